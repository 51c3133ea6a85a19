"""Runs the engine's Triton kernels in Triton's CPU interpreter against torch; prints one JSON line of errors.

Run in a fresh process with TRITON_INTERPRET=1 (Triton reads it when the kernels are defined):
tests/test_engine_triton_cpu.py does that.
"""
import json

import torch
import torch.nn.functional as F

from transbench.engine import gemm, kernels


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item() if torch.isfinite(out).all() else float("inf")


def main():
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(torch.float16)

    errors = {}
    cfgs = [(64, 64, 64, 2, 4, True), (64, 32, 64, 2, 4, False)]
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
    for T, N in [(3, 96), (33, 100)]:
        x, r, b, lw, lb = rnd(T, N), rnd(T, N), rnd(N), rnd(N), rnd(N)
        s = x.float() + b.float() + r.float()
        y, res = kernels.add_layernorm(x, r, b, lw, lb, 1e-5, store_residual=True)
        errors[f"add_layernorm {T}x{N}"] = rel(y, F.layer_norm(s, (N,), lw.float(), lb.float(), 1e-5))
        errors[f"add_layernorm residual out {T}x{N}"] = rel(res, s)
        for tanh in (False, True):
            ref = F.gelu(x.float() * 3 + b.float(), approximate="tanh" if tanh else "none")
            errors[f"bias_gelu tanh={tanh} {T}x{N}"] = rel(kernels.bias_gelu((x * 3).contiguous(), b, tanh), ref)
    routes(errors, rnd)
    print(json.dumps(errors))


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


def _f(d):
    """An fp32 copy of a Linear/Norm: the reference runs in fp32."""
    from dataclasses import fields, replace
    return replace(d, **{f.name: getattr(d, f.name).float() for f in fields(d)
                         if isinstance(getattr(d, f.name), torch.Tensor)})


if __name__ == "__main__":
    main()
