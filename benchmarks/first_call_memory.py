"""What the fused engine holds after a first call that tuned its shape (CUDA only): memory allocated after compile,
after the first call, after a garbage collection, after release(), and after the shape is captured again.

    PYTHONPATH=src TRANSBENCH_CACHE_DIR=/tmp/empty python3 benchmarks/first_call_memory.py LABEL

Run it with an empty TRANSBENCH_CACHE_DIR so the first call tunes (bert-base 256 x 128 fp8, encoder layers)."""
from __future__ import annotations

import gc
import sys

import torch

from transbench.engine import compile_model
from transbench.models import build


def mib() -> float:
    return round(torch.cuda.memory_allocated() / 2**20, 1)


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "run"
    model = build.build_model(build.resolve("bert-base-uncased"), "base").half().cuda()
    c = compile_model(model, dtype="fp8", tune_budget_s=None)
    x = torch.randn(256, 128, 768, device="cuda", dtype=torch.float16)
    steps = {"after compile": mib()}
    c.encode(x)
    torch.cuda.synchronize()
    steps["after first call"] = mib()
    gc.collect()
    steps["after gc"] = mib()
    c.release()
    gc.collect()
    steps["after release"] = mib()
    c.encode(x)
    torch.cuda.synchronize()
    steps["after recapture"] = mib()
    print(label, " ".join(f"{k} {v}" for k, v in steps.items()), flush=True)


if __name__ == "__main__":
    main()
