"""`transbench train`: training throughput, memory and scaling, one GPU or many (torchrun)."""

from __future__ import annotations

from typing import List, Optional

import typer
from rich.table import Table

from ..scenarios.training import TrainSpec, train as run_training
from ..spec import load_file
from .app import app, friendly
from .tables import console, fmt

LIST = "comma-separated; a sweep axis"


SPEED_COLUMNS = [("model", "model"), ("task", "task"), ("backend", "attn"), ("dtype", "precision"),
                 ("optim", "optim"), ("batch_size", "batch"), ("seq_len", "seq"), ("grad_accum", "accum"),
                 ("grad_ckpt", "ckpt"), ("compile", "compile"), ("kernels", "kernels"), ("strategy", "strategy"),
                 ("world_size", "GPUs"), ("zero_stage", "ZeRO"), ("nccl", "nccl"), ("status", "status"),
                 ("latency_ms", "step ms"), ("forward_ms", "fwd ms"), ("backward_ms", "bwd ms"),
                 ("optimizer_ms", "optim ms"), ("samples_per_s", "samples/s"),
                 ("tokens_per_s", "tokens/s"), ("tflops_per_gpu", "TFLOPS/GPU"), ("mfu", "MFU"),
                 ("scaling_efficiency", "scaling")]
MEMORY_COLUMNS = [("model", "model"), ("backend", "attn"), ("dtype", "precision"), ("optim", "optim"),
                  ("batch_size", "batch"), ("seq_len", "seq"), ("kernels", "kernels"), ("strategy", "strategy"),
                  ("zero_stage", "ZeRO"), ("world_size", "GPUs"), ("status", "status"), ("peak_mem_mb", "peak MiB"), ("peak_reserved_mb", "reserved MiB"),
                  ("params_mb", "params MiB"), ("grads_mb", "grads MiB"), ("optim_state_mb", "optim MiB"),
                  ("activations_mb", "activations MiB"), ("loss_start", "loss first"), ("loss_end", "loss last")]
LADDER_COLUMNS = [("step", "step"), ("batch_size", "batch"), ("status", "status"), ("samples_per_s", "samples/s"),
                  ("gain_samples_per_s", "gain"), ("tflops", "TFLOPS"), ("gain_tflops", "gain"), ("mfu", "MFU"),
                  ("gain_mfu", "gain"), ("peak_mem_mb", "peak MiB"), ("gain_peak_mem_mb", "gain"),
                  ("forward_ms", "fwd ms"), ("backward_ms", "bwd ms"), ("optimizer_ms", "optim ms")]
TEXT = ("step", "model", "task", "backend", "dtype", "optim", "kernels", "strategy", "status", "nccl")


def training_table(recs: list[dict], columns: list[tuple[str, str]], title: str = "") -> Table:
    """Only the columns some record fills, so a one-GPU sweep shows no NCCL or scaling column."""
    cols = [c for c in columns if c[0] == "status" or any(r.get(c[0]) not in (None, "") for r in recs)]
    t = Table(title=title)
    for key, label in cols:
        t.add_column(label, justify="left" if key in TEXT else "right")
    for r in recs:
        row = []
        for key, _ in cols:
            v = r.get(key)
            if key in ("mfu", "scaling_efficiency") and v is not None:
                row.append(f"{v:.1%}")
            elif key.startswith("gain_") and v is not None:
                row.append(f"x{v:.2f}")
            elif key == "status" and v != "ok":
                row.append(f"[bold red]{v}[/]")
            elif isinstance(v, bool):
                row.append("on" if v else "off")
            else:
                row.append(fmt(v, ".4g"))
        t.add_row(*row)
    return t


