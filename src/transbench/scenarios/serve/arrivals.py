"""When requests arrive: times planned ahead from a seed (open loop), so a slow model can never delay an arrival
(no coordinated omission); closed loops and offline runs plan no times at all.

Kinds (`--arrivals`): `poisson` (exponential gaps), `gamma:B` (gamma gaps of burstiness B as vLLM's
benchmark_serving defines it: shape B, scale 1 / (rate B), so the mean gap stays 1 / rate and the variance is
1 / (B rate^2): B < 1 burstier than Poisson, B > 1 steadier, B = 1 Poisson) and `constant` (gaps of exactly
1 / rate). A trace (`--trace`, scenarios/serve/trace.py) brings its own times. Planning is separate from issuing
(load.py): any target, in-process or over HTTP, can replay the same plan."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ...errors import SpecError
from ...spec import read_number

MIN_REQUESTS = 20  # a percentile over fewer requests says little (a bisection probe may ask a low rate)
FORMS = "poisson, gamma:B (burstiness 0.01 <= B <= 1e6; 1 is Poisson) or constant"
MAX_BURSTINESS = 1e6  # past it gaps are constant to the float's precision
# Below it the gamma draws (random.gammavariate, shape B) underflow to exactly 0: at B = 0.001 about half of them,
# so half the requests arrive at one instant, and far below every gap is 0, and `gamma:1e-300` planned arrivals for
# ever, its list growing without bound. At 0.01 under 0.1% of the draws are 0, and the gaps' coefficient of
# variation is already 10 (Poisson's is 1).
MIN_BURSTINESS = 0.01


@dataclass(frozen=True)
class Arrivals:
    kind: str = "poisson"  # poisson | gamma | constant
    burstiness: float = 1.0  # gamma's shape

    @property
    def label(self) -> str:
        return f"gamma:{self.burstiness:g}" if self.kind == "gamma" else self.kind

    def times(self, rate: float, span_s: float, seed: int) -> list[float]:
        """Arrival times in seconds from the start, over [0, span_s), `rate` per second on average."""
        if rate <= 0:
            raise ValueError("rate must be positive")
        if self.kind == "constant":
            gap = 1.0 / rate
            return [i * gap for i in range(1, math.ceil(span_s * rate) + 1) if i * gap < span_s]
        rng = random.Random(seed)
        if self.kind == "gamma":
            shape, scale = self.burstiness, 1.0 / (rate * self.burstiness)
            gap = lambda: rng.gammavariate(shape, scale)  # noqa: E731
        else:
            gap = lambda: rng.expovariate(rate)  # noqa: E731
        times, t = [], gap()
        while t < span_s:
            times.append(t)
            t += gap()
        return times


def parse(text: str) -> Arrivals:
    """`--arrivals` as given; SpecError names what is wrong."""
    kind, _, rest = str(text).partition(":")
    if kind in ("poisson", "constant") and not rest:
        return Arrivals(kind)
    if kind == "gamma" and rest:
        try:
            b = read_number(rest, float)
        except ValueError:
            raise SpecError(f"--arrivals {text}: burstiness '{rest}' is not a number; use {FORMS}") from None
        if not (math.isfinite(b) and MIN_BURSTINESS <= b <= MAX_BURSTINESS):
            raise SpecError(f"--arrivals {text}: burstiness must be at least {MIN_BURSTINESS:g} and at most "
                            f"{MAX_BURSTINESS:g}")
        return Arrivals("poisson") if b == 1 else Arrivals("gamma", b)
    raise SpecError(f"--arrivals '{text}' is not understood: use {FORMS}")


def window_s(rate: float, warmup: float, duration: float, need: int = MIN_REQUESTS, limit: float | None = None) -> float:
    """Seconds over which a rate's arrivals are planned: a low rate's window stretches to `need` expected arrivals
    after the warm-up (a percentile verdict's minimum, tails.min_requests), never past `limit` seconds (what the
    cell's --timeout leaves), nor below warm-up + duration."""
    span = warmup + max(duration, need / rate)
    if limit is not None:
        span = max(min(span, limit), warmup + duration)
    return span


def poisson_arrivals(rate: float, span_s: float, seed: int) -> list[float]:
    """Arrival times in seconds from the start, over [0, span_s): exponential gaps of mean 1/rate."""
    return Arrivals("poisson").times(rate, span_s, seed)
