"""`transbench train`: training throughput, memory and scaling, one GPU or many (torchrun)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .. import api
from ..errors import SpecError
from ..scenarios.training.spec import TrainSpec, zero_stage_refusal
from ..api import export
from .app import app, declared_command
from .options import build_spec
from .tables import Col, console, fitted, fmt, pct, show, status_text, visible

SETTINGS = [Col(k, setting=True) for k in ("model", "task", "backend", "dtype", "optim", "batch_size", "seq_len",
                                            "grad_accum", "grad_ckpt", "compile", "kernels", "head", "activation",
                                            "dropout", "pad_vocab", "strategy", "world_size", "zero_stage", "nccl")]
SETTINGS.append(Col("status", show=status_text))
# A narrow terminal drops the lowest rank first: the phase split and the derived rates go before the figures a
# training table is read for (samples/s, MFU, scaling), which one cell on a 180-column terminal lost first.
SPEED_COLUMNS = [*SETTINGS, Col("latency_ms", "step ms"), Col("forward_ms", rank=2), Col("backward_ms", rank=2),
                 Col("optimizer_ms", rank=2), Col("samples_per_s", rank=8), Col("tokens_per_s", rank=3),
                 Col("tflops_per_gpu", rank=5), Col("mfu", rank=7), Col("hfu", rank=4),
                 Col("scaling_efficiency", rank=6), Col("allreduce_ms", rank=4), Col("comm_share", rank=5),
                 Col("allreduce_exposed_ms", rank=3)]
MEMORY_COLUMNS = [*SETTINGS, Col("peak_mem_mb"), Col("peak_reserved_mb", rank=2, wide=True), Col("params_mb", rank=5),
                  Col("grads_mb", rank=4), Col("optim_state_mb", rank=4), Col("activations_mb", rank=6),
                  Col("loss_start", rank=3), Col("loss_end", rank=3)]


LADDER_COLUMNS = [("step", "step"), ("kept", "kept"), ("batch_size", "batch"), ("status", "status"), ("samples_per_s", "samples/s"),
                  ("gain_samples_per_s", "gain"), ("tflops", "TFLOPS"), ("gain_tflops", "gain"), ("mfu", "MFU"),
                  ("gain_mfu", "gain"), ("hfu", "HFU"), ("peak_mem_mb", "peak MiB"), ("gain_peak_mem_mb", "gain"),
                  ("forward_ms", "fwd ms"), ("backward_ms", "bwd ms"), ("optimizer_ms", "optim ms"),
                  ("options", "best combination")]
TEXT = ("step", "options", "model", "task", "backend", "dtype", "optim", "kernels", "strategy", "status", "nccl")


def training_table(recs: list[dict], columns: list[tuple[str, str]], title: str = "") -> Table:
    """Only the columns some record fills, so a one-GPU sweep shows no NCCL or scaling column."""
    cols = [c for c in columns if c[0] == "status" or any(r.get(c[0]) not in (None, "") for r in recs)]
    # names are text, never markup: a ladder named "x[/bold]y" ended in a MarkupError after all its training
    t = Table(title=Text(visible(title)))
    for key, label in cols:
        t.add_column(label, justify="left" if key in TEXT else "right")
    for r in recs:
        row = []
        for key, _ in cols:
            v = r.get(key)
            if key in ("mfu", "hfu", "scaling_efficiency") and v is not None:
                row.append(f"{v:.1%}")
            elif key.startswith("gain_") and v is not None:
                row.append(f"x{v:.2f}")
            elif key == "status" and v != "ok":
                row.append(f"[bold red]{v}[/]")
            elif isinstance(v, bool):
                row.append(show(key, v))  # as every table prints a true/false key (keys.flag)
            else:
                row.append(escape(fmt(v, ".4g")))  # a checkpoint folder's name may hold brackets
        t.add_row(*row)
    return t


@declared_command(app, TrainSpec, command_options=("spec", "db", "json_path", "csv_path", "wide"))
def train(given: dict, *, spec, db, json_path, csv_path, wide,
          plot: Optional[str] = typer.Option(None, show_default="ladder-MODEL.png",
                                             help="where --ladder writes its plot (the suffix picks the format: "
                                                  ".png, .svg, .pdf, ...)")) -> None:
    """Measure training samples/s, tokens/s, TFLOPS per GPU, MFU, memory and scaling over a grid of choices."""
    zero_stage, max_batch_limit = given["zero_stages"], given["max_batch_limit"]
    the_spec = build_spec(TrainSpec, spec, given, kind="training")
    # --zero-stage 2 is also the spec's default, which the spec's own check cannot tell from a typed one: the
    # command line can (None: not given), and `--zero-stage 2` without deepspeed trained plain and said ok.
    if zero_stage is not None and "deepspeed" not in (the_spec.strategies or []):
        raise SpecError(zero_stage_refusal(the_spec.zero_stages))
    if not the_spec.ladder:  # both only shape a ladder: a plain sweep wrote no plot and searched nothing, and said ok
        for option, value in (("--plot", plot), ("--max-batch-limit", max_batch_limit)):
            if value is not None:
                raise SpecError(f"{option} applies to --ladder only: add --ladder, or leave {option} out")
    # A ladder always writes its plot (a default name in the current folder): checked with the exports, before
    # the ladder's minutes of training.
    if plot is None and the_spec.ladder and the_spec.models:
        plot = f"ladder-{the_spec.models[0].replace('/', '_')}.png"
    export.check_paths(json_path, csv_path, db, plot=plot)

    def on_start(cells, done):
        console.print(f"{len(cells)} training {'step' if the_spec.ladder else 'cell'}(s)"
                      + (f", {done} already stored: resuming" if done else ""))

    def on_cell(cell, result):
        label = cell_label(cell)
        if result is None:
            console.print(visible(f"  {label}: already stored"), highlight=False, markup=False)
            return
        detail = (f"{result.record.get('samples_per_s', 0):.4g} samples/s" if result.status == "ok" and result.record
                  else (result.error or ""))
        console.print(visible(f"  {label}: {result.status} {detail}")[:200], highlight=False, markup=False)
        for w in result.warnings:
            console.print(visible(f"    warning: {w}"), highlight=False, markup=False)

    recs = api.train(the_spec, db, json_path=json_path, csv_path=csv_path, on_start=on_start, on_cell=on_cell)
    if recs and the_spec.ladder:
        from ..api import ladder_plot

        console.print(training_table(recs, LADDER_COLUMNS, f"training ladder {visible(recs[0]['run_name'])} "
                                     f"({recs[0]['run_id']}): gain = this step / the kept steps it changed "
                                     "(the best: / the first); "
                                     "kept = later steps build on it"))
        with export.writing(plot, recs):  # the run is stored: a failure says how to plot it again
            path = ladder_plot(recs, plot)
        console.print(f"plot: {escape(visible(path))}; stored in {escape(visible(db))} as run "
                      f"[bold]{escape(visible(recs[0]['run_name']))}[/]")
    elif recs:
        console.print(fitted(recs, SPEED_COLUMNS, f"training run {recs[0]['run_name']} ({recs[0]['run_id']})",
                             console.width, wide))
        console.print(fitted(recs, MEMORY_COLUMNS, "memory per GPU (peak minus parameters, gradients and optimizer "
                                                   "state = activations and workspace)", console.width, wide,
                             notes_from=None))
        console.print(f"stored in {escape(visible(db))} as run [bold]{escape(visible(recs[0]['run_name']))}[/]")


def cell_label(cell) -> str:
    """A training cell's progress line: every setting that tells two cells of a grid or a ladder apart.
    `--zero-stage 2,3` and `--nccl-p2p on,off` printed two identical lines (`... deepspeed@2: unsupported ...` twice),
    and so did a ladder's masked-head, padded-vocabulary and no-dropout steps (three)."""
    return (f"{cell.model} {cell.task} {cell.backend} {cell.dtype} {cell.optim} b{cell.batch} s{cell.seq} "
            f"x{cell.grad_accum}{' ckpt' if cell.grad_ckpt else ''}{' compile' if cell.compile else ''} {cell.kernels}"
            f"{' masked-head' if cell.head == 'masked' else ''}"
            f"{f' {cell.activation}' if cell.activation else ''}"
            f"{f' pad-vocab-{cell.pad_vocab}' if cell.pad_vocab != 1 else ''}"
            f"{f' dropout-{cell.dropout:g}' if cell.dropout is not None else ''} "
            f"{cell.strategy}@{cell.world_size}"
            f"{f' ZeRO-{cell.zero_stage}' if cell.zero_stage is not None else ''}"
            f"{f' {cell.nccl}' if cell.nccl else ''}")
