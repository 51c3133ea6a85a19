"""Runs the engine's Triton kernels in Triton's CPU interpreter against torch; prints one JSON line of errors.

Run in a fresh process with TRITON_INTERPRET=1 (Triton reads it when the kernels are defined):
tests/test_engine_triton_cpu.py does that.
"""
import json

import torch
import torch.nn.functional as F

from transbench.engine import gemm, kernels, ops


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item() if torch.isfinite(out).all() else float("inf")


def main():
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(torch.float16)

    errors = {}
    cfgs = [(64, 64, 64, 2, 4, True, True), (64, 32, 64, 2, 4, False, False)]
    for M, N, K in [(1, 64, 64), (77, 192, 128), (300, 128, 256)]:
        x, w, b, r = rnd(M, K), rnd(N, K, scale=K**-0.5), rnd(N), rnd(M, N)
        lin = x.float() @ w.float().t()
        for act, approx in [(gemm.ACT_NONE, None), (gemm.ACT_GELU, "none"), (gemm.ACT_GELU_TANH, "tanh")]:
            ref = lin + b.float()
            ref = F.gelu(ref, approximate=approx) if approx else ref
            for cfg in cfgs:
                errors[f"gemm act={act} {M}x{N}x{K} cfg={cfg[:2]}"] = rel(gemm.linear(x, w, b, act, cfg=cfg), ref)
        errors[f"gemm residual {M}x{N}x{K}"] = rel(gemm.linear(x, w, b, residual=r, cfg=cfgs[0]), lin + b.float() + r.float())
        errors[f"gemm no bias {M}x{N}x{K}"] = rel(gemm.linear(x, w, None, cfg=cfgs[1]), lin)
    split_cfgs = [(16, 32, 32, 2, 2, 4), (64, 64, 32, 4, 2, 4)]
    for M, N, K in [(1, 96, 128), (37, 64, 160)]:  # K = 160: the last split of 4 gets 32 of 5 x 32
        x, w, b, r = rnd(M, K), rnd(N, K, scale=K**-0.5), rnd(N), rnd(M, N)
        lin = x.float() @ w.float().t() + b.float()
        for cfg in split_cfgs:
            errors[f"splitk gelu {M}x{N}x{K} cfg={cfg[:4]}"] = rel(gemm.linear_splitk(x, w, b, gemm.ACT_GELU, cfg=cfg),
                                                                 F.gelu(lin))
            # a second call: the first left its arrival counters at zero
            errors[f"splitk residual {M}x{N}x{K} cfg={cfg[:4]}"] = rel(
                gemm.linear_splitk(x, w, b, residual=r, cfg=cfg), lin + r.float())
    decode(errors, rnd)
    for B, S, H, D in [(2, 77, 3, 24), (1, 130, 2, 64)]:  # odd length and head size; more than one block
        qkv = rnd(B * S, 3 * H * D)
        q, k, v = qkv.float().view(B, S, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
        for causal in (False, True):
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.2).transpose(1, 2).reshape(B * S, -1)
            for cfg in kernels.ATTENTION_CONFIGS:
                errors[f"attention {B}x{S}x{H}x{D} causal={causal} cfg={cfg}"] = rel(
                    kernels.attention(qkv, B, S, H, 0.2, causal, cfg), ref)
            # the e4m3 output on the bound's scales (ops.attention_scale): every V value of token row r is at most
            # 448 * x_scale[r] * gain here
            bound = ops.AttnBound(v.abs().amax(dim=(1, 3)).reshape(-1, 1) / 448 * 1.5, 1.0, 0.25)
            for cfg in kernels.ATTENTION_CONFIGS:
                q8, qs = kernels.attention(qkv, B, S, H, 0.2, causal, cfg, bound)
                errors[f"fp8 attention {B}x{S}x{H}x{D} causal={causal} cfg={cfg}"] = near(
                    q8, qs, ref, ops.attention_scale(bound, S))
    for T, N in [(3, 96), (33, 100)]:
        x, r, b, lw, lb = rnd(T, N), rnd(T, N), rnd(N), rnd(N), rnd(N)
        s = x.float() + b.float() + r.float()
        y, res = kernels.add_layernorm(x, r, b, lw, lb, 1e-5, store_residual=True)
        errors[f"add_layernorm {T}x{N}"] = rel(y, F.layer_norm(s, (N,), lw.float(), lb.float(), 1e-5))
        errors[f"add_layernorm residual out {T}x{N}"] = rel(res, s)
        for tanh in (False, True):
            ref = F.gelu(x.float() * 3 + b.float(), approximate="tanh" if tanh else "none")
            errors[f"bias_gelu tanh={tanh} {T}x{N}"] = rel(kernels.bias_gelu((x * 3).contiguous(), b, tanh), ref)
    embed(errors, rnd)
    fp8(errors, rnd)
    routes(errors, rnd)
    packing(errors)
    print(json.dumps(errors))


