"""What every Triton kernel of the engine shares: the optional Triton import, programmatic dependent launch, launch
sizes, and the process's zeroed scratch.

Triton is optional: without it (or with a broken install) the op modules still import, their kernels refuse to
launch, and the engine runs its torch ops (ops.select_ops). No op module imports Triton itself."""
from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    from triton.tools.tensor_descriptor import TensorDescriptor
except Exception:  # noqa: BLE001 - ImportError, or a broken Triton install
    triton = tl = TensorDescriptor = gdc_launch_dependents = gdc_wait = None

AVAILABLE = triton is not None


class _Missing:
    """Stands for the triton module where it is not installed: a launch function called anyway says so."""

    def __getattr__(self, name):
        raise RuntimeError(f"triton.{name}: Triton is not installed (the engine's torch path runs without it)")


if not AVAILABLE:
    triton = _Missing()


class _NoTriton:
    """A kernel defined without Triton installed: launching it says so (the torch path never launches one)."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        raise RuntimeError(f"{self.fn.__name__} is a Triton kernel and Triton is not installed")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.fn.__name__} is a Triton function and Triton is not installed")


def jit(fn=None, **kwargs):
    """triton.jit (its keyword arguments too), or without Triton a stand-in that refuses to launch. Kernel
    signatures may name tl.constexpr: every op module has `from __future__ import annotations`, so those are
    strings until Triton reads them."""
    if not AVAILABLE:
        return _NoTriton(fn) if fn is not None else _NoTriton
    return triton.jit(fn, **kwargs) if fn is not None else triton.jit(**kwargs)


@functools.cache
def _sm90_or_newer(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (9, 0)


def pdl_on(device: torch.device, pdl: bool = True) -> bool:
    """Programmatic dependent launch (Hopper on; EngineOptions.pdl): a kernel may start while the previous one in
    the stream finishes, so its launch and prologue hide under that tail. Every kernel launched so calls
    `pdl_enter` first."""
    return pdl and device.type == "cuda" and _sm90_or_newer(device)


@jit
def pdl_enter(PDL: tl.constexpr):
    # Let the next kernel launch, then wait for the previous one (its writes become visible) before touching
    # activations or outputs. Triggering first lets kernels further on take SMs as they free up and fetch their
    # weights before their own waits, where triggering after the wait allowed one kernel of lookahead: gpt2's
    # decode step went from 0.1800 to 0.1779 ms, gpt2-medium's at batch 4 from 0.5768 to 0.5700, bert-base 1 x 128
    # from 0.3188 to 0.3127 (benchmarks/results/engine_limits_h200_2026-11.md). The waits still chain: a kernel
    # finishes only after its own wait, so waiting on the previous kernel waits on every kernel before it. What
    # a kernel reads before its wait must therefore be written before the graph's replay began (weights, the
    # position, earlier steps' cache rows), never by a kernel of the same replay.
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


def launch_options(device: torch.device, pdl: bool = True) -> dict:
    """The PDL constexpr and the launch option that go together on every kernel launch (pdl: EngineOptions.pdl)."""
    on = pdl_on(device, pdl)
    return {"PDL": on, "launch_pdl": on}


def warps(block: int) -> int:
    """Warps for a program holding `block` elements of a row."""
    return max(1, min(16, block // 256))


_scratch: dict = {}


def scratch(device: torch.device, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """Zeroed scratch kept for the process: CUDA graphs capture its address, so it must never move or be
    freed. Kernels that count arrivals in it leave the counters at zero for the next call."""
    key = (device, dtype, numel)
    if key not in _scratch:
        _scratch[key] = torch.zeros(numel, device=device, dtype=dtype)
    return _scratch[key]
