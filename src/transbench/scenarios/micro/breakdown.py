"""`micro breakdown`: where one layer's time goes, part by part, and which ceiling bounds each part.

The parts are the modules of transformers' own layer called on their own (forward, no autograd), on
random inputs of the right shapes; their FLOPs and minimum bytes come from models/parts.py. A part is
compute-bound when its arithmetic intensity is at or right of the ridge point (peak FLOP/s over
bandwidth) of this device: the ceilings are the measured ones stored in the same --db for this GPU
(best `micro gemm` TFLOPS of the dtype, best `micro bandwidth` copy GB/s) when there are any, else the
datasheet's. Parts overlap (dense is inside dense+act, inside ffn), so shares do not add up to 100%."""

from __future__ import annotations

from ...measure import device as dev
from ...models import parts as parts_mod
from ...report.roofline import attainable_tflops, bound
from ..inference.measure import TOLERANCE
from .ceilings import best_ceilings
from .common import Context, Point, failure_point, first_tensor, guarded, time_calls, timing_record
from .layer import CastLayer, attn_implementation, build_layer
from .options import BreakdownOptions


def part_calls(layer, family: str, x, heads: int):
    """{part name: a callable running that part of `layer` on inputs shaped like `x` (b, s, h)}."""
    import torch
    import torch.nn.functional as F

    b, s, h = x.shape
    d = h // heads

    def heads_of(t):
        return t.view(b, s, heads, d).transpose(1, 2)

    def rand_like(t):
        return torch.randn(t.shape, device=t.device, dtype=t.dtype)

    q, k, v = (heads_of(rand_like(x)) for _ in range(3))
    ctx = rand_like(x)
    if family == "bert":
        sa, ao = layer.attention.self, layer.attention.output
        calls = {
            "qkv": lambda: (sa.query(x), sa.key(x), sa.value(x)),
            "attention core": lambda: F.scaled_dot_product_attention(q, k, v, scale=sa.scaling),
            "output proj": lambda: ao.dense(ctx),
            "dense": lambda: layer.intermediate.dense(x),
            "dense+act": lambda: layer.intermediate(x),
            "ffn": lambda: layer.output(layer.intermediate(x), x),
            "layernorms": lambda: (ao.LayerNorm(x), layer.output.LayerNorm(x)),
            "attention block": lambda: first_tensor(layer.attention(x)),
            "layer": lambda: first_tensor(layer(x)),
        }
        causal = False
    else:
        attn, mlp = layer.attn, layer.mlp
        calls = {
            "qkv": lambda: attn.c_attn(x),
            "attention core": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling),
            "output proj": lambda: attn.c_proj(ctx),
            "dense": lambda: mlp.c_fc(x),
            "dense+act": lambda: mlp.act(mlp.c_fc(x)),
            "ffn": lambda: x + mlp(layer.ln_2(x)),
            "layernorms": lambda: (layer.ln_1(x), layer.ln_2(x)),
            "attention block": lambda: x + first_tensor(attn(layer.ln_1(x))),
            "layer": lambda: first_tensor(layer(x)),
        }
        causal = True
    assert set(calls) == set(parts_mod.PARTS)
    return calls, sdpa_backend(q, k, v, causal)


def sdpa_backend(q, k, v, causal: bool) -> str | None:
    """The kernel SDPA picks for these inputs (flash, efficient, cudnn, math), when torch says."""
    import torch

    try:
        from torch.nn.attention import SDPBackend

        return SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=causal)).name.lower()
    except Exception:  # a private torch API: absent or changed, the choice stays unknown
        return None


def point_key(opts: BreakdownOptions, part: str) -> dict:
    return {"model": opts.model, "dtype": opts.dtype, "batch": opts.batch, "seq": opts.seq, "part": part}


# A part this far above its roofline is no timing noise: the ceilings, or the memory level they describe, are off.
ABOVE_ROOF = 1.1