@app.command()
@friendly
def train(
    model: Optional[str] = typer.Option(None, "--model", "-m", help=f"preset or local checkpoint folder ({LIST})"),
    task: Optional[str] = typer.Option(None, help=f"mlm|causal-lm|classification ({LIST}); default: the model's LM task"),
    precision: Optional[str] = typer.Option(None, help=f"fp32|tf32|fp16|bf16 ({LIST}); fp16 = autocast + GradScaler, "
                                            "bf16 = autocast with fp32 master weights; default bf16 on GPU, fp32 on CPU"),
    optim: Optional[str] = typer.Option(None, help=f"adamw|adamw-foreach|adamw-fused|sgd|ds-fused-adam|apex-fused-adam ({LIST})"),
    attn: Optional[str] = typer.Option(None, help=f"eager|sdpa|sdpa-math|sdpa-efficient|sdpa-flash|sdpa-cudnn|flash-attn2 ({LIST})"),
    batch: Optional[str] = typer.Option(None, help=f"micro-batch per GPU ({LIST})"),
    seq: Optional[str] = typer.Option(None, help=f"sequence length ({LIST})"),
    grad_accum: Optional[str] = typer.Option(None, help=f"micro-batches per optimizer step ({LIST})"),
    grad_ckpt: Optional[str] = typer.Option(None, help=f"gradient checkpointing on|off ({LIST})"),
    compile: Optional[str] = typer.Option(None, "--compile", help=f"torch.compile on|off ({LIST})"),
    kernels: Optional[str] = typer.Option(None, help=f"torch|liger ({LIST}): liger = Liger-Kernel's LayerNorm and fused "
                                          "linear + cross-entropy head (CUDA; pip install 'transbench[liger]')"),
    ladder: bool = typer.Option(False, "--ladder", help="the seed notebook's ladder for one model: fp32, bf16, largest "
                                "batches, fused Adam, accumulation, checkpointing, compile, liger; a table and a plot"),
    plot: Optional[str] = typer.Option(None, help="where --ladder writes its plot (PNG); default ladder-MODEL.png"),
    max_batch_limit: Optional[int] = typer.Option(None, help="--ladder's largest-batch searches stop at this batch"),
    strategy: Optional[str] = typer.Option(None, help=f"none|ddp|fsdp|deepspeed ({LIST}); default none on one GPU, ddp on several"),
    nproc: Optional[str] = typer.Option(None, help=f"GPUs (processes) per node, through torchrun ({LIST})"),
    zero_stage: Optional[str] = typer.Option(None, help=f"DeepSpeed ZeRO stage 1|2|3 ({LIST})"),
    nccl_p2p: Optional[str] = typer.Option(None, help=f"on|off: NCCL_P2P_DISABLE=0|1 ({LIST})"),
    nccl_env: Optional[List[str]] = typer.Option(None, help="KEY=VAL[ KEY=VAL] for the ranks; repeat the option: "
                                                 "each one is a point of the axis"),
    scaling: Optional[bool] = typer.Option(None, "--scaling", help="also run each multi-GPU point on one GPU, for the scaling efficiency"),
    steps: Optional[int] = typer.Option(None, help="timed optimizer steps"),
    warmup_steps: Optional[int] = typer.Option(None, help="untimed steps first (at least 1)"),
    lr: Optional[float] = typer.Option(None, help="learning rate"),
    device: Optional[str] = typer.Option(None, help="auto|cpu|cuda"),
    nnodes: Optional[int] = typer.Option(None, help="hosts (torchrun --nnodes)"),
    node_rank: Optional[int] = typer.Option(None, help="this host's rank (torchrun --node-rank); only node 0 stores"),
    rdzv_endpoint: Optional[str] = typer.Option(None, help="HOST:PORT of node 0 (torchrun --rdzv-endpoint)"),
    timeout: Optional[float] = typer.Option(None, help="seconds a cell (all its ranks) may take before it is `timeout`"),
    seed: Optional[int] = typer.Option(None, help="seed of the random weights and tokens"),
    spec: Optional[str] = typer.Option(None, help="YAML/TOML sweep file; options given here override it"),
    db: str = typer.Option("transbench.db", help="SQLite store"),
    json_path: Optional[str] = typer.Option(None, "--json", help="also write the records as JSON"),
    csv_path: Optional[str] = typer.Option(None, "--csv", help="also write the records as CSV"),
    name: Optional[str] = typer.Option(None, help="run name; rerunning a name resumes it"),
) -> None:
    """Measure training samples/s, tokens/s, TFLOPS per GPU, MFU, memory and scaling over a grid of choices."""
    given = {
        "models": model, "tasks": task, "precisions": precision, "optims": optim, "attns": attn, "batches": batch,
        "seqs": seq, "grad_accums": grad_accum, "grad_ckpts": grad_ckpt, "compiles": compile, "kernels": kernels,
        "ladder": ladder or None, "max_batch_limit": max_batch_limit,
        "strategies": strategy, "nprocs": nproc, "zero_stages": zero_stage, "nccl_p2p": nccl_p2p,
        "nccl_envs": list(nccl_env) if nccl_env else None, "scaling": scaling, "steps": steps,
        "warmup_steps": warmup_steps, "lr": lr, "device": device, "nnodes": nnodes, "node_rank": node_rank,
        "rdzv_endpoint": rdzv_endpoint, "timeout": timeout, "seed": seed, "name": name,
    }
    base = load_file(spec) if spec else {}
    the_spec = TrainSpec.from_dict({**base, **{k: v for k, v in given.items() if v is not None}})

    def on_start(cells, done):
        console.print(f"{len(cells)} training {'step' if the_spec.ladder else 'cell'}(s)"
                      + (f", {done} already stored: resuming" if done else ""))

    def on_cell(cell, result):
        label = (f"{cell.model} {cell.task} {cell.attn} {cell.precision} {cell.optim} b{cell.batch} s{cell.seq} "
                 f"x{cell.grad_accum} {cell.kernels} {cell.strategy}@{cell.world_size}")
        if result is None:
            console.print(f"  {label}: already stored", highlight=False)
            return
        detail = (f"{result.record.get('samples_per_s', 0):.4g} samples/s" if result.status == "ok" and result.record
                  else (result.error or ""))
        console.print(f"  {label}: {result.status} {detail}"[:200], highlight=False)
        for w in result.warnings:
            console.print(f"    [yellow]warning:[/] {w}")

    recs = run_training(the_spec, db, json_path=json_path, csv_path=csv_path, on_start=on_start, on_cell=on_cell)
    if recs and the_spec.ladder:
        from ..scenarios.training_ladder import plot as ladder_plot

        console.print(training_table(recs, LADDER_COLUMNS, f"training ladder {recs[0]['run_name']} "
                                     f"({recs[0]['run_id']}): gain = this step / the step before"))
        path = ladder_plot(recs, plot or f"ladder-{recs[0]['model'].replace('/', '_')}.png")
        console.print(f"plot: {path}; stored in {db} as run [bold]{recs[0]['run_name']}[/]")
    elif recs:
        console.print(training_table(recs, SPEED_COLUMNS, f"training run {recs[0]['run_name']} ({recs[0]['run_id']})"))
        console.print(training_table(recs, MEMORY_COLUMNS, "memory per GPU (peak minus parameters, gradients "
                                                           "and optimizer state = activations and workspace)"))
        console.print(f"stored in {db} as run [bold]{recs[0]['run_name']}[/]")

