"""`micro collectives`: all-reduce, all-gather and reduce-scatter over `nproc` processes (torchrun; NCCL between
GPUs, gloo on the CPU), per message size, with nccl-tests' figures: the time of one call, algorithm bandwidth
(algbw = bytes / time) and bus bandwidth (busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather and
reduce-scatter: the rate each link ran at, comparable with the link's own, whatever n is). As in nccl-tests, the bytes
are the all-reduced buffer, the gathered output and the scattered input.

The sweep side (`units`, `measure_unit`) launches one torchrun per op, which measures all its sizes in one process
group; the rank side (`run`, this module's __main__) is started by runner/launch.py. Each size is checked first (the
sum or the gathered chunks are exact for every dtype at these small integers), then timed: `reps` back-to-back calls
between one pair of CUDA events (perf_counter on the CPU) per sample, after a barrier, each sample taking the slowest
rank's time, through the one sampler with every decision taken by all ranks together."""

from __future__ import annotations

import math

from ...cells import CellResult
from ...measure import device as dev
from ...measure import timer
from ...measure.record import timing_record
from ...runner import rank as rank_mod
from .common import MAX_CALLS_PER_SAMPLE, SAMPLE_TARGET_MS, Context, Point
from .options import CollectivesOptions, buffer_elements

# busbw / algbw (nccl-tests, doc/PERFORMANCE.md): what each rank sends and receives over its links per byte of the op
BUS_FACTOR = {"all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n,
              "reduce-scatter": lambda n: (n - 1) / n}
MODULE = "transbench.scenarios.micro.collectives"


def point_key(op: str, nbytes: int, dtype: str, nproc: int) -> dict:
    return {"op": op, "bytes": nbytes, "dtype": dtype, "nproc": nproc}


def units(opts: CollectivesOptions) -> list[tuple[dict, list[dict]]]:
    """One unit per op: one torchrun measures every size of it."""
    return [({"op": op}, [point_key(op, s, opts.dtype, opts.nproc) for s in opts.sizes]) for op in opts.ops]


def measure_unit(unit: dict, opts: CollectivesOptions, ctx: Context) -> list[Point]:
    from ...runner import launch

    payload = {"device": ctx.device.type, "op": unit["op"], "sizes": opts.sizes, "dtype": opts.dtype,
               "min_time": opts.min_time, "warmup": opts.warmup}
    cfg = launch.LaunchConfig(nproc=opts.nproc, torchrun=True, timeout=opts.timeout)
    result = launch.outcome(launch.launch(MODULE, payload, cfg), cfg)
    keys = [point_key(unit["op"], s, opts.dtype, opts.nproc) for s in opts.sizes]
    base = {**ctx.base_record(opts.dtype), "op": unit["op"], "world_size": opts.nproc}
    if result.status != "ok":  # the launch failed as a whole: every size says why
        return [Point(k, result.status, {**base, "bytes": k["bytes"]}, info=result.info, error=result.error)
                for k in keys]
    got = {p["bytes"]: p for p in result.info["points"]}
    out = []
    for k in keys:
        p = got[k["bytes"]]
        out.append(Point(k, p["status"], {**base, **p["record"]}, p.get("samples_ms", []),
                         {**p.get("info", {}), "dist_backend": result.info.get("dist_backend"),
                          "nccl_env": result.info.get("nccl_env"), "wall_s": result.info.get("wall_s")},
                         p.get("warnings", []), p.get("error")))
    return out


# ---- the rank side -------------------------------------------------------------------------------------------------

def _buffers(op: str, count: int, n: int, rank: int, dtype, device):
    """(the call, its check): inputs filled with rank + 1 (sums and chunks exact in every dtype here)."""
    import torch
    import torch.distributed as dist

    if op == "all-reduce":
        buf = torch.full((count,), rank + 1, dtype=dtype, device=device)

        def check():
            return bool((buf == n * (n + 1) / 2).all())

        def reset():
            # NCCL's and gloo's work does not depend on the values; zeros keep the repeated in-place sums finite
            buf.zero_()

        return (lambda: dist.all_reduce(buf)), check, reset
    part = count // n
    if op == "all-gather":
        inp = torch.full((part,), rank + 1, dtype=dtype, device=device)
        out = torch.empty(count, dtype=dtype, device=device)
        expected = torch.arange(1, n + 1, dtype=dtype, device=device).repeat_interleave(part)
        return (lambda: dist.all_gather_into_tensor(out, inp)), (lambda: bool(torch.equal(out, expected))), (
            lambda: None)
    inp = torch.full((count,), rank + 1, dtype=dtype, device=device)
    out = torch.empty(part, dtype=dtype, device=device)
    return (lambda: dist.reduce_scatter_tensor(out, inp)), (lambda: bool((out == n * (n + 1) / 2).all())), (
        lambda: None)


