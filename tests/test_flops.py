import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from transbench.models import build, flops
from transbench.models.presets import PRESETS, Preset


def test_layer_formula_matches_hand_count():
    p = Preset("x", "bert", 1, 8, 2, 32, 100, 64)
    s, h, i = 4, 8, 32
    qkv, scores, values, out, ffn = 2 * s * h * 3 * h, 2 * s * s * h, 2 * s * s * h, 2 * s * h * h, 2 * 2 * s * h * i
    assert flops.layer_flops(p, s) == qkv + scores + values + out + ffn == 6656


def test_gqa_gated_layer_hand_count():
    # Llama-style: 4 heads of 12, 2 kv heads, gated MLP (gate, up, down).
    p = PRESETS["llama-tiny"]
    s, h, i, q, kv = 8, 48, 96, 48, 24
    proj = 2 * s * h * q * 2 + 2 * s * h * kv * 2
    ffn = 3 * 2 * s * h * i
    causal = 2 * 2 * q * s * (s + 1) // 2
    assert flops.layer_flops(p, s) == proj + ffn + causal


def test_bert_base_anchor():
    # 12 x (24 s h^2 + 4 s^2 h) at s=128: 22.35 GFLOP per sequence (anchors.md).
    assert flops.forward_flops(PRESETS["bert-base-uncased"], 128) == (12 * (24 * 128 * 768**2 + 4 * 128**2 * 768),
                                                                      "analytic")


def _eager_count(model, ref, seq: int) -> int:
    ids = torch.randint(2, ref.shape.vocab, (2, seq))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=ids)
    return flops.counter_total(counter, model)


def _masked_away(shape, seq: int) -> int:
    """What eager attention computes and masks away, which the formula does not credit: the upper triangle
    of a causal layer, the pairs outside a ModernBERT local layer's window."""
    q = shape.heads * shape.dim
    return sum(4 * seq * seq * q - flops.attention_flops(shape, seq, k) for k in range(shape.layers))


FAMILY_TASKS = [(m, t) for m in ("bert-tiny", "roberta-tiny", "distilbert-tiny", "modernbert-tiny", "gpt2-tiny",
                                 "llama-tiny", "qwen2-tiny")
                for t in build.family_tasks(PRESETS[m].family) if t != "generate"]


@pytest.mark.parametrize("model,task", FAMILY_TASKS)
def test_formula_matches_torch_flop_counter(model, task):
    ref = build.resolve(model)
    assert ref.family in flops.ANALYTIC
    seq = 16
    counted = _eager_count(build.build_model(ref, task, attn="eager"), ref, seq) - 2 * _masked_away(ref.shape, seq)
    analytic, method = flops.forward_flops(ref.shape, [seq, seq], task)
    assert method == "analytic"
    assert counted == analytic


def test_modernbert_local_layers_count_their_window():
    p = PRESETS["modernbert-tiny"]  # layers 0 global; 1, 2 local with an 8-token window
    assert flops.attention_flops(p, 64, 0) == 4 * 64 * 64 * 48
    assert flops.attention_flops(p, 64, 1) < flops.attention_flops(p, 64, 0) / 6
    assert flops.attention_flops(p, 4, 1) == 4 * flops._local_pairs(4, 8) * 48 == 4 * 16 * 48  # window covers all



def _modernbert(layers: int, local: int, **config) -> Preset:
    base = {k: v for k, v in PRESETS["modernbert-tiny"].config.items() if k != "global_attn_every_n_layers"}
    return dataclasses.replace(PRESETS["modernbert-tiny"], name=f"mb-{layers}-{local}-{sorted(config.items())}",
                               layers=layers, config={**base, "local_attention": local, **config})


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(1, 5), every=st.integers(1, 4), local=st.integers(1, 12).map(lambda n: 2 * n),
       seq=st.integers(1, 40))
