"""Task agreement and rel_err of the reduced-precision recipes, on the CPU, against fp32: what the correctness gate
of `run` rests on (docs/quantization.md). Measured with the package's own functions (measure/agreement.py, the
inference scenario's answers and rel_err, models/quant.py), so the figures are the ones a cell would record.

  PYTHONPATH=src python benchmarks/studies/agreement.py                 # about 3 minutes on two cores
  PYTHONPATH=src python benchmarks/studies/agreement.py --no-presets    # the packaged checkpoint only

Random-weight presets as `transbench run` builds them, on random tokens: a bare encoder's sentence embeddings
(bert-base 16 x 128) and heads' argmax predictions (bert-base mlm 4 x 128, gpt2 causal-lm 2 x 128). The packaged
all-MiniLM-L6-v2 checkpoint on the packaged sentences (scenarios/inference/sentences.py). Recipes: bf16 (the model
cast), int8-weight, int8-dynamic (torchao), nf4 (bitsandbytes, where it imports), and the fused engine's fp8
emulated on the CPU (fp32 products of e4m3 values; bare BERT encoders only). One line per model and recipe.
"""
from __future__ import annotations

import argparse
import copy
import importlib.util

import torch

from transbench.measure import agreement
from transbench.models import build, quant
from transbench.scenarios.inference.answers import answers, measures
from transbench.scenarios.inference.measure import rel_err
from transbench.scenarios.inputs import make_inputs

PRESETS = (("bert-base-uncased", "base", 16, 128), ("bert-base-uncased", "mlm", 4, 128),
           ("gpt2", "causal-lm", 2, 128))


def recipes(model, task: str):
    """(name, the model under that recipe) for each recipe that runs here."""
    yield "bf16", copy.deepcopy(model).to(torch.bfloat16)
    wanted = ["int8-weight", "int8-dynamic"] + (["nf4"] if importlib.util.find_spec("bitsandbytes") else [])
    for name in wanted:
        q = copy.deepcopy(model)
        quant.apply(q, name)
        yield name, q
    if task == "base" and model.config.model_type == "bert":
        from transbench.engine import compile_model

        yield "fused fp8 (emulated)", compile_model(copy.deepcopy(model), dtype=torch.float32, fp8=True)


def compare(label: str, model, task: str, inputs) -> None:
    kwargs = inputs.model_kwargs()
    width = inputs.input_ids.shape[1]

    def output(m):
        with torch.inference_mode():
            out = m(**kwargs)
        return (out.last_hidden_state if task == "base" else out.logits).float()

    want = output(model)
    ref = answers(want, task, inputs.lengths)
    for name, m in recipes(model, task):
        got = output(m)
        shown = {k: v for k, v in measures(answers(got, task, inputs.lengths), ref, task).items()
                 if k != "task_agreement"}
        figures = " ".join(f"{k} {v:.5f}" if isinstance(v, float) else f"{k} -" for k, v in shown.items())
        short = agreement.shortfall(shown) or "meets the targets"
        print(f"{label} {name}: rel_err {rel_err(got, want, inputs.lengths, width):.3g} {figures} ({short})",
              flush=True)


def presets() -> None:
    for name, task, batch, seq in PRESETS:
        ref = build.resolve(name)
        kinds = build.input_kinds(ref)
        inputs = make_inputs(ref.shape.vocab, batch, seq, token_types=kinds.token_types, pad_id=kinds.pad_id,
                             max_len=ref.shape.max_positions, seed=1)
        compare(f"{name} {task} {batch}x{seq}", build.build_model(ref, task).eval(), task, inputs)


def minilm() -> None:
    from transbench.demo import packaged_checkpoint
    from transbench.scenarios.inference.sentences import SENTENCES, sentence_inputs

    ref = build.resolve(str(packaged_checkpoint()))
    compare(f"all-MiniLM-L6-v2 base, {len(SENTENCES)} sentences", build.build_model(ref, "base").eval(), "base",
            sentence_inputs(ref))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-presets", action="store_true", help="the packaged checkpoint only")
    a = ap.parse_args()
    torch.manual_seed(0)
    if not a.no_presets:
        presets()
    minilm()


if __name__ == "__main__":
    main()
