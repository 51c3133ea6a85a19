"""Running one micro-benchmark: resolve its options for the device, measure point by point, store each
point as a cell of a run of kind "micro", and hand back the flat records."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import SpecError
from ...measure import device as dev
from ...measure import env as env_mod
from ...store import Store, export
from . import bandwidth, breakdown, gemm, layer
from .common import Point, make_context
from .options import BandwidthOptions, BreakdownOptions, GemmOptions, LayerOptions

# kind -> (its options, the generator of its points, the cells' scenario)
KINDS = {
    "gemm": (GemmOptions, gemm.points, "micro-gemm"),
    "bandwidth": (BandwidthOptions, bandwidth.points, "micro-bandwidth"),
    "layer": (LayerOptions, layer.points, "micro-layer"),
    "breakdown": (BreakdownOptions, breakdown.points, "micro-breakdown"),
}


@dataclass
class MicroOutcome:
    run_id: str
    name: str
    records: list[dict]
    options: object  # the resolved options (defaults filled for the device)


def run_micro(kind: str, options, db: str = "transbench.db",
              on_point: Callable[[Point], None] = lambda p: None) -> MicroOutcome:
    """Measure micro-benchmark `kind` ('gemm', 'bandwidth', 'layer' or 'breakdown') with its options
    dataclass; every point is stored as it is measured. Bad options raise SpecError before anything runs."""
    if kind not in KINDS:
        raise SpecError(f"unknown micro-benchmark '{kind}': choose from {', '.join(KINDS)}")
    cls, points, scenario = KINDS[kind]
    if not isinstance(options, cls):
        raise SpecError(f"micro {kind} takes {cls.__name__}, not {type(options).__name__}")
    device = dev.resolve(options.device)
    opts = options.resolved(device)
    store = Store(db)
    saved_tf32 = _tf32_state()
    try:
        spec = {"micro": kind, **opts.to_dict(), "device": str(device)}
        try:
            run_id, name = store.create_run(opts.name, "micro", spec, env_mod.collect(open_cuda=device.type == "cuda"))
        except sqlite3.IntegrityError:
            raise SpecError(f"a run named '{opts.name}' is already in {db}: choose another --name") from None
        ctx = make_context(device, db, opts.min_time, opts.warmup)
        for p in points(opts, ctx):
            record = {**p.record, "scenario": scenario, "status": p.status, "error": p.error}
            store.put_cell(run_id, json.dumps(p.key, sort_keys=True), scenario, p.status, record,
                           cell=p.key, samples=p.samples_ms, info=p.info, warnings=p.warnings)
            on_point(p)
        recs = export.records(store, [run_id])
    finally:
        _restore_tf32(saved_tf32)
        store.close()
    return MicroOutcome(run_id, name, recs, opts)


def _tf32_state():
    import torch

    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def _restore_tf32(state) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = state


def plot_micro(outcome: MicroOutcome, db: str, path: str) -> str:
    """The roofline PNG of a gemm or breakdown run: its points against the ceilings it was judged by
    (breakdown: those in its records; gemm: the datasheet's per dtype, or, on a device without a
    datasheet row, the best measured GEMM per dtype and the best stored copy bandwidth)."""
    from ...report.roofline import plot_roofline, roofline_points
    from .ceilings import _best

    recs = [r for r in outcome.records if r.get("status") == "ok"]
    if not recs:
        raise SpecError(f"nothing to plot: no point of run {outcome.name} measured ok")
    scenario = recs[0]["scenario"]
    if scenario == "micro-breakdown":
        first = recs[0]
        peaks = {first["dtype"] + (f" ({first['ceiling_source']})" if first.get("ceiling_source") else ""):
                 first.get("peak_tflops")}
        bw = first.get("peak_gbs")
        title = f"{first['model']} layer parts, batch {first['batch_size']} x seq {first['seq_len']}, {first['dtype']}"
    elif scenario == "micro-gemm":
        peaks = {r["dtype"]: r["peak_tflops"] for r in recs if r.get("peak_tflops")}
        if not peaks:  # no datasheet row: the best measured GEMM of each dtype stands in
            for r in recs:
                label = f"{r['dtype']} (measured)"
                peaks[label] = max(peaks.get(label, 0.0), r["tflops"])
        bw = next((r["peak_gbs"] for r in recs if r.get("peak_gbs")), None)
        if bw is None:
            bw = _best(db, recs[0]["gpu"] or "cpu")[1]
        title = f"GEMM roofline on {recs[0]['gpu'] or 'cpu'}"
    else:
        raise SpecError("--plot is for gemm and breakdown runs")
    return plot_roofline(roofline_points(recs), peaks, bw, path, title=title)
