"""Memory per cell: torch's peak allocated and reserved, and device-wide use from NVML."""

from __future__ import annotations

from . import device as dev


def reset_peak(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def snapshot(device) -> dict:
    """Peak since the last reset, in MiB; empty values on CPU (torch tracks no CPU peak)."""
    import torch

    if device.type != "cuda":
        return {"peak_mem_mb": None, "peak_reserved_mb": None, "device_used_mb": None}
    return {
        "peak_mem_mb": torch.cuda.max_memory_allocated(device) / 2**20,
        "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20,
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
