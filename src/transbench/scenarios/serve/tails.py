"""How far a tail percentile can be trusted: MLPerf LoadGen's early-stopping rule (mlcommons/inference,
loadgen/early_stopping.cc and results.cc, PerformanceSummary::EarlyStopping), in exact pure-Python math.

The rule: among n requests, t of them "over" (above a latency, or missing an objective), the claim "the true
p-th percentile is met" holds at confidence c when P(X <= t) < 1 - c for X ~ Binomial(n, 1 - p): had the true
share over been 1 - p, seeing as few as t overs would have been that unlikely. LoadGen's defaults: c = 0.99,
tolerance 0. From it:

- the minimum requests a p-th percentile needs: the smallest n where even t = 1 passes (LoadGen: 64 for p90,
  662 for p99), below which a percentile verdict is not valid;
- the early-stopping estimate: with t* the largest t that passes, the latency with t* - 1 latencies above it
  (LoadGen "would discard t* - 1 highest latency queries"), an upper bound on the true percentile at confidence c;
- a verdict against a target: met when the requests over it number at most t* - 1 (the estimate is within it).

Each P(X <= t) is one pass over the binomial's terms by their ratio (log space, no overflow), so the largest
t* over a million requests costs one pass, not LoadGen's nested searches."""

from __future__ import annotations

import math
from functools import lru_cache

CONFIDENCE = 0.99  # LoadGen's default (early_stopping: confidence = 0.99, tolerance = 0.0)


def _check(p: float, c: float) -> None:
    if not 0.0 < p < 1.0:
        raise ValueError(f"percentile share must be in (0, 1), got {p}")
    if not 0.0 < c < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {c}")


@lru_cache(maxsize=4096)
def passing_overs(n: int, p: float, c: float = CONFIDENCE) -> int:
    """t*: the largest count of requests over (of n) with P(Binomial(n, 1 - p) <= t*) < 1 - c; 0 where none passes
    (too few requests for the p-th percentile)."""
    _check(p, c)
    if n < 1:
        return 0
    q = 1.0 - p  # the chance one request is over, were the p-th percentile exactly at the bound
    limit = 1.0 - c
    log_term = n * math.log(p)  # log P(X = 0)
    ratio = math.log(q) - math.log(p)
    cdf, t = 0.0, -1
    for x in range(n + 1):
        if x:
            log_term += math.log(n - x + 1) - math.log(x) + ratio
        cdf += math.exp(log_term)
        if cdf >= limit:
            return max(t, 0)
        t = x
    return n


def allowed_overs(n: int, p: float, c: float = CONFIDENCE) -> int | None:
    """Requests of n that may be over a target while the p-th percentile still meets it (t* - 1); None when n is
    below the minimum (no verdict is valid)."""
    t = passing_overs(n, p, c)
    return t - 1 if t >= 1 else None


@lru_cache(maxsize=256)
def min_requests(p: float, c: float = CONFIDENCE) -> int:
    """The fewest requests with which a p-th percentile verdict is valid (LoadGen: 64 for p90, 662 for p99)."""
    _check(p, c)
    lo, hi = 1, 2
    while passing_overs(hi, p, c) < 1:
        hi *= 2
    while lo < hi:  # passing_overs(n) >= 1 is monotone in n
        mid = (lo + hi) // 2
        if passing_overs(mid, p, c) >= 1:
            hi = mid
        else:
            lo = mid + 1
    return lo


def upper_estimate(values: list[float], p: float, c: float = CONFIDENCE) -> float | None:
    """LoadGen's early-stopping estimate of the p-th percentile of `values` (an upper bound at confidence c), or
    None below the minimum count."""
    allowed = allowed_overs(len(values), p, c)
    if allowed is None:
        return None
    s = sorted(values)
    return s[len(s) - 1 - allowed]


def verdict(n: int, overs: int, p: float, c: float = CONFIDENCE) -> tuple[bool, bool]:
    """(valid, met): whether n requests are enough for a p-th percentile verdict, and whether one with `overs`
    requests over the target holds (never met when not valid)."""
    allowed = allowed_overs(n, p, c)
    if allowed is None:
        return False, False
    return True, overs <= allowed