class _Ranks:
    """The collectives that keep the ranks in step: each decision and each failure taken by all of them."""

    def __init__(self, device):
        import torch

        self.device = device
        self.flag = torch.zeros(1, dtype=torch.float64, device=device)

    def max(self, value: float) -> float:
        import torch.distributed as dist

        self.flag.fill_(value)
        dist.all_reduce(self.flag, op=dist.ReduceOp.MAX)
        return float(self.flag.item())

    def any(self, go_on: bool) -> bool:
        return self.max(1.0 if go_on else 0.0) > 0


def _time_size(op: str, nbytes: int, dtype_name: str, payload: dict, info: rank_mod.RankInfo, device, ranks: _Ranks):
    """This rank's result for one size: (status, record, per-call samples, info, warnings, error)."""
    import torch
    import torch.distributed as dist

    n = info.world_size
    dtype = dev.torch_dtype(dtype_name)
    esize = torch.empty((), dtype=dtype).element_size()
    count = buffer_elements(op, nbytes, esize, n)
    record = {"bytes": count * esize, "elements": count, "element_bytes": esize}
    failed = None
    try:
        call, check, reset = _buffers(op, count, n, info.rank, dtype, device)
    except Exception as exc:  # noqa: BLE001 - an out-of-memory on any rank makes the size an `oom` row on all
        failed = exc
    if ranks.any(failed is not None):
        oom = failed is not None and dev.is_oom(failed)
        dev.free_memory(device)
        status = "oom" if ranks.any(oom) else "error"
        return status, record, [], {}, [], (f"{type(failed).__name__}: {str(failed).splitlines()[0][:300]}"
                                            if failed else "another rank failed to allocate this size")
    call()
    dev.synchronize(device)
    if ranks.any(not check()):
        return "wrong", record, [], {}, [], f"{op} result differs from the exact sum or chunks"
    reset()
    clock = timer.Clock(device)
    for _ in range(2):
        call()
    dev.synchronize(device)
    one = []
    for _ in range(3):
        dist.barrier()
        one.append(clock.time_ms(call))
    one_ms = ranks.max(min(one))  # every rank takes the same reps from the slowest rank's call
    reps = max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(SAMPLE_TARGET_MS / max(one_ms, 1e-4))))

    def loop():
        for _ in range(reps):
            call()

    cfg = timer.TimerConfig(warmup=max(1, payload["warmup"]), min_time_s=payload["min_time"], min_count=10,
                            max_count=10_000, max_time_s=20.0)
    sampled = timer.sample(loop, device, cfg, sync=ranks.any, before=dist.barrier).per_call(reps)
    return "ok", record, sampled, {"calls_per_sample": reps}, [], None


def run(payload: dict, info: rank_mod.RankInfo, device) -> CellResult | None:
    """Every size of one op on this rank; rank 0 returns them all in info["points"] (the slowest rank per sample)."""
    import torch.distributed as dist

    op, n = payload["op"], info.world_size
    ranks = _Ranks(device)
    gpu = dev.gpu_info(device)
    points = []
    for nbytes in payload["sizes"]:
        status, record, sampled, pinfo, warnings, error = _time_size(op, nbytes, payload["dtype"], payload, info,
                                                                     device, ranks)
        mine = sampled.samples_ms if status == "ok" else []
        every = [None] * n
        dist.all_gather_object(every, mine)
        point = {"bytes": nbytes, "status": status, "record": record, "info": pinfo, "warnings": warnings,
                 "error": error}
        if status == "ok":
            per_call = [max(r[i] for r in every) for i in range(min(len(r) for r in every))]
            slowest = timer.Sampled(per_call, timer.summarize(per_call), sampled.calls, sampled.context, {},
                                    sampled.short)
            timing, warn = timing_record(slowest)
            seconds = slowest.stats.median_ms / 1e3
            algbw = record["bytes"] / seconds / 1e9
            point["record"] = {**record, **timing, "algbw_gbs": algbw, "busbw_gbs": algbw * BUS_FACTOR[op](n),
                               "bus_factor": BUS_FACTOR[op](n), "gpu": gpu.name if gpu else None}
            point["samples_ms"] = per_call
            point["warnings"] = warn
            point["info"] = {**pinfo, "stats": slowest.stats.as_dict(),
                             "per_rank_median_ms": [timer.summarize(r).median_ms for r in every if r]}
        points.append(point)
        dev.free_memory(device)
    if info.rank != 0:
        return None
    return CellResult("ok", info={"points": points, "dist_backend": info.backend, "nccl_env": info.nccl_env()})


if __name__ == "__main__":
    rank_mod.main(run)
