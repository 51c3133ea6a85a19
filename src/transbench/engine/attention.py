"""Attention over the fused QKV buffer: dense (B, S), packed variable-length, and one-token decode.

The QKV GEMM writes (tokens, 3, heads, head_dim) rows; q, k and v are strided views of it, so no
transpose or contiguous copy runs before the attention kernel.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .tuning import tuner

_SDPA = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
         "efficient": SDPBackend.EFFICIENT_ATTENTION}


class Packing(NamedTuple):
    """Where the real tokens of a padded (B, S) batch live once packed into `tokens` rows."""

    B: int
    S: int
    gidx: torch.Tensor | None  # (Tp,) flat (b*S + s) source index of each packed row; spare rows read 0
    sidx: torch.Tensor | None  # (Tp,) destination in a (B*S + 1) buffer; spare rows go to the extra row B*S
    cu: torch.Tensor | None  # (B+1,) int32 cumulative real lengths, the varlen kernels' sequence bounds
    mask: torch.Tensor | None  # (B, S) bool, for the padded fallback

    @property
    def dense(self) -> bool:
        return self.gidx is None

    @property
    def tokens(self) -> int:
        return self.B * self.S if self.gidx is None else self.gidx.shape[0]


def make_packing(mask: torch.Tensor | None, B: int, S: int, bucket: int) -> Packing:
    if mask is None:
        return Packing(B, S, None, None, None, None)
    m = mask.reshape(B, S).to(torch.bool)
    n = int(m.sum())  # the one host sync per call: the packed size decides the buffers (and the graph)
    if n == B * S:
        return Packing(B, S, None, None, None, None)
    # Round the packed size up so that batches of similar total length share one captured graph.
    tp = min(B * S, -(-n // bucket) * bucket)
    try:
        idx = torch.nonzero_static(m.flatten(), size=tp, fill_value=-1).squeeze(1)
    except (NotImplementedError, RuntimeError):  # builds without nonzero_static for this device
        idx = F.pad(m.flatten().nonzero().squeeze(1), (0, tp - n), value=-1)
    gidx = idx.clamp(min=0)
    sidx = torch.where(idx < 0, B * S, idx)
    cu = F.pad(m.sum(1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0))
    return Packing(B, S, gidx, sidx, cu, m)


def _sdpa(q, k, v, backend: str | None, **kw):
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    with sdpa_kernel(_SDPA[backend]):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def dense(self) -> bool:
        return self.gidx is None

    @property
    def tokens(self) -> int:
        return self.B * self.S if self.gidx is None else self.gidx.shape[0]


def make_packing(mask: torch.Tensor | None, B: int, S: int, bucket: int) -> Packing:
    if mask is None:
        return Packing(B, S, None, None, None, None)
    m = mask.reshape(B, S).to(torch.bool)
    n = int(m.sum())  # the one host sync per call: the packed size decides the buffers (and the graph)
    if n == B * S:
        return Packing(B, S, None, None, None, None)
    # Round the packed size up so that batches of similar total length share one captured graph.
    tp = min(B * S, -(-n // bucket) * bucket)
    try:
        idx = torch.nonzero_static(m.flatten(), size=tp, fill_value=-1).squeeze(1)
    except (NotImplementedError, RuntimeError):  # builds without nonzero_static for this device
        idx = F.pad(m.flatten().nonzero().squeeze(1), (0, tp - n), value=-1)
    gidx = idx.clamp(min=0)
    sidx = torch.where(idx < 0, B * S, idx)
    cu = F.pad(m.sum(1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0))
    return Packing(B, S, gidx, sidx, cu, m)


def _sdpa(q, k, v, backend: str | None, **kw):
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    with sdpa_kernel(_SDPA[backend]):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def _tuned(key: str, candidates: dict):
    """Run the fastest candidate for this shape (CUDA); on CPU the first one (plain SDPA)."""
    first = next(iter(candidates.values()))
    if not next(iter(candidates.values())).__self__.is_cuda if hasattr(first, "__self__") else False:
        return first()
    return candidates[tuner().choose(key, candidates)]()


def dense(qkv: torch.Tensor, B: int, S: int, heads: int, scale: float, causal: bool) -> torch.Tensor:
    D = qkv.shape[-1] // (3 * heads)
    q, k, v = qkv.view(B, S, 3, heads, D).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, S, D), strided
    if not qkv.is_cuda:
        o = _sdpa(q, k, v, None, is_causal=causal, scale=scale)
    else:
        key = f"dense|{B}x{S}x{heads}x{D}|{qkv.dtype}|causal={causal}"
        cands = {n: (lambda n=n: _sdpa(q, k, v, n, is_causal=causal, scale=scale)) for n in _SDPA}
        o = cands[tuner().choose(key, cands)]()
    # flash/cuDNN/efficient return (B, H, S, D) views of (B, S, H, D) memory: this reshape is free.
    return o.transpose(1, 2).reshape(B * S, heads * D)


def _varlen_flash(qkv, p: Packing, heads, scale, causal):
    T, D = qkv.shape[0], qkv.shape[-1] // (3 * heads)
    q, k, v = qkv.view(T, 3, heads, D).unbind(1)
    # Spare rows past cu[-1] are never read nor written by the kernel; their garbage stays in spare rows.
    out = torch.ops.aten._flash_attention_forward(q, k, v, p.cu, p.cu, p.S, p.S, 0.0, causal, False, scale=scale)[0]
    return out.reshape(T, heads * D)


def _padded(qkv, p: Packing, heads, scale, causal):
    # Scatter to (B, S), masked SDPA, gather back: padding work in attention only.
    B, S, T = p.B, p.S, qkv.shape[0]
    D = qkv.shape[-1] // (3 * heads)
    buf = qkv.new_zeros(B * S + 1, qkv.shape[1]).index_copy_(0, p.sidx, qkv)[: B * S]
    q, k, v = buf.view(B, S, 3, heads, D).permute(2, 0, 3, 1, 4).unbind(0)
    m = p.mask[:, None, None, :]
    if causal:
        m = m & torch.ones(S, S, dtype=torch.bool, device=qkv.device).tril()
    o = _sdpa(q, k, v, None, attn_mask=m, scale=scale).transpose(1, 2).reshape(B * S, heads * D)
    return F.pad(o, (0, 0, 0, 1))[p.sidx]


def varlen(qkv: torch.Tensor, p: Packing, heads: int, scale: float, causal: bool) -> torch.Tensor:
    if not qkv.is_cuda:
        return _padded(qkv, p, heads, scale, causal)
    key = f"varlen|{p.B}x{p.S}x{p.tokens}x{heads}|{qkv.dtype}|causal={causal}"
    cands = {"flash_varlen": lambda: _varlen_flash(qkv, p, heads, scale, causal),
             "padded": lambda: _padded(qkv, p, heads, scale, causal)}
    return cands[tuner().choose(key, cands)]()


def attention(qkv: torch.Tensor, p: Packing, heads: int, scale: float, causal: bool) -> torch.Tensor:
    if p.dense:
        return dense(qkv, p.B, p.S, heads, scale, causal)
    return varlen(qkv, p, heads, scale, causal)
