"""Measured ceilings: the best GEMM TFLOPS per dtype and the best copy GB/s stored for a GPU.

They are the micro-gemm and micro-bandwidth cells of the store, read back; `transbench env --db`
shows them, and `micro breakdown` classifies parts against them when present. MFU elsewhere stays
against the datasheet."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...store import Store
from .common import Context


def _best(db_path: str, hardware: str) -> tuple[dict[str, float], float | None]:
    """({dtype: best GEMM TFLOPS}, best copy GB/s) over the ok cells measured on `hardware`."""
    gemm: dict[str, float] = {}
    copy: float | None = None
    if not db_path or not os.path.isfile(db_path):
        return gemm, copy
    store = Store(db_path, readonly=True)
    try:
        for run in store.runs():
            if run["kind"] != "micro":
                continue
            for c in store.cells(run["run_id"]):
                rec = c["record"]
                if c["status"] != "ok" or not _on(rec, hardware):
                    continue
                if c["scenario"] == "micro-gemm" and rec.get("tflops") and rec.get("dtype"):  # a null dtype: no
                    # ceiling of any dtype (sorting them by name was a TypeError in `env`)
                    gemm[rec["dtype"]] = max(gemm.get(rec["dtype"], 0.0), rec["tflops"])
                elif c["scenario"] == "micro-bandwidth" and rec.get("op") == "copy" and rec.get("gbps"):
                    copy = max(copy or 0.0, rec["gbps"])
    finally:
        store.close()
    return gemm, copy


def _on(rec: dict, hardware: str) -> bool:
    if hardware == "cpu":
        return rec.get("gpu") is None and str(rec.get("device", "")).startswith("cpu")
    return rec.get("gpu") == hardware


def measured_ceilings(db_path: str, gpu_name: str) -> dict[str, float]:
    """{'bf16 GEMM TFLOPS': ..., 'copy GB/s': ...} from the store at `db_path` for the GPU of that name
    ('cpu' for CPU runs); empty when nothing was measured there (a missing file is not created)."""
    gemm, copy = _best(db_path, gpu_name)
    out = {f"{d} GEMM TFLOPS": v for d, v in sorted(gemm.items())}
    if copy:
        out["copy GB/s"] = copy
    return out


@dataclass(frozen=True)
class Ceilings:
    tflops: float | None
    gbps: float | None
    source: str | None  # "measured", "datasheet", "measured+datasheet", or None when neither is known


def best_ceilings(ctx: Context, dtype: str) -> Ceilings:
    """The compute ceiling of `dtype` and the bandwidth ceiling: measured when stored, else datasheet."""
    gemm, copy = _best(ctx.db, ctx.hardware)
    sources = []
    tflops, gbps = gemm.get(dtype), copy
    sources.append("measured" if tflops else None)
    sources.append("measured" if gbps else None)
    if tflops is None and ctx.peak:
        tflops = ctx.peak.peak(dtype)
        sources[0] = "datasheet" if tflops else None
    if gbps is None and ctx.peak:
        gbps = ctx.peak.bandwidth_gbs
        sources[1] = "datasheet"
    known = sorted({s for s in sources if s})
    return Ceilings(tflops, gbps, "+".join(known) if known else None)
