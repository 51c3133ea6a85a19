"""`transbench train --ladder`: the seed notebook's ladder for one model. Each step is one training cell,
built on the step before it; where a step says "largest batch", the batch comes from the same search
`run --max-batch` uses (runner/sweep.py search_max_batch), run through the same sweep loop, so a ladder
resumes by name like any run and stores every cell it measured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..cells import CellResult
from .training_cell import TrainCell


@dataclass(frozen=True)
class LadderStep:
    name: str
    change: dict = field(default_factory=dict)  # settings over the base cell (absolute, not cumulative)
    search: bool = False  # the batch is the largest that fits, found by the max-batch search


# Each step names every setting it differs from the base in, so the list reads as the notebook's table.
# Gradient accumulation is measured and then left out of the later steps: it only amortises the optimizer
# step over 4 micro-batches, and kept on it would make every later batch probe 4 times as long.
STEPS: tuple[LadderStep, ...] = (
    LadderStep("fp32, largest batch", {"precision": "fp32", "optim": "adamw"}, search=True),
    LadderStep("bf16", {"precision": "bf16", "optim": "adamw"}),
    LadderStep("bf16, largest batch", {"precision": "bf16", "optim": "adamw"}, search=True),
    LadderStep("fused AdamW", {"precision": "bf16", "optim": "adamw-fused"}),
    LadderStep("grad accumulation 4", {"precision": "bf16", "optim": "adamw-fused", "grad_accum": 4}),
    LadderStep("grad checkpointing, largest batch", {"precision": "bf16", "optim": "adamw-fused",
                                                     "grad_ckpt": True}, search=True),
    LadderStep("torch.compile", {"precision": "bf16", "optim": "adamw-fused", "grad_ckpt": True, "compile": True}),
    LadderStep("Liger kernels", {"precision": "bf16", "optim": "adamw-fused", "grad_ckpt": True, "compile": True,
                                 "kernels": "liger"}),
)
COLUMNS = ("samples_per_s", "tflops", "mfu", "peak_mem_mb")

# measure(cell, search) -> (the cell that was measured: its batch the largest that fits where search, result)
Measure = Callable[[TrainCell, bool], tuple[TrainCell, CellResult]]


def walk(base: TrainCell, measure: Measure, steps: tuple[LadderStep, ...] = STEPS) -> list[dict]:
    """Run the ladder: each step's cell at the batch the last search found (the base batch before any),
    one row per step with its cell's record and the gains over the step before it."""
    rows: list[dict] = []
    batch = base.batch
    for step in steps:
        cell, result = measure(replace(base, **step.change, batch=batch), step.search)
        if step.search and result.status == "ok":
            batch = cell.batch
        rows.append({"step": step.name, **cell.record_fields(), **result.record, "status": result.status,
                     "error": result.error})
    return add_gains(rows)


def add_gains(rows: list[dict]) -> list[dict]:
    """`gain_<column>` = this step's figure / the previous step's (None where either did not run): what
    the step bought (samples/s, TFLOPS, MFU) or cost (memory)."""
    for prev, row in zip([None, *rows], rows):
        for k in COLUMNS:
            a = prev and prev.get("status") == "ok" and prev.get(k)
            b = row.get("status") == "ok" and row.get(k)
            row[f"gain_{k}"] = b / a if a and b else None
    return rows


def _stored(store, run_id: str, key: str) -> dict | None:
    for c in store.cells(run_id):
        if c["key"] == key:
            return c
    return None


def sweep_measure(store, run_id: str, spec, on_cell, on_probe=lambda c, r: None) -> Measure:
    """A step measured on the one sweep loop: a plain step is a one-cell grid; a search step runs its
    cell at the batch so far (the search starts there), then the max-batch search, whose stored result is
    the step's cell at the largest batch that fits."""
    from ..runner.sweep import SweepOptions, max_batch_key, run_grid
    from .training import target

    def measure(cell: TrainCell, search: bool) -> tuple[TrainCell, CellResult]:
        opts = SweepOptions(timeout=spec.timeout, max_batch=search, max_batch_limit=spec.max_batch_limit)
        run_grid(store, run_id, [cell], target(spec), opts, on_cell, on_probe)
        got = _stored(store, run_id, max_batch_key(cell) if search else cell.key())
        if got is None:  # cannot happen after run_grid; kept so a store mismatch reads as an error row
            return cell, CellResult("error", error="the step's cell was not stored")
        if search:
            cell = TrainCell.from_dict(got["cell"])
        return cell, CellResult(got["status"], got["record"], error=got["record"].get("error"))

    return measure


