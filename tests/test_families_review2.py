"""Second review of "any transformers family" (CPU, tiny random-weight checkpoint folders built here): families the
first review left out (mixture of experts, BigBird-like encoders, XLNet, GPT-1, Longformer, non-text models). Each
test failed before the fix it names."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from transbench.cells import Cell
from transbench.errors import SpecError
from transbench.models import build, flops
from transbench.runner import worker
from transbench.scenarios.inference.measure import ModelCache

FAST = dict(min_time=0.0, warmup=0, min_count=1)
SIZES = dict(hidden_size=48, num_attention_heads=4, intermediate_size=72, num_hidden_layers=2, vocab_size=1003,
             max_position_embeddings=64)


def _save(path, family, cls_name="AutoModelForCausalLM", **config):
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, cls_name).from_config(transformers.AutoConfig.for_model(family, **config))
    model.save_pretrained(path / family)
    return str(path / family)


def _cell(model, task, backend="eager", cache=None, **kw):
    cell = Cell(model=model, task=task, backend=backend, dtype="fp32", batch=2, seq=16, device="cpu",
                **{**FAST, "new_tokens": 3, **kw})
    return worker.execute("transbench.scenarios.inference.target:measure", cell.to_dict(), {"models": cache or ModelCache()})


def _torch_count(folder, task, seq, causal):
    """torch's counter over the real model's eager forward of one sequence (experts run one by one: `eager`)."""
    ref = build.resolve(folder)
    model = build.build_model(ref, task, attn="eager")
    if model._can_set_experts_implementation():
        model.set_experts_implementation("eager")
    custom = flops._causal_products(seq) if causal else {}
    with FlopCounterMode(display=False, custom_mapping=custom) as counter, torch.no_grad():
        model(input_ids=torch.randint(3, ref.shape.vocab - 1, (1, seq)))
    return counter.get_total_flops()


def _refusal(folder) -> str:
    with pytest.raises(SpecError) as e:
        build.resolve(folder)
    assert "\n" not in str(e.value)
    return str(e.value)


# --- mixture of experts: every cell was `error` -------------------------------------------------------------------

MOE = {
    "mixtral": dict(SIZES, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(SIZES, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=32),
}


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe")
    return {family: _save(path, family, **config) for family, config in MOE.items()}


def test_moe_families_count_every_chosen_expert(moe):
    # Before: the meta copy ran its experts through grouped_mm, whose meta kernel takes bf16 only: "RuntimeError:
    # Expected inputs of BF16 type but got mat_a.dtype=torch.float32", so every cell of Mixtral, Qwen2-MoE, Qwen3-MoE,
    # OLMoE, GraniteMoE, gpt-oss and Jamba was an `error` (torch's counter does not count grouped_mm either).
    for family, folder in moe.items():
        shape = build.resolve(folder).shape
        for task in ("base", "causal-lm"):
            assert flops.forward_flops(shape, [16], task) == (_torch_count(folder, task, 16, True), "counted"), family


def test_a_moe_checkpoint_runs_inference_and_generation(moe):
    cache = ModelCache()
    for task, kw in (("causal-lm", {}), ("classification", {"seq_stdev": 4.0}), ("generate", {})):
        for backend in ("eager", "sdpa"):
            r = _cell(moe["mixtral"], task, backend, cache, **kw)
            assert r.status == "ok", (task, backend, r.error)
            assert r.record["flops_method"] == "counted" and r.record["tflops"] > 0


# --- families the meta device cannot run: every cell `unsupported` after it was timed ----------------------------

@pytest.mark.parametrize("family,config", [
    ("big_bird", dict(SIZES, attention_type="original_full")),
    ("megatron-bert", SIZES),
    ("longformer", dict(SIZES, attention_window=8, pad_token_id=1)),
])
def test_families_the_meta_device_cannot_run_are_counted_on_the_host(tmp_path, family, config):
    # Before: "FLOPs of big_bird: torch's counter cannot run it on the meta device (Tensor.item() cannot be called on
    # meta tensors)" for every cell of BigBird, Canine, Longformer, LUKE, Megatron-BERT, RemBERT, Reformer and XLNet,
    # each after it had been checked and timed.
    folder = _save(tmp_path, family, "AutoModelForMaskedLM", **config)
    shape = build.resolve(folder).shape
    for task in ("base", "mlm"):
        assert flops.forward_flops(shape, [16], task) == (_torch_count(folder, task, 16, False), "counted")
    r = _cell(folder, "mlm", seq_stdev=4.0)
    assert r.status == "ok", r.error
    assert r.record["flops_method"] == "counted" and r.record["tflops"] > 0


# --- XLNet: refused, and told to fix a config.json that was right ------------------------------------------------

@pytest.fixture(scope="module")
def xlnet(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("xlnet"), "xlnet", d_model=48, n_head=4, d_inner=72, n_layer=2,
                 vocab_size=1003)


def test_xlnet_has_no_position_limit_and_counts_its_attention_both_ways(xlnet):
    # Before: "config.json sets max_position_embeddings to -1, and it must be a positive integer; fix config.json":
    # the -1 is XLNetConfig's read-only property, transformers' "no sequence length limit", in no config.json.
    shape = build.resolve(xlnet).shape
    assert shape.max_positions == 1 << 20
    # transformers lists XLNet as a causal LM, but its forward attends both ways: no causal half here.
    assert flops.forward_flops(shape, [16], "causal-lm") == (_torch_count(xlnet, "causal-lm", 16, False), "counted")
    cache = ModelCache()
    for task, kw in (("base", {}), ("causal-lm", {"seq_stdev": 4.0})):
        r = _cell(xlnet, task, cache=cache, **kw)
        assert r.status == "ok", r.error


@pytest.mark.parametrize("family,config", [
    ("openai-gpt", dict(n_embd=48, n_head=4, n_layer=2, vocab_size=1003, n_positions=64)),
    ("xlnet", dict(d_model=48, n_head=4, d_inner=72, n_layer=2, vocab_size=1003)),
])
def test_generation_without_a_kv_cache_is_unsupported(tmp_path, family, config):
    # Before: GPT-1's forward takes no past_key_values and swallowed the cache in its **kwargs: every decode step ran
    # the new token alone, and the cell was `ok` with kv_cache_mb 0.0 and the time of that context-free step.
    folder = _save(tmp_path, family, **config)
    for backend in ("eager", "sdpa"):
        r = _cell(folder, "generate", backend)
        if backend == "sdpa" and r.status == "unsupported" and "no 'sdpa' attention" in r.error:
            continue
        assert r.status == "unsupported" and "forward takes no KV cache" in r.error, (backend, r.status, r.error)


# --- Longformer's QA head: `error` ---------------------------------------------------------------------------------

def test_longformer_qa_is_unsupported_and_refused_alone(tmp_path):
    # Before: "AssertionError: There should be exactly three separator tokens: 2 in every sample for questions
    # answering", an `error` cell for every backend (random tokens hold no question and context).
    folder = _save(tmp_path, "longformer", "AutoModelForMaskedLM", **SIZES, attention_window=8, pad_token_id=1)
    r = _cell(folder, "qa")
    assert r.status == "unsupported" and "separator tokens" in r.error, (r.status, r.error)
    with pytest.raises(SpecError, match="LongformerForQuestionAnswering needs a question and a context"):
        build.check_task(build.resolve(folder), "qa")


# --- models that are not text transformers: refused, but told to fix config.json (or run as `error`) -------------

VISION = dict(hidden_size=48, num_attention_heads=4, intermediate_size=72, num_hidden_layers=2, image_size=32,
              patch_size=8)


@pytest.fixture(scope="module")
def not_text(tmp_path_factory):
    path = tmp_path_factory.mktemp("not_text")
    return {
        "vit": _save(path, "vit", "AutoModel", **VISION),
        "wav2vec2": _save(path, "wav2vec2", "AutoModel", hidden_size=48, num_attention_heads=4, intermediate_size=72,
                          num_hidden_layers=2, vocab_size=32, conv_dim=[16, 16], conv_stride=[5, 2],
                          conv_kernel=[10, 3], num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
        "clip": _save(path, "clip", "AutoModel", projection_dim=16, vision_config=VISION,
                      text_config=dict(SIZES, bos_token_id=1, eos_token_id=2, pad_token_id=0)),
        "mamba": _save(path, "mamba", hidden_size=48, num_hidden_layers=2, vocab_size=1003, state_size=4),
    }


def test_a_model_that_is_not_a_text_transformer_is_refused_with_why(not_text):
    # Before: vit "transformers cannot read its config.json ('ViTConfig' object has no attribute 'vocab_size'); fix
    # config.json", clip "... no attribute 'hidden_size' ...", mamba "... no attribute 'num_attention_heads' ...", and
    # wav2vec2 passed every check: each of its cells an `error` ("missing ... argument: 'input_values'"), exit 0.
    said = {name: _refusal(folder) for name, folder in not_text.items()}
    assert "vit is not a text model: ViTModel takes pixel_values, not token ids" in said["vit"]
    assert "wav2vec2 is not a text model: Wav2Vec2Model takes input_values, not token ids" in said["wav2vec2"]
    assert "clip is a multimodal model: its config.json nests" in said["clip"]
    assert "mamba has no attention heads" in said["mamba"]
    assert not any("fix config.json" in line for line in said.values()), said


def test_cli_refuses_a_non_text_folder_in_one_line_and_stores_nothing(not_text, tmp_path):
    db = tmp_path / "t.db"
    p = subprocess.run([sys.executable, "-m", "transbench", "run", "--model", not_text["wav2vec2"], "--backend",
                        "eager", "--batch", "1", "--seq", "8", "--min-time", "0", "--db", str(db)],
                       capture_output=True, text=True, timeout=300)
    lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert p.returncode == 2 and len(lines) == 1 and "not a text model" in lines[0], (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr and not db.exists()


# --- an end-of-sequence id outside the vocabulary ----------------------------------------------------------------

def test_an_eos_id_outside_the_vocabulary_is_not_made_the_padding_id(tmp_path):
    # Before: with no pad_token_id, hf_config made the eos id (Starcoder2's default 50256, in a 1003-token vocabulary)
    # the padding id, and the embedding asserted: "transformers cannot build the model its config.json describes
    # (Padding_idx must be within num_embeddings); fix config.json", for a model transformers itself builds.
    folder = _save(tmp_path, "starcoder2", **SIZES, num_key_value_heads=2)
    assert json.loads((tmp_path / "starcoder2" / "config.json").read_text())["eos_token_id"] >= 1003
    r = _cell(build.resolve(folder).name, "classification", seq_stdev=4.0)
    assert r.status == "ok", r.error


def test_a_one_token_vocabulary_is_refused_in_one_line(tmp_path):
    # Before: every cell was an `error` ("random_ expects 'from' to be less than 'to', but got from=0 >= to=0"): the
    # random tokens skip the padding id, and a vocabulary of one id has no other. A vocabulary of two runs.
    one = _save(tmp_path / "one", "bert", "AutoModelForMaskedLM", **{**SIZES, "vocab_size": 1, "hidden_size": 48})
    assert "config.json sets vocab_size to 1, which leaves the random tokens no id but the padding id" in _refusal(one)
    two = _save(tmp_path / "two", "gpt2", n_embd=48, n_head=3, n_layer=1, vocab_size=2, n_positions=32)
    r = _cell(two, "causal-lm", seq_stdev=4.0)
    assert r.status == "ok", r.error


def test_the_fused_backend_refuses_xlnet_as_any_family_it_has_no_loader_for(xlnet):
    # Before: "ValueError: max_seq must be a whole number of at least 1, got -1" (the engine's options read XLNet's
    # max_position_embeddings before the engine looked at the family): an `error` cell for every task.
    for task in ("base", "causal-lm"):
        r = _cell(xlnet, task, "fused")
        assert r.status == "unsupported" and "the engine runs bert, roberta" in r.error, (r.status, r.error)
