"""`transbench train`: training throughput, memory and scaling, one GPU or many (torchrun)."""

from __future__ import annotations

from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .. import api
from ..errors import SpecError
from ..spec import limit_help
from ..scenarios.training.spec import WHOLE_FIELDS, TrainSpec, zero_stage_refusal
from ..store import export
from .app import app, friendly
from .options import LIST, build_spec, shown
from .tables import Col, console, fitted, fmt, pct, status_text, visible

SETTINGS = [Col("model", "model", setting=True), Col("task", "task", setting=True),
            Col("backend", "backend", setting=True), Col("dtype", "dtype", setting=True),
            Col("optim", "optim", setting=True), Col("batch_size", "batch", setting=True),
            Col("seq_len", "seq", setting=True), Col("grad_accum", "accum", setting=True),
            Col("grad_ckpt", "grad ckpt", setting=True), Col("compile", "compile", setting=True),
            Col("kernels", "kernels", setting=True), Col("head", "head", setting=True),
            Col("activation", "activation", setting=True), Col("pad_vocab", "pad vocab", setting=True),
            Col("strategy", "strategy", setting=True), Col("world_size", "GPUs", setting=True),
            Col("zero_stage", "ZeRO", setting=True), Col("nccl", "nccl", setting=True),
            Col("status", "status", status_text)]
# A narrow terminal drops the lowest rank first: the phase split and the derived rates go before the figures a
# training table is read for (samples/s, MFU, scaling), which one cell on a 180-column terminal lost first.
SPEED_COLUMNS = [*SETTINGS, Col("latency_ms", "step ms"), Col("forward_ms", "fwd ms", rank=2),
                 Col("backward_ms", "bwd ms", rank=2), Col("optimizer_ms", "optim ms", rank=2),
                 Col("samples_per_s", "samples/s", rank=8), Col("tokens_per_s", "tokens/s", rank=3),
                 Col("tflops_per_gpu", "TFLOPS /GPU", rank=5), Col("mfu", "MFU", pct, rank=7),
                 Col("hfu", "HFU", pct, rank=4), Col("scaling_efficiency", "scaling", pct, rank=6)]
MEMORY_COLUMNS = [*SETTINGS, Col("peak_mem_mb", "peak MiB"), Col("peak_reserved_mb", "reserved MiB", rank=2, wide=True),
                  Col("params_mb", "params MiB", rank=5), Col("grads_mb", "grads MiB", rank=4),
                  Col("optim_state_mb", "optim MiB", rank=4), Col("activations_mb", "activ. MiB", rank=6),
                  Col("loss_start", "loss first", rank=3), Col("loss_end", "loss last", rank=3)]


def _d(name: str) -> str:
    return shown(TrainSpec, name)


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
                row.append("on" if v else "off")
            else:
                row.append(escape(fmt(v, ".4g")))  # a checkpoint folder's name may hold brackets
        t.add_row(*row)
    return t


