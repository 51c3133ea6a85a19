"""`transbench run`: the inference grid (the main job)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import api
from ..errors import SpecError
from ..scenarios.inference.spec import RunSpec
from ..spec import load_file, split_list
from ..api import export
from .app import app, declared_command
from .options import build_spec
from .tables import console, records_table, visible


def _refuse_unused_options(given: dict, the_spec: RunSpec) -> None:
    """An option typed for a task or backend the grid does not hold changed nothing, and the run said ok
    (`--task base --new-tokens 64`). Only options typed here: a --spec file (`runs --spec` writes every key)
    holds them all."""
    from ..api import check_mode

    if given.get("new_tokens") is not None and "generate" not in the_spec.tasks:
        raise SpecError(f"--new-tokens {given['new_tokens']} applies to --task generate, and the grid's tasks are "
                        f"{','.join(the_spec.tasks)}: add --task generate, or leave --new-tokens out")
    if given.get("compile_mode") is not None and "compile" not in the_spec.backends:
        check_mode(given["compile_mode"])  # a misspelt mode is named as such first
        raise SpecError(f"--compile-mode {given['compile_mode']} applies to the compile backend, and the grid's "
                        f"backends are {','.join(the_spec.backends)}: add --backend compile, or leave --compile-mode out")


@declared_command(app, RunSpec, command_options=("spec", "db", "json_path", "csv_path", "resume", "wide"))
def run(given: dict, *, spec, db, json_path, csv_path, resume, wide) -> None:
    """Measure inference latency, throughput, TFLOPS, MFU and memory over a model x backend x shape grid."""
    export.check_paths(json_path, csv_path, db)
    the_spec = build_spec(RunSpec, spec, given, kind="inference")
    _refuse_unused_options(given, the_spec)
    explicit = set(load_file(spec, RunSpec) if spec is not None else {}) | {k for k, v in given.items() if v is not None}

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=False)
    bar = {}

    def on_start(cells, done):
        if done:
            console.print(f"resuming: {done} of {len(cells)} cells already stored", markup=False, highlight=False)
        bar["id"] = progress.add_task("cells", total=len(cells))
        progress.start()

    def quant(cell) -> str:
        return f" {cell.quant}" if cell.quant != "none" else ""

    def on_probe(cell, result):
        detail = f"{result.record.get('latency_ms', 0):.3f} ms" if result.status == "ok" else (result.error or "")
        what = "largest batch" if "probes" in result.info else "batch"  # the search's answer, with its warnings
        progress.console.print(visible(f"  max-batch search {cell.model} {cell.backend} {cell.dtype}{quant(cell)} "
                                       f"s{cell.seq}: {what} {cell.batch} {result.status} {detail}")[:160],
                               highlight=False, markup=False)
        for w in result.warnings:
            progress.console.print(visible(f"    warning: {w}"), highlight=False, markup=False)

    def on_cell(cell, result):
        label = f"{cell.model} {cell.task} {cell.backend} {cell.dtype}{quant(cell)} b{cell.batch} s{cell.seq}"
        if result is not None:
            detail = f"{result.record.get('latency_ms', 0):.3f} ms" if result.status == "ok" else (result.error or "")
            progress.console.print(visible(f"  {label}: {result.status} {detail}")[:160], highlight=False, markup=False)
            for w in result.warnings:
                progress.console.print(visible(f"    warning: {w}"), highlight=False, markup=False)
        progress.advance(bar["id"])

    try:
        outcome = api.run(the_spec, db, json_path=json_path, csv_path=csv_path, resume=resume,
                          on_start=on_start, on_cell=on_cell, on_probe=on_probe, explicit=explicit,
                          on_warning=lambda line: progress.console.print(visible(f"warning: {line}"), style="yellow",
                                                                         highlight=False, markup=False))
    finally:
        if bar:  # a stopped, never started bar would still print an empty line
            progress.stop()
    console.print(records_table(outcome.records, title=f"run {outcome.name} ({outcome.run_id})",
                                width=console.width, wide=wide))
    console.print(f"stored in {escape(visible(db))} as run [bold]{escape(visible(outcome.name))}[/]" + (" (resumed)" if outcome.resumed else ""))
