"""Sliding-window attention layers (Mistral, Gemma 2, gpt-oss, Qwen2/Qwen3 with use_sliding_window, GPT-Neo's local
layers, ...) count the query-key pairs of their window, in the forward, in each decode step and in the KV cache
(CPU, tiny random-weight checkpoint folders built here). Before, every decoder layer counted as a full causal one:
each test failed then. A sequence no longer than the window gives what it gave before.

The expectations do not come from the code under test: which pairs a layer attends is read off the real model's
eager attention probabilities (a masked pair's probability is exactly 0), and the FLOPs it needs are torch's count
of the real forward less the scores and values of every pair its mask removed."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from transbench.backends.decoders import HFGenerator
from transbench.models import build, flops
from transbench.models.presets import PRESETS, Preset

W = 8  # every window here: sequences of 6 (inside), 8 (equal) and 13 (past it) tokens
SEQS = (6, W, 13)
SIZES = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=12, intermediate_size=72,
             num_hidden_layers=4, vocab_size=1003, max_position_embeddings=64)
Q = 4 * 12  # heads x head_dim of every model here
EXPERTS = dict(num_experts_per_tok=2)

# name: (model_type, config, the window of each layer, the windows of the layers that attend, in order)
MODELS = {
    # no layer_types: sliding_window on every layer (modeling_mistral picks create_sliding_window_causal_mask)
    "mistral": ("mistral", dict(SIZES, sliding_window=W), (W,) * 4, None),
    "mistral-full": ("mistral", dict(SIZES, sliding_window=None), (None,) * 4, None),
    # no layer_types either; sliding_window is None unless use_sliding_window
    "qwen3_moe": ("qwen3_moe", dict(SIZES, use_sliding_window=True, sliding_window=W, num_experts=4,
                                    moe_intermediate_size=32, **EXPERTS), (W,) * 4, None),
    # layer_types: sliding and full layers alternate
    "gemma2": ("gemma2", dict(SIZES, sliding_window=W), (W, None, W, None), None),
    "gpt_oss": ("gpt_oss", dict(SIZES, sliding_window=W, num_local_experts=4, **EXPERTS), (W, None, W, None), None),
    "cohere2": ("cohere2", dict(SIZES, sliding_window=W), (W, W, W, None), None),
    # layer_types from use_sliding_window and max_window_layers: the layers from max_window_layers on slide
    "qwen3": ("qwen3", dict(SIZES, use_sliding_window=True, sliding_window=W, max_window_layers=2),
              (None, None, W, W), None),
    "qwen2": ("qwen2", dict(SIZES, use_sliding_window=True, sliding_window=W, max_window_layers=2),
              (None, None, W, W), None),
    # GPT-Neo's own fields: "local" layers of window_size
    "gpt_neo": ("gpt_neo", dict(hidden_size=48, num_heads=4, num_layers=4, intermediate_size=72, vocab_size=1003,
                                max_position_embeddings=64, attention_types=[[["global", "local"], 2]],
                                window_size=W), (None, W, None, W), None),
    # recurrent layers (no attention products) between sliding attention layers: products are told apart by layer
    "recurrent_gemma": ("recurrent_gemma", dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
                                                intermediate_size=72, num_hidden_layers=4, vocab_size=1003,
                                                attention_window_size=W, lru_width=48,
                                                block_types=["recurrent", "attention"]), (None, W, None, W), (W, W)),
    # multi-head latent attention, no window: its cache holds one latent per token, each step expands them all
    "deepseek_v3": ("deepseek_v3", dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=4,
                                        intermediate_size=72, moe_intermediate_size=32, n_routed_experts=4,
                                        n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=None,
                                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                                        num_hidden_layers=2, vocab_size=1003, max_position_embeddings=64, **EXPERTS),
                    (None, None), None),
    # a sliding_window its family's attention never applies (Llama and Moshi mask with create_causal_mask)
    "llama-stray": ("llama", dict(SIZES, sliding_window=W), (None,) * 4, None),
    "moshi-stray": ("moshi", dict(SIZES, sliding_window=W), (None,) * 4, None),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny random-weight checkpoint folder of MODELS[name], made once per module."""
    import transformers

    made: dict[str, str] = {}
    path = tmp_path_factory.mktemp("window")

    def make(name: str) -> str:
        if name not in made:
            family, config, _, _ = MODELS[name]
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(family, **config))
            model.save_pretrained(path / name)
            made[name] = str(path / name)
        return made[name]

    return make


def _pairs(seq: int, window: int | None) -> int:
    """Query i attends keys i - window < j <= i: min(i + 1, window) keys (transformers.masking_utils)."""
    return sum(min(i + 1, window or seq) for i in range(seq))


@functools.lru_cache(maxsize=None)
def _real_model(folder: str, task: str = "causal-lm"):
    ref = build.resolve(folder)
    model = build.build_model(ref, task, attn="eager")
    if model._can_set_experts_implementation():
        model.set_experts_implementation("eager")  # the real model's experts, one by one
    return ref.shape, model


