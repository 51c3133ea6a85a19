"""One-token decode attention (GPT-2 generation): the new token's k and v written into the static KV cache and
its attention over the positions so far, in one flash-decoding kernel. ops.TorchOps.decode_attention is the
reference."""
from __future__ import annotations

import torch

from .launch import jit, launch_options, pdl_enter, scratch, tl, triton

# (rows a chunk holds at least, rows a tile, warps), the likeliest first: ops.TritonOps.decode_attention races them
# (tuning.rule_route takes the first that fits). One warp reduces a tile's dot products and softmax sums within the
# warp, where four pass them through shared memory: in the decode step's graph one warp ran gpt2-medium's step at
# batch 4 in 0.6506 ms against 0.7140 with four, gpt2's at batch 1 in 0.1758 against 0.1826
# (benchmarks/results/engine_limits_h200_2026-11.md).
CONFIGS = [(64, 64, 1), (32, 32, 1), (64, 64, 2), (128, 128, 4), (64, 64, 4)]
# fp16/bf16 values of the key and value tiles a thread may hold: configs() drops the configs past it.
PER_THREAD = 256


@jit
def _attend_tile(q, k, v, jm, m_i, l_i, acc):
    # One tile of cached rows folded into the running softmax (m_i, l_i) and its weighted sum acc.
    s = tl.where(jm, tl.sum(k.to(tl.float32) * q[None, :], 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)


@jit
def _decode_attention_kernel(QKV, K, V, POS, OUT, PART, ARRIVED, L, scale, H: tl.constexpr, D: tl.constexpr,
                             BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                             CHUNKS_P2: tl.constexpr, PDL: tl.constexpr):
    # Flash-decoding: program (sequence x head, chunk of the cache). At batch 1 one program per head would
    # leave most SMs idle and walk the cache serially. The position comes from device memory, so one graph
    # serves every step; chunks past it return at once. The last program of a head to finish merges the
    # chunks' partial softmaxes, and resets its arrival counter.
    bh, c = tl.program_id(0), tl.program_id(1)
    chunks = tl.num_programs(1)
    b, h = bh // H, bh % H
    # The position and the cached rows before it were written before this replay began (the position's fill or
    # the step's input copied in before it, earlier steps' attention), so the chunk's first tile is loaded before
    # waiting on the previous kernel (PDL, launch.pdl_enter): its trip from HBM overlaps the kernels before.
    pos = tl.load(POS)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    cache = bh.to(tl.int64) * L * D
    start = c * CHUNK
    j = start + tl.arange(0, BLOCK)
    jm = (j < pos) & (j < start + CHUNK)
    offs = cache + j[:, None] * D + d[None, :]
    k_first = tl.load(K + offs, mask=jm[:, None] & dm[None, :], other=0.0)
    v_first = tl.load(V + offs, mask=jm[:, None] & dm[None, :], other=0.0)
    pdl_enter(PDL)
    row = QKV + b * (3 * H * D) + h * D
    q = tl.load(row + d, mask=dm, other=0.0).to(tl.float32) * scale
    # The chunk holding pos writes the new k, v there and seeds its softmax with them from registers: every
    # program reads only rows < pos, never the row being written.
    own = (pos >= start) & (pos < start + CHUNK)
    at = pos + d * 0  # pos per element: masks are built element-wise
    new_m = dm & (at >= start) & (at < start + CHUNK)
    k_new = tl.load(row + H * D + d, mask=new_m, other=0.0)
    v_new = tl.load(row + 2 * H * D + d, mask=new_m, other=0.0)
    tl.store(K + cache + pos * D + d, k_new, mask=new_m)
    tl.store(V + cache + pos * D + d, v_new, mask=new_m)
    m_i = tl.where(own, tl.sum(q * k_new.to(tl.float32), 0), -1e30)  # finite: empty chunks stay NaN-free
    l_i = tl.where(own, 1.0, 0.0)
    m_i, l_i, acc = _attend_tile(q, k_first, v_first, jm, m_i, l_i, v_new.to(tl.float32))
    for off in range(start + BLOCK, tl.minimum(start + CHUNK, pos), BLOCK):
        rows = off + tl.arange(0, BLOCK)
        rm = (rows < pos) & (rows < start + CHUNK)
        at_rows = cache + rows[:, None] * D + d[None, :]
        k = tl.load(K + at_rows, mask=rm[:, None] & dm[None, :], other=0.0)
        v = tl.load(V + at_rows, mask=rm[:, None] & dm[None, :], other=0.0)
        m_i, l_i, acc = _attend_tile(q, k, v, rm, m_i, l_i, acc)
    part = PART + (bh * chunks + c) * (BLOCK_D + 2)
    tl.store(part + d, acc)
    tl.store(part + BLOCK_D, m_i)
    tl.store(part + BLOCK_D + 1, l_i)
    tl.debug_barrier()  # every thread's share of the partial is written before this program announces itself
    if tl.atomic_add(ARRIVED + bh, 1, sem="acq_rel") == chunks - 1:
        cs = tl.arange(0, CHUNKS_P2)
        cm = cs < chunks
        parts = PART + (bh * chunks + cs) * (BLOCK_D + 2)
        ms = tl.load(parts + BLOCK_D, mask=cm, other=-1e30, cache_modifier=".cg")
        w = tl.exp(ms - tl.max(ms, 0))
        ls = tl.load(parts + BLOCK_D + 1, mask=cm, other=0.0, cache_modifier=".cg")
        accs = tl.load(parts[:, None] + d[None, :], mask=cm[:, None], other=0.0, cache_modifier=".cg")
        out = tl.sum(w[:, None] * accs, 0) / tl.sum(w * ls, 0)
        tl.store(OUT + b * (H * D) + h * D + d, out.to(OUT.dtype.element_ty), mask=dm)
        tl.store(ARRIVED + bh, 0)


def configs(D: int) -> list[tuple[int, int, int]]:
    """The configs whose key and value tiles fit a thread's registers at head size D, in CONFIGS' order; the last of
    CONFIGS (four warps) always, so every head size has one."""
    block_d = triton.next_power_of_2(D)
    return [c for c in CONFIGS if 2 * c[1] * block_d <= PER_THREAD * 32 * c[2]] or CONFIGS[-1:]


def decode_attention(qkv, k_cache, v_cache, pos, scale, pdl: bool = True, cfg=CONFIGS[-1]):
    """qkv (B, 3*H*D) of one new token per sequence; caches (B, H, L, D); pos a 1-element device tensor.
    Writes the token's k and v at pos and returns its attention over positions 0..pos, (B, H*D). pdl:
    EngineOptions.pdl; cfg: one of CONFIGS."""
    B, H, L, D = k_cache.shape
    qkv = qkv.contiguous()
    block_d = triton.next_power_of_2(D)
    rows, block, num_warps = cfg
    chunk = max(rows, triton.next_power_of_2(triton.cdiv(L, 32)))  # at most 32 chunks, at least `rows` rows each
    chunks = triton.cdiv(L, chunk)
    out = qkv.new_empty(B, H * D)
    _decode_attention_kernel[(B * H, chunks)](
        qkv, k_cache, v_cache, pos, out, scratch(qkv.device, torch.float32, B * H * chunks * (block_d + 2)),
        scratch(qkv.device, torch.int32, B * H), L, scale, H=H, D=D, BLOCK_D=block_d, CHUNK=chunk, BLOCK=block,
        CHUNKS_P2=triton.next_power_of_2(chunks), num_warps=num_warps, **launch_options(qkv.device, pdl))
    return out
