"""A Triton GEMM for the engine's linear layers, Y = act(X @ W^T + bias) [+ residual], with the epilogue fused.

cuBLAS wins on plain GEMMs at large batch; this kernel exists for what cuBLAS cannot do in its epilogue
(exact GELU, a residual add) and for small-M shapes where cuBLAS leaves most SMs idle. Operands move
through TMA tensor descriptors (Hopper's bulk copy engine); the grid is persistent. Imported on CUDA only.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .kernels import launch_options, pdl_enter, scratch

ACT_NONE, ACT_GELU, ACT_GELU_TANH = 0, 1, 2
# Under PDL, GEMMs of at most this many rows prefetch their weights into L2 before waiting on the previous kernel:
# only there is streaming the weights most of a GEMM's time. H100, bert-base (benchmarks/engine_bench.py --parts
# pdl): 1 x 128 0.357 -> 0.341 ms and a gpt2 decode step 0.418 -> 0.414 ms; prefetching in every GEMM gained
# nothing at 1024 or 4096 rows (8 x 128: 0.694 vs 0.696 ms, 8 x 512: 2.089 vs 2.086).
PREFETCH_MAX_M = 128


@triton.jit
def _erf(x):
    # Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7 (about one fp32 ulp of the result, far under fp16/bf16
    # rounding): an exp and a reciprocal instead of libdevice's erf, whose cost in the epilogue of a
    # 128 x 256 tile rivals the tile's matrix work.
    a = tl.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    y = 1.0 - p * tl.exp(-a * a)
    return tl.where(x < 0, -y, y)


@triton.jit
def _activate(x, ACT: tl.constexpr):
    if ACT == 1:
        return 0.5 * x * (1.0 + _erf(x * 0.7071067811865476))
    if ACT == 2:  # 0.5 * (1 + tanh(u)) == sigmoid(2u)
        return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    return x


@triton.jit
def _tile_origin(tile, n_m, n_n, GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    # Grouped order: tiles that run together share rows of X in L2.
    per_group = GROUP * n_n
    first_m = (tile // per_group) * GROUP
    size_m = min(n_m - first_m, GROUP)
    return (first_m + (tile % per_group) % size_m) * BM, ((tile % per_group) // size_m) * BN


@triton.jit
def _prefetch_weights(W, row0, N, K, k0, k1, PDL: tl.constexpr, BR: tl.constexpr, PREFETCH: tl.constexpr):
    # Weights never depend on the previous kernel: under PDL, ask for this program's rows [row0, row0 + BR) x
    # columns [k0, k1) of W (N x K, 2-byte elements) in L2 while that kernel finishes, one request per 128-byte
    # line. At a few tokens a GEMM is the time to stream its weights, so this is most of its work.
    if PDL and PREFETCH:
        rows = tl.minimum(row0 + tl.arange(0, BR), N - 1).to(tl.int64)
        for k in range(k0, k1, 512):
            cols = tl.minimum(k + tl.arange(0, 8) * 64, K - 1)
            tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [W + rows[:, None] * K + cols[None, :]],
                                      dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _load_stats(STATS, rows, M, P, P2: tl.constexpr):
    # The producer's per-chunk partials STATS[row, chunk] = (mean, M2) of LayerNorm rows, every chunk at once.
    # Issued before the K loop and combined (_row_stats) after it: a load stalls only where its value is first used,
    # so the L2 round trip hides under the loop instead of adding to a small GEMM's latency.
    ps = tl.arange(0, P2)
    inside = (rows < M)[:, None] & (ps < P)[None, :]
    at = STATS + (rows.to(tl.int64)[:, None] * P + ps[None, :]) * 2
    return tl.load(at, mask=inside, other=0.0), tl.load(at + 1, mask=inside, other=0.0)


@triton.jit
def _row_stats(mean_p, m2_p, P, CHUNK, NTOT, eps, P2: tl.constexpr):
    # (mean, rstd) of the rows from their chunks' partials, combined exactly (Chan et al.): the mean first, then
    # each chunk's M2 plus its count x squared offset from that mean.
    ps = tl.arange(0, P2)
    count = tl.where(ps < P, tl.minimum(CHUNK, NTOT - ps * CHUNK), 0).to(tl.float32)
    mean = tl.sum(mean_p * count[None, :], 1) / NTOT
    d = mean_p - mean[:, None]
    var = (tl.sum(m2_p, 1) + tl.sum(d * d * count[None, :], 1)) / NTOT
    return mean, 1.0 / tl.sqrt(var + eps)


@triton.jit
def _normalize(v, mean, rstd, G, B, cols, NTOT):
    # LayerNorm of a loaded residual tile's rows, rounded to the storage dtype as the LayerNorm kernel's output
    # would be (columns past NTOT come out 0).
    g = tl.load(G + cols, mask=cols < NTOT, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=cols < NTOT, other=0.0).to(tl.float32)
    return ((v.to(tl.float32) - mean[:, None]) * rstd[:, None] * g[None, :] + b[None, :]).to(v.dtype)


@triton.jit
def _unfold(acc, mean, rstd, C, cols, N):
    # The GEMM read the LayerNorm's input x as it is, against W' = W diag(gamma): LN(x) W^T = rstd (x W'^T - mean c),
    # c = W' 1 (the bias carries b + W beta). The K loop stays a plain TMA -> tensor-core GEMM; normalising x in
    # registers inside it (tried first) made bert-base 1 x 128 slower than running the LayerNorm kernels.
    c = tl.load(C + cols, mask=cols < N, other=0.0)
    return (acc - mean[:, None] * c[None, :]) * rstd[:, None]


@triton.jit
def _write_stats(STATS_OUT, y, rows, cols, M, N, on, BN: tl.constexpr):
    # Per row, the (mean, M2) of this tile's columns of the output as stored: what a consumer needs to apply the
    # LayerNorm that no kernel of its own runs (chunk on // BN of tl.cdiv(N, BN) per row).
    # A half tile of a subtiled epilogue may lie wholly past N: it has no chunk to write.
    valid = (cols < N)[None, :]
    v = tl.where(valid, y.to(tl.float32), 0.0)
    mean = tl.sum(v, 1) / tl.maximum(tl.minimum(BN, N - on), 1)
    d = tl.where(valid, v - mean[:, None], 0.0)
    at = STATS_OUT + (rows.to(tl.int64) * tl.cdiv(N, BN) + on // BN) * 2
    live = rows < tl.where(on < N, M, 0)
    tl.store(at, mean, mask=live)
    tl.store(at + 1, tl.sum(d * d, 1), mask=live)


@triton.jit
def _epilogue(acc, om, on, y_desc, r_desc, BIAS, M, N, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
              HAS_RES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              STATS_OUT, STATS: tl.constexpr, a_mean, a_rstd, A_C, NORM_A: tl.constexpr,
              r_mean, r_rstd, R_G, R_B, NORM_RES: tl.constexpr):
    cols = on + tl.arange(0, BN)
    if NORM_A:
        acc = _unfold(acc, a_mean, a_rstd, A_C, cols, N)
    if HAS_BIAS:
        acc += tl.load(BIAS + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    acc = _activate(acc, ACT)
    if HAS_RES:
        r = r_desc.load([om, on])
        if NORM_RES:
            r = _normalize(r, r_mean, r_rstd, R_G, R_B, cols, N)
        acc += r.to(tl.float32)
    y = acc.to(y_desc.dtype)
    if STATS:
        _write_stats(STATS_OUT, y, om + tl.arange(0, BM), cols, M, N, on, BN)
    y_desc.store([om, on], y)


# The LayerNorm-on-load arguments vary with the producer's tile and the model's width: specialising on their values
# would compile each kernel again for every combination the tuner meets.
_NORM_ARGS = ["a_eps", "A_P", "A_CHUNK", "r_eps", "R_P", "R_CHUNK"]


@triton.jit(do_not_specialize=_NORM_ARGS)
def _linear_kernel(x_desc, w_desc, y_desc, r_desc, W, BIAS, M, N, K,
                   STATS_OUT, A_STATS, A_C, a_eps, A_P, A_CHUNK, R_STATS, R_G, R_B, r_eps, R_P, R_CHUNK,
                   ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                   STATS: tl.constexpr, NORM_A: tl.constexpr, A_P2: tl.constexpr,
                   NORM_RES: tl.constexpr, R_P2: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                   PROGRAMS: tl.constexpr, SUBTILE: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr):
    n_m, n_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    first_om, first_on = _tile_origin(tl.program_id(0), n_m, n_n, GROUP, BM, BN)
    # Programs whose first tiles share a weight slab (M > BM) would fetch it once each: only row block 0 asks.
    _prefetch_weights(W, first_on, N, K, 0, tl.where(first_om == 0, K, 0), PDL, BN, PREFETCH)
    pdl_enter(PDL)
    # flatten: the tile loop and its K loop pipeline as one, so the next tile's first loads are in flight
    # while this one runs its epilogue (worth ~10% on a GELU epilogue at large M). The epilogue keeps its own
    # tile counter, as Triton's persistent-matmul tutorial does, so the pipeliner need not carry `tile` across.
    tile_c = tl.program_id(0) - PROGRAMS
    for tile in tl.range(tl.program_id(0), n_m * n_n, PROGRAMS, flatten=True):
        om, on = _tile_origin(tile, n_m, n_n, GROUP, BM, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        if NORM_A:  # X is the input of a LayerNorm folded into W (see _unfold): its statistics, left by X's producer
            a_mp, a_m2 = _load_stats(A_STATS, om + tl.arange(0, BM), M, A_P, A_P2)
        if NORM_RES:  # the residual is the input of a LayerNorm too, applied to each tile as it is loaded
            r_mp, r_m2 = _load_stats(R_STATS, om + tl.arange(0, BM), M, R_P, R_P2)
        for k in range(0, tl.cdiv(K, BK)):
            a = x_desc.load([om, k * BK])
            b = w_desc.load([on, k * BK])
            acc = tl.dot(a, b.T, acc)
        tile_c += PROGRAMS
        om, on = _tile_origin(tile_c, n_m, n_n, GROUP, BM, BN)
        a_mean = tl.zeros((BM,), dtype=tl.float32)
        a_rstd, r_mean, r_rstd = a_mean, a_mean, a_mean
        if NORM_A:
            a_mean, a_rstd = _row_stats(a_mp, a_m2, A_P, A_CHUNK, K, a_eps, A_P2)
        if NORM_RES:
            r_mean, r_rstd = _row_stats(r_mp, r_m2, R_P, R_CHUNK, N, r_eps, R_P2)
        if SUBTILE:  # two half-width stores: half the shared memory for the output tile, one more stage for loads
            acc0, acc1 = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))
            _epilogue(acc0, om, on, y_desc, r_desc, BIAS, M, N, ACT, HAS_BIAS, HAS_RES, BM, BN // 2,
                      STATS_OUT, STATS, a_mean, a_rstd, A_C, NORM_A, r_mean, r_rstd, R_G, R_B, NORM_RES)
            _epilogue(acc1, om, on + BN // 2, y_desc, r_desc, BIAS, M, N, ACT, HAS_BIAS, HAS_RES, BM, BN // 2,
                      STATS_OUT, STATS, a_mean, a_rstd, A_C, NORM_A, r_mean, r_rstd, R_G, R_B, NORM_RES)
        else:
            _epilogue(acc, om, on, y_desc, r_desc, BIAS, M, N, ACT, HAS_BIAS, HAS_RES, BM, BN,
                      STATS_OUT, STATS, a_mean, a_rstd, A_C, NORM_A, r_mean, r_rstd, R_G, R_B, NORM_RES)


# (BM, BN, BK, stages, warps, persistent, subtile): the tuner times each against cuBLAS for every shape it meets.
# The first seven are the large-M ones (H100: 128 x 256 tiles with four stages win under a GELU epilogue).
# Small-M shapes (batch 1-8) stream the weights: narrow N tiles spread them over more SMs.
CONFIGS = [
    (128, 256, 64, 4, 8, True, True), (128, 256, 64, 3, 8, True, True), (128, 256, 64, 3, 8, True, False),
    (256, 128, 64, 4, 8, True, True), (128, 128, 128, 3, 8, True, False), (128, 128, 64, 4, 8, True, False),
    (128, 256, 64, 3, 8, False, True),
    (128, 128, 64, 3, 4, False, False), (64, 128, 64, 4, 4, False, False), (64, 64, 128, 4, 4, False, False),
    (64, 32, 128, 4, 4, False, False), (64, 32, 256, 3, 4, False, False), (64, 16, 256, 4, 4, False, False),
    (128, 32, 128, 4, 4, False, False),
    (128, 128, 64, 2, 4, False, False),  # small enough for two programs per SM: one's epilogue hides under the other's loads
]


@triton.jit(do_not_specialize=_NORM_ARGS)
def _linear_splitk_kernel(x_desc, w_desc, Y, R, W, BIAS, PARTIAL, ARRIVED, M, N, K,
                          STATS_OUT, A_STATS, A_C, a_eps, A_P, A_CHUNK, R_STATS, R_G, R_B, r_eps, R_P, R_CHUNK,
                          ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                          STATS: tl.constexpr, NORM_A: tl.constexpr, A_P2: tl.constexpr,
                          NORM_RES: tl.constexpr, R_P2: tl.constexpr,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                          PDL: tl.constexpr, PREFETCH: tl.constexpr):
    # Small M (batch 1-8 tokens x seq): too few output tiles to occupy the SMs, so SPLIT programs share each
    # tile's K range, write fp32 partials, and the last to arrive sums them in a fixed order (deterministic)
    # and runs the epilogue. It also resets the tile's arrival count, so no memset precedes the next call.
    tile, part = tl.program_id(0) // SPLIT, tl.program_id(0) % SPLIT
    n_n = tl.cdiv(N, BN)
    om, on = (tile // n_n) * BM, (tile % n_n) * BN
    k_tiles = tl.cdiv(K, BK)
    per = tl.cdiv(k_tiles, SPLIT)
    _prefetch_weights(W, on, N, K, part * per * BK, tl.minimum(part * per * BK + per * BK, K), PDL, BN, PREFETCH)
    pdl_enter(PDL)
    rows, cols = om + tl.arange(0, BM), on + tl.arange(0, BN)
    # LayerNorm statistics (see _linear_kernel), loaded by every program: which one reduces is known only at the end
    if NORM_A:
        a_mp, a_m2 = _load_stats(A_STATS, rows, M, A_P, A_P2)
    if NORM_RES:
        r_mp, r_m2 = _load_stats(R_STATS, rows, M, R_P, R_P2)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(part * per, min(part * per + per, k_tiles)):
        a = x_desc.load([om, k * BK])
        b = w_desc.load([on, k * BK])
        acc = tl.dot(a, b.T, acc)
    inside = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows[:, None] * N + cols[None, :]
    tl.store(PARTIAL + part * M * N + offs, acc, mask=inside)
    tl.debug_barrier()  # every thread's partial is written before this program announces itself
    if tl.atomic_add(ARRIVED + tile, 1, sem="acq_rel") == SPLIT - 1:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for p in range(SPLIT):  # .cg: read from L2, where the other programs' stores landed
            acc += tl.load(PARTIAL + p * M * N + offs, mask=inside, other=0.0, cache_modifier=".cg")
        tl.store(ARRIVED + tile, 0)
        if NORM_A:  # X is the input of a LayerNorm folded into W (see _unfold)
            a_mean, a_rstd = _row_stats(a_mp, a_m2, A_P, A_CHUNK, K, a_eps, A_P2)
            acc = _unfold(acc, a_mean, a_rstd, A_C, cols, N)
        if HAS_BIAS:
            acc += tl.load(BIAS + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        acc = _activate(acc, ACT)
        if HAS_RES:
            r = tl.load(R + offs, mask=inside, other=0.0)
            if NORM_RES:  # the residual is the input of a LayerNorm too, applied as it is loaded
                r_mean, r_rstd = _row_stats(r_mp, r_m2, R_P, R_CHUNK, N, r_eps, R_P2)
                r = _normalize(r, r_mean, r_rstd, R_G, R_B, cols, N)
            acc += r.to(tl.float32)
        y = acc.to(Y.dtype.element_ty)
        if STATS:
            _write_stats(STATS_OUT, y, rows, cols, M, N, on, BN)
        tl.store(Y + offs, y, mask=inside)


# Routes that produce or read a deferred LayerNorm: not the persistent large-M tiles, where a LayerNorm kernel costs a
# tenth of its GEMM; each route here is a kernel variant more to compile (about 2 s each on an H100 host).
LN_CONFIGS = [c for c in CONFIGS if not c[5]]

# (BM, BN, BK, split, stages, warps) for the split-K kernel, candidates only where M <= SPLITK_MAX_M.
SPLITK_CONFIGS = [(64, 64, 128, 2, 3, 4), (64, 64, 128, 4, 3, 4), (64, 64, 64, 8, 3, 4),
                  (16, 64, 128, 4, 3, 4), (16, 64, 64, 8, 3, 4)]
SPLITK_MAX_M = 256


def splitk_configs(M: int) -> list:
    """The split-K configs worth timing for M rows: 16-row tiles only for the few-token (decode) case."""
    if M > SPLITK_MAX_M:
        return []
    return [c for c in SPLITK_CONFIGS if (c[0] == 16) == (M <= 16)]


def linear_splitk(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: int = ACT_NONE,
                  residual: torch.Tensor | None = None, cfg=SPLITK_CONFIGS[0], norm_x=None, x_colsum=None,
                  norm_residual=None, stats: bool = False):
    """As linear(), with SPLIT programs sharing each output tile's K range."""
    if not supported(x, weight) or (residual is not None and not residual.is_contiguous()):
        raise ValueError("shape/alignment not supported by the TMA GEMM")
    (M, K), N = x.shape, weight.shape[0]
    bm, bn, bk, split, stages, warps = cfg
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    st = _stats_out(y, bn, stats)
    _linear_splitk_kernel[(tiles * split,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(weight, [bn, bk]),
        y, residual.view(M, N) if residual is not None else y, weight, bias if bias is not None else y,
        scratch(x.device, torch.float32, split * M * N), scratch(x.device, torch.int32, tiles), M, N, K,
        st if stats else y, *_x_norm_args(norm_x, x_colsum, K, y), *_res_norm_args(norm_residual, N, y),
        ACT=act, HAS_BIAS=bias is not None, HAS_RES=residual is not None, BM=bm, BN=bn, BK=bk, SPLIT=split,
        **_norm_flags(stats, norm_x, K, norm_residual, N),
        num_stages=stages, num_warps=warps, PREFETCH=M <= PREFETCH_MAX_M, **launch_options(x.device))
    return (y, st, bn) if stats else y


def _stats_out(y: torch.Tensor, chunk: int, wanted: bool) -> torch.Tensor | None:
    return torch.empty(y.shape[0], triton.cdiv(y.shape[1], chunk), 2, device=y.device, dtype=torch.float32) \
        if wanted else None


def _x_norm_args(src, colsum, width: int, placeholder: torch.Tensor) -> tuple:
    """(STATS, C, eps, P, CHUNK) kernel arguments for x as the input of a LayerNorm folded into the weights (src:
    an ops.Normed with rows `width` wide; colsum: c = W' 1), or placeholders the kernel never reads."""
    if src is None:
        return placeholder, placeholder, 0.0, 1, 1
    return src.stats, colsum, src.norm.eps, triton.cdiv(width, src.chunk), src.chunk


def _res_norm_args(src, width: int, placeholder: torch.Tensor) -> tuple:
    """(STATS, G, B, eps, P, CHUNK) kernel arguments for the residual as a LayerNorm's input (src: an ops.Normed
    with rows `width` wide), or placeholders the kernel never reads."""
    if src is None:
        return placeholder, placeholder, placeholder, 0.0, 1, 1
    return src.stats, src.norm.weight, src.norm.bias, src.norm.eps, triton.cdiv(width, src.chunk), src.chunk


def _norm_flags(stats: bool, norm_x, k: int, norm_residual, n: int) -> dict:
    def p2(src, width):  # every chunk of a row is loaded at once
        return 2 if src is None else max(2, triton.next_power_of_2(triton.cdiv(width, src.chunk)))
    return {"STATS": stats, "NORM_A": norm_x is not None, "A_P2": p2(norm_x, k),
            "NORM_RES": norm_residual is not None, "R_P2": p2(norm_residual, n)}


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """TMA reads of x and weight need 16-byte aligned row strides and base addresses, 2-D row-major operands."""
    return (x.dim() == 2 and x.is_contiguous() and weight.is_contiguous() and x.dtype == weight.dtype
            and x.dtype in (torch.float16, torch.bfloat16) and (x.shape[1] * x.element_size()) % 16 == 0
            and all(t.data_ptr() % 16 == 0 for t in (x, weight)))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: int = ACT_NONE,
           residual: torch.Tensor | None = None, cfg=CONFIGS[0], norm_x=None, x_colsum=None, norm_residual=None,
           stats: bool = False):
    """act(x W^T + bias) [+ residual]. `norm_x` (an ops.Normed of x): x is the input of that LayerNorm, already
    folded into weight and bias (ops.Folded), whose column sums are `x_colsum`. `norm_residual` (an ops.Normed
    of residual): the residual is normalised as it is loaded. `stats`: also return the output's per-row partial
    LayerNorm statistics and their chunk width, (y, stats, chunk), for a consumer."""
    if (not supported(x, weight) or (weight.shape[0] * x.element_size()) % 16  # y is written through TMA too
            or (residual is not None and not residual.is_contiguous())):
        raise ValueError("shape/alignment not supported by the TMA GEMM")
    (M, K), N = x.shape, weight.shape[0]
    bm, bn, bk, stages, warps, persistent, subtile = cfg
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    programs = min(tiles, _sm_count(x.device)) if persistent else tiles
    r = residual.view(M, N) if residual is not None else y
    out_block = [bm, bn // 2 if subtile else bn]
    st = _stats_out(y, out_block[1], stats)
    _linear_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(weight, [bn, bk]),
        TensorDescriptor.from_tensor(y, out_block), TensorDescriptor.from_tensor(r, out_block), weight,
        bias if bias is not None else y, M, N, K,
        st if stats else y, *_x_norm_args(norm_x, x_colsum, K, y), *_res_norm_args(norm_residual, N, y),
        ACT=act, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        **_norm_flags(stats, norm_x, K, norm_residual, N),
        BM=bm, BN=bn, BK=bk, GROUP=8, PROGRAMS=programs, SUBTILE=subtile,
        num_stages=stages, num_warps=warps, PREFETCH=M <= PREFETCH_MAX_M, **launch_options(x.device))
    return (y, st, out_block[1]) if stats else y
