"""The one device seam: fused Triton kernels on CUDA (one module per op: gemm, gemv, layernorm, activation, quantize,
embeddings, decode_attention, argmax; attention.py chooses its own routes), plain torch ops elsewhere (same math, same
signatures): TorchOps is every op's torch reference."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import gemm, gemv
from .activation import ACT_GELU, ACT_GELU_TANH
from .activation import bias_gelu as triton_bias_gelu
from .argmax import argmax as triton_argmax
from .config import EngineOptions
from .decode_attention import configs as decode_attention_configs
from .decode_attention import decode_attention as triton_decode_attention
from .embeddings import embed_layernorm as triton_embed_layernorm
from .launch import AVAILABLE
from .layernorm import add_layernorm as triton_add_layernorm
from .quantize import quantize_rows as triton_quantize_rows
from .tuning import Tuner
from .tuning import tuner as default_tuner

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_MIN_SCALE = 1e-12 / FP8_MAX  # an all-zero row keeps a finite scale (and quantizes to zeros)


@dataclass
class Linear:
    weight: torch.Tensor  # (out, in), the layout F.linear / cuBLAS "TN" wants
    bias: torch.Tensor | None
    weight_fp8: torch.Tensor | None = None  # (out, in) float8_e4m3fn: row n is weight[n] / weight_scale[0, n]
    weight_scale: torch.Tensor | None = None  # (1, out) float32, one per output channel, fixed at conversion
    # max over output channels n of weight_scale[n] * sum_k |weight_fp8[n, k]|, and max |bias|: what bounds a row of
    # x W^T + b from the row's e4m3 scale (fp8_out_scale), fixed at conversion with the e4m3 weights
    fp8_gain: float = 0.0
    fp8_bias_max: float = 0.0
    # (the Norm, W gamma, W beta + b) of the LayerNorm a decode GEMV runs before this projection (gemv.fold_norm),
    # made by its first call (a warm-up, never a capture: graphs.GraphCache._graph) and kept
    norm_sums: tuple | None = None


@dataclass
class Norm:
    weight: torch.Tensor | None  # None: no gamma or beta, folded into the projection after it (weights.fold)
    bias: torch.Tensor | None
    eps: float


class Fp8Act(NamedTuple):
    """A GEMM input in e4m3 with one scale per row (token): row i is data[i] * scale[i]. `hp` is the same
    activation in the model's dtype where its producer wrote that too (a LayerNorm output is also the residual)."""

    data: torch.Tensor  # (M, K) float8_e4m3fn
    scale: torch.Tensor  # (M, 1) float32
    hp: torch.Tensor | None = None


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, K) -> (e4m3 data, (rows, 1) fp32 scales): each row scaled so its max-abs maps to FP8_MAX. The
    reference of the Triton kernels that fuse this into their producers, and how weights are quantized (once)."""
    x = t.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=FP8_MIN_SCALE)
    return (x / scale).to(torch.float8_e4m3fn), scale


def fp8_bounds(weight_fp8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> tuple[float, float]:
    """(Linear.fp8_gain, Linear.fp8_bias_max) of e4m3 weights (out, in) with their (1, out) scales."""
    gain = (weight_fp8.float().abs().sum(dim=1) * weight_scale.flatten()).max()
    return float(gain), float(bias.float().abs().max()) if bias is not None else 0.0


def fp8_out_scale(x_scale: torch.Tensor, lin: Linear) -> torch.Tensor:
    """The per-row e4m3 scale of gelu(x W^T + b) for an input with per-row scales x_scale, known before the GEMM
    runs: the reference of gemm.fp8_out_scale, whose comment says why it is safe and as accurate as the row's max."""
    return torch.clamp(x_scale * lin.fp8_gain + lin.fp8_bias_max / FP8_MAX, min=0.17 / FP8_MAX)


