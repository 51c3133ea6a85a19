"""`micro gemm`: TFLOPS of C[m,n] = A[m,k] @ B[k,n] over square and transformer-shaped products.

Operands are random normal (never zeros: some GPUs run measurably faster on zeros). fp8 is e4m3 with
one scale per tensor through torch._scaled_mm, bf16 output, exact accumulation (no fast-accum mode).
Each point checks a corner of its output against a float64 product of the same operands, so the
record's rel_err also shows whether tf32 really ran (about 1e-4 instead of fp32's 1e-7)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...measure import device as dev
from ...models import build
from ...models.flops import GATED_MLP
from ..inference.measure import TOLERANCE
from .common import Context, Point, cycling, guarded, operand_sets, rel_err, time_calls, timing_record
from .options import GemmOptions

FP8_MAX = 448.0  # largest finite e4m3 value
FP8_MIN_CAPABILITY = (8, 9)
CHECK_ROWS, CHECK_COLS = 4, 64


@dataclass(frozen=True)
class GemmShape:
    shape: str  # "square", or the layer GEMM: qkv, attn-out, ffn-up, ffn-down
    m: int
    n: int
    k: int
    model: str | None = None

    @property
    def label(self) -> str:
        if self.shape == "square":
            return f"n={self.m}"
        return f"{self.model} {self.shape} {self.m}x{self.n}x{self.k}"


def shapes(opts: GemmOptions) -> list[GemmShape]:
    out = [GemmShape("square", n, n, n) for n in opts.sizes]
    for name in opts.models:
        s = build.resolve(name).shape
        t, h, i = opts.tokens, s.hidden, s.intermediate
        # The model's own widths (models/flops.py counts the same): grouped-query attention projects kv_heads keys
        # and values, and a gated MLP's up projection is gate and up together; 3h and i labelled llama-tiny's qkv
        # 16x144x48 where its layer computes 16x96x48, and its ffn-up at half its width.
        q, kv = s.heads * s.dim, s.kv * s.dim
        up = 2 * i if s.family in GATED_MLP else i
        out += [GemmShape("qkv", t, q + 2 * kv, h, name), GemmShape("attn-out", t, h, q, name),
                GemmShape("ffn-up", t, up, h, name), GemmShape("ffn-down", t, h, i, name)]
    return out


def element_bytes(dtype: str) -> tuple[int, int]:
    """Bytes per input element and per output element."""
    return {"fp32": (4, 4), "tf32": (4, 4), "fp16": (2, 2), "bf16": (2, 2), "fp8": (1, 2)}[dtype]


def gemm_bytes(g: GemmShape, dtype: str) -> int:
    """Each operand read once, the output written once."""
    ein, eout = element_bytes(dtype)
    return (g.m * g.k + g.k * g.n) * ein + g.m * g.n * eout


def fp8_unsupported(device) -> str | None:
    import torch

    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no float8_e4m3fn / _scaled_mm: upgrade torch"
    cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if cap is not None and tuple(cap) < FP8_MIN_CAPABILITY:
        return f"fp8 tensor cores need compute capability 8.9 or newer; this GPU is {cap[0]}.{cap[1]}"
    return None


def build_calls(g: GemmShape, dtype: str, device, sets: int, seed: int):
    """`sets` independent operand sets; returns (one callable per set, a check of set 0 -> rel_err, info)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    if dtype == "fp8":
        e4m3 = torch.float8_e4m3fn

        def quantized(rows, cols):
            x = torch.randn(sets, rows, cols, device=device, generator=gen)
            scale = (x.abs().amax() / FP8_MAX).float()
            q = (x / scale).to(e4m3)
            del x
            return q, scale

        a, sa = quantized(g.m, g.k)
        b, sb = quantized(g.n, g.k)  # stored n x k: _scaled_mm wants its second operand column-major
        c = torch.empty(sets, g.m, g.n, device=device, dtype=torch.bfloat16)
        # Each set's views taken once: indexing in the call (two views a call) made a small GEMM's loop host-bound
        calls = [lambda x=a[j], y=b[j].t(), z=c[j]: torch._scaled_mm(x, y, sa, sb, out_dtype=torch.bfloat16, out=z)
                 for j in range(sets)]

        def check():
            a64 = a[0, :CHECK_ROWS].float().double() * float(sa)
            b64 = b[0, :CHECK_COLS].float().double() * float(sb)
            ref = a64 @ b64.t()
            return c[0, :CHECK_ROWS, :CHECK_COLS], ref

        info = {"out_dtype": "bfloat16", "scale_a": float(sa), "scale_b": float(sb), "use_fast_accum": False}
    else:
        t = dev.torch_dtype(dtype)
        a = torch.randn(sets, g.m, g.k, device=device, dtype=t, generator=gen)
        b = torch.randn(sets, g.k, g.n, device=device, dtype=t, generator=gen)
        # A plain `a @ b` with a fresh output (the caching allocator hands back the same block), as users
        # and the plain loop of benchmarks/gemm_vs_plain.py call it: `out=` can pick another cuBLAS path.
        # Each set's views taken once: indexing them in the call (two views a call) made the loop host-bound where
        # the GEMM is short (an H200 at n = 1000: 118.5 TFLOPS against 160.5 for a loop over the same sets).
        last = {}
        calls = [lambda x=a[j], y=b[j]: last.__setitem__("c", torch.matmul(x, y)) for j in range(sets)]

        def check():
            return last["c"][:CHECK_ROWS, :CHECK_COLS], a[0, :CHECK_ROWS].double() @ b[0, :, :CHECK_COLS].double()

        info = {"out_dtype": str(t).replace("torch.", "")}
    if device.type == "cuda":
        info["allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        info["fp16_reduced_precision_reduction"] = torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
    return calls, check, info


def point_key(g: GemmShape, dtype: str) -> dict:
    return {"shape": g.shape, "model": g.model, "m": g.m, "n": g.n, "k": g.k, "dtype": dtype}


def measure(g: GemmShape, dtype: str, opts: GemmOptions, ctx: Context) -> Point:
    key = point_key(g, dtype)
    flops = 2 * g.m * g.n * g.k
    nbytes = gemm_bytes(g, dtype)
    record = {**ctx.base_record(dtype), "shape": g.shape, "model": g.model, "m": g.m, "n": g.n, "k": g.k,
              "flops": flops, "bytes": nbytes, "intensity": flops / nbytes}
    if dtype == "fp8":
        reason = fp8_unsupported(ctx.device)
        if reason is None and any(x % 16 for x in (g.m, g.n, g.k)):
            reason = "fp8 GEMMs need m, n and k to be multiples of 16"
        if reason:
            return Point(key, "unsupported", record, error=reason)

    def run() -> Point:
        dev.set_matmul_precision(dtype)
        sets = operand_sets(nbytes, ctx.device)
        calls, check, info = build_calls(g, dtype, ctx.device, sets, opts.seed)
        calls[0]()
        dev.synchronize(ctx.device)
        err = rel_err(*check())
        rec = {**record, "rel_err": err}
        info.update(operand_sets=sets, set_bytes=nbytes)
        if not err <= TOLERANCE[dtype]:
            return Point(key, "wrong", rec, info=info,
                         error=f"rel_err {err:.3g} over the {dtype} tolerance {TOLERANCE[dtype]:g}")
        per_call, reps = time_calls(cycling(calls), ctx)
        timing, stats, warnings = timing_record(per_call)
        per_call = per_call.samples_ms
        tflops = flops / (stats.median_ms / 1e3) / 1e12
        peak = ctx.peak.peak(dtype) if ctx.peak else None
        rec.update(timing, tflops=tflops, peak_tflops=peak, pct_of_peak=100 * tflops / peak if peak else None,
                   gbps=nbytes / (stats.median_ms / 1e3) / 1e9,
                   peak_gbs=ctx.peak.bandwidth_gbs if ctx.peak else None)
        info.update(calls_per_sample=reps, stats=stats.as_dict())
        return Point(key, "ok", rec, per_call, info, warnings)

    return guarded(key, record, ctx, run)


def units(opts: GemmOptions) -> list[tuple[dict, list[dict]]]:
    """(unit, its point keys): every shape x dtype is measured on its own."""
    return [({"shape": dataclasses.asdict(g), "dtype": d}, [point_key(g, d)]) for g in shapes(opts) for d in opts.dtypes]


def measure_unit(unit: dict, opts: GemmOptions, ctx: Context) -> list[Point]:
    return [measure(GemmShape(**unit["shape"]), unit["dtype"], opts, ctx)]
