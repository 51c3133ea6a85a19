"""`transbench micro gemm|bandwidth|layer|breakdown`: the device's ceilings and the cost of a layer's parts."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape

from ..report.document import percent
from ..scenarios import micro
from ..spec import split_list
from ..store import export
from .app import app, friendly
from .options import App, build_spec
from .tables import Col, console, fitted, pct, pivot, visible

micro_app = App(no_args_is_help=True, help="Micro-benchmarks: GEMM and memory ceilings, one layer, its parts.")
app.add_typer(micro_app, name="micro")

DEVICE = typer.Option(None, show_default="auto", help="auto|cpu|cuda|cuda:N")
MIN_TIME = typer.Option(None, "--min-time", show_default="1 on GPU, 0.1 on CPU", help="seconds of timed calls per point")
WARMUP = typer.Option(None, "--warmup", show_default="2", help="untimed calls before timing each point")
DB = typer.Option("transbench.db", help="SQLite store")
NAME = typer.Option(None, help="run name")
JSON = typer.Option(None, "--json", help="also write the records as JSON")
CSV = typer.Option(None, "--csv", help="also write the records as CSV")
PLOT = typer.Option(None, "--plot", help="write a roofline PNG here")
SPEC = typer.Option(None, "--spec", help="YAML/TOML/JSON file of these options; options given here override it")


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


@micro_app.command()
@friendly
def gemm(
    sizes: Optional[str] = typer.Option(None, help="square sizes n, e.g. 1024,2^12 (GPU default 128..16384)"),
    dtype: Optional[str] = typer.Option(None, "--dtype", show_default="all on GPU, fp32 on CPU",
                                        help="fp32,tf32,fp16,bf16,fp8 (comma-separated)"),
    model: Optional[str] = typer.Option(None, "--model", "-m", show_default="bert-base-uncased,bert-large-uncased on GPU, none on CPU",
                                        help="presets whose 4 layer GEMMs to add (comma-separated); '' for none"),
    tokens: Optional[int] = typer.Option(None, help="rows (batch x seq) of the layer GEMMs (default 8192 on GPU)"),
    device: Optional[str] = DEVICE, min_time: Optional[float] = MIN_TIME, warmup: Optional[int] = WARMUP,
    db: str = DB, name: Optional[str] = NAME, json_path: Optional[str] = JSON, csv_path: Optional[str] = CSV,
    plot: Optional[str] = PLOT, spec: Optional[str] = SPEC,
) -> None:
    """TFLOPS of matrix products per size and dtype, next to the datasheet peak."""
    export.check_paths(json_path, csv_path, db, plot=plot)
    opts = build_spec(micro.GemmOptions, spec, dict(
        sizes=micro.parse_sizes(sizes), dtypes=dtype and split_list(dtype),
        models=None if model is None else split_list(model), tokens=tokens, device=device, min_time=min_time,
        warmup=warmup, name=name), command=("micro", "gemm"))
    outcome = micro.run_micro("gemm", opts, db, on_point=_progress)
    recs = outcome.records
    rows: dict[str, dict] = {}
    for r in recs:
        label = f"n={r['m']}" if r["shape"] == "square" else f"{r['model']} {r['shape']} {r['m']}x{r['n']}x{r['k']}"
        clock = f" @{r['sm_clock_mhz']:.0f} MHz {r['avg_power_w']:.0f} W" if r.get("sm_clock_mhz") and r.get("avg_power_w") else ""
        rows.setdefault(label, {})[r["dtype"]] = _status(r) or _pct(r.get("tflops"), r.get("pct_of_peak")) + clock
    # Each figure with the SM clock and board power it ran at: a GPU at its power cap runs large GEMMs
    # below its maximum clock, so a sustained figure is lower than a short burst (README, "micro").
    _grid(f"GEMM TFLOPS (% of datasheet peak) on {recs[0]['gpu'] or 'cpu'}" if recs else "GEMM", "m x n x k",
          list(dict.fromkeys(r["dtype"] for r in recs)), rows)
    _finish(outcome, db, json_path, csv_path, plot)


@micro_app.command()
@friendly
def bandwidth(
    sizes: Optional[str] = typer.Option(None, help="elements per vector, e.g. 2^20,2^24 (GPU default 2^14..2^28)"),
    ops: Optional[str] = typer.Option(None, help="copy,scale,add"),
    dtype: Optional[str] = typer.Option(None, show_default="fp32", help="fp32|fp16|bf16"),
    device: Optional[str] = DEVICE, min_time: Optional[float] = MIN_TIME, warmup: Optional[int] = WARMUP,
    db: str = DB, name: Optional[str] = NAME, json_path: Optional[str] = JSON, csv_path: Optional[str] = CSV,
    spec: Optional[str] = SPEC,
) -> None:
    """GB/s (bytes read + written) of element-wise copy, scale and add, and the TFLOPS they reach."""
    export.check_paths(json_path, csv_path, db)
    opts = build_spec(micro.BandwidthOptions, spec, dict(
        sizes=micro.parse_sizes(sizes), ops=ops and split_list(ops), dtype=dtype, device=device,
        min_time=min_time, warmup=warmup, name=name), command=("micro", "bandwidth"))
    outcome = micro.run_micro("bandwidth", opts, db, on_point=_progress)
    recs = outcome.records
    rows: dict[str, dict] = {}
    for r in recs:
        status = _status(r)
        cells = rows.setdefault(f"{r['elements']:,}", {})
        cells[f"{r['op']} GB/s"] = status or _pct(r.get("gbps"), r.get("pct_of_peak"))
        cells[f"{r['op']} TFLOPS"] = "" if status else f"{r['tflops']:.3g}"
    _grid(f"memory bandwidth, {opts.dtype}: GB/s (% of datasheet) and TFLOPS on {recs[0]['gpu'] or 'cpu'}"
          if recs else "bandwidth", "elements",
          [f"{op} {unit}" for op in dict.fromkeys(r["op"] for r in recs) for unit in ("GB/s", "TFLOPS")], rows)
    _finish(outcome, db, json_path, csv_path)


@micro_app.command()
@friendly
def layer(
    model: Optional[str] = typer.Option(None, "--model", "-m", show_default="bert-large-uncased",
                                        help="preset or local checkpoint folder"),
    dtype: Optional[str] = typer.Option(None, show_default="fp16 on GPU, fp32 on CPU", help="fp32|tf32|fp16|bf16"),
    batch: Optional[str] = typer.Option(None, show_default="4,8,...,128 on GPU, 1,4 on CPU", help="batch sizes (comma-separated)"),
    seq: Optional[str] = typer.Option(None, show_default="128,512 on GPU, 128 on CPU", help="sequence lengths (comma-separated)"),
    device: Optional[str] = DEVICE, min_time: Optional[float] = MIN_TIME, warmup: Optional[int] = WARMUP,
    db: str = DB, name: Optional[str] = NAME, json_path: Optional[str] = JSON, csv_path: Optional[str] = CSV,
    spec: Optional[str] = SPEC,
) -> None:
    """Forward and forward+backward TFLOPS of one transformer layer over batch x seq."""
    export.check_paths(json_path, csv_path, db)
    opts = build_spec(micro.LayerOptions, spec, dict(
        model=model, dtype=dtype, batches=batch and split_list(batch, int), seqs=seq and split_list(seq, int),
        device=device, min_time=min_time, warmup=warmup, name=name), command=("micro", "layer"))
    outcome = micro.run_micro("layer", opts, db, on_point=_progress)
    recs = outcome.records
    res = outcome.options
    rows: dict[str, dict] = {}
    for r in recs:
        rows.setdefault(str(r["batch_size"]), {})[f"{r['pass']} seq={r['seq_len']}"] = (
            _status(r) or _pct(r.get("tflops"), r.get("pct_of_peak")))
    _grid(f"one {res.model} layer, {res.dtype}: TFLOPS (% of datasheet peak)", "batch",
          [f"{p} seq={s}" for s in res.seqs for p in ("fwd", "fwd+bwd")], rows)
    _finish(outcome, db, json_path, csv_path)


@micro_app.command()
@friendly
def breakdown(
    model: Optional[str] = typer.Option(None, "--model", "-m", show_default="bert-large-uncased",
                                        help="preset or local checkpoint folder"),
    dtype: Optional[str] = typer.Option(None, show_default="fp16 on GPU, fp32 on CPU", help="fp32|tf32|fp16|bf16"),
    batch: Optional[int] = typer.Option(None, show_default="64 on GPU, 4 on CPU", help="batch size"),
    seq: Optional[int] = typer.Option(None, show_default="128", help="sequence length"),
    device: Optional[str] = DEVICE, min_time: Optional[float] = MIN_TIME, warmup: Optional[int] = WARMUP,
    db: str = DB, name: Optional[str] = NAME, json_path: Optional[str] = JSON, csv_path: Optional[str] = CSV,
    plot: Optional[str] = PLOT, spec: Optional[str] = SPEC,
) -> None:
    """Time, share, TFLOPS, bytes, intensity and roofline bound of each part of one layer."""
    export.check_paths(json_path, csv_path, db, plot=plot)
    opts = build_spec(micro.BreakdownOptions, spec, dict(
        model=model, dtype=dtype, batch=batch, seq=seq, device=device, min_time=min_time, warmup=warmup,
        name=name), command=("micro", "breakdown"))
    outcome = micro.run_micro("breakdown", opts, db, on_point=_progress)
    recs = outcome.records
    res = outcome.options
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
