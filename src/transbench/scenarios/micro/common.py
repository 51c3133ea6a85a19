"""What the micro-benchmarks share: a measured point, timing of short calls, cache-defeating operand
rotation, the ceilings of the device, and turning an out-of-memory into a row."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ...measure import device as dev
from ...measure import peaks, record, timer

# One sample times enough back-to-back calls to last about this long, so a 5-microsecond kernel is not
# timed against the resolution of one event pair and the launch of a lone call.
SAMPLE_TARGET_MS = 2.0
MAX_CALLS_PER_SAMPLE = 2000
# Operand sets cycled through are, together, at least this many times the L2 cache, so each call reads
# its operands from device memory rather than from the cache the previous call left them in.
L2_MULTIPLE = 2
MAX_SETS = 4096


@dataclass
class Point:
    """One measured grid point: a row of the table, a cell of the store."""

    key: dict
    status: str
    record: dict = field(default_factory=dict)
    samples_ms: list[float] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class Context:
    """The device a micro run measures, and its datasheet row (None on CPUs and unknown GPUs)."""

    device: object
    gpu: dev.GpuInfo | None
    peak: peaks.PeakRow | None
    db: str
    timer: timer.TimerConfig

    @property
    def hardware(self) -> str:
        """The name measured ceilings are filed under: the GPU's name, or 'cpu'."""
        return self.gpu.name if self.gpu else "cpu"

    def base_record(self, dtype: str) -> dict:
        return {"dtype": dtype, "device": str(self.device), "gpu": self.gpu.name if self.gpu else None}


def make_context(device, db: str, min_time: float, warmup: int) -> Context:
    gpu = dev.gpu_info(device)
    row = peaks.lookup(gpu.name, gpu.memory_gb) if gpu else None
    cfg = timer.TimerConfig(warmup=warmup, min_time_s=min_time, min_count=10, max_count=10_000, max_time_s=20.0)
    return Context(device, gpu, row, db, cfg)


def l2_bytes(device) -> int | None:
    import torch

    if device.type != "cuda":
        return None
    return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", None) or None


def operand_sets(set_bytes: int, device) -> int:
    """How many independent operand sets to cycle through (1 on CPUs and when one set outgrows L2)."""
    l2 = l2_bytes(device)
    if not l2:
        return 1
    return max(1, min(MAX_SETS, math.ceil(L2_MULTIPLE * l2 / max(set_bytes, 1))))


def cycling(calls: list[Callable[[], object]]) -> Callable[[], object]:
    """One call after another of `calls`, round robin."""
    if len(calls) == 1:
        return calls[0]
    state = {"i": 0}
    n = len(calls)

    def call():
        i = state["i"]
        state["i"] = i + 1 if i + 1 < n else 0
        return calls[i]()

    return call


def time_calls(fn: Callable[[], object], ctx: Context) -> tuple[timer.Sampled, int]:
    """Per-call timings (the sampler's, divided by the calls per sample) and the calls per sample. Each
    sample times `reps` back-to-back calls with one pair of CUDA events, so short kernels are timed as they
    run in a stream; the clock, power and energy of the region come with them."""
    clock = timer.Clock(ctx.device)
    for _ in range(2):
        clock.time_ms(fn)
    one = min(clock.time_ms(fn) for _ in range(3))
    reps = max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(SAMPLE_TARGET_MS / max(one, 1e-4))))

    def loop():
        for _ in range(reps):
            fn()

    return timer.sample(loop, ctx.device, ctx.timer).per_call(reps), reps


def timing_record(sampled: timer.Sampled, **kwargs) -> tuple[dict, timer.Stats, list[str]]:
    """The one record builder's keys (measure/record.py) for per-call timings, with their statistics."""
    rec, warnings = record.timing_record(sampled, **kwargs)
    return rec, sampled.stats, warnings


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64."""
    import torch

    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(o).all():
        return float("inf")
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r).clamp_min(1e-30))


def failure_point(key: dict, record: dict, exc: BaseException) -> Point:
    """An out-of-memory becomes an `oom` row, any other failure an `error` row, with its message."""
    text = str(exc).strip()
    message = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:500]
    return Point(key, "oom" if dev.is_oom(exc) else "error", record, error=message)


def guarded(key: dict, record: dict, ctx: Context, measure: Callable[[], Point]) -> Point:
    """Run `measure`; a failure becomes a row (failure_point), so a size that does not fit never ends
    the sweep."""
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - every failure becomes a stored row with its message
        point = failure_point(key, record, exc)
    dev.free_memory(ctx.device)  # after the except block: the traceback no longer holds the tensors
    return point


def first_tensor(out):
    """transformers modules return a tensor or a tuple whose first item is the hidden states."""
    return out[0] if isinstance(out, (tuple, list)) else out