def packing(errors):
    """kernels.mask_counts / pack_rows against make_packing's torch ops (its path off CUDA): 0 where every index,
    count and mask agree exactly, else 1."""
    from transbench.engine.attention import make_packing

    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(0, 78, (5,), generator=g)
    ragged = (torch.arange(77)[None, :] < lengths[:, None]).int()
    ragged[1] = 0  # an all-padding row
    ragged[2] = ragged[2].flip(0)  # left padding
    cases = {"1x1": torch.ones(1, 1, dtype=torch.int64), "1x128 right-padded": (torch.arange(128) < 100)[None].long(),
             "5x77 ragged int32": ragged, "5x77 ragged bool": ragged.bool(), "5x77 ragged float": ragged.float(),
             "5x77 ragged transposed view": ragged.t().contiguous().t(), "3x16 all real": torch.ones(3, 16),
             "300x20 random": (torch.rand(300, 20, generator=g) < 0.7).long()}
    for name, mask in cases.items():
        B, S = mask.shape
        for bucket in (1, 16):
            ref = make_packing(mask, B, S, bucket)
            cu, counts = kernels.mask_counts(mask)
            n = int(mask.ne(0).sum())
            same = counts.tolist() == [n, int(mask[:, 0].ne(0).sum())] and cu[: B + 1].tolist() == [0, *mask.ne(0).sum(
                1).cumsum(0).tolist()]
            if not ref.dense:
                gidx, sidx, m = kernels.pack_rows(mask, cu, n, ref.tokens)
                same = same and all(torch.equal(a, b) for a, b in ((gidx, ref.gidx), (sidx, ref.sidx), (m, ref.mask),
                                                                   (cu, ref.cu)))
            errors[f"packing {name} bucket={bucket}"] = 0.0 if same else 1.0


def off(q, qs, ref):
    """Per-row e4m3 codes and scales against ops.quantize_rows of the same values: the fraction of elements that
    differ, or the scales' relative error, whichever is larger."""
    from transbench.engine.ops import quantize_rows
    rq, rs = quantize_rows(ref)
    # Triton 3.9's interpreter rounds a value just under a power of two (124.3 -> 64, not 128) when its
    # mantissa carries into the exponent; the GPU's cvt does not (tests/gpu/test_engine_fp8_gpu.py compares every
    # element there). Those elements are left out here.
    r = rq.float().abs()
    carry = (r == 2.0 ** torch.log2(r.clamp(min=1e-30)).round()) & ((ref / rs).abs() < r)
    wrong = (q.float() != rq.float()) & ~carry
    return max(wrong.float().mean().item(), rel(qs, rs))


def near(q, qs, ref, scale):
    """e4m3 codes on given scales against ops.quantize_scaled of an fp32 reference the kernel only approximates
    (attention's fp16 probabilities move ~1% of values across a rounding boundary): the fraction of codes more
    than one e4m3 step off, a fifth of the fraction off at all, or the scales' relative error, the largest."""
    rq = ops.quantize_scaled(ref, scale).float()
    d = (q.float() - rq).abs()
    step = (rq.abs() * 2.0**-3).clamp(min=2.0**-9)
    r = rq.abs()  # the interpreter's carry slip (off): a value rounding up to a power of two lands one binade low
    carry = (r == 2.0 ** torch.log2(r.clamp(min=1e-30)).round()) & ((ref / scale).abs() < r)
    d = d[~carry]
    return max((d > step[~carry] * 1.01).float().mean().item(), (d > 0).float().mean().item() / 5, rel(qs, scale))


