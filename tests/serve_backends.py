"""A test-only backend of known service time: the real model's output for its inputs, computed once, after
a fixed sleep per call (so a load test's capacity does not depend on how busy the test machine is)."""

import time

from transbench.backends.base import Backend, Prepared, hf_call

SERVICE_S = 0.004


def _prepare(model, inputs, cell) -> Prepared:
    out = hf_call(model, inputs)()

    def fn():
        time.sleep(SERVICE_S)
        return out

    return Prepared(fn)


BACKEND = Backend(name="sleepy", attn="sdpa", prepare=_prepare, describe=f"sleeps {SERVICE_S * 1e3:g} ms a batch")
