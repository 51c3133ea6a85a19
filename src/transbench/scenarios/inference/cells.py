"""From a validated spec to the ordered list of cells, and deterministic shards of it."""

from __future__ import annotations

import itertools

from ... import backends
from ...errors import SpecError
from ...measure import device as dev
from ...measure.load import check_cpu_ranks, check_threads
from ...models import build
from ...models import quant as quantization
from ...models.build import ACTIVATIONS
from .spec import RunSpec, device_defaults
from ...runner import shard as sharding
from ...spec import check_once, checked
from ...store.db import check_name_text
from ...cells import Cell


MAX_REPEAT = 100  # each repeat is a process that builds the model again


def validate(spec: RunSpec) -> RunSpec:
    """Check every option; return the spec with device-sized defaults filled in."""
    spec = checked(RunSpec, spec)  # api.run(RunSpec(...)): each field's type, as a spec file's
    device = dev.resolve(spec.device)
    spec = device_defaults(spec, device.type)
    for axis, option in (("models", "--model"), ("tasks", "--task"), ("backends", "--backend"),
                         ("dtypes", "--dtype"), ("quants", "--quant"), ("batches", "--batch"), ("seqs", "--seq")):
        if not getattr(spec, axis):
            raise SpecError(f"{option} is empty: give at least one value (an empty axis measures nothing)")
        check_once(getattr(spec, axis), option)
    refs = [build.resolve(m) for m in spec.models]
    for name in spec.backends:
        backends.get(name)
    for d in spec.dtypes:
        dev.torch_dtype(d)
        dev.check_dtype_runs(str(device), d)
    check_quants(spec, device)
    for v, what in [*((b, "batch") for b in spec.batches), *((s, "seq") for s in spec.seqs)]:
        if v < 1:
            raise SpecError(f"{what} must be at least 1, got {v}")
    if spec.activation is not None and spec.activation not in ACTIVATIONS:
        raise SpecError(f"unknown activation '{spec.activation}': choose from {', '.join(ACTIVATIONS)}")
    if spec.baseline is not None and spec.baseline not in spec.backends:
        raise SpecError(f"--baseline {spec.baseline} is not among the backends being run ({', '.join(spec.backends)})")
    if spec.seq_stdev < 0:
        raise SpecError("--seq-stdev must be 0 or more")
    if spec.new_tokens < 1:
        raise SpecError("--new-tokens must be at least 1")
    if spec.seq_stdev > 0 and set(spec.tasks) == {"generate"}:  # else every cell `unsupported`, and exit 0
        raise SpecError(f"--seq-stdev {spec.seq_stdev:g}: generation runs equal-length prompts (--seq); leave "
                        "--seq-stdev out with --task generate")
    from ...backends.compile import check_mode

    check_mode(spec.compile_mode)  # also without the compile backend: a misspelt mode is a mistake either way
    if spec.timeout <= 0:
        raise SpecError("--timeout must be positive")
    if spec.min_time < 0 or spec.warmup < 0:
        raise SpecError("--min-time and --warmup must be 0 or more")
    if spec.min_count < 1:
        raise SpecError("--min-count must be at least 1")
    if spec.nproc < 1:
        raise SpecError("--nproc must be at least 1")
    check_threads(spec.threads)
    if not 1 <= spec.repeat <= MAX_REPEAT:
        raise SpecError(f"--repeat must be between 1 and {MAX_REPEAT}, got {spec.repeat}")
    if spec.max_batch_limit < 1:  # the search's cap: 0 or below probed nothing and stored a misleading answer
        raise SpecError(f"max_batch_limit must be at least 1, got {spec.max_batch_limit}")
    if spec.max_batch and max(spec.batches) > spec.max_batch_limit:  # the search starts at the largest batch
        raise SpecError(f"--batch {max(spec.batches)} is above max_batch_limit {spec.max_batch_limit}, the cap of the "
                        "--max-batch search: lower --batch or raise max_batch_limit")
    if spec.gpus is not None:
        # Lanes run one worker per listed GPU; without the GPUs they would be parallel CPU workers that
        # share the cores, and every figure would come out slower while still `ok`.
        count = dev.gpu_count()
        if count == 0:
            raise SpecError("--gpus needs CUDA GPUs and none is visible: leave --gpus out to run on this machine")
        wrong = [g for g in spec.gpus if not 0 <= g < count]
        if wrong:
            raise SpecError(f"--gpus {','.join(map(str, spec.gpus))}: there is no GPU {wrong[0]} "
                            f"({count} visible: 0..{count - 1})")
        if len(set(spec.gpus)) != len(spec.gpus):
            raise SpecError(f"--gpus {','.join(map(str, spec.gpus))} lists a GPU twice: each GPU runs one worker")
        if device.type != "cuda":
            raise SpecError("--gpus runs cells on GPUs: leave out --device cpu, or --gpus")
    for task in spec.tasks:
        # A task no model has a head for is bad input; one that only some models lack makes their cells
        # `unsupported` (the scenario says why), so a grid of several families still runs.
        reasons = [build.missing_head(ref, task) for ref in refs]
        if all(reasons):
            raise SpecError(reasons[0])
    check_lengths(spec, refs)
    spec = sharding.resolved(spec)  # `auto` becomes this task's I/N, stored with the run
    check_name_text(spec.name)  # before the store is opened (created, when new) for a name it cannot hold
    return spec


