"""CUDA-graph capture that leaves the process usable when it fails."""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

import torch


@contextmanager
def capture(graph: torch.cuda.CUDAGraph, **kw) -> Iterator[None]:
    """`torch.cuda.graph(graph, **kw)`; if the capture fails, one small capture follows before the error goes on.
    A capture that fails inside cudaStreamEndCapture (an op the capture cannot hold) skips the CUDA generator's
    capture epilogue, and every later random op on that device then raises "Offset increment outside graph capture
    encountered unexpectedly" (H100, session 15: `transbench tune` of the bert-base grid died so after a failed
    capture at 8 x 384). The next capture that succeeds runs that epilogue. The allocator, too, goes on routing the
    capture stream's allocations into the graph's pool: callers move to a new stream and pool after a failure."""
    # No garbage collection while capturing: a CUDAGraph freed by a collection mid-capture destroys its executable
    # graph, which a capturing stream does not permit, and the capture fails (H100, session 15: "operation not
    # permitted when stream is capturing (function reset)" in the same tuning run). torch.cuda.graph collects
    # just before it begins.
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, **kw):
            yield
    except BaseException:
        _recapture()
        raise
    finally:
        if enabled:
            gc.enable()


def _recapture() -> None:
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            torch.ones(1, device="cuda").add_(1)
    except Exception:  # noqa: BLE001 - best effort: the original error is the one to report
        pass