def fp8(errors, rnd):
    """The kernels that write fp8 GEMM inputs (per-row e4m3 + scales) against ops.quantize_rows on the same fp32
    values: the data as the fraction of elements off by more than one e4m3 step, the scales as a relative error."""
    for T, N in [(3, 96), (33, 200)]:  # 200: not a power of two
        x, r, b, lw, lb = rnd(T, N), rnd(T, N), rnd(N), rnd(N), rnd(N)
        s = x.float() + b.float() + r.float()
        want = F.layer_norm(s, (N,), lw.float(), lb.float(), 1e-5)
        y, q, qs = kernels.add_layernorm(x, r, b, lw, lb, 1e-5, quant=True)
        errors[f"fp8 add_layernorm y {T}x{N}"] = rel(y, want)
        errors[f"fp8 add_layernorm q {T}x{N}"] = off(q, qs, want)
        for act, approx in [(0, None), (1, "none"), (2, "tanh")]:
            want = (x * 3).float() + b.float()
            want = F.gelu(want, approximate=approx) if approx else want
            q, qs = kernels.quantize_rows((x * 3).contiguous(), b, act)
            errors[f"fp8 quantize_rows act={act} {T}x{N}"] = off(q, qs, want)


def embed(errors, rnd):
    """The fused embedding block (gathers + sum + LayerNorm) against the torch path: dense rows (positions from
    the row), given positions, token types or none; odd width."""
    from transbench.engine.ops import Norm, TorchOps
    V, P, N, B, S = 50, 40, 100, 3, 13
    word, pos, typ, lw, lb = rnd(V, N), rnd(P, N), rnd(2, N), rnd(N), rnd(N)
    ids, pids, tt = torch.randint(0, V, (B * S,)), torch.randint(0, P, (B * S,)), torch.randint(0, 2, (B * S,))
    for label, p, t in [("dense", None, None), ("positions+types", pids, tt), ("types", None, tt)]:
        ref = TorchOps().embed_layernorm(ids, word.float(), p, pos.float(), t, typ.float(),
                                         Norm(lw.float(), lb.float(), 1e-12), S)
        errors[f"embed_layernorm {label}"] = rel(kernels.embed_layernorm(ids, word, p, pos, t, typ, lw, lb, 1e-12, S), ref)


def decode(errors, rnd):
    """Decode attention writes k, v at pos and attends over 0..pos, as the torch path does (odd head size,
    positions inside the first block and past it)."""
    from transbench.engine.ops import TorchOps
    B, H, L, D = 2, 3, 300, 24
    for pos in (0, 5, 200):
        qkv = rnd(B, 3 * H * D)
        caches = [rnd(B, H, L, D) for _ in range(2)]
        p = torch.tensor([pos])
        mine = [c.clone() for c in caches]
        out = kernels.decode_attention(qkv, mine[0], mine[1], p, 0.3)
        want = [c.float() for c in caches]
        ref = TorchOps().decode_attention(qkv.float(), want[0], want[1], p, 0.3)
        errors[f"decode attention pos={pos}"] = rel(out, ref)
        errors[f"decode cache write pos={pos}"] = max(rel(m, w) for m, w in zip(mine, want))