def measure(opts: BreakdownOptions, ctx: Context) -> list[Point]:
    import torch

    base_layer, shape = build_layer(opts.model, ctx.device, opts.seed)
    dtype, b, s = opts.dtype, opts.batch, opts.seq
    esize = torch.empty((), dtype=dev.torch_dtype(dtype)).element_size()
    costs = parts_mod.layer_parts(shape, b, s, esize)
    ceil = best_ceilings(ctx, dtype)
    base = {**ctx.base_record(dtype), "model": opts.model, "batch_size": b, "seq_len": s,
            "peak_tflops": ceil.tflops, "peak_gbs": ceil.gbps, "ceiling_source": ceil.source,
            "attn_ffn_flop_ratio": parts_mod.attention_ffn_ratio(shape, s)}

    def key(part):
        return point_key(opts, part)

    def record(part):
        c = costs[part]
        return {**base, "part": part, "flops": c.flops, "bytes": c.min_bytes, "intensity": c.intensity,
                "bound": bound(c.intensity, ceil.tflops, ceil.gbps)}

    try:
        cast = CastLayer(base_layer, dtype)
        gen = torch.Generator(device=ctx.device).manual_seed(opts.seed)
        x32 = torch.randn(b, s, shape.hidden, device=ctx.device, generator=gen)
        err, out_dtype = cast.check(x32)
        x = x32.to(dev.torch_dtype(dtype))
        del x32
        calls, sdpa = part_calls(cast.layer, shape.family, x, shape.heads)
    except Exception as exc:  # noqa: BLE001 - an OOM while making inputs is a row like any other
        failed = [failure_point(key(p), record(p), exc) for p in parts_mod.PARTS]
    else:
        failed = None
    if failed:
        dev.free_memory(ctx.device)
        return failed
    info = {"attn_implementation": attn_implementation(cast.layer), "out_dtype": out_dtype,
            "sdpa_kernel": sdpa, "layer": type(cast.layer).__name__, "activation": parts_mod.activation(shape)}
    if not err <= TOLERANCE[dtype]:
        return [Point(key(p), "wrong", {**record(p), "rel_err": err}, info=info,
                      error=f"layer rel_err {err:.3g} over the {dtype} tolerance {TOLERANCE[dtype]:g}")
                for p in parts_mod.PARTS]

    points: dict[str, Point] = {}
    for part in parts_mod.PARTS:
        def run(part=part) -> Point:
            with torch.inference_mode():
                per_call, reps = time_calls(calls[part], ctx)
            timing, stats, warnings = timing_record(per_call)
            per_call = per_call.samples_ms
            seconds = stats.median_ms / 1e3
            c = costs[part]
            tflops = c.flops / seconds / 1e12
            roof = attainable_tflops(c.intensity, ceil.tflops, ceil.gbps) if ceil.tflops and ceil.gbps else None
            rec = {**record(part), "rel_err": err, **timing, "tflops": tflops,
                   "gbps": c.min_bytes / seconds / 1e9, "pct_of_roofline": 100 * tflops / roof if roof else None}
            if roof and tflops > roof * ABOVE_ROOF:
                # A store whose only `bandwidth` run was of 3 elements had a 0.009 GB/s "ceiling" (the call's
                # overhead, not the memory): parts read 293% of the roofline and "memory"-bound without a word.
                warnings.append(f"above the roofline ({rec['pct_of_roofline']:.0f}%): its data stayed in a cache, "
                                f"or the {ceil.source} ceilings ({ceil.tflops:.4g} TFLOPS, {ceil.gbps:.4g} GB/s) are "
                                "below this device's; measure `micro gemm` and `micro bandwidth` at sizes past the "
                                "caches into this --db")
            return Point(key(part), "ok", rec, per_call, {**info, "calls_per_sample": reps,
                                                          "stats": stats.as_dict()}, warnings)

        points[part] = guarded(key(part), {**record(part), "rel_err": err}, ctx, run)
    layer_ms = points["layer"].record.get("latency_ms") if points["layer"].status == "ok" else None
    for p in points.values():
        if layer_ms and p.status == "ok":
            p.record["share"] = p.record["latency_ms"] / layer_ms
    return list(points.values())


def units(opts: BreakdownOptions) -> list[tuple[dict, list[dict]]]:
    """Every part of the layer is measured in one unit: the shares are of the whole layer's time."""
    return [({}, [point_key(opts, p) for p in parts_mod.PARTS])]


def measure_unit(unit: dict, opts: BreakdownOptions, ctx: Context) -> list[Point]:
    return measure(opts, ctx)
