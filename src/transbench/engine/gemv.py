"""A few-row GEMV for decode steps, Y = act(LayerNorm(X) W^T + b) [+ residual], in one kernel.

At one to a few tokens a projection is the time to stream its weights, and a decode step of gpt2 ran 8 kernels a
layer at about 3.7 us each (benchmarks/results/engine_limits_h200_2026-11.md): cuBLAS's GEMV, then a LayerNorm, GELU
or residual add of its own. Here the LayerNorm that precedes a pre-LN projection is this kernel's prologue (each
program normalises the few input rows itself: they are a few KiB, read from L2) and the bias, GELU and residual its
epilogue, so a GPT-2 layer is five kernels: QKV, attention, output projection, FC1, FC2. Launched on CUDA only (and
in Triton's CPU interpreter by the tests); ops.TorchOps.norm_linear is the reference.
"""
from __future__ import annotations

import torch

from .activation import activate
from .gemm import _prefetch_weights
from .launch import jit, launch_options, pdl_enter, tl, triton

# Rows (tokens) up to which the GEMV is offered: past a few rows the tensor-core GEMMs (gemm.py) read each weight
# once for many rows, where this kernel's FMA loop would be compute-bound.
MAX_ROWS = 8
# (BN output columns a program, BK inputs an iteration, warps). Small BN gives the few-column layers (768 outputs)
# enough programs to reach every SM; a program's x-times-w tile BM x BN x BK stays within 8,192 fp32 values
# (configs() drops the larger ones for more rows) so it sits in registers.
CONFIGS = [(4, 512, 4), (8, 256, 4), (8, 512, 4), (16, 256, 4), (2, 1024, 4), (16, 512, 8), (32, 128, 4)]
TILE_MAX = 8192


def configs(M: int) -> list[tuple[int, int, int]]:
    """The configs that fit M rows' tile in registers, in CONFIGS' order."""
    bm = triton.next_power_of_2(M) if M > 1 else 1
    return [c for c in CONFIGS if bm * c[0] * c[1] <= TILE_MAX * (c[2] // 4)]


@jit(do_not_specialize=["M"])
def _gemv_kernel(X, W, BIAS, R, Y, LNW, LNB, M, N, K, eps, ACT: tl.constexpr, HAS_LN: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, KP2: tl.constexpr, PDL: tl.constexpr):
    n0 = tl.program_id(0) * BN
    n = n0 + tl.arange(0, BN)
    nm = n < N
    # The weights never depend on the previous kernel: under PDL they are on their way to L2 while it finishes.
    _prefetch_weights(W, n0, N, K, 0, K, PDL, BN, True)
    pdl_enter(PDL)
    m = tl.arange(0, BM)
    mm = m < M
    xrow = X + m.to(tl.int64)[:, None] * K
    if HAS_LN:  # the rows' mean and 1 / std, two passes over the row in registers (no E[x^2] - mean^2 cancellation)
        kk = tl.arange(0, KP2)
        full = mm[:, None] & (kk < K)[None, :]
        xf = tl.load(xrow + kk[None, :], mask=full, other=0.0).to(tl.float32)
        mean = tl.sum(xf, 1) / K
        d = tl.where(full, xf - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, 1) / K + eps)
    wrow = W + n.to(tl.int64)[:, None] * K
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        km = k < K
        x = tl.load(xrow + k[None, :], mask=mm[:, None] & km[None, :], other=0.0).to(tl.float32)
        if HAS_LN:  # masked columns: weight and bias 0, so they add nothing
            g = tl.load(LNW + k, mask=km, other=0.0).to(tl.float32)
            b = tl.load(LNB + k, mask=km, other=0.0).to(tl.float32)
            x = (x - mean[:, None]) * rstd[:, None] * g[None, :] + b[None, :]
        w = tl.load(wrow + k[None, :], mask=nm[:, None] & km[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], 2)
    if HAS_BIAS:
        acc += tl.load(BIAS + n, mask=nm, other=0.0).to(tl.float32)[None, :]
    acc = activate(acc, ACT)
    out = m.to(tl.int64)[:, None] * N + n[None, :]
    om = mm[:, None] & nm[None, :]
    if HAS_RES:
        acc += tl.load(R + out, mask=om, other=0.0).to(tl.float32)
    tl.store(Y + out, acc.to(Y.dtype.element_ty), mask=om)


def supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """A few contiguous fp16/bf16 rows against a row-major weight of the same dtype."""
    return (x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.is_contiguous() and weight.is_contiguous()
            and x.dtype == weight.dtype and x.dtype in (torch.float16, torch.bfloat16) and x.shape[1] == weight.shape[1])


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: int = 0,
         residual: torch.Tensor | None = None, norm: tuple | None = None, cfg=CONFIGS[0],
         pdl: bool = True) -> torch.Tensor:
    """act(LayerNorm(x) W^T + bias) [+ residual] for x of at most MAX_ROWS rows; norm: (weight, bias, eps) of the
    LayerNorm, or None (x as it is). act: an activation.ACT_* code. pdl: EngineOptions.pdl."""
    if not supported(x, weight) or (residual is not None and (not residual.is_contiguous()
                                                              or residual.shape != (x.shape[0], weight.shape[0]))):
        raise ValueError("shape/layout not supported by the GEMV")
    (M, K), N = x.shape, weight.shape[0]
    bn, bk, num_warps = cfg
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    lnw, lnb, eps = norm if norm is not None else (weight, weight, 0.0)
    _gemv_kernel[(triton.cdiv(N, bn),)](
        x, weight, bias if bias is not None else weight, residual if residual is not None else y, y, lnw, lnb,
        M, N, K, float(eps), ACT=act, HAS_LN=norm is not None, HAS_BIAS=bias is not None,
        HAS_RES=residual is not None, BM=triton.next_power_of_2(M) if M > 1 else 1, BN=bn, BK=bk,
        KP2=triton.next_power_of_2(K), num_warps=num_warps, **launch_options(x.device, pdl))
    return y
