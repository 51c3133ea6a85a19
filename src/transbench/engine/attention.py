"""Attention over the fused QKV buffer, dense (B, S) or packed variable-length: each route (SDPA's kernels, ours
below, flash varlen, masked SDPA) chosen by the tuner per shape, and our Triton kernel that reads the QKV rows in
place and may write the output projection's e4m3 input. Decode steps: decode_attention.py.

The QKV GEMM writes (tokens, 3, heads, head_dim) rows; q, k and v are strided views of it, so no
transpose or contiguous copy runs before the attention kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .launch import AVAILABLE, jit, launch_options, pdl_enter, tl, triton
from .ops import AttnBound, Fp8Act, attention_scale, quantize_scaled
from .packing import Packing
from .tuning import Tuner
from .tuning import tuner as default_tuner

_SDPA = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
         "efficient": SDPBackend.EFFICIENT_ATTENTION}


def _sdpa(q, k, v, backend: str | None, **kw):
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    with sdpa_kernel(_SDPA[backend]):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def _split(buf: torch.Tensor, B: int, S: int, heads: int):
    D = buf.shape[-1] // (3 * heads)
    return buf.view(B, S, 3, heads, D).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, S, D), strided


def dense(qkv: torch.Tensor, B: int, S: int, heads: int, scale: float, causal: bool, bound: AttnBound | None = None,
          *, tuner: Tuner | None = None, pdl: bool = True):
    """(B*S, heads*D) attention output. bound (ops.TorchOps.attention_bound: the output projection runs in fp8):
    the routes also include our kernel writing the output in e4m3 instead, on ops.attention_scale's scales, as an
    Fp8Act (the projection's fp8 input); on the CPU that is the one route. The tuner races it in the whole forward
    (tuning.Tuner.refine's fp8 forward). tuner: the engine's, which chooses the route on CUDA (None: the process's
    tuner of the default table); pdl: EngineOptions.pdl."""
    q, k, v = _split(qkv, B, S, heads)

    def sdpa(backend):  # flash/cuDNN/efficient return (B, H, S, D) views of (B, S, H, D) memory: reshape is free
        return _sdpa(q, k, v, backend, is_causal=causal, scale=scale).transpose(1, 2).reshape(B * S, -1)

    if not qkv.is_cuda:
        if bound is None:
            return sdpa(None)
        s = attention_scale(bound, S)
        return Fp8Act(quantize_scaled(sdpa(None), s), s)
    cands = {n: (lambda n=n: sdpa(n)) for n in _SDPA}
    if AVAILABLE:
        for cfg in ATTENTION_CONFIGS:
            cands["triton" + "x".join(map(str, cfg))] = lambda cfg=cfg: triton_attention(
                qkv, B, S, heads, scale, causal, cfg, pdl=pdl)
            if bound is not None:
                cands["fp8+triton" + "x".join(map(str, cfg))] = lambda cfg=cfg: Fp8Act(
                    *triton_attention(qkv, B, S, heads, scale, causal, cfg, bound, pdl=pdl))
    form = "|fp8 output" if bound is not None else ""
    tuner = tuner or default_tuner()
    return cands[tuner.choose(f"dense|{B}x{S}x{heads}x{q.shape[-1]}|{qkv.dtype}|causal={causal}{form}", cands)]()


def _varlen_flash(qkv, p: Packing, heads, scale, causal):
    T, D = qkv.shape[0], qkv.shape[-1] // (3 * heads)
    q, k, v = qkv.view(T, 3, heads, D).unbind(1)
    out = torch.ops.aten._flash_attention_forward(q, k, v, p.cu, p.cu, p.max_len, p.max_len, 0.0, causal, False,
                                                  scale=scale)[0]
    return out.reshape(T, heads * D)


def _padded(qkv, p: Packing, heads, scale, causal):
    # Scatter to (B, S), masked SDPA, gather back: padding work in attention only.
    B, S = p.B, p.S
    buf = qkv.new_zeros(B * S + 1, qkv.shape[1]).index_copy_(0, p.sidx, qkv)[: B * S]
    q, k, v = _split(buf, B, S, heads)
    m = p.mask[:, None, None, :]
    if causal:
        m = m & torch.ones(S, S, dtype=torch.bool, device=qkv.device).tril()
    o = _sdpa(q, k, v, None, attn_mask=m, scale=scale).transpose(1, 2).reshape(B * S, -1)
    return F.pad(o, (0, 0, 0, 1))[p.sidx]


def attention(qkv: torch.Tensor, p: Packing, heads: int, scale: float, causal: bool, bound: AttnBound | None = None,
              *, tuner: Tuner | None = None, pdl: bool = True):
    """The attention output: a tensor, or (dense batches with a bound) possibly an Fp8Act (see dense). tuner and
    pdl: as dense's."""
    if p.dense:
        return dense(qkv, p.B, p.S, heads, scale, causal, bound, tuner=tuner, pdl=pdl)
    if not qkv.is_cuda:
        return _padded(qkv, p, heads, scale, causal)
    key = f"varlen|{p.B}x{p.S}x{p.tokens}x{heads}|{qkv.dtype}|causal={causal}"
    cands = {"flash_varlen": lambda: _varlen_flash(qkv, p, heads, scale, causal),
             "padded": lambda: _padded(qkv, p, heads, scale, causal)}
    return cands[(tuner or default_tuner()).choose(key, cands)]()


@jit
def _attend(base, rows, h, S, hi, qk_scale, H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr):
    # One head's softmax(q k^T) v for the query rows `rows` of one sequence (its QKV rows start at `base`), keys
    # below `hi`, in fp32: flash-style, online softmax over key blocks of BN, exp2 with log2(e) folded in qk_scale.
    stride: tl.constexpr = 3 * H * D
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(base + rows[:, None] * stride + h * D + d[None, :], mask=(rows < S)[:, None] & dm[None, :],
                other=0.0)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BLOCK_D], tl.float32)
    for start in range(0, hi, BN):
        cols = start + tl.arange(0, BN)
        kv_mask = (cols < S)[:, None] & dm[None, :]
        k = tl.load(base + cols[:, None] * stride + (H + h) * D + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, k.T) * qk_scale
        valid = (cols < S)[None, :]
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(base + cols[:, None] * stride + (2 * H + h) * D + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc / l_i[:, None]


@jit(do_not_specialize=["S"])  # one compile for every sequence length (S only bounds masks and loops)
def _attention_kernel(QKV, OUT, XS, QS, S, scale, gain, bias_q, H: tl.constexpr, D: tl.constexpr,
                      BLOCK_D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
                      QUANT: tl.constexpr, PDL: tl.constexpr):
    # Attention straight off the fused QKV rows (B*S, 3*H*D), output (B*S, H*D); program (query block, sequence x
    # head).
    pdl_enter(PDL)
    qb, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows, d = qb * BM + tl.arange(0, BM), tl.arange(0, BLOCK_D)
    hi = tl.minimum(S, (qb + 1) * BM) if CAUSAL else S
    o = _attend(QKV + b.to(tl.int64) * S * (3 * H * D), rows, h, S, hi, scale * 1.4426950408889634, H, D, BLOCK_D,
                BM, BN, CAUSAL)
    out = OUT + (b.to(tl.int64) * S + rows[:, None]) * (H * D) + h * D + d[None, :]
    inside = (rows < S)[:, None] & (d < D)[None, :]
    if QUANT:
        # The output projection's e4m3 input instead of the output, on a scale known before any head is done
        # (ops.attention_scale, the reference): a token's own max spans every head, which no one program has, and a
        # version in which the last of a query block's programs read the block back to find it cost 42 us more than
        # this kernel without QUANT (H100, 256 x 128 x 12 heads: 115 against 73 us). The sequence's largest QKV input
        # row scale bounds every value of V, and each output is a convex combination of V rows.
        xm = tl.zeros([BN], tl.float32)
        for start in range(0, S, BN):
            c = start + tl.arange(0, BN)
            xm = tl.maximum(xm, tl.load(XS + b.to(tl.int64) * S + c, mask=c < S, other=0.0))
        sc = tl.maximum(tl.max(xm, 0) * gain + bias_q, 1e-12 / 448.0)
        tl.store(out, tl.minimum(tl.maximum(o / sc, -448.0), 448.0).to(OUT.dtype.element_ty), mask=inside)
        if h == 0:
            tl.store(QS + b.to(tl.int64) * S + rows, tl.zeros([BM], tl.float32) + sc, mask=rows < S)
    else:
        tl.store(out, o.to(OUT.dtype.element_ty), mask=inside)


ATTENTION_CONFIGS = [(64, 64, 4), (128, 64, 8), (32, 64, 4)]  # (BM, BN, warps): each a route of dense()


def triton_attention(qkv, B, S, heads, scale, causal, cfg=ATTENTION_CONFIGS[0], bound=None, pdl: bool = True):
    """Our kernel: dense (B, S) attention over the fused QKV buffer (B*S, 3*heads*D) -> (B*S, heads*D) in qkv's
    dtype. bound (an ops.AttnBound: the output projection runs in fp8): the output in e4m3 instead, as (codes,
    (B*S, 1) fp32 scales), the fields of that projection's fp8 input (ops.Fp8Act), on ops.attention_scale's scales.
    pdl: EngineOptions.pdl."""
    D = qkv.shape[-1] // (3 * heads)
    bm, bn, warps, *stages = cfg  # (BM, BN, warps[, pipeline stages]; Triton's default without)
    qkv = qkv.contiguous()
    if bound is None:
        out = qkv.new_empty(B * S, heads * D)
        xs = qs = out
    else:
        out = torch.empty(B * S, heads * D, device=qkv.device, dtype=torch.float8_e4m3fn)
        qs = torch.empty(B * S, 1, device=qkv.device, dtype=torch.float32)
        xs = bound.x_scale.float().contiguous()
    _attention_kernel[(triton.cdiv(S, bm), B * heads)](
        qkv, out, xs, qs, S, scale, bound.gain if bound else 0.0, bound.bias_max / 448.0 if bound else 0.0,
        H=heads, D=D, BLOCK_D=max(16, triton.next_power_of_2(D)), BM=bm, BN=bn, CAUSAL=causal,
        QUANT=bound is not None, num_warps=warps, **dict(num_stages=stages[0]) if stages else {},
        **launch_options(qkv.device, pdl))
    return out if bound is None else (out, qs)
