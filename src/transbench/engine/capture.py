"""CUDA-graph capture that leaves the process usable when it fails, on the process's one capture stream."""
from __future__ import annotations

import functools
import gc
from contextlib import contextmanager
from typing import Iterator

import torch


@functools.cache
def side_stream(device: int) -> torch.cuda.Stream:
    """The one stream per device on which every graph of the process is warmed up and captured (graphs.GraphCache,
    tuning's candidates, the cudagraph backend). One per GraphCache made a process's first engine the only fast one: on
    an H100, bert-base fp16 8 x 128's graph replayed in 0.611-0.626 ms until a second engine warmed up and captured on a
    stream of its own, and in 0.648-0.663 ms from then on, its kernels as long as before (summed, 611.5 us, then 608.1).
    Programmatic dependent launch (launch.pdl_on) had stopped hiding the launches between them: without it both read
    0.649-0.650. A second engine on the first's stream kept both at 0.610-0.624
    (benchmarks/results/cell_order_h100_2026-11.md). Freed blocks stay with the stream they were allocated on, so one
    stream also strands no memory. After a failed capture, later captures get a new one (see capture). Captures run one
    at a time in a process, as torch's global capture mode requires."""
    return torch.cuda.Stream(device)


# Captures that failed in this process. Later captures then run on a new stream, and a second capture stream is what
# cost the fused engine's graphs their programmatic dependent launch (side_stream): runner/worker.py replaces the
# worker after a cell in which this count rose, so no later cell is measured in such a process.
failures = 0


@contextmanager
def capture(graph: torch.cuda.CUDAGraph, **kw) -> Iterator[None]:
    """`torch.cuda.graph(graph, **kw)`; if the capture fails, one small capture follows before the error goes on.
    A capture that fails inside cudaStreamEndCapture (an op the capture cannot hold) skips the CUDA generator's capture
    epilogue, and every later random op on that device then raises "Offset increment outside graph capture encountered
    unexpectedly" (H100: `transbench tune` of the bert-base grid died so after a failed capture at 8 x 384,
    benchmarks/results/tuned_grid_h100_2026-11.md). The next capture that succeeds runs that epilogue. The allocator,
    too, goes on routing the capture stream's allocations into the graph's pool: later captures move to a new stream
    here (callers with a pool of their own take a new pool), and `failures` counts the failure."""
    global failures
    # No garbage collection while capturing: a CUDAGraph freed by a collection mid-capture destroys its executable
    # graph, which a capturing stream does not permit, and the capture fails (H100: "operation not permitted when stream
    # is capturing (function reset)" in the same tuning run, benchmarks/results/tuned_grid_h100_2026-11.md).
    # torch.cuda.graph collects just before it begins.
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, **kw):
            yield
    except BaseException:
        failures += 1
        side_stream.cache_clear()
        _recapture()
        raise
    finally:
        if enabled:
            gc.enable()


def _recapture() -> None:
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side_stream(torch.cuda.current_device())):  # the new stream: no third one
            torch.ones(1, device="cuda").add_(1)
    except Exception:  # noqa: BLE001 - best effort: the original error is the one to report
        pass