@app.command()
@friendly
def train(
    model: Optional[str] = typer.Option(None, "--model", "-m", help=f"preset or local checkpoint folder ({LIST})"),
    task: Optional[str] = typer.Option(None, help=f"mlm|causal-lm|classification ({LIST}); default: the model's LM task"),
    dtype: Optional[str] = typer.Option(None, "--dtype", show_default="bf16 on GPU, fp32 on CPU",
                                        help=f"fp32|tf32|fp16|bf16 ({LIST}); fp16 = autocast + GradScaler, "
                                        "bf16 = autocast with fp32 master weights"),
    optim: Optional[str] = typer.Option(None, show_default=_d("optims"), help=f"adamw|adamw-foreach|adamw-fused|sgd|ds-fused-adam|apex-fused-adam ({LIST})"),
    backend: Optional[str] = typer.Option(None, "--backend", "-b", show_default=_d("attns"),
                                          help=f"attention: eager|sdpa|sdpa-math|sdpa-efficient|sdpa-flash|sdpa-cudnn|flash-attn2 ({LIST})"),
    batch: Optional[str] = typer.Option(None, show_default="16 on GPU, 4 on CPU", help=f"micro-batch per GPU ({LIST})"),
    seq: Optional[str] = typer.Option(None, show_default="128 on GPU, 32 on CPU", help=f"sequence length ({LIST})"),
    grad_accum: Optional[str] = typer.Option(None, show_default=_d("grad_accums"), help=f"micro-batches per optimizer step ({LIST})"),
    grad_ckpt: Optional[str] = typer.Option(None, "--grad-ckpt", show_default=_d("grad_ckpts"),
                                            help=f"gradient checkpointing: on|off ({LIST}); alone: on"),
    compile: Optional[str] = typer.Option(None, "--compile", show_default=_d("compiles"),
                                          help=f"torch.compile: on|off ({LIST}); alone: on"),
    # help text is rich markup: a bare [liger] was read as a tag and dropped (--help said "pip install 'transbench'")
    kernels: Optional[str] = typer.Option(None, show_default=_d("kernels"),
                                          help=f"torch|liger ({LIST}): liger = Liger-Kernel's LayerNorm and fused "
                                          "linear + cross-entropy head (CUDA; pip install 'transbench\\[liger]')"),
    head: Optional[str] = typer.Option(None, show_default=_d("heads"),
                                       help=f"all|masked ({LIST}): the MLM head on every position (transformers) or "
                                       "on the 15% masked ones only (BERT's own pretraining)"),
    activation: Optional[str] = typer.Option(None, show_default="the model's own",
                                             help="gelu|gelu-tanh: gelu-tanh is GPT-2's gelu_new in one kernel"),
    pad_vocab: Optional[int] = typer.Option(None, show_default=_d("pad_vocab"),
                                            help="pad the vocabulary (embeddings, LM head) to a multiple of N, as "
                                            "nanoGPT's 50,304-row GPT-2: aligned GEMMs for the head; 1: as it is"),
    ladder: bool = typer.Option(False, "--ladder", help="the seed notebook's ladder for one model: fp32, bf16, largest "
                                "batches, fused Adam, accumulation, checkpointing, padded vocabulary, compile, liger; "
                                "a table and a plot"),
    plot: Optional[str] = typer.Option(None, show_default="ladder-MODEL.png", help="where --ladder writes its plot (PNG)"),
    max_batch_limit: Optional[int] = typer.Option(None, show_default=_d("max_batch_limit"),
                                                  help="--ladder's largest-batch searches stop at this batch"),
    strategy: Optional[str] = typer.Option(None, show_default="none on one GPU, ddp on several",
                                           help=f"none|ddp|fsdp|deepspeed ({LIST})"),
    nproc: Optional[str] = typer.Option(None, show_default=_d("nprocs"), help=f"GPUs (processes) per node, through torchrun ({LIST})"),
    zero_stage: Optional[str] = typer.Option(None, show_default=_d("zero_stages"), help=f"DeepSpeed ZeRO stage 1|2|3 ({LIST})"),
    nccl_p2p: Optional[str] = typer.Option(None, help=f"on|off: NCCL_P2P_DISABLE=0|1 ({LIST})"),
    nccl_env: Optional[List[str]] = typer.Option(None, help="KEY=VAL[ KEY=VAL] for the ranks; repeat the option: "
                                                 "each one is a point of the axis"),
    scaling: Optional[bool] = typer.Option(None, "--scaling", help="also run each multi-GPU point on one GPU, for the scaling efficiency"),
    steps: Optional[int] = typer.Option(None, show_default="20 on GPU, 5 on CPU", help=limit_help("timed optimizer steps", "--steps")),
    warmup: Optional[int] = typer.Option(None, "--warmup", show_default="5 on GPU, 2 on CPU",
                                         help=limit_help("untimed optimizer steps first (at least 1)", "--warmup")),
    lr: Optional[float] = typer.Option(None, show_default=_d("lr"), help="learning rate"),
    device: Optional[str] = typer.Option(None, show_default=_d("device"), help="auto|cpu|cuda"),
    nnodes: Optional[int] = typer.Option(None, show_default=_d("nnodes"), help="hosts (torchrun --nnodes)"),
    node_rank: Optional[int] = typer.Option(None, show_default=_d("node_rank"), help="this host's rank (torchrun --node-rank); only node 0 stores"),
    rdzv_endpoint: Optional[str] = typer.Option(None, help="HOST:PORT of node 0 (torchrun --rdzv-endpoint)"),
    timeout: Optional[float] = typer.Option(None, show_default=_d("timeout"), help="seconds a cell (all its ranks) may take before it is `timeout`"),
    seed: Optional[int] = typer.Option(None, show_default=_d("seed"), help="seed of the random weights and tokens"),
    spec: Optional[str] = typer.Option(None, help="YAML/TOML/JSON sweep file; options given here override it"),
    db: str = typer.Option("transbench.db", help="SQLite store"),
    json_path: Optional[str] = typer.Option(None, "--json", help="also write the records as JSON"),
    csv_path: Optional[str] = typer.Option(None, "--csv", help="also write the records as CSV"),
    name: Optional[str] = typer.Option(None, help="run name; rerunning a name resumes it"),
    wide: bool = typer.Option(False, "--wide", help="print every column of the result tables"),
) -> None:
    """Measure training samples/s, tokens/s, TFLOPS per GPU, MFU, memory and scaling over a grid of choices."""
    given = {
        "models": model, "tasks": task, "precisions": dtype, "optims": optim, "attns": backend, "batches": batch,
        "seqs": seq, "grad_accums": grad_accum, "grad_ckpts": grad_ckpt, "compiles": compile, "kernels": kernels,
        "heads": head, "activation": activation, "pad_vocab": pad_vocab,
        "ladder": ladder or None, "max_batch_limit": max_batch_limit,
        "strategies": strategy, "nprocs": nproc, "zero_stages": zero_stage, "nccl_p2p": nccl_p2p,
        "nccl_envs": list(nccl_env) if nccl_env else None, "scaling": scaling, "steps": steps,
        "warmup_steps": warmup, "lr": lr, "device": device, "nnodes": nnodes, "node_rank": node_rank,
        "rdzv_endpoint": rdzv_endpoint, "timeout": timeout, "seed": seed, "name": name,
    }
    the_spec = build_spec(TrainSpec, spec, given, WHOLE_FIELDS)
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
        label = (f"{cell.model} {cell.task} {cell.attn} {cell.precision} {cell.optim} b{cell.batch} s{cell.seq} "
                 f"x{cell.grad_accum}{' ckpt' if cell.grad_ckpt else ''}{' compile' if cell.compile else ''} {cell.kernels}"
                 f"{' masked-head' if cell.head == 'masked' else ''} "
                 f"{cell.strategy}@{cell.world_size}")
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
        from ..scenarios.training.ladder import plot as ladder_plot

        console.print(training_table(recs, LADDER_COLUMNS, f"training ladder {visible(recs[0]['run_name'])} "
                                     f"({recs[0]['run_id']}): gain = this step / the step before (the best: / the first); "
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
