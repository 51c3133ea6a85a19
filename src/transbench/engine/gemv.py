"""A few-row GEMV for decode steps, Y = act(LayerNorm(X) W^T + b) [+ residual], in one kernel.

At one to a few tokens a projection is the time to stream its weights, and a decode step of gpt2 ran 8 kernels a
layer at about 3.7 us each (benchmarks/results/engine_limits_h200_2026-11.md): cuBLAS's GEMV, then a LayerNorm, GELU
or residual add of its own. Here the LayerNorm that precedes a pre-LN projection is this kernel's prologue (each
program normalises the few input rows itself: they are a few KiB, read from L2) and the bias, GELU and residual its
epilogue, so a GPT-2 layer is five kernels: QKV, attention, output projection, FC1, FC2. Each program holds its
slice of the weights whole, fetched before it waits on the previous kernel (see the kernel). Launched on CUDA only (and
in Triton's CPU interpreter by the tests); ops.TorchOps.norm_linear is the reference.
"""
from __future__ import annotations

import torch

from .activation import activate
from .launch import jit, launch_options, pdl_enter, scratch, tl, triton

# Rows (tokens) up to which the GEMV is offered: past a few rows the tensor-core GEMMs (gemm.py) read each weight
# once for many rows, where this kernel's FMA work would be compute-bound.
MAX_ROWS = 8
# Widest input (K, rounded up to a power of two) a program holds whole: a GPT-2 up to gpt2-xl's FC2 (6,400).
MAX_K = 8192
# (BN output rows of W a program, warps, SPLIT programs over K), the likeliest first (tuning.rule_route takes the
# first that fits). Small BN gives the few-column layers (768 outputs) enough programs to fill every SM.
CONFIGS = [(bn, w, 1) for bn, w in [(4, 4), (2, 4), (8, 4), (4, 8), (2, 8), (1, 4), (8, 8), (16, 4), (16, 8), (32, 8),
                                    (4, 16), (8, 16), (4, 2), (8, 2), (2, 2), (2, 1), (4, 1), (8, 1)]]
# Split over K, for projections without a LayerNorm (whose statistics need the whole row): a program of one slice
# holds all M input rows K wide, in fp32, beside its weights, and reads them from L2 after its wait. At 4 rows of
# gpt2-medium's FC2 (K = 4,096) that is 64 KiB of registers a program, twice its weight slice, and as many bytes read
# from L2 as from HBM. A program of 1/SPLIT of K holds 1/SPLIT of the rows; the last of a column tile's programs
# to finish adds their partial sums in a fixed order (deterministic) and applies the epilogue.
CONFIGS += [(bn, w, s) for s in (2, 4, 8) for bn, w in [(8, 4), (4, 4), (8, 8), (4, 8), (8, 2), (4, 2), (8, 1), (4, 1)]]
# Values a thread may hold of the program's weight slice (fp16/bf16) and of its input rows (fp32): configs() drops
# the configs past them, which would spill registers.
PER_THREAD = 64