class AttnBound(NamedTuple):
    """What lets attention write the output projection's e4m3 input without knowing its tokens' maxima: the QKV
    GEMM's input row scales and that GEMM's bounds. Every value of V's row s is at most FP8_MAX * x_scale[s] * gain
    + bias_max in magnitude (fp8_out_scale's argument), and each attention output is a convex combination of the
    sequence's V rows, so the sequence's largest bound holds for all its outputs."""

    x_scale: torch.Tensor  # (B*S, 1) fp32, the QKV GEMM's input (an Fp8Act's scale)
    gain: float  # the QKV Linear's fp8_gain
    bias_max: float  # and its fp8_bias_max


def attention_scale(bound: AttnBound, S: int) -> torch.Tensor:
    """(B*S, 1) e4m3 scales of attention's output: per sequence of S rows, its largest V bound over FP8_MAX. The
    reference of attention.triton_attention's (bound=...). Looser than each row's own max-abs by 2^4.9 to 2^5.9
    (emulated, random-weight bert-base 2 x 128 and bert-large 1 x 384), which costs no precision: a value keeps its
    3-bit mantissa down to 2^-6, 2^14.8 below FP8_MAX."""
    seq = bound.x_scale.float().reshape(-1, S).amax(dim=1, keepdim=True)
    scale = torch.clamp(seq * bound.gain + bound.bias_max / FP8_MAX, min=FP8_MIN_SCALE)
    return scale.repeat_interleave(S, dim=0)


