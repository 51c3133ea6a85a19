"""`transbench train --ladder`: the seed notebook's ladder for one model. Each step is one training cell,
built on the steps kept before it; where a step says "largest batch", the batch comes from the same search
`run --max-batch` uses (runner/sweep.py search_max_batch), run through the same sweep loop, so a ladder
resumes by name like any run and stores every cell it measured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ...cells import CellResult
from .cell import TrainCell


@dataclass(frozen=True)
class LadderStep:
    name: str
    change: dict = field(default_factory=dict)  # settings changed over the ladder's configuration so far
    search: bool = False  # the batch is the largest that fits, searched from the batch so far
    # Whether later steps build on this one: "always" (the notebook's fixed order: precision, batch),
    # "faster" (only where it beat the configuration so far in samples/s, so the last configuration is
    # the best combination the ladder found), "never" (measured and shown, then left out).
    keep: str = "always"
    tasks: tuple[str, ...] = ()  # the tasks it applies to (empty: all)
    families: tuple[str, ...] = ()  # the model families it applies to (empty: all)


# The seed notebook's table, then what the field adds for the rest of the MFU gap. Gradient accumulation
# is measured and never kept: it only amortises the optimizer step over 4 micro-batches, and kept on it
# would make every later probe 4 times as long. Checkpointing is kept only where its larger batch paid for
# its recomputed forward.
STEPS: tuple[LadderStep, ...] = (
    LadderStep("fp32, largest batch", {"dtype": "fp32", "optim": "adamw"}, search=True),
    LadderStep("bf16", {"dtype": "bf16"}),
    LadderStep("bf16, largest batch", search=True),
    LadderStep("fused AdamW", {"optim": "adamw-fused"}, keep="faster"),
    LadderStep("grad accumulation 4", {"grad_accum": 4}, keep="never"),
    LadderStep("grad checkpointing, largest batch", {"grad_ckpt": True}, search=True, keep="faster"),
    LadderStep("MLM head on masked positions", {"head": "masked"}, keep="faster", tasks=("mlm",)),
    # GPT-2's gelu_new is tanh-approximated GELU written as 8 element-wise ops (transformers
    # NewGELUActivation): in eager each is a kernel over the (tokens x 4h) activations, and autograd keeps
    # their intermediates. gelu_pytorch_tanh is the same function in one kernel (F.gelu(approximate="tanh")).
    LadderStep("GELU in one kernel (gelu-tanh)", {"activation": "gelu-tanh"}, keep="faster", families=("gpt2",)),
    # An odd vocabulary (GPT-2's 50,257 rows; BERT's 30,522 is even but not a multiple of 8) leaves the head's
    # GEMMs unaligned (scenarios/training/loop.py _pad_vocab says what that cost on an H100).
    LadderStep("vocabulary padded to a multiple of 64", {"pad_vocab": 64}, keep="faster"),
    # BERT's and GPT-2's configs train with dropout 0.1; nanoGPT and llm.c pretrain GPT-2 with none. Its masks are
    # memory-bound work in every layer, forward and backward; a step of its own, so the table shows what it cost.
    LadderStep("no dropout", {"dropout": 0.0}, keep="faster"),
    LadderStep("torch.compile", {"compile": True}, keep="faster"),
    LadderStep("Liger kernels", {"kernels": "liger"}, keep="faster"),
)
BEST = "best combination"
COLUMNS = ("samples_per_s", "tflops", "mfu", "peak_mem_mb")
# Each search probe is a process that builds the model and trains it: bisect only to 1/4 of the batch
# (a few percent of batch moves samples/s by less than the run-to-run noise once the GPU is full).
RESOLUTION = 4

# The spec's options each step of the ladder sets for itself (STEPS), and their command-line spellings.
SET_BY_LADDER = (("dtypes", "--dtype"), ("optims", "--optim"), ("grad_accums", "--grad-accum"),
                 ("grad_ckpts", "--grad-ckpt"), ("compiles", "--compile"), ("kernels", "--kernels"),
                 ("heads", "--head"), ("activation", "--activation"), ("dropout", "--dropout"),
                 ("pad_vocab", "--pad-vocab"),
                 ("strategies", "--strategy"), ("zero_stages", "--zero-stage"))

# measure(cell, search) -> (the cell that was measured: its batch the largest that fits where search, result)
Measure = Callable[[TrainCell, bool], tuple[TrainCell, CellResult]]


def steps_for(task: str, family: str = "", steps: tuple[LadderStep, ...] = STEPS) -> tuple[LadderStep, ...]:
    return tuple(s for s in steps if (not s.tasks or task in s.tasks) and (not s.families or family in s.families))


def _options(cell: TrainCell) -> str:
    """What the configuration turns on, for the best row's label."""
    on = [cell.dtype, f"batch {cell.batch}", cell.optim]
    on += [label for flag, label in ((cell.grad_ckpt, "grad ckpt"), (cell.head == "masked", "masked head"),
                                     (cell.activation is not None, cell.activation),
                                     (cell.dropout is not None, f"dropout {cell.dropout}"),
                                     (cell.pad_vocab > 1, f"vocabulary padded to {cell.pad_vocab}"),
                                     (cell.compile, "compile"), (cell.kernels != "torch", cell.kernels)) if flag]
    return ", ".join(on)


