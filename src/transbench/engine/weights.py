"""Engine weights read off a transformers module tree: fused QKV, (out, in) layouts, target dtype/device."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .ops import Linear, Norm, fp8_bounds, quantize_rows


@dataclass
class Layer:
    qkv: Linear
    out: Linear
    norm1: Norm  # BERT: after attention; GPT-2: before it (ln_1)
    fc1: Linear
    fc2: Linear
    norm2: Norm  # BERT: after the MLP; GPT-2: before it (ln_2)
    scale: float  # softmax scale (GPT-2 may scale by the inverse layer index)


class Converter:
    def __init__(self, dtype: torch.dtype, device: torch.device, fp8: bool):
        self.dtype, self.device, self.fp8 = dtype, device, fp8

    def t(self, x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x.detach().to(self.device, self.dtype).contiguous()

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None, transpose: bool = False) -> Linear:
        w = self.t(weight.t() if transpose else weight)
        lin = Linear(w, self.t(bias))
        if self.fp8:
            w8, scale = quantize_rows(w)  # one scale per output channel, fixed once
            lin.weight_fp8, lin.weight_scale = w8, scale.t().contiguous()
            lin.fp8_gain, lin.fp8_bias_max = fp8_bounds(w8, lin.weight_scale, lin.bias)
        return lin

    def norm(self, ln: nn.LayerNorm) -> Norm:
        return Norm(self.t(ln.weight), self.t(ln.bias), float(ln.eps))


def bert_layer(c: Converter, layer, scale: float) -> Layer:
    sa = layer.attention.self
    qkv_w = torch.cat([sa.query.weight, sa.key.weight, sa.value.weight])
    qkv_b = torch.cat([sa.query.bias, sa.key.bias, sa.value.bias])
    return Layer(
        qkv=c.linear(qkv_w, qkv_b),
        out=c.linear(layer.attention.output.dense.weight, layer.attention.output.dense.bias),
        norm1=c.norm(layer.attention.output.LayerNorm),
        fc1=c.linear(layer.intermediate.dense.weight, layer.intermediate.dense.bias),
        fc2=c.linear(layer.output.dense.weight, layer.output.dense.bias),
        norm2=c.norm(layer.output.LayerNorm),
        scale=scale,
    )


def gpt2_layer(c: Converter, block, scale: float) -> Layer:
    # GPT-2's Conv1D stores (in, out): transpose once here so every GEMM is F.linear's (out, in).
    a, m = block.attn, block.mlp
    return Layer(
        qkv=c.linear(a.c_attn.weight, a.c_attn.bias, transpose=True),
        out=c.linear(a.c_proj.weight, a.c_proj.bias, transpose=True),
        norm1=c.norm(block.ln_1),
        fc1=c.linear(m.c_fc.weight, m.c_fc.bias, transpose=True),
        fc2=c.linear(m.c_proj.weight, m.c_proj.bias, transpose=True),
        norm2=c.norm(block.ln_2),
        scale=scale,
    )
