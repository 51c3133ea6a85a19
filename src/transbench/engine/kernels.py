"""Triton kernels for the elementwise work around the GEMMs. Imported only when Triton is present (see ops.py)."""
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


@triton.jit
def _gelu(x, TANH: tl.constexpr):
    if TANH:
        return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))


@triton.jit
def _linear_gelu_kernel(X, W, BIAS, Y, M, N, K, TANH: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    # Y = gelu(X @ W^T + bias), X (M, K), W (N, K) row-major: the MLP's first GEMM with its activation as
    # the epilogue, so the (M, 4*hidden) intermediate is written once instead of written, read and rewritten.
    pid = tl.program_id(0)
    n_m, n_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = pid // (GROUP * n_n)  # grouped order: neighbouring programs share X tiles in L2
    first_m = group * GROUP
    size_m = min(n_m - first_m, GROUP)
    pm = first_m + (pid % (GROUP * n_n)) % size_m
    pn = (pid % (GROUP * n_n)) // size_m
    rm = (pm * BM + tl.arange(0, BM)) % M
    rn = (pn * BN + tl.arange(0, BN)) % N
    rk = tl.arange(0, BK)
    xp = X + rm[:, None].to(tl.int64) * K + rk[None, :]
    wp = W + rn[None, :].to(tl.int64) * K + rk[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        kmask = rk < K - k * BK
        a = tl.load(xp, mask=kmask[None, :], other=0.0)
        b = tl.load(wp, mask=kmask[:, None], other=0.0)
        acc = tl.dot(a, b, acc)
        xp += BK
        wp += BK
    acc += tl.load(BIAS + rn).to(tl.float32)[None, :]
    y = _gelu(acc, TANH).to(Y.dtype.element_ty)
    om = pm * BM + tl.arange(0, BM)
    on = pn * BN + tl.arange(0, BN)
    tl.store(Y + om[:, None].to(tl.int64) * N + on[None, :], y, mask=(om[:, None] < M) & (on[None, :] < N))


# (BM, BN, BK, stages, warps): the tuner times each against cuBLAS + a separate activation kernel.
GEMM_CONFIGS = [(128, 256, 64, 3, 8), (128, 128, 64, 4, 4), (128, 128, 32, 4, 4), (64, 128, 64, 4, 4)]


def linear_gelu(x, weight, bias, tanh: bool, cfg=GEMM_CONFIGS[0]):
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    bm, bn, bk, stages, warps = cfg
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    _linear_gelu_kernel[grid](x, weight, bias, y, M, N, K, TANH=tanh, BM=bm, BN=bn, BK=bk, GROUP=8,
                              num_stages=stages, num_warps=warps)
    return y