def walk(base: TrainCell, measure: Measure, steps: tuple[LadderStep, ...] = STEPS) -> list[dict]:
    """Run the ladder: each step's cell is the configuration so far with the step's change (at the batch
    the last kept search found, the base batch before any); one row per step with its cell's record and
    the gains over the configuration it changed, then the best combination (the configuration the kept steps built)
    with its gain over the first step."""
    rows: list[dict] = []
    bases: list[dict | None] = []  # each step's configuration so far: what its change is measured against
    config, config_row = base, None
    from ...models import build

    for step in steps_for(base.task, build.resolve(base.model).family, steps):
        bases.append(config_row)
        cell, result = measure(replace(config, **step.change), step.search)
        ok = result.status == "ok"
        row = {"step": step.name, **cell.record_fields(), **result.record, "status": result.status,
               "error": result.error}
        rows.append(row)
        speed = row.get("samples_per_s") if ok else None
        best_speed = config_row.get("samples_per_s") if config_row else None
        if step.keep == "always":
            config = cell if ok else replace(config, **step.change)
            config_row = row if ok else None
        elif step.keep == "faster" and speed and (not best_speed or speed > best_speed):
            config, config_row = cell, row
        row["kept"] = config_row is row
    add_gains(rows, bases)
    if config_row is not None:
        best = {**config_row, "step": BEST, "best_of": config_row["step"], "options": _options(config),
                "kept": True}
        first = rows[0] if rows else None
        for k in COLUMNS:
            a = first and first.get("status") == "ok" and first.get(k)
            best[f"gain_{k}"] = best[k] / a if a and best.get(k) else None
        rows.append(best)
    return rows


def add_gains(rows: list[dict], bases: list[dict | None] | None = None) -> list[dict]:
    """`gain_<column>` = this step's figure / its base's, the configuration the step changed (None where either did
    not run; `bases` default to the rows before): what the step bought (samples/s, TFLOPS, MFU) or cost (memory).
    Over the row before, a step after one left out compared two changes: on a CPU ladder torch.compile read x179.85
    against the `no dropout` step it was not built on, x1.11 against the configuration it changed."""
    for prev, row in zip([None, *rows] if bases is None else bases, rows):
        for k in COLUMNS:
            a = prev and prev.get("status") == "ok" and prev.get(k)
            b = row.get("status") == "ok" and row.get(k)
            row[f"gain_{k}"] = b / a if a and b else None
    return rows


def _stored(store, run_id: str, key: str) -> dict | None:
    for c in store.cells(run_id, TrainCell):
        if c["key"] == key:
            return c
    return None