def quantize_scaled(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """t's e4m3 codes on given (rows, 1) scales, saturating at FP8_MAX (a bound may round under a value)."""
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_gelu_out(q: Fp8Act, lin: Linear) -> Fp8Act:
    """gelu(x W^T + b) from an e4m3 input, as the next fp8 GEMM's e4m3 input with fp8_out_scale's row scales: the
    math of the fused fp8 GEMM (gemm.linear_fp8), emulated in fp32. GELU in its tanh form for exact-GELU models too,
    as that kernel computes it (gemm._epilogue says why)."""
    y = F.gelu(scaled_mm(q, lin, torch.float32, lin.bias), approximate="tanh")
    scale = fp8_out_scale(q.scale, lin)
    return Fp8Act((y / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale)


def dequantize(q: Fp8Act, dtype: torch.dtype) -> torch.Tensor:
    return (q.data.float() * q.scale).to(dtype)


def scaled_mm(q: Fp8Act, lin: Linear, out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """(x W^T [+ bias]) from e4m3 operands with per-row x scales and per-column W scales, fp32 accumulation.
    CUDA: torch._scaled_mm (cuBLASLt/CUTLASS row-wise scaling, fp8 tensor cores). Elsewhere the same math
    emulated in fp32 on the e4m3 values, so the fp8 numerics can be checked without a GPU."""
    if q.data.is_cuda:
        return torch._scaled_mm(q.data, lin.weight_fp8.t(), scale_a=q.scale, scale_b=lin.weight_scale, bias=bias,
                                out_dtype=out_dtype)
    y = (q.data.float() * q.scale) @ (lin.weight_fp8.float() * lin.weight_scale.t()).t()
    return (y if bias is None else y + bias.float()).to(out_dtype)


def hp(x, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The activation in the model's dtype `dtype` (dequantized only where no producer wrote it)."""
    if isinstance(x, torch.Tensor):
        return x
    return x.hp if x.hp is not None else dequantize(x, dtype)


def rows(x) -> int:
    """The row count of a GEMM input, a tensor or an Fp8Act."""
    return (x if isinstance(x, torch.Tensor) else x.data).shape[0]


class TorchOps:
    """Reference implementations; also what runs on CPU. options: the engine's (EngineOptions.fp8_min_rows here)."""

    name = "torch"
    # fp8 layers run their GEMMs in fp8 from this many rows; below, the fp16 forward (see FP8_MIN_ROWS). The CPU
    # emulation exists to check fp8 numerics, so it quantizes at any size.
    default_fp8_min_rows = 1
    pdl = False  # programmatic dependent launch: the Triton kernels' (TritonOps)

    def __init__(self, options: EngineOptions | None = None):
        self.options = options or EngineOptions()
        min_rows = self.options.fp8_min_rows
        self.fp8_min_rows = self.default_fp8_min_rows if min_rows is None else min_rows

    def fp8(self, lin: Linear, m: int) -> bool:
        """Whether `lin`'s GEMM over m rows is offered fp8 routes (and its input's producer writes an fp8 copy)."""
        return lin.weight_fp8 is not None and m >= self.fp8_min_rows

    def attention_bound(self, x, qkv: Linear, out: Linear) -> AttnBound | None:
        """Where attention may hand the output projection its e4m3 input: that projection runs in fp8 and the QKV
        GEMM's input came with per-row scales (a LayerNorm wrote it in e4m3 too); else None."""
        if isinstance(x, Fp8Act) and qkv.weight_fp8 is not None and self.fp8(out, rows(x)):
            return AttnBound(x.scale, qkv.fp8_gain, qkv.fp8_bias_max)
        return None

    def quantize(self, x) -> Fp8Act:
        """x as an fp8 GEMM input (per-row scales); an Fp8Act passes through."""
        if isinstance(x, Fp8Act):
            return x
        return Fp8Act(*quantize_rows(x), hp=x)

    def linear(self, x, lin: Linear, bias: bool = True) -> torch.Tensor:
        """x W^T + b. x: a tensor, or an Fp8Act from a producer that quantized it (fp8 layers)."""
        if self.fp8(lin, rows(x)):
            q = self.quantize(x)
            return scaled_mm(q, lin, lin.weight.dtype, lin.bias if bias else None)
        return F.linear(hp(x, lin.weight.dtype), lin.weight, lin.bias if bias else None)

    def bias_gelu(self, x: torch.Tensor, bias: torch.Tensor | None, kind: str) -> torch.Tensor:
        return F.gelu(x if bias is None else x + bias, approximate="tanh" if kind == "tanh" else "none")

    def linear_gelu(self, x, lin: Linear, kind: str):
        """gelu(x W^T + b): the MLP's first half; in an fp8 layer, as the next GEMM's e4m3 input (fp8_gelu_out)."""
        if self.fp8(lin, rows(x)):
            return fp8_gelu_out(self.quantize(x), lin)
        return self.bias_gelu(self.linear(hp(x, lin.weight.dtype), lin, bias=False), lin.bias, kind)

    def add_layernorm(self, x, residual, bias, weight, ln_bias, eps, store_residual=False, quant=False):
        """LayerNorm(x + bias + residual); store_residual: also the sum; quant: y as an Fp8Act (with y as its hp)."""
        s = x if bias is None else x + bias
        s = s if residual is None else s + residual
        y = F.layer_norm(s, (s.shape[-1],), weight, ln_bias, eps)
        y = self.quantize(y) if quant else y
        return (y, s) if store_residual else y

    def embed_layernorm(self, ids, word, pos_ids, pos, tt, type_, norm: Norm | None, S: int) -> torch.Tensor:
        """LayerNorm(word[ids] + pos[pos_ids] + type_[tt]) of flat (T,) ids: BERT's embedding block. pos_ids None:
        the position of row r is r % S (dense (B, S) rows), one element: that position for every row; tt None:
        token type 0; type_ None: no token types (GPT-2); norm None: the sum, not normalised (GPT-2)."""
        p = torch.arange(ids.shape[0], device=ids.device) % S if pos_ids is None else pos_ids
        x = F.embedding(ids, word) + F.embedding(p, pos)
        if type_ is not None:
            x = x + (type_[0] if tt is None else F.embedding(tt, type_))
        return x if norm is None else F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, norm.eps)

    def linear_add_layernorm(self, x, lin: Linear, residual: torch.Tensor, norm: Norm,
                             store_residual: bool = False, quant: bool = False):
        """LayerNorm(x W^T + b + residual), and with store_residual also the sum (pre-LN's next residual); quant:
        the LayerNorm's output as an Fp8Act too (the next GEMM's input in fp8 layers)."""
        return self.add_layernorm(self.linear(x, lin, bias=False), residual, lin.bias, norm.weight, norm.bias,
                                  norm.eps, store_residual, quant)

    def norm_linear(self, x, lin: Linear, norm: Norm | None = None, act: str | None = None,
                    residual: torch.Tensor | None = None):
        """act(LayerNorm(x) W^T + b) + residual, each part optional (act: a GELU kind): a pre-LN decoder's
        projections as a decode step runs them, the LayerNorm before its GEMM (gemv.py says why)."""
        h = x if norm is None else self.add_layernorm(x, None, None, norm.weight, norm.bias, norm.eps)
        y = self.linear(h, lin) if act is None else self.linear_gelu(h, lin, act)
        return y if residual is None else y + residual

    def decode_attention(self, qkv, k_cache, v_cache, pos, scale):
        """One new token per sequence: write its k, v at `pos` of the (B, heads, L, head_dim) caches and attend
        over positions 0..pos. `pos` is a 1-element device tensor, so a captured graph serves every step."""
        B, H, L, D = k_cache.shape
        q, k, v = qkv.view(B, 3, H, D).unbind(1)
        k_cache.index_copy_(2, pos, k.unsqueeze(2))
        v_cache.index_copy_(2, pos, v.unsqueeze(2))
        valid = (torch.arange(L, device=qkv.device) <= pos)[None, None, None, :]
        return F.scaled_dot_product_attention(q.unsqueeze(2), k_cache, v_cache, attn_mask=valid,
                                              scale=scale).reshape(B, H * D)

    def argmax(self, logits, pos=None):
        """(B, V) -> (B,) int64: greedy decoding's next tokens, the first index of each row's largest value; with
        the step's position (a 1-element tensor), (B + 1,): the next position after them."""
        out = logits.argmax(-1)
        return out if pos is None else torch.cat((out, pos.long() + 1))


# Rows (tokens) from which an fp8 layer's GEMMs are offered fp8 routes, listed first (tuning.rule_route, the rule
# an op not yet tuned follows, picks among them); below it an fp8 model runs the fp16 forward: the same tuning keys
# and routes, no LayerNorm fp8 copies, no quantize kernels. On an H100 the four bert-base GEMMs at 32,768 rows ran
# 1.83x faster in fp8 through torch._scaled_mm, at 128 rows 0.86x (slower), and the fp8 engine at 1 x 128 took
# 0.4196 ms against fp16's 0.387 ms with the fp8 routes on offer there. 1,024 rows is batch 8 x 128;
# `bash benchmarks/gpu.sh fp8` times fp16 and fp8 at 8 x 128 to check the crossover.
FP8_MIN_ROWS = 1024


def norm_sums(lin: Linear, norm: Norm) -> tuple[torch.Tensor, torch.Tensor]:
    """gemv.fold_norm's vectors of `lin` after `norm`, kept on the Linear for the next call with the same Norm."""
    if lin.norm_sums is None or lin.norm_sums[0] is not norm:
        lin.norm_sums = (norm, *gemv.fold_norm(lin.weight, lin.bias, norm.weight, norm.bias))
    return lin.norm_sums[1:]


class TritonOps(TorchOps):
    """CUDA: every GEMM and its epilogue by whichever route the tuner timed fastest for the shape (cuBLAS,
    cuBLAS with its own epilogue, our Triton GEMM with the epilogue fused, and for fp8 layers torch._scaled_mm
    with the quantization of its output's consumer fused into the epilogue kernel); element-wise work in Triton.
    options: the engine's (EngineOptions: pdl, prefetch_max_m, fp8_min_rows); tuner: what chooses the routes (a
    tuning.Tuner, or anything with its choose(key, candidates); None: EngineOptions.tuner, else the process's tuner of
    the default table)."""

    name = "triton"
    default_fp8_min_rows = FP8_MIN_ROWS

    def __init__(self, options: EngineOptions | None = None, tuner: Tuner | None = None):
        super().__init__(options)
        o = self.options
        self.tuner = tuner or o.tuner or default_tuner()
        self.pdl = o.pdl
        # Our GEMMs as the routes call them, with the engine's launch options bound.
        self._linear = partial(gemm.linear, pdl=o.pdl, prefetch_max_m=o.prefetch_max_m)
        self._splitk = partial(gemm.linear_splitk, pdl=o.pdl, prefetch_max_m=o.prefetch_max_m)
        self._linear_fp8 = partial(gemm.linear_fp8, pdl=o.pdl)

    def quantize(self, x) -> Fp8Act:
        return x if isinstance(x, Fp8Act) else Fp8Act(*triton_quantize_rows(x, pdl=self.pdl), hp=x)

    @staticmethod
    def _fp8_out(out, store: bool, quant: bool):
        """add_layernorm's (y, y8, scales) as an Fp8Act, inside its (y, residual) pair when store."""
        if not quant:
            return out
        y, res = out if store else (out, None)
        y = Fp8Act(y[1], y[2], hp=y[0])
        return (y, res) if store else y

    @staticmethod
    def _fp8_ours(lin: Linear, name: str, run, out_dtype: torch.dtype) -> dict:
        """{name + config: fn(q)}: `run(q, cfg)` with each tile config of our fp8 GEMM (gemm.linear_fp8) that fits
        its output dtype, for a layer with fp8 weights."""
        if lin.weight_fp8 is None:
            return {}
        return {name + "x".join(map(str, cfg)): (lambda q, cfg=cfg: run(q, cfg))
                for cfg in gemm.fp8_configs(out_dtype, lin.weight.device)}

    def _choose(self, op: str, x, lin: Linear, cands: dict, triton_cand, fp8_cands: dict | None = None):
        """Run `op` by the route the tuner picks. cands: library routes {name: fn(h)} on the input in the model's
        dtype; triton_cand(gemm_fn, cfg, h) runs it with one of our GEMM kernels (each config a candidate);
        fp8_cands: {name: fn(q)} on the input as an Fp8Act (layers with fp8 weights). Each route converts the
        input it is given (quantize or dequantize), and that conversion is part of its timed cost."""
        dtype = lin.weight.dtype
        (M, K), N = (x if isinstance(x, torch.Tensor) else x.data).shape, lin.weight.shape[0]
        h = x if isinstance(x, torch.Tensor) else x.hp

        def high():
            return hp(x, dtype)
        routes = {name: (lambda fn=fn: fn(high())) for name, fn in cands.items()}
        if h is not None and gemm.supported(h, lin.weight):
            for cfg in gemm.CONFIGS:
                routes["triton" + "x".join(map(str, cfg))] = lambda cfg=cfg: triton_cand(self._linear, cfg, h)
            for cfg in gemm.splitk_configs(M):
                routes["splitk" + "x".join(map(str, cfg))] = lambda cfg=cfg: triton_cand(self._splitk, cfg, h)
        if fp8_cands and self.fp8(lin, M):  # listed first (tuning.rule_route picks among them by the input's form)
            routes = {**{name: (lambda fn=fn: fn(self.quantize(x))) for name, fn in fp8_cands.items()}, **routes}
        form = "" if isinstance(x, torch.Tensor) else "|fp8 input"
        return routes[self.tuner.choose(f"{op}|{M}x{N}x{K}|{dtype}{form}", routes)]()

    def linear(self, x, lin, bias=True):
        b = lin.bias if bias else None

        def fp8_add(q):  # bias added by a separate kernel, where _scaled_mm cannot take it
            y = scaled_mm(q, lin, lin.weight.dtype)
            return y if b is None else y.add_(b)

        def ours(q, cfg):
            return self._linear_fp8(q.data, q.scale, lin.weight_fp8, lin.weight_scale, b,
                                    out_dtype=lin.weight.dtype, cfg=cfg)[0]
        return self._choose(f"linear|bias={b is not None}", x, lin,
                            {"cublas": lambda h: F.linear(h, lin.weight, b)},
                            lambda gemm, cfg, h: gemm(h, lin.weight, b, cfg=cfg),
                            {"fp8": lambda q: scaled_mm(q, lin, lin.weight.dtype, b), "fp8+add": fp8_add,
                             **self._fp8_ours(lin, "fp8+triton", ours, lin.weight.dtype)})

    def bias_gelu(self, x, bias, kind):
        if bias is None:
            return super().bias_gelu(x, bias, kind)
        return triton_bias_gelu(x, bias, kind == "tanh", pdl=self.pdl)

    def linear_gelu(self, x, lin, kind):
        """gelu(x W^T + b); with fp8 weights its route may return the activation as an Fp8Act (fp8+gelu_q: bias,
        GELU and the per-token quantization in one pass over the fp8 GEMM's output) for the next fp8 GEMM."""
        if lin.bias is None:
            return super().linear_gelu(x, lin, kind)
        tanh = kind == "tanh"
        cands = {"cublas+triton_gelu": lambda h: triton_bias_gelu(F.linear(h, lin.weight), lin.bias, tanh,
                                                                  pdl=self.pdl)}
        if tanh:  # cuBLASLt's GELU epilogue is the tanh form: only right for tanh-GELU models
            cands["cublaslt_gelu"] = lambda h: torch._addmm_activation(lin.bias, h, lin.weight.t(), use_gelu=True)
        act = ACT_GELU_TANH if tanh else ACT_GELU

        def gelu_q(q):
            return Fp8Act(*triton_quantize_rows(scaled_mm(q, lin, lin.weight.dtype), lin.bias, act, pdl=self.pdl))

        def ours(q, cfg):  # bias, GELU and the e4m3 output in our fp8 GEMM's epilogue
            return Fp8Act(*self._linear_fp8(q.data, q.scale, lin.weight_fp8, lin.weight_scale, lin.bias, lin.fp8_gain,
                                            lin.fp8_bias_max, act, cfg=cfg))
        fp8 = {"fp8+gelu_q": gelu_q, **self._fp8_ours(lin, "fp8+triton_gelu_q", ours, torch.float8_e4m3fn)}
        # Every fp8 route hands the next GEMM an fp8 input. An fp16-output fp8 route (bias + GELU in fp16) used to be
        # offered too, and the tuner, timing each op alone, chose it: cheaper alone, it left the next GEMM to quantize
        # its input in a pass of its own or to run in fp16. H100 profile (benchmarks/engine_bench.py --parts
        # profile-fp8, benchmarks/results/fp8_engine_h100_2026-11.md): bert-large 128 x 384 spent 8.3 ms in that fp16
        # bias+GELU and 5.1 ms re-quantizing it, of a 54.6 ms forward; bert-base 256 x 128 ran its second MLP GEMM in
        # fp16.
        return self._choose(f"linear_gelu|{kind}", x, lin, cands,
                            lambda gemm, cfg, h: gemm(h, lin.weight, lin.bias, act, cfg=cfg), fp8)

    def norm_linear(self, x, lin, norm=None, act=None, residual=None):
        if (not isinstance(x, torch.Tensor) or self.fp8(lin, rows(x))
                or (residual is not None and not residual.is_contiguous())):
            return super().norm_linear(x, lin, norm, act, residual)
        code = ACT_GELU_TANH if act == "tanh" else ACT_GELU if act is not None else 0
        ln = (None if norm is None else (norm.weight, norm.bias, norm.eps))
        sums = None if norm is None else norm_sums(lin, norm)

        def normed(h):
            return h if norm is None else self.add_layernorm(h, None, None, norm.weight, norm.bias, norm.eps)

        def library(h):  # cuBLAS, our LayerNorm before it and bias + GELU, then the residual add, after it
            if act is None:
                y = F.linear(normed(h), lin.weight, lin.bias)
            elif lin.bias is None:
                y = F.gelu(F.linear(normed(h), lin.weight), approximate="tanh" if act == "tanh" else "none")
            else:
                y = triton_bias_gelu(F.linear(normed(h), lin.weight), lin.bias, act == "tanh", pdl=self.pdl)
            return y if residual is None else y.add_(residual)
        cands = {"cublas": library}
        if gemv.supported(x, lin.weight):  # the whole projection in one kernel: gemv.py
            for cfg in gemv.configs(*x.shape):
                cands["gemv" + "x".join(map(str, cfg))] = (
                    lambda h, cfg=cfg: gemv.gemv(h, lin.weight, lin.bias, code, residual, ln, cfg, self.pdl, sums))
        key = f"norm_linear|ln={norm is not None}|act={act}|res={residual is not None}"
        return self._choose(key, x, lin, cands,
                            lambda gemm, cfg, h: gemm(normed(h), lin.weight, lin.bias, code, residual, cfg=cfg))

    def decode_attention(self, qkv, k_cache, v_cache, pos, scale):
        B, H, L, D = k_cache.shape
        cands = {"decode" + "x".join(map(str, cfg)): (lambda cfg=cfg: triton_decode_attention(
            qkv, k_cache, v_cache, pos, scale, pdl=self.pdl, cfg=cfg)) for cfg in decode_attention_configs(D)}
        return cands[self.tuner.choose(f"decode_attention|{B}x{L}x{H}x{D}|{qkv.dtype}", cands)]()

    def argmax(self, logits, pos=None):
        return triton_argmax(logits, pdl=self.pdl, pos=pos)

    def embed_layernorm(self, ids, word, pos_ids, pos, tt, type_, norm, S):
        w, b, eps = (None, None, 0.0) if norm is None else (norm.weight, norm.bias, norm.eps)
        return triton_embed_layernorm(ids, word, pos_ids, pos, tt, type_, w, b, eps, S,
                                      pdl=self.pdl)

    def add_layernorm(self, x, residual, bias, weight, ln_bias, eps, store_residual=False, quant=False):
        out = triton_add_layernorm(x, residual, bias, weight, ln_bias, eps, store_residual, quant, pdl=self.pdl)
        return self._fp8_out(out, store_residual, quant)

    def linear_add_layernorm(self, x, lin, residual, norm, store_residual=False, quant=False):
        if not residual.is_contiguous():
            return super().linear_add_layernorm(x, lin, residual, norm, store_residual, quant)
        n = norm

        def ln(h, r, b, store=store_residual):
            return self.add_layernorm(h, r, b, n.weight, n.bias, n.eps, store, quant)

        def fused(gemm, cfg, h):  # the GEMM writes x W^T + b + residual, itself the next residual of a pre-LN model
            s = gemm(h, lin.weight, lin.bias, residual=residual, cfg=cfg)
            return (ln(s, None, None, False), s) if store_residual else ln(s, None, None)

        cands = {"cublas+ln": lambda h: ln(F.linear(h, lin.weight), residual, lin.bias),
                 # cuBLAS adds the residual as its C operand (beta = 1): the LayerNorm reads one tensor, not two
                 "cublas_addmm+ln": lambda h: ln(torch.addmm(residual, h, lin.weight.t()), None, lin.bias)}

        def ours(q, cfg):  # our fp8 GEMM writes x W^T + b + residual in the model's dtype, as `fused` does
            s = self._linear_fp8(q.data, q.scale, lin.weight_fp8, lin.weight_scale, lin.bias,
                                 out_dtype=lin.weight.dtype, residual=residual, cfg=cfg)[0]
            return (ln(s, None, None, False), s) if store_residual else ln(s, None, None)
        return self._choose(f"linear_add_ln|store={store_residual}" + ("|quant" if quant else ""), x, lin, cands,
                            fused, {"fp8+ln": lambda q: ln(scaled_mm(q, lin, lin.weight.dtype), residual, lin.bias),
                                    **self._fp8_ours(lin, "fp8+triton+ln", ours, lin.weight.dtype)})


def select_ops(device: torch.device, options: EngineOptions | None = None, tuner: Tuner | None = None) -> TorchOps:
    """The ops for `device`: our Triton kernels on CUDA where Triton imports (their routes chosen by `tuner`), else
    the torch references."""
    return TritonOps(options, tuner) if device.type == "cuda" and AVAILABLE else TorchOps(options)
