"""Rank side of data-parallel inference (`run --nproc N`): each rank runs its slice of the cell's batch
through the inference scenario's steps (same tokens, fp32 reference, correctness gate, backend), and every
timed iteration starts on all ranks at once (a barrier); an iteration lasts as long as its slowest rank.

Started by runner/launch.py as `python -m transbench.scenarios.inference_dp --cell CELL.json --out DIR`."""

from __future__ import annotations

import math
from dataclasses import replace

from .. import backends
from ..measure import device as dev
from ..measure import memory, peaks, timer
from ..models import build, flops
from ..runner import rank as rank_mod
from ..cells import Cell, CellResult
from . import inference


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


def synced_sample(fn, device, cfg: timer.TimerConfig) -> list[float]:
    """Like timer.sample, but every call starts after a barrier and all ranks take the same number of
    samples (fixed from the slowest rank's first call, so the adaptive stop cannot differ between ranks)."""
    import torch.distributed as dist

    clock = timer.Clock(device)
    for _ in range(cfg.warmup):
        dist.barrier()
        clock.time_ms(fn)
    dist.barrier()
    first = max(_gather(clock.time_ms(fn)))
    per_call = max(first, 1e-3)
    count = max(cfg.min_count, math.ceil(cfg.min_time_s * 1e3 / per_call))
    count = min(count, cfg.max_count, max(cfg.min_count, int(cfg.max_time_s * 1e3 / per_call)))
    samples = []
    for _ in range(count):
        dist.barrier()
        samples.append(clock.time_ms(fn))
    return samples


def run(cell_dict: dict, info: rank_mod.RankInfo, device) -> CellResult | None:
    cell = Cell.from_dict(cell_dict)
    lead = info.rank == 0
    backend = backends.get(cell.backend)
    reason = backend.unsupported_reason(device.type, cell.dtype, cell.task)
    if reason:  # the same answer on every rank: all stop here, none waits in a collective
        return CellResult("unsupported", error=reason) if lead else None
    shape = build.resolve(cell.model).shape
    rows = shard(cell.batch, info.world_size, info.rank)
    inputs = inference.cell_inputs(cell, shape).rows(rows)  # the tokens a one-GPU run of this cell sees
    local = replace(cell, batch=len(rows), device=str(device))
    cache = inference.ModelCache()
    ref_rows, ref = inference.reference(cache, local, inputs, device)

    model = inference.model_for(cache, local, backend, device)
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
                "dist_backend": info.backend, "nccl_env": info.nccl_env(), **prepared.what_ran()}
    tol = inference.TOLERANCE[cell.dtype]
    if not worst <= tol:
        if not lead:
            return None
        return CellResult("wrong", record=record, info=run_info,
                          error=f"rel_err {worst:.3g} over the {cell.dtype} tolerance {tol:g}")

    samples = synced_sample(prepared.fn, device, timer.TimerConfig(cell.warmup, cell.min_time, cell.min_count))
    per_rank = _gather({"samples": samples, "mem": memory.snapshot(device), "lengths": inputs.lengths,
                        "device": str(device)})
    if not lead:
        return None
    latency = [max(r["samples"][i] for r in per_rank) for i in range(len(samples))]
    stats = timer.summarize(latency)
    seconds = stats.median_ms / 1e3
    lengths = [n for r in per_rank for n in r["lengths"]]
    fl, flops_method = flops.forward_flops(shape, lengths, cell.task)
    gpu = dev.gpu_info(device)
    peak = [r["mem"]["peak_mem_mb"] for r in per_rank if r["mem"]["peak_mem_mb"] is not None]
    record.update({
        "latency_ms": stats.median_ms, "latency_p90_ms": stats.p90_ms, "latency_p99_ms": stats.p99_ms,
        "latency_iqr_ms": stats.iqr_ms, "n_samples": stats.n,
        "throughput_per_s": cell.batch / seconds, "tokens_per_s": sum(lengths) / seconds,
        "tflops": fl / seconds / 1e12, "flops_method": flops_method, "tflops_per_gpu": fl / seconds / 1e12 / info.world_size,
        "mfu": peaks.mfu(fl / seconds / info.world_size, gpu and gpu.name, cell.dtype, gpu and gpu.memory_gb),
        "peak_mem_mb": max(peak) if peak else None, "gpu": gpu.name if gpu else None,
    })
    run_info.update({"stats": stats.as_dict(), "flops_per_batch": fl, "rows_per_rank": [len(r["lengths"]) for r in per_rank],
                     "per_rank": [{"device": r["device"], "mem": r["mem"],
                                   "median_ms": timer.summarize(r["samples"]).median_ms} for r in per_rank]})
    warnings = [f"noisy: IQR/median {stats.iqr_ms / stats.median_ms:.1%} > 5%"] if stats.noisy else []
    return CellResult("ok", record=record, samples_ms=latency, info=run_info, warnings=warnings)


if __name__ == "__main__":
    rank_mod.main(run)
