"""`transbench tune`: the fused engine's kernel routes tuned ahead of time, into the on-disk table."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from ...errors import SpecError
from ...spec import check_once
from .spec import TuneSpec


def run(spec: TuneSpec, progress: Callable[[dict], None] | None = None, options=None) -> list[dict]:
    """Tune the fused engine's kernel routes for every batch x seq of `model` ahead of time, with no time budget,
    into the on-disk table (`cache_dir`/engine-tuning.json; default $TRANSBENCH_CACHE_DIR or
    ~/.cache/transbench). A process that finds the table starts warm: its first call at a tuned shape captures
    its graph without timing anything. GPT-2: also a generator's prefill at batch x seq and its decode step at
    that batch. Returns one row per shape: batch, seq, seconds, routes (ops of the forward tuned), races (the
    whole-forward trials that settled close choices, tuning.Tuner.refine: routes tried, times, whether it won).
    options: the engine's launch and tuning switches (transbench.engine.EngineOptions; None: the defaults); its tuner
    is cache_dir's table's where cache_dir is given."""
    from dataclasses import replace

    import torch

    from ...backends.decoders import greedy_step
    from ...backends.fused import check_cache_dir
    from ...engine import EngineOptions, EngineUnsupported, compile_model, tuning
    from ...measure import device as dev
    from ...models import build

    model, dtype, device, cache_dir = spec.model, spec.dtype, spec.device, spec.cache_dir
    if model is None:
        raise SpecError("--model is required: give a preset or a bert/gpt2 checkpoint folder")

    if dtype not in ("fp16", "bf16", "fp8"):
        raise SpecError(f"dtype {dtype} cannot be tuned: the fused engine tunes fp16, bf16 and fp8")
    if not isinstance(model, (str, os.PathLike)):
        raise SpecError(f"model must be a preset name or a checkpoint folder, got {model!r}")
    batches, seqs = spec.batches or [], spec.seqs or []
    ref = build.resolve(model)
    for v, what in [*((b, "batch") for b in batches), *((s, "seq") for s in seqs)]:
        if v < 1:
            raise SpecError(f"{what} must be at least 1, got {v}")
    if not batches or not seqs:
        raise SpecError("give at least one --batch and one --seq")
    for values, option in ((batches, "--batch"), (seqs, "--seq")):
        check_once(values, option)  # the shape was tuned again for nothing (minutes on a large one)
    if max(seqs) > ref.shape.max_positions:
        raise SpecError(f"seq {max(seqs)} exceeds {model}'s {ref.shape.max_positions} positions")
    from ...engine.compiled import BERT_LIKE

    if ref.family not in (*BERT_LIKE, "gpt2"):  # before the GPU is asked for: a CPU host is told this too
        raise SpecError(f"{model} is a {ref.family} model; the fused engine runs {', '.join(BERT_LIKE)} and gpt2 "
                        "models only, so there is nothing to tune for it")
    if cache_dir is not None and not str(cache_dir).strip():
        raise SpecError("--cache-dir is empty: give a folder, or leave it out for the default")
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):  # was pathlib's TypeError, unnamed
        raise SpecError(f"cache_dir must be a folder path (text), got {cache_dir!r}")
    if cache_dir is None:  # the default's folder may come from the environment: checked there, and named
        check_cache_dir()
    table = Path(cache_dir) / tuning.TABLE_NAME if cache_dir is not None else tuning.cache_path()
    problem = tuning.table_problem(table)
    if problem:  # else minutes of tuning would be kept nowhere (the engine's tables are caches: a save may fail)
        raise SpecError(f"cannot use the tuning table {table}: {problem}; give --cache-dir another folder "
                        "(or delete a damaged table)")
    if dev.gpu_count() == 0:  # before dev.resolve, whose advice for a missing GPU is --device cpu
        raise SpecError("tune needs a CUDA GPU: the table holds kernel timings of the GPU it ran on")
    target = dev.resolve(device)
    if target.type != "cuda":
        raise SpecError("tune needs a CUDA GPU: the table holds kernel timings of the GPU it ran on")
    if options is not None and not isinstance(options, EngineOptions):
        raise SpecError(f"options must be a transbench.engine.EngineOptions, got {options!r}")
    options = options or EngineOptions()
    if cache_dir is not None:
        options = replace(options, tuner=tuning.for_table(table))
    hf = build.build_model(ref, "base", device=str(target)).to(dev.torch_dtype(dtype))
    try:
        compiled = compile_model(hf, dtype=dev.torch_dtype(dtype), max_batch=max(batches), max_seq=max(seqs),
                                 fp8=dtype == "fp8", tune_budget_s=None, options=options)
    except EngineUnsupported as exc:  # a config the engine refuses (an activation, fp8 on this GPU): one line
        raise SpecError(f"{model} cannot be tuned: {exc.reason}") from None
    rows = []
    try:
        for b in batches:
            for s in seqs:
                ids = torch.randint(0, ref.shape.vocab, (b, s), device=target)
                start = time.perf_counter()
                compiled(input_ids=ids)
                if ref.family == "gpt2" and s < ref.shape.max_positions:  # generation: its one-token decode step too
                    gen = compiled.generator(b, s + 1)
                    greedy_step(gen, gen.prefill(ids).argmax(-1))  # the step a generation cell runs
                torch.cuda.synchronize(target)
                tuned = compiled.tuning().values()
                rows.append({"batch": b, "seq": s, "seconds": time.perf_counter() - start,
                             "routes": sum(len(t["routes"] or {}) for t in tuned),
                             "races": [r for t in tuned for r in t["races"]]})
                compiled.release()  # one shape's graph at a time: a large grid must not hold them all
                if progress:
                    progress(rows[-1])
    finally:
        compiled.release()
    return rows
