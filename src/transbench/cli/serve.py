"""`transbench serve`: a load test of one model through one or more backends."""

from __future__ import annotations

from rich.markup import escape

from .. import api
from ..scenarios.serve import spec as serve_spec
from ..scenarios.serve.spec import ServeSpec
from ..api import export
from .app import app, declared_command
from .options import build_spec
from .tables import Col, console, fitted, status_text, visible

def _help(name: str) -> str:
    """A setting's help, declared once with its field (ServeSpec)."""
    return ServeSpec.__dataclass_fields__[name].metadata["help"]


# The table every serve prints, fitted to the terminal as run's is (cli/tables.fitted): a cell that did not end ok
# has its reason under the table; columns of a lower rank go first where the terminal is narrow (0: never).
SERVE_COLUMNS = [
    Col("backend", setting=True), Col("mode", setting=True), Col("rate", setting=True),
    Col("concurrency", setting=True), Col("status", show=status_text), Col("offered_rate", rank=6),
    Col("achieved_rate", rank=7), Col("error_rate", rank=8), Col("latency_p50_ms"), Col("latency_p99_ms"),
    Col("latency_p999_ms", rank=3), Col("latency_p99_upper_ms", rank=5), Col("n_requests", rank=6),
    Col("tail_valid", rank=2), Col("goodput", rank=5), Col("mean_batch", rank=3), Col("ttft_p50_ms", rank=4),
    Col("tpot_p50_ms", rank=4), Col("itl_p50_ms", rank=2), Col("client_lag_p99_ms", rank=1), Col("max_rate"),
]


def _tail_text(r: dict, key: str, enough) -> str:
    """A tail figure of a cell's record as its line shows it. It is empty below the count that carries it
    (`enough(n)`), or where it falls on failed requests: 170,682 requests to an endpoint that had died read
    "n/a: 170682 requests", as if too few."""
    value, n = r.get(key), r.get("n_requests")
    if value is not None:
        return f"{value:.2f} ms"
    if r.get("failed") and isinstance(n, int) and enough(n):
        return "failed"
    return f"n/a: {n} requests"


def estimate_text(r: dict, upper_key: str, q: float) -> str:
    """A cell's LoadGen estimate of the q-th percentile (its key: `upper_key`), carried from its minimum count."""
    return _tail_text(r, upper_key, lambda n: n >= serve_spec.estimate_min_requests(q))


@declared_command(app, ServeSpec, command_options=("spec", "db", "json_path", "csv_path"))
def serve(given: dict, *, spec, db, json_path, csv_path) -> None:
    """Serving under load: latency percentiles against offered load, and the largest rate under a target."""
    export.check_paths(json_path, csv_path, db)  # as run does: a bad path is refused before any load, not after
    spec = build_spec(ServeSpec, spec, given, kind="serve")
    # given at its default value, an option that nothing here uses is refused as any other value is
    serve_spec.check_given(spec, percentile=given["percentile"] is not None, new_tokens=given["new_tokens"] is not None)

    # each probe's line shows the percentile its verdict holds: --percentile 90 printed p99 beside a p90 verdict
    latency_key, upper_key, label = serve_spec.verdict_keys(spec)
    q = serve_spec.tail_share(spec) * 100

    def on_cell(cell, result):
        if result is None:
            return
        level = {"rate": f"{cell.rate:.1f}/s", "concurrency": f"c{cell.concurrency}"}.get(cell.mode, cell.mode)
        r = result.record
        tail = _tail_text(r, latency_key, lambda n: serve_spec.carried(q, n))  # measure/timer.carried
        # A max rate of 0 (no probed rate met the target) is an answer too: it printed as a bare "max-rate: ok".
        detail = (f"{label} {tail} (LoadGen estimate {estimate_text(r, upper_key, q)})"
                  + (f", verdict {'met' if r['slo_met'] else 'not met'}" + ("" if r.get("tail_valid") else
                     " (too few requests)") if "slo_met" in r else "")
                  + (f", achieved {r['achieved_rate']:.1f}/s" if r.get("achieved_rate") is not None else "")
                  + (f", errors {r['error_rate']:.1%}" if r.get("error_rate") else "")
                  + (f", max rate {r['max_rate']:.1f}/s" if r.get("max_rate") is not None else "")
                  if latency_key in r else f"max rate {r['max_rate']:.1f}/s"
                  if r.get("max_rate") is not None and result.status == "ok" else "")
        console.print(visible(f"  {cell.backend} {level}: {result.status} {detail or result.error or ''}")[:160],
                      markup=False, highlight=False)
        # as run prints its cells' warnings: a search whose answer is a lower bound, requests left unserved
        for w in result.warnings:
            console.print(visible(f"    warning: {w}"), markup=False, highlight=False)


    def on_progress(cell, text):  # the worker's preparation, as it goes (what, i of n)
        console.print(visible(f"  {cell.backend}: {text}")[:160], markup=False, highlight=False)

    outcome = api.serve(spec, db, json_path=json_path, csv_path=csv_path, on_cell=on_cell, on_progress=on_progress)
    console.print(_table(outcome.records, f"serve {outcome.name} ({outcome.run_id})"))
    # names are text, never markup (as run prints them): --name "x[/bold]y" raised a MarkupError after the load
    console.print(f"stored in {escape(visible(db))} as run [bold]{escape(visible(outcome.name))}[/]"
                  + (" (resumed)" if outcome.resumed else ""))


def _table(recs: list[dict], title: str):
    return fitted(recs, SERVE_COLUMNS, title)
