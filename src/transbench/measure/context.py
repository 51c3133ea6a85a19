"""What the GPU was doing while a cell was timed: SM clock, power, temperature, throttle reasons and energy,
read through NVML on a thread during the timed region (never in the parent: no CUDA context needed).

Why: an H100 at its 700 W cap runs large GEMMs below its maximum clock, so the same kernel reads 652 or
721 TFLOPS depending on the power state. A figure is only comparable with the clock it ran at,
so every GPU cell records the clock and power beside its latency, and energy from the board's own counter."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

from . import device as dev
from . import load

# Each poll's four NVML calls hand the interpreter's lock to this thread and back four times, time a host-bound
# cell's launching thread may lose: in one call on an H200, polling every 20 ms (NVML's own refresh) made a plain
# loop inside a Monitor 2.6% slower at roberta-base sdpa 3 x 250 and 16 x 64 (95% intervals 0.5-4.2%), though in a
# later call neither 20 ms nor 0.1 s cost anything measurable (benchmarks/results/host_bound_h200_2026-12.md). A
# fifth of the handovers costs nothing: a tenth of a second still reads a 1 s region ten times.
POLL_S = 0.1
# The board's energy counter advances in steps: over a region of 0.2 s an H100 read 1,027 W against its
# 700 W cap, so shorter regions report power from the samples and no energy.
MIN_ENERGY_REGION_S = 1.0
LOW_CLOCK = 0.9  # a cell whose SM clock fell below this share of its maximum carries a warning

# nvmlClocksEventReasons bits (nvml.h); the power-cap bit alone is also set on a GPU running at full
# clock, so reasons are reported only when the clock really was low (see DeviceContext.warnings).
THROTTLE_BITS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                 0x80: "hw_power_brake", 0x100: "display_clocks"}


@dataclass
class DeviceContext:
    """The device's state over one timed region."""

    sm_clock_mhz: list[float] = field(default_factory=list)
    power_w: list[float] = field(default_factory=list)
    temp_c: list[float] = field(default_factory=list)
    reasons: set[str] = field(default_factory=set)
    max_sm_clock_mhz: float | None = None
    energy_j: float | None = None  # over the region: from the board's counter, else integrated (energy_source)
    energy_source: str | None = None  # counter | integrated (sampled power, trapezoid rule) | None: no energy
    power_t: list[float] = field(default_factory=list)  # perf_counter time of each power_w reading
    seconds: float = 0.0
    device_type: str = "cpu"
    busy: object = None  # load.Busy: other processes' CPU use over the region (None: not watched)

    def summary(self) -> dict:
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        return {
            "sm_clock_mhz": med(self.sm_clock_mhz),
            "sm_clock_min_mhz": min(self.sm_clock_mhz) if self.sm_clock_mhz else None,
            "sm_clock_max_mhz": self.max_sm_clock_mhz,
            "power_median_w": med(self.power_w),
            "temp_c": max(self.temp_c) if self.temp_c else None,
            "throttle_reasons": sorted(self.reasons),
            "energy_region_j": self.energy_j,
            "energy_source": self.energy_source,
            "region_s": self.seconds,
        }

    def low_clock(self) -> bool:
        return bool(self.sm_clock_mhz and self.max_sm_clock_mhz
                    and min(self.sm_clock_mhz) < LOW_CLOCK * self.max_sm_clock_mhz)

    def warnings(self) -> list[str]:
        if not self.low_clock():
            return []
        why = f" ({', '.join(sorted(self.reasons))})" if self.reasons else ""
        return [f"SM clock fell to {min(self.sm_clock_mhz):.0f} MHz, below {LOW_CLOCK:.0%} of its "
                f"{self.max_sm_clock_mhz:.0f} MHz maximum{why}"]


