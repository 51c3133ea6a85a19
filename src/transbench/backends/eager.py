"""The model's own eager attention (explicit matmul + softmax), as transformers writes it."""

from .base import Backend, Prepared, hf_call

BACKEND = Backend(
    name="eager",
    attn="eager",
    prepare=lambda model, inputs, cell: Prepared(hf_call(model, inputs)),
    describe="transformers with eager attention",
)
