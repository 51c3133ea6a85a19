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


PACK_STEP = 8


def _prepare_packer(model, inputs, cell) -> Prepared:
    """Like the fused engine on CUDA: one 'graph' per packed token count, the first call of a count captures it
    (the engine's own packing decides the count); the output is the real model's for the prepared inputs."""
    from transbench.engine.packing import make_packing

    out = hf_call(model, inputs)()
    seen: set = set()

    def fn():
        B, S = inputs.input_ids.shape
        p = make_packing(inputs.attention_mask.cpu(), B, S, PACK_STEP)
        seen.add((p.dense, p.tokens))
        return out

    return Prepared(fn, token_bucket=PACK_STEP, graphs=lambda: len(seen))


FORCED = [Backend(name="packer", attn="sdpa", prepare=_prepare_packer, packs=True,
                  describe=f"packs tokens, a graph per {PACK_STEP} of them")]
