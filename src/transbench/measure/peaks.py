"""Datasheet peaks (dense, no sparsity) per GPU and dtype, and the memory bandwidth.

Sources: NVIDIA datasheets and architecture whitepapers (the "with sparsity" figures halved), the Ampere
GA102 and Ada whitepapers for GeForce parts (FP16/BF16 tensor rate with FP32 accumulate, which is what
PyTorch uses), and Baseten's "A10 vs A10G" spec comparison for the AWS-only A10G. "tf32" on V100 is its
FP32 rate: that chip has no TF32 mode.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PeakRow:
    gpu: str
    match: tuple[str, ...]  # all of these must appear in the lower-cased device name
    tflops: dict[str, float]  # dtype -> dense TFLOPS
    bandwidth_gbs: float
    memory_gb: float | None = None  # told apart by memory where names collide (A100 40/80)

    def peak(self, dtype: str) -> float | None:
        return self.tflops.get(dtype)


def _row(gpu, match, fp32, tf32, half, fp8, bw, mem=None) -> PeakRow:
    t = {"fp32": fp32, "tf32": tf32, "fp16": half, "bf16": half}
    if fp8:
        t["fp8"] = fp8
    return PeakRow(gpu, match, t, bw, mem)


# Order matters: the first row whose words all appear in the name (and memory fits) wins.
PEAKS: tuple[PeakRow, ...] = (
    _row("H200", ("h200",), 66.9, 494.7, 989.4, 1978.9, 4800),
    _row("H100 PCIe", ("h100", "pcie"), 51.2, 378.0, 756.0, 1513.0, 2000),
    _row("H100 NVL", ("h100", "nvl"), 60.0, 417.5, 835.0, 1670.0, 3900),
    _row("H100 SXM", ("h100",), 66.9, 494.7, 989.4, 1978.9, 3350),
    _row("A100 80GB", ("a100",), 19.5, 156.0, 312.0, None, 2039, mem=80),
    _row("A100 40GB", ("a100",), 19.5, 156.0, 312.0, None, 1555, mem=40),
    _row("L40S", ("l40s",), 91.6, 183.0, 362.05, 733.0, 864),
    _row("L4", ("l4",), 30.3, 60.0, 121.0, 242.0, 300),
    _row("A10G", ("a10g",), 35.0, 35.0, 70.0, None, 600),
    _row("RTX 4090", ("4090",), 82.6, 82.6, 165.2, 330.3, 1008),
    _row("RTX 3090", ("3090",), 35.6, 35.6, 71.0, None, 936),
    _row("V100", ("v100",), 15.7, 15.7, 125.0, None, 900),
)


def lookup(name: str | None, memory_gb: float | None = None) -> PeakRow | None:
    """The row for a device name as torch/NVML report it; None for an unknown device (no guessing)."""
    if not name:
        return None
    low = name.lower()
    for row in PEAKS:
        if not all(word in low for word in row.match):
            continue
        if row.memory_gb is not None and memory_gb is not None:
            if (memory_gb > 60) != (row.memory_gb > 60):
                continue
        return row
    return None


def mfu(flops_per_s: float | None, name: str | None, dtype: str, memory_gb: float | None = None) -> float | None:
    row = lookup(name, memory_gb)
    peak = row.peak(dtype) if row else None
    if not flops_per_s or not peak:
        return None
    return flops_per_s / (peak * 1e12)
