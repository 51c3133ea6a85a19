"""transbench's sampler against a plain CUDA-event loop, in one process, on the same prepared callable.

    PYTHONPATH=src python3 benchmarks/plain_loop_check.py --model bert-base-uncased --backend sdpa,fused \
        --point 64x512 --point 8x384 --dtype fp16

For each backend and batch x seq point: the model is prepared once through transbench's own path
(scenarios/inference/measure.py: model_for, backend.prepare), then timed alternately, three rounds each, by
(a) transbench's sampler (measure/timer.sample: one synchronized call per sample, median) and (b) a plain
loop: CUDA events around N back-to-back calls, divided by N. The SM clock and power of each region are
read through NVML (measure/context.py), so a difference can be told from a clock change. Prints one row
per point: both medians, their ratio, and the clocks.

With --new-tokens N the points are generation cells (`--task generate`): the decoder is built as the scenario builds
it (scenarios/generation/measure.py make_generator), and each round times (a) three generations by the scenario's
own step clock (`greedy` with `StepClock`: the median of the decode steps) and (b) N - 1 back-to-back decode steps
(`greedy_step`, what the scenario calls) from the same prompt between two CUDA events:

    PYTHONPATH=src python3 benchmarks/plain_loop_check.py --model gpt2 --backend fused --point 1x512 \
        --new-tokens 128 --dtype fp16"""

from __future__ import annotations

import argparse
import statistics
import sys


def plain_loop_ms(fn, calls: int) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="bert-base-uncased")
    p.add_argument("--backend", default="sdpa,fused")
    p.add_argument("--point", action="append", default=None, help="BATCHxSEQ, repeatable")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=None, help="generation cells of this many new tokens (2 or more)")
    args = p.parse_args(argv)
    if args.new_tokens is not None and args.new_tokens < 2:  # a generation of one token has no decode step to time
        p.error(f"--new-tokens must be at least 2, got {args.new_tokens}")
    import torch

    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    from transbench import backends
    from transbench.cells import Cell
    from transbench.measure import timer
    from transbench.measure.context import Monitor
    from transbench.models import build
    from transbench.scenarios.inference.measure import ModelCache, cell_inputs, model_for

    device = torch.device("cuda", 0)
    cache = ModelCache()
    rows = []
    for point in args.point or ["64x512", "8x384"]:
        batch, seq = (int(x) for x in point.lower().split("x"))
        for name in args.backend.split(","):
            if args.new_tokens:
                ours, plain, clocks = generation_rounds(args, name, batch, seq, cache, device)
                rows.append((f"{name} {batch}x{seq} decode", statistics.median(ours), statistics.median(plain),
                             statistics.median(ours) / statistics.median(plain), min(clocks), max(clocks)))
                continue
            cell = Cell(args.model, "base", name, args.dtype, batch, seq, device="cuda:0")
            backend = backends.get(name)
            model = model_for(cache, cell, backend, device)
            inputs = cell_inputs(cell, build.resolve(args.model).shape).to(device)
            prepared = backend.prepare(model, inputs, cell)
            prepared.fn()
            torch.cuda.synchronize()
            ours, plain, clocks = [], [], []
            for _ in range(args.rounds):
                s = timer.sample(prepared.fn, device, timer.TimerConfig(warmup=5, min_time_s=1.0, min_count=20))
                ours.append(s.stats.median_ms)
                clocks.append(s.context.summary()["sm_clock_mhz"])
                calls = max(20, int(1000 / max(s.stats.median_ms, 1e-3)))
                plain_loop_ms(prepared.fn, 5)
                with Monitor(device) as m:
                    plain.append(plain_loop_ms(prepared.fn, calls))
                clocks.append(m.context.summary()["sm_clock_mhz"])
            a, b = statistics.median(ours), statistics.median(plain)
            print(f"{name} {batch}x{seq} rounds: transbench {' '.join(f'{x:.4f}' for x in ours)}; "
                  f"plain loop {' '.join(f'{x:.4f}' for x in plain)}", flush=True)
            rows.append((f"{name} {batch}x{seq}", a, b, a / b, min(c for c in clocks if c) if any(clocks) else None,
                         max(c for c in clocks if c) if any(clocks) else None))
            del model, prepared, inputs
            torch.cuda.empty_cache()
    print(f"\n{'point':<22} {'transbench ms':>14} {'plain loop ms':>14} {'ratio':>7} {'SM MHz min-max':>15}")
    for label, a, b, r, lo, hi in rows:
        print(f"{label:<22} {a:>14.4f} {b:>14.4f} {r:>7.3f} {lo or 0:>7.0f}-{hi or 0:<7.0f}")
    worst = max(abs(r[3] - 1) for r in rows)
    print(f"largest difference: {worst:.1%} ({'within' if worst <= 0.05 else 'OVER'} 5%)")
    return 0


def generation_rounds(args, name: str, batch: int, seq: int, cache, device):
    """(the scenario's decode ms a token per generation, the plain loop's per round, SM clocks) of one generation
    cell, its decoder built and warmed as the scenario does."""
    from transbench import backends
    from transbench.backends.decoders import greedy_step, make_generator
    from transbench.cells import Cell
    from transbench.measure.context import Monitor
    from transbench.models import build
    from transbench.scenarios.generation.measure import StepClock, greedy
    from transbench.scenarios.inference.measure import cell_inputs, model_for

    n = args.new_tokens
    cell = Cell(args.model, "generate", name, args.dtype, batch, seq, device="cuda:0", new_tokens=n)
    backend = backends.get(name)
    gen = make_generator(backend, model_for(cache, cell, backend, device), cell)
    prompt = cell_inputs(cell, build.resolve(args.model).shape).input_ids.to(device)
    greedy(gen, prompt, n)  # compiles, tunes or captures
    clock, ours, plain, clocks = StepClock(device, n), [], [], []
    nxt = [None]  # the step's tokens, fed back to it

    def step():
        nxt[0] = greedy_step(gen, nxt[0])
    for _ in range(args.rounds):
        with Monitor(device) as m:
            for _ in range(3):
                greedy(gen, prompt, n, clock)
                ours.append(statistics.median(clock.elapsed_ms()[1:]))
        clocks.append(m.context.summary()["sm_clock_mhz"])
        nxt[0] = gen.prefill(prompt).argmax(-1)
        with Monitor(device) as m:
            plain.append(plain_loop_ms(step, n - 1))
        clocks.append(m.context.summary()["sm_clock_mhz"])
    print(f"{name} {batch}x{seq} decode rounds: transbench {' '.join(f'{x:.4f}' for x in ours)}; "
          f"plain loop {' '.join(f'{x:.4f}' for x in plain)}", flush=True)
    return ours, plain, [c for c in clocks if c] or [0]


if __name__ == "__main__":
    sys.exit(main())
