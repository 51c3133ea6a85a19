"""`transbench micro gemm|bandwidth|layer|breakdown|collectives`: the device's ceilings, the cost of a layer's parts,
and the collectives between GPUs."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape

from ..keys import percent
from ..api import measured_ceilings
from ..api import micro_benchmarks as micro
from ..api import export
from .app import app, declared_command
from .options import App, build_spec
from .tables import Col, console, fitted, pct, pivot, visible

micro_app = App(no_args_is_help=True, help="Micro-benchmarks: GEMM and memory ceilings, one layer, its parts, "
                                                   "collectives between GPUs.")
app.add_typer(micro_app, name="micro")

PLOT = typer.Option(None, "--plot", help="write a roofline plot here (the suffix picks the format: .png, .svg, .pdf, "
                                          "...)")


def _measure(kind: str, cls, spec, given: dict, db: str, json_path, csv_path, plot=None):
    """One micro-benchmark: its outputs checked before anything runs, its options from the --spec file and the
    options given, its points measured and stored."""
    export.check_paths(json_path, csv_path, db, plot=plot)
    opts = build_spec(cls, spec, given, command=("micro", kind), kind="micro")
    return micro.run_micro(kind, opts, db, on_point=_progress)


def _status(r: dict) -> str | None:
    return None if r["status"] == "ok" else r["status"]


def _pct(value: float | None, pct: float | None) -> str:
    """A figure and its percent of the peak, the percentage as the report prints one (report.document.percent): with
    no decimal, a GEMM at 99.6% of its peak read "(100%)"."""
    if value is None:
        return "-"
    return f"{value:.4g}" + (f" ({percent(pct)})" if pct is not None else "")


def _finish(outcome, db: str, json_path, csv_path, plot_path=None) -> None:
    export.write(outcome.records, json_path, csv_path, db=db)
    if plot_path:
        with export.writing(plot_path, outcome.records):  # the run is stored: a failure says how to plot again
            micro.plot_micro(outcome, db, plot_path)
        console.print(visible(f"roofline plot: {plot_path}"), markup=False, highlight=False)
    problems = [r for r in outcome.records if r["status"] != "ok"]
    for r in problems:
        console.print(visible(f"  {r['status']} {r.get('error') or ''}")[:200], style="yellow", highlight=False, markup=False)
    console.print(f"stored in {escape(visible(db))} as run [bold]{escape(visible(outcome.name))}[/] ({len(outcome.records)} points)")


def _grid(title: str, corner: str, columns: list[str], rows: dict[str, dict[str, str]]) -> None:
    """Print `rows` ({row label: {column: text}}) as tables no wider than the terminal; a cell a row lacks
    stays blank."""
    for table in pivot(title, corner, columns, rows, console.width):
        console.print(table)


BREAKDOWN_COLUMNS = [
    Col("part", "part", setting=True), Col("status", "status"), Col("ms", "ms"),
    Col("share", "share", pct, rank=5), Col("tflops", "TFLOPS", rank=4),
    Col("gbps", "GB/s", rank=4), Col("mb", "MB moved", rank=2), Col("intensity", "FLOP/B", rank=3),
    Col("bound", "bound", rank=3), Col("roofline", "% of roofline", lambda v: "-" if v is None else percent(v), rank=6),
]


def _progress(p) -> None:
    if p.status != "ok":
        return
    # The point's settings as `k=v`, in the order they were declared (its key is a dict: a raw dict printed
    # as Python reads badly next to a warning).
    where = " ".join(f"{k}={v}" for k, v in p.key.items() if v is not None) if isinstance(p.key, dict) else p.key
    for w in p.warnings:
        console.print(visible(f"  warning: {where}: {w}"), highlight=False, markup=False)


@declared_command(micro_app, micro.GemmOptions, command_options=("spec", "db", "json_path", "csv_path"))
def gemm(given: dict, *, spec, db, json_path, csv_path, plot: Optional[str] = PLOT) -> None:
    """TFLOPS of matrix products per size and dtype, next to the device's ceiling (datasheet, or measured)."""
    outcome = _measure("gemm", micro.GemmOptions, spec, given, db, json_path, csv_path, plot)
    recs = outcome.records
    ceiling, of_ceiling = _gemm_ceiling(recs, db)
    rows: dict[str, dict] = {}
    for r in recs:
        label = f"n={r['m']}" if r["shape"] == "square" else f"{r['model']} {r['shape']} {r['m']}x{r['n']}x{r['k']}"
        clock = f" @{r['sm_clock_mhz']:.0f} MHz {r['avg_power_w']:.0f} W" if r.get("sm_clock_mhz") and r.get("avg_power_w") else ""
        rows.setdefault(label, {})[r["dtype"]] = _status(r) or _pct(r.get("tflops"), of_ceiling(r)) + clock
    # Each figure with the SM clock and board power it ran at: a GPU at its power cap runs large GEMMs
    # below its maximum clock, so a sustained figure is lower than a short burst (docs/micro.md).
    _grid(f"GEMM TFLOPS{ceiling} on {recs[0]['gpu'] or 'cpu'}" if recs else "GEMM", "m x n x k",
          list(dict.fromkeys(r["dtype"] for r in recs)), rows)
    _finish(outcome, db, json_path, csv_path, plot)


