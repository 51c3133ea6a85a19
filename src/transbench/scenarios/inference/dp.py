"""Rank side of data-parallel inference (`run --nproc N`): each rank runs its slice of the cell's batch
through the inference scenario's steps (same tokens, fp32 reference, correctness gate, backend), and every
timed iteration starts on all ranks at once (a barrier); an iteration lasts as long as its slowest rank.

Started by runner/launch.py as `python -m transbench.scenarios.inference.dp --cell CELL.json --out DIR`."""

from __future__ import annotations

import math
from dataclasses import replace

from ... import backends
from ...measure import device as dev
from ...measure import memory, timer
from ...measure.record import timing_record
from ...models import build, flops
from ...models import quant as quantization
from ...runner import rank as rank_mod
from ...cells import Cell, CellResult
from . import measure as inference


def shard(batch: int, world: int, rank: int) -> list[int]:
    """This rank's rows: contiguous, sizes differing by at most one."""
    base, extra = divmod(batch, world)
    start = rank * base + min(rank, extra)
    return list(range(start, start + base + (rank < extra)))


def _gather(obj) -> list:
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def agree(go_on: bool) -> bool:
    """The sampler's decisions made by all ranks together: any rank that wants another sample (its warm-up
    time is not up, its minimum not reached) keeps every rank going, so all take the same samples."""
    return any(_gather(bool(go_on)))


def barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def run(cell_dict: dict, info: rank_mod.RankInfo, device) -> CellResult | None:
    cell = Cell.from_dict(cell_dict)
    lead = info.rank == 0
    backend = backends.get(cell.backend)
    reason = inference.unsupported_reason(cell, backend, device)
    if reason:  # the same answer on every rank: all stop here, none waits in a collective
        return CellResult("unsupported", error=reason) if lead else None
    shape = build.resolve(cell.model).shape
    rows = shard(cell.batch, info.world_size, info.rank)
    inputs = inference.cell_inputs(cell, shape).rows(rows)  # the tokens a one-GPU run of this cell sees
    local = replace(cell, batch=len(rows), device=str(device))
    cache = inference.ModelCache()
    ref_rows, ref = inference.reference(cache, local, inputs, device)

    model = inference.model_for(cache, local, backend, device)
    quant_info = quantization.apply(model, cell.quant)
    inputs = inputs.to(device)
    if not cell.embeddings:
        inference.encoders_only(model, inputs, shape.family)
    prepared = backend.prepare(model, inputs, local)
    out = prepared.fn()
    dev.synchronize(device)
    err = inference.rel_err(inference.output_tensor(out, cell.task)[ref_rows], ref,
                            [inputs.lengths[i] for i in ref_rows], inputs.input_ids.shape[1])
    errs = _gather(err)
    worst = max(errs, key=lambda e: e if e == e else math.inf)  # NaN counts as the worst
    record = {"rel_err": worst, "world_size": info.world_size, "strategy": "data-parallel"}
    run_info = {"attn_implementation": model.config._attn_implementation, "device": str(device),
                "param_dtype": str(next(model.parameters()).dtype), "rel_err_per_rank": errs,
                "dist_backend": info.backend, "nccl_env": info.nccl_env(), **quant_info, **prepared.what_ran()}
    why = inference.wrong(cell, worst, None)  # task agreement is not measured across ranks: rel_err decides
    if why:
        if not lead:
            return None
        return CellResult("wrong", record=record, info=run_info, error=why)

    sampled = timer.sample(prepared.fn, device, timer.TimerConfig(cell.warmup, cell.min_time, cell.min_count),
                           sync=agree, before=barrier)
    per_rank = _gather({"samples": sampled.samples_ms, "mem": memory.snapshot(device), "lengths": inputs.lengths,
                        "device": str(device), "context": sampled.context})
    if not lead:
        return None
    # An iteration lasts as long as its slowest rank; energy is the sum over the ranks' boards.
    latency = [max(r["samples"][i] for r in per_rank) for i in range(len(sampled.samples_ms))]
    energies = [r["context"].energy_j for r in per_rank]
    context = per_rank[0]["context"]
    context.energy_j = sum(energies) if all(e is not None for e in energies) else None
    slowest = timer.Sampled(latency, timer.summarize(latency), sampled.calls, context, short=sampled.short)
    lengths = [n for r in per_rank for n in r["lengths"]]
    fl, flops_method = flops.forward_flops(shape, lengths, cell.task)
    gpu = dev.gpu_info(device)
    timing, warnings = timing_record(slowest, items=cell.batch, tokens=sum(lengths), flops=fl, gpu=gpu,
                                     dtype=inference.peak_dtype(cell, run_info), world=info.world_size)
    peak = [r["mem"]["peak_mem_mb"] for r in per_rank if r["mem"]["peak_mem_mb"] is not None]
    record.update(timing, tflops_per_gpu=timing["tflops"] / info.world_size,
                  peak_mem_mb=max(peak) if peak else None, gpu=gpu.name if gpu else None, flops_method=flops_method)
    run_info.update({"stats": slowest.stats.as_dict(), "flops_per_batch": fl,
                     "rows_per_rank": [len(r["lengths"]) for r in per_rank],
                     "per_rank": [{"device": r["device"], "mem": r["mem"], "context": r["context"].summary(),
                                   "median_ms": timer.summarize(r["samples"]).median_ms} for r in per_rank]})
    return CellResult("ok", record=record, samples_ms=latency, info=run_info, warnings=warnings)


if __name__ == "__main__":
    rank_mod.main(run)
