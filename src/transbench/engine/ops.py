"""The one device seam: fused Triton kernels on CUDA, plain torch ops elsewhere (same math, same signatures)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .tuning import tuner

try:  # Triton is optional: the CPU path must import without it.
    from . import kernels as _triton
except Exception:  # noqa: BLE001 - ImportError, or a broken Triton install
    _triton = None

FP8_MAX = 448.0  # largest finite float8_e4m3fn


@dataclass
class Linear:
    weight: torch.Tensor  # (out, in), the layout F.linear / cuBLAS "TN" wants
    bias: torch.Tensor | None
    weight_fp8: torch.Tensor | None = None  # (out, in) float8_e4m3fn, per-tensor scaled
    weight_scale: torch.Tensor | None = None


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

    def bias_gelu(self, x: torch.Tensor, bias: torch.Tensor, kind: str) -> torch.Tensor:
        return F.gelu(x + bias, approximate="tanh" if kind == "tanh" else "none")

    def linear_gelu(self, x: torch.Tensor, lin: Linear, kind: str) -> torch.Tensor:
        h = self.linear(x, lin, bias=False)
        return self.bias_gelu(h, lin.bias, kind) if lin.bias is not None else \
            F.gelu(h, approximate="tanh" if kind == "tanh" else "none")

    def add_layernorm(self, x, residual, bias, weight, ln_bias, eps, store_residual=False):
        s = x if bias is None else x + bias
        s = s if residual is None else s + residual
        y = F.layer_norm(s, (s.shape[-1],), weight, ln_bias, eps)
        return (y, s) if store_residual else y


class TritonOps(TorchOps):
    """CUDA: bias+GELU and bias+residual+LayerNorm each one Triton kernel; GEMMs stay on cuBLAS."""

    name = "triton"

    def bias_gelu(self, x, bias, kind):
        return _triton.bias_gelu(x, bias, kind == "tanh")

    def linear_gelu(self, x, lin, kind):
        """The MLP's first GEMM + bias + GELU, by whichever route is fastest for this shape."""
        if lin.weight_fp8 is not None or lin.bias is None or x.dim() != 2:
            return super().linear_gelu(x, lin, kind)
        tanh = kind == "tanh"
        cands = {"cublas+triton": lambda: super(TritonOps, self).linear_gelu(x, lin, kind)}
        if tanh:  # cuBLASLt's GELU epilogue is the tanh form: exact only for tanh-GELU models
            cands["cublaslt_epilogue"] = lambda: torch._addmm_activation(lin.bias, x, lin.weight.t(), use_gelu=True)
        for cfg in _triton.GEMM_CONFIGS:
            cands["triton_gemm" + "x".join(map(str, cfg))] = \
                lambda cfg=cfg: _triton.linear_gelu(x, lin.weight, lin.bias, tanh, cfg)
        (M, K), N = x.shape, lin.weight.shape[0]
        return cands[tuner().choose(f"linear_gelu|{M}x{N}x{K}|{x.dtype}|{kind}", cands)]()

    def add_layernorm(self, x, residual, bias, weight, ln_bias, eps, store_residual=False):
        return _triton.add_layernorm(x, residual, bias, weight, ln_bias, eps, store_residual)


def select_ops(device: torch.device) -> TorchOps:
    return TritonOps() if device.type == "cuda" and _triton is not None else TorchOps()
