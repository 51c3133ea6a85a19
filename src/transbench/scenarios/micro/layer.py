"""`micro layer`: one transformer layer (transformers' own BertLayer / GPT2Block, sdpa attention),
forward and forward+backward TFLOPS over batch x seq, as in the seeds' notebook.

FLOPs: batch x flops.layer_flops (the MFU convention: matrix products only, full s^2 attention);
backward = 2 x forward. The layer is in eval mode (no dropout) so its FLOPs are its whole work; the
forward runs without autograd, forward+backward backpropagates a random output gradient through the
layer to its input and weights. Before timing, each point's output is compared with an fp32 run of
the same weights on the first sequences."""

from __future__ import annotations

import copy

from ...measure import device as dev
from ...measure import memory
from ...models import build, flops
from ..inference.measure import TOLERANCE
from .common import Context, Point, failure_point, first_tensor, guarded, rel_err, time_calls, timing_record
from .options import LayerOptions

CHECK_ROWS = 2


def build_layer(model: str, device, seed: int):
    """An fp32 layer of the model's shape with random weights, eval mode, sdpa attention, on `device`."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    ref = build.resolve(model)
    cfg = build.hf_config(ref, "base")
    cfg._attn_implementation = "sdpa"
    if ref.family == "bert":
        from transformers.models.bert.modeling_bert import BertLayer as cls
    else:
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block as cls
    torch.manual_seed(seed)
    with torch.device(device):
        layer = cls(cfg, layer_idx=0)
    if ref.path:
        _load_first_layer(layer, ref)
    return layer.eval(), ref.shape


def _load_first_layer(layer, ref) -> None:
    """A local checkpoint's weights for layer 0, so `--model FOLDER` times its real weights. Loaded as `run` loads
    them (build.build_model: fp32 whatever config.json's dtype says): transformers' own default builds the model in
    that dtype, and a config.json of dtype "int8" made every point an `error` ("BertModel cannot be instantiated
    under `dtype=torch.int8`"), exit 0, where `run` of the same folder measured it."""
    model = build.build_model(ref, "base")
    src = model.encoder.layer[0] if ref.family == "bert" else model.h[0]
    layer.load_state_dict(src.state_dict())


def attn_implementation(layer) -> str | None:
    for m in layer.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None:
            return cfg._attn_implementation
    return None


class CastLayer:
    """The fp32 layer (the reference) and its copy in the measured dtype."""

    def __init__(self, base, dtype: str):
        self.base, self.dtype = base, dtype
        self.layer = copy.deepcopy(base).to(dtype=dev.torch_dtype(dtype))

    def check(self, x32) -> tuple[float, str]:
        """rel_err of the cast layer against the fp32 layer (no TF32) on the first rows of `x32`."""
        import torch

        dev.set_matmul_precision("fp32")
        with torch.no_grad():
            ref = first_tensor(self.base(x32[:CHECK_ROWS])).float()
        dev.set_matmul_precision(self.dtype)
        with torch.no_grad():
            out = first_tensor(self.layer(x32[:CHECK_ROWS].to(dev.torch_dtype(self.dtype))))
        return rel_err(out, ref), str(out.dtype).replace("torch.", "")


PASSES = ("fwd", "fwd+bwd")


def point_key(opts: LayerOptions, batch: int, seq: int, p: str) -> dict:
    return {"model": opts.model, "dtype": opts.dtype, "batch": batch, "seq": seq, "pass": p}


def measure(cast: CastLayer, shape, batch: int, seq: int, opts: LayerOptions, ctx: Context) -> list[Point]:
    import torch

    dtype, layer = opts.dtype, cast.layer
    fwd_flops = batch * flops.layer_flops(shape, seq)
    passes = tuple(zip(PASSES, (fwd_flops, 3 * fwd_flops)))
    base = {**ctx.base_record(dtype), "model": opts.model, "batch_size": batch, "seq_len": seq}

    def key(p):
        return point_key(opts, batch, seq, p)

    def record(p, fl):
        return {**base, "pass": p, "flops": fl}

    layer.zero_grad(set_to_none=True)
    try:
        gen = torch.Generator(device=ctx.device).manual_seed(opts.seed)
        x32 = torch.randn(batch, seq, shape.hidden, device=ctx.device, generator=gen)
        err, out_dtype = cast.check(x32)
        x = x32.to(dev.torch_dtype(dtype))
        del x32
        grad = torch.randn(batch, seq, shape.hidden, device=ctx.device, generator=gen).to(x.dtype)
    except Exception as exc:  # noqa: BLE001 - an OOM while making inputs is a row like any other
        failed = [failure_point(key(p), record(p, fl), exc) for p, fl in passes]
    else:
        failed = None
    if failed:
        dev.free_memory(ctx.device)
        return failed
    info = {"attn_implementation": attn_implementation(layer), "out_dtype": out_dtype,
            "layer": type(layer).__name__, "training_mode": layer.training}
    tol = TOLERANCE[dtype]
    if not err <= tol:
        return [Point(key(p), "wrong", {**record(p, fl), "rel_err": err}, info=info,
                      error=f"rel_err {err:.3g} over the {dtype} tolerance {tol:g}") for p, fl in passes]
    xg = x.detach().requires_grad_(True)

    def forward():
        with torch.no_grad():
            return layer(x)

    def forward_backward():
        first_tensor(layer(xg)).backward(grad)

    out = []
    for p, fl in passes:
        def run(fn=forward if p == "fwd" else forward_backward, fl=fl, p=p) -> Point:
            memory.reset_peak(ctx.device)
            per_call, reps = time_calls(fn, ctx)
            timing, stats, warnings = timing_record(per_call)
            per_call = per_call.samples_ms
            seconds = stats.median_ms / 1e3
            tflops = fl / seconds / 1e12
            peak = ctx.peak.peak(dtype) if ctx.peak else None
            rec = {**record(p, fl), "rel_err": err, **timing, "tflops": tflops,
                   "throughput_per_s": batch / seconds, "tokens_per_s": batch * seq / seconds,
                   "mfu": tflops / peak if peak else None, "pct_of_peak": 100 * tflops / peak if peak else None,
                   "peak_mem_mb": memory.snapshot(ctx.device)["peak_mem_mb"]}
            return Point(key(p), "ok", rec, per_call, {**info, "calls_per_sample": reps, "stats": stats.as_dict()},
                         warnings)

        out.append(guarded(key(p), {**record(p, fl), "rel_err": err}, ctx, run))
    return out


def units(opts: LayerOptions) -> list[tuple[dict, list[dict]]]:
    """Both passes of one batch x seq are measured together, on one built layer."""
    return [({"batch": b, "seq": s}, [point_key(opts, b, s, p) for p in PASSES]) for s in opts.seqs for b in opts.batches]


def measure_unit(unit: dict, opts: LayerOptions, ctx: Context) -> list[Point]:
    base, shape = build_layer(opts.model, ctx.device, opts.seed)
    return measure(CastLayer(base, opts.dtype), shape, unit["batch"], unit["seq"], opts, ctx)
