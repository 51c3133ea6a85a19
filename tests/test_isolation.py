"""A cell's figures do not depend on the cells before it: memory counted above what the cell found (fake
allocator), workers that keep memory are replaced, and the device context read during the timed region
(fake NVML) becomes clock, power and energy keys."""

from __future__ import annotations

import time
import types

import pytest
import torch

from transbench.cells import CellResult
from transbench.measure import context, memory, record, timer
from transbench.runner import sweep


class FakeAllocator:
    """torch.cuda's allocator counters, driven by the test."""

    def __init__(self):
        self.allocated = 0
        self.peak = 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n: int) -> None:
        self.allocated -= n

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: self.allocated)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: self.peak)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: self.peak)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: setattr(self, "peak", self.allocated))
        monkeypatch.setattr(torch.cuda, "init", lambda: None)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
        monkeypatch.setattr(memory, "_clear_workspaces", lambda: None)
        monkeypatch.setattr(memory.dev, "nvml_used_mb", lambda i: None)


MiB = 2**20


def test_peak_counts_only_what_the_cell_allocated(monkeypatch):
    fake = FakeAllocator()
    fake.install(monkeypatch)
    gpu = torch.device("cuda", 0)

    def cell(model_mib: int, work_mib: int) -> float:
        memory.reset_peak(gpu)
        fake.alloc(model_mib * MiB)
        fake.alloc(work_mib * MiB)
        fake.free(work_mib * MiB)
        peak = memory.snapshot(gpu)["peak_mem_mb"]
        fake.free(model_mib * MiB)
        return peak

    alone = cell(250, 65)
    fake.alloc(574 * MiB)  # a previous backend's captured graphs, still held
    after_leftovers = cell(250, 65)
    assert alone == after_leftovers == 315


def test_a_cells_peak_does_not_count_its_first_calls_kernel_tuning(monkeypatch):
    """A fused cell's first call times kernel routes unless they are on disk (tuning's candidates come and go),
    then captures. The scenario drops that capture, restarts the peak and captures again (inference.settle), so
    the cell reads the same with or without its routes on disk; the model and the capture still count."""
    from transbench.backends.base import Prepared
    from transbench.scenarios.inference import measure as inference
    fake = FakeAllocator()
    fake.install(monkeypatch)
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(inference.dev, "synchronize", lambda d: None)

    def cell(routes_on_disk: bool) -> float:
        memory.reset_peak(gpu)
        fake.alloc(250 * MiB)  # the model
        graphs, table = [], [routes_on_disk]

        def call():  # the engine's call: tunes a shape it has no routes for, captures it once, replays after
            if not graphs:
                if not table[0]:
                    fake.alloc(400 * MiB), fake.free(400 * MiB)  # candidates timed alone, races
                    table[0] = True
                fake.alloc(80 * MiB), fake.free(80 * MiB)  # the capture's warm-up activations
                fake.alloc(20 * MiB)  # the graph's outputs
                graphs.append(20)

        def release():
            fake.free(graphs.pop() * MiB)
        p = Prepared(call, release=release)
        p.fn()
        inference.settle(p, gpu)
        for _ in range(3):
            p.fn()
        peak = memory.snapshot(gpu)["peak_mem_mb"]
        release(), fake.free(250 * MiB)
        return peak

    assert cell(routes_on_disk=False) == cell(routes_on_disk=True) == 250 + 80
    # a backend with nothing to release (no graphs, or not the fused engine) is left as it was
    calls = []
    inference.settle(Prepared(lambda: calls.append(1)), gpu)
    assert calls == []

def test_lane_replaces_a_worker_that_leaves_memory_behind(monkeypatch):
    made = []

    class FakeWorker:
        def __init__(self, env=None):
            self.left_mb, self.stopped = None, False
            made.append(self)

        def alive(self):
            return not self.stopped

        def run(self, target, cell, timeout):
            self.left_mb = 600.0 if len(made) == 1 else 0.0  # the first worker's cell leaks
            return CellResult("ok", record={"latency_ms": 1.0})

        def stop(self, kill=False):
            self.stopped = True

    monkeypatch.setattr(sweep, "Worker", FakeWorker)
    lane = sweep._Lane(None, sweep.Target(dict, measure="x:y"))
    cell = types.SimpleNamespace(to_dict=lambda: {})
    first = lane.run(cell, 10)
    assert first.info["worker_replaced_mb_left"] == 600.0 and made[0].stopped
    lane.run(cell, 10)
    lane.run(cell, 10)
    assert len(made) == 2 and not made[1].stopped  # a clean worker is kept


