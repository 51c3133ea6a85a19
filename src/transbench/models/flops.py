"""Analytic FLOPs of transformer inference and training, from the model's shape.

Counted: matrix products only, 2 FLOPs per multiply-add (element-wise work, softmax and LayerNorm are
a fraction of a percent and are left out, as in the usual MFU convention). Per layer and per sequence
of ``s`` real tokens, hidden ``h``, FFN width ``i``:

    QKV projection        2 * s * h * 3h  = 6 s h^2
    attention scores      2 * s * s * h   (Q K^T over all heads)
    attention x values    2 * s * s * h
    output projection     2 * s * h * h   = 2 s h^2
    FFN (two matrices)    2 * s * h * i * 2 = 4 s h i
    layer total           8 s h^2 + 4 s h i + 4 s^2 h      (= 24 s h^2 + 4 s^2 h when i = 4h)

Decoders need only the causal half of the attention products: s (s + 1) / 2 query-key pairs, so their
attention terms are 4 h * s (s + 1) / 2 = 2 s (s + 1) h. Counting the full square (what eager attention
computes and then masks) would credit a causal kernel with work it never does and overstate MFU.
Heads on top of the last layer:

    mlm                   2 s h^2 (transform) + 2 s h V (decoder)
    causal-lm             2 s h V
    token-classification  2 s h C          qa  2 s h * 2
    classification        2 h^2 (pooler, bert only) + 2 h C

Embedding lookups are gathers: no FLOPs. Training is 3 x forward (backward = 2 x forward), 4 x forward
with activation checkpointing (one more forward). Generation: the prompt's forward, then per new token
at context length t: 8 h^2 + 4 h i + 4 t h per layer and 2 h V for the LM head.
"""

from __future__ import annotations

from collections.abc import Sequence

from .presets import Preset

NUM_LABELS = 2


def attention_flops(shape: Preset, seq: int) -> int:
    """Scores and values products of one layer: the full square for encoders, the causal half for decoders."""
    if shape.family == "gpt2":
        return 2 * seq * (seq + 1) * shape.hidden
    return 4 * seq * seq * shape.hidden


def layer_flops(shape: Preset, seq: int) -> int:
    h, i = shape.hidden, shape.intermediate
    return 8 * seq * h * h + 4 * seq * h * i + attention_flops(shape, seq)


def head_flops(shape: Preset, task: str, seq: int) -> int:
    h, v, c = shape.hidden, shape.vocab, NUM_LABELS
    if task == "mlm":
        return 2 * seq * h * h + 2 * seq * h * v
    if task in ("causal-lm", "generate"):
        return 2 * seq * h * v
    if task == "token-classification":
        return 2 * seq * h * c
    if task == "qa":
        return 2 * seq * h * 2
    if task == "classification":
        return (2 * h * h if shape.family == "bert" else 0) + 2 * h * c
    return 0


def forward_flops(shape: Preset, seq_lens: int | Sequence[int], task: str = "base") -> int:
    """FLOPs of one forward over a batch whose real sequence lengths are `seq_lens`."""
    lens = [seq_lens] if isinstance(seq_lens, int) else list(seq_lens)
    return sum(shape.layers * layer_flops(shape, s) + head_flops(shape, task, s) for s in lens)


def training_flops(shape: Preset, seq_lens: int | Sequence[int], task: str, grad_ckpt: bool = False) -> int:
    return (4 if grad_ckpt else 3) * forward_flops(shape, seq_lens, task)


def decode_token_flops(shape: Preset, context: int) -> int:
    """FLOPs to produce one new token when `context` tokens (the new one included) are in the cache."""
    h, i = shape.hidden, shape.intermediate
    return shape.layers * (8 * h * h + 4 * h * i + 4 * context * h) + 2 * h * shape.vocab


def generation_flops(shape: Preset, prompt: int, new_tokens: int) -> int:
    """Prompt forward (with its LM head) plus each further decoded token, per sequence."""
    return forward_flops(shape, prompt, "causal-lm") + sum(
        decode_token_flops(shape, prompt + k + 1) for k in range(new_tokens - 1)
    )


def kv_cache_bytes(shape: Preset, seq: int, bytes_per_element: int) -> int:
    """Keys and values of every layer for one sequence: 2 x layers x hidden x seq x bytes."""
    return 2 * shape.layers * shape.hidden * seq * bytes_per_element
