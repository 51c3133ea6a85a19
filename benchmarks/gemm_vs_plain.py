"""`micro gemm`'s measurement against a plain CUDA-event loop over `a @ b`, in one process, with the SM
clock and power of each region (652 vs 721 TFLOPS at 8192 fp16, the GPU at its power cap).

    PYTHONPATH=src python3 benchmarks/gemm_vs_plain.py --sizes 4096,8192 --dtype fp16,bf16

For each size and dtype, alternately, three rounds: transbench's point (scenarios/micro/gemm.measure, the
same code `transbench micro gemm` runs) and a plain loop (fresh random operands, one second of back-to-back
calls after 5 warm-up, one event pair around them: sustained, as transbench's point is; a 30-call burst
ran at another power state). Both report TFLOPS with the median SM clock and power of their own
region; the last column compares TFLOPS per MHz, i.e. the two at the same clock."""

from __future__ import annotations

import argparse
import statistics
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4096,8192")
    p.add_argument("--dtype", default="fp16,bf16")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    from transbench.measure import device as dev
    from transbench.measure.context import Monitor
    from transbench.scenarios.micro import gemm
    from transbench.scenarios.micro.common import make_context
    from transbench.scenarios.micro.options import GemmOptions

    device = torch.device("cuda", 0)
    ctx = make_context(device, "unused.db", 1.0, 5)
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        for dtype in args.dtype.split(","):
            opts = GemmOptions(sizes=[n], dtypes=[dtype], device="cuda").resolved(device)
            ours, plain = [], []
            for _ in range(args.rounds):
                pt = gemm.measure(gemm.GemmShape("square", n, n, n), dtype, opts, ctx)
                ours.append((pt.record["tflops"], pt.record.get("sm_clock_mhz"), pt.record.get("avg_power_w")))
                dev.set_matmul_precision(dtype)
                t = dev.torch_dtype(dtype)
                a = torch.randn(n, n, device=device, dtype=t)
                b = torch.randn(n, n, device=device, dtype=t)
                for _ in range(5):
                    a @ b
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(10):
                    a @ b
                end.record()
                end.synchronize()
                calls = max(30, int(1000 / (start.elapsed_time(end) / 10)))  # a second: sustained, like ours
                with Monitor(device) as m:
                    start.record()
                    for _ in range(calls):
                        a @ b
                    end.record()
                    end.synchronize()
                ms = start.elapsed_time(end) / calls
                c = m.context.summary()
                plain.append((2 * n**3 / (ms / 1e3) / 1e12, c["sm_clock_mhz"], c["power_median_w"]))
                del a, b
                torch.cuda.empty_cache()
            med = lambda xs, i: statistics.median(x[i] for x in xs if x[i] is not None)  # noqa: E731
            o, pl = [med(ours, i) for i in range(3)], [med(plain, i) for i in range(3)]
            per_mhz = (o[0] / o[1]) / (pl[0] / pl[1]) if o[1] and pl[1] else None
            rows.append((f"{n} {dtype}", o, pl, per_mhz))
    print(f"\n{'gemm':<11} {'transbench TFLOPS @ MHz, W':>28} {'plain loop TFLOPS @ MHz, W':>28} {'same-clock ratio':>17}")
    for label, o, pl, r in rows:
        print(f"{label:<11} {o[0]:>10.1f} @ {o[1]:>5.0f}, {o[2]:>4.0f} {pl[0]:>12.1f} @ {pl[1]:>5.0f}, {pl[2]:>4.0f}"
              f" {r if r is None else f'{r:.3f}':>17}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