def test_lane_replaces_the_worker_after_a_cell_that_asks_for_a_fresh_one(monkeypatch):
    made = []

    class FakeWorker:
        left_mb = 0.0

        def __init__(self, env=None):
            self.stopped, self.cells = False, 0
            made.append(self)

        def alive(self):
            return not self.stopped

        def run(self, target, cell, timeout):
            self.cells += 1
            info = {"fresh_worker_after": "graphs on streams of its own"} if cell["graphs"] else {}
            return CellResult("ok", record={"latency_ms": 1.0}, info=info)

        def stop(self, kill=False):
            self.stopped = True

    monkeypatch.setattr(sweep, "Worker", FakeWorker)
    lane = sweep._Lane(None, sweep.Target(dict, measure="x:y"))
    for graphs in (False, False, True, False):
        lane.run(types.SimpleNamespace(to_dict=lambda g=graphs: {"graphs": g}), 10)
    assert [w.cells for w in made] == [3, 1] and made[0].stopped and not made[1].stopped


@pytest.mark.parametrize("mode, device, fresh", [
    ("reduce-overhead", "cuda", True), ("max-autotune", "cuda", True), ("default", "cuda", False),
    ("max-autotune-no-cudagraphs", "cuda", False), ("reduce-overhead", "cpu", False)])
def test_compile_modes_with_cuda_graphs_end_their_worker(mode, device, fresh):
    from transbench.backends.compile import fresh_worker_after

    assert bool(fresh_worker_after(mode, torch.device(device))) == fresh


class FakeNvml:
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, clocks, power_mw=500_000, mask=0x4):
        self.clocks, self.power_mw, self.mask = list(clocks), power_mw, mask
        self.energy_mj = 1_000_000

    def nvmlDeviceGetClockInfo(self, h, which):
        return self.clocks.pop(0) if len(self.clocks) > 1 else self.clocks[0]

    def nvmlDeviceGetMaxClockInfo(self, h, which):
        return 1980

    def nvmlDeviceGetPowerUsage(self, h):
        return self.power_mw

    def nvmlDeviceGetTemperature(self, h, which):
        return 55

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.mask

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.energy_mj += 35_000  # 35 J between two readings
        return self.energy_mj


def test_monitor_reads_clock_power_and_energy_over_the_region(monkeypatch):
    monkeypatch.setattr(context, "MIN_ENERGY_REGION_S", 0.0)
    nv = FakeNvml([1980, 1790, 1980])
    with context.Monitor(nvml=nv, handle=object(), poll_s=0.001) as m:
        pass
    c = m.context
    assert c.energy_j == pytest.approx(35.0) and min(c.sm_clock_mhz) == 1790 and c.max_sm_clock_mhz == 1980
    assert c.summary()["throttle_reasons"] == ["sw_power_cap"]
    assert not c.warnings()  # 1790 MHz is 90.4% of the maximum: the power-cap bit alone is no warning
    c.sm_clock_mhz.append(1700.0)
    assert c.low_clock() and "sw_power_cap" in c.warnings()[0]


def test_mark_restarts_the_region_from_the_sampling_thread(monkeypatch):
    """Monitor.mark(): the readings before it are dropped and energy counts from it, and the caller's thread makes
    no NVML call (the serve scenario marks its warm-up's end while requests arrive)."""
    import threading

    monkeypatch.setattr(context, "MIN_ENERGY_REGION_S", 0.0)
    nv = FakeNvml([1000, 1980])
    callers = []
    energy = nv.nvmlDeviceGetTotalEnergyConsumption
    nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: (callers.append(threading.current_thread()), energy(h))[1]
    with context.Monitor(nvml=nv, handle=object(), poll_s=0.001) as m:
        time.sleep(0.01)
        main_calls = callers.count(threading.current_thread())
        m.mark()
        time.sleep(0.01)
        assert callers.count(threading.current_thread()) == main_calls  # the mark's reading ran elsewhere
    assert 1000 not in m.context.sm_clock_mhz and m.context.sm_clock_mhz  # readings before the mark dropped
    assert m.context.energy_j == pytest.approx(35.0)  # the mark's reading to the exit's
    assert 0 < m.context.seconds < 0.015


def test_low_clock_is_below_90_percent_of_the_maximum():
    c = context.DeviceContext(sm_clock_mhz=[1980, 1783], max_sm_clock_mhz=1980)
    assert not c.low_clock()  # 90.05%
    c.sm_clock_mhz.append(1781)
    assert c.low_clock()


