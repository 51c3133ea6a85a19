"""How often `transbench compare` calls a change where there is none, and how often it sees a real one: pairs of
cells drawn from one distribution (and from two, B's median moved), each judged by compare.judge, the function
compare_records calls for every pair of ok cells, as it calls it (the medians of the samples, no repeats).

Per-call latencies are AR(1) noise in call order (phi 0, 0.5, 0.9, 0.95: correlation times 1, 3, 19 and 39 calls) on
a 10 ms median; `normal`: Gaussian innovations, marginal spread 5%; `lognormal`: innovations exp(N(0, 1)) centred,
a long slow tail as latencies have, marginal spread 5%. A and B are separate series (separate runs), seeded.

  PYTHONPATH=src python benchmarks/studies/compare_level.py --shift 0     # docs/compare.md's false rates, about 3 min
  PYTHONPATH=src python benchmarks/studies/compare_level.py --pairs 500 --shift 0.05,0.1 --kind normal   # its power

Prints one row per point: the share of pairs called `slower` or `faster` (shift 0: the false rate, nominal alpha at
--min-effect 0) or called `slower` (shift > 0: the power). CPU only; times are for 2 busy cores.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from transbench.report.compare import CompareConfig, judge

SPREAD = 0.05
MEDIAN = 10.0


def series(n: int, phi: float, kind: str, rng: np.random.Generator) -> np.ndarray:
    """n consecutive latencies (ms): AR(1) noise of marginal spread SPREAD, stationary from the first call."""
    burn = int(10 / (1 - phi)) if phi > 0 else 0
    if kind == "normal":
        e = rng.normal(0.0, 1.0, n + burn)
    else:  # exp(N(0, 1)) centred and scaled to unit variance: skewed, a long tail of slow calls
        s2 = math.e * (math.e - 1)
        e = (rng.lognormal(0.0, 1.0, n + burn) - math.exp(0.5)) / math.sqrt(s2)
    z = np.empty(n + burn)
    z[0] = e[0]
    c = math.sqrt(1 - phi * phi)
    for i in range(1, n + burn):
        z[i] = phi * z[i - 1] + c * e[i]
    return MEDIAN * (1 + SPREAD * z[burn:])


def point(args: tuple) -> tuple:
    """(slower, faster, n/a) over `pairs` seeded pairs at one point."""
    n, phi, kind, shift, pairs, min_effect, alpha = args
    cfg = CompareConfig(alpha=alpha, min_effect=min_effect)
    slower = faster = na = 0
    seed = [int(n), int(round(phi * 100)), kind == "normal", int(round(shift * 1000))]
    rng = np.random.default_rng(seed)
    for _ in range(pairs):
        a = series(n, phi, kind, rng)
        b = series(n, phi, kind, rng)
        if shift:
            # B's median moved by `shift`: the true median of a, the same distribution, moved multiplicatively
            b = b + MEDIAN * shift
        a_list, b_list = a.tolist(), b.tolist()
        v = judge(a_list, b_list, statistics.median(a_list), statistics.median(b_list), cfg)[2]
        slower += v == "slower"
        faster += v == "faster"
        na += v == "n/a"
    return slower, faster, na


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=2000)
    p.add_argument("--n", default="30,60,120,250,500")
    p.add_argument("--phi", default="0,0.5,0.9,0.95")
    p.add_argument("--kind", default="normal,lognormal")
    p.add_argument("--shift", default="0,0.05,0.1", help="B's median over A's, minus 1; 0: no change")
    p.add_argument("--min-effect", type=float, default=0.0)
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    points = [(int(n), float(phi), kind, float(s), args.pairs, args.min_effect, args.alpha)
              for s in args.shift.split(",") for kind in args.kind.split(",")
              for phi in args.phi.split(",") for n in args.n.split(",")]
    start = time.perf_counter()
    print(f"alpha {args.alpha}, min effect {args.min_effect}, {args.pairs} pairs a point; false: slower + faster "
          f"where shift is 0 (nominal {args.alpha:.1%}), power: slower where it is not")
    print(f"{'shift':>5} {'kind':>9} {'phi':>4} {'n':>4} {'rate':>7} {'x nominal':>9} {'slower':>6} {'faster':>6} "
          f"{'n/a':>5}")
    with ProcessPoolExecutor(args.workers) as pool:
        for (n, phi, kind, shift, pairs, _, alpha), (slower, faster, na) in zip(points, pool.map(point, points)):
            rate = (slower + faster if shift == 0 else slower) / pairs
            times = f"{rate / alpha:9.2f}" if shift == 0 else ""
            print(f"{shift:5.2f} {kind:>9} {phi:4.2f} {n:4d} {rate:7.2%} {times:>9} {slower:6d} {faster:6d} {na:5d}",
                  flush=True)
    print(f"{time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
