"""CUDA-graph capture of a whole forward, one graph per shape key, replayed with inputs copied in."""
from __future__ import annotations

import gc
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .capture import capture, side_stream
from .tuning import RACE_BUDGET_S, TUNE_BUDGET_S, Tuner, replay_ms
from .tuning import tuner as default_tuner


@dataclass
class _Entry:
    graph: torch.cuda.CUDAGraph
    static_in: list  # the tensors the captured call read, in _flat order
    out: Any
    routes: dict | None = None  # op name -> the route it runs in this graph (Tuner.routes)
    races: list | None = None  # the whole-forward trials its capture ran (Tuner.races)
    origins: dict | None = None  # how many of its routes came from each origin (Tuner.origins)


# Arguments and outputs are tensors, None, ints, or tuples (NamedTuples such as Packing) of those: flattening
# one level by hand costs ~1 us per call where torch's pytree cost ~17 (its time is the host's, before the replay
# is launched, so it adds to every synchronized call's latency).
def _flat(args: tuple) -> list:
    return [leaf for a in args for leaf in (a if isinstance(a, tuple) else (a,))]


def _with_static(args: tuple, static: list) -> tuple:
    """args with each tensor replaced by its static copy (static: _flat(args) with tensors cloned)."""
    it, out = iter(static), []
    for a in args:
        if isinstance(a, tuple):
            fields = [next(it) for _ in a]
            out.append(type(a)(*fields) if hasattr(a, "_fields") else tuple(fields))
        else:
            out.append(next(it))
    return tuple(out)


def _clone(out):
    if isinstance(out, torch.Tensor):
        return out.clone()
    return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in out)


class GraphCache:
    """`cache(key, fn, *args)` == `fn(*args)`; on CUDA the first call per key captures, later ones replay.

    All graphs share one memory pool: each replay's outputs are cloned out before any other graph can run,
    so no graph ever holds state another needs, and activation memory is paid once, not per shape. A key's
    first capture also settles the close route choices of its ops by racing whole graphs (Tuner.refine).
    tuner, refine and race_budget_s: EngineOptions' (tuner None: the process's tuner of the default table).
    """

    def __init__(self, enabled: bool, max_entries: int = 32, tune_budget_s: float | None = TUNE_BUDGET_S,
                 tuner: Tuner | None = None, refine: bool = True, race_budget_s: float = RACE_BUDGET_S):
        self.enabled = enabled and torch.cuda.is_available()
        self.max_entries, self.tune_budget_s = max_entries, tune_budget_s
        self.tuner = tuner if tuner is not None else default_tuner()
        self.refine, self.race_budget_s = refine, race_budget_s
        self.entries: OrderedDict[Any, _Entry] = OrderedDict()
        self.captures = 0  # graphs captured so far, evicted or released ones included
        self.pool = torch.cuda.graph_pool_handle() if self.enabled else None
        self.device = torch.cuda.current_device() if self.enabled else None  # its warm-up and capture stream's

    def __call__(self, key, fn: Callable, *args):
        if not self.enabled:
            # Without graphs a call still tunes the ops it meets first, under the same budget, so an eager engine
            # starts as fast and runs the routes a graphed one would: the call runs, tunes what it left pending,
            # and runs again if a route changed. Unbudgeted, it re-timed the routes a graphed engine in the same
            # process had chosen out of time, and the two then ran different kernels (H100:
            # tests/gpu/test_engine_kernels.py's PDL test saw bert and GPT-2 outputs differ by 6e-3,
            # benchmarks/results/fp8_power_cap_h100_2026-11.md); the tuner's settled routes keep them equal now.
            t = self.tuner
            with t.budget(self.tune_budget_s), t.recording() as keys:
                out = fn(*args)
                if t.tune_pending(keys):
                    out = fn(*args)
            t.settle(keys)
            return out
        e = self.entries.get(key)
        if e is not None:
            self.entries.move_to_end(key)
            for s, a in zip(e.static_in, (t for t in _flat(args) if isinstance(t, torch.Tensor)), strict=True):
                s.copy_(a, non_blocking=True)
        else:
            leaves = _flat(args)
            if not any(isinstance(t, torch.Tensor) and t.is_cuda for t in leaves):
                return fn(*args)
            e = self._capture(fn, args, [t.clone() if isinstance(t, torch.Tensor) else t for t in leaves])
            self.entries[key] = e
            self.captures += 1
            if len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)
        e.graph.replay()
        return _clone(e.out)

    def _capture(self, fn, args, static) -> _Entry:
        args = _with_static(args, static)
        static = [t for t in static if isinstance(t, torch.Tensor)]
        t = self.tuner
        first_race, timed = len(t.races), t.timed
        # The budget covers the whole first call of a shape: Triton compiles, each op's candidates timed alone (in
        # the first warm-up unbudgeted; under a budget after the first capture, the ops with the largest share
        # first, then captured again if a route changed: Tuner.refine), and the whole-forward races. Once the call
        # returns, its routes stay for the process (Tuner.settle).
        with t.budget(self.tune_budget_s), t.recording() as keys:
            e = t.refine(keys, lambda: self._graph(fn, args, static), lambda e: replay_ms(e.graph.replay),
                         enabled=self.refine, race_budget_s=self.race_budget_s)
        t.settle(keys)
        if t.timed > timed or len(t.races) > first_race:
            # What tuning dropped (the graphs of lost races among it) waits in reference cycles for a garbage
            # collection, its device memory still allocated: on an H100, bert-base 256 x 128 fp8 held 1,271.4 MiB after
            # its first call in two of three tunings and 551.1 in the third; 551.1 in all three after gc.collect()
            # (benchmarks/results/cell_memory_h100_2026-11.md). A call that tuned pays for one collection; one whose
            # routes were on disk does not.
            gc.collect()
        e.routes, e.origins, e.races = t.routes(keys), t.origins(keys), t.races[first_race:]
        return e

    def release(self) -> None:
        """Drop every captured graph: their memory goes back to the pool's allocator, not yet to the GPU (the
        caller's torch.cuda.empty_cache() returns it). The next call of a shape captures again, without timing
        anything (the tuner keeps its choices)."""
        self.entries.clear()

    def tuning(self) -> dict[str, dict]:
        """Per captured shape (its key, '|'-joined): the route each op runs, how many of those routes came from each
        origin (tuning.ORIGINS: the table, tuned in this call, partial, a neighbour, the rule) and the races that
        settled them."""
        return {key if isinstance(key, str) else "|".join(map(str, key)):
                {"routes": e.routes, "races": e.races, "origins": e.origins} for key, e in self.entries.items()}

    def _graph(self, fn, args, static) -> _Entry:
        side = side_stream(self.device)  # the process's one capture stream: capture.side_stream says why
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture: Triton JIT, cuBLAS handles, shape tuning
            for _ in range(2):
                fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # Captured on the warm-up stream: cuBLAS keeps a workspace per stream, and on a stream it first meets while
        # capturing it takes that workspace from the graph's pool and keeps it. Once release() dropped the pool's
        # graphs, the next capture into the pool then failed torch's check that a pool with live blocks has users
        # (H100: a second `transbench tune` of the bert-base grid, its routes all on disk,
        # benchmarks/results/tuned_grid_h100_2026-11.md).
        try:
            with capture(graph, pool=self.pool, stream=side):
                out = fn(*args)
        except BaseException:
            self.pool = torch.cuda.graph_pool_handle()  # capture.capture moved later captures to a new stream
            raise
        return _Entry(graph, static, out)