def test_modernbert_local_layers_are_its_layer_types(layers, every, local, seq):
    # A checkpoint saved by transformers 5 names its layers in layer_types and keeps no global_attn_every_n_layers:
    # before, each of its local layers counted as a global one (+14% at modernbert-tiny's shape and 64 tokens).
    old = _modernbert(layers, local, global_attn_every_n_layers=every)  # what transformers 4 saved
    types = ["sliding_attention" if k % every else "full_attention" for k in range(layers)]
    new = _modernbert(layers, local, layer_types=types)  # what transformers 5 saves: the same model
    assert flops.forward_flops(new, [seq], "mlm") == flops.forward_flops(old, [seq], "mlm")
    q = new.heads * new.dim
    want = [4 * (flops._local_pairs(seq, local) if t == "sliding_attention" else seq * seq) * q for t in types]
    assert [flops.attention_flops(new, seq, k) for k in range(layers)] == want


def test_modernbert_layer_types_outrank_an_every_n_layers_transformers_does_not_read():
    # transformers builds the layers from layer_types where a config has them: all global here, whatever the 3 says
    shape = _modernbert(3, 8, layer_types=["full_attention"] * 3, global_attn_every_n_layers=3)
    assert all(flops.attention_flops(shape, 64, k) == 4 * 64 * 64 * 48 for k in range(3))

def test_meta_counter_matches_analytic_where_both_exist():
    # The counted path (meta device, no weights) agrees with the formula on a family the formula covers.
    for model, task in [("bert-tiny", "mlm"), ("roberta-tiny", "classification"), ("distilbert-tiny", "qa")]:
        shape = PRESETS[model]
        assert flops.counted_flops(shape, 16, task) == flops.analytic_forward_flops(shape, 16, task)


def test_unknown_family_is_counted_on_meta():
    shape = PRESETS["deberta-tiny"]
    assert shape.family not in flops.ANALYTIC
    fl, method = flops.forward_flops(shape, [16, 8], "base")
    assert method == "counted"
    # Each sequence's own count, and the work done once per forward at the batch's width once.
    assert fl == flops.counted_split(shape, 16, "base")[0] + sum(flops.counted_split(shape, 8, "base"))
    # More than a BERT of the same shape: DeBERTa adds its relative-position products (c2p, p2c) on top.
    bert = flops.analytic_forward_flops(PRESETS["bert-tiny"], [16, 8])
    assert bert < fl < 4 * bert


def test_counted_work_done_once_per_forward_is_not_repeated_per_sequence():
    # DeBERTa projects its relative-position embeddings once per forward, whatever the batch.
    from torch.utils.flop_counter import FlopCounterMode

    shape = PRESETS["deberta-tiny"]
    model = build.build_model(build.resolve("deberta-tiny"), "base")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=torch.ones(3, 13, dtype=torch.long))
    assert flops.forward_flops(shape, [13, 13, 13]) == (flops.counter_total(counter, model), "counted")
    per_seq, once = flops.counted_split(shape, 13, "base")
    assert once > 0 and flops.forward_flops(shape, 13)[0] == per_seq + once
    assert flops.training_flops(shape, 13, "base") == 3 * per_seq  # x the step's sequences


def test_decoding_a_counted_family_counts_its_own_projections_and_mlp():
    p = PRESETS["llama-tiny"]  # gated MLP: the counted path must see three FFN matrices, not the two of 4 h i
    counted = dataclasses.replace(p, family="mistral", kv_heads=2)
    assert counted.family not in flops.ANALYTIC
    assert flops.decode_token_flops(counted, 1) == flops.counted_flops(counted, 1, "causal-lm")
    for context in (1, 11):
        assert flops.decode_token_flops(counted, context) == flops.decode_token_flops(p, context)
    total, method = flops.generation_flops(counted, 8, 4)
    assert method == "counted" and total > flops.forward_flops(counted, 8, "causal-lm")[0]


def test_variable_lengths_count_real_tokens():
    p = PRESETS["bert-tiny"]
    assert flops.forward_flops(p, [10, 30])[0] == flops.forward_flops(p, 10)[0] + flops.forward_flops(p, 30)[0]
    assert flops.forward_flops(p, [10, 30])[0] < flops.forward_flops(p, [30, 30])[0]


