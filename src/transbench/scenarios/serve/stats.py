"""Latency accounting of one load: the record keys of a serve cell (design.md: offered_rate, achieved_rate,
latency_p999_ms, goodput, mean_batch, ...) from a `Trace`, and every measured request's latency as the
cell's samples (in arrival order)."""

from __future__ import annotations

import math
from collections import Counter

from ...errors import SpecError
from ...measure.timer import carried
from ...spec import read_number
from . import tails
from .load import Trace, measured

# Always stored (design.md's latency_p999_ms among them), whatever --percentiles adds.
STORED = (50.0, 90.0, 99.0, 99.9)
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
OBJECTIVES = ("ttft", "tpot", "e2e")  # --slo's metrics: time to first token, time per output token, end to end


def name(q: float) -> str:
    """A percentile's key part: p50, p99, p999 (99.9), p05 (5), p025 (2.5). The whole part has two digits, so the
    digits alone never name two percentiles (99.9 -> p999, 9.99 -> p0999)."""
    whole, _, frac = f"{q:.6f}".rstrip("0").rstrip(".").partition(".")
    return f"p{int(whole):02d}{frac}"


def parse_percentiles(text) -> list[float]:
    """`--percentiles 50,90,99` (or a list): each above 0 and below 100, at most 4 decimals, none twice."""
    items = text if isinstance(text, (list, tuple)) else [x.strip() for x in str(text).split(",")]
    out: list[float] = []
    for item in items:
        try:
            q = float(item) if isinstance(item, (int, float)) and not isinstance(item, bool) else \
                read_number(str(item), float)
        except ValueError:
            raise SpecError(f"--percentiles: '{item}' is not a number; give percentiles such as 50,90,99") from None
        if not (math.isfinite(q) and 0 < q < 100) or round(q, 4) != q:
            # as given: `:g` alone showed 99.99999999 as 100, and repr alone 100 as 100.0
            shown = (f"{item:g}" if float(f"{item:g}") == item else repr(item)) if isinstance(item, float) else item
            raise SpecError(f"--percentiles: {shown} must be above 0 and below 100, with at most 4 decimals")
        if q in out:
            raise SpecError(f"--percentiles lists {q:g} twice: give each value once")
        out.append(q)
    if not out:
        raise SpecError("--percentiles is empty: give at least one, such as 50,90,99")
    return out


def parse_slo(text: str) -> dict[str, float]:
    """`--slo ttft:200,tpot:50,e2e:2000` (ms) -> {metric: ms}; a request meets the SLO when it meets every one."""
    out: dict[str, float] = {}
    for part in str(text).split(","):
        metric, sep, value = part.strip().partition(":")
        if not sep or metric not in OBJECTIVES:
            raise SpecError(f"--slo '{text}': '{part.strip()}' is not METRIC:MS with METRIC one of "
                            f"{', '.join(OBJECTIVES)} (e.g. ttft:200,tpot:50,e2e:2000)")
        if metric in out:
            raise SpecError(f"--slo '{text}' names {metric} twice: give each objective once")
        try:
            ms = read_number(value, float)
        except ValueError:
            raise SpecError(f"--slo '{text}': {metric}'s '{value}' is not a number of milliseconds") from None
        if not (math.isfinite(ms) and ms > 0):
            raise SpecError(f"--slo '{text}': {metric} must be a finite number of milliseconds above 0")
        out[metric] = ms
    return out


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    pos = q / 100 * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    if pos == lo:  # on a rank: its value (a failure ranked as infinity next to it made inf * 0, NaN)
        return s[lo]
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(prefix: str, values_ms: list[float], qs=STORED, upper=()) -> dict:
    """Percentiles (empirical) of `values_ms` as `{prefix}_{pXX}_ms` (None where too few values carry one:
    timer.carried), max and mean; for the percentiles in `upper`, also LoadGen's early-stopping estimate
    `{prefix}_{pXX}_upper_ms` (None below its minimum count)."""
    if not values_ms:
        return {}
    n = len(values_ms)
    out = {f"{prefix}_{name(q)}_ms": percentile(values_ms, q) if carried(q / 100, n) else None
           for q in sorted(set(qs) | set(upper))}
    out.update({f"{prefix}_{name(q)}_upper_ms": tails.upper_estimate(values_ms, q / 100) for q in upper})
    out[f"{prefix}_max_ms"] = max(values_ms)
    out[f"{prefix}_mean_ms"] = sum(values_ms) / len(values_ms)
    return out


