"""Which attention kernel a training step reaches through transformers' SDPA, eager and under torch.compile: the
aten attention ops that run (eager) or that AOTAutograd put in the compiled forward and backward graphs, for a
model built and stepped as a training cell builds it (bf16 autocast, train mode, dropout on).

    PYTHONPATH=src python3 benchmarks/studies/sdpa_choice.py --model bert-large-uncased --batch 8 --seq 128 \
        [--kernel FLASH_ATTENTION] [--no-dropout]

Why it exists: on an H100 (benchmarks/results/fp8_engine_h100_2026-11.md) the compiled bert-large step ran SDPA's
math path (softmax and dropout kernels, an fp32 CUDA-core GEMM) while the compiled gpt2 step ran cuDNN's attention.
Each variant prints the ops it found, or the error SDPA raised (a forced --kernel says why it cannot run)."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter


def _attention_op(name: str) -> bool:
    return any(k in name for k in ("attention", "softmax", "dropout"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="bert-large-uncased")
    p.add_argument("--task", default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--kernel", default=None, help="an SDPBackend name forced around the step (FLASH_ATTENTION, ...)")
    p.add_argument("--no-dropout", action="store_true", help="attention dropout 0 (the model's other dropouts stay)")
    args = p.parse_args(argv)

    import contextlib

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from transbench.models import build
    from transbench.scenarios.training.spec import default_task

    ref = build.resolve(args.model)
    task = args.task or default_task(ref.shape)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build.build_model(ref, task, attn="sdpa", device=device).train().requires_grad_(True)
    if args.no_dropout:
        for m in model.modules():
            if hasattr(m, "is_causal") and hasattr(m, "dropout") and isinstance(m.dropout, torch.nn.Dropout):
                m.dropout.p = 0.0
            if hasattr(m, "attn_dropout"):
                m.attn_dropout.p = 0.0
    ids = torch.randint(1, ref.shape.vocab - 1, (args.batch, args.seq), device=device)

    def kernel():
        if not args.kernel:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, args.kernel)])

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if _attention_op(str(func)):
                self.seen[str(func)] += 1
            return func(*args, **(kwargs or {}))

    def step(fn):
        with kernel(), torch.autocast(device, dtype=torch.bfloat16):
            loss = fn(input_ids=ids, labels=ids if task != "mlm" else ids)["loss"]
        loss.backward()

    graph_ops: Counter = Counter()

    def recording_backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified
        from functorch.compile import make_boxed_func

        def compiler(g, inputs):
            for n in g.graph.nodes:
                if n.op == "call_function" and _attention_op(str(n.target)):
                    graph_ops[str(n.target)] += 1
            return make_boxed_func(g.forward)
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler, bw_compiler=compiler)

    print(f"{args.model} {task} b{args.batch} s{args.seq} on {device}, kernel {args.kernel or 'chosen by SDPA'}"
          f"{', attention dropout 0' if args.no_dropout else ''}; torch {torch.__version__}")
    for label in ("eager", "compiled"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if label == "eager":
                    with Ops() as ops:
                        step(model)
                    found = ops.seen
                else:
                    torch._dynamo.reset()
                    step(torch.compile(model, backend=recording_backend))
                    found = graph_ops
                print(f"  {label}: {dict(found)}")
            except Exception as e:  # noqa: BLE001 - a diagnostic: print what SDPA said
                print(f"  {label}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        for w in caught:
            text = str(w.message)
            if "attention" in text.lower() or "sdp" in text.lower():
                print(f"    warning: {text[:400]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
