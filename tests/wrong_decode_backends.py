"""A test-only backend whose decode steps go wrong after the prefill's gate, loaded with
TRANSBENCH_EXTRA_BACKENDS=wrong_decode_backends (tests/ is on sys.path)."""

from __future__ import annotations

from transbench.backends.base import Backend, Prepared, hf_call
from transbench.backends.decoders import HFGenerator


class _WrongAfterTwo(HFGenerator):
    """A right prefill and two right decode steps; then each step feeds its cache a token other than the one it was
    given, as a step reading a cache gone wrong would decode."""

    def prefill(self, input_ids):
        self.k = 0
        return super().prefill(input_ids)

    def decode(self, next_ids):
        self.k += 1
        return super().decode(next_ids if self.k < 3 else (next_ids + 1) % self.model.config.vocab_size)


BACKEND = Backend(name="broken-decode", attn="sdpa", prepare=lambda model, inputs, cell: Prepared(hf_call(model, inputs),
                  {}), generator=lambda model, cell: _WrongAfterTwo(model), describe="test only: wrong decode steps")
