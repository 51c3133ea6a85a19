"""engine/layernorm.py: LayerNorm(x + bias + residual) of rows, the sum kept (pre-LN's next residual) and the output
in e4m3 too (the next fp8 GEMM's input), against torch."""
import pytest
import torch
import torch.nn.functional as F

from op_cases import DTYPES, cases, e4m3_off, randn, rel, run, skip_without_fp8, tol

# (rows, width): one row, odd counts, widths not a power of two (100, 200, 1600)
SHAPES = cases(cpu=[(3, 96), (33, 200)], gpu=[(1, 384), (7, 768), (333, 1024), (4097, 1600), (129, 100)],
               cpu_dtypes=DTYPES)
FP8_SHAPES = cases(cpu=[(3, 96), (33, 200)], gpu=[(1, 384), (7, 768), (333, 200), (4097, 1024)])


def check_add_layernorm(device, dtype, T, N):
    from transbench.engine.layernorm import add_layernorm
    x, r, b, w, lb = (randn(device, dtype, *s, seed=i) for i, s in enumerate([(T, N), (T, N), (N,), (N,), (N,)]))
    s = x.float() + b.float() + r.float()
    y, res = add_layernorm(x, r, b, w, lb, 1e-5, store_residual=True)
    err = rel(y, F.layer_norm(s, (N,), w.float(), lb.float(), 1e-5)), rel(res, s)
    assert max(err) < tol(device, dtype), err
    y = add_layernorm(x, None, None, w, lb, 1e-12)  # no residual, no bias
    err = rel(y, F.layer_norm(x.float(), (N,), w.float(), lb.float(), 1e-12))
    assert err < tol(device, dtype), err
    y, res = add_layernorm(x, r, b, None, None, 1e-5, store_residual=True)  # no weights: folded (weights.fold)
    err = rel(y, F.layer_norm(s, (N,), None, None, 1e-5)), rel(res, s)
    assert max(err) < tol(device, dtype), err


@pytest.mark.parametrize("device,dtype,T,N", SHAPES)
def test_add_layernorm(device, dtype, T, N):
    run(check_add_layernorm, device, dtype, T, N)


def check_add_layernorm_e4m3(device, dtype, T, N):
    from transbench.engine.layernorm import add_layernorm
    x, r, b, w, lb = (randn(device, dtype, *s, seed=i) for i, s in enumerate([(T, N), (T, N), (N,), (N,), (N,)]))
    ref = F.layer_norm(x.float() + b.float() + r.float(), (N,), w.float(), lb.float(), 1e-5)
    y, q, qs = add_layernorm(x, r, b, w, lb, 1e-5, quant=True)
    assert rel(y, ref) < tol(device, dtype), rel(y, ref)
    assert q.dtype == torch.float8_e4m3fn and qs.shape == (T, 1) and qs.dtype == torch.float32
    off = e4m3_off(q, qs, ref, device)
    assert off < (1e-2 if device == "cpu" else 1e-3), off


@pytest.mark.parametrize("device,dtype,T,N", FP8_SHAPES)
def test_add_layernorm_writes_its_output_in_e4m3_too(device, dtype, T, N):
    skip_without_fp8(device)
    run(check_add_layernorm_e4m3, device, dtype, T, N)
