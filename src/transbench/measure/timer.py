"""Timing: warm-up, adaptive stop on a minimum time and count, robust statistics over raw samples."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

NOISY_IQR_RATIO = 0.05


@dataclass(frozen=True)
class TimerConfig:
    warmup: int = 3
    min_time_s: float = 1.0
    min_count: int = 10
    max_count: int = 10_000
    max_time_s: float = 120.0  # a hard stop for very slow cells, whatever min_count says
    warmup_time_s: float = 0.25  # GPU only: clocks ramp up from idle over a fraction of a second


@dataclass(frozen=True)
class Stats:
    median_ms: float
    mean_ms: float
    min_ms: float
    p90_ms: float
    p99_ms: float
    iqr_ms: float
    std_ms: float
    n: int
    noisy: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _quantile(sorted_ms: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted data."""
    pos = q * (len(sorted_ms) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (pos - lo)


def summarize(samples_ms: list[float]) -> Stats:
    if not samples_ms:
        raise ValueError("no samples to summarize")
    s = sorted(samples_ms)
    median = _quantile(s, 0.5)
    iqr = _quantile(s, 0.75) - _quantile(s, 0.25)
    return Stats(
        median_ms=median,
        mean_ms=statistics.fmean(s),
        min_ms=s[0],
        p90_ms=_quantile(s, 0.90),
        p99_ms=_quantile(s, 0.99),
        iqr_ms=iqr,
        std_ms=statistics.pstdev(s),
        n=len(s),
        noisy=median > 0 and iqr / median > NOISY_IQR_RATIO,
    )


class Clock:
    """Times one call. On CUDA: events around the call, then a synchronize, so each sample is the
    device time of one call started on an idle device (its launch overhead included). On CPU: perf_counter."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        if self.cuda:
            self._torch = torch
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def time_ms(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            self._start.record()
            fn()
            self._end.record()
            self._end.synchronize()
            return self._start.elapsed_time(self._end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def sample(fn: Callable[[], object], device, cfg: TimerConfig = TimerConfig()) -> list[float]:
    """Warm up, then time `fn` until both min_time and min_count are reached; the raw samples in ms."""
    clock = Clock(device)
    warm_started = time.perf_counter()
    done = 0
    while done < cfg.warmup or (clock.cuda and time.perf_counter() - warm_started < cfg.warmup_time_s):
        clock.time_ms(fn)
        done += 1
    samples: list[float] = []
    started = time.perf_counter()
    while True:
        samples.append(clock.time_ms(fn))
        wall = time.perf_counter() - started
        enough = sum(samples) >= cfg.min_time_s * 1e3 and len(samples) >= cfg.min_count
        if enough or len(samples) >= cfg.max_count or wall >= cfg.max_time_s:
            return samples
