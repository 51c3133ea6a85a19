"""The load loop: requests issued (open loop: by their own thread at planned times; closed loop: one per
finished request), batched, served, and each request's arrival, start and finish written down.

Latency runs from a request's *planned* arrival to the moment `serve_batch` returns (its results are on
the host then), so a stalled model delays finishes, never arrivals: the requests that arrive during a
stall carry the stall in their latency (no coordinated omission, as in wrk2 or MLPerf's Server scenario)."""

from __future__ import annotations

import gc
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .batcher import Batcher, BatchPolicy

# A backlog still unserved this long after the last arrival is abandoned: past saturation the queue grows
# without bound, and waiting it out would only lengthen a probe whose answer (missed target) is known.
DRAIN_LIMIT_S = 10.0


# A rate's arrivals are planned in full before its load starts, and the load keeps every request as Python objects
# (its arrival, start, finish): a million take under a second to plan and ~350 MB in the worker, and cover 80,000/s
# over the default 12 s window (bert-base serves ~9,000/s on an H100). --rate 1e9 planned 7e8 arrivals for minutes
# and grew the worker to gigabytes before the first request. Closed-loop clients are queued at the start alike.
MAX_REQUESTS = 1_000_000


@dataclass
class Request:
    rid: int
    arrival: float  # seconds from the start of the load
    length: int
    output: int = 0  # generation: tokens it asks for (a trace's output_length); 0: the cell's --new-tokens


@dataclass
class Served:
    request: Request
    start: float  # its batch was handed to the model
    done: float  # its result was on the host
    batch: int  # requests in its batch
    steps: list[float] = field(default_factory=list)  # generation: when each token was on the host


@dataclass
class LoadPlan:
    """Open loop when `arrivals` is given, else a closed loop of `concurrency` clients."""

    lengths: list[int]  # request i has lengths[i % len] tokens
    arrivals: list[float] | None = None
    outputs: list[int] | None = None  # generation: request i asks for outputs[i % len] tokens (a trace's)
    concurrency: int = 0
    span_s: float = 0.0  # closed loop: no new request after this; open loop: the end of the arrivals' window
    warmup_s: float = 0.0  # requests that arrive before this are served but not counted
    # Closed loop: clients go on past span_s until this many requests arrived after the warm-up, up to limit_s. An
    # offline probe whose first batches stalled (H100, the fused server capturing graphs under load:
    # benchmarks/results/serve_fused_h100_2026-11.md) had measured 1 request in its window, and the max-rate search
    # then bisected under a capacity of 0.7 requests/s.
    min_measured: int = 1
    limit_s: float = float("inf")


@dataclass
class Trace:
    served: list[Served]
    unserved: list[Request]  # abandoned backlog (DRAIN_LIMIT_S)
    batches: list[tuple[float, float, int]]  # (start, done, size) of every batch
    plan: LoadPlan
    end: float
    gc_collections: list[int] = field(default_factory=list)  # Python GC collections per generation during the load
    # Open loop: per request, how late its issue was against its planned arrival (s): the load generator's own lag.
    # Latency still runs from the planned time; a lag that grows says the client, not the server, fell behind.
    lags: list[tuple[float, float]] = field(default_factory=list)  # (planned arrival, lag)


def run_load(serve_batch: Callable[[list[Request]], Any], plan: LoadPlan, policy: BatchPolicy,
             clock: Callable[[], float] = time.perf_counter,
             on_measure: Callable[[], None] = lambda: None) -> Trace:
    """Serve the plan. `serve_batch(requests)` returns when their results are on the host, optionally with
    the host times at which each generated token was (generation). `on_measure` is called once, when the
    loop first finds the warm-up over (the energy counter starts there).

    The load runs without the cyclic garbage collector (no_collector)."""
    with no_collector() as collections:
        trace = _serve(serve_batch, plan, policy, clock, on_measure)
    trace.gc_collections = collections
    return trace


