"""`transbench serve`: a load test of one model through one or more backends."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape

from .. import api
from ..scenarios.serve import spec as serve_spec
from ..scenarios.serve.spec import ServeSpec
from ..spec import MAX_SECONDS, check_name, limit_help, split_list
from ..store import export
from .app import app, friendly
from .tables import console, fmt, pct, visible

SHOWN = ("backend", "mode", "rate", "concurrency", "offered_rate", "achieved_rate", "latency_p50_ms",
         "latency_p99_ms", "latency_p999_ms", "goodput", "mean_batch", "ttft_p50_ms", "itl_p50_ms", "max_rate")
# Headers with their units, as the report's (report/serve.py LOAD_COLS): rates per second, goodput a percentage
# (it printed as a bare fraction, 0.9996, and the rates without a unit).
HEADERS = {"rate": "rate /s", "offered_rate": "offered /s", "achieved_rate": "achieved /s", "max_rate": "max rate /s"}
SHOW = {"goodput": pct}


@app.command()
@friendly
def serve(
    model: str = typer.Option("bert-base-uncased", "--model", "-m", help="preset or local checkpoint folder"),
    task: str = typer.Option("classification", help="an encoder task, or generate (decoders: generation under load)"),
    backend: str = typer.Option("sdpa", "--backend", "-b", help="backends, comma-separated"),
    dtype: Optional[str] = typer.Option(None, help="fp32|tf32|fp16|bf16; default fp16 on GPU, fp32 on CPU"),
    device: str = typer.Option("auto", help="auto|cpu|cuda|cuda:N"),
    rate: Optional[str] = typer.Option(None, help="Poisson arrival rates, requests/s (comma-separated: an axis)"),
    concurrency: Optional[str] = typer.Option(None, help=limit_help("closed loop: clients, each sending its next request "
                                              "when the last returns (comma-separated: an axis)", "--concurrency")),
    offline: bool = typer.Option(False, "--offline", help="every batch full: the throughput bound"),
    lengths: str = typer.Option("lognormal:64:256", help="fixed:N | normal:MEAN:MAX[:STDEV] | "
                                "lognormal:MEAN:MAX[:SIGMA] | counts:FILE | text:FILE (tokenized, one request a line)"),
    max_batch_size: int = typer.Option(32, help=limit_help("the batcher's largest batch", "--max-batch-size")),
    max_wait_ms: float = typer.Option(2.0, help="a batch leaves when its oldest request has waited this long"),
    duration: float = typer.Option(10.0, help="seconds of arrivals measured per cell"),
    warmup: float = typer.Option(2.0, help=f"seconds of arrivals served first and not counted (at most {MAX_SECONDS:,})"),
    slo_ms: Optional[float] = typer.Option(None, help="latency target: goodput is the share within it"),
    percentile: Optional[float] = typer.Option(None, show_default="99",
                                               help="the percentile --find-max-rate holds under --slo-ms"),
    find_max_rate: bool = typer.Option(False, "--find-max-rate", help="bisect the largest rate meeting the target"),
    new_tokens: Optional[int] = typer.Option(None, show_default="32", help=limit_help("tokens generated per request (--task generate)", "--new-tokens")),
    seed: int = typer.Option(0, help="seed of arrivals, lengths and weights"),
    timeout: float = typer.Option(900.0, help="seconds a cell may take before it is `timeout`"),
    db: str = typer.Option("transbench.db", help="SQLite store"),
    json_path: Optional[str] = typer.Option(None, "--json", help="also write the records as JSON"),
    csv_path: Optional[str] = typer.Option(None, "--csv", help="also write the records as CSV"),
    name: Optional[str] = typer.Option(None, help="run name; rerunning a name resumes it"),
) -> None:
    """Serving under load: latency percentiles against offered load, and the largest rate under a target."""
    export.check_paths(json_path, csv_path, db)  # as run does: a bad path is refused before any load, not after
    if name is not None:
        check_name(name)
    spec = ServeSpec(model=model, task=task, backends=split_list(backend), dtype=dtype, device=device,
                     rates=split_list(rate, float) if rate else [],
                     concurrency=split_list(concurrency, int) if concurrency else [], offline=offline,
                     lengths=lengths, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, duration=duration,
                     warmup=warmup, slo_ms=slo_ms, find_max_rate=find_max_rate, seed=seed, timeout=timeout, name=name,
                     **({} if percentile is None else {"percentile": percentile}),
                     **({} if new_tokens is None else {"new_tokens": new_tokens}))
    # given at its default value, an option that nothing here uses is refused as any other value is
    serve_spec.check_given(spec, percentile=percentile is not None, new_tokens=new_tokens is not None)

    def on_cell(cell, result):
        if result is None:
            return
        level = {"rate": f"{cell.rate:.1f}/s", "concurrency": f"c{cell.concurrency}"}.get(cell.mode, cell.mode)
        r = result.record
        # A max rate of 0 (no probed rate met the target) is an answer too: it printed as a bare "max-rate: ok".
        detail = (f"p99 {r['latency_p99_ms']:.2f} ms, achieved {r['achieved_rate']:.1f}/s"
                  if "latency_p99_ms" in r else f"max rate {r['max_rate']:.1f}/s"
                  if r.get("max_rate") is not None and result.status == "ok" else "")
        console.print(visible(f"  {cell.backend} {level}: {result.status} {detail or result.error or ''}")[:160],
                      markup=False, highlight=False)
        # as run prints its cells' warnings: a search whose answer is a lower bound, requests left unserved
        for w in result.warnings:
            console.print(visible(f"    warning: {w}"), markup=False, highlight=False)

    outcome = api.serve(spec, db, json_path=json_path, csv_path=csv_path, on_cell=on_cell)
    console.print(_table(outcome.records, f"serve {outcome.name} ({outcome.run_id})"))
    # names are text, never markup (as run prints them): --name "x[/bold]y" raised a MarkupError after the load
    console.print(f"stored in {escape(visible(db))} as run [bold]{escape(visible(outcome.name))}[/]"
                  + (" (resumed)" if outcome.resumed else ""))


def _table(recs: list[dict], title: str):
    from rich.table import Table
    from rich.text import Text

    cols = [k for k in SHOWN if any(r.get(k) is not None for r in recs)]
    t = Table(title=Text(visible(title)))
    for k in ["status", *cols]:
        t.add_column(HEADERS.get(k) or k.replace("_ms", " ms").replace("_", " "),
                     justify="left" if k in ("backend", "mode", "status") else "right")
    for r in recs:
        t.add_row(str(r.get("status")), *(SHOW.get(k, fmt)(r.get(k)) for k in cols))
    return t
