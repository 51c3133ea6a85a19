"""LayerNorm(x + bias + residual) of rows in one kernel, optionally also writing the sum (pre-LN's next residual)
and the output in e4m3 with per-row scales (the next fp8 GEMM's input)."""
from __future__ import annotations

import torch

from .launch import jit, launch_options, pdl_enter, tl, triton, warps
from .quantize import store_fp8_row


@jit
def _add_layernorm_kernel(X, R, BIAS, W, B, Y, RES_OUT, Q, QS, N, eps,
                          HAS_R: tl.constexpr, HAS_BIAS: tl.constexpr, AFFINE: tl.constexpr, STORE_RES: tl.constexpr,
                          QUANT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # One row per program: rows are at most a few thousand wide, so the whole row sits in registers
    # and x + bias + residual is read once, normalised and written once.
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(X + row * N + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(BIAS + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_R:
        x += tl.load(R + row * N + cols, mask=m, other=0.0).to(tl.float32)
    if STORE_RES:  # pre-LN models (GPT-2) carry the un-normalised sum on as the next residual
        tl.store(RES_OUT + row * N + cols, x.to(RES_OUT.dtype.element_ty), mask=m)
    mean = tl.sum(x, 0) / N
    d = tl.where(m, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, 0) / N + eps)
    y = d * rstd
    if AFFINE:
        y = y * tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
        y += tl.load(B + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=m)
    if QUANT:  # the next GEMM's fp8 input, from the same registers
        store_fp8_row(y, row, cols, m, N, Q, QS)


def add_layernorm(x, residual, bias, weight, ln_bias, eps, store_residual=False, quant=False, pdl: bool = True):
    """LayerNorm(x + bias + residual) of rows; weight and ln_bias None: no gamma and beta (both or neither;
    weights.fold); store_residual: also the sum; quant: also y in e4m3 with per-row scales, returned as (y, y8,
    scales (rows, 1) fp32) (2-D x only). pdl: EngineOptions.pdl."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    res_out = torch.empty_like(x2) if store_residual else y
    q = torch.empty(x2.shape, device=x.device, dtype=torch.float8_e4m3fn) if quant else y
    qs = torch.empty(x2.shape[0], 1, device=x.device, dtype=torch.float32) if quant else y
    r = residual.reshape(-1, n).contiguous() if residual is not None else x2
    block = triton.next_power_of_2(n)
    _add_layernorm_kernel[(x2.shape[0],)](
        x2, r, bias if bias is not None else x2, x2 if weight is None else weight, x2 if ln_bias is None else ln_bias,
        y, res_out, q, qs, n, eps, HAS_R=residual is not None, HAS_BIAS=bias is not None, AFFINE=weight is not None,
        STORE_RES=store_residual, QUANT=quant, BLOCK=block, num_warps=warps(block), **launch_options(x.device, pdl))
    y = y.view_as(x)
    if quant:
        y = (y, q, qs)
    return (y, res_out.view_as(x)) if store_residual else y
