import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from transbench.models import build, flops
from transbench.models.presets import PRESETS, Preset


def test_layer_formula_matches_hand_count():
    p = Preset("x", "bert", 1, 8, 2, 32, 100, 64)
    s, h, i = 4, 8, 32
    qkv, scores, values, out, ffn = 2 * s * h * 3 * h, 2 * s * s * h, 2 * s * s * h, 2 * s * h * h, 2 * 2 * s * h * i
    assert flops.layer_flops(p, s) == qkv + scores + values + out + ffn == 6656


def test_bert_base_anchor():
    # 12 x (24 s h^2 + 4 s^2 h) at s=128: 22.35 GFLOP per sequence (anchors.md).
    assert flops.forward_flops(PRESETS["bert-base-uncased"], 128) == 12 * (24 * 128 * 768**2 + 4 * 128**2 * 768)


@pytest.mark.parametrize("model,task", [("bert-tiny", "base"), ("bert-tiny", "mlm"), ("bert-tiny", "qa"),
                                        ("bert-tiny", "token-classification"), ("bert-tiny", "classification"),
                                        ("gpt2-tiny", "base"), ("gpt2-tiny", "causal-lm")])
def test_formula_matches_torch_flop_counter(model, task):
    ref = build.resolve(model)
    m = build.build_model(ref, task, attn="eager")
    ids = torch.randint(1, ref.shape.vocab, (2, 16))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        m(input_ids=ids)
    counted = counter.get_total_flops()
    if ref.family == "gpt2":  # eager attention computes the full square and masks half of it away
        s, h, layers = 16, ref.shape.hidden, ref.shape.layers
        counted -= 2 * layers * (4 * s * s * h - 2 * s * (s + 1) * h)
    assert counted == flops.forward_flops(ref.shape, [16, 16], task)


def test_variable_lengths_count_real_tokens():
    p = PRESETS["bert-tiny"]
    assert flops.forward_flops(p, [10, 30]) == flops.forward_flops(p, 10) + flops.forward_flops(p, 30)
    assert flops.forward_flops(p, [10, 30]) < flops.forward_flops(p, [30, 30])


def test_training_and_generation():
    p = PRESETS["gpt2-tiny"]
    assert flops.training_flops(p, 32, "causal-lm") == 3 * flops.forward_flops(p, 32, "causal-lm")
    assert flops.training_flops(p, 32, "causal-lm", grad_ckpt=True) == 4 * flops.forward_flops(p, 32, "causal-lm")
    assert flops.generation_flops(p, 8, 1) == flops.forward_flops(p, 8, "causal-lm")
    assert flops.kv_cache_bytes(PRESETS["gpt2"], 512, 4) == 2 * 12 * 768 * 512 * 4  # seeds: ~38 MB
