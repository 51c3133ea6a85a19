"""Datasheet peaks (dense, no sparsity) per GPU and dtype, and the memory bandwidth.

Sources: NVIDIA datasheets and architecture whitepapers (the "with sparsity" figures halved), the Ampere
GA102 and Ada whitepapers for GeForce parts (FP16/BF16 tensor rate with FP32 accumulate, which is what
PyTorch uses), and Baseten's "A10 vs A10G" spec comparison for the AWS-only A10G. "tf32" on V100 is its
FP32 rate: that chip has no TF32 mode; it has no bf16 at all, so no bf16 peak. A halved sparse figure keeps its
half (1,671 / 2 = 835.5): a peak rounded down raises MFU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PeakRow:
    gpu: str
    match: tuple[str, ...]  # all of these must be words of the lower-cased device name (see `words`)
    tflops: dict[str, float]  # dtype -> dense TFLOPS
    bandwidth_gbs: float
    memory_gb: float | None = None  # told apart by memory where names collide (A100 40/80)
    exclude: tuple[str, ...] = ()  # a variant with other peaks ("3090 Ti"): none of these may be a word of the name

    def peak(self, dtype: str) -> float | None:
        return self.tflops.get(dtype)


def _row(gpu, match, fp32, tf32, half, fp8, bw, mem=None, exclude=(), bf16=True) -> PeakRow:
    t = {"fp32": fp32, "tf32": tf32, "fp16": half}
    if bf16:
        t["bf16"] = half
    if fp8:
        t["fp8"] = fp8
    return PeakRow(gpu, match, t, bw, mem, exclude)


# Order matters: the first row whose words all appear in the name (and memory fits) wins. Words, not substrings:
# "l4" inside "NVIDIA L40" once gave an L40 the L4's peaks (121 fp16 TFLOPS for a 181 TFLOPS card: MFU 1.5x
# too high), and "3090" a 3090 Ti the 3090's; a name no row names exactly gets no MFU.
PEAKS: tuple[PeakRow, ...] = (
    _row("H200 NVL", ("h200", "nvl"), 60.0, 417.5, 835.5, 1670.5, 4800),
    _row("H200", ("h200",), 66.9, 494.7, 989.4, 1978.9, 4800),
    # its H100-class GPU; 96 GB HBM3 at 4 TB/s, or ("NVIDIA GH200 144G HBM3e") 144 GB HBM3e at 4.9 TB/s
    _row("GH200 144GB HBM3e", ("gh200", "hbm3e"), 66.9, 494.7, 989.4, 1978.9, 4900),
    _row("GH200", ("gh200",), 66.9, 494.7, 989.4, 1978.9, 4000),
    _row("H100 PCIe", ("h100", "pcie"), 51.2, 378.0, 756.5, 1513.0, 2000),
    _row("H100 NVL", ("h100", "nvl"), 60.0, 417.5, 835.5, 1670.5, 3900),
    _row("H100 SXM", ("h100",), 66.9, 494.7, 989.4, 1978.9, 3350),
    # Same compute in every A100; the 80GB PCIe card's HBM2e runs 1,935 GB/s against the SXM's 2,039.
    _row("A100 80GB PCIe", ("a100", "pcie"), 19.5, 156.0, 312.0, None, 1935, mem=80),
    _row("A100 80GB", ("a100",), 19.5, 156.0, 312.0, None, 2039, mem=80),
    _row("A100 40GB", ("a100",), 19.5, 156.0, 312.0, None, 1555, mem=40),
    _row("L40S", ("l40s",), 91.6, 183.0, 362.05, 733.0, 864),
    _row("L40", ("l40",), 90.5, 90.5, 181.05, 362.0, 864),
    _row("L4", ("l4",), 30.3, 60.0, 121.0, 242.5, 300),
    _row("A10G", ("a10g",), 35.0, 35.0, 70.0, None, 600),
    _row("RTX 4090", ("4090",), 82.6, 82.6, 165.2, 330.3, 1008, exclude=("d",)),
    _row("RTX 3090", ("3090",), 35.6, 35.6, 71.0, None, 936, exclude=("ti",)),
    # V100 PCIe: 14 TFLOPS fp32 and 112 tensor, against the SXM2's 15.7 and 125 (a FHHL card has lower clocks
    # still: no row). "Tesla V100S-PCIE-32GB" is the word "v100s": no row either.
    _row("V100 PCIe", ("v100", "pcie"), 14.0, 14.0, 112.0, None, 900, bf16=False),
    _row("V100", ("v100",), 15.7, 15.7, 125.0, None, 900, exclude=("fhhl",), bf16=False),
)


def words(name: str) -> set[str]:
    """The lower-cased words of a device name, split at anything not a letter or digit:
    'NVIDIA A100-SXM4-80GB' -> {'nvidia', 'a100', 'sxm4', '80gb'}."""
    return set(re.findall(r"[a-z0-9]+", name.lower()))


# Words that make any name a device no row describes: a MIG instance ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", as torch
# names it) runs on a slice of the GPU's SMs (14 of 108 for 1g.5gb), so the whole GPU's peak made its MFU up to 7x
# too low; a laptop part ("NVIDIA GeForce RTX 4090 Laptop GPU", an AD103) is another chip than its desktop namesake.
NOT_A_ROW = ("mig", "laptop")


def name_memory_gb(have: set[str]) -> float | None:
    """The memory a device name states ('80gb' in 'NVIDIA A100-SXM4-80GB'), or None."""
    sizes = [int(w[:-2]) for w in have if w.endswith("gb") and w[:-2].isdigit()]
    return float(sizes[0]) if len(sizes) == 1 else None


def lookup(name: str | None, memory_gb: float | None = None) -> PeakRow | None:
    """The row for a device name as torch/NVML report it; None for an unknown device (no guessing). Rows told apart
    by memory (A100 40/80GB) need it: `memory_gb`, else the size the name states; without either, no row (the
    report looks rows up by name alone, and every A100 got the 80GB's bandwidth)."""
    if not name:
        return None
    have = words(name)
    if any(word in have for word in NOT_A_ROW):
        return None
    memory_gb = memory_gb if memory_gb is not None else name_memory_gb(have)
    for row in PEAKS:
        if not all(word in have for word in row.match) or any(word in have for word in row.exclude):
            continue
        if row.memory_gb is not None:
            if memory_gb is None or (memory_gb > 60) != (row.memory_gb > 60):
                continue
        return row
    return None


def mfu(flops_per_s: float | None, name: str | None, dtype: str, memory_gb: float | None = None) -> float | None:
    row = lookup(name, memory_gb)
    peak = row.peak(dtype) if row else None
    if not flops_per_s or not peak:
        return None
    return flops_per_s / (peak * 1e12)
