"""When requests arrive: Poisson arrival times planned ahead from a seed (open loop), so a slow model can
never delay an arrival (no coordinated omission); closed loops and offline runs plan no times at all."""

from __future__ import annotations

import random

MIN_REQUESTS = 20  # a percentile over fewer requests says little (a bisection probe may ask a low rate)


def window_s(rate: float, warmup: float, duration: float) -> float:
    """Seconds over which a rate's arrivals are planned: a low rate's window stretches to MIN_REQUESTS expected
    arrivals after the warm-up."""
    return warmup + max(duration, MIN_REQUESTS / rate)


def poisson_arrivals(rate: float, span_s: float, seed: int) -> list[float]:
    """Arrival times in seconds from the start, over [0, span_s): exponential gaps of mean 1/rate."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    rng = random.Random(seed)
    times, t = [], rng.expovariate(rate)
    while t < span_s:
        times.append(t)
        t += rng.expovariate(rate)
    return times