def token_figures(ttft_ms: list[float], tpot_ms: list[float], gaps_ms: list[float], chosen) -> dict:
    """A generating load's token figures, in-process and at an endpoint alike: TTFT at the stored and `chosen`
    percentiles, with LoadGen's estimate of the chosen ones, its max and mean; TPOT at the chosen percentiles and its
    mean; the gaps between tokens (ITL) at p50, p99 and the chosen. A value that is not finite (a failed request, which
    the endpoint's accounting ranks after every answered one) leaves each figure it decides empty. The endpoint's own
    set had no TTFT estimates and no chosen percentile of TPOT or ITL: `--percentiles 95` stored none of them."""
    qs = sorted(set(STORED) | set(chosen))
    out = spread("ttft", ttft_ms, qs, chosen)
    out.update({k: v for k, v in spread("tpot", tpot_ms, chosen).items() if k != "tpot_max_ms"})
    keep = {f"itl_{name(q)}_ms" for q in {50.0, 99.0, *chosen}}
    out.update({k: v for k, v in spread("itl", gaps_ms, qs).items() if k in keep})
    return {k: v if v is None or math.isfinite(v) else None for k, v in out.items()}


def tpot_ms(s) -> float | None:
    """Time per output token of one generated request: (end to end - TTFT) / (tokens - 1); None for one token."""
    if len(s.steps) < 2:
        return None
    return (s.steps[-1] - s.steps[0]) * 1e3 / (len(s.steps) - 1)


def within(objectives: dict[str, float], e2e: float, ttft: float | None, tpot: float | None) -> bool:
    """Whether one request's times (ms) meet every objective: no first token misses a TTFT objective, and a
    one-token request has no TPOT (that one is met). In-process (meets) and endpoint requests are judged here."""
    if "e2e" in objectives and e2e > objectives["e2e"]:
        return False
    if "ttft" in objectives and (ttft is None or ttft > objectives["ttft"]):
        return False
    return not ("tpot" in objectives and tpot is not None and tpot > objectives["tpot"])


def meets(s, objectives: dict[str, float]) -> bool:
    """Whether a served request meets every objective (ms)."""
    a = s.request.arrival
    return within(objectives, (s.done - a) * 1e3, (s.steps[0] - a) * 1e3 if s.steps else None, tpot_ms(s))


