"""Running one micro-benchmark: resolve its options for the device, measure point by point, store each
point as a cell of a run of kind "micro", and hand back the flat records."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import SpecError
from ...measure import device as dev
from ...measure import env as env_mod
from ...cells import CellResult, SweepCell
from ...runner import shard as sharding
from ...runner.sweep import SweepOptions, Target, open_run, run_grid
from ...spec import checked
from ...store import Store, export
from . import bandwidth, breakdown, collectives, gemm, layer
from .common import Point, make_context
from .options import BandwidthOptions, BreakdownOptions, CollectivesOptions, GemmOptions, LayerOptions

# kind -> (its options, its module: units(opts) and measure_unit(unit, opts, ctx), the cells' scenario)
KINDS = {
    "gemm": (GemmOptions, gemm, "micro-gemm"),
    "bandwidth": (BandwidthOptions, bandwidth, "micro-bandwidth"),
    "layer": (LayerOptions, layer, "micro-layer"),
    "breakdown": (BreakdownOptions, breakdown, "micro-breakdown"),
    "collectives": (CollectivesOptions, collectives, "micro-collectives"),
}
NO_DEADLINE_S = 3600.0  # a point has no --timeout of its own; a hung kernel still ends within the hour


@dataclass
class MicroOutcome:
    run_id: str
    name: str
    records: list[dict]
    options: object  # the resolved options (defaults filled for the device)


@dataclass(frozen=True)
class MicroCell(SweepCell):
    """One measured point of a micro run, for the sweep loop. Points of one `unit` (the two passes of a
    layer, the parts of a breakdown) are measured together by the first of them that runs, and the
    worker hands the others out as they come (their numbers belong together)."""

    kind: str
    point: str  # the point's key, JSON (sorted keys): the cell's identity
    unit: str  # JSON of the unit the point is measured in
    options: str  # JSON of the resolved options
    device: str = "cpu"
    db: str = "transbench.db"  # breakdown's ceilings come from GEMM and copy runs stored here
    batch: int = 1  # the point's batch where it has one (layer): larger batches after an OOM are skipped

    @property
    def scenario(self) -> str:
        return KINDS[self.kind][2]

    def identity(self) -> dict:
        return json.loads(self.point)

    def oom_group(self) -> str:
        key = json.loads(self.point)
        key.pop("batch", None)
        return json.dumps(key, sort_keys=True)

    def record_fields(self) -> dict:
        """The point's key as record keys (a skipped point has no record of its own)."""
        fields = json.loads(self.point)
        if "batch" in fields:
            fields["batch_size"] = fields.pop("batch")
        if "seq" in fields:
            fields["seq_len"] = fields.pop("seq")
        return {"scenario": self.scenario, "device": self.device, **fields}




def spec_file(stored: dict) -> dict:
    """A stored micro run's spec as `micro KIND --spec` reads it back (`runs --spec`). A gemm run without layer GEMMs
    stores its resolved default --tokens (256 on a CPU), which `micro gemm --spec` refuses where no model is measured:
    left out, the rerun resolves the same default, so the spec (and a resume by name) is the same."""
    if stored.get("micro") == "gemm" and not stored.get("models"):
        return {k: v for k, v in stored.items() if k != "tokens"}
    return stored


def cells(kind: str, opts, device, db: str) -> list[MicroCell]:
    _, module, _ = KINDS[kind]
    options = json.dumps(opts.to_dict(), sort_keys=True)
    return [MicroCell(kind, json.dumps(k, sort_keys=True), json.dumps(unit, sort_keys=True), options, str(device), db,
                      k.get("batch", 1)) for unit, keys in module.units(opts) for k in keys]


def measure(cell_dict: dict, state: dict) -> CellResult:
    """The sweep's target for micro cells, in a worker."""
    cell = MicroCell.from_dict(cell_dict)
    cls, module, scenario = KINDS[cell.kind]
    opts = cls(**json.loads(cell.options))
    measured = state.setdefault("micro_units", {})
    unit_id = (cell.kind, cell.options, cell.unit)
    if unit_id not in measured or cell.point not in measured[unit_id]:
        measured.clear()
        device = dev.resolve(cell.device)
        ctx = make_context(device, cell.db, opts.min_time, opts.warmup)
        points = module.measure_unit(json.loads(cell.unit), opts, ctx)
        measured[unit_id] = {json.dumps(p.key, sort_keys=True): p for p in points}
        dev.free_memory(device)
    p = measured[unit_id].pop(cell.point)
    return CellResult(p.status, {**p.record, "scenario": scenario}, p.samples_ms, p.info, p.warnings, p.error)


def run_micro(kind: str, options, db: str = "transbench.db",
              on_point: Callable[[Point], None] = lambda p: None) -> MicroOutcome:
    """Measure micro-benchmark `kind` ('gemm', 'bandwidth', 'layer', 'breakdown' or 'collectives') with its options
    dataclass, through the one sweep loop (a worker process, one stored cell per point, resumable by
    name). Bad options raise SpecError before anything runs."""
    if not isinstance(kind, str) or kind not in KINDS:  # a list or None: a SpecError, not a TypeError
        raise SpecError(f"unknown micro-benchmark '{kind}': choose from {', '.join(KINDS)}")
    cls, _, _ = KINDS[kind]
    if not isinstance(options, cls):
        raise SpecError(f"micro {kind} takes {cls.__name__}, not {type(options).__name__}")
    options = checked(cls, options)  # api.micro(kind, GemmOptions(...)): each field's type, as a spec file's
    device = dev.resolve(options.device)
    opts = options.resolved(device)
    store = Store(db)
    try:
        spec = {"micro": kind, **opts.to_dict(), "device": str(device)}
        spec.pop("name", None)
        # a shard measures whole units (their points are measured together)
        todo = sharding.select(cells(kind, opts, device, str(db)), sharding.resolve(opts.shard),
                               group=lambda c: c.unit)
        run_id, name, _ = open_run(store, "micro", spec, opts.name, lambda: env_mod.collect(open_cuda=False),
                                   {c.key() for c in todo})

        def on_cell(cell: MicroCell, r: CellResult | None) -> None:
            if r is not None:
                on_point(Point(json.loads(cell.point), r.status, r.record, r.samples_ms, r.info, r.warnings, r.error))

        run_grid(store, run_id, todo,
                 Target(MicroCell, measure="transbench.scenarios.micro.run:measure"),
                 SweepOptions(timeout=NO_DEADLINE_S, threads=opts.threads), on_cell)
        recs = export.records(store, [run_id], by_id=True)
    finally:
        store.close()
    return MicroOutcome(run_id, name, recs, opts)


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
