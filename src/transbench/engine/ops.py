"""The one device seam: fused Triton kernels on CUDA, plain torch ops elsewhere (same math, same signatures)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .tuning import tuner

try:  # Triton is optional: the CPU path must import without it.
    from . import gemm as _gemm
    from . import kernels as _triton
except Exception:  # noqa: BLE001 - ImportError, or a broken Triton install
    _gemm = _triton = None

FP8_MAX = 448.0  # largest finite float8_e4m3fn
DEFER_LAYERNORM = True  # benchmarks/engine_bench.py turns it off to measure what it buys


@dataclass
class Norm:
    weight: torch.Tensor
    bias: torch.Tensor
    eps: float


@dataclass
class Folded:
    """A linear layer with the LayerNorm before it folded in: LN(x) W^T + b = rstd (x W'^T - mean c) + b', where
    W' = W diag(gamma), c = W' 1 and b' = b + W beta. A GEMM then reads the LayerNorm's input x as it is, and
    the normalisation becomes its epilogue, on the per-row statistics x's producer left (a Normed)."""

    norm: Norm
    weight: torch.Tensor  # W', (out, in), the activation dtype
    bias: torch.Tensor  # b', fp32
    colsum: torch.Tensor  # c, fp32, summed over W' as rounded, as the GEMM multiplies it


@dataclass
class Linear:
    weight: torch.Tensor  # (out, in), the layout F.linear / cuBLAS "TN" wants
    bias: torch.Tensor | None
    weight_fp8: torch.Tensor | None = None  # (out, in) float8_e4m3fn, per-tensor scaled
    weight_scale: torch.Tensor | None = None
    folded: Folded | None = None  # this layer with the LayerNorm always before it folded in (TritonOps.fold)


def fold(lin: Linear, norm: Norm) -> Folded:
    w = lin.weight.float()
    folded = (w * norm.weight.float()[None, :]).to(lin.weight.dtype)
    bias = w @ norm.bias.float() + (lin.bias.float() if lin.bias is not None else 0.0)
    return Folded(norm, folded, bias, folded.float().sum(1))


class Normed(NamedTuple):
    """LayerNorm(pre) that no kernel has written yet. The GEMM that produced `pre` also left each row's partial
    statistics (stats[row, c] = mean and M2 of the c-th `chunk` columns), so a GEMM reading it normalises rows
    as it loads them: no LayerNorm kernel, and no write and re-read of the normalised activations."""

    pre: torch.Tensor
    stats: torch.Tensor
    chunk: int
    norm: Norm


def quantize_fp8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # One max-abs reduction, then scale and cast in t's own dtype (|t / scale| <= 448 by construction).
    scale = (torch.linalg.vector_norm(t, float("inf"), dtype=torch.float32) / FP8_MAX).clamp(min=1e-12)
    return (t * (1.0 / scale).to(t.dtype)).to(torch.float8_e4m3fn), scale


class TorchOps:
    """Reference implementations; also what runs on CPU."""

    name = "torch"

    def fold(self, lin: Linear, norm: Norm) -> None:
        """`norm` always comes right before `lin`: routes that defer it may fold it into `lin` (TritonOps)."""

    def dense(self, x):
        """x as a tensor: a Normed gets its LayerNorm applied (TorchOps never defers one)."""
        if not isinstance(x, Normed):
            return x
        n = x.norm
        return self.add_layernorm(x.pre, None, None, n.weight, n.bias, n.eps)

    def linear(self, x: torch.Tensor, lin: Linear, bias: bool = True) -> torch.Tensor:
        if lin.weight_fp8 is not None:
            # Per-tensor dynamic activation scale: one amax reduction, then the fp8 GEMM on the tensor cores.
            x8, xs = quantize_fp8(x)
            y = torch._scaled_mm(x8, lin.weight_fp8.t(), scale_a=xs, scale_b=lin.weight_scale, out_dtype=x.dtype)
            return y + lin.bias if bias and lin.bias is not None else y
        return F.linear(x, lin.weight, lin.bias if bias else None)

    def bias_gelu(self, x: torch.Tensor, bias: torch.Tensor | None, kind: str) -> torch.Tensor:
        return F.gelu(x if bias is None else x + bias, approximate="tanh" if kind == "tanh" else "none")

    def linear_gelu(self, x: torch.Tensor, lin: Linear, kind: str) -> torch.Tensor:
        """gelu(x W^T + b): the MLP's first half."""
        return self.bias_gelu(self.linear(x, lin, bias=False), lin.bias, kind)

    def add_layernorm(self, x, residual, bias, weight, ln_bias, eps, store_residual=False):
        s = x if bias is None else x + bias
        s = s if residual is None else s + residual
        y = F.layer_norm(s, (s.shape[-1],), weight, ln_bias, eps)
        return (y, s) if store_residual else y

    def linear_add_layernorm(self, x: torch.Tensor, lin: Linear, residual: torch.Tensor, norm: Norm,
                             store_residual: bool = False):
        """LayerNorm(x W^T + b + residual), and with store_residual also the sum (pre-LN's next residual)."""
        return self.add_layernorm(self.linear(x, lin, bias=False), residual, lin.bias, norm.weight, norm.bias,
                                  norm.eps, store_residual)

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


class TritonOps(TorchOps):
    """CUDA: every GEMM and its epilogue by whichever route the tuner timed fastest for the shape (cuBLAS,
    cuBLAS with its own epilogue, or our Triton GEMM with the epilogue fused); element-wise work in Triton.
    A GEMM + LayerNorm may also defer the LayerNorm (a Normed): the GEMMs that read it then normalise on load."""

    name = "triton"

    @staticmethod
    def _tritonable(x: torch.Tensor, lin: Linear) -> bool:
        return lin.weight_fp8 is None and _gemm.supported(x, lin.weight)

    @staticmethod
    def _choose(op: str, x: torch.Tensor, lin: Linear, cands: dict, triton_cand, defer_cand=None,
                normed: bool = False) -> torch.Tensor:
        """`triton_cand(gemm_fn, cfg)` runs the op with one of our GEMM kernels; each config is a candidate (None:
        no such routes). `defer_cand(gemm_fn, cfg)` likewise returns a Normed, leaving the op's LayerNorm to the
        GEMMs that read it. `normed`: an operand is a Normed (only gemm.LN_CONFIGS then)."""
        (M, K), N = x.shape, lin.weight.shape[0]
        for cfg in (_gemm.LN_CONFIGS if normed else _gemm.CONFIGS) if triton_cand is not None else ():
            cands["triton" + "x".join(map(str, cfg))] = lambda cfg=cfg: triton_cand(_gemm.linear, cfg)
        for cfg in _gemm.splitk_configs(M) if triton_cand is not None else ():
            cands["splitk" + "x".join(map(str, cfg))] = lambda cfg=cfg: triton_cand(_gemm.linear_splitk, cfg)
        if defer_cand is not None:
            for cfg in _gemm.LN_CONFIGS:
                cands["defer+triton" + "x".join(map(str, cfg))] = lambda cfg=cfg: defer_cand(_gemm.linear, cfg)
            for cfg in _gemm.splitk_configs(M):
                cands["defer+splitk" + "x".join(map(str, cfg))] = lambda cfg=cfg: defer_cand(_gemm.linear_splitk, cfg)
        return cands[tuner().choose(f"{op}|{M}x{N}x{K}|{x.dtype}", cands)]()

    def fold(self, lin, norm):
        # A second copy of these weights (bert-base: QKV and FFN1, 99 MB in fp16), made once, outside any capture.
        if DEFER_LAYERNORM and lin.weight_fp8 is None and lin.weight.dtype in (torch.float16, torch.bfloat16):
            lin.folded = fold(lin, norm)

    @staticmethod
    def _operand(x) -> tuple[torch.Tensor, Normed | None, str]:
        """(the tensor a GEMM reads, the Normed to apply on load or None, the tuner key's mark for it)."""
        return (x.pre, x, "|normed") if isinstance(x, Normed) else (x, None, "")

    @staticmethod
    def _on_load(x, lin: Linear, triton_cand):
        """For a Normed x: our GEMM routes read x.pre against the folded weights, or there are none (no fold of
        x's LayerNorm into lin: only routes that apply it first remain)."""
        if not isinstance(x, Normed):
            return lambda gemm, cfg: triton_cand(gemm, cfg, x, lin.weight, lin.bias, {})
        f = lin.folded
        if f is None or f.norm is not x.norm:
            return None
        return lambda gemm, cfg: triton_cand(gemm, cfg, x.pre, f.weight, f.bias, {"norm_x": x, "x_colsum": f.colsum})

    def linear(self, x, lin, bias=True):
        t, normed, mark = self._operand(x)
        if not self._tritonable(t, lin):
            return super().linear(self.dense(x), lin, bias)
        b = lin.bias if bias else None
        # without its bias, a folded layer would lose W beta too: no GEMM route of ours for that
        ours = self._on_load(x, lin, lambda gemm, cfg, xt, w, wb, kw: gemm(xt, w, wb if bias else None, cfg=cfg, **kw)) \
            if bias or normed is None else None
        return self._choose(f"linear|bias={b is not None}{mark}", t, lin,
                            {("ln+" if normed else "") + "cublas": lambda: F.linear(self.dense(x), lin.weight, b)},
                            ours, normed=normed is not None)

    def bias_gelu(self, x, bias, kind):
        if bias is None:
            return super().bias_gelu(x, bias, kind)
        return _triton.bias_gelu(x, bias, kind == "tanh")

    def linear_gelu(self, x, lin, kind):
        t, normed, mark = self._operand(x)
        if not self._tritonable(t, lin) or lin.bias is None:
            return super().linear_gelu(self.dense(x), lin, kind)
        ln = "ln+" if normed else ""
        cands = {ln + "cublas+triton_gelu": lambda: _triton.bias_gelu(F.linear(self.dense(x), lin.weight), lin.bias,
                                                                      kind == "tanh")}
        if kind == "tanh":  # cuBLASLt's GELU epilogue is the tanh form: only right for tanh-GELU models
            cands[ln + "cublaslt_gelu"] = lambda: torch._addmm_activation(lin.bias, self.dense(x), lin.weight.t(),
                                                                          use_gelu=True)
        act = _gemm.ACT_GELU_TANH if kind == "tanh" else _gemm.ACT_GELU
        return self._choose(f"linear_gelu|{kind}{mark}", t, lin, cands,
                            self._on_load(x, lin, lambda gemm, cfg, xt, w, wb, kw: gemm(xt, w, wb, act, cfg=cfg, **kw)),
                            normed=normed is not None)

    def decode_attention(self, qkv, k_cache, v_cache, pos, scale):
        return _triton.decode_attention(qkv.contiguous(), k_cache, v_cache, pos, scale)

    def add_layernorm(self, x, residual, bias, weight, ln_bias, eps, store_residual=False):
        return _triton.add_layernorm(x, residual, bias, weight, ln_bias, eps, store_residual)

    def linear_add_layernorm(self, x, lin, residual, norm, store_residual=False):
        """As TorchOps', or deferred: a Normed of the sum (with store_residual, (that Normed, the sum))."""
        x = self.dense(x)
        res, normed, mark = self._operand(residual)
        if not self._tritonable(x, lin) or not res.is_contiguous():
            return super().linear_add_layernorm(x, lin, self.dense(residual), norm, store_residual)
        n = norm

        def ln(h, r, b, store=store_residual):
            return _triton.add_layernorm(h, r, b, n.weight, n.bias, n.eps, store)

        def fused(gemm, cfg):  # the GEMM writes x W^T + b + residual, itself the next residual of a pre-LN model
            h = gemm(x, lin.weight, lin.bias, residual=res, cfg=cfg, norm_residual=normed)
            return (ln(h, None, None, False), h) if store_residual else ln(h, None, None)

        def deferred(gemm, cfg):
            h, stats, chunk = gemm(x, lin.weight, lin.bias, residual=res, cfg=cfg, norm_residual=normed, stats=True)
            return (Normed(h, stats, chunk, n), h) if store_residual else Normed(h, stats, chunk, n)

        ln_ = "ln+" if normed else ""
        cands = {ln_ + "cublas+ln": lambda: ln(F.linear(x, lin.weight), self.dense(residual), lin.bias),
                 # cuBLAS adds the residual as its C operand (beta = 1): the LayerNorm reads one tensor, not two
                 ln_ + "cublas_addmm+ln": lambda: ln(torch.addmm(self.dense(residual), x, lin.weight.t()), None,
                                                     lin.bias)}
        return self._choose(f"linear_add_ln|store={store_residual}{mark}", x, lin, cands, fused,
                            deferred if DEFER_LAYERNORM else None, normed=normed is not None)


def select_ops(device: torch.device) -> TorchOps:
    return TritonOps() if device.type == "cuda" and _triton is not None else TorchOps()
