"""A few-row GEMV for decode steps, Y = act(LayerNorm(X) W^T + b) [+ residual], in one kernel.

At one to a few tokens a projection is the time to stream its weights, and a decode step of gpt2 ran 8 kernels a
layer at about 3.7 us each (benchmarks/results/engine_limits_h200_2026-11.md): cuBLAS's GEMV, then a LayerNorm, GELU
or residual add of its own. Here the LayerNorm that precedes a pre-LN projection is this kernel's prologue (each
program takes the few input rows' statistics itself: they are a few KiB, read from L2; GPT-2's ln_1 and ln_2 come
with their weights folded into QKV and FC1 (weights.fold), and ln_f's act through two vectors of the head's,
fold_norm) and the bias, GELU and residual its epilogue, so a GPT-2 layer is five kernels: QKV, attention, output
projection, FC1, FC2. Each program holds its slice of the weights whole, fetched before it waits on the previous
kernel (see the kernel). Launched on CUDA only (and in Triton's CPU interpreter by the tests);
ops.TorchOps.norm_linear is the reference.
"""
from __future__ import annotations

import torch

from .activation import activate
from .launch import jit, launch_options, pdl_enter, tl, triton

# Rows (tokens) up to which the GEMV is offered: past a few rows the tensor-core GEMMs (gemm.py) read each weight
# once for many rows, where this kernel's FMA work would be compute-bound.
MAX_ROWS = 8
# Widest input (K, rounded up to a power of two) a program holds whole: a GPT-2 up to gpt2-xl's FC2 (6,400).
MAX_K = 8192
# (BN output rows of W a program, warps), the likeliest first (tuning.rule_route takes the first that fits). Small
# BN gives the few-column layers (768 outputs) enough programs to fill every SM.
CONFIGS = [(4, 4), (2, 4), (8, 4), (4, 8), (2, 8), (1, 4), (8, 8), (16, 4), (16, 8), (32, 8), (4, 16), (8, 16),
           (4, 2), (8, 2), (2, 2), (2, 1), (4, 1), (8, 1)]
# Values a thread may hold of the program's weight slice (fp16/bf16) and of its input rows (fp32): configs() drops
# the configs past them, which would spill registers.
PER_THREAD = 64


def configs(M: int, K: int) -> list[tuple[int, int]]:
    """The configs whose weight slice and input rows fit in registers for M rows of K, in CONFIGS' order. Each
    thread of a program of several warps takes at least one 8-wide vector of a row: with more threads than that,
    Triton spreads some warps over the rows and re-lays the slice out through shared memory (the kernel says why
    that costs)."""
    kp2, bm = triton.next_power_of_2(K), triton.next_power_of_2(M)
    return [(bn, w) for bn, w in CONFIGS
            if max(bn, bm) * kp2 <= PER_THREAD * 32 * w and (w == 1 or kp2 >= 8 * 32 * w)]


