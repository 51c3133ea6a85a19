"""A Triton GEMM for the engine's linear layers, Y = act(X @ W^T + bias) [+ residual], with the epilogue fused.

cuBLAS wins on plain GEMMs at large batch; this kernel exists for what cuBLAS cannot do in its epilogue
(exact GELU, a residual add, an e4m3 output with its row scales: linear_fp8) and for small-M shapes where cuBLAS
leaves most SMs idle. Operands move through TMA tensor descriptors (Hopper's bulk copy engine); the grid is
persistent. Launched on CUDA only (and in Triton's CPU interpreter by the tests).
"""
from __future__ import annotations

import functools

import torch

from .activation import ACT_GELU, ACT_GELU_TANH, ACT_NONE, activate  # noqa: F401 - the ACT codes callers pass
from .launch import TensorDescriptor, jit, launch_options, pdl_enter, scratch, tl, triton

# Under PDL, GEMMs of at most this many rows (EngineOptions.prefetch_max_m) prefetch their weights into L2 before
# waiting on the previous kernel: only there is streaming the weights most of a GEMM's time. H100, bert-base
# (benchmarks/engine_bench.py --parts pdl): 1 x 128 0.357 -> 0.341 ms and a gpt2 decode step 0.418 -> 0.414 ms;
# prefetching in every GEMM gained nothing at 1024 or 4096 rows (8 x 128: 0.694 vs 0.696 ms, 8 x 512: 2.089 vs
# 2.086).
PREFETCH_MAX_M = 128


