"""Attention over the fused QKV buffer: dense (B, S), packed variable-length, and one-token decode.

The QKV GEMM writes (tokens, 3, heads, head_dim) rows; q, k and v are strided views of it, so no
transpose or contiguous copy runs before the attention kernel.
"""
from __future__ import annotations

import bisect
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .ops import AttnBound, Fp8Act, attention_scale, quantize_scaled
from .tuning import tuner

try:  # Triton is optional (see ops.py)
    from . import kernels as _kernels
except Exception:  # noqa: BLE001
    _kernels = None

_SDPA = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
         "efficient": SDPBackend.EFFICIENT_ATTENTION}


class Packing(NamedTuple):
    """Where the real tokens of a padded (B, S) batch live once packed into `tokens` rows."""

    B: int
    S: int
    gidx: torch.Tensor | None  # (Tp,) flat (b*S + s) source index of each packed row; spare rows read 0
    sidx: torch.Tensor | None  # (Tp,) destination in a (B*S + 1) buffer; spare rows go to the extra row B*S
    cu: torch.Tensor | None  # (B+2,) int32 cumulative lengths (spare rows last), the varlen kernels' bounds
    mask: torch.Tensor | None  # (B, S) bool, for the padded fallback
    max_len: int = 0  # bound on the longest sequence in cu (the spare-row one may exceed S)
    # Some sequence's first position is padding (left padding, an all-padding row): BertEngine's pooler reads that
    # position, which packing never computes.
    first_padded: bool = False

    @property
    def dense(self) -> bool:
        return self.gidx is None

    @property
    def tokens(self) -> int:
        return self.B * self.S if self.gidx is None else self.gidx.shape[0]


