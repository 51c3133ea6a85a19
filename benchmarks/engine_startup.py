"""What the fused engine costs before it runs fast (items 2 and 4), one measurement per process.

  PYTHONPATH=src python benchmarks/engine_startup.py first-call --model bert-base-uncased --shape 1x128 [--dtype fp8] [--no-budget]
  PYTHONPATH=src python benchmarks/engine_startup.py generate [--requests 5]

first-call: seconds from the call to its result for a new shape in this process (tuning, Triton compiles, graph
capture), with the tuning table and Triton cache the environment points to (TRANSBENCH_CACHE_DIR,
TRITON_CACHE_DIR): fresh folders give a cold start, a table written by `transbench tune` a warm one.
generate: gpt2, batch 1, prompt 512, 128 new tokens, greedy: ms per request with a fresh generator per request
against one reused generator (after one request has captured the graphs). Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def first_call(model: str, shape: str, dtype: str, budget: bool) -> dict:
    from transbench.engine import compile_model
    from transbench.measure import device as dev
    from transbench.models import build

    b, s = (int(v) for v in shape.split("x"))
    ref = build.resolve(model)
    m = build.build_model(ref, "base", device="cuda").to(dev.torch_dtype(dtype))
    kw = {} if budget else {"tune_budget_s": None}
    c = compile_model(m, dtype=dev.torch_dtype(dtype), fp8=dtype == "fp8", max_batch=b, **kw)
    ids = torch.randint(0, ref.shape.vocab, (b, s), device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    c(input_ids=ids)
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    start = time.perf_counter()
    c(input_ids=ids)
    torch.cuda.synchronize()
    routes = next(iter(c.tuning().values()), {}).get("routes") or {}
    return {"part": "first-call", "model": model, "shape": shape, "dtype": dtype, "budget": budget,
            "first_s": round(first, 3), "second_ms": round((time.perf_counter() - start) * 1e3, 3),
            "fp8_routes": sum(r.startswith("fp8") for r in routes.values()), "routes": len(routes)}


def generate(requests: int, prompt: int = 512, new: int = 128) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    from transbench.engine import compile_model

    m = GPT2LMHeadModel(GPT2Config()).cuda().half().eval()
    c = compile_model(m, dtype=torch.float16, max_batch=1)
    ids = torch.randint(0, 50257, (1, prompt), device="cuda")

    def request(gen) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        nxt = gen.prefill(ids).argmax(-1)
        for _ in range(new - 1):
            nxt = gen.decode(nxt).argmax(-1)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    first = request(c.generator(1, prompt + new))  # captures (and tunes) the prefill and decode graphs
    reused = c.generator(1, prompt + new)
    same = [request(reused) for _ in range(requests)]
    fresh = [request(c.generator(1, prompt + new)) for _ in range(requests)]
    return {"part": "generate", "first_ms": round(first, 1), "reused_ms": round(statistics.median(same), 2),
            "fresh_ms": round(statistics.median(fresh), 2),
            "fresh_over_reused": round(statistics.median(fresh) / statistics.median(same), 4)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["first-call", "generate"])
    ap.add_argument("--model", default="bert-base-uncased")
    ap.add_argument("--shape", default="1x128")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp8"])
    ap.add_argument("--no-budget", action="store_true", help="tune every route (what the first call cost before)")
    ap.add_argument("--requests", type=int, default=5)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: engine_startup.py measures on a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    out = first_call(a.model, a.shape, a.dtype, not a.no_budget) if a.part == "first-call" else generate(a.requests)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