def test_mlm_training_counts_the_head_on_the_masked_positions_it_needs():
    p = PRESETS["bert-large-uncased"]
    body = flops.forward_flops(p, 128, "base")[0]
    head = lambda n: 2 * n * p.hidden * p.hidden + 2 * n * p.hidden * p.vocab  # noqa: E731
    assert flops.training_flops(p, 128, "mlm") == 3 * (body + head(128))  # what transformers' head runs
    assert flops.training_flops(p, 128, "mlm", head_tokens=19) == 3 * (body + head(19))  # what BERT needs
    # bert-large's vocabulary head on every position is ~9% of the step; on 15% of them ~1.4%.
    assert 0.08 < 1 - flops.training_flops(p, 128, "mlm", head_tokens=19) / flops.training_flops(p, 128, "mlm") < 0.1


def test_a_counted_family_s_mlm_head_is_counted_on_its_masked_positions_too():
    # ALBERT's, DeBERTa's and the other counted families' heads were counted on every position whatever
    # head_tokens said: MFU 1.3 to 1.8 times what the step needs
    p = PRESETS["deberta-tiny"]
    assert p.family not in flops.ANALYTIC
    body = flops.counted_split(p, 16, "base")[0]
    whole = flops.counted_split(p, 16, "mlm")[0]
    assert whole > body
    assert flops.training_flops(p, 16, "mlm") == 3 * whole
    assert flops.training_flops(p, 16, "mlm", head_tokens=16) == 3 * whole
    assert flops.training_flops(p, 16, "mlm", head_tokens=2) == 3 * (body + (whole - body) * 2 // 16)
    assert flops.training_flops(p, 16, "mlm", recompute=True) == 3 * whole + body  # the layers once more, no head


def test_training_and_generation():
    p = PRESETS["gpt2-tiny"]
    fwd = flops.forward_flops(p, 32, "causal-lm")[0]
    assert flops.training_flops(p, 32, "causal-lm") == 3 * fwd
    layers = flops.forward_flops(p, 32, "base")[0]
    # Checkpointing's second forward runs the layers again (not the head): HFU counts it, MFU does not.
    assert flops.training_flops(p, 32, "causal-lm", recompute=True) == 3 * fwd + layers
    assert flops.generation_flops(p, 8, 1) == (flops.forward_flops(p, 8, "causal-lm")[0], "analytic")
    assert flops.kv_cache_bytes(PRESETS["gpt2"], 512, 4) == 2 * 12 * 768 * 512 * 4  # seeds: ~38 MB


def test_decode_step_matches_the_forward_of_one_more_token():
    # The decode formula is the forward's own terms for one query over `context` keys.
    for name in ("gpt2-tiny", "llama-tiny"):
        p = PRESETS[name]
        assert flops.decode_token_flops(p, 1) == flops.analytic_forward_flops(p, 1, "causal-lm")
        grows = flops.decode_token_flops(p, 11) - flops.decode_token_flops(p, 1)
        assert grows == p.layers * 4 * 10 * p.heads * p.dim  # scores and values over 10 more keys


def test_gqa_kv_cache_size():
    # Llama-3.2-1B: 16 layers, 8 kv heads of 64: 2 x 16 x 8 x 64 x 2 bytes = 32 KiB per token in fp16,
    # a quarter of what 32 full heads would hold.
    p = PRESETS["llama-3.2-1b"]
    assert flops.kv_cache_bytes(p, 1, 2) == 2 * 16 * 8 * 64 * 2 == 32768
    assert flops.kv_cache_bytes(p, 640, 2) * 4 == 2 * p.layers * p.hidden * 640 * 2
    q = PRESETS["qwen2.5-0.5b"]  # 2 kv heads of 64
    assert flops.kv_cache_bytes(q, 100, 2) == 2 * 24 * 2 * 64 * 100 * 2
