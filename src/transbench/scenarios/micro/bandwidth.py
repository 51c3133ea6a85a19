"""`micro bandwidth`: GB/s of element-wise copy, scale and add (STREAM's kernels), and the TFLOPS they reach.

Bytes counted are those read plus those written (copy and scale: 2 n elements, add: 3 n); FLOPs are
one per output element for scale and add, none for copy. Inputs are random normal."""

from __future__ import annotations

from ...measure import device as dev
from .common import Context, Point, cycling, guarded, operand_sets, time_calls, timing_record
from .options import BandwidthOptions

SCALE = 1.5
TENSORS = {"copy": 2, "scale": 2, "add": 3}  # elements moved per element of the vector
FLOPS = {"copy": 0, "scale": 1, "add": 1}


def build_calls(op: str, n: int, dtype: str, device, sets: int, seed: int):
    """`sets` independent vectors per operand; (one callable per set, a correctness check of set 0)."""
    import torch

    t = dev.torch_dtype(dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(sets, n, device=device, dtype=t, generator=gen)
    if op == "copy":
        y = torch.empty_like(x)
        calls = [lambda j=j: y[j].copy_(x[j]) for j in range(sets)]
        return calls, lambda: bool(torch.equal(y[0], x[0]))
    if op == "scale":
        y = torch.empty_like(x)
        calls = [lambda j=j: torch.mul(x[j], SCALE, out=y[j]) for j in range(sets)]
        return calls, lambda: bool(torch.equal(y[0], x[0] * SCALE))
    y = torch.randn(sets, n, device=device, dtype=t, generator=gen)
    z = torch.empty_like(x)
    calls = [lambda j=j: torch.add(x[j], y[j], out=z[j]) for j in range(sets)]
    return calls, lambda: bool(torch.equal(z[0], x[0] + y[0]))


def point_key(op: str, n: int, dtype: str) -> dict:
    return {"op": op, "elements": n, "dtype": dtype}


def measure(op: str, n: int, opts: BandwidthOptions, ctx: Context) -> Point:
    import torch

    key = point_key(op, n, opts.dtype)
    esize = torch.empty((), dtype=dev.torch_dtype(opts.dtype)).element_size()
    nbytes = TENSORS[op] * n * esize
    flops = FLOPS[op] * n
    record = {**ctx.base_record(opts.dtype), "op": op, "elements": n, "bytes": nbytes, "flops": flops,
              "intensity": flops / nbytes}

    def run() -> Point:
        sets = operand_sets(nbytes, ctx.device)
        calls, check = build_calls(op, n, opts.dtype, ctx.device, sets, opts.seed)
        calls[0]()
        dev.synchronize(ctx.device)
        info = {"operand_sets": sets, "set_bytes": nbytes, "element_bytes": esize}
        if not check():
            return Point(key, "wrong", record, info=info, error=f"{op} result differs from the reference")
        per_call, reps = time_calls(cycling(calls), ctx)
        timing, stats, warnings = timing_record(per_call)
        per_call = per_call.samples_ms
        seconds = stats.median_ms / 1e3
        gbps = nbytes / seconds / 1e9
        peak = ctx.peak.bandwidth_gbs if ctx.peak else None
        rec = {**record, **timing, "gbps": gbps, "tflops": flops / seconds / 1e12, "peak_gbs": peak,
               "pct_of_peak": 100 * gbps / peak if peak else None}
        info.update(calls_per_sample=reps, stats=stats.as_dict())
        return Point(key, "ok", rec, per_call, info, warnings)

    return guarded(key, record, ctx, run)


def units(opts: BandwidthOptions) -> list[tuple[dict, list[dict]]]:
    return [({"op": op, "n": n}, [point_key(op, n, opts.dtype)]) for n in opts.sizes for op in opts.ops]


def measure_unit(unit: dict, opts: BandwidthOptions, ctx: Context) -> list[Point]:
    return [measure(unit["op"], unit["n"], opts, ctx)]
