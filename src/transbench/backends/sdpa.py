"""PyTorch scaled_dot_product_attention: PyTorch's own kernel choice, or one kernel forced.

A forced kernel that cannot run the cell (dtype, head size, mask) makes torch raise; the scenario turns
that into `unsupported` with torch's reason, so a forced kernel never silently falls back to another."""

from __future__ import annotations

from .base import Backend, Prepared, hf_call

KERNELS = {
    "sdpa-math": "MATH",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
}


def _forced(kernel: str):
    def prepare(model, inputs, cell) -> Prepared:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, kernel)
        call = hf_call(model, inputs)

        def fn():
            with sdpa_kernel([backend]):
                return call()

        return Prepared(fn, {"sdpa_kernel": kernel.lower()})

    return prepare


BACKEND = Backend(
    name="sdpa",
    attn="sdpa",
    prepare=lambda model, inputs, cell: Prepared(hf_call(model, inputs)),
    describe="transformers with torch SDPA, kernel chosen by PyTorch",
)

FORCED = [
    Backend(
        name=name,
        attn="sdpa",
        prepare=_forced(kernel),
        devices=("cpu", "cuda") if name in ("sdpa-math", "sdpa-flash") else ("cuda",),
        describe=f"transformers with torch SDPA forced to {kernel.lower()}",
    )
    for name, kernel in KERNELS.items()
]
