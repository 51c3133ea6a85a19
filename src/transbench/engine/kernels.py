"""Triton kernels besides the GEMM (gemm.py): the element-wise work around it, attention over the fused QKV
rows, and one-token decode attention. Imported only when Triton is present (see ops.py)."""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

USE_PDL = True  # benchmarks/engine_bench.py turns it off to measure what it buys


@functools.cache
def _sm90_or_newer(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (9, 0)


def pdl(device: torch.device) -> bool:
    """Programmatic dependent launch (Hopper on): a kernel may start while the previous one in the stream
    finishes, so its launch and prologue hide under that tail. Every kernel launched so calls `pdl_enter` first."""
    return USE_PDL and device.type == "cuda" and _sm90_or_newer(device)


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    # Wait for the previous kernel (its writes become visible) before touching activations or outputs, then
    # let the next kernel launch: it can only get as far as its own wait, so the lookahead is one kernel.
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def erf(x):
    # Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7 (about one fp32 ulp of the result, far under fp16/bf16
    # rounding): an exp and a reciprocal instead of libdevice's erf, whose cost in the epilogue of a
    # 128 x 256 tile rivals the tile's matrix work (gemm.py), and which held the fp8 quantize pass below at
    # 1.27 TB/s (H100, benchmarks/engine_bench.py --parts quant: 32,768 x 3,072 in 238 us, 186 with this).
    a = tl.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    y = 1.0 - p * tl.exp(-a * a)
    return tl.where(x < 0, -y, y)


@triton.jit
def _store_fp8_row(y, row, cols, m, N, Q, QS):
    # Per-token fp8 of one row held in fp32 registers: its max-abs maps to 448 (e4m3's largest finite value), one
    # fp32 scale per row. Fused into the kernel that produced the row, so no separate pass reads it again
    # (ops.quantize_rows is the reference; 1e-12 / 448 is its floor for an all-zero row).
    scale = tl.maximum(tl.max(tl.abs(tl.where(m, y, 0.0)), 0) / 448.0, 1e-12 / 448.0)
    tl.store(Q + row * N + cols, (y / scale).to(Q.dtype.element_ty), mask=m)
    tl.store(QS + row, scale)


@triton.jit
def _add_layernorm_kernel(X, R, BIAS, W, B, Y, RES_OUT, Q, QS, N, eps,
                          HAS_R: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_RES: tl.constexpr, QUANT: tl.constexpr,
                          BLOCK: tl.constexpr, PDL: tl.constexpr):
    # One row per program: rows are at most a few thousand wide, so the whole row sits in registers
    # and x + bias + residual is read once, normalised and written once.
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(X + row * N + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(BIAS + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_R:
        x += tl.load(R + row * N + cols, mask=m, other=0.0).to(tl.float32)
    if STORE_RES:  # pre-LN models (GPT-2) carry the un-normalised sum on as the next residual
        tl.store(RES_OUT + row * N + cols, x.to(RES_OUT.dtype.element_ty), mask=m)
    mean = tl.sum(x, 0) / N
    d = tl.where(m, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, 0) / N + eps)
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=m, other=0.0).to(tl.float32)
    y = d * rstd * w + b
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=m)
    if QUANT:  # the next GEMM's fp8 input, from the same registers
        _store_fp8_row(y, row, cols, m, N, Q, QS)


@triton.jit(do_not_specialize=["S"])
def _embed_layernorm_kernel(IDS, WORD, POS_IDS, POS, TT, TYPE, W, B, Y, S, N, eps, HAS_POS_IDS: tl.constexpr,
                            HAS_TT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # BERT's embedding block in one kernel: word + position + token-type rows gathered, summed and normalised in
    # registers. In torch it is five to seven launches (three gathers, the positions' arange, adds, the LayerNorm),
    # which at 1 x 128 made the whole model call 1.28x the encoder layers alone (issue 23: 0.457 vs 0.356 ms).
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    tok = tl.load(IDS + row).to(tl.int64)
    p = tl.load(POS_IDS + row).to(tl.int64) if HAS_POS_IDS else row % S  # dense rows: position = column
    t = tl.load(TT + row).to(tl.int64) if HAS_TT else 0
    x = tl.load(WORD + tok * N + cols, mask=m, other=0.0).to(tl.float32)
    x += tl.load(POS + p * N + cols, mask=m, other=0.0).to(tl.float32)
    x += tl.load(TYPE + t * N + cols, mask=m, other=0.0).to(tl.float32)
    mean = tl.sum(x, 0) / N
    d = tl.where(m, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, 0) / N + eps)
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, (d * rstd * w + b).to(Y.dtype.element_ty), mask=m)


