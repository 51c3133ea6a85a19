"""Per-token fp8: [bias +] [GELU] then e4m3 rows with one fp32 scale each, the input of an fp8 GEMM; and the
row store that kernels producing such an input (layernorm.py) fuse. ops.quantize_rows is the torch reference."""
from __future__ import annotations

import torch

from .activation import activate
from .launch import jit, launch_options, pdl_enter, tl, triton, warps


@jit
def store_fp8_row(y, row, cols, m, N, Q, QS):
    # Per-token fp8 of one row held in fp32 registers: its max-abs maps to 448 (e4m3's largest finite value), one
    # fp32 scale per row. Fused into the kernel that produced the row, so no separate pass reads it again
    # (ops.quantize_rows is the reference; 1e-12 / 448 is its floor for an all-zero row).
    scale = tl.maximum(tl.max(tl.abs(tl.where(m, y, 0.0)), 0) / 448.0, 1e-12 / 448.0)
    tl.store(Q + row * N + cols, (y / scale).to(Q.dtype.element_ty), mask=m)
    tl.store(QS + row, scale)


@jit
def _quantize_rows_kernel(X, BIAS, Q, QS, N, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, BLOCK: tl.constexpr,
                          PDL: tl.constexpr):
    # One row per program, the whole row in registers: [bias +] [GELU] then per-row e4m3. With ACT it is the MLP's
    # middle (the fp8 GEMM's output -> bias + GELU -> the next fp8 GEMM's input): the activation is written once,
    # in one byte per element, and never in fp16.
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(X + row * N + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(BIAS + cols, mask=m, other=0.0).to(tl.float32)
    store_fp8_row(activate(x, ACT), row, cols, m, N, Q, QS)


def quantize_rows(x, bias=None, act: int = 0, pdl: bool = True):
    """act(x + bias) of 2-D x as (e4m3 data, (rows, 1) fp32 scales); act an activation.ACT_* (0 none, 1 exact GELU,
    2 tanh GELU). pdl: EngineOptions.pdl."""
    x = x.contiguous()
    n = x.shape[-1]
    q = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
    qs = torch.empty(x.shape[0], 1, device=x.device, dtype=torch.float32)
    block = triton.next_power_of_2(n)
    # At most 8 warps a row: 16 (what warps() gives a 4,096-wide row) ran 1.19x slower on an H100 (49,152 x 4,096:
    # 329 against 282 us, benchmarks/engine_bench.py --parts quant).
    _quantize_rows_kernel[(x.shape[0],)](x, bias if bias is not None else x, q, qs, n, HAS_BIAS=bias is not None,
                                         ACT=act, BLOCK=block, num_warps=min(8, warps(block)),
                                         **launch_options(x.device, pdl))
    return q, qs
