"""The one place where sampled timings become record keys: latency statistics, rates, TFLOPS and MFU,
the device context (clock, power, energy per call / sequence / token) and the warnings a reader needs
(noisy, low clock, host-bound). Every scenario builds its timing record here."""

from __future__ import annotations

import statistics

from . import peaks
from .timer import Sampled

NOISY_TEXT = "noisy: IQR/median {:.1%} > 5%"
# What steadies a noisy cell. On a CPU, timing longer does not: calls vary because the cell's threads share cores
# with other work (another process, the sweep itself), and more samples of that only repeat it. On a 2-core
# machine a busy neighbour took sdpa bert batch 1 from 0.81 to 93.65 ms.
NOISY_FIX = {"cpu": "on a CPU, a quiet machine and fewer threads than free cores (run and micro: --threads) steady "
                    "it (timing longer does not)",
             "cuda": "other processes on the GPU, or a clock that moved (sm_clock_min_mhz), widen it; --min-time "
                     "longer evens out the rest"}


def noisy_text(s: Sampled) -> list[str]:
    """The noisy warning, with the fix that works on the cell's device."""
    if not s.stats.noisy:
        return []
    fix = NOISY_FIX.get(s.context.device_type, NOISY_FIX["cpu"])
    return [NOISY_TEXT.format(s.stats.iqr_ms / s.stats.median_ms) + f": {fix}"]
# A call that holds the host for most of its time is timed by the CPU's speed, not the GPU's. On an H100's
# machine, transformers' bert-base with sdpa attention (the `sdpa` backend: no graphs) at 2 x 96 read 4.7 to
# 8.1 ms over seven rounds of one process, by transbench and by a plain event loop alike, while graph-replayed points
# (cudagraph, fused) agreed within 2.1% (benchmarks/plain_loop_check.py,
# benchmarks/results/sampler_host_h100_2026-11.md).
HOST_BOUND = 0.9
HOST_BOUND_TEXT = ("host-bound: the host was inside each {} for {:.3g} of its {:.3g} ms (launching kernels, or "
                   "waiting where it synchronizes); this time moves with the CPU")


def host_bound(host_ms: float, call_ms: float, call: str = "call") -> list[str]:
    """The host-bound warning where the host's time inside a call (measured with the GPU's queue empty: the
    call's own work) is most of the call's time on the GPU."""
    return [HOST_BOUND_TEXT.format(call, host_ms, call_ms)] if host_ms >= HOST_BOUND * call_ms else []


def timing_record(s: Sampled, *, items: float | None = None, tokens: float | None = None,
                  flops: float | None = None, gpu=None, dtype: str | None = None,
                  world: int = 1) -> tuple[dict, list[str]]:
    """(record keys, warnings) for work sampled per call: `items` sequences (or samples) and `tokens`
    tokens per call, `flops` per call, over `world` GPUs. Rates use the median call."""
    st = s.stats
    seconds = st.median_ms / 1e3
    rec: dict = {
        "latency_ms": st.median_ms, "latency_p90_ms": st.p90_ms, "latency_p99_ms": st.p99_ms,
        "latency_iqr_ms": st.iqr_ms, "n_samples": st.n,
    }
    if items is not None and seconds > 0:
        rec["throughput_per_s"] = items / seconds
    if tokens is not None and seconds > 0:
        rec["tokens_per_s"] = tokens / seconds
    if flops is not None and seconds > 0:
        rec["tflops"] = flops / seconds / 1e12
        rec["mfu"] = peaks.mfu(flops / seconds / world, gpu and gpu.name, dtype, gpu and gpu.memory_gb)
    rec.update(context_record(s, items=items, tokens=tokens))
    warnings = noisy_text(s)
    if s.short:  # a cap ended the sampling before --min-time and --min-count were both reached (timer.sample_steps)
        warnings.append(f"short: {s.short}")
    if s.parts.get("host_ms"):
        rec["host_ms"] = statistics.median(s.parts["host_ms"])
        warnings += host_bound(rec["host_ms"], st.median_ms)
    return rec, warnings + s.context.warnings()


def context_record(s: Sampled, *, items: float | None = None, tokens: float | None = None) -> dict:
    """Clock, power and energy keys. Energy comes from the board's total-energy counter over the timed region
    (`energy_source: counter`), or where the board keeps none, from its sampled power integrated over the region
    (`integrated`), divided by the calls in it (idle gaps between calls included: they are a few microseconds
    of host work per call, and a real caller has them too)."""
    c = s.context
    busy = {} if c.busy is None else {"busy_processes": c.busy.processes, "busy_cores": c.busy.total}  # load.Watch
    if not c.sm_clock_mhz and c.energy_j is None:
        return busy
    summary = c.summary()
    rec = {**busy, "sm_clock_mhz": summary["sm_clock_mhz"], "sm_clock_min_mhz": summary["sm_clock_min_mhz"],
           "temp_c": summary["temp_c"]}
    if c.energy_j is not None and s.calls:
        per_call = c.energy_j / s.calls
        rec["energy_j"] = per_call
        rec["energy_source"] = c.energy_source  # counter, or integrated from sampled power (no counter)
        rec["avg_power_w"] = c.energy_j / c.seconds if c.seconds > 0 else summary["power_median_w"]
        if items:
            rec["j_per_seq"] = per_call / items
        if tokens:
            rec["j_per_token"] = per_call / tokens
    else:
        rec["avg_power_w"] = summary["power_median_w"]
    return rec


def noisy_warnings(s: Sampled) -> list[str]:
    return noisy_text(s)
