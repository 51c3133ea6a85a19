"""Test-only backends that fail in every way a real cell can (loaded via TRANSBENCH_EXTRA_BACKENDS)."""

import os
import signal
import time

from transbench.backends.base import Backend, Prepared, hf_call


def _raises(model, inputs, cell):
    raise RuntimeError("this backend always fails")


def _hangs(model, inputs, cell):
    time.sleep(3600)


def _segfaults(model, inputs, cell):
    os.kill(os.getpid(), signal.SIGSEGV)


def _segfaults_while_told(model, inputs, cell):
    """A crash that need not happen again (the OS killing the worker, a driver fault): only while FAULT_CRASH=1."""
    if os.environ.get("FAULT_CRASH") == "1":
        os.kill(os.getpid(), signal.SIGSEGV)
    return Prepared(hf_call(model, inputs))


def _oom_above(model, inputs, cell):
    """Out of memory above a fake allocator limit, in batch size."""
    import torch

    if cell.batch > int(os.environ.get("FAKE_MAX_BATCH", "2")):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (fake limit)")
    return Prepared(hf_call(model, inputs))


def _noisy_output(model, inputs, cell):
    """Right shape, wrong numbers: the correctness gate must catch it."""
    call = hf_call(model, inputs)

    def fn():
        out = call()
        out.last_hidden_state = out.last_hidden_state + 0.5 * out.last_hidden_state.std()
        return out

    return Prepared(fn)


FORCED = [
    Backend("fail-raises", _raises), Backend("fail-hangs", _hangs), Backend("fail-segv", _segfaults),
    Backend("crash-once", _segfaults_while_told),
    Backend("fake-oom", _oom_above), Backend("wrong-output", _noisy_output),
]
