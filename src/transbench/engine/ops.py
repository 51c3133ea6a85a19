"""The one device seam: fused Triton kernels on CUDA, plain torch ops elsewhere (same math, same signatures)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .tuning import tuner

try:  # Triton is optional: the CPU path must import without it.
    from . import gemm as _gemm
    from . import kernels as _triton
except Exception:  # noqa: BLE001 - ImportError, or a broken Triton install
    _gemm = _triton = None

FP8_MAX = 448.0  # largest finite float8_e4m3fn


@dataclass
class Linear:
    weight: torch.Tensor  # (out, in), the layout F.linear / cuBLAS "TN" wants
    bias: torch.Tensor | None
    weight_fp8: torch.Tensor | None = None  # (out, in) float8_e4m3fn, per-tensor scaled
    weight_scale: torch.Tensor | None = None


@dataclass
class Norm:
    weight: torch.Tensor
    bias: torch.Tensor
    eps: float


def quantize_fp8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # One max-abs reduction, then scale and cast in t's own dtype (|t / scale| <= 448 by construction).
    scale = (torch.linalg.vector_norm(t, float("inf"), dtype=torch.float32) / FP8_MAX).clamp(min=1e-12)
    return (t * (1.0 / scale).to(t.dtype)).to(torch.float8_e4m3fn), scale


class TorchOps:
    """Reference implementations; also what runs on CPU."""

    name = "torch"

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

    def embed_layernorm(self, ids, word, pos_ids, pos, tt, type_, norm: Norm, S: int) -> torch.Tensor:
        """LayerNorm(word[ids] + pos[pos_ids] + type_[tt]) of flat (T,) ids: BERT's embedding block. pos_ids None:
        the position of row r is r % S (dense (B, S) rows); tt None: token type 0."""
        p = torch.arange(ids.shape[0], device=ids.device) % S if pos_ids is None else pos_ids
        x = F.embedding(ids, word) + F.embedding(p, pos)
        x = x + (type_[0] if tt is None else F.embedding(tt, type_))
        return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, norm.eps)

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
    cuBLAS with its own epilogue, or our Triton GEMM with the epilogue fused); element-wise work in Triton."""

    name = "triton"

    @staticmethod
    def _tritonable(x: torch.Tensor, lin: Linear) -> bool:
        return lin.weight_fp8 is None and _gemm.supported(x, lin.weight)

    @staticmethod
    def _choose(op: str, x: torch.Tensor, lin: Linear, cands: dict, triton_cand) -> torch.Tensor:
        """`triton_cand(gemm_fn, cfg)` runs the op with one of our GEMM kernels; each config is a candidate."""
        (M, K), N = x.shape, lin.weight.shape[0]
        for cfg in _gemm.CONFIGS:
            cands["triton" + "x".join(map(str, cfg))] = lambda cfg=cfg: triton_cand(_gemm.linear, cfg)
        for cfg in _gemm.splitk_configs(M):
            cands["splitk" + "x".join(map(str, cfg))] = lambda cfg=cfg: triton_cand(_gemm.linear_splitk, cfg)
        return cands[tuner().choose(f"{op}|{M}x{N}x{K}|{x.dtype}", cands)]()

    def linear(self, x, lin, bias=True):
        if not self._tritonable(x, lin):
            return super().linear(x, lin, bias)
        b = lin.bias if bias else None
        return self._choose(f"linear|bias={b is not None}", x, lin,
                            {"cublas": lambda: F.linear(x, lin.weight, b)},
                            lambda gemm, cfg: gemm(x, lin.weight, b, cfg=cfg))

    def bias_gelu(self, x, bias, kind):
        if bias is None:
            return super().bias_gelu(x, bias, kind)
        return _triton.bias_gelu(x, bias, kind == "tanh")

    def linear_gelu(self, x, lin, kind):
        if not self._tritonable(x, lin) or lin.bias is None:
            return super().linear_gelu(x, lin, kind)
        cands = {"cublas+triton_gelu": lambda: _triton.bias_gelu(F.linear(x, lin.weight), lin.bias, kind == "tanh")}
        if kind == "tanh":  # cuBLASLt's GELU epilogue is the tanh form: only right for tanh-GELU models
            cands["cublaslt_gelu"] = lambda: torch._addmm_activation(lin.bias, x, lin.weight.t(), use_gelu=True)
        act = _gemm.ACT_GELU_TANH if kind == "tanh" else _gemm.ACT_GELU
        return self._choose(f"linear_gelu|{kind}", x, lin, cands,
                            lambda gemm, cfg: gemm(x, lin.weight, lin.bias, act, cfg=cfg))

    def decode_attention(self, qkv, k_cache, v_cache, pos, scale):
        return _triton.decode_attention(qkv.contiguous(), k_cache, v_cache, pos, scale)

    def embed_layernorm(self, ids, word, pos_ids, pos, tt, type_, norm, S):
        return _triton.embed_layernorm(ids, word, pos_ids, pos, tt, type_, norm.weight, norm.bias, norm.eps, S)

    def add_layernorm(self, x, residual, bias, weight, ln_bias, eps, store_residual=False):
        return _triton.add_layernorm(x, residual, bias, weight, ln_bias, eps, store_residual)

    def linear_add_layernorm(self, x, lin, residual, norm, store_residual=False):
        if not self._tritonable(x, lin) or not residual.is_contiguous():
            return super().linear_add_layernorm(x, lin, residual, norm, store_residual)
        n = norm

        def ln(h, r, b, store=store_residual):
            return _triton.add_layernorm(h, r, b, n.weight, n.bias, n.eps, store)

        def fused(gemm, cfg):  # the GEMM writes x W^T + b + residual, itself the next residual of a pre-LN model
            h = gemm(x, lin.weight, lin.bias, residual=residual, cfg=cfg)
            return (ln(h, None, None, False), h) if store_residual else ln(h, None, None)

        cands = {"cublas+ln": lambda: ln(F.linear(x, lin.weight), residual, lin.bias),
                 # cuBLAS adds the residual as its C operand (beta = 1): the LayerNorm reads one tensor, not two
                 "cublas_addmm+ln": lambda: ln(torch.addmm(residual, x, lin.weight.t()), None, lin.bias)}
        return self._choose(f"linear_add_ln|store={store_residual}", x, lin, cands, fused)


def select_ops(device: torch.device) -> TorchOps:
    return TritonOps() if device.type == "cuda" and _triton is not None else TorchOps()
