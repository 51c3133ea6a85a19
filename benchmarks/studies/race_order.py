"""Does a whole-forward race favour the forward timed first? (CUDA only)

engine/tuning.py `Tuner._race` times the best forward so far and a trial forward in rounds. This races one captured
forward against itself, so every difference it reports is the timing's own: per race the median trial / best ratio,
with the best timed first in every round, then with the order alternating between rounds. A pause between races
stands for the capture of the next trial, during which the GPU idles.

    PYTHONPATH=src python3 benchmarks/studies/race_order.py --model bert-large-uncased --batch 128 --seq 384 --dtype fp8"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from transbench.engine import compile_model
from transbench.engine.tuning import replay_ms
from transbench.models import build


def race(fn, rounds: int, alternate: bool) -> float:
    """trial / best, medians over `rounds`, as Tuner._race times them; both are fn."""
    best, trial = [], []
    for r in range(rounds):
        if alternate and r % 2:
            trial.append(replay_ms(fn))
            best.append(replay_ms(fn))
        else:
            best.append(replay_ms(fn))
            trial.append(replay_ms(fn))
    return statistics.median(trial) / statistics.median(best)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert-large-uncased")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=384)
    ap.add_argument("--dtype", default="fp8")
    ap.add_argument("--races", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pause", type=float, default=0.5, help="seconds idle before each race (a trial's capture)")
    a = ap.parse_args()
    model = build.build_model(build.resolve(a.model), "base").half().cuda()
    compiled = compile_model(model, dtype="fp8" if a.dtype == "fp8" else torch.float16, max_batch=a.batch)
    x = torch.randn(a.batch, a.seq, model.config.hidden_size, device="cuda", dtype=torch.float16)
    fn = lambda: compiled.encode(x)  # noqa: E731 - replays the captured forward after the first call
    fn()
    torch.cuda.synchronize()
    for alternate in (False, True, False, True):
        ratios = []
        for _ in range(a.races):
            time.sleep(a.pause)
            ratios.append(race(fn, a.rounds, alternate))
        order = "alternating" if alternate else "best first"
        print(f"{a.model} {a.batch}x{a.seq} {a.dtype} {order:>12}: trial/best median {statistics.median(ratios):.4f}, "
              f"mean {statistics.mean(ratios):.4f}, min {min(ratios):.4f}, max {max(ratios):.4f}, "
              f"beyond 1% either way {sum(abs(r - 1) > 0.01 for r in ratios)}/{len(ratios)}", flush=True)


if __name__ == "__main__":
    main()