def sweep_measure(store, run_id: str, spec, on_cell, on_probe=lambda c, r: None) -> Measure:
    """A step measured on the one sweep loop: a plain step is a one-cell grid; a search step runs its
    cell at the batch so far (the search starts there), then the max-batch search, whose stored result is
    the step's cell at the largest batch that fits."""
    from ...runner.sweep import SweepOptions, max_batch_key, run_grid
    from .spec import target

    def measure(cell: TrainCell, search: bool) -> tuple[TrainCell, CellResult]:
        opts = SweepOptions(timeout=spec.timeout, max_batch=search, max_batch_limit=spec.max_batch_limit,
                            max_batch_resolution=RESOLUTION, threads=spec.threads)
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
    from ...store import Store, export
    from ...errors import SpecError
    from . import spec as training

    one = {"--model": spec.models, "--seq": spec.seqs, "--backend": spec.backends, "--task": spec.tasks or [None],
           "--batch": spec.batches}
    many = [k for k, v in one.items() if len(v) != 1]
    if many:
        raise SpecError(f"--ladder walks one model at one shape: give one value of {', '.join(many)}")
    if spec.nnodes > 1 or max(spec.nprocs) > 1:
        raise SpecError("--ladder runs on one GPU: leave out --nproc and --nnodes")
    device = _device(spec)
    # The ladder sets these itself, step by step: a value given for one was dropped without a word (`--ladder
    # --optim sgd` trained AdamW and said ok). A stored ladder's spec holds the defaults, so it is not refused.
    untouched = training.device_defaults(training.TrainSpec(), device == "cuda")
    set_here = [option for axis, option in SET_BY_LADDER if getattr(spec, axis) != getattr(untouched, axis)]
    if set_here:
        raise SpecError(f"--ladder takes no {', '.join(set_here)}: each step sets what it changes, on one process; "
                        f"leave {set_here[0]} out, or train without --ladder")
    model = spec.models[0]
    from ...models import build

    task = (spec.tasks or [training.default_task(build.resolve(model).shape)])[0]
    base = TrainCell(model=model, task=task, backend=spec.backends[0], dtype="fp32", optim="adamw",
                     batch=spec.batches[0], seq=spec.seqs[0], device=device, steps=spec.steps,
                     warmup_steps=spec.warmup_steps, lr=spec.lr, seed=spec.seed)
    store = Store(db)
    try:
        run_id, name, done = training.open_training_run(store, spec)
        on_start([replace(base, **s.change) for s in steps_for(task, build.resolve(model).family)], done)
        rows = walk(base, sweep_measure(store, run_id, spec, on_cell, on_probe=on_cell))  # probes shown too
        for r in rows:
            r.update(run_id=run_id, run_name=name)
    finally:
        store.close()
    export.write(rows, json_path, csv_path, db=db)
    return rows


def _device(spec) -> str:
    from ...measure import device as dev

    return dev.resolve(spec.device).type


def plot(rows: list[dict], path: str) -> str:
    """One panel per figure (samples/s, TFLOPS, MFU, peak memory), a bar per step, each bar labelled with
    its gain over the configuration it changed. Returns the file written."""
    import matplotlib

    from ...store import export

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
    export.save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


def summary(rows: list[dict]) -> str:
    """The ladder as compact text (the GPU scripts print it); `*` marks the steps later steps build on."""
    head = (f"{'step':36} {'batch':>6} {'status':>8} {'samples/s':>10} {'gain':>6} {'TFLOPS':>7} {'MFU':>6} "
            f"{'HFU':>6} {'peak MiB':>9} {'fwd ms':>7} {'bwd ms':>7} {'opt ms':>7}")
    lines = [head]
    for r in rows:
        ok = r.get("status") == "ok"
        g = r.get("gain_samples_per_s")

        def f(k, spec):
            return format(r[k], spec) if ok and r.get(k) is not None else "-"
        name = ("* " if r.get("kept") and r["step"] != BEST else "  ") + r["step"]
        lines.append(f"{name:36} {r.get('batch_size', '-')!s:>6} {r.get('status')!s:>8} "
                     f"{f('samples_per_s', '.1f'):>10} {(f'x{g:.2f}' if g else '-'):>6} {f('tflops', '.1f'):>7} "
                     f"{f('mfu', '.1%'):>6} {f('hfu', '.1%'):>6} {f('peak_mem_mb', '.0f'):>9} "
                     f"{f('forward_ms', '.1f'):>7} {f('backward_ms', '.1f'):>7} {f('optimizer_ms', '.1f'):>7}")
        if r["step"] == BEST:
            lines.append(f"  = {r.get('best_of')}: {r.get('options')} (gain over the first step)")
    return "\n".join(lines)