def _gemm_ceiling(recs: list[dict], db: str):
    """(the title's words for the percentage, record -> its percent of that ceiling). A device with a datasheet row
    has its peak in the records; a CPU (or a GPU of no known row) has none, and its ceiling is the best GEMM of the
    dtype measured on it in this store (this run's points included: `env` shows the same figure). The title read
    "% of datasheet peak" on a CPU, which has no datasheet figure."""
    if any(r.get("pct_of_peak") is not None for r in recs):
        return " (% of datasheet peak)", lambda r: r.get("pct_of_peak")
    hardware = next((r["gpu"] or "cpu" for r in recs), "cpu")
    best = measured_ceilings(db, hardware)

    def of_measured(r: dict) -> float | None:
        top = best.get(f"{r['dtype']} GEMM TFLOPS")
        # the ratio first: t / t is exactly 1, where 100 t / t missed 100.0 by a rounding for 7% of figures, and the
        # ceiling's own point read "(100.000000%)"
        return 100 * (r["tflops"] / top) if top and r.get("tflops") is not None else None

    if not any(of_measured(r) is not None for r in recs):
        return "", of_measured  # nothing to compare with: no percentage, and no title claiming one
    return f" (% of the measured ceiling: the best GEMM of its dtype stored for {hardware})", of_measured


@declared_command(micro_app, micro.BandwidthOptions, command_options=("spec", "db", "json_path", "csv_path"))
def bandwidth(given: dict, *, spec, db, json_path, csv_path) -> None:
    """GB/s (bytes read + written) of element-wise copy, scale and add, and the TFLOPS they reach."""
    outcome = _measure("bandwidth", micro.BandwidthOptions, spec, given, db, json_path, csv_path)
    recs = outcome.records
    rows: dict[str, dict] = {}
    for r in recs:
        status = _status(r)
        cells = rows.setdefault(f"{r['elements']:,}", {})
        cells[f"{r['op']} GB/s"] = status or _pct(r.get("gbps"), r.get("pct_of_peak"))
        cells[f"{r['op']} TFLOPS"] = "" if status else f"{r['tflops']:.3g}"
    # a percentage only where a datasheet gives the peak (a CPU has none: its title claimed one all the same)
    of_peak = " (% of datasheet)" if any(r.get("pct_of_peak") is not None for r in recs) else ""
    _grid(f"memory bandwidth, {outcome.options.dtype}: GB/s{of_peak} and TFLOPS on {recs[0]['gpu'] or 'cpu'}"
          if recs else "bandwidth", "elements",
          [f"{op} {unit}" for op in dict.fromkeys(r["op"] for r in recs) for unit in ("GB/s", "TFLOPS")], rows)
    _finish(outcome, db, json_path, csv_path)


