"""The largest arrival rate whose requests meet a target, by bisection between 0 and the
offline throughput (no rate above what the model serves with every batch full can be sustained), and the rule that
ends it where the failed requests say no lower rate can pass (`hopeless`)."""

from __future__ import annotations

import math
from collections.abc import Callable

from . import tails

REL_TOL = 0.05  # a rate known to 5%: finer than run-to-run spread of a tail percentile over seconds
MAX_PROBES = 8
# Failures that are the server's word on its load: it times out (408, 504, a client timeout), sheds (429, 503), its
# proxy finds it busy (502), or its listen queue overflows (a refused or dropped connection). A lower rate can
# clear them, so the search goes on below a rate that failed with them.
LOAD_KINDS = frozenset({"http_408", "http_429", "http_502", "http_503", "http_504", "timeout", "refused", "dropped"})
FALL_SE = 2.0  # a failing share counts as fallen when it fell by more than this many standard errors


def find_max_rate(probe: Callable[[float], float | tuple | None], slo_ms: float | None, capacity: float,
                  rel_tol: float = REL_TOL, max_probes: int = MAX_PROBES,
                  lowest: float = 0.0) -> tuple[float | None, list]:
    """`probe(rate)` runs a load at `rate` and returns its latency percentile in ms (None: the probe failed,
    which ends the search), or (a figure to show, passed) where the probe judges itself (LoadGen's early-stopping
    verdict, stats.account's slo_met: a probe with too few requests for its percentile never passes), or (figure,
    passed, why) where `why`, when set, says no lower rate can pass (`hopeless`) and ends the search. Returns
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
        lat, ok, *why = result if isinstance(result, tuple) else (result, result is not None and result <= slo_ms)
        trail.append((rate, lat, ok))
        if result is None or any(why):
            break
        if ok:
            lo, best = rate, rate
        else:
            hi = rate
    return best, trail


def client_errors(failures: dict[str, int]) -> int:
    """Requests refused for themselves: HTTP 4xx but 408 and 429 (400 for an input over the model's positions, 404,
    413, 422). The same request is refused at any rate."""
    return sum(v for k, v in failures.items() if k.startswith("http_4") and k not in LOAD_KINDS)


def _kinds(failures: dict[str, int], keep) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(failures.items()) if keep(k))


def hopeless(probes: list[tuple[float, int, dict[str, int]]], share: float) -> str | None:
    """Why no rate at or under the last probe's can pass, in one line, or None to search on. `probes` are the
    probes run so far while none has passed, in order (each at a lower rate than the one before): (rate, measured
    requests, failed requests by kind, as an endpoint cell's info `failures`). `share` is the verdict's (0.99).

    A failed request misses every objective, so failures alone fail a probe once they are more than LoadGen's
    verdict lets miss at that probe's count (tails.verdict). A probe at a lower rate measures no more requests (its
    window is --duration, stretched to the verdict's minimum), so it is let miss no more of them. The search ends:
    - at the first probe where the client errors alone (`client_errors`: the request itself is refused, as a 400
      for an input over bert-tiny's 128 positions) fail the verdict: they do not depend on the rate;
    - at the second of two probes where the failures other than the load's (LOAD_KINDS: 408, 429, 502, 503, 504,
      timeouts, refused or dropped connections) fail the verdict at the lower rate and their share did not fall by
      FALL_SE standard errors though the rate halved: failures that do not follow the load (a 500 on some inputs).
    A server that sheds load (429, 503) at high rates is searched on: those failures fall as the rate falls."""
    rate, n, failures = probes[-1]
    refused = client_errors(failures)
    valid, met = tails.verdict(n, refused, share)
    allowed = tails.allowed_overs(n, share)
    if refused and valid and not met:
        return (f"{refused:,} of {n:,} requests at {rate:.3g}/s were refused for themselves "
                f"({_kinds(failures, lambda k: k.startswith('http_4') and k not in LOAD_KINDS)}), more than the "
                f"{allowed:,} the verdict lets miss; a client error (HTTP 4xx but 408 and 429) is refused at any "
                "rate, so no lower one can pass")
    if len(probes) < 2:
        return None
    (high, n1, f1), steady = probes[-2], sum(v for k, v in failures.items() if k not in LOAD_KINDS)
    before = sum(v for k, v in f1.items() if k not in LOAD_KINDS)
    valid, met = tails.verdict(n, steady, share)
    if not steady or not valid or met or not n1:
        return None
    p1, p2, pooled = before / n1, steady / n, (before + steady) / (n1 + n)
    if p1 - p2 > FALL_SE * math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n)):
        return None  # it fell: the failures follow the load
    return (f"the share of requests failing ({_kinds(failures, lambda k: k not in LOAD_KINDS)}) did not fall as "
            f"the rate fell: {p1:.2%} of {n1:,} at {high:.3g}/s, {p2:.2%} of {n:,} at {rate:.3g}/s, more than the "
            f"{allowed:,} the verdict lets miss; failures that do not follow the load leave no lower rate to pass")
