"""Why transbench's median and a plain CUDA-event loop's mean can differ on a host-bound cell.

    PYTHONPATH=src python3 benchmarks/host_bound_check.py --model gpt2-medium --backend eager --point 2x96 --dtype fp16

On one prepared callable (transbench's own path, as benchmarks/plain_loop_check.py), interleaved over rounds: the
sampler's median, mean, p90 and p99; a plain loop's mean over back-to-back calls with the garbage collector on and
off; the host's own time a call (perf_counter, no synchronize); and the share of calls during which Python's
collector ran (gc.callbacks)."""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2-medium")
    p.add_argument("--backend", default="eager")
    p.add_argument("--point", default="2x96")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    from transbench import backends
    from transbench.cells import Cell
    from transbench.measure import timer
    from transbench.models import build
    from transbench.scenarios.inference.measure import ModelCache, cell_inputs, model_for

    sys.path.insert(0, "benchmarks")
    from plain_loop_check import plain_loop_ms

    device = torch.device("cuda", 0)
    batch, seq = (int(x) for x in args.point.lower().split("x"))
    cell = Cell(args.model, "base", args.backend, args.dtype, batch, seq, device="cuda:0")
    backend = backends.get(args.backend)
    model = model_for(ModelCache(), cell, backend, device)
    inputs = cell_inputs(cell, build.resolve(args.model).shape).to(device)
    fn = backend.prepare(model, inputs, cell).fn
    fn()
    torch.cuda.synchronize()
    collections = [0]

    def on_gc(phase, info):
        if phase == "start" and info.get("generation", 0) >= 0:
            collections[0] += 1

    for r in range(args.rounds):
        s = timer.sample(fn, device, timer.TimerConfig(warmup=5, min_time_s=1.0, min_count=20))
        st = s.stats
        calls = max(20, int(1000 / max(st.median_ms, 1e-3)))
        plain_loop_ms(fn, 5)
        on = plain_loop_ms(fn, calls)
        gc.disable()
        off = plain_loop_ms(fn, calls)
        gc.enable()
        torch.cuda.synchronize()
        gc.callbacks.append(on_gc)
        collections[0] = 0
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host = (time.perf_counter() - t0) * 1e3 / calls
        gc.callbacks.remove(on_gc)
        torch.cuda.synchronize()
        print(f"round {r}: sampler median {st.median_ms:.4f} mean {st.mean_ms:.4f} p90 {st.p90_ms:.4f} "
              f"p99 {st.p99_ms:.4f} n {st.n}; plain loop gc on {on:.4f} gc off {off:.4f}; host a call {host:.4f} ms, "
              f"collections per call {collections[0] / calls:.2f}", flush=True)
        srt = sorted(s.samples_ms)
        print("   sampler deciles: " + " ".join(f"{srt[int(q * (len(srt) - 1))]:.3f}" for q in
                                                  (0, .1, .2, .3, .4, .5, .6, .7, .8, .9, 1.0)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