def check_lengths(spec: RunSpec, refs: list) -> None:
    """A cell longer than its model's positions is `unsupported` where it runs (measure.py unsupported_reason), with
    the reason, so the cells of a grid that fit still run: `--model gpt2-tiny,llama-3.2-1b --seq 8,200` was refused
    whole for gpt2-tiny's 128 positions. A seq that fits none of the grid's models (with a head for their task)
    would measure nothing, as a seq typed past the one model's positions: bad input, with what would fit."""
    runnable = [(ref, task) for ref in refs for task in spec.tasks if not build.missing_head(ref, task)]
    tokens = {task: spec.new_tokens if task == "generate" else 0 for task in spec.tasks}
    # Generation feeds the prompt and every new token but the last (Cell.positions): seq + new tokens - 1.
    room = {(ref.name, task): ref.shape.max_positions - max(tokens[task] - 1, 0) for ref, task in runnable}
    for s in sorted(set(spec.seqs)):
        if not runnable or any(build.too_long(ref, s, tokens[task]) is None for ref, task in runnable):
            continue
        ref, task = max(runnable, key=lambda rt: room[rt[0].name, rt[1]])  # the advice that fits the most
        top, most = ref.shape.max_positions, room[ref.name, task]
        # fewer new tokens after the longest prompt fit too: `--seq 32 --new-tokens 128` was told only `use --seq 1 or
        # less`
        tokens_fit = top - max(spec.seqs) + 1
        fewer = f", or --new-tokens {tokens_fit} or less" if tokens[task] > 1 and tokens_fit >= 1 else ""
        fix = (f"use --seq {most} or less{fewer}" if most >= 1 else  # `--seq -72 or less` was the advice
               f"use --new-tokens {top - s + 1} or less" if s <= top
               else f"give --seq and --new-tokens that add up to {top + 1} or less")
        raise SpecError(f"{build.too_long(ref, s, tokens[task])}: {fix}")


def check_quants(spec: RunSpec, device) -> None:
    """--quant: each name known, its library installed, the device able to run it (as --dtype is checked); and a grid
    whose every quantized cell would be `unsupported` (backends that quantize on their own, or not at all; dtype
    fp8 alone) is refused rather than run to exit 0 with nothing measured."""
    asked = [q for q in spec.quants if q != "none"]
    if not asked:
        return
    capability = dev.nvml_capability(device.index or 0) if device.type == "cuda" else None
    quantization.check(spec.quants, device.type, capability)
    takers = [b for b in spec.backends if backends.get(b).quant_refusal is None]
    if not takers:
        # each backend's own reason: `--backend fused,onnxruntime` named the engine's alone
        reasons = "; ".join(dict.fromkeys(backends.get(b).quant_refusal for b in spec.backends))
        raise SpecError(f"--quant {','.join(asked)}: {reasons}; add a backend that takes it (eager, sdpa, compile, "
                        "...) or leave --quant out")
    if not any(quantization.unsupported_reason(q, d, device.type, capability) is None for q in asked
               for d in spec.dtypes):
        raise SpecError(quantization.unsupported_reason(asked[0], spec.dtypes[0], device.type, capability))
    if set(spec.tasks) == {"generate"}:
        raise SpecError(f"--quant {','.join(asked)} measures the inference tasks; generation runs unquantized: "
                        "leave --quant out with --task generate")


def check_data_parallel(spec: RunSpec) -> None:
    """`run --nproc N` splits each batch over N GPUs of this node."""
    device = dev.resolve(spec.device)
    if device.type == "cuda":
        import torch

        if spec.nproc > torch.cuda.device_count():
            raise SpecError(f"--nproc {spec.nproc} needs {spec.nproc} GPUs; {torch.cuda.device_count()} visible")
    else:
        check_cpu_ranks(spec.nproc)
    small = [b for b in spec.batches if b < spec.nproc]
    if small:
        raise SpecError(f"batch {small[0]} cannot be split over --nproc {spec.nproc}: use batches of {spec.nproc} or more")
    if spec.gpus or spec.max_batch:
        raise SpecError("--nproc runs each cell on all its GPUs: leave out --gpus and --max-batch")


def expand(spec: RunSpec) -> list[Cell]:
    """Cells ordered so that a worker reuses its model and batches grow within each OOM group."""
    device = str(dev.resolve(spec.device))
    cells = []
    for model, task, dtype, backend, quant, seq, batch in itertools.product(
        spec.models, spec.tasks, spec.dtypes, spec.backends, spec.quants, sorted(spec.seqs), sorted(spec.batches)
    ):
        cells.append(Cell(
            model=model, task=task, backend=backend, dtype=dtype, quant=quant, batch=batch, seq=seq, device=device,
            seq_stdev=spec.seq_stdev, activation=spec.activation, embeddings=spec.embeddings,
            new_tokens=spec.new_tokens, compile_mode=spec.compile_mode, seed=spec.seed, warmup=spec.warmup,
            min_time=spec.min_time, min_count=spec.min_count, nproc=spec.nproc,
        ))
    return sharding.select(cells, sharding.resolve(spec.shard, spec.shard_count))