@jit(do_not_specialize=["M"])
def _gemv_kernel(X, W, BIAS, R, Y, LNW, WG, WB, M, N, K, eps, ACT: tl.constexpr, HAS_LN: tl.constexpr,
                 HAS_GAMMA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, KP2: tl.constexpr, PDL: tl.constexpr):
    # A program holds its BN rows of W whole, K wide. They, the LayerNorm's weights and the bias never depend on
    # the previous kernel, so they are loaded before this program waits on it (PDL): the weights' trip from HBM
    # overlaps that kernel, and after the wait only the few input rows (in L2) are left to read.
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    nm = n < N
    k = tl.arange(0, KP2)
    km = k < K
    # The product is [rows, BN, K] and both operands are loaded in that shape, so the layouts Triton gives the loads
    # (K across the threads, 8 to a thread) serve the product as they are. A [BN, K] load broadcast later is re-laid
    # out through shared memory after the wait, the work this kernel exists to take off the critical path: with it a
    # gpt2-medium step of 4 rows took 0.7585 ms, without it 0.6843 (benchmarks/results/decode_gemv_h200_2026-11.md).
    w = tl.load(W + n.to(tl.int64)[None, :, None] * K + k[None, None, :], mask=nm[None, :, None] & km[None, None, :],
                other=0.0)
    if HAS_LN:  # the bias is in WB (fold_norm); masked columns are 0 in x and w, so they add nothing
        if HAS_GAMMA:
            g = tl.load(LNW + k, mask=km, other=0.0).to(tl.float32)
        wg = tl.load(WG + n, mask=nm, other=0.0)
        bias = tl.load(WB + n, mask=nm, other=0.0)
    elif HAS_BIAS:
        bias = tl.load(BIAS + n, mask=nm, other=0.0).to(tl.float32)
    pdl_enter(PDL)
    m = tl.arange(0, BM)
    mm = m < M
    full = mm[:, None, None] & km[None, None, :]
    x = tl.load(X + m.to(tl.int64)[:, None, None] * K + k[None, None, :], mask=full, other=0.0).to(tl.float32)
    out = m.to(tl.int64)[:, None] * N + n[None, :]
    om = mm[:, None] & nm[None, :]
    if HAS_RES:  # written in this replay, so after the wait; but with the input rows, not after the product: their
        # trips to L2 overlap, where a load after the reductions is a second trip in series
        res = tl.load(R + out, mask=om, other=0.0).to(tl.float32)
    if HAS_LN:
        # LayerNorm(x) W^T + b = rstd ((x - c) gamma W^T - mean_c W gamma) + W beta + b, with mean_c and rstd of
        # the row shifted by its first value c (no E[x^2] - mean^2 cancellation for a row far from 0). The row's
        # two sums and the product are three reductions of the same registers with no order between them, where
        # normalising first chained two reductions before the product's: gpt2-medium's step at 4 rows went from
        # 0.6761 to 0.6598 ms on the same routes (benchmarks/results/engine_limits_h200_2026-11.md).
        c = tl.load(X + m.to(tl.int64) * K, mask=mm, other=0.0).to(tl.float32)
        x = tl.where(full, x - c[:, None, None], 0.0)
        mean = tl.sum(x, 2) / K
        var = tl.maximum(tl.sum(x * x, 2) / K - mean * mean, 0.0)
        if HAS_GAMMA:  # gamma not folded into W (weights.fold): GPT-2's ln_f before the LM head tied to wte
            x = x * g[None, None, :]
        acc = tl.sum(x * w.to(tl.float32), 2)  # [rows, BN]: every row's sums in one reduction
        acc = (acc - mean * wg[None, :]) * (1.0 / tl.sqrt(var + eps))
    else:
        acc = tl.sum(x * w.to(tl.float32), 2)
    if HAS_LN or HAS_BIAS:
        acc += bias[None, :]
    acc = activate(acc, ACT)
    if HAS_RES:
        acc += res
    tl.store(Y + out, acc.to(Y.dtype.element_ty), mask=om)


def supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """A few contiguous fp16/bf16 rows against a row-major weight of the same dtype."""
    return (x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and 0 < x.shape[1] <= MAX_K and x.is_contiguous()
            and weight.is_contiguous() and x.dtype == weight.dtype and x.dtype in (torch.float16, torch.bfloat16)
            and x.shape[1] == weight.shape[1])


def fold_norm(weight: torch.Tensor, bias: torch.Tensor | None, gamma: torch.Tensor | None,
              beta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(W gamma, W beta + b), fp32 (N,): what the kernel's LayerNorm prologue needs of a projection and the LayerNorm
    before it, computed once per pair (ops.TritonOps.norm_linear keeps them on the Linear); gamma and beta None: a
    LayerNorm without weights (1 and 0). From the weights as stored, so that mean_c W gamma cancels the kernel's own
    sums."""
    w = weight.float()
    wg = w.sum(1) if gamma is None else w @ gamma.float()
    wb = torch.zeros_like(wg) if beta is None else w @ beta.float()
    return wg.contiguous(), (wb + (0.0 if bias is None else bias.float())).contiguous()


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: int = 0,
         residual: torch.Tensor | None = None, norm: tuple | None = None, cfg=CONFIGS[0],
         pdl: bool = True, sums: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """act(LayerNorm(x) W^T + bias) [+ residual] for x of at most MAX_ROWS rows; norm: (weight, bias, eps) of the
    LayerNorm (weight and bias None: none, weights.fold), or None (x as it is); sums: fold_norm's of this weight,
    bias and norm (computed here if None). act: an activation.ACT_* code. pdl: EngineOptions.pdl."""
    if not supported(x, weight) or (residual is not None and (not residual.is_contiguous()
                                                              or residual.shape != (x.shape[0], weight.shape[0]))):
        raise ValueError("shape/layout not supported by the GEMV")
    (M, K), N = x.shape, weight.shape[0]
    bn, num_warps = cfg
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    if norm is None:  # the kernel reads none of these
        gamma, eps, (wg, wb) = weight, 0.0, (weight, weight)
    else:
        gamma, eps = norm[0], norm[2]
        wg, wb = sums if sums is not None else fold_norm(weight, bias, norm[0], norm[1])
    _gemv_kernel[(triton.cdiv(N, bn),)](
        x, weight, bias if bias is not None else weight, residual if residual is not None else y, y,
        weight if gamma is None else gamma, wg, wb, M, N, K, float(eps), ACT=act, HAS_LN=norm is not None,
        HAS_GAMMA=gamma is not None, HAS_BIAS=bias is not None,
        HAS_RES=residual is not None, BM=triton.next_power_of_2(M), BN=bn, KP2=triton.next_power_of_2(K),
        num_warps=num_warps, **launch_options(x.device, pdl))
    return y
