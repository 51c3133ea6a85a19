"""GELU: the bias + GELU kernel that follows a GEMM whose epilogue cannot take it, and the GELU math the fused
kernels share (gemm.py's epilogue, quantize.py's pass)."""
from __future__ import annotations

from .launch import jit, launch_options, pdl_enter, tl, triton, warps

ACT_NONE, ACT_GELU, ACT_GELU_TANH = 0, 1, 2  # the ACT constexpr of the kernels that fuse an activation


@jit
def erf(x):
    # Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7 (about one fp32 ulp of the result, far under fp16/bf16
    # rounding): an exp and a reciprocal instead of libdevice's erf, whose cost in the epilogue of a
    # 128 x 256 tile rivals the tile's matrix work (gemm.py), and which held the fp8 quantize pass (quantize.py)
    # at 1.27 TB/s (H100, benchmarks/engine_bench.py --parts quant: 32,768 x 3,072 in 238 us, 186 with this).
    a = tl.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    y = 1.0 - p * tl.exp(-a * a)
    return tl.where(x < 0, -y, y)


@jit
def activate(x, ACT: tl.constexpr):
    """ACT_GELU (exact, on erf above) or ACT_GELU_TANH of fp32 x; ACT_NONE: x."""
    if ACT == 1:
        return 0.5 * x * (1.0 + erf(x * 0.7071067811865476))
    if ACT == 2:  # 0.5 * (1 + tanh(u)) == sigmoid(2u): avoids a libdevice tanh
        return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    return x


@jit
def _bias_gelu_kernel(X, BIAS, Y, N, TANH: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # 2-D grid (row, column block) so the bias index needs no per-element modulo.
    pdl_enter(PDL)
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


def bias_gelu(x, bias, tanh: bool, pdl: bool = True):
    """GELU(x + bias) over the last dimension, in place in x (the GEMM output is dead after the activation, so no
    second buffer is needed); tanh: the tanh form. pdl: EngineOptions.pdl."""
    n = x.shape[-1]
    x = x.contiguous()
    x2 = x.view(-1, n)
    block = min(1024, triton.next_power_of_2(n))
    _bias_gelu_kernel[(x2.shape[0], triton.cdiv(n, block))](x2, bias, x2, n, TANH=tanh, BLOCK=block,
                                                          num_warps=warps(block), **launch_options(x.device, pdl))
    return x
