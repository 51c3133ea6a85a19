"""A test-only backend of known service time: the real model's output for its inputs, computed once, after
a fixed sleep per call (so a load test's capacity does not depend on how busy the test machine is)."""

import time

from transbench.backends.base import Backend, Prepared, hf_call
from transbench.backends.decoders import HFGenerator

SERVICE_S = 0.004


def _prepare(model, inputs, cell) -> Prepared:
    out = hf_call(model, inputs)()

    def fn():
        time.sleep(SERVICE_S)
        return out

    return Prepared(fn)


BACKEND = Backend(name="sleepy", attn="sdpa", prepare=_prepare, per_shape=True,
                  describe=f"sleeps {SERVICE_S * 1e3:g} ms a batch, a 'graph' per bucket")


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


FORCED = [Backend(name="packer", attn="sdpa", prepare=_prepare_packer, packs=True, per_shape=True,
                  describe=f"packs tokens, a graph per {PACK_STEP} of them")]


CLOCK = [0.0]  # a fake clock the ladder's captures advance: a tuned capture costs TUNED_S, an untuned one UNTUNED_S
TUNED_S, UNTUNED_S = 3.0, 0.5


def _prepare_ladder(model, inputs, cell) -> Prepared:
    """Like the fused engine prepared for a server: a 'graph' per size of a packed-token ladder, its first call a
    capture that advances CLOCK (tuned unless its tuning budget was set to 0), and, once told to reuse, a padded
    call runs the smallest captured size that holds it (engine/packing.py reuse_sizes)."""
    from transbench.engine.packing import make_packing, reuse_sizes, token_ladder

    out = hf_call(model, inputs)()
    seen: set = set()
    B, S = inputs.input_ids.shape
    sizes = token_ladder(B * S, PACK_STEP, 1.25, S)
    budgets, reuse = [], [False]

    def fn():
        use = reuse_sizes(sizes, {t for dense, t in seen if not dense}) if reuse[0] else sizes
        p = make_packing(inputs.attention_mask.cpu(), B, S, PACK_STEP, sizes=use)
        if (p.dense, p.tokens) not in seen:
            CLOCK[0] += UNTUNED_S if budgets and budgets[-1] == 0 else TUNED_S
            seen.add((p.dense, p.tokens))
        return out

    return Prepared(fn, token_bucket=PACK_STEP, graphs=lambda: len(seen), token_sizes=tuple(sizes),
                    tune_budget=budgets.append, reuse_captured=lambda on: reuse.__setitem__(0, on))


FORCED.append(Backend(name="ladder", attn="sdpa", prepare=_prepare_ladder, packs=True, per_shape=True,
                      describe="packs tokens, a graph per size of a ladder"))


class _TuningGenerator(HFGenerator):
    """Like the fused engine's generator: its first prefill is a capture that advances CLOCK (tuned unless its
    tuning budget was set to 0); the budgets it was given are kept."""

    def __init__(self, model):
        super().__init__(model)
        self.budgets, self.captured = [], False

    def set_tune_budget(self, seconds):
        self.budgets.append(seconds)

    def prefill(self, input_ids):
        if not self.captured:
            CLOCK[0] += UNTUNED_S if self.budgets and self.budgets[-1] == 0 else TUNED_S
            self.captured = True
        return super().prefill(input_ids)


FORCED.append(Backend(name="tuning-gen", attn="sdpa", prepare=_prepare, generator=lambda model, cell:
                      _TuningGenerator(model), describe="its generators tune their first capture"))
