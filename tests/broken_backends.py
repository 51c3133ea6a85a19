"""Test-only backends, loaded with TRANSBENCH_EXTRA_BACKENDS=broken_backends (tests/ is on sys.path)."""

from __future__ import annotations

from transbench.backends.base import Backend, Prepared, hf_call
from transbench.backends.decoders import HFGenerator
from transbench.scenarios.inference.measure import output_tensor


def _noisy(model, inputs, cell) -> Prepared:
    import torch

    call = hf_call(model, inputs)

    def fn():
        out = output_tensor(call(), cell.task)
        return out + 0.5 * out.std() * torch.randn_like(out)  # a kernel bug: fast, and wrong

    return Prepared(fn, {"broken": "adds noise"})


class _NoisyPrefill(HFGenerator):
    def prefill(self, input_ids):
        logits = super().prefill(input_ids)
        return logits + logits.std() * 0.5


BACKEND = Backend(name="broken-noise", attn="sdpa", prepare=_noisy,
                  generator=lambda model, cell: _NoisyPrefill(model), describe="test only: noisy output")
