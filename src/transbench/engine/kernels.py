"""Triton kernels for the element-wise work around the GEMMs (the GEMMs themselves: gemm.py). Imported only when Triton is present (see ops.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_layernorm_kernel(X, R, BIAS, W, B, Y, RES_OUT, N, eps,
                          HAS_R: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_RES: tl.constexpr,
                          BLOCK: tl.constexpr):
    # One row per program: rows are at most a few thousand wide, so the whole row sits in registers
    # and x + bias + residual is read once, normalised and written once.
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
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, (d * rstd * w + b).to(Y.dtype.element_ty), mask=m)


@triton.jit
def _bias_gelu_kernel(X, BIAS, Y, N, TANH: tl.constexpr, BLOCK: tl.constexpr):
    # 2-D grid (row, column block) so the bias index needs no per-element modulo.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(X + row * N + cols, mask=m, other=0.0).to(tl.float32)
    x += tl.load(BIAS + cols, mask=m, other=0.0).to(tl.float32)
    if TANH:  # 0.5 * (1 + tanh(u)) == sigmoid(2u): avoids a libdevice tanh
        y = x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    else:
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=m)


def _warps(block: int) -> int:
    return max(1, min(16, block // 256))


def add_layernorm(x, residual, bias, weight, ln_bias, eps, store_residual=False):
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    res_out = torch.empty_like(x2) if store_residual else y
    r = residual.reshape(-1, n).contiguous() if residual is not None else x2
    block = triton.next_power_of_2(n)
    _add_layernorm_kernel[(x2.shape[0],)](
        x2, r, bias if bias is not None else weight, weight, ln_bias, y, res_out, n, eps,
        HAS_R=residual is not None, HAS_BIAS=bias is not None, STORE_RES=store_residual,
        BLOCK=block, num_warps=_warps(block))
    y = y.view_as(x)
    return (y, res_out.view_as(x)) if store_residual else y


def bias_gelu(x, bias, tanh: bool):
    n = x.shape[-1]
    x = x.contiguous()
    x2 = x.view(-1, n)
    block = min(1024, triton.next_power_of_2(n))
    # In place: the GEMM output is dead after the activation, so no second buffer is needed.
    _bias_gelu_kernel[(x2.shape[0], triton.cdiv(n, block))](x2, bias, x2, n, TANH=tanh, BLOCK=block,
                                                          num_warps=_warps(block))
    return x
