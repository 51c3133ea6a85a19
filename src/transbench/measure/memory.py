"""Memory per cell: what the cell allocated, isolated from whatever ran before it in the same process.

A cell's `peak_mem_mb` is torch's peak allocated since the cell reset it, minus what was allocated at
that moment; `mem_before_mb` is what the process still held when the cell started. Both matter because
a worker runs many cells: at 730ddb4 a gpt2 sdpa cell read 315.5 MiB alone and 889 MiB after fused
cells had left their captured graphs behind. `release` is called after every cell, and the
sweep replaces a worker that still holds more than LEFTOVER_MB afterwards."""

from __future__ import annotations

import sys

from . import device as dev

# What a clean worker may still hold between cells. The CUDA context itself is not allocator memory;
# cuBLAS workspaces are, and `release` frees them, so a clean worker holds ~0.
LEFTOVER_MB = 8.0
_baseline: dict[str, int] = {}


def release(device) -> None:
    """Free what the last cell left: Python garbage, torch.compile's caches (compiled graphs and their
    CUDA-graph pools hold device memory), cuBLAS workspaces and the allocator's cached blocks."""
    import gc

    gc.collect()
    if "torch._dynamo" in sys.modules:  # only where a compile ran: importing dynamo costs seconds
        import torch._dynamo

        torch._dynamo.reset()
        gc.collect()
    if device.type == "cuda":
        import torch

        _clear_workspaces()
        torch.cuda.empty_cache()


def allocated_mb(device) -> float | None:
    if device.type != "cuda":
        return None
    import torch

    return torch.cuda.memory_allocated(device) / 2**20


def _clear_workspaces() -> None:
    import torch

    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def reset_peak(device) -> None:
    """Start counting this cell's peak here: the peak is measured above what is allocated now. cuBLAS
    workspaces are freed first, so each cell counts the one its own GEMMs allocate: on an H100 a gpt2
    sdpa cell read 322.5 MiB after a reference forward had left a 33 MiB workspace, and 355.5 MiB when a
    cached reference had not (`bash benchmarks/gpu.sh isolation`,
    benchmarks/results/measurement_path_h100_2026-11.md)."""
    import torch

    if device.type == "cuda":
        torch.cuda.init()
        _clear_workspaces()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        _baseline[str(device)] = torch.cuda.memory_allocated(device)


def restart_peak(device) -> None:
    """Count the peak from here on, against the baseline reset_peak took: what is allocated now still counts, what
    was allocated and freed before (a first call's kernel tuning) does not. cuBLAS workspaces are freed first, as
    in reset_peak: the fused engine's tuner times its candidates on a stream of its own, whose workspace no later
    call needs."""
    import torch

    if device.type == "cuda":
        _clear_workspaces()
        torch.cuda.reset_peak_memory_stats(device)


def snapshot(device) -> dict:
    """Peak since the last reset_peak, above what was allocated then, in MiB; empty on CPU (torch
    tracks no CPU peak)."""
    import torch

    if device.type != "cuda":
        return {"peak_mem_mb": None, "peak_reserved_mb": None, "device_used_mb": None}
    base = _baseline.get(str(device), 0)
    return {
        "peak_mem_mb": (torch.cuda.max_memory_allocated(device) - base) / 2**20,
        "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20,
        "held_at_reset_mb": base / 2**20,
        "device_used_mb": dev.nvml_used_mb(device.index or 0),
    }


def current(device) -> dict:
    """Memory held right now (what an OOM leaves behind)."""
    import torch

    if device.type != "cuda":
        return {}
    return {
        "allocated_mb": torch.cuda.memory_allocated(device) / 2**20,
        "reserved_mb": torch.cuda.memory_reserved(device) / 2**20,
        "device_used_mb": dev.nvml_used_mb(device.index or 0),
    }