def _needed(folder: str, seq: int, task: str = "causal-lm") -> tuple[int, list[int]]:
    """(torch's count of the real eager forward of one sequence less the scores and values of every masked pair,
    the pairs each attention layer attends): what the mask leaves is read off the attention probabilities."""
    shape, model = _real_model(folder, task)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        out = model(input_ids=torch.randint(3, shape.vocab - 1, (1, seq)), output_attentions=True)
    pairs = []
    for probs in out.attentions:
        kept = (probs[0] != 0).sum(dim=(-1, -2))  # per head
        assert (kept == kept[0]).all()
        pairs.append(int(kept[0]))
    return flops.counter_total(counter, model) - sum(4 * Q * (seq * seq - p) for p in pairs), pairs


def _before(folder: str, seq: int, task: str = "causal-lm") -> int:
    """What every decoder layer counted before: torch's count less the masked upper half of each square."""
    needed, pairs = _needed(folder, seq, task)
    return needed - sum(4 * Q * (seq * (seq + 1) // 2 - p) for p in pairs)


# --- the forward: counted and analytic families ----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", ["mistral", "qwen3_moe", "gemma2", "gpt_oss", "cohere2", "qwen3", "gpt_neo",
                                  "recurrent_gemma"])
def test_counted_sliding_window_layers_count_their_window(folder, name):
    # Before: every layer counted s (s + 1) / 2 pairs, 91 at 13 tokens where a window of 8 attends 76 (+20% of
    # the attention FLOPs of each sliding layer, and more the longer the sequence).
    _, _, windows, attends = MODELS[name]
    shape = build.resolve(folder(name)).shape
    assert flops.attention_windows(shape) == windows
    for seq in SEQS:
        needed, pairs = _needed(folder(name), seq)
        assert pairs == [_pairs(seq, w) for w in attends or windows], (seq, pairs)  # the rule, on the real mask
        assert flops.forward_flops(shape, [seq], "causal-lm") == (needed, "counted"), seq
        if seq <= W:
            assert needed == _before(folder(name), seq)  # within the window: what it counted before
    assert flops.forward_flops(shape, [13, 6], "causal-lm")[0] == _needed(folder(name), 13)[0] + _needed(
        folder(name), 6)[0]


def test_analytic_qwen2_counts_its_sliding_layers(folder):
    # Qwen2 is counted by formula (ANALYTIC): its layers from max_window_layers on attend a window when
    # use_sliding_window is set. Before: all four layers counted s (s + 1) / 2 pairs.
    shape = build.resolve(folder("qwen2")).shape
    for seq in SEQS:
        needed, pairs = _needed(folder("qwen2"), seq)
        assert pairs == [_pairs(seq, None)] * 2 + [_pairs(seq, W)] * 2
        assert flops.forward_flops(shape, [seq], "causal-lm") == (needed, "analytic")
        assert [flops.attention_flops(shape, seq, k) for k in range(4)] == [4 * Q * p for p in pairs]
        assert flops.training_flops(shape, seq, "causal-lm") == 3 * needed
    # A preset (no folder) of the same config: transformers' Qwen2Config derives the same layer_types.
    preset = Preset("qwen2-window-preset", "qwen2", 4, 48, 4, 72, 1003, 64, kv_heads=2, head_dim=12, decoder=True,
                    config=dict(use_sliding_window=True, sliding_window=W, max_window_layers=2))
    assert flops.attention_windows(preset) == (None, None, W, W)
    assert flops.forward_flops(preset, 13, "causal-lm") == flops.forward_flops(shape, 13, "causal-lm")
    # Without use_sliding_window (every Qwen2.5 checkpoint) and in Llama (no window in LlamaConfig): causal.
    for name in ("qwen2-tiny", "qwen2.5-0.5b", "llama-tiny", "llama-3.2-1b"):
        assert set(flops.attention_windows(PRESETS[name])) == {None}, name
        assert flops.attention_flops(PRESETS[name], 13, 1) == 2 * 13 * 14 * PRESETS[name].heads * PRESETS[name].dim


