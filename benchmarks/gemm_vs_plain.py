"""`micro gemm`'s measurement against a plain CUDA-event loop over `a @ b`, in one process, with the SM
clock and power of each region (652 vs 721 TFLOPS at 8192 fp16, the GPU at its power cap).

    PYTHONPATH=src python3 benchmarks/gemm_vs_plain.py --sizes 4096,8192 --dtype fp16,bf16

For each size and dtype, alternately, three rounds: transbench's point (scenarios/micro/gemm.measure, the
same code `transbench micro gemm` runs) and a plain loop (one second of back-to-back calls after 5 warm-up, one
event pair around them: sustained, as transbench's point is; a 30-call burst ran at another power state). The plain
loop cycles as many random operand pairs as transbench's point does (together twice the L2 cache, so each call reads
its operands from HBM), and once more with one pair, which small sizes find in L2 (the figure a loop over one `a @ b`
gives). Below about n = 2048 (fp16, H200) a call is as fast as the host launches it, and all three columns are the
host's (benchmarks/results/plain_loop_points_h200_2026-11.md). Both report TFLOPS with the median SM clock and
power of their own region; the ratio column compares TFLOPS per MHz, i.e. the two at the same clock."""

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

    def plain_loop(n: int, dtype: str, sets: int) -> tuple:
        """TFLOPS, SM clock and power of back-to-back `a @ b` over `sets` operand pairs, round robin."""
        dev.set_matmul_precision(dtype)
        t = dev.torch_dtype(dtype)
        pairs = [(torch.randn(n, n, device=device, dtype=t), torch.randn(n, n, device=device, dtype=t))
                 for _ in range(sets)]

        def calls(k: int) -> None:
            for i in range(k):
                a, b = pairs[i % sets]
                a @ b

        calls(5)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        calls(10)
        end.record()
        end.synchronize()
        count = max(30, int(1000 / (start.elapsed_time(end) / 10)))  # a second: sustained, like ours
        with Monitor(device) as m:
            start.record()
            calls(count)
            end.record()
            end.synchronize()
        ms = start.elapsed_time(end) / count
        c = m.context.summary()
        del pairs
        torch.cuda.empty_cache()
        return 2 * n**3 / (ms / 1e3) / 1e12, c["sm_clock_mhz"], c["power_median_w"]

    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        for dtype in args.dtype.split(","):
            opts = GemmOptions(sizes=[n], dtypes=[dtype], device="cuda").resolved(device)
            ours, plain, warm = [], [], []
            for _ in range(args.rounds):
                pt = gemm.measure(gemm.GemmShape("square", n, n, n), dtype, opts, ctx)
                if pt.status != "ok":  # unsupported (fp8 off multiples of 16), wrong, oom: no figure to compare
                    print(f"{n} {dtype}: {pt.status} ({pt.error})", flush=True)
                    break
                ours.append((pt.record["tflops"], pt.record.get("sm_clock_mhz"), pt.record.get("avg_power_w")))
                sets = pt.info.get("operand_sets", 1)
                plain.append(plain_loop(n, dtype, sets))
                warm.append(plain_loop(n, dtype, 1))
            if not ours:
                continue
            med = lambda xs, i: statistics.median(x[i] for x in xs if x[i] is not None)  # noqa: E731
            o, pl, w = ([med(xs, i) for i in range(3)] for xs in (ours, plain, warm))
            per_mhz = (o[0] / o[1]) / (pl[0] / pl[1]) if o[1] and pl[1] else None
            rows.append((f"{n} {dtype}", sets, o, pl, per_mhz, w))
    print(f"\n{'gemm':<11} {'sets':>5} {'transbench TFLOPS @ MHz, W':>28} {'plain loop, same sets':>24} "
          f"{'same-clock ratio':>17} {'plain loop, one set (L2-warm)':>30}")
    for label, sets, o, pl, r, w in rows:
        print(f"{label:<11} {sets:>5} {o[0]:>10.1f} @ {o[1]:>5.0f}, {o[2]:>4.0f} {pl[0]:>8.1f} @ {pl[1]:>5.0f}, "
              f"{pl[2]:>4.0f} {r if r is None else f'{r:.3f}':>17} {w[0]:>14.1f} @ {w[1]:>5.0f}, {w[2]:>4.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