def embed_layernorm(ids, word, pos_ids, pos, tt, type_, weight, ln_bias, eps, S: int):
    """LayerNorm(word[ids] + pos[pos_ids] + type_[tt]) per row of the flat (T,) ids; pos_ids None: row % S (dense
    (B, S) rows), tt None: token type 0."""
    n = word.shape[1]
    ids, pos_ids, tt = (None if t is None else t.contiguous() for t in (ids, pos_ids, tt))
    y = word.new_empty(ids.shape[0], n)
    block = triton.next_power_of_2(n)
    _embed_layernorm_kernel[(ids.shape[0],)](
        ids, word, pos_ids if pos_ids is not None else ids, pos, tt if tt is not None else ids, type_, weight,
        ln_bias, y, S, n, eps, HAS_POS_IDS=pos_ids is not None, HAS_TT=tt is not None, BLOCK=block,
        num_warps=_warps(block), **launch_options(ids.device))
    return y


@triton.jit
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


def launch_options(device: torch.device) -> dict:
    """The PDL constexpr and the launch option that go together on every kernel launch."""
    on = pdl(device)
    return {"PDL": on, "launch_pdl": on}


def _warps(block: int) -> int:
    return max(1, min(16, block // 256))


def add_layernorm(x, residual, bias, weight, ln_bias, eps, store_residual=False, quant=False):
    """LayerNorm(x + bias + residual) of rows; store_residual: also the sum; quant: also y in e4m3 with
    per-row scales, returned as (y, y8, scales (rows, 1) fp32) (2-D x only)."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    res_out = torch.empty_like(x2) if store_residual else y
    q = torch.empty(x2.shape, device=x.device, dtype=torch.float8_e4m3fn) if quant else y
    qs = torch.empty(x2.shape[0], 1, device=x.device, dtype=torch.float32) if quant else y
    r = residual.reshape(-1, n).contiguous() if residual is not None else x2
    block = triton.next_power_of_2(n)
    _add_layernorm_kernel[(x2.shape[0],)](
        x2, r, bias if bias is not None else weight, weight, ln_bias, y, res_out, q, qs, n, eps,
        HAS_R=residual is not None, HAS_BIAS=bias is not None, STORE_RES=store_residual, QUANT=quant,
        BLOCK=block, num_warps=_warps(block), **launch_options(x.device))
    y = y.view_as(x)
    if quant:
        y = (y, q, qs)
    return (y, res_out.view_as(x)) if store_residual else y


@triton.jit
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
    if ACT == 1:
        x = 0.5 * x * (1.0 + erf(x * 0.7071067811865476))
    if ACT == 2:
        x = x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    _store_fp8_row(x, row, cols, m, N, Q, QS)


def quantize_rows(x, bias=None, act: int = 0):
    """act(x + bias) of 2-D x as (e4m3 data, (rows, 1) fp32 scales); act 0 none, 1 exact GELU, 2 tanh GELU."""
    x = x.contiguous()
    n = x.shape[-1]
    q = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
    qs = torch.empty(x.shape[0], 1, device=x.device, dtype=torch.float32)
    block = triton.next_power_of_2(n)
    # At most 8 warps a row: 16 (what _warps gives a 4,096-wide row) ran 1.19x slower on an H100 (49,152 x 4,096:
    # 329 against 282 us, benchmarks/engine_bench.py --parts quant).
    _quantize_rows_kernel[(x.shape[0],)](x, bias if bias is not None else x, q, qs, n, HAS_BIAS=bias is not None,
                                         ACT=act, BLOCK=block, num_warps=min(8, _warps(block)),
                                         **launch_options(x.device))
    return q, qs


def bias_gelu(x, bias, tanh: bool):
    n = x.shape[-1]
    x = x.contiguous()
    x2 = x.view(-1, n)
    block = min(1024, triton.next_power_of_2(n))
    # In place: the GEMM output is dead after the activation, so no second buffer is needed.
    _bias_gelu_kernel[(x2.shape[0], triton.cdiv(n, block))](x2, bias, x2, n, TANH=tanh, BLOCK=block,
                                                          num_warps=_warps(block), **launch_options(x.device))
    return x


_scratch: dict = {}


def scratch(device: torch.device, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """Zeroed scratch kept for the process: CUDA graphs capture its address, so it must never move or be
    freed. Kernels that count arrivals in it leave the counters at zero for the next call."""
    key = (device, dtype, numel)
    if key not in _scratch:
        _scratch[key] = torch.zeros(numel, device=device, dtype=dtype)
    return _scratch[key]


@triton.jit
def _decode_attention_kernel(QKV, K, V, POS, OUT, PART, ARRIVED, L, scale, H: tl.constexpr, D: tl.constexpr,
                             BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                             CHUNKS_P2: tl.constexpr, PDL: tl.constexpr):
    # Flash-decoding: program (sequence x head, chunk of the cache). At batch 1 one program per head would
    # leave most SMs idle and walk the cache serially. The position comes from device memory, so one graph
    # serves every step; chunks past it return at once. The last program of a head to finish merges the
    # chunks' partial softmaxes, and resets its arrival counter.
    pdl_enter(PDL)
    bh, c = tl.program_id(0), tl.program_id(1)
    chunks = tl.num_programs(1)
    b, h = bh // H, bh % H
    pos = tl.load(POS)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    row = QKV + b * (3 * H * D) + h * D
    q = tl.load(row + d, mask=dm, other=0.0).to(tl.float32) * scale
    cache = bh.to(tl.int64) * L * D
    start = c * CHUNK
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
    acc = v_new.to(tl.float32)
    for off in range(start, tl.minimum(start + CHUNK, pos), BLOCK):
        j = off + tl.arange(0, BLOCK)
        jm = (j < pos) & (j < start + CHUNK)
        offs = cache + j[:, None] * D + d[None, :]
        k = tl.load(K + offs, mask=jm[:, None] & dm[None, :], other=0.0).to(tl.float32)
        s = tl.where(jm, tl.sum(k * q[None, :], 1), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(V + offs, mask=jm[:, None] & dm[None, :], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
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


def decode_attention(qkv, k_cache, v_cache, pos, scale):
    """qkv (B, 3*H*D) of one new token per sequence; caches (B, H, L, D); pos a 1-element device tensor.
    Writes the token's k and v at pos and returns its attention over positions 0..pos, (B, H*D)."""
    B, H, L, D = k_cache.shape
    block_d = triton.next_power_of_2(D)
    chunk = max(64, triton.next_power_of_2(triton.cdiv(L, 32)))  # at most 32 chunks, at least 64 rows each
    chunks = triton.cdiv(L, chunk)
    out = qkv.new_empty(B, H * D)
    _decode_attention_kernel[(B * H, chunks)](
        qkv, k_cache, v_cache, pos, out, scratch(qkv.device, torch.float32, B * H * chunks * (block_d + 2)),
        scratch(qkv.device, torch.int32, B * H), L, scale, H=H, D=D, BLOCK_D=block_d, CHUNK=chunk, BLOCK=64,
        CHUNKS_P2=triton.next_power_of_2(chunks), num_warps=4, **launch_options(qkv.device))
    return out


@triton.jit
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


@triton.jit(do_not_specialize=["S"])  # one compile for every sequence length (S only bounds masks and loops)
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
        # version in which the last of a query block's programs read the block back to find it cost 42 us more than this
        # kernel without QUANT (H100, 256 x 128 x 12 heads: 115 against 73 us). The sequence's largest QKV input row
        # scale bounds every value of V, and each output is a convex combination of V rows.
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


ATTENTION_CONFIGS = [(64, 64, 4), (128, 64, 8), (32, 64, 4)]  # (BM, BN, warps)


def attention(qkv, B, S, heads, scale, causal, cfg=ATTENTION_CONFIGS[0], bound=None):
    """Dense (B, S) attention over the fused QKV buffer (B*S, 3*heads*D) -> (B*S, heads*D) in qkv's dtype. bound
    (an ops.AttnBound: the output projection runs in fp8): the output in e4m3 instead, as (codes, (B*S, 1) fp32
    scales), the fields of that projection's fp8 input (ops.Fp8Act), on ops.attention_scale's scales."""
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
        **launch_options(qkv.device))
    return out if bound is None else (out, qs)


# The padding path's index arithmetic (engine/attention.py make_packing) in two launches around its one host sync.
# As torch ops it was 22 kernels and copies, each paying the host's dispatch: on an H100 a right-padded bert-base call
# cost 0.8134 ms at 1 x 128 against 0.4024 with no mask, 1.2919 against 0.6548 at 8 x 128
# (benchmarks/studies/packing_cost.py).
PACK_MAX_S = 8192  # one program holds a row (and two rows of the mask a step in the count): longer rows use torch
# mask_counts is one program, so its time grows with the mask while torch's reductions spread over the SMs. H100,
# make_packing alone (benchmarks/studies/packing_cost.py, benchmarks/results/host_bound_h100_2026-11.md), Triton
# against torch ops, padded / all-ones mask:
# 256 x 512 229 / 126 us against 503 / 91, 1024 x 128 257 / 195 against 353 / 141, 4096 x 128 545 / 480 against
# 497 / 136. Masks of more elements than this use the torch ops.
PACK_MAX_TOKENS = 1 << 18


@triton.jit(do_not_specialize=["B", "S", "stride_b", "stride_s"])
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


@triton.jit(do_not_specialize=["B", "S", "stride_b", "stride_s", "n", "tp"])
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