def token_ladder(top: int, step: int, growth: float, max_gap: int) -> list[int]:
    """Packed sizes up to `top` (a batch's B x S) for a server's graphs: multiples of `step`, each at most `growth`
    times the one below and at most `max_gap` above it (never less than one step), `top` last. A call of n real
    tokens runs the first size >= n, so its spare rows number fewer than max(n (growth - 1), step) and fewer than
    max(max_gap, step): with growth 1.25, step 128 and max_gap the width S, padding stays under a quarter of the
    tokens (or one step of 128, whichever is larger), and the spare rows, one extra sequence in the varlen
    attention (make_packing), never outgrow a real one. bert-base 32 x 512 on CUDA: 39 sizes where every
    multiple of 128 made 128 graphs."""
    gap_cap = max(step, max_gap // step * step)
    sizes, r = [], step
    while r < top:
        sizes.append(r)
        r = min(r + gap_cap, max(r + step, int(r * growth) // step * step))
    sizes.append(top)
    return sizes


def make_packing(mask: torch.Tensor | None, B: int, S: int, bucket: int, sizes: list[int] | None = None) -> Packing:
    """`sizes`: the packed sizes allowed (token_ladder, ascending, ending at B x S); None: multiples of `bucket`."""
    if mask is None:
        return Packing(B, S, None, None, None, None)
    m = mask.reshape(B, S)
    fast = _kernels is not None and m.is_cuda and S <= _kernels.PACK_MAX_S and B * S <= _kernels.PACK_MAX_TOKENS
    # The one host sync per call: the packed size decides the buffers (and the graph); the same read says how many
    # sequences have their first position real (BertEngine's pooler reads that position).
    if fast:  # two launches around the sync (kernels.PACK_MAX_S/_TOKENS say what the torch ops below cost on a GPU)
        cu, counts = _kernels.mask_counts(m)
        n, lead = counts.tolist()
    else:
        m = m.to(torch.bool)
        n, lead = torch.stack((m.sum(), m[:, 0].sum())).tolist()
    if n == B * S:
        return Packing(B, S, None, None, None, None)
    # Round the packed size up so that batches of similar total length share one captured graph.
    tp = sizes[bisect.bisect_left(sizes, n)] if sizes else min(B * S, -(-n // bucket) * bucket)
    # Spare rows form one extra sequence (of token-0 copies), so every row holds finite values: nothing
    # uninitialised can reach a per-tensor reduction such as the fp8 amax.
    if fast:
        gidx, sidx, m = _kernels.pack_rows(m, cu, n, tp)
    else:
        try:
            idx = torch.nonzero_static(m.flatten(), size=tp, fill_value=-1).squeeze(1)
        except (NotImplementedError, RuntimeError):  # builds without nonzero_static for this device
            idx = F.pad(m.flatten().nonzero().squeeze(1), (0, tp - n), value=-1)
        gidx = idx.clamp(min=0)
        sidx = torch.where(idx < 0, B * S, idx)
        cu = F.pad(m.sum(1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 1), value=tp)
        cu[0] = 0
    # max_len: a function of the graph key only
    return Packing(B, S, gidx, sidx, cu, m, max(S, min(tp, bucket)), lead < B)


def _sdpa(q, k, v, backend: str | None, **kw):
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    with sdpa_kernel(_SDPA[backend]):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def _split(buf: torch.Tensor, B: int, S: int, heads: int):
    D = buf.shape[-1] // (3 * heads)
    return buf.view(B, S, 3, heads, D).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, S, D), strided


def dense(qkv: torch.Tensor, B: int, S: int, heads: int, scale: float, causal: bool, bound: AttnBound | None = None):
    """(B*S, heads*D) attention output. bound (ops.TorchOps.attention_bound: the output projection runs in fp8):
    the routes also include our kernel writing the output in e4m3 instead, on ops.attention_scale's scales, as an
    Fp8Act (the projection's fp8 input); on the CPU that is the one route. The tuner races it in the whole forward
    (tuning.Tuner.refine's fp8 forward)."""
    q, k, v = _split(qkv, B, S, heads)

    def sdpa(backend):  # flash/cuDNN/efficient return (B, H, S, D) views of (B, S, H, D) memory: reshape is free
        return _sdpa(q, k, v, backend, is_causal=causal, scale=scale).transpose(1, 2).reshape(B * S, -1)

    if not qkv.is_cuda:
        if bound is None:
            return sdpa(None)
        s = attention_scale(bound, S)
        return Fp8Act(quantize_scaled(sdpa(None), s), s)
    cands = {n: (lambda n=n: sdpa(n)) for n in _SDPA}
    if _kernels is not None:
        for cfg in _kernels.ATTENTION_CONFIGS:
            cands["triton" + "x".join(map(str, cfg))] = lambda cfg=cfg: _kernels.attention(qkv, B, S, heads, scale,
                                                                                          causal, cfg)
            if bound is not None:
                cands["fp8+triton" + "x".join(map(str, cfg))] = lambda cfg=cfg: Fp8Act(
                    *_kernels.attention(qkv, B, S, heads, scale, causal, cfg, bound))
    form = "|fp8 output" if bound is not None else ""
    return cands[tuner().choose(f"dense|{B}x{S}x{heads}x{q.shape[-1]}|{qkv.dtype}|causal={causal}{form}", cands)]()


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


def attention(qkv: torch.Tensor, p: Packing, heads: int, scale: float, causal: bool, bound: AttnBound | None = None):
    """The attention output: a tensor, or (dense batches with a bound) possibly an Fp8Act (see dense)."""
    if p.dense:
        return dense(qkv, p.B, p.S, heads, scale, causal, bound)
    if not qkv.is_cuda:
        return _padded(qkv, p, heads, scale, causal)
    key = f"varlen|{p.B}x{p.S}x{p.tokens}x{heads}|{qkv.dtype}|causal={causal}"
    cands = {"flash_varlen": lambda: _varlen_flash(qkv, p, heads, scale, causal),
             "padded": lambda: _padded(qkv, p, heads, scale, causal)}
    return cands[tuner().choose(key, cands)]()