class Monitor:
    """`with Monitor(device) as m:` around a timed region; `m.context` afterwards. A no-op on CPUs and
    where NVML is missing. `nvml` and `handle` can be injected (tests)."""

    def __init__(self, device=None, *, nvml=None, handle=None, poll_s: float = POLL_S):
        if nvml is None and device is not None and getattr(device, "type", "cpu") == "cuda":
            nvml, handle = dev.nvml_handle(device.index or 0)
        self.nv, self.h, self.poll_s = nvml, handle, poll_s
        self.context = DeviceContext(device_type=getattr(device, "type", None) or ("cuda" if nvml else "cpu"))
        self._stop = threading.Event()
        self._mark = threading.Event()
        self._thread: threading.Thread | None = None
        self._energy0: float | None = None
        self._t0 = 0.0
        self._load = load.Watch()  # other processes busy during the region (the CPU's own context)

    @property
    def active(self) -> bool:
        return self.nv is not None and self.h is not None

    def _try(self, fn, *args):
        try:
            return fn(*args)
        except Exception:  # a reading NVML does not support on this board stays empty
            return None

    def _read(self) -> None:
        nv, h, c = self.nv, self.h, self.context
        clock = self._try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        if clock is not None:
            c.sm_clock_mhz.append(float(clock))
        power = self._try(nv.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            c.power_w.append(power / 1e3)
            c.power_t.append(time.perf_counter())
        temp = self._try(nv.nvmlDeviceGetTemperature, h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        if temp is not None:
            c.temp_c.append(float(temp))
        mask = self._try(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        if mask:
            c.reasons |= {name for bit, name in THROTTLE_BITS.items() if mask & bit}

    def _energy(self) -> float | None:
        mj = self._try(self.nv.nvmlDeviceGetTotalEnergyConsumption, self.h)
        return None if mj is None else mj / 1e3

    def _loop(self) -> None:
        while True:
            marked = self._mark.wait(self.poll_s)
            if self._stop.is_set():
                return
            if marked:
                self._restart()
            else:
                self._read()

    def _restart(self) -> None:
        """The region starts now: readings so far are dropped, energy and time count from here."""
        self._mark.clear()
        c = self.context
        for readings in (c.sm_clock_mhz, c.power_w, c.power_t, c.temp_c, c.reasons):
            readings.clear()
        self._read()
        self._energy0 = self._energy()
        self._t0 = time.perf_counter()

    def mark(self) -> None:
        """Move the region's start to now, without an NVML call on the caller's thread: the sampling thread
        takes the readings (within microseconds). The serve scenario marks the end of its warm-up this way, while
        requests keep arriving. Entering the region there instead made its NVML calls on the serving thread and
        held the request arriving then (H100: the first measured request of most probes, 8.3 ms,
        benchmarks/results/fp8_engine_h100_2026-11.md)."""
        if self.active and self._thread is not None:
            self._mark.set()
        else:
            self._t0 = time.perf_counter()

    def __enter__(self) -> Monitor:
        self._load.__enter__()
        if self.active:
            self.context.max_sm_clock_mhz = self._try(self.nv.nvmlDeviceGetMaxClockInfo, self.h, self.nv.NVML_CLOCK_SM)
            self._read()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
            self._energy0 = self._energy()
        self._t0 = time.perf_counter()  # the region's time is taken right beside its energy readings
        return self

    def __exit__(self, *exc) -> None:
        e1 = self._energy() if self.active else None
        end = time.perf_counter()
        self.context.seconds = end - self._t0
        self._load.__exit__(*exc)
        self.context.busy = self._load.busy
        if not self.active:
            return
        self._stop.set()
        self._mark.set()  # wakes the thread now rather than at its next poll
        if self._thread is not None:
            self._thread.join()
        self._read()
        # A counter that did not advance over a region of work (a board that reports a fixed value) measured nothing:
        # its 0 J became energy_j, j_per_seq and avg_power_w of 0. Power then comes from the readings, as for a short
        # region (record.context_record).
        if (self._energy0 is not None and e1 is not None and self.context.seconds >= MIN_ENERGY_REGION_S
                and e1 > self._energy0):
            self.context.energy_j, self.context.energy_source = e1 - self._energy0, "counter"
        elif self._energy0 is None and e1 is None:
            # A board with no energy counter (NVML answers no total energy): the power readings, integrated over the
            # region. Only there: over a short region a counter's steps are the trouble, and polls of a
            # power figure that NVML itself averages do not resolve it either.
            energy = integrate_energy(self.context.power_t, self.context.power_w, self._t0, end)
            if energy is not None:
                self.context.energy_j, self.context.energy_source = energy, "integrated"


def integrate_energy(times: list[float], watts: list[float], start: float, end: float) -> float | None:
    """Joules over [start, end] from power readings `watts` taken at `times`: the trapezoid rule between readings,
    the first reading held back to `start` and the last carried on to `end` (a reading stands for the power
    around it). None without two readings inside the region."""
    points = [(t, w) for t, w in zip(times, watts) if start <= t <= end]
    if len(points) < 2 or end <= start:
        return None
    joules = (points[0][0] - start) * points[0][1] + (end - points[-1][0]) * points[-1][1]
    for (t0, w0), (t1, w1) in zip(points, points[1:]):
        joules += (t1 - t0) * (w0 + w1) / 2
    return joules