@contextmanager
def no_collector():
    """Python's cyclic collector off for a load, the heap as it stands frozen first (gc.freeze, as long-running Python
    servers do after their warm-up); yields a list that holds the collections per generation that ran anyway.
    Freezing alone kept the model, its graphs and its tuning records out of every scan (on an H100 each fused probe,
    a fresh worker that had captured 68 graphs, had stalled once for 10-20 ms in mid-load:
    benchmarks/results/fp8_engine_h100_2026-11.md), but full collections still ran over the load's own records: a
    10-s probe of 89,189 requests on an H200 had its batch service and its arrivals' issue stall together, 54.5 and
    51.1 ms (benchmarks/results/serve_fused_h200_2026-11.md), and here a full collection over 90,000 requests'
    records took 22 ms. A load's own records hold no cycles; the few it makes (an exception's traceback) wait for the
    collection after it."""
    gc.collect()
    gc.freeze()
    was = gc.isenabled()
    gc.disable()
    before = [g["collections"] for g in gc.get_stats()]
    collections: list[int] = []
    try:
        yield collections
    finally:
        collections += [g["collections"] - b for g, b in zip(gc.get_stats(), before)]
        if was:
            gc.enable()
        gc.unfreeze()


def _serve(serve_batch, plan: LoadPlan, policy: BatchPolicy, clock, on_measure) -> Trace:
    t0 = clock()
    now = lambda: clock() - t0  # noqa: E731
    inbox: queue.Queue = queue.Queue()
    lengths = plan.lengths
    served: list[Served] = []
    batches: list[tuple[float, float, int]] = []
    pending: deque = deque()
    batcher = Batcher(policy)
    measuring = False

    outputs = plan.outputs or [0]
    lags: list[tuple[float, float]] = []

    def request(i: int, t: float) -> Request:
        return Request(i, t, lengths[i % len(lengths)], outputs[i % len(outputs)])

    if plan.arrivals is not None:
        def issue() -> None:
            for i, t in enumerate(plan.arrivals):
                delay = t - now()
                if delay > 0:
                    time.sleep(delay)
                inbox.put(request(i, t))  # stamped with its planned time
                lags.append((t, max(0.0, now() - t)))
            inbox.put(None)

        issuer = threading.Thread(target=issue, daemon=True, name="serve-arrivals")
        issuer.start()
        issuing = True
        last_arrival = plan.arrivals[-1] if plan.arrivals else 0.0
    else:
        issuer, issuing, last_arrival = None, False, plan.span_s
        for i in range(plan.concurrency):
            pending.append(request(i, 0.0))
    next_id = plan.concurrency
    after = 0  # closed loop: requests sent after the warm-up

    while True:
        while True:  # everything that has arrived joins the queue
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                break
            if item is None:
                issuing = False
            else:
                pending.append(item)
        t = now()
        if not measuring and t >= plan.warmup_s:
            measuring = True
            on_measure()
        if not pending and not issuing:
            break
        if t > last_arrival + DRAIN_LIMIT_S and not issuing:
            break
        batch = batcher.take(pending, t)
        if not batch:
            # Never past the drain limit: a --max-wait-ms longer than that (1e9) blocked here after the last arrival
            # until the cell's timeout, and one past what a lock's timeout holds (1e15) raised OverflowError.
            wait = min(batcher.deadline(pending), last_arrival + DRAIN_LIMIT_S + 1e-3) - t if pending else None
            try:
                item = inbox.get(timeout=wait if wait is None or wait > 0 else 0)
            except queue.Empty:
                continue
            if item is None:
                issuing = False
            else:
                pending.append(item)
            continue
        start = now()
        steps = serve_batch(batch)
        done = now()
        batches.append((start, done, len(batch)))
        step_times = [s - t0 for s in steps] if steps else []
        for r in batch:
            # Generation: a request asking fewer tokens than its batch ran is done at its own last token.
            own = step_times[:r.output] if r.output and step_times else step_times
            served.append(Served(r, start, own[-1] if own else done, len(batch), own))
            # Closed loop: the client sends its next request; past the span too while fewer than min_measured
            # have arrived after the warm-up (a model slower than the span would otherwise leave too few to
            # measure), until limit_s.
            if plan.arrivals is None and (done < plan.span_s or (after < plan.min_measured and done < plan.limit_s)):
                pending.append(request(next_id, done))
                next_id += 1
                after += done >= plan.warmup_s
    if issuer is not None:
        issuer.join(timeout=1.0)
    return Trace(served, list(pending), batches, plan, now(), lags=lags)


def measured(trace: Trace) -> tuple[list[Served], list[Request]]:
    """The served and abandoned requests that arrived after the warm-up."""
    w = trace.plan.warmup_s
    return [s for s in trace.served if s.request.arrival >= w], [r for r in trace.unserved if r.arrival >= w]
