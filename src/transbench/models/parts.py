"""FLOPs and minimum bytes moved by each part of one transformer layer, for the micro breakdown.

Per layer, for ``b`` sequences of ``s`` tokens (``T = b s``), hidden ``h``, ``a`` heads, FFN width ``i``,
``e`` bytes per element. Matrix products count 2 FLOPs per multiply-add; element-wise work counts one
FLOP per arithmetic step of the textbook formula, per element:

    bias add 1 · residual add 1 · LayerNorm 7 (mean 1, centre 1, square 1, sum 1, normalise 1, affine 2)
    the FFN's activation ``act``: the model's own (ACTIVATION_FLOPS), e.g. GELU's erf form (BERT's "gelu") 5
    (x/sqrt2, erf, +1, *x, *0.5), its tanh form (GPT-2's "gelu_new") 9, ReLU 1
    softmax 6 per attention score (scale, max, subtract, exp, sum, divide)

    part             matrix FLOPs              element-wise FLOPs          minimum bytes / e
    qkv              2 T h 3h                  3 T h (bias)                T h + 3h^2 + 3h + 3 T h
    attention core   4 b s^2 h (half: causal)  6 a b s^2 (half: causal)    3 T h + T h
    output proj      2 T h^2                   T h                         T h + h^2 + h + T h
    dense            2 T h i                   T i                         T h + h i + i + T i
    dense+act        2 T h i                   T i (1 + act)               T h + h i + i + T i
    ffn (sub-layer)  4 T h i                   T i (1 + act) + 9 T h       T h + 2 h i + i + h + 2h + T h
    layernorms       0                         2 x 7 T h                   2 (T h + 2h + T h)
    attention block  qkv + core + proj         theirs + 8 T h              T h + 4h^2 + 4h + 2h + T h
    layer            attention block + ffn     theirs                      T h + all weights + T h

(9 T h in the FFN and 8 T h in the attention block: output bias 1, residual 1, LayerNorm 7, the
attention's output bias being counted in ``output proj``.)

"Minimum bytes" is what an ideal fused kernel must move: each input (activations, weights, biases,
LayerNorm parameters) read once and each output written once; the real, unfused kernels move more,
which is the point of comparing. Arithmetic intensity = FLOPs / minimum bytes. The sub-layers are
arranged as their model arranges them: BERT's attention block is self-attention, output projection,
residual and LayerNorm (post-LN); GPT-2's is LayerNorm, self-attention, projection and residual (pre-LN);
the FFN likewise. Causal attention (GPT-2) counts the half of the score matrix the kernels compute
(``flops.attention_flops``, the same count MFU uses).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError
from .flops import attention_flops
from .presets import Preset

PARTS = ("qkv", "attention core", "output proj", "dense", "dense+act", "ffn", "layernorms",
         "attention block", "layer")
LAYERNORM_FLOPS = 7
# FLOPs per element of each FFN activation, by its transformers name (ACT2FN: config.json's hidden_act or
# activation_function), one per step of its textbook formula. The count follows the activation the layer runs: keyed
# by family, a BERT checkpoint of hidden_act "relu" was counted as GELU's 5, its dense+act FLOPs and intensity
# overstated.
# 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): x^3 2, *0.044715, +x, *sqrt(2/pi), tanh, +1, *x, *0.5
_TANH_GELU = 9
_SIGMOID = 4  # 1 / (1 + exp(-x)): negate, exp, +1, divide
ACTIVATION_FLOPS = {
    "linear": 0, "relu": 1, "tanh": 1,
    "relu6": 2, "leaky_relu": 2, "relu2": 2,  # max and min; a multiply and a max; max, then square
    "gelu": 5, "gelu_python": 5,  # x/sqrt2, erf, +1, *x, *0.5
    "gelu_10": 7,  # GELU, clipped to [-10, 10]
    "gelu_new": _TANH_GELU, "gelu_pytorch_tanh": _TANH_GELU, "gelu_fast": _TANH_GELU, "gelu_accurate": _TANH_GELU,
    "gelu_python_tanh": _TANH_GELU,
    "sigmoid": _SIGMOID, "silu": _SIGMOID + 1, "swish": _SIGMOID + 1,  # silu: x * sigmoid(x)
    "quick_gelu": _SIGMOID + 2,  # x * sigmoid(1.702 x)
    "mish": 5,  # x * tanh(log(1 + exp(x)))
    "hardswish": 5,  # x * min(max(x + 3, 0), 6) / 6
}
SOFTMAX_FLOPS = 6


def activation(shape: Preset) -> str | None:
    """The FFN activation `shape`'s layer runs: its config's (a checkpoint's config.json), else its family's default,
    as transformers builds the layer; None for a family that names none."""
    from .build import activation_field, preset_config

    cfg = preset_config(shape)
    name = activation_field(cfg)
    return getattr(cfg, name) if name else None


def activation_flops(shape: Preset) -> int:
    """FLOPs per element of `shape`'s FFN activation; SpecError for one without a count."""
    act = activation(shape)
    if not isinstance(act, str) or act not in ACTIVATION_FLOPS:
        raise SpecError(f"{shape.name}: its FFN activation {str(act)[:40]!r} has no FLOP count here "
                        f"(counted: {', '.join(sorted(ACTIVATION_FLOPS))}): micro breakdown cannot weigh its parts")
    return ACTIVATION_FLOPS[act]


@dataclass(frozen=True)
class PartCost:
    name: str
    matmul_flops: int
    elementwise_flops: int
    min_bytes: int

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.elementwise_flops

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved (the roofline's x axis)."""
        return self.flops / self.min_bytes


def layer_parts(shape: Preset, batch: int, seq: int, bytes_per_element: int) -> dict[str, PartCost]:
    """The cost of each part in PARTS for one layer of `shape` over batch x seq tokens."""
    b, s, h, i, a, e = batch, seq, shape.hidden, shape.intermediate, shape.heads, bytes_per_element
    t = b * s
    causal = shape.family == "gpt2"
    act = activation_flops(shape)
    ln_params = 2 * h  # weight and bias

    def cost(name, mm, ew, elements):
        return PartCost(name, mm, ew, elements * e)

    core_mm = b * attention_flops(shape, s)
    core_ew = SOFTMAX_FLOPS * b * a * s * s
    if causal:
        core_ew //= 2
    qkv = cost("qkv", 2 * t * h * 3 * h, 3 * t * h, t * h + 3 * h * h + 3 * h + 3 * t * h)
    core = cost("attention core", core_mm, core_ew, 3 * t * h + t * h)
    proj = cost("output proj", 2 * t * h * h, t * h, t * h + h * h + h + t * h)
    dense = cost("dense", 2 * t * h * i, t * i, t * h + h * i + i + t * i)
    dense_act = cost("dense+act", 2 * t * h * i, t * i * (1 + act), t * h + h * i + i + t * i)
    residual_ln = t * h + LAYERNORM_FLOPS * t * h
    ffn = cost("ffn", 4 * t * h * i, t * i * (1 + act) + t * h + residual_ln,
               t * h + 2 * h * i + i + h + ln_params + t * h)
    lns = cost("layernorms", 0, 2 * LAYERNORM_FLOPS * t * h, 2 * (t * h + ln_params + t * h))
    attn_weights = 4 * h * h + 4 * h
    attn = cost("attention block", qkv.matmul_flops + core.matmul_flops + proj.matmul_flops,
                qkv.elementwise_flops + core.elementwise_flops + proj.elementwise_flops + residual_ln,
                t * h + attn_weights + ln_params + t * h)
    ffn_weights = 2 * h * i + i + h
    layer = cost("layer", attn.matmul_flops + ffn.matmul_flops, attn.elementwise_flops + ffn.elementwise_flops,
                 t * h + attn_weights + ffn_weights + 2 * ln_params + t * h)
    return {p.name: p for p in (qkv, core, proj, dense, dense_act, ffn, lns, attn, layer)}


def attention_ffn_ratio(shape: Preset, seq: int) -> float:
    """Matrix FLOPs of the attention block over those of the FFN (the seeds' 0.53 for bert-large, s=128)."""
    p = layer_parts(shape, 1, seq, 1)
    return p["attention block"].matmul_flops / p["ffn"].matmul_flops
