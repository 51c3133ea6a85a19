"""The largest arrival rate whose requests meet a target, by bisection between 0 and the
offline throughput (no rate above what the model serves with every batch full can be sustained)."""

from __future__ import annotations

from collections.abc import Callable

REL_TOL = 0.05  # a rate known to 5%: finer than run-to-run spread of a tail percentile over seconds
MAX_PROBES = 8


def find_max_rate(probe: Callable[[float], float | tuple | None], slo_ms: float | None, capacity: float,
                  rel_tol: float = REL_TOL, max_probes: int = MAX_PROBES,
                  lowest: float = 0.0) -> tuple[float | None, list]:
    """`probe(rate)` runs a load at `rate` and returns its latency percentile in ms (None: the probe failed,
    which ends the search), or (a figure to show, passed) where the probe judges itself (LoadGen's early-stopping
    verdict, stats.account's slo_met: a probe with too few requests for its percentile never passes). Returns
    (largest passing rate or None, [(rate, latency or None, passed), ...]).
    Every probe is below `capacity` (at most capacity (1 - 2^-max_probes)): with the offline cell's rate there, a probe
    plans fewer arrivals than that cell served over the same window, so serve_spec.MAX_REQUESTS need not bound it.
    No probe is run at or below `lowest`, where a load would outlast the cell's deadline (a low rate's window
    stretches to serve_arrivals.MIN_REQUESTS arrivals): the search ends there."""
    trail: list[tuple[float, float | None, bool]] = []
    lo, hi = 0.0, capacity
    best = None
    while len(trail) < max_probes and hi - lo > rel_tol * hi:
        rate = (lo + hi) / 2
        if rate <= lowest:
            break
        result = probe(rate)
        lat, ok = result if isinstance(result, tuple) else (result, result is not None and result <= slo_ms)
        trail.append((rate, lat, ok))
        if result is None:
            break
        if ok:
            lo, best = rate, rate
        else:
            hi = rate
    return best, trail