@pytest.mark.slow
def test_a_sequence_within_the_window_counts_as_before(folder):
    # Mistral with a window of 8 and without one, same shape: the same count up to 8 tokens (7 stored in the
    # cache), less after.
    windowed = build.resolve(folder("mistral")).shape
    full = build.resolve(folder("mistral-full")).shape
    for seq in range(1, W + 1):
        assert flops.forward_flops(windowed, [seq], "causal-lm") == flops.forward_flops(full, [seq], "causal-lm")
    assert flops.generation_flops(windowed, 4, 5) == flops.generation_flops(full, 4, 5)  # contexts up to 8
    for seq in range(W):
        assert flops.kv_cache_bytes(windowed, seq, 2) == flops.kv_cache_bytes(full, seq, 2)
    past = flops.forward_flops(full, [W + 1], "causal-lm")[0] - flops.forward_flops(windowed, [W + 1], "causal-lm")[0]
    assert past == 4 * 4 * Q * (_pairs(W + 1, None) - _pairs(W + 1, W))  # 4 layers x 1 pair past the window
    assert flops.generation_flops(windowed, 4, 6)[0] < flops.generation_flops(full, 4, 6)[0]  # a context of 9
    assert flops.kv_cache_bytes(windowed, W, 2) < flops.kv_cache_bytes(full, W, 2)
    # Encoders are unchanged: ModernBERT's local layers keep their own window (|i - j| <= local_attention / 2),
    # and no encoder layer slides.
    for name in ("bert-tiny", "modernbert-tiny", "deberta-tiny"):
        assert set(flops.attention_windows(PRESETS[name])) == {None}, name
    p = PRESETS["modernbert-tiny"]
    assert [flops.attention_flops(p, 13, k) for k in range(3)] == [4 * 13 * 13 * 48] + [
        4 * flops._local_pairs(13, 8) * 48] * 2


# --- generation: each decode step and the KV cache ---------------------------------------------------------------

def _decode_step(model, prompt: int):
    """torch's count of one real decode step after a `prompt`-token prefill (transformers' DynamicCache, as the
    generate cells run it), and the bytes that cache then holds."""
    gen = HFGenerator(model)
    gen.prefill(torch.randint(3, 1000, (1, prompt)))
    with FlopCounterMode(display=False) as counter:
        gen.decode(torch.tensor([5]))
    return flops.counter_total(counter, model), gen.cache_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mistral", "qwen2", "gemma2", "gpt_oss", "llama-stray"])
def test_decode_steps_and_the_kv_cache_hold_the_window(folder, name):
    # A decode step at context t scores min(t, w) keys in a sliding layer, and transformers' DynamicCache keeps
    # the last w - 1 tokens of it (DynamicSlidingWindowLayer). Before: t keys and t stored tokens in every layer.
    # A Llama config with a stray sliding_window attends every key in its prefill (above), but its cache keeps
    # the window all the same, so each step scores the window too.
    shape, model = _real_model(folder(name))
    prompts = (5, W - 1, W, 12)  # contexts of 6, 8, 9 and 13 tokens
    steps = [_decode_step(model, prompt) for prompt in prompts]
    assert [flops.decode_token_flops(shape, prompt + 1) for prompt in prompts] == [step for step, _ in steps]
    # What the cache holds after the step (the step's own token included), in fp32: 4 bytes per element.
    assert [flops.kv_cache_bytes(shape, prompt + 1, 4) for prompt in prompts] == [stored for _, stored in steps]
    if name == "mistral":  # every layer slides: a step costs the same from the window on
        assert flops.decode_token_flops(shape, 40) == flops.decode_token_flops(shape, W)
        assert flops.kv_cache_bytes(shape, 40, 2) == 2 * 4 * 2 * 12 * (W - 1) * 2


def test_a_stray_sliding_window_slides_the_cache_not_the_attention(folder):
    # Llama and Moshi take a sliding_window into their config but mask with create_causal_mask: their forward
    # attends every earlier key (counted as before), while DynamicCache keeps the window for them.
    for name in ("llama-stray", "moshi-stray"):
        shape = build.resolve(folder(name)).shape
        assert flops.attention_windows(shape) == (None,) * 4
        assert flops.cache_windows(shape) == (W,) * 4
        needed, pairs = _needed(folder(name), 13)
        if name == "moshi-stray" and pairs == [13 * 13] * 4:
            continue  # transformers 5.17's Moshi (the GPU image's) masks nothing in this forward; 5.24's is causal
        assert pairs == [_pairs(13, None)] * 4
        assert flops.forward_flops(shape, [13], "causal-lm")[0] == needed
        assert flops.kv_cache_bytes(shape, 13, 4) == 2 * 4 * 2 * 12 * (W - 1) * 4


def test_latent_attention_decode_steps_and_cache_are_its_own(folder):
    # DeepSeek-V3's attention (and its kin's: Kimi, GLM-4-MoE-Lite, MiniCPM3, ...) caches one compressed latent per
    # token, kv_lora_rank + qk_rope_head_dim elements, and each decode step expands every cached latent through
    # kv_b_proj before scoring keys of qk_nope + qk_rope and values of v_head_dim. Counted as standard attention of
    # its config's head_dim (the rotary part, 8), a step at 12 tokens read 67% of torch's count and the cache 2.7
    # times what transformers' DynamicCache held.
    shape, model = _real_model(folder("deepseek_v3"))
    prompts = (5, 11)
    steps = [_decode_step(model, prompt) for prompt in prompts]
    assert [flops.decode_token_flops(shape, prompt + 1) for prompt in prompts] == [step for step, _ in steps]
    assert [flops.kv_cache_bytes(shape, prompt + 1, 4) for prompt in prompts] == [stored for _, stored in steps]
    assert flops.kv_cache_bytes(shape, 10, 2) == 2 * 10 * (16 + 8) * 2  # layers x tokens x latent x bytes
