"""`transbench run`: the inference grid (the main job)."""

from __future__ import annotations

import json
import os
from typing import Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import api
from ..errors import SpecError
from ..scenarios.inference.spec import RunSpec
from ..spec import limit_help, load_file, split_list
from ..store import Store, export
from .app import app, friendly
from .options import LIST, build_spec, shown
from .tables import console, records_table, visible


def _refuse_ignored_options(db: str, spec_file: str | None, given: dict, the_spec: RunSpec) -> None:
    """`--resume` without --name resumes the newest run with the options stored with it, so an option given
    alongside that says otherwise would be dropped without a word (`--resume --batch 1,2,4` after a run of
    batch 1,2 measured nothing and said "resumed"): refused, naming it. Options equal to the stored ones pass."""
    explicit = set(load_file(spec_file, RunSpec) if spec_file is not None else {})
    explicit |= {k for k, v in given.items() if v is not None}
    if not explicit or not os.path.exists(db):
        return  # nothing given, or nothing to resume (api.run says so)
    store = Store(db, readonly=True)
    try:
        last = store.find_run("last")
    finally:
        store.close()
    if last is None or last["kind"] != "inference":
        return  # api.run says there is nothing to resume
    mine = the_spec.to_dict()
    differ = sorted(k for k in explicit if mine.get(k) != last["spec"].get(k))
    if differ:
        listed = ", ".join(f"{k} {json.dumps(last['spec'].get(k))} -> {json.dumps(mine.get(k))}" for k in differ[:3])
        raise SpecError(f"--resume without --name resumes the newest run, '{last['name']}', with its own options, "
                        f"and these differ ({listed}): leave them out, or give --name to resume or start a run "
                        "with them")


def _refuse_unused_options(given: dict, the_spec: RunSpec) -> None:
    """An option typed for a task or backend the grid does not hold changed nothing, and the run said ok
    (`--task base --new-tokens 64`). Only options typed here: a --spec file (`runs --spec` writes every key)
    holds them all."""
    from ..backends.compile import check_mode

    if given.get("new_tokens") is not None and "generate" not in the_spec.tasks:
        raise SpecError(f"--new-tokens {given['new_tokens']} applies to --task generate, and the grid's tasks are "
                        f"{','.join(the_spec.tasks)}: add --task generate, or leave --new-tokens out")
    if given.get("compile_mode") is not None and "compile" not in the_spec.backends:
        check_mode(given["compile_mode"])  # a misspelt mode is named as such first
        raise SpecError(f"--compile-mode {given['compile_mode']} applies to the compile backend, and the grid's "
                        f"backends are {','.join(the_spec.backends)}: add --backend compile, or leave --compile-mode out")


def _d(name: str) -> str:
    return shown(RunSpec, name)