@jit
def _tile_origin(tile, n_m, n_n, GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    # Grouped order: tiles that run together share rows of X in L2.
    per_group = GROUP * n_n
    first_m = (tile // per_group) * GROUP
    size_m = min(n_m - first_m, GROUP)
    return (first_m + (tile % per_group) % size_m) * BM, ((tile % per_group) // size_m) * BN


@jit
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


@jit
def _tanh(u, HW: tl.constexpr):
    if HW:  # the SFU's tanh: one instruction, |error| ~ 2^-11 (PTX ISA, tanh.approx.f32)
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [u], dtype=tl.float32, is_pure=True,
                                         pack=1)
    return 2.0 * tl.sigmoid(2.0 * u) - 1.0  # Triton's CPU interpreter runs no PTX


@jit
def _epilogue(acc, om, on, y_desc, r_desc, BIAS, XS, WS, YS, M, N, GAIN, BIAS_MAX, ACT: tl.constexpr,
              HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, FP8: tl.constexpr, QUANT: tl.constexpr, HW: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr):
    cols = on + tl.arange(0, BN)
    if FP8:  # e4m3 operands: the product times the row's input scale and the column's weight scale
        rows = om + tl.arange(0, BM)
        xs = tl.load(XS + rows, mask=rows < M, other=0.0)
        acc = acc * xs[:, None] * tl.load(WS + cols, mask=cols < N, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(BIAS + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if QUANT:
        # The output in e4m3 for the next fp8 GEMM, on a per-row scale that bounds the row before it is computed
        # (fp8_out_scale says why that is safe), so no tile waits for the row's other tiles.
        ys = fp8_out_scale(xs, GAIN, BIAS_MAX)
        if ACT == 0:
            acc = acc * (1.0 / ys)[:, None]
        else:
            # GELU in its tanh form on the SFU's tanh, the row's 1 / scale folded in: ~6 instructions an element
            # where the erf form (activation.activate) takes ~25 and two SFU calls. This epilogue runs on the same
            # warps as the tile's matrix work, so its instructions are the kernel's time: H100, 32,768 x 3,072 x 768
            # (benchmarks/engine_bench.py --parts fp8gemm), 0.156 ms with no activation, 0.288 with the erf GELU,
            # 0.159 with this one (torch._scaled_mm alone, fp16 output: 0.166).
            # For exact-GELU models the tanh form is within 5e-4 of erf's; e4m3 then rounds to 3 mantissa bits,
            # steps of 6-12%, so the two differ in the e4m3 output where a value sits that close to a rounding tie.
            half = (0.5 / ys)[:, None] * acc
            acc = half + half * _tanh(acc * (0.7978845608028654 + 0.03567740813636141 * acc * acc), HW)
        acc = tl.minimum(tl.maximum(acc, -448.0), 448.0)  # past the bound only by fp32 rounding
        if on == 0:
            tl.store(YS + rows, ys, mask=rows < M)
    else:
        acc = activate(acc, ACT)
        if HAS_RES:
            acc += r_desc.load([om, on]).to(tl.float32)
    y_desc.store([om, on], acc.to(y_desc.dtype))


@jit
def fp8_out_scale(xs, GAIN, BIAS_MAX):
    # A row of x W^T + b with |x| <= 448 xs (its e4m3 scale) is bounded by 448 xs GAIN + BIAS_MAX, GAIN being the
    # largest column sum of |W| (Linear.fp8_gain); GELU leaves positive values below themselves and negative ones
    # above -0.17. That bound maps to 448. It is looser than the row's true max-abs (2^5.3 on average on bert-base,
    # 2^4.8 on bert-large, benchmarks/studies/fp8_accuracy.py), which e4m3, a floating-point format, absorbs: the row's
    # values keep their 3-bit mantissas and only ones far below the max turn subnormal. Same accuracy as the
    # max-abs scale in the emulation: bert-base 2 x 128 rel_err 0.0702 against 0.0704, bert-large 1 x 384 0.128
    # for both, MiniLM min cosine 0.9943 against 0.9936.
    return tl.maximum(xs * GAIN + BIAS_MAX / 448.0, 0.17 / 448.0)


# do_not_specialize M: Triton would compile a kernel apart for M == 1 and for M not divisible by 16 (its integer
# specialisations); M only bounds tiles here (the TMA descriptors carry the shapes), so one compile per config
# serves every batch x seq: part of the first-call cost the first call counts.
@jit(do_not_specialize=["M"])
def _linear_kernel(x_desc, w_desc, y_desc, r_desc, W, BIAS, XS, WS, YS, M, N, K, GAIN, BIAS_MAX,
                   ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, FP8: tl.constexpr,
                   QUANT: tl.constexpr, HW: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   GROUP: tl.constexpr, PROGRAMS: tl.constexpr, SUBTILE: tl.constexpr, PDL: tl.constexpr,
                   PREFETCH: tl.constexpr):
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
        for k in range(0, tl.cdiv(K, BK)):
            a = x_desc.load([om, k * BK])
            b = w_desc.load([on, k * BK])
            acc = tl.dot(a, b.T, acc)
        tile_c += PROGRAMS
        om, on = _tile_origin(tile_c, n_m, n_n, GROUP, BM, BN)
        if SUBTILE:  # two half-width stores: half the shared memory for the output tile, one more stage for loads
            acc0, acc1 = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))
            _epilogue(acc0, om, on, y_desc, r_desc, BIAS, XS, WS, YS, M, N, GAIN, BIAS_MAX, ACT, HAS_BIAS, HAS_RES,
                      FP8, QUANT, HW, BM, BN // 2)
            _epilogue(acc1, om, on + BN // 2, y_desc, r_desc, BIAS, XS, WS, YS, M, N, GAIN, BIAS_MAX, ACT, HAS_BIAS,
                      HAS_RES, FP8, QUANT, HW, BM, BN // 2)
        else:
            _epilogue(acc, om, on, y_desc, r_desc, BIAS, XS, WS, YS, M, N, GAIN, BIAS_MAX, ACT, HAS_BIAS, HAS_RES, FP8,
                      QUANT, HW, BM, BN)


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
# The tiles for e4m3 operands (linear_fp8), large M only (ops.FP8_MIN_ROWS): K steps of 128 one-byte elements, the
# 128-byte rows wgmma reads. H100 (benchmarks/engine_bench.py --parts fp8gemm, no activation): 128 x 256 x 128 with
# four stages ran 32,768 x 3,072 x 768 at 1,063 TFLOPS and 49,152 x 4,096 x 1,024 at 1,077 (torch._scaled_mm 947 and
# 1,058); 128 x 128 tiles with four warps lost half their speed to a GELU epilogue, 128 x 64 ones ran at 620-690.
FP8_CONFIGS = [
    (128, 256, 128, 4, 8, True, False), (128, 256, 128, 4, 8, True, True), (128, 256, 128, 3, 8, True, True),
    (128, 128, 128, 4, 8, True, False), (128, 128, 128, 3, 4, False, False), (256, 128, 128, 4, 8, True, True),
]


@jit(do_not_specialize=["M"])  # as _linear_kernel
def _linear_splitk_kernel(x_desc, w_desc, Y, R, W, BIAS, PARTIAL, ARRIVED, M, N, K,
                          ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
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
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(part * per, min(part * per + per, k_tiles)):
        a = x_desc.load([om, k * BK])
        b = w_desc.load([on, k * BK])
        acc = tl.dot(a, b.T, acc)
    rows, cols = om + tl.arange(0, BM), on + tl.arange(0, BN)
    inside = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows[:, None] * N + cols[None, :]
    tl.store(PARTIAL + part * M * N + offs, acc, mask=inside)
    tl.debug_barrier()  # every thread's partial is written before this program announces itself
    if tl.atomic_add(ARRIVED + tile, 1, sem="acq_rel") == SPLIT - 1:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for p in range(SPLIT):  # .cg: read from L2, where the other programs' stores landed
            acc += tl.load(PARTIAL + p * M * N + offs, mask=inside, other=0.0, cache_modifier=".cg")
        tl.store(ARRIVED + tile, 0)
        if HAS_BIAS:
            acc += tl.load(BIAS + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        acc = activate(acc, ACT)
        if HAS_RES:
            acc += tl.load(R + offs, mask=inside, other=0.0).to(tl.float32)
        tl.store(Y + offs, acc.to(Y.dtype.element_ty), mask=inside)


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
                  residual: torch.Tensor | None = None, cfg=SPLITK_CONFIGS[0], pdl: bool = True,
                  prefetch_max_m: int = PREFETCH_MAX_M) -> torch.Tensor:
    """act(x W^T + bias) [+ residual], SPLIT programs sharing each output tile's K range (small M). pdl and
    prefetch_max_m: EngineOptions'."""
    if not supported(x, weight) or (residual is not None and not residual.is_contiguous()):
        raise ValueError("shape/alignment not supported by the TMA GEMM")
    (M, K), N = x.shape, weight.shape[0]
    bm, bn, bk, split, stages, warps = cfg
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    _linear_splitk_kernel[(tiles * split,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(weight, [bn, bk]),
        y, residual.view(M, N) if residual is not None else y, weight, bias if bias is not None else y,
        # The partials are written before they are read: a buffer of the call (of the graph, when captured), not
        # process scratch, which kept one for every split and shape the tuner tried, for the life of the process.
        # The arrival counts must start at zero: scratch.
        torch.empty(split * M * N, device=x.device, dtype=torch.float32), scratch(x.device, torch.int32, tiles),
        M, N, K,
        ACT=act, HAS_BIAS=bias is not None, HAS_RES=residual is not None, BM=bm, BN=bn, BK=bk, SPLIT=split,
        num_stages=stages, num_warps=warps, PREFETCH=M <= prefetch_max_m, **launch_options(x.device, pdl))
    return y


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """TMA reads of x and weight need 16-byte aligned row strides and base addresses, 2-D row-major operands."""
    return (x.dim() == 2 and x.is_contiguous() and weight.is_contiguous() and x.dtype == weight.dtype
            and x.dtype in (torch.float16, torch.bfloat16) and (x.shape[1] * x.element_size()) % 16 == 0
            and all(t.data_ptr() % 16 == 0 for t in (x, weight)))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: int = ACT_NONE,
           residual: torch.Tensor | None = None, cfg=CONFIGS[0], pdl: bool = True,
           prefetch_max_m: int = PREFETCH_MAX_M) -> torch.Tensor:
    """act(x W^T + bias) [+ residual] on fp16/bf16 operands, the epilogue fused. pdl and prefetch_max_m:
    EngineOptions'."""
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
    _linear_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(weight, [bn, bk]),
        TensorDescriptor.from_tensor(y, out_block), TensorDescriptor.from_tensor(r, out_block), weight,
        bias if bias is not None else y, y, y, y, M, N, K, 0.0, 0.0, ACT=act, HAS_BIAS=bias is not None,
        HAS_RES=residual is not None, FP8=False, QUANT=False, HW=False, BM=bm, BN=bn, BK=bk, GROUP=8,
        PROGRAMS=programs, SUBTILE=subtile, num_stages=stages, num_warps=warps, PREFETCH=M <= prefetch_max_m,
        **launch_options(x.device, pdl))
    return y


@functools.cache
def _shared_memory(device: torch.device) -> int:
    props = torch.cuda.get_device_properties(device) if device.type == "cuda" else None
    return props.shared_memory_per_block_optin if props else 1 << 30


def fp8_configs(out_dtype: torch.dtype, device: torch.device) -> list:
    """The FP8_CONFIGS whose load stages and output tile fit in the GPU's shared memory for this output dtype: an fp16
    output doubles the output tile, and 128 x 256 tiles with four stages then need 256 KiB (an H100 has 227)."""
    return [c for c in FP8_CONFIGS if c[3] * (c[0] + c[1]) * c[2] + c[0] * (c[1] // 2 if c[6] else c[1])
            * out_dtype.itemsize <= _shared_memory(device)]


def supported_fp8(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """linear_fp8's operands: 2-D row-major e4m3, rows of a multiple of 16 bytes (TMA), 16-byte aligned bases."""
    return (x.dim() == 2 and x.is_contiguous() and weight.is_contiguous()
            and x.dtype == weight.dtype == torch.float8_e4m3fn and x.shape[1] % 16 == 0 and weight.shape[0] % 16 == 0
            and all(t.data_ptr() % 16 == 0 for t in (x, weight)))


def linear_fp8(x: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None, gain: float = 0.0, bias_max: float = 0.0, act: int = ACT_NONE,
               out_dtype: torch.dtype = torch.float8_e4m3fn, residual: torch.Tensor | None = None,
               cfg=FP8_CONFIGS[0], pdl: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """act(x W^T + bias) [+ residual] from e4m3 x (M, K) with per-row scales (M, 1) and e4m3 W (N, K) with
    per-column scales (1, N), the scales, bias and activation applied in the GEMM's epilogue. out_dtype e4m3: written
    with a per-row scale (fp8_out_scale, from W's `gain` and max |bias| `bias_max`) as the next fp8 GEMM's input,
    (y, y_scale (M, 1)): the fp16 output, and the pass that reads it to quantize, never exist. Otherwise (y, None)
    in out_dtype, and the residual may be added there too. pdl: EngineOptions.pdl."""
    quant = out_dtype == torch.float8_e4m3fn
    if not supported_fp8(x, weight) or (residual is not None and (quant or not residual.is_contiguous())):
        raise ValueError("shape/alignment not supported by the fp8 TMA GEMM")
    (M, K), N = x.shape, weight.shape[0]
    bm, bn, bk, stages, warps, persistent, subtile = cfg
    y = torch.empty(M, N, device=x.device, dtype=out_dtype)
    y_scale = torch.empty(M, 1, device=x.device, dtype=torch.float32) if quant else x_scale
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    programs = min(tiles, _sm_count(x.device)) if persistent else tiles
    out_block = [bm, bn // 2 if subtile else bn]
    r = residual.view(M, N) if residual is not None else y
    _linear_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(weight, [bn, bk]),
        TensorDescriptor.from_tensor(y, out_block), TensorDescriptor.from_tensor(r, out_block), weight,
        bias if bias is not None else y_scale, x_scale, weight_scale, y_scale, M, N, K, gain, bias_max, ACT=act,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, FP8=True, QUANT=quant, HW=x.is_cuda, BM=bm, BN=bn,
        BK=bk, GROUP=8, PROGRAMS=programs, SUBTILE=subtile, num_stages=stages, num_warps=warps, PREFETCH=False,
        **launch_options(x.device, pdl))
    return y, (y_scale if quant else None)
