"""The one sampler: warm-up (a count and a minimum time), adaptive stop on a minimum time and count, robust
statistics over the raw samples, and the device context of the timed region. Every scenario times through
`sample` / `sample_steps` (the engine's tuner keeps its own timer: the engine depends on nothing here)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from .context import DeviceContext

NOISY_IQR_RATIO = 0.05


@dataclass(frozen=True)
class TimerConfig:
    warmup: int = 3
    min_time_s: float = 1.0
    min_count: int = 10
    max_count: int = 10_000
    max_time_s: float = 120.0  # a hard stop for very slow cells, whatever min_count says
    warmup_time_s: float = 0.25  # GPU only: clocks ramp up from idle over a fraction of a second


@dataclass(frozen=True)
class Stats:
    median_ms: float
    mean_ms: float
    min_ms: float
    p90_ms: float | None  # None: too few samples to carry it (carried)
    p99_ms: float | None
    iqr_ms: float | None
    std_ms: float
    n: int
    noisy: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _quantile(sorted_ms: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted data."""
    pos = q * (len(sorted_ms) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (pos - lo)


def carried(q: float, n: int) -> bool:
    """Whether n samples carry the q-quantile (0 < q < 1): the median always, any other once n x min(q, 1 - q) >= 1,
    one sample expected beyond it: p90 from 10 samples, p99 from 100, p99.9 from 1,000, the IQR's quartiles from 4.
    Below that the interpolation lands between the few most extreme samples, which is no estimate of the percentile:
    5 samples gave a "p99" of 0.917 ms that was the slowest's neighbourhood, and one sample an IQR of 0, "0.0%", a
    steady cell. Such a percentile is stored empty; the raw samples stay (every percentile is computed here or
    through this rule: scenarios/serve/stats.spread)."""
    return q == 0.5 or n * min(q, 1.0 - q) >= 1.0 - 1e-9


def summarize(samples_ms: list[float]) -> Stats:
    if not samples_ms:
        raise ValueError("no samples to summarize")
    s = sorted(samples_ms)
    n = len(s)
    median = _quantile(s, 0.5)
    iqr = _quantile(s, 0.75) - _quantile(s, 0.25) if carried(0.75, n) else None
    return Stats(
        median_ms=median,
        mean_ms=statistics.fmean(s),
        min_ms=s[0],
        p90_ms=_quantile(s, 0.90) if carried(0.90, n) else None,
        p99_ms=_quantile(s, 0.99) if carried(0.99, n) else None,
        iqr_ms=iqr,
        std_ms=statistics.pstdev(s),
        n=n,
        noisy=iqr is not None and median > 0 and iqr / median > NOISY_IQR_RATIO,
    )


def mark(cuda: bool):
    """Now, on the clock of the work: a CUDA event recorded on the current stream (read with `elapsed_time` once it
    has completed, so a mark adds no synchronization) on a GPU, perf_counter seconds on a CPU."""
    if cuda:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


class Clock:
    """Times one call. On CUDA: events around the call, then a synchronize, so each sample is the
    device time of one call started on an idle device (its launch overhead included). On CPU: perf_counter."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        if self.cuda:
            self._torch = torch
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def time_ms(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            self._start.record()
            fn()
            self._end.record()
            self._end.synchronize()
            return self._start.elapsed_time(self._end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def round_ms(self, fn: Callable[[], object], calls: int) -> tuple[list[float], dict[str, float]]:
        """`calls` calls issued back to back with an event pair around each and one synchronize at the
        end (as triton's do_bench): each sample is one call's time in a stream of calls, the host's work
        for the next call overlapping this one's kernels. A host-bound call still shows its launch time:
        the GPU reaches the start event before the host has launched the call's kernels.
        Also `host_ms`: the host's time inside the round's first call. The GPU is idle and its queue empty
        then, so that is the call's own host work: launching its kernels, and waiting where it synchronizes."""
        if not self.cuda:
            return [self.time_ms(fn) for _ in range(calls)], {}
        torch = self._torch
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(calls)]
        host_ms = 0.0
        for i, (start, end) in enumerate(events):
            start.record()
            if i:
                fn()
            else:  # the host clock around the first call only: nothing more inside the others' events
                t0 = time.perf_counter()
                fn()
                host_ms = (time.perf_counter() - t0) * 1e3
            end.record()
        events[-1][1].synchronize()
        return [start.elapsed_time(end) for start, end in events], {"host_ms": host_ms}


# Calls per synchronize on a GPU. A synchronize after every call leaves the GPU idle while the host
# prepares the next one: on an H100 the fused engine's bert-base 8 x 384 read 1.627 ms synchronized per
# call against 1.511 ms in a plain back-to-back event loop (benchmarks/plain_loop_check.py,
# benchmarks/results/measurement_path_h100_2026-11.md).
ROUND = 8


@dataclass
class Sampled:
    """What the sampler collected over a timed region."""

    samples_ms: list[float]  # one per timed sample, in time order (compare relies on the order)
    stats: Stats
    calls: int  # calls of the measured work inside the region (a sample may hold several)
    context: DeviceContext  # SM clock, power, energy during the region (empty on CPUs)
    parts: dict[str, list[float]] = field(default_factory=dict)  # parts of samples (prefill, phases; a round's host_ms)
    # Why sampling ended before both min_time_s and min_count were reached (a cap: max_count or max_time_s), else
    # None. docs/measurement.md promises both minimums; a cell cut short says so (record.timing_record warns).
    short: str | None = None

    def per_call(self, reps: int) -> Sampled:
        """Samples that each timed `reps` back-to-back calls, as per-call times."""
        per = [s / reps for s in self.samples_ms]
        parts = {k: [x / reps for x in v] for k, v in self.parts.items()}
        return Sampled(per, summarize(per), self.calls * reps, self.context, parts, self.short)


Step = Callable[[], "float | list[float] | tuple[float | list[float], dict[str, list[float] | float]]"]


def sample(fn: Callable[[], object], device, cfg: TimerConfig = TimerConfig(), *,
           sync: Callable[[bool], bool] | None = None, before: Callable[[], None] | None = None) -> Sampled:
    """Time `fn`, one call per sample, with a Clock: on a GPU in rounds of ROUND back-to-back calls
    (`Clock.round_ms`); with `before()` (a barrier between data-parallel ranks, outside the timed region)
    one synchronized call per sample. See `sample_steps`."""
    clock = Clock(device)

    def step():
        if before is not None:
            before()
            return clock.time_ms(fn)
        return clock.round_ms(fn, ROUND) if clock.cuda else clock.time_ms(fn)

    return sample_steps(step, device, cfg, sync=sync)


def sample_steps(step: Step, device, cfg: TimerConfig = TimerConfig(), *,
                 sync: Callable[[bool], bool] | None = None) -> Sampled:
    """The one sampler of every scenario. `step()` does one timed sample and returns its milliseconds, or
    (milliseconds, {part: ms or [ms, ...]}) when the sample has parts (generation's prefill and decode
    steps, training's phases), or a list of milliseconds for a round of samples.

    Warm-up: `cfg.warmup` samples and, on a GPU, at least `cfg.warmup_time_s` of them, so the clocks have
    left idle. Then samples until both `min_time_s` of sampled time and `min_count` samples are reached
    (or `max_count` / `max_time_s`: then `Sampled.short` says so). `sync(go_on) -> bool`, where given, makes
    each of those decisions collectively (data-parallel ranks: any rank that wants another sample keeps all
    going, so none waits in a barrier alone). The device context (clock, power, energy) is read over the timed
    samples only."""
    from .context import Monitor

    agree = sync or (lambda go_on: go_on)
    gpu = getattr(device, "type", "cpu") == "cuda"
    warm_started = time.perf_counter()
    done = 0
    while agree(done < cfg.warmup or (gpu and time.perf_counter() - warm_started < cfg.warmup_time_s)):
        step()
        done += 1
    samples: list[float] = []
    parts: dict[str, list[float]] = {}
    with Monitor(device) as monitor:
        started = time.perf_counter()
        while True:
            out = step()
            ms, got = (out if isinstance(out, tuple) else (out, None))
            samples.extend(ms if isinstance(ms, list) else [ms])
            for name, v in (got or {}).items():
                parts.setdefault(name, []).extend(v if isinstance(v, list) else [v])
            wall = time.perf_counter() - started
            timed_s = sum(samples) / 1e3
            enough = timed_s >= cfg.min_time_s and len(samples) >= cfg.min_count
            if not agree(not (enough or len(samples) >= cfg.max_count or wall >= cfg.max_time_s)):
                break
    # A cap ended it first: a 0.05 ms call reaches 10,000 samples after 0.5 s of the default 1 s, and a --min-time
    # above max_time_s stops there. Neither is the measurement asked for, and the record must not read as one.
    cap = f"{cfg.max_count} samples" if len(samples) >= cfg.max_count else f"{cfg.max_time_s:g} s"
    short = None if enough else (
        f"sampling stopped at its cap of {cap} with {len(samples)} samples and {timed_s:.3g} s of timed calls, short "
        f"of the {cfg.min_count} samples and {cfg.min_time_s:g} s asked for")
    return Sampled(samples, summarize(samples), len(samples), monitor.context, parts, short)
