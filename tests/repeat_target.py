"""A worker target for the repeat tests: each call records its process and when it ran, and 'measures' a
latency the cell names (shifted per process, so repeats differ)."""

from __future__ import annotations

import os
import time

from transbench.cells import CellResult


def measure(cell: dict, state: dict) -> CellResult:
    base = cell["seq"] * 1.0
    latency = base * (1 + (os.getpid() % 7) / 100)
    samples = [latency] * 12
    return CellResult("ok", record={"latency_ms": latency, "n_samples": len(samples), "pid": os.getpid(),
                                    "at": time.time(), "torch_threads": _threads(),
                                    "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                    else None}, samples_ms=samples)


def _threads() -> int:
    import torch

    return torch.get_num_threads()