def routes(errors, rnd):
    """Every route TritonOps may pick for a GEMM and its epilogue gives the torch reference's result."""
    from transbench.engine import ops

    class EveryRoute:  # stands in for the GPU tuner: runs every candidate, keeps each result
        def choose(self, key, cands):
            self.outs = {name: fn() for name, fn in cands.items()}
            return next(iter(cands))

    every = EveryRoute()
    ops.tuner = lambda: every
    t, ref = ops.TritonOps(), ops.TorchOps()
    M, H, F4 = 37, 64, 256
    x, res = rnd(M, F4), rnd(M, H)
    lin = ops.Linear(rnd(H, F4, scale=F4**-0.5), rnd(H))
    fc1 = ops.Linear(rnd(F4, H, scale=H**-0.5), rnd(F4))
    norm = ops.Norm(rnd(H), rnd(H), 1e-5)

    def check(label, want):
        for name, out in every.outs.items():
            outs, wants = (out, want) if isinstance(want, tuple) else ((out,), (want,))
            assert len(outs) == len(wants), (label, name)
            errors[f"route {label} {name}"] = max(rel(o, w.float()) for o, w in zip(outs, wants))

    for store in (False, True):
        t.linear_add_layernorm(x, lin, res, norm, store)
        check(f"linear_add_ln store={store}", ref.linear_add_layernorm(x.float(), _f(lin), res.float(), _f(norm), store))
    for kind in ("exact", "tanh"):
        t.linear_gelu(x[:, :H].contiguous(), fc1, kind)
        check(f"linear_gelu {kind}", ref.linear_gelu(x[:, :H].float(), _f(fc1), kind))
    t.linear(x[:, :H].contiguous(), fc1)
    check("linear", ref.linear(x[:, :H].float(), _f(fc1)))
    fp8_routes(errors, every, t, ref, rnd)


def fp8_routes(errors, every, t, ref, rnd):
    """A layer with fp8 weights: every route (fp16 ones and fp8 ones, scaled_mm emulated on the CPU) against
    the fp32 reference of the same fp8 layer; the fp8 routes quantize in Triton what the reference does in torch."""
    from transbench.engine.ops import Fp8Act, Norm, fp8_out_scale, hp, quantize_rows
    from transbench.engine.weights import Converter
    M, H, F4 = 37, 64, 256
    t.fp8_min_rows = 1  # M = 37 is below TritonOps' FP8_MIN_ROWS: offer the fp8 routes anyway, to check them
    conv = Converter(torch.float16, torch.device("cpu"), fp8=True)
    lin, fc1 = conv.linear(rnd(H, F4, scale=F4**-0.5), rnd(H)), conv.linear(rnd(F4, H, scale=H**-0.5), rnd(F4))
    x, res, h = rnd(M, F4), rnd(M, H), rnd(M, H)
    norm = Norm(rnd(H), rnd(H), 1e-5)

    def check(label, want):
        for name, out in every.outs.items():
            got = out[0] if isinstance(out, tuple) and not isinstance(out, Fp8Act) else out
            w = want
            if isinstance(got, Fp8Act) and got.hp is None:  # a route that hands on fp8 only: want rounded on its scales
                w = Fp8Act((hp(want).float() / got.scale).clamp(-448, 448).to(torch.float8_e4m3fn), got.scale)
            errors[f"fp8route {label} {name}"] = rel(hp(got, torch.float32).float(), hp(w, torch.float32).float())
            if "triton_gelu_q" in name:  # the fused fp8 GEMM's row scales: fp8_out_scale of its input's scales
                errors[f"fp8route {label} {name} scale"] = rel(got.scale, fp8_out_scale(quantize_rows(h.float())[1], fc1))
    f32 = Converter(torch.float32, torch.device("cpu"), fp8=True)
    flin, ffc1 = f32.linear(lin.weight.float(), lin.bias.float()), f32.linear(fc1.weight.float(), fc1.bias.float())
    t.linear_add_layernorm(x, lin, res, norm, quant=True)
    check("linear_add_ln quant", ref.linear_add_layernorm(x.float(), flin, res.float(), _f(norm), quant=True))
    t.linear_gelu(h, fc1, "exact")
    # the unquantized fp32 GELU output (from the e4m3 input and weights): fp16 routes are held to it, fp8-only ones to
    # its e4m3 rounding on their own scales
    check("linear_gelu", ref.bias_gelu(ref.linear(h.float(), ffc1, bias=False), ffc1.bias, "exact"))
    t.linear(t.quantize(h), fc1)  # an fp8 input from a producer: fp16 routes dequantize it
    check("linear fp8 input", ref.linear(h.float(), ffc1))


def _f(d):
    """An fp32 copy of a Linear/Norm: the reference runs in fp32."""
    from dataclasses import fields, replace
    return replace(d, **{f.name: getattr(d, f.name).float() for f in fields(d)
                         if isinstance(getattr(d, f.name), torch.Tensor)})


if __name__ == "__main__":
    main()