@declared_command(micro_app, micro.LayerOptions, command_options=("spec", "db", "json_path", "csv_path"))
def layer(given: dict, *, spec, db, json_path, csv_path) -> None:
    """Forward and forward+backward TFLOPS of one transformer layer over batch x seq."""
    outcome = _measure("layer", micro.LayerOptions, spec, given, db, json_path, csv_path)
    recs = outcome.records
    res = outcome.options
    rows: dict[str, dict] = {}
    for r in recs:
        rows.setdefault(str(r["batch_size"]), {})[f"{r['pass']} seq={r['seq_len']}"] = (
            _status(r) or _pct(r.get("tflops"), r.get("pct_of_peak")))
    of_peak = " (% of datasheet peak)" if any(r.get("pct_of_peak") is not None for r in recs) else ""  # none on a CPU
    _grid(f"one {res.model} layer, {res.dtype}: TFLOPS{of_peak}", "batch",
          [f"{p} seq={s}" for s in res.seqs for p in ("fwd", "fwd+bwd")], rows)
    _finish(outcome, db, json_path, csv_path)


@declared_command(micro_app, micro.BreakdownOptions, command_options=("spec", "db", "json_path", "csv_path"))
def breakdown(given: dict, *, spec, db, json_path, csv_path, plot: Optional[str] = PLOT) -> None:
    """Time, share, TFLOPS, bytes, intensity and roofline bound of each part of one layer."""
    outcome = _measure("breakdown", micro.BreakdownOptions, spec, given, db, json_path, csv_path, plot)
    recs = outcome.records
    res = outcome.options
    if not recs:  # a shard that holds none of the parts
        _finish(outcome, db, json_path, csv_path)
        return
    first = recs[0]
    src = first.get("ceiling_source")
    ceil = (f"ceilings ({src}): {first['peak_tflops']:.4g} TFLOPS, {first['peak_gbs']:.4g} GB/s"
            if first.get("peak_tflops") and first.get("peak_gbs")
            else "no ceilings known: run `micro gemm` and `micro bandwidth` with this --db")
    rows = []
    for r in recs:
        timed = r if r["status"] == "ok" else {}
        rows.append({"part": r["part"], "status": r["status"], "ms": timed.get("latency_ms"),
                     "share": timed.get("share"), "tflops": timed.get("tflops"), "gbps": timed.get("gbps"),
                     "mb": r["bytes"] / 1e6, "intensity": r["intensity"], "bound": r.get("bound") or "?",
                     "roofline": timed.get("pct_of_roofline") or None, "error": r.get("error")})
    console.print(fitted(rows, BREAKDOWN_COLUMNS, f"one {res.model} layer, batch {res.batch} x seq {res.seq}, "
                         f"{res.dtype}; {ceil}", console.width))
    console.print(f"attention / FFN FLOP ratio: {first.get('attn_ffn_flop_ratio', 0):.4g} (matrix products; "
                  "shares overlap: dense is inside dense+act, inside ffn)")
    _finish(outcome, db, json_path, csv_path, plot)


def _size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes:,} B"


@declared_command(micro_app, micro.CollectivesOptions, command_options=("spec", "db", "json_path", "csv_path"))
def collectives(given: dict, *, spec, db, json_path, csv_path) -> None:
    """Time, algorithm and bus bandwidth (nccl-tests' definitions) of all-reduce, all-gather and reduce-scatter."""
    outcome = _measure("collectives", micro.CollectivesOptions, spec, given, db, json_path, csv_path)
    recs = outcome.records
    res = outcome.options
    rows: dict[str, dict] = {}
    for r in recs:
        cells = rows.setdefault(_size_label(r["bytes"]), {})
        status = _status(r)
        cells[f"{r['op']} us"] = status or f"{r['latency_ms'] * 1e3:.4g}"
        cells[f"{r['op']} busbw"] = "" if status else f"{r['busbw_gbs']:.4g}"
    where = recs[0]["gpu"] or "cpu" if recs else "cpu"
    _grid(f"collectives over {res.nproc} x {where}, {res.dtype}: time per call (us) and bus bandwidth (GB/s, "
          "nccl-tests' busbw)", "bytes", [f"{o} {u}" for o in res.ops for u in ("us", "busbw")], rows)
    _finish(outcome, db, json_path, csv_path)