def account(trace: Trace, slo_ms: float | None = None, offered_rate: float | None = None, *,
            objectives: dict[str, float] | None = None, percentiles=DEFAULT_PERCENTILES,
            tail_share: float = 0.99) -> tuple[dict, list[float], dict]:
    """(record, latency samples in ms, info). Abandoned requests (a backlog past saturation) count with the
    latency they had when abandoned, a lower bound, and never meet an objective.

    `objectives` ({ttft, tpot, e2e: ms}): goodput is the share (and rate) of requests meeting all of them, and the
    verdict (`slo_met`) holds where the requests missing any are few enough for a `tail_share` percentile to meet
    them at LoadGen's confidence (tails.verdict): with e2e alone, the early-stopping estimate of the latency's
    `tail_share` percentile is within it. Fewer requests than that percentile needs (tails.min_requests) make the
    verdict not valid (`tail_valid` false), and a verdict that is not valid is never met. `slo_ms` is the e2e
    objective.

    The batch figures (mean_batch, service_*_ms, info's batch_sizes) are over the batches that served at least one
    measured request. Such a batch's size is all the requests it held, warm-up ones included (the model computed
    them, and its service time is theirs too); a batch of warm-up requests alone counts nowhere, even where it
    started after the warm-up ended (the warm-up's backlog under a saturating load)."""
    objectives = {**(objectives or {}), **({"e2e": slo_ms} if slo_ms is not None else {})}
    done, lost = measured(trace)
    w = trace.plan.warmup_s
    done = sorted(done, key=lambda s: s.request.arrival)
    lat = [(s.done - s.request.arrival) * 1e3 for s in done]
    lat_all = lat + [(trace.end - r.arrival) * 1e3 for r in lost]
    n = len(lat_all)
    if not n:
        return {"requests": 0, "n_requests": 0}, [], {}
    # The window runs to the last result, or to the end of the planned arrivals where every result came before it:
    # measured to the last result alone, a light load's window lost the idle gap after its last arrival, and
    # achieved_rate read ~5% above offered_rate with 20 expected arrivals (busy_share, tokens_per_s alike).
    last = max(max((s.done for s in done), default=trace.end), trace.plan.span_s)
    span = max(last - w, 1e-9)
    chosen = sorted(set(percentiles))
    rec = {"requests": n, "n_requests": n, "unserved": len(lost), "achieved_rate": len(done) / span,
           "offered_rate": offered_rate, **spread("latency", lat_all, upper=chosen)}
    # The contract's latency_ms (median) and n_samples of every timed record, over the stored samples: without
    # them a serve row's --json / --csv median and sample count were empty beside latency_p50_ms.
    rec.update(latency_ms=rec["latency_p50_ms"], n_samples=n)
    waits = [(s.start - s.request.arrival) * 1e3 for s in done]
    rec.update(queue_mean_ms=sum(waits) / len(waits) if waits else None)
    # The tail verdict's footing: how many requests its percentile needs, and whether this load had them.
    need = tails.min_requests(tail_share)
    rec.update(tail_percentile=tail_share * 100, tail_min_requests=need, tail_valid=n >= need)
    if objectives:
        good = sum(1 for s in done if meets(s, objectives))
        misses = n - good  # abandoned requests miss every objective
        valid, met = tails.verdict(n, misses, tail_share)
        rec.update(goodput=good / n, goodput_rate=good / span, slo_misses=misses,
                   slo_allowed_misses=tails.allowed_overs(n, tail_share), tail_valid=valid, slo_met=met)
        if "e2e" in objectives:
            rec["slo_ms"] = objectives["e2e"]
    # The measured batches (the docstring's rule), told by their start: a request's `start` is its batch's. Counted
    # from the warm-up's end instead, a saturated load's first batches were the warm-up's backlog alone.
    starts = {s.start for s in done}
    ours = [(s, e, b) for s, e, b in trace.batches if s in starts]
    sizes = [b for _, _, b in ours]
    busy = sum(e - max(s, w) for s, e, _ in trace.batches if e > w)
    # Each batch's own service time (handed to the model -> results on the host): a p99 that grows while these
    # stay flat is queueing; one that follows service_p99 is the server itself (on an H100 the fused engine's
    # p99 under Poisson load was 8-34 ms beside a 2.8 ms p50, and these keys were not yet recorded to tell).
    rec.update({k: v for k, v in spread("service", [(e - s) * 1e3 for s, e, _ in ours]).items()
                if k in ("service_p50_ms", "service_p99_ms", "service_max_ms")})
    rec.update(mean_batch=sum(sizes) / len(sizes) if sizes else None, busy_share=min(1.0, busy / span),
               real_tokens_mean=sum(s.request.length for s in done) / len(done) if done else None)
    lags = [lag * 1e3 for t, lag in trace.lags if t >= w]
    if lags:  # open loop: the load generator's own lag behind its plan (never part of a request's latency)
        rec.update(client_lag_p99_ms=percentile(lags, 99), client_lag_max_ms=max(lags))
    gen = [s for s in done if s.steps]
    if gen:  # generation: time to first token, time per output token, gaps between tokens, end to end
        gaps = [(b - a) * 1e3 for s in gen for a, b in zip(s.steps, s.steps[1:])]
        rec.update(token_figures([(s.steps[0] - s.request.arrival) * 1e3 for s in gen],
                                 [x for x in map(tpot_ms, gen) if x is not None], gaps, chosen))
        rec["tokens_per_s"] = sum(len(s.steps) for s in gen) / span
    info = {"batch_sizes": dict(sorted(Counter(sizes).items())), "measured_span_s": span,
            "warmup_requests": len(trace.served) - len(done), "gc_collections_under_load": trace.gc_collections}
    return rec, lat_all, info