def ladder(spec, db: str, *, json_path: str | None = None, csv_path: str | None = None,
           on_start=lambda cells, done: None, on_cell=lambda c, r: None) -> list[dict]:
    """The ladder of `spec` (its one model, task, seq, attention and start batch), stored as one training
    run; returns one row per step (the cells' records, `step` and the gains)."""
    from ..store import Store, export
    from ..errors import SpecError
    from . import training

    one = {"--model": spec.models, "--seq": spec.seqs, "--backend": spec.attns, "--task": spec.tasks or [None],
           "--batch": spec.batches}
    many = [k for k, v in one.items() if len(v) != 1]
    if many:
        raise SpecError(f"--ladder walks one model at one shape: give one value of {', '.join(many)}")
    if spec.nnodes > 1 or max(spec.nprocs) > 1:
        raise SpecError("--ladder runs on one GPU: leave out --nproc and --nnodes")
    model = spec.models[0]
    from ..models import build

    task = (spec.tasks or [training.default_task(build.resolve(model).shape)])[0]
    device = _device(spec)
    base = TrainCell(model=model, task=task, attn=spec.attns[0], precision="fp32", optim="adamw",
                     batch=spec.batches[0], seq=spec.seqs[0], device=device, steps=spec.steps,
                     warmup_steps=spec.warmup_steps, lr=spec.lr, seed=spec.seed)
    store = Store(db)
    try:
        run_id, name, done = training.open_training_run(store, spec)
        on_start([replace(base, **s.change) for s in STEPS], done)
        rows = walk(base, sweep_measure(store, run_id, spec, on_cell, on_probe=on_cell))  # probes shown too
        for r in rows:
            r.update(run_id=run_id, run_name=name)
    finally:
        store.close()
    export.write(rows, json_path, csv_path)
    return rows


def _device(spec) -> str:
    from ..measure import device as dev

    return dev.resolve(spec.device).type


def plot(rows: list[dict], path: str) -> str:
    """One panel per figure (samples/s, TFLOPS, MFU, peak memory), a bar per step, each bar labelled with
    its gain over the step before. Returns the file written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, len(COLUMNS), figsize=(4.2 * len(COLUMNS), 4.2))
    titles = {"samples_per_s": "samples/s", "tflops": "TFLOPS", "mfu": "MFU", "peak_mem_mb": "peak memory (MiB)"}
    for ax, key in zip(axes, COLUMNS):
        values = [(r.get(key) or 0) if r.get("status") == "ok" else 0 for r in rows]
        bars = ax.barh(range(len(rows)), values, color="#4c72b0")
        for bar, r in zip(bars, rows):
            g = r.get(f"gain_{key}")
            text = f"x{g:.2f}" if g else ("" if r.get("status") == "ok" else r.get("status", ""))
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {text}", va="center", fontsize=7)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(labels if key == COLUMNS[0] else [], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(titles[key], fontsize=9)
    first = rows[0] if rows else {}
    fig.suptitle(f"training ladder: {first.get('model')} {first.get('task')} seq {first.get('seq_len')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def summary(rows: list[dict]) -> str:
    """The ladder as compact text (the GPU scripts print it)."""
    head = f"{'step':36} {'batch':>6} {'status':>8} {'samples/s':>10} {'gain':>6} {'TFLOPS':>7} {'MFU':>6} {'peak MiB':>9}"
    lines = [head]
    for r in rows:
        ok = r.get("status") == "ok"
        g = r.get("gain_samples_per_s")

        def f(k, spec):
            return format(r[k], spec) if ok and r.get(k) is not None else "-"
        lines.append(f"{r['step']:36} {r.get('batch_size', '-')!s:>6} {r.get('status')!s:>8} "
                     f"{f('samples_per_s', '.1f'):>10} {(f'x{g:.2f}' if g else '-'):>6} {f('tflops', '.1f'):>7} "
                     f"{f('mfu', '.1%'):>6} {f('peak_mem_mb', '.0f'):>9}")
    return "\n".join(lines)

