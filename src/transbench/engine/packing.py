"""Packing a padded (B, S) batch's real tokens into consecutive rows: where each lives (Packing), from the attention
mask, by two Triton launches around the call's one host sync on CUDA and by torch ops elsewhere."""
from __future__ import annotations

import bisect

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .launch import AVAILABLE, jit, tl, triton

# The padding path's index arithmetic in two launches around its one host sync. As torch ops it was 22 kernels and
# copies, each paying the host's dispatch: on an H100 a right-padded bert-base call cost 0.8134 ms at 1 x 128 against
# 0.4024 with no mask, 1.2919 against 0.6548 at 8 x 128 (benchmarks/studies/packing_cost.py).
PACK_MAX_S = 8192  # one program holds a row (and two rows of the mask a step in the count): longer rows use torch
# mask_counts is one program, so its time grows with the mask while torch's reductions spread over the SMs. H100,
# make_packing alone (benchmarks/studies/packing_cost.py, benchmarks/results/host_bound_h100_2026-11.md), Triton
# against torch ops, padded / all-ones mask:
# 256 x 512 229 / 126 us against 503 / 91, 1024 x 128 257 / 195 against 353 / 141, 4096 x 128 545 / 480 against
# 497 / 136. Masks of more elements than this use the torch ops.
PACK_MAX_TOKENS = 1 << 18


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
    attention (make_packing), never outgrow a real one. bert-base 32 x 512 on CUDA: 40 sizes where every
    multiple of 128 made 128 graphs."""
    gap_cap = max(step, max_gap // step * step)
    sizes, r = [], step
    while r < top:
        sizes.append(r)
        r = min(r + gap_cap, max(r + step, int(r * growth) // step * step))
    sizes.append(top)
    return sizes


def reuse_sizes(sizes: list[int], captured) -> list[int]:
    """The packed sizes a call may run when it should reuse a captured graph rather than capture one: the captured
    sizes, then the ladder above the largest of them (a call larger than every captured graph still captures its
    own). A server under load pads a batch up to the next captured size: on an H100 the fused server's first cell,
    80 of its 88 shapes left to first use, had p99 77.9 ms at 1,000 requests/s against 4.1 ms at 3,000/s in the
    next cell with 59 prepared (benchmarks/results/http_serving_h100_2026-11.md): each capture under load stalls
    the batches queued behind it for far longer than padding costs."""
    have = sorted(set(captured) & set(sizes))
    if not have:
        return list(sizes)
    return have + [s for s in sizes if s > have[-1]]


def make_packing(mask: torch.Tensor | None, B: int, S: int, bucket: int, max_s: int = PACK_MAX_S,
                 max_tokens: int = PACK_MAX_TOKENS, sizes: list[int] | None = None) -> Packing:
    """The packing of a (B, S) mask (None: dense), its packed size rounded up to a multiple of `bucket`. On CUDA,
    masks of at most max_s columns and max_tokens elements (EngineOptions.pack_max_s, pack_max_tokens) take the
    Triton kernels, larger ones the torch ops."""
    if mask is None:
        return Packing(B, S, None, None, None, None)
    m = mask.reshape(B, S)
    fast = AVAILABLE and m.is_cuda and S <= max_s and B * S <= max_tokens
    # The one host sync per call: the packed size decides the buffers (and the graph); the same read says how many
    # sequences have their first position real (BertEngine's pooler reads that position).
    if fast:  # two launches around the sync (PACK_MAX_S/_TOKENS say what the torch ops below cost on a GPU)
        cu, counts = mask_counts(m)
        n, lead = counts.tolist()
    else:
        m = m.to(torch.bool)
        n, lead = torch.stack((m.sum(), m[:, 0].sum())).tolist()
    if n == B * S:
        return Packing(B, S, None, None, None, None)
    # Round the packed size up so that batches of similar total length share one captured graph.
    # `sizes`: the packed sizes allowed (token_ladder, ascending, ending at B x S); None: multiples of `bucket`
    tp = sizes[bisect.bisect_left(sizes, n)] if sizes else min(B * S, -(-n // bucket) * bucket)
    # Spare rows form one extra sequence (of token-0 copies), so every row holds finite values: nothing
    # uninitialised can reach a per-tensor reduction such as the fp8 amax.
    if fast:
        gidx, sidx, m = pack_rows(m, cu, n, tp)
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


@jit(do_not_specialize=["B", "S", "stride_b", "stride_s"])
def _mask_counts_kernel(M, CU, COUNTS, B, S, stride_b, stride_s, RB: tl.constexpr, SB: tl.constexpr):
    # One program walks the (B, S) mask RB rows a step: each row's real-token count, their running sum into CU[1:B+1]
    # (CU[0] = 0), and into COUNTS the total and how many rows have a real first position.
    cols = tl.arange(0, SB)
    total = tl.sum(tl.zeros((RB,), dtype=tl.int32), axis=0)
    lead = total
    for r0 in range(0, B, RB):
        rows = r0 + tl.arange(0, RB)
        inside = (rows < B)[:, None] & (cols < S)[None, :]
        m = (tl.load(M + rows[:, None] * stride_b + cols[None, :] * stride_s, mask=inside, other=0) != 0).to(tl.int32)
        lens = tl.sum(m, axis=1)
        tl.store(CU + 1 + rows, total + tl.cumsum(lens, axis=0), mask=rows < B)
        total += tl.sum(lens, axis=0)
        lead += tl.sum(tl.sum(tl.where(cols[None, :] == 0, m, 0), axis=1), axis=0)
    tl.store(CU, 0)
    tl.store(COUNTS, total)
    tl.store(COUNTS + 1, lead)


@jit(do_not_specialize=["B", "S", "stride_b", "stride_s", "n", "tp"])
def _pack_rows_kernel(M, CU, GIDX, SIDX, MASK, B, S, stride_b, stride_s, n, tp, SB: tl.constexpr):
    # Program b < B: row b's real positions, in order, to rows CU[b]... of the packed layout (GIDX: their flat b*S + s
    # source index; SIDX: the same, their destination when unpacked) and the row as bool into MASK. Program B: the
    # spare rows n..tp-1 (fewer than make_packing's bucket) read row 0 and unpack to the extra row B*S (make_packing
    # says why), and CU[B+1] = tp.
    b = tl.program_id(0)
    if b < B:
        cols = tl.arange(0, SB)
        real = tl.load(M + b * stride_b + cols * stride_s, mask=cols < S, other=0) != 0
        one = real.to(tl.int32)
        dst = tl.load(CU + b) + tl.cumsum(one, axis=0) - one
        src = b.to(tl.int64) * S + cols
        tl.store(GIDX + dst, src, mask=real)
        tl.store(SIDX + dst, src, mask=real)
        tl.store(MASK + b.to(tl.int64) * S + cols, real, mask=cols < S)
    else:
        for k0 in range(n, tp, 128):
            k = k0 + tl.arange(0, 128)
            tl.store(GIDX + k, tl.zeros((128,), dtype=tl.int64), mask=k < tp)
            tl.store(SIDX + k, tl.zeros((128,), dtype=tl.int64) + B * S, mask=k < tp)
        tl.store(CU + B + 1, tp)


def mask_counts(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) mask (any dtype, nonzero = real) -> (cu (B+2,) int32 with cu[1:B+1] the running real-token counts,
    counts (2,) int32: the total and the rows whose first position is real). One launch, no sync."""
    B, S = mask.shape
    sb = max(16, triton.next_power_of_2(S))
    buf = torch.empty(B + 4, device=mask.device, dtype=torch.int32)  # one allocation: each costs host time here
    cu, counts = buf[: B + 2], buf[B + 2:]
    _mask_counts_kernel[(1,)](mask, cu, counts, B, S, *mask.stride(), RB=max(2, 4096 // sb), SB=sb, num_warps=8)
    return cu, counts


def pack_rows(mask: torch.Tensor, cu: torch.Tensor, n: int, tp: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gidx, sidx, bool mask) of make_packing for n real tokens packed into tp rows (cu from mask_counts, its last
    entry set here). One launch."""
    B, S = mask.shape
    gidx = torch.empty(tp, device=mask.device, dtype=torch.int64)
    sidx = torch.empty(tp, device=mask.device, dtype=torch.int64)
    m = torch.empty(B, S, device=mask.device, dtype=torch.bool)
    _pack_rows_kernel[(B + 1,)](mask, cu, gidx, sidx, m, B, S, *mask.stride(), n, tp,
                                SB=max(16, triton.next_power_of_2(S)), num_warps=4)
    return gidx, sidx, m
