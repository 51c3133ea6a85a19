"""`transbench micro gemm|bandwidth|layer|breakdown`: the device's ceilings and the cost of a layer's parts."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from ..scenarios import micro
from ..spec import split_list
from ..store import export
from .app import app, friendly
from .tables import console

micro_app = typer.Typer(no_args_is_help=True, help="Micro-benchmarks: GEMM and memory ceilings, one layer, its parts.")
app.add_typer(micro_app, name="micro")

DEVICE = typer.Option("auto", help="auto|cpu|cuda|cuda:N")
MIN_TIME = typer.Option(None, "--min-time", help="seconds of timed calls per point (default 0.2 on GPU, 0.1 on CPU)")
DB = typer.Option("transbench.db", help="SQLite store")
NAME = typer.Option(None, help="run name")
JSON = typer.Option(None, "--json", help="also write the records as JSON")
CSV = typer.Option(None, "--csv", help="also write the records as CSV")
PLOT = typer.Option(None, "--plot", help="write a roofline PNG here")


def _status(r: dict) -> str | None:
    return None if r["status"] == "ok" else f"[bold red]{r['status']}[/]"


def _pct(value: float | None, pct: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" + (f" ({pct:.0f}%)" if pct is not None else "")


def _finish(outcome, db: str, json_path, csv_path, plot_path=None) -> None:
    export.write(outcome.records, json_path, csv_path)
    if plot_path:
        micro.plot_micro(outcome, db, plot_path)
        console.print(f"roofline plot: {plot_path}")
    problems = [r for r in outcome.records if r["status"] != "ok"]
    for r in problems:
        console.print(f"  [yellow]{r['status']}[/] {r.get('error') or ''}"[:200], highlight=False)
    console.print(f"stored in {db} as run [bold]{outcome.name}[/] ({len(outcome.records)} points)")


def _grid(title: str, corner: str, columns: list[str], rows: dict[str, dict[str, str]]) -> None:
    """Print `rows` ({row label: {column: text}}) as one table; a cell a row lacks stays blank."""
    t = Table(title=title)
    t.add_column(corner, justify="right")
    for c in columns:
        t.add_column(c, justify="right")
    for label, cells in rows.items():
        t.add_row(label, *(cells.get(c, "") for c in columns))
    console.print(t)


def _progress(p) -> None:
    if p.status != "ok":
        return
    for w in p.warnings:
        console.print(f"  [yellow]warning:[/] {p.key}: {w}", highlight=False)


@micro_app.command()
@friendly
def gemm(
    sizes: Optional[str] = typer.Option(None, help="square sizes n, e.g. 1024,2^12 (GPU default 128..16384)"),
    dtypes: Optional[str] = typer.Option(None, help="fp32,tf32,fp16,bf16,fp8 (default: all on GPU, fp32 on CPU)"),
    models: Optional[str] = typer.Option(None, help="presets whose 4 layer GEMMs to add; '' for none"),
    tokens: Optional[int] = typer.Option(None, help="rows (batch x seq) of the layer GEMMs (default 8192 on GPU)"),
    device: str = DEVICE, min_time: Optional[float] = MIN_TIME, db: str = DB, name: Optional[str] = NAME,
    json_path: Optional[str] = JSON, csv_path: Optional[str] = CSV, plot: Optional[str] = PLOT,
) -> None:
    """TFLOPS of matrix products per size and dtype, next to the datasheet peak."""
    opts = micro.GemmOptions(sizes=micro.parse_sizes(sizes), dtypes=dtypes and split_list(dtypes),
                             models=None if models is None else split_list(models), tokens=tokens,
                             device=device, min_time=min_time, name=name)
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
    dtype: str = typer.Option("fp32", help="fp32|fp16|bf16"),
    device: str = DEVICE, min_time: Optional[float] = MIN_TIME, db: str = DB, name: Optional[str] = NAME,
    json_path: Optional[str] = JSON, csv_path: Optional[str] = CSV,
) -> None:
    """GB/s (bytes read + written) of element-wise copy, scale and add, and the TFLOPS they reach."""
    opts = micro.BandwidthOptions(sizes=micro.parse_sizes(sizes), ops=ops and split_list(ops), dtype=dtype,
                                  device=device, min_time=min_time, name=name)
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
    model: str = typer.Option("bert-large-uncased", "--model", "-m", help="preset or local checkpoint folder"),
    dtype: Optional[str] = typer.Option(None, help="fp32|tf32|fp16|bf16 (default fp16 on GPU, fp32 on CPU)"),
    batch: Optional[str] = typer.Option(None, help="batch sizes (default 4,8,...,128 on GPU)"),
    seq: Optional[str] = typer.Option(None, help="sequence lengths (default 128,512 on GPU)"),
    device: str = DEVICE, min_time: Optional[float] = MIN_TIME, db: str = DB, name: Optional[str] = NAME,
    json_path: Optional[str] = JSON, csv_path: Optional[str] = CSV,
) -> None:
    """Forward and forward+backward TFLOPS of one transformer layer over batch x seq."""
    opts = micro.LayerOptions(model=model, dtype=dtype, batches=batch and split_list(batch, int),
                              seqs=seq and split_list(seq, int), device=device, min_time=min_time, name=name)
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
    model: str = typer.Option("bert-large-uncased", "--model", "-m", help="preset or local checkpoint folder"),
    dtype: Optional[str] = typer.Option(None, help="fp32|tf32|fp16|bf16 (default fp16 on GPU, fp32 on CPU)"),
    batch: Optional[int] = typer.Option(None, help="batch size (default 64 on GPU, 4 on CPU)"),
    seq: Optional[int] = typer.Option(None, help="sequence length (default 128)"),
    device: str = DEVICE, min_time: Optional[float] = MIN_TIME, db: str = DB, name: Optional[str] = NAME,
    json_path: Optional[str] = JSON, csv_path: Optional[str] = CSV, plot: Optional[str] = PLOT,
) -> None:
    """Time, share, TFLOPS, bytes, intensity and roofline bound of each part of one layer."""
    opts = micro.BreakdownOptions(model=model, dtype=dtype, batch=batch, seq=seq, device=device,
                                  min_time=min_time, name=name)
    outcome = micro.run_micro("breakdown", opts, db, on_point=_progress)
    recs = outcome.records
    res = outcome.options
    first = recs[0]
    src = first.get("ceiling_source")
    ceil = (f"ceilings ({src}): {first['peak_tflops']:.4g} TFLOPS, {first['peak_gbs']:.4g} GB/s"
            if first.get("peak_tflops") and first.get("peak_gbs")
            else "no ceilings known: run `micro gemm` and `micro bandwidth` with this --db")
    t = Table(title=f"one {res.model} layer, batch {res.batch} x seq {res.seq}, {res.dtype}; {ceil}")
    for c in ("part", "ms", "share", "TFLOPS", "GB/s", "MB moved", "FLOP/B", "bound", "% of roofline"):
        t.add_column(c, justify="left" if c in ("part", "bound") else "right")
    for r in recs:
        status = _status(r)
        timed = None if status else r
        t.add_row(r["part"], status or f"{r['latency_ms']:.4g}",
                  f"{timed['share']:.1%}" if timed and timed.get("share") is not None else "-",
                  f"{timed['tflops']:.4g}" if timed else "-", f"{timed['gbps']:.4g}" if timed else "-",
                  f"{r['bytes'] / 1e6:.4g}", f"{r['intensity']:.4g}", r.get("bound") or "?",
                  f"{timed['pct_of_roofline']:.0f}%" if timed and timed.get("pct_of_roofline") else "-")
    console.print(t)
    console.print(f"attention / FFN FLOP ratio: {first.get('attn_ffn_flop_ratio', 0):.4g} (matrix products; "
                  "shares overlap: dense is inside dense+act, inside ffn)")
    _finish(outcome, db, json_path, csv_path, plot)
