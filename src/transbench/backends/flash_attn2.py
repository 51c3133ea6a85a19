"""FlashAttention-2 through transformers (`attn_implementation="flash_attention_2"`, the flash-attn package).

Half precision on CUDA only: that is all the flash-attn kernels run. Padded batches go through
transformers' unpad/varlen path, so the kernel never sees the padding."""

from __future__ import annotations

from .base import Backend, Prepared, hf_call


def _prepare(model, inputs, cell) -> Prepared:
    import flash_attn

    ran = model.config._attn_implementation
    if ran != "flash_attention_2":  # never time another kernel under this name
        from ..errors import Unsupported

        raise Unsupported(f"flash-attn2: transformers runs '{ran}' attention for this model, not flash_attention_2")
    return Prepared(hf_call(model, inputs), {"flash_attn_version": flash_attn.__version__})


BACKEND = Backend(
    name="flash-attn2",
    attn="flash_attention_2",
    prepare=_prepare,
    devices=("cuda",),
    dtypes=("fp16", "bf16"),
    requires=("flash_attn",),
    extra="flash",
    describe="transformers with FlashAttention-2 (flash-attn package)",
)