def configs(M: int, K: int, norm: bool = False) -> list[tuple[int, int, int]]:
    """The configs whose weight slice and input rows fit in registers for M rows of K, in CONFIGS' order; with a
    LayerNorm (norm), the unsplit ones only. Each thread of a program of several warps takes at least one 8-wide
    vector of a row: with more threads than that, Triton spreads some warps over the rows and re-lays the slice out
    through shared memory (the kernel says why that costs)."""
    kp2, bm = triton.next_power_of_2(K), triton.next_power_of_2(M)
    return [(bn, w, s) for bn, w, s in CONFIGS
            if (s == 1 or not norm) and kp2 // s >= 8 and max(bn, bm) * (kp2 // s) <= PER_THREAD * 32 * w
            and (w == 1 or kp2 // s >= 8 * 32 * w)]


@jit
def _epilogue(acc, n, nm, m, mm, bias, R, Y, N, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr):
    if HAS_BIAS:
        acc += bias[None, :]
    acc = activate(acc, ACT)
    out = m.to(tl.int64)[:, None] * N + n[None, :]
    om = mm[:, None] & nm[None, :]
    if HAS_RES:
        acc += tl.load(R + out, mask=om, other=0.0).to(tl.float32)
    tl.store(Y + out, acc.to(Y.dtype.element_ty), mask=om)


@jit(do_not_specialize=["M"])
def _gemv_kernel(X, W, BIAS, R, Y, LNW, LNB, PART, COUNT, M, N, K, eps, ACT: tl.constexpr, HAS_LN: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr):
    # Program (column tile j, slice s of K) holds its BN rows of W, BK wide, whole. They, the LayerNorm's weights and
    # the bias never depend on the previous kernel, so they are loaded before this program waits on it (PDL): the
    # weights' trip from HBM overlaps that kernel, and after the wait only the few input rows (in L2) are left to
    # read. HAS_LN only with SPLIT == 1 (configs()): the LayerNorm needs the whole row.
    j, s = tl.program_id(0), tl.program_id(1)
    n = j * BN + tl.arange(0, BN)
    nm = n < N
    k = s * BK + tl.arange(0, BK)
    km = k < K
    # The product is [rows, BN, BK] and both operands are loaded in that shape, so the layouts Triton gives the
    # loads (K across the threads, 8 to a thread) serve the product as they are. A [BN, K] load broadcast later is
    # re-laid out through shared memory after the wait, the work this kernel exists to take off the critical path:
    # with it a gpt2-medium step of 4 rows took 0.7585 ms, without it 0.6843
    # (benchmarks/results/decode_gemv_h200_2026-11.md).
    w = tl.load(W + n.to(tl.int64)[None, :, None] * K + k[None, None, :], mask=nm[None, :, None] & km[None, None, :],
                other=0.0)
    if HAS_LN:  # masked columns: weight and bias 0, so they add nothing
        g = tl.load(LNW + k, mask=km, other=0.0).to(tl.float32)
        gb = tl.load(LNB + k, mask=km, other=0.0).to(tl.float32)
    bias = tl.zeros([BN], tl.float32)
    if HAS_BIAS:
        bias = tl.load(BIAS + n, mask=nm, other=0.0).to(tl.float32)
    pdl_enter(PDL)
    m = tl.arange(0, BM)
    mm = m < M
    full = mm[:, None, None] & km[None, None, :]
    x = tl.load(X + m.to(tl.int64)[:, None, None] * K + k[None, None, :], mask=full, other=0.0).to(tl.float32)
    if HAS_LN:  # two passes over the rows in registers: no E[x^2] - mean^2 cancellation
        mean = tl.sum(x, 2) / K
        d = tl.where(full, x - mean[:, :, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, 2) / K + eps)
        x = d * rstd[:, :, None] * g[None, None, :] + gb[None, None, :]
    acc = tl.sum(x * w.to(tl.float32), 2)  # [rows, BN]: every row's sums in one reduction
    if SPLIT == 1:
        _epilogue(acc, n, nm, m, mm, bias, R, Y, N, ACT, HAS_BIAS, HAS_RES)
    else:
        # The tile's partial sums, [SPLIT, BM, BN] in the scratch; its last program adds them up in slice order.
        tile = PART + j.to(tl.int64) * (SPLIT * BM * BN)
        at = m[:, None] * BN + tl.arange(0, BN)[None, :]
        tl.store(tile + s * (BM * BN) + at, acc)
        tl.debug_barrier()  # every thread's share is written before this program announces itself
        if tl.atomic_add(COUNT + j, 1, sem="acq_rel") == SPLIT - 1:
            parts = tl.load(tile + tl.arange(0, SPLIT)[:, None, None] * (BM * BN) + at[None, :, :],
                            cache_modifier=".cg")
            _epilogue(tl.sum(parts, 0), n, nm, m, mm, bias, R, Y, N, ACT, HAS_BIAS, HAS_RES)
            tl.store(COUNT + j, 0)  # zero again for the next call (scratch's contract)


def supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """A few contiguous fp16/bf16 rows against a row-major weight of the same dtype."""
    return (x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and 0 < x.shape[1] <= MAX_K and x.is_contiguous()
            and weight.is_contiguous() and x.dtype == weight.dtype and x.dtype in (torch.float16, torch.bfloat16)
            and x.shape[1] == weight.shape[1])


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: int = 0,
         residual: torch.Tensor | None = None, norm: tuple | None = None, cfg=CONFIGS[0],
         pdl: bool = True) -> torch.Tensor:
    """act(LayerNorm(x) W^T + bias) [+ residual] for x of at most MAX_ROWS rows; norm: (weight, bias, eps) of the
    LayerNorm, or None (x as it is). act: an activation.ACT_* code. pdl: EngineOptions.pdl."""
    if not supported(x, weight) or (residual is not None and (not residual.is_contiguous()
                                                              or residual.shape != (x.shape[0], weight.shape[0]))):
        raise ValueError("shape/layout not supported by the GEMV")
    (M, K), N = x.shape, weight.shape[0]
    bn, num_warps, split = cfg
    if split > 1 and norm is not None:
        raise ValueError("a LayerNorm needs the whole row: a split GEMV takes none")
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    lnw, lnb, eps = norm if norm is not None else (weight, weight, 0.0)
    tiles, bm = triton.cdiv(N, bn), triton.next_power_of_2(M)
    part, count = ((scratch(x.device, torch.float32, tiles * split * bm * bn), scratch(x.device, torch.int32, tiles))
                   if split > 1 else (y, y))
    _gemv_kernel[(tiles, split)](
        x, weight, bias if bias is not None else weight, residual if residual is not None else y, y, lnw, lnb,
        part, count, M, N, K, float(eps), ACT=act, HAS_LN=norm is not None, HAS_BIAS=bias is not None,
        HAS_RES=residual is not None, BM=bm, BN=bn, BK=triton.next_power_of_2(K) // split, SPLIT=split,
        num_warps=num_warps, **launch_options(x.device, pdl))
    return y
