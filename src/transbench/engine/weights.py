"""Engine weights read off a transformers module tree: fused QKV, (out, in) layouts, target dtype/device."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .gemv import fold_norm
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

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None, transpose: bool = False,
               after: nn.LayerNorm | None = None) -> Linear:
        """after: the LayerNorm whose only reader this projection is (pre-LN GPT-2), its gamma and beta folded in:
        LayerNorm(x) W^T + b = norm(x) (W diag(gamma))^T + (W beta + b), norm without weights (fold)."""
        weight = weight.t() if transpose else weight
        if after is not None:
            weight, bias = fold(weight, bias, after)
        w = self.t(weight)
        lin = Linear(w, self.t(bias))
        if self.fp8:
            w8, scale = quantize_rows(w)  # one scale per output channel, fixed once
            lin.weight_fp8, lin.weight_scale = w8, scale.t().contiguous()
            lin.fp8_gain, lin.fp8_bias_max = fp8_bounds(w8, lin.weight_scale, lin.bias)
        return lin

    def norm(self, ln: nn.LayerNorm, folded: bool = False) -> Norm:
        """folded: its gamma and beta live in the projections after it (linear(after=ln)), so it normalises only."""
        if folded:
            return Norm(None, None, float(ln.eps))
        n = ln.normalized_shape[-1]  # a LayerNorm without weights or bias (elementwise_affine, bias=False): 1 and 0
        return Norm(self.t(ln.weight if ln.weight is not None else torch.ones(n)),
                    self.t(ln.bias if ln.bias is not None else torch.zeros(n)), float(ln.eps))


def fold(weight: torch.Tensor, bias: torch.Tensor | None, ln: nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """(W diag(gamma), W beta + b) in fp32, (out, in) weight. Folded once here, the decode GEMV's LayerNorm prologue
    multiplies by nothing more, and the prefill's LayerNorms run without weights: gpt2-medium's decode at batch 4
    went from 0.5685 to 0.5318 ms a token on one tuned table (benchmarks/results/engine_limits_h200_2026-11.md,
    "GPT-2's LayerNorm weights folded into the projections after them")."""
    w = weight.detach().float()
    b = fold_norm(w, bias, None, ln.bias)[1]  # W beta + b, as the GEMV's prologue takes it for an unfolded norm
    return (w * ln.weight.detach().float() if ln.weight is not None else w), b


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


def distilbert_layer(c: Converter, block, scale: float) -> Layer:
    """DistilBERT's TransformerBlock: BERT's post-LN layer under other names (q_lin, sa_layer_norm, ffn.lin1, ...)."""
    a, f = block.attention, block.ffn
    return Layer(
        qkv=c.linear(torch.cat([a.q_lin.weight, a.k_lin.weight, a.v_lin.weight]),
                     torch.cat([a.q_lin.bias, a.k_lin.bias, a.v_lin.bias])),
        out=c.linear(a.out_lin.weight, a.out_lin.bias),
        norm1=c.norm(block.sa_layer_norm),
        fc1=c.linear(f.lin1.weight, f.lin1.bias),
        fc2=c.linear(f.lin2.weight, f.lin2.bias),
        norm2=c.norm(block.output_layer_norm),
        scale=scale,
    )


def gpt2_layer(c: Converter, block, scale: float) -> Layer:
    # GPT-2's Conv1D stores (in, out): transpose once here so every GEMM is F.linear's (out, in).
    a, m = block.attn, block.mlp
    # ln_1 and ln_2 feed only QKV and FC1: their weights are folded into them (fold).
    return Layer(
        qkv=c.linear(a.c_attn.weight, a.c_attn.bias, transpose=True, after=block.ln_1),
        out=c.linear(a.c_proj.weight, a.c_proj.bias, transpose=True),
        norm1=c.norm(block.ln_1, folded=True),
        fc1=c.linear(m.c_fc.weight, m.c_fc.bias, transpose=True, after=block.ln_2),
        fc2=c.linear(m.c_proj.weight, m.c_proj.bias, transpose=True),
        norm2=c.norm(block.ln_2, folded=True),
        scale=scale,
    )