@app.command()
@friendly
def run(
    model: Optional[str] = typer.Option(None, "--model", "-m", show_default=_d("models"),
                                        help=f"preset or local checkpoint folder ({LIST})"),
    task: Optional[str] = typer.Option(None, show_default=_d("tasks"),
                                       help=f"base|mlm|classification|token-classification|qa|causal-lm|generate ({LIST})"),
    backend: Optional[str] = typer.Option(None, "--backend", "-b", show_default=_d("backends"),
                                          help=f"eager,sdpa,sdpa-math,...,fused ({LIST})"),
    dtype: Optional[str] = typer.Option(None, show_default="fp16 on GPU, fp32 on CPU",
                                        help=f"fp32|tf32|fp16|bf16|fp8 ({LIST})"),
    batch: Optional[str] = typer.Option(None, show_default="1,8,64,256 on GPU, 1,2 on CPU", help=limit_help(f"batch sizes ({LIST})", "--batch")),
    seq: Optional[str] = typer.Option(None, show_default="128,384 on GPU, 128 on CPU", help=limit_help(f"sequence lengths ({LIST})", "--seq")),
    seq_stdev: Optional[float] = typer.Option(None, show_default=_d("seq_stdev"),
                                              help="variable lengths: stdev of lengths drawn around --seq, padded with a mask"),
    device: Optional[str] = typer.Option(None, show_default=_d("device"), help="auto|cpu|cuda|cuda:N"),
    activation: Optional[str] = typer.Option(None, show_default="the model's own", help="gelu|gelu-tanh"),
    embeddings: Optional[bool] = typer.Option(None, "--embeddings/--encoders-only", show_default="--embeddings",
                                              help="time the embedding layer too, or the encoder stack only"),
    min_time: Optional[float] = typer.Option(None, show_default="1 on GPU, 0.5 on CPU", help="seconds of timed calls per cell, at least"),
    min_count: Optional[int] = typer.Option(None, show_default="20 on GPU, 5 on CPU", help=limit_help("timed calls per cell, at least", "--min-count")),
    warmup: Optional[int] = typer.Option(None, show_default="5 on GPU, 2 on CPU", help=limit_help("untimed calls before timing", "--warmup")),
    timeout: Optional[float] = typer.Option(None, show_default=_d("timeout"), help="seconds a cell may take before it is `timeout`"),
    baseline: Optional[str] = typer.Option(None, help="backend to compute speedup and mem_saved against"),
    new_tokens: Optional[int] = typer.Option(None, show_default=_d("new_tokens"), help=limit_help("tokens to generate (--task generate)", "--new-tokens")),
    compile_mode: Optional[str] = typer.Option(None, show_default=_d("compile_mode"), help="torch.compile mode for the compile backend"),
    max_batch: Optional[bool] = typer.Option(None, "--max-batch", help="also search the largest batch that fits"),
    gpus: Optional[str] = typer.Option(None, help="run cells in parallel, one worker per listed GPU (0,1,...)"),
    nproc: Optional[int] = typer.Option(None, show_default=_d("nproc"), help=limit_help("data-parallel inference over N GPUs through torchrun", "--nproc")),
    shard: Optional[str] = typer.Option(None, help="I/N: run a deterministic slice of the grid"),
    spec: Optional[str] = typer.Option(None, help="YAML/TOML/JSON sweep file; options given here override it"),
    db: str = typer.Option("transbench.db", help="SQLite store"),
    json_path: Optional[str] = typer.Option(None, "--json", help="also write the records as JSON"),
    csv_path: Optional[str] = typer.Option(None, "--csv", help="also write the records as CSV"),
    name: Optional[str] = typer.Option(None, help="run name; rerunning a name resumes it"),
    resume: bool = typer.Option(False, "--resume", help="skip finished cells of the named (or newest) run"),
    seed: Optional[int] = typer.Option(None, show_default=_d("seed"), help="seed of the random weights and tokens"),
    wide: bool = typer.Option(False, "--wide", help="print every column of the result table (p99, tokens/s, memory, ...)"),
) -> None:
    """Measure inference latency, throughput, TFLOPS, MFU and memory over a model x backend x shape grid."""
    export.check_paths(json_path, csv_path, db)
    given = {
        "models": model and split_list(model), "tasks": task and split_list(task),
        "backends": backend and split_list(backend), "dtypes": dtype and split_list(dtype),
        "batches": batch and split_list(batch, int), "seqs": seq and split_list(seq, int),
        "seq_stdev": seq_stdev, "device": device, "activation": activation, "embeddings": embeddings,
        "min_time": min_time, "min_count": min_count, "warmup": warmup, "timeout": timeout, "baseline": baseline,
        "new_tokens": new_tokens, "compile_mode": compile_mode, "max_batch": max_batch,
        "gpus": gpus and split_list(gpus, int), "nproc": nproc, "shard": shard, "name": name, "seed": seed,
    }
    the_spec = build_spec(RunSpec, spec, given)
    _refuse_unused_options(given, the_spec)
    if resume and not the_spec.name:
        _refuse_ignored_options(db, spec, given, the_spec)

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=False)
    bar = {}

    def on_start(cells, done):
        if done:
            console.print(f"resuming: {done} of {len(cells)} cells already stored", markup=False, highlight=False)
        bar["id"] = progress.add_task("cells", total=len(cells))
        progress.start()

    def on_probe(cell, result):
        detail = f"{result.record.get('latency_ms', 0):.3f} ms" if result.status == "ok" else (result.error or "")
        what = "largest batch" if "probes" in result.info else "batch"  # the search's answer, with its warnings
        progress.console.print(visible(f"  max-batch search {cell.model} {cell.backend} {cell.dtype} s{cell.seq}: "
                                       f"{what} {cell.batch} {result.status} {detail}")[:160], highlight=False,
                               markup=False)
        for w in result.warnings:
            progress.console.print(visible(f"    warning: {w}"), highlight=False, markup=False)

    def on_cell(cell, result):
        label = f"{cell.model} {cell.task} {cell.backend} {cell.dtype} b{cell.batch} s{cell.seq}"
        if result is not None:
            detail = f"{result.record.get('latency_ms', 0):.3f} ms" if result.status == "ok" else (result.error or "")
            progress.console.print(visible(f"  {label}: {result.status} {detail}")[:160], highlight=False, markup=False)
            for w in result.warnings:
                progress.console.print(visible(f"    warning: {w}"), highlight=False, markup=False)
        progress.advance(bar["id"])

    try:
        outcome = api.run(the_spec, db, json_path=json_path, csv_path=csv_path, resume=resume,
                          on_start=on_start, on_cell=on_cell, on_probe=on_probe)
    finally:
        if bar:  # a stopped, never started bar would still print an empty line
            progress.stop()
    console.print(records_table(outcome.records, title=f"run {outcome.name} ({outcome.run_id})",
                                width=console.width, wide=wide))
    console.print(f"stored in {escape(visible(db))} as run [bold]{escape(visible(outcome.name))}[/]" + (" (resumed)" if outcome.resumed else ""))