def test_record_builder_energy_per_call_sequence_and_token():
    ctx = context.DeviceContext(sm_clock_mhz=[1980.0], power_w=[600.0], max_sm_clock_mhz=1980,
                                energy_j=12.0, seconds=0.02)
    samples = [2.0] * 10
    s = timer.Sampled(samples, timer.summarize(samples), calls=10, context=ctx)
    rec, warnings = record.timing_record(s, items=8, tokens=8 * 128, flops=1e12)
    assert rec["energy_j"] == pytest.approx(1.2) and rec["j_per_seq"] == pytest.approx(0.15)
    assert rec["j_per_token"] == pytest.approx(1.2 / 1024) and rec["avg_power_w"] == pytest.approx(600.0)
    assert rec["throughput_per_s"] == pytest.approx(4000) and rec["tflops"] == pytest.approx(500)
    assert rec["sm_clock_mhz"] == 1980 and warnings == []


def test_cpu_records_have_no_device_context():
    s = timer.sample(lambda: None, torch.device("cpu"), timer.TimerConfig(warmup=1, min_time_s=0, min_count=3))
    rec, _ = record.timing_record(s, items=1)
    assert "energy_j" not in rec and "sm_clock_mhz" not in rec and rec["n_samples"] == 3


def test_sampler_sync_makes_every_decision_together():
    """Data-parallel ranks: every go-on decision goes through `sync`; here another rank wants three
    warm-up calls and ten samples, more than this rank's own one and one."""
    answers = iter([True, True, True, False] + [True] * 9 + [False])
    asked, calls = [], []

    def sync(go_on):
        asked.append(go_on)
        return next(answers)

    s = timer.sample(lambda: calls.append(1), torch.device("cpu"),
                     timer.TimerConfig(warmup=1, min_time_s=0, min_count=1), sync=sync)
    assert len(calls) == 3 + 10 and s.stats.n == 10
    assert asked[0] is True and asked[1] is False  # this rank's own wish: one warm-up call


def test_sampler_keeps_parts_of_each_sample():
    s = timer.sample_steps(lambda: (3.0, {"prefill": 1.0, "decode": [1.0, 1.0]}), torch.device("cpu"),
                           timer.TimerConfig(warmup=0, min_time_s=0, min_count=4))
    assert s.samples_ms == [3.0] * 4 and s.parts["prefill"] == [1.0] * 4 and len(s.parts["decode"]) == 8


def test_a_short_region_reports_power_but_no_energy():
    """The energy counter advances in steps: a region under MIN_ENERGY_REGION_S gets no energy figure."""
    with context.Monitor(nvml=FakeNvml([1980]), handle=object(), poll_s=0.001) as m:
        pass
    assert m.context.energy_j is None and m.context.power_w
    s = timer.Sampled([1.0], timer.summarize([1.0]), 1, m.context)
    rec = record.context_record(s, items=1)
    assert "energy_j" not in rec and rec["avg_power_w"] == pytest.approx(500.0)


def test_gpu_samples_come_in_rounds_with_one_synchronize(monkeypatch):
    """On a GPU each sample is one call between its own events, calls issued back to back and one
    synchronize per round (fake events: no GPU here)."""
    log = []

    class FakeEvent:
        t = 0.0

        def __init__(self, enable_timing=True):
            self.at = None

        def record(self):
            FakeEvent.t += 1.0
            self.at = FakeEvent.t
            log.append("record")

        def synchronize(self):
            log.append("sync")

        def elapsed_time(self, other):
            return other.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    clock = timer.Clock(torch.device("cpu"))
    clock.cuda, clock._torch = True, torch
    host = iter([10.0, 10.004, 20.0, 20.001, 30.0, 30.001])  # the host's clock around each call: 4, 1, 1 ms
    monkeypatch.setattr(timer.time, "perf_counter", lambda: next(host))
    out, parts = clock.round_ms(lambda: log.append("call"), 3)
    assert out == [1.0, 1.0, 1.0]  # each call between its own start and end
    assert log == ["record", "call", "record"] * 3 + ["sync"]
    assert parts == {"host_ms": pytest.approx(4.0)}  # the round's first call: an idle GPU, an empty queue


@pytest.mark.parametrize("host_ms, warned", [(0.05, False), (0.89, False), (0.95, True), (1.3, True)])
def test_a_call_that_holds_the_host_for_most_of_its_time_is_warned_host_bound(host_ms, warned):
    s = timer.sample_steps(lambda: ([1.0] * 8, {"host_ms": host_ms}), torch.device("cpu"),
                           timer.TimerConfig(warmup=0, min_time_s=0, min_count=16))
    rec, warnings = record.timing_record(s, items=1)
    assert rec["host_ms"] == pytest.approx(host_ms)
    assert any(w.startswith("host-bound") for w in warnings) == warned


def test_per_call_times_divide_their_parts_too():
    s = timer.Sampled([8.0, 8.0], timer.summarize([8.0, 8.0]), 2, context.DeviceContext(), {"host_ms": [4.0]})
    per = s.per_call(4)
    assert per.samples_ms == [2.0, 2.0] and per.parts == {"host_ms": [1.0]} and per.calls == 8
