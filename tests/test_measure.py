"""The figures transbench publishes, on the CPU (fake CUDA events, NVML and allocator where a GPU would be needed):
percentiles and the sampler's stop rule, the datasheet peaks behind MFU, rates and energy from the raw samples, no
speed for a failed check in any output, record keys, and a cell's memory and timing independent of the cells before
it. Tests that name a defect failed before its fix."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from transbench.measure import context, memory, peaks, record, timer


def test_stats_on_fixed_samples():
    s = timer.summarize([float(x) for x in range(1, 11)])
    assert s.median_ms == 5.5
    assert s.p90_ms == pytest.approx(9.1)
    assert s.p99_ms is None  # ten samples carry no p99 (timer.carried)
    assert s.iqr_ms == pytest.approx(7.75 - 3.25)
    assert s.min_ms == 1.0 and s.n == 10
    assert s.noisy  # IQR/median = 0.82


def test_quiet_samples_are_not_noisy():
    s = timer.summarize([10.0, 10.1, 9.9, 10.0, 10.05])
    assert not s.noisy and s.median_ms == 10.0


def test_empty_samples_rejected():
    with pytest.raises(ValueError):
        timer.summarize([])


def test_sample_stops_on_min_count_and_min_time():
    calls = []
    out = timer.sample(lambda: calls.append(1), torch.device("cpu"), timer.TimerConfig(warmup=2, min_time_s=0.0, min_count=7))
    assert len(out.samples_ms) == 7 and len(calls) == 9 and out.stats.n == 7  # warm-up calls are not samples

    slow = timer.sample(lambda: sum(range(20000)), torch.device("cpu"),
                        timer.TimerConfig(warmup=0, min_time_s=0.05, min_count=1))
    assert sum(slow.samples_ms) >= 50.0


@pytest.mark.parametrize("name,mem,gpu", [
    ("NVIDIA H100 80GB HBM3", 79.2, "H100 SXM"), ("NVIDIA H100 PCIe", 79.0, "H100 PCIe"),
    ("NVIDIA H200", 139.8, "H200"), ("NVIDIA A100-SXM4-40GB", 39.4, "A100 40GB"),
    ("NVIDIA A100-SXM4-80GB", 79.2, "A100 80GB"), ("NVIDIA A10G", 22.0, "A10G"), ("NVIDIA L4", 22.0, "L4"),
    ("NVIDIA L40S", 44.0, "L40S"), ("NVIDIA GeForce RTX 4090", 23.6, "RTX 4090"),
    ("NVIDIA GeForce RTX 3090", 23.6, "RTX 3090"), ("Tesla V100-SXM2-16GB", 15.8, "V100"),
])
def test_peak_table_matches_device_names(name, mem, gpu):
    assert peaks.lookup(name, mem).gpu == gpu


def test_unknown_device_has_no_mfu():
    assert peaks.lookup("Some Future GPU") is None
    assert peaks.mfu(1e12, "Some Future GPU", "fp16") is None
    assert peaks.mfu(494.7e12, "NVIDIA H100 80GB HBM3", "fp16", 79) == pytest.approx(0.5)


# --- the published figures: percentiles, datasheet peaks, rates and energy, failed checks, record keys, independent cells ---

# --- 1. percentiles and the sampler's stop rule -----------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 9, 10, 99, 100, 101])
def test_percentiles_are_numpys_linear_ones_where_the_samples_carry_them(n):
    """docs/measurement.md: median (latency_ms), p90, p99, IQR; timer._quantile claims numpy's default (linear) method,
    and a percentile is stored only from the samples that carry it (p90 10, p99 100, the IQR 4), else None."""
    xs = np.random.default_rng(n).lognormal(0.0, 1.0, n).tolist()
    s = timer.summarize(xs)
    a = np.asarray(xs)
    assert s.median_ms == pytest.approx(np.percentile(a, 50), rel=1e-12)
    for got, q, need in ((s.p90_ms, 90, 10), (s.p99_ms, 99, 100)):
        assert (got is None) == (n < need), (q, n, got)
        assert got is None or (got == pytest.approx(np.percentile(a, q), rel=1e-12) and s.median_ms <= got <= a.max())
    assert (s.iqr_ms is None) == (n < 4)
    if n >= 4:
        assert s.iqr_ms == pytest.approx(np.percentile(a, 75) - np.percentile(a, 25), rel=1e-12, abs=1e-15)
    else:
        assert not s.noisy  # one sample had an IQR of 0: a steady cell, by its figures
    assert s.min_ms == a.min() and s.n == n and s.std_ms == pytest.approx(np.std(a), rel=1e-12)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 5000), q=st.floats(0.001, 0.999))
def test_any_percentile_is_carried_from_one_sample_expected_beyond_it(n, q):
    # the one rule every stored percentile follows (timer.carried): run cells and serve cells alike
    from transbench.scenarios.serve.stats import spread

    expect = q == 0.5 or n * min(q, 1 - q) >= 1 - 1e-9
    assert timer.carried(q, n) == expect
    q100 = round(q * 100, 4)
    got = spread("x", [float(i) for i in range(n)], qs=(q100,))
    (key,) = [k for k in got if k not in ("x_max_ms", "x_mean_ms")]
    assert (got[key] is not None) == timer.carried(q100 / 100, n)


def test_noisy_is_iqr_over_5_percent_of_the_median():
    assert not timer.summarize([100.0, 102.0, 104.0, 106.0, 108.0]).noisy  # IQR 4 / 104 = 3.8%
    assert timer.summarize([100.0, 103.0, 106.0, 109.0, 112.0]).noisy  # IQR 6 / 106 = 5.7%


def test_min_time_counts_timed_calls_and_warmup_calls_are_not_samples():
    calls = []
    out = timer.sample(lambda: calls.append(1), torch.device("cpu"),
                       timer.TimerConfig(warmup=3, min_time_s=0.0, min_count=4))
    assert len(calls) == 3 + 4 and out.stats.n == 4 and out.calls == 4
    slow = timer.sample_steps(lambda: 30.0, torch.device("cpu"), timer.TimerConfig(warmup=0, min_time_s=0.1,
                                                                                  min_count=1))
    assert slow.samples_ms == [30.0] * 4  # 4 x 30 ms is the first count of sampled time at or over 0.1 s


@pytest.mark.parametrize("cfg, step", [
    (timer.TimerConfig(warmup=0, min_time_s=1.0, min_count=5, max_count=20), lambda: 0.01),  # count cap
    (timer.TimerConfig(warmup=0, min_time_s=0.0, min_count=10**6, max_time_s=0.05), lambda: 0.01),  # time cap
])
def test_a_cell_stopped_by_a_cap_before_its_minimum_says_so(cfg, step):
    """docs/measurement.md: timed samples "until both --min-time seconds and --min-count samples are reached"; the sampler also
    stops at max_count (10,000) and max_time_s (120 s; micro 20 s), and said nothing: a 0.05 ms GPU call under the
    default --min-time 1 stopped after 0.5 s of calls, and --min-time 300 after 120 s, both read as complete."""
    s = timer.sample_steps(step, torch.device("cpu"), cfg)
    rec, warnings = record.timing_record(s, items=1)
    assert s.short is not None and any(w.startswith("short:") for w in warnings), warnings
    assert rec["n_samples"] == len(s.samples_ms)


def test_a_cell_that_reached_its_minimum_has_no_short_warning():
    s = timer.sample_steps(lambda: 1.0, torch.device("cpu"), timer.TimerConfig(warmup=0, min_time_s=0.005, min_count=3))
    _, warnings = record.timing_record(s, items=1)
    assert s.short is None and not any(w.startswith("short:") for w in warnings)
    per = s.per_call(4)
    assert per.short is None
    # training asks for exactly `steps` samples (min_count == max_count): reaching the cap is reaching the minimum
    t = timer.sample_steps(lambda: 1.0, torch.device("cpu"), timer.TimerConfig(warmup=0, min_time_s=0.0, min_count=3,
                                                                               max_count=3))
    assert t.short is None and len(t.samples_ms) == 3


# --- 2. the datasheet peaks behind MFU ---------------------------------------------------------------------

NAMES = [
    # (device name as torch / NVML report it, GiB torch reports, the row it must get: None = no MFU)
    ("NVIDIA H100 80GB HBM3", 79.1, "H100 SXM"), ("NVIDIA H100 PCIe", 79.6, "H100 PCIe"),
    ("NVIDIA H100 NVL", 93.1, "H100 NVL"), ("NVIDIA H200", 139.8, "H200"), ("NVIDIA H200 NVL", 139.8, "H200 NVL"),
    ("NVIDIA GH200 480GB", 95.0, "GH200"), ("NVIDIA H20", 95.0, None), ("NVIDIA H800", 79.1, None),
    ("NVIDIA A100-SXM4-80GB", 79.2, "A100 80GB"), ("NVIDIA A100-SXM4-40GB", 39.4, "A100 40GB"),
    ("NVIDIA A100-PCIE-40GB", 39.4, "A100 40GB"), ("NVIDIA A10", 22.0, None), ("NVIDIA A10G", 22.0, "A10G"),
    ("NVIDIA L4", 22.0, "L4"), ("NVIDIA L40", 44.5, "L40"), ("NVIDIA L40S", 44.5, "L40S"),
    ("NVIDIA GeForce RTX 4090", 23.6, "RTX 4090"), ("NVIDIA GeForce RTX 4090 D", 23.6, None),
    ("NVIDIA GeForce RTX 3090", 23.6, "RTX 3090"), ("NVIDIA GeForce RTX 3090 Ti", 23.6, None),
    ("Tesla V100-SXM2-16GB", 15.8, "V100"), ("Tesla V100S-PCIE-32GB", 31.7, None), ("Tesla T4", 14.6, None),
    ("NVIDIA B200", 178.4, None), ("NVIDIA GB200", 184.0, None), ("NVIDIA RTX A6000", 47.5, None),
    ("Some Future GPU", 80.0, None), ("", None, None), (None, None, None),
]


@pytest.mark.parametrize("name, mem, gpu", NAMES)
def test_each_device_name_gets_its_own_row_or_none(name, mem, gpu):
    row = peaks.lookup(name, mem)
    assert (row.gpu if row else None) == gpu


@pytest.mark.parametrize("name, mem, gpu", [
    # A MIG instance runs on a slice of the SMs (14 of the A100's 108 for 1g.5gb): the whole GPU's peak made its
    # MFU 7x too low, and its memory (4.75 GiB) gave an A100 80GB the 40GB row's bandwidth.
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4.75, None), ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 39.5, None),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9.75, None),
    # The laptop 4090 is another chip (AD103) with other peaks: it had the desktop card's.
    ("NVIDIA GeForce RTX 4090 Laptop GPU", 16.0, None),
    # The V100 PCIe runs 14 / 112 TFLOPS (fp32 / tensor), the SXM2's 15.7 / 125: it had the SXM2's.
    ("Tesla V100-PCIE-16GB", 15.8, "V100 PCIe"), ("Tesla V100-PCIE-32GB", 31.7, "V100 PCIe"),
    # The A100 80GB PCIe reads 1,935 GB/s, the SXM 2,039: it had the SXM's bandwidth (micro pct_of_peak, roofline).
    ("NVIDIA A100 80GB PCIe", 79.2, "A100 80GB PCIe"),
    # GH200 with 144 GB HBM3e: 4.9 TB/s, the 96 GB HBM3 one 4 TB/s.
    ("NVIDIA GH200 144G HBM3e", 142.0, "GH200 144GB HBM3e"),
])
def test_variants_without_the_siblings_peaks(name, mem, gpu):
    row = peaks.lookup(name, mem)
    assert (row.gpu if row else None) == gpu


def test_a100_without_memory_is_told_apart_by_its_name_never_guessed():
    """The report's roofline looks a row up by the record's GPU name alone (report/plots.py _ceilings): every A100
    got the first A100 row, the 80GB's 2,039 GB/s, a 40GB card's 1,555 GB/s was never drawn."""
    assert peaks.lookup("NVIDIA A100-SXM4-40GB").bandwidth_gbs == 1555
    assert peaks.lookup("NVIDIA A100-PCIE-40GB").bandwidth_gbs == 1555
    assert peaks.lookup("NVIDIA A100-SXM4-80GB").bandwidth_gbs == 2039
    assert peaks.lookup("NVIDIA A100 80GB PCIe").bandwidth_gbs == 1935
    assert peaks.lookup("NVIDIA A100") is None  # neither memory nor a size in the name: no row, not the first one


def test_dense_peaks_per_dtype():
    """Dense (no sparsity) datasheet figures; a dtype the chip has no tensor rate for has no peak."""
    def p(name, dtype, mem=None):
        return peaks.lookup(name, mem).peak(dtype)

    h100 = "NVIDIA H100 80GB HBM3"
    assert [p(h100, d, 79.1) for d in ("fp32", "tf32", "fp16", "bf16", "fp8")] == [66.9, 494.7, 989.4, 989.4, 1978.9]
    assert [p("NVIDIA A100-SXM4-80GB", d, 79.2) for d in ("fp32", "tf32", "fp16", "bf16", "fp8")] == \
        [19.5, 156.0, 312.0, 312.0, None]  # Ampere: no fp8
    assert p("NVIDIA L40S", "fp8") == 733.0 and p("NVIDIA L40S", "fp16") == 362.05
    assert p("NVIDIA GeForce RTX 4090", "fp16") == 165.2  # FP32 accumulate (PyTorch's), not 330.3
    assert peaks.lookup("NVIDIA H100 80GB HBM3").peak("int8") is None  # no int8 figures: no invented one


def test_halved_sparse_peaks_are_not_rounded_down():
    """A peak rounded down raises MFU: the NVL datasheets give 1,671 (fp16) and 3,341 (fp8) TFLOPS with sparsity,
    dense 835.5 and 1,670.5 (rows said 835.0 and 1,670.0); the L4's fp8 485 with sparsity is 242.5 (said 242.0)."""
    for name in ("NVIDIA H100 NVL", "NVIDIA H200 NVL"):
        row = peaks.lookup(name, 93.0)
        assert (row.peak("tf32"), row.peak("fp16"), row.peak("bf16"), row.peak("fp8")) == (417.5, 835.5, 835.5, 1670.5)
    assert peaks.lookup("NVIDIA L4").peak("fp8") == 242.5


def test_v100_has_no_bf16_peak():
    """Volta has no bf16 tensor cores (compute capability 7.0): `env` showed a bf16 peak of 125 TFLOPS for it."""
    for name in ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"):
        row = peaks.lookup(name, 15.8)
        assert row.peak("bf16") is None and row.peak("fp16") is not None


def test_mfu_on_an_unknown_gpu_is_empty_never_guessed():
    assert peaks.mfu(100e12, "NVIDIA B200", "fp16", 178.4) is None
    assert peaks.mfu(100e12, None, "fp16") is None
    assert peaks.mfu(100e12, "NVIDIA A100-SXM4-80GB", "fp8", 79.2) is None  # no fp8 peak on an A100
    assert peaks.mfu(0.0, "NVIDIA H100 80GB HBM3", "fp16", 79.1) is None
    assert peaks.mfu(156e12, "NVIDIA A100-SXM4-80GB", "tf32", 79.2) == pytest.approx(1.0)


def test_every_row_is_reachable_and_dense_below_its_sparse_figure():
    for row in peaks.PEAKS:
        name = "NVIDIA " + " ".join(row.match)
        mem = None if row.memory_gb is None else row.memory_gb - 1.0
        found = peaks.lookup(name, mem)
        assert found is row, (row.gpu, found and found.gpu)
        assert row.peak("fp16") == row.peak("bf16") or row.peak("bf16") is None
        assert all(v > 0 for v in row.tflops.values() if v is not None)


# --- 2. rates and energy from the raw samples, through a fake GPU ---------------------------------------------


class FakeEvent:
    """torch.cuda.Event on the CPU: every call the test times lasts `FakeEvent.call_ms`."""

    t = 0.0
    call_ms = 2.0

    def __init__(self, enable_timing=True):
        self.at = None

    def record(self):
        self.at = FakeEvent.t

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return other.at - self.at


class FakeNvml:
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, energy_step_mj=0.0, power_mw=400_000):
        self.energy_mj, self.step, self.power_mw = 5_000_000.0, energy_step_mj, power_mw

    def nvmlDeviceGetClockInfo(self, h, which):
        return 1755

    def nvmlDeviceGetMaxClockInfo(self, h, which):
        return 1980

    def nvmlDeviceGetPowerUsage(self, h):
        return self.power_mw

    def nvmlDeviceGetTemperature(self, h, which):
        return 60

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.energy_mj += self.step
        return self.energy_mj


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA device for the sampler: fake events (each call 2 ms), fake NVML through measure/device's seam."""
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    nv = FakeNvml()
    monkeypatch.setattr(context.dev, "nvml_handle", lambda index: (nv, object()))
    monkeypatch.setattr(context, "MIN_ENERGY_REGION_S", 0.0)

    def call():
        FakeEvent.t += FakeEvent.call_ms

    return torch.device("cuda", 0), nv, call


def test_rates_mfu_and_energy_follow_from_the_samples_and_the_counter(fake_gpu):
    device, nv, call = fake_gpu
    nv.step = 700.0  # mJ per counter read
    cfg = timer.TimerConfig(warmup=1, min_time_s=0.0, min_count=16, warmup_time_s=0.0)
    s = timer.sample(call, device, cfg)
    assert s.samples_ms == [2.0] * 16 and s.calls == 16  # two rounds of 8 calls, each between its own events
    gpu = type("Gpu", (), {"name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.1})()
    lengths = [100, 128, 77, 128]  # --seq-stdev: real tokens, not 4 x 128
    rec, _ = record.timing_record(s, items=4, tokens=sum(lengths), flops=4.947e11, gpu=gpu, dtype="fp16")
    assert rec["latency_ms"] == 2.0 and rec["throughput_per_s"] == pytest.approx(2000.0)
    assert rec["tokens_per_s"] == pytest.approx(433 / 2e-3)
    assert rec["tflops"] == pytest.approx(247.35) and rec["mfu"] == pytest.approx(0.25)
    c = s.context
    assert c.energy_j == pytest.approx(0.7)  # the counter read once at the region's start and once at its end
    assert rec["energy_j"] == pytest.approx(0.7 / 16) and rec["j_per_seq"] == pytest.approx(0.7 / 16 / 4)
    assert rec["j_per_token"] == pytest.approx(0.7 / 16 / 433)
    assert rec["avg_power_w"] == pytest.approx(0.7 / c.seconds) and rec["sm_clock_mhz"] == 1755


def test_a_counter_that_did_not_advance_is_no_energy_figure(fake_gpu):
    """A board whose total-energy counter does not move (read-only or stale: 0 mJ over a region of seconds of work)
    published energy_j 0, j_per_seq 0 and avg_power_w 0 W: zeros that were never measured."""
    device, nv, call = fake_gpu
    nv.step = 0.0
    s = timer.sample(call, device, timer.TimerConfig(warmup=0, min_time_s=0.0, min_count=8, warmup_time_s=0.0))
    rec, _ = record.timing_record(s, items=4, tokens=512)
    assert s.context.energy_j is None
    assert "energy_j" not in rec and "j_per_seq" not in rec
    assert rec["avg_power_w"] == pytest.approx(400.0)  # the power readings stand in, as for a short region


@pytest.mark.slow
def test_cpu_inference_cell_rates_use_real_tokens_and_the_median(quick):
    """run --seq-stdev: tokens_per_s counts real (unpadded) tokens; seq/s and tokens/s divide by the median."""
    from transbench.cells import Cell
    from transbench.scenarios.inference import measure as inference

    cell = Cell("bert-tiny", "base", "eager", "fp32", batch=4, seq=24, seq_stdev=6.0, min_time=0.0, min_count=5,
                warmup=1)
    r = inference.run(cell, inference.ModelCache())
    assert r.status == "ok", r.error
    lengths = inference.cell_inputs(cell, inference.build.resolve("bert-tiny").shape).lengths
    assert len(set(lengths)) > 1 and r.info["real_tokens"] == sum(lengths)
    median_s = float(np.percentile(r.samples_ms, 50)) / 1e3
    assert r.record["latency_ms"] == pytest.approx(median_s * 1e3)
    assert r.record["throughput_per_s"] == pytest.approx(4 / median_s)
    assert r.record["tokens_per_s"] == pytest.approx(sum(lengths) / median_s)
    assert r.record["mfu"] is None and r.record["peak_mem_mb"] is None and r.record["gpu"] is None


# --- 3. a failed check shows no speed, in any output -------------------------------------------------------


@pytest.mark.slow
def test_a_wrong_generation_cell_shows_no_speed_in_json_csv_report_or_compare(tmp_path, extra_backends):
    from transbench import api
    from transbench.errors import SpecError
    from report_helpers import judged_pairs

    from transbench.report.compare import compare
    from transbench.scenarios.inference.spec import RunSpec

    extra_backends("broken_backends")
    db = str(tmp_path / "w.db")
    spec = dict(models=["gpt2-tiny"], tasks=["generate"], backends=["eager", "broken-noise"], batches=[2],
                seqs=[8], new_tokens=3, device="cpu", dtypes=["fp32"], min_time=0.0, min_count=2, warmup=1)
    for name in ("a", "b"):
        api.run(RunSpec(**spec, name=name), db=db, json_path=str(tmp_path / f"{name}.json"),
                csv_path=str(tmp_path / f"{name}.csv"))
    recs = {r["backend"]: r for r in json.loads((tmp_path / "a.json").read_text())["cells"]}
    timed = [k for k, v in recs["eager"].items() if isinstance(v, float) and k not in ("rel_err", "seq_stdev", "load_avg", "busy_cores")]
    assert {"latency_ms", "prefill_ms", "ttft_ms", "tokens_per_s"} <= set(timed)
    assert recs["eager"]["itl_p99_ms"] is None  # a few decode steps carry no p99 (measure/timer.carried)
    wrong = recs["broken-noise"]
    assert wrong["status"] == "wrong" and wrong["rel_err"] > 0.1
    assert all(wrong.get(k) is None for k in timed), {k: wrong.get(k) for k in timed if wrong.get(k) is not None}
    rows = {r["backend"]: r for r in csv.DictReader(open(tmp_path / "a.csv"))}
    assert all(rows["broken-noise"].get(k, "") == "" for k in timed)
    api.report(db, ["a"], str(tmp_path / "rep"))
    md = (tmp_path / "rep" / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| gpt2-tiny | broken-noise"))
    assert "wrong" in row and not any(ch.isdigit() for ch in row.split("wrong", 1)[1].split("|")[1:-2][0])
    # two samples a cell leave every pair n/a, which compare() refuses: the pairs as it judged them
    with pytest.raises(SpecError, match="no pair of cells got a verdict"):
        compare(db, "a", "b")
    cmp = judged_pairs(db, "a", "b")
    broken = next(c for c in cmp.cells if c.record_a["backend"] == "broken-noise")
    assert broken.median_a is None and broken.median_b is None and broken.ratio is None


# --- 4. record keys ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cpu_run_records_have_every_documented_key_with_nulls_not_zeros(tmp_path, quick):
    from transbench import api
    from transbench.scenarios.inference.spec import RunSpec
    from transbench.store.export import RECORD_KEYS

    out = tmp_path / "r.json"
    api.run(RunSpec(models=["bert-tiny"], backends=["sdpa"], batches=[2], seqs=[16], dtypes=["fp32"], **quick),
            db=str(tmp_path / "r.db"), json_path=str(out))
    (rec,) = json.loads(out.read_text())["cells"]
    assert list(rec)[:len(RECORD_KEYS)] == list(RECORD_KEYS)
    for key in ("gpu", "mfu", "peak_mem_mb", "mem_before_mb", "sm_clock_mhz", "avg_power_w", "j_per_seq",
                "host_ms", "speedup", "mem_saved", "error"):
        assert rec[key] is None, key  # not applicable or not measurable on a CPU: null, never 0
    assert isinstance(rec["n_samples"], int) and rec["n_samples"] >= quick["min_count"]
    # each percentile from the samples that carry it, or empty (measure/timer.carried)
    n, p90, p99 = rec["n_samples"], rec["latency_p90_ms"], rec["latency_p99_ms"]
    assert (p90 is None) == (n < 10) and (p99 is None) == (n < 100)
    assert 0 < rec["latency_ms"] <= (p90 or rec["latency_ms"]) <= (p99 or p90 or rec["latency_ms"])
    assert rec["throughput_per_s"] == pytest.approx(2 / (rec["latency_ms"] / 1e3))


# --- 5. a cell's memory and timing do not depend on the cells before it -----------------------------------------

MiB = 2**20


class FakeAllocator:
    """torch.cuda's allocator counters on the CPU, driven by the test."""

    def __init__(self):
        self.allocated = self.peak = 0

    def alloc(self, mib: float) -> None:
        self.allocated += int(mib * MiB)
        self.peak = max(self.peak, self.allocated)

    def free(self, mib: float) -> None:
        self.allocated -= int(mib * MiB)

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: self.allocated)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: self.peak)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: self.peak)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: setattr(self, "peak", self.allocated))
        monkeypatch.setattr(torch.cuda, "init", lambda: None)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
        monkeypatch.setattr(memory, "_clear_workspaces", lambda: None)
        monkeypatch.setattr(memory.dev, "nvml_used_mb", lambda i: None)


def test_cell_figures_do_not_depend_on_the_order_of_cells(monkeypatch, fake_gpu):
    """Two cells, A (300 MiB model, 900 MiB peak of work, leaves 64 MiB behind) and B (100 + 50 MiB), in both orders
    in one fake worker: each reads the same peak_mem_mb, latency and rates whichever ran first."""
    device, nv, _ = fake_gpu
    fake = FakeAllocator()
    fake.install(monkeypatch)
    cfg = timer.TimerConfig(warmup=2, min_time_s=0.0, min_count=8, warmup_time_s=0.0)

    def cell(model_mib, work_mib, call_ms, leak_mib):
        memory.reset_peak(device)
        fake.alloc(model_mib)

        def call():
            fake.alloc(work_mib)
            fake.free(work_mib)
            FakeEvent.t += call_ms

        s = timer.sample(call, device, cfg)
        rec, _ = record.timing_record(s, items=8, tokens=1024, flops=1e9)
        rec["peak_mem_mb"] = memory.snapshot(device)["peak_mem_mb"]
        fake.free(model_mib - leak_mib)  # what the cell leaves allocated (a worker over 8 MiB is replaced)
        return rec

    keys = ("peak_mem_mb", "latency_ms", "latency_p99_ms", "throughput_per_s", "tokens_per_s", "tflops", "n_samples")
    a_first = [cell(300, 900, 3.0, 64), cell(100, 50, 0.5, 0)]
    fake.allocated = fake.peak = 0
    b_first = [cell(100, 50, 0.5, 0), cell(300, 900, 3.0, 64)]
    for x, y in ((a_first[0], b_first[1]), (a_first[1], b_first[0])):
        assert {k: x[k] for k in keys} == {k: y[k] for k in keys}
    assert a_first[0]["peak_mem_mb"] == 1200 and a_first[1]["peak_mem_mb"] == 150


# memory's reset_peak / restart_peak / snapshot over a fake allocator, and what an fp32 reference borrows
from test_record_audit import FakeDevice as Borrowing  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("task", ["base", "generate"])
def test_run_cell_peak_is_the_same_with_the_reference_cached(monkeypatch, task):
    """The fp32 reference runs on the device unless an earlier cell of the worker cached it: run and generate
    compute it before the cell's peak starts, so the cell reads the same first in its worker and after another."""
    from transbench.cells import Cell
    from transbench.scenarios.generation import measure as generation
    from transbench.scenarios.inference import measure as inference

    fake = Borrowing()
    for name in ("reset_peak", "restart_peak", "snapshot"):
        monkeypatch.setattr(memory, name, getattr(fake, name))
    real_model_for = inference.model_for
    real_to = torch.nn.Module.to

    def model_for(*args):
        model = real_model_for(*args)
        fake.held = fake.base + fake.MODEL_MB
        fake.peak = max(fake.peak, fake.held)
        return model

    def to(self, *args, **kwargs):  # the reference model moved to the (fake) device borrows its size until freed
        if args and str(args[0]) == "cpu" and not kwargs:
            fake.peak = max(fake.peak, fake.held + fake.REFERENCE_MB)
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(inference, "model_for", model_for)
    monkeypatch.setattr(generation, "model_for", model_for)
    monkeypatch.setattr(torch.nn.Module, "to", to)
    cell = Cell("gpt2-tiny", task, "eager", "fp32", batch=2, seq=8, new_tokens=2, min_time=0.0, min_count=2,
                warmup=0)
    scenario = generation if task == "generate" else inference
    cache = inference.ModelCache()
    first, second = scenario.run(cell, cache), scenario.run(cell, cache)
    assert first.status == second.status == "ok", (first.error, second.error)
    assert first.record["peak_mem_mb"] == second.record["peak_mem_mb"] == fake.MODEL_MB


# --- 4. serve --find-max-rate: a failed probe is no answer ------------------------------------------------------


def _max_rate_search(tmp_path, monkeypatch, offline: float, probe):
    """serve --find-max-rate through a fake lane: offline serves `offline`/s, `probe(cell)` is a rate cell's result.
    (the records, the serve-max-rate summary)."""
    from transbench import api
    from transbench.cells import CellResult
    from transbench.runner import sweep
    from transbench.scenarios.serve.spec import ServeSpec

    class FakeLane:
        def __init__(self, gpu, target, **kw):  # the lane's own keywords (progress, threads)
            pass

        def run(self, cell, timeout):
            if cell.mode == "offline":
                return CellResult("ok", record={"achieved_rate": offline, "latency_p99_ms": 5.0})
            return probe(cell)

        def close(self):
            pass

    monkeypatch.setattr(sweep, "_Lane", FakeLane)
    spec = ServeSpec(model="bert-tiny", backends=["sdpa"], device="cpu", lengths="fixed:8", find_max_rate=True,
                     slo_ms=10, name="mr")
    recs = api.serve(spec, str(tmp_path / "m.db")).records
    (summary,) = [r for r in recs if r["scenario"] == "serve-max-rate"]
    return recs, summary


@pytest.mark.parametrize("offline, fail_above", [(400.0, 0.0), (400.0, 250.0), (0.01, 1e9)])
def test_a_max_rate_search_ended_by_a_failed_probe_is_not_a_measured_rate(tmp_path, monkeypatch, offline, fail_above):
    """A probe that crashed or timed out ended the search (serve_search.find_max_rate) and the summary cell was stored
    `ok` with max_rate 0 (no probe had failed the target) or with the last passing rate and no word that the search
    stopped early: a 0 that was never measured, a bound read as the answer."""
    from transbench.cells import CellResult

    def probe(cell):  # a probe at or under `fail_above` meets the target, above it crashes
        if cell.rate <= fail_above:  # met by LoadGen's verdict as by the percentile (stats.account's slo_met)
            return CellResult("ok", record={"achieved_rate": cell.rate, "latency_p99_ms": 5.0,
                                            "latency_p99_upper_ms": 5.0, "slo_met": True})
        return CellResult("error", error="worker process killed by signal 9")
    _, summary = _max_rate_search(tmp_path, monkeypatch, offline, probe)
    if offline < 1:  # the first probe (0.005/s) would outlast --timeout: none ran, nothing was measured
        assert summary["status"] == "error" and summary["max_rate"] is None, summary
        assert "outlast --timeout" in summary["error"]
    elif fail_above == 0.0:  # the first probe (200/s) crashed: nothing was measured
        assert summary["status"] == "error" and summary["max_rate"] is None, summary
        assert "200/s" in summary["error"] and "error" in summary["error"]
    else:  # 200/s passed, 300/s crashed: 200/s is a lower bound, said so
        assert summary["status"] == "ok" and summary["max_rate"] == 200.0
        from transbench.store import Store

        store = Store(str(tmp_path / "m.db"), readonly=True)
        try:
            (cell,) = [c for c in store.cells(summary["run_id"]) if c["scenario"] == "serve-max-rate"]
        finally:
            store.close()
        assert any("300/s" in w and "may be above" in w for w in cell["warnings"]), cell["warnings"]


@pytest.mark.parametrize("failing, probes, why", [
    # 4.5% of requests answered 400 at every rate (bert-tiny's lognormal:64:256 inputs over its 128 positions):
    # the search bisected down to its lowest rate (~14 minutes) for what the first probe already said
    (lambda rate: {"http_400": 45}, 1, "refused for themselves (http_400 45)"),
    (lambda rate: {"http_500": 50}, 2, "did not fall as the rate fell: 5.00% of 1,000 at 200/s"),  # a steady 500
    # a server that sheds load (503), or fails its overload with 500, fails less as the rate falls: searched on
    (lambda rate: {"http_503": round(1000 * max(0.0, 1 - 60 / rate))}, None, None),
    (lambda rate: {"http_500": round(1000 * max(0.0, 1 - 60 / rate))}, None, None),
    (lambda rate: {"http_400": 1}, None, None),  # one refusal in 1,000: a p99 verdict still passes
])
def test_a_max_rate_search_stops_where_its_failures_leave_no_lower_rate_to_pass(tmp_path, monkeypatch, failing,
                                                                                 probes, why):
    from transbench.cells import CellResult

    def probe(cell):  # each probe measures 1,000 requests, `failing(rate)` of them failed
        failures = {k: v for k, v in failing(cell.rate).items() if v}
        failed = sum(failures.values())
        met = failed <= 2  # LoadGen's p99 verdict lets 1,000 requests miss a few
        return CellResult("ok", record={"requests": 1000, "failed": failed, "achieved_rate": cell.rate,
                                        "latency_p99_upper_ms": 5.0 if met else None, "slo_met": met},
                          info={"failures": failures})
    recs, summary = _max_rate_search(tmp_path, monkeypatch, 400.0, probe)
    rates = [r["rate"] for r in recs if r["mode"] == "rate"]
    if why is None:
        assert summary["status"] == "ok" and summary["max_rate"] > 0 and len(rates) > 2, (summary, rates)
        return
    assert len(rates) == probes and summary["status"] == "error" and summary["max_rate"] is None, (summary, rates)
    error = summary["error"]
    assert error.startswith("the search stopped: ") and why in error and "\n" not in error, error


def test_a_multi_gpu_training_cells_energy_and_power_are_of_the_same_gpus():
    """Training reads NVML on rank 0's GPU and multiplied energy_j, j_per_seq and j_per_token by the world size, but
    not avg_power_w: a 2-GPU record said 6 J per 10 ms step (600 W) beside 300 W. Data-parallel inference sums the
    ranks' boards for both (inference_dp.py), so a record's power is that of all the cell's GPUs, as its energy."""
    from types import SimpleNamespace

    from transbench.models import build
    from transbench.runner.rank import RankInfo
    from transbench.scenarios.training import loop as training_loop
    from transbench.scenarios.training.cell import TrainCell

    cell = TrainCell("bert-tiny", "mlm", "sdpa", "bf16", "adamw", batch=2, seq=16, strategy="ddp", nproc=2,
                     device="cuda")
    ctx = context.DeviceContext(sm_clock_mhz=[1500.0], power_w=[310.0], max_sm_clock_mhz=1980, energy_j=30.0,
                                seconds=0.1)
    steps = [10.0] * 10
    sampled = timer.Sampled(steps, timer.summarize(steps), len(steps), ctx, {})
    per_rank = [{"samples": steps, "parts": {}, "mem": {}, "device": f"cuda:{i}"} for i in range(2)]
    trainer = SimpleNamespace(shape=build.resolve("bert-tiny").shape, info={}, by_allocator=True, scaler=None)
    r = training_loop._result(cell, trainer, per_rank, sampled, [1.0] * 12, [], 0.0, torch.device("cpu"),
                              RankInfo(world_size=2))
    rec = r.record
    assert rec["energy_j"] == pytest.approx(2 * 30.0 / 10)  # rank 0's 3 J a step, times the two GPUs
    assert rec["j_per_seq"] == pytest.approx(rec["energy_j"] / cell.global_batch)
    assert rec["avg_power_w"] == pytest.approx(rec["energy_j"] / (rec["latency_ms"] / 1e3))  # 600 W, not 300


def test_the_serve_table_gives_rates_per_second_and_goodput_as_a_percentage():
    """`transbench serve` printed `offered rate`, `achieved rate` and `max rate` without a unit, and goodput as a bare
    fraction (0.9996) where the report prints 99.96% (report/serve.py LOAD_COLS)."""
    from rich.console import Console

    from transbench.cli.serve import _table

    rec = {"status": "ok", "backend": "sdpa", "mode": "rate", "rate": 500.0, "offered_rate": 500.0,
           "achieved_rate": 497.2, "latency_p50_ms": 3.1, "latency_p99_ms": 9.7, "goodput": 0.9996, "mean_batch": 3.2}
    table = _table([rec, {**rec, "status": "unsupported", "goodput": None, "achieved_rate": None,
                          "error": "cudagraph runs on cuda only"}], "t")
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert all(h in text for h in ("rate /s=500", "offered /s", "achieved /s", "goodput")), text
    assert "99.96%" in text and "0.9996" not in text
    # a cell that did not end ok: its whole status and, under the table, why (as run's table): "unsuppor…" before
    assert "unsupported [1]" in text and "[1] cudagraph runs on cuda only" in text


def test_micro_tables_print_percent_of_peak_as_every_percentage():
    """docs/measurement.md: percentages print with one decimal, never rounded onto 0% or 100%. `micro gemm`, `bandwidth` and
    `layer` printed % of the datasheet peak with none (99.6% read "(100%)", 0.4% "(0%)"), `breakdown` its % of
    roofline likewise."""
    from transbench.cli.micro import BREAKDOWN_COLUMNS, _pct

    assert _pct(330.0, 99.6) == "330 (99.6%)" and _pct(1.2, 0.04) == "1.2 (0.04%)" and _pct(None, None) == "-"
    roofline = next(c for c in BREAKDOWN_COLUMNS if c.key == "roofline")
    assert roofline.show(99.96) == "99.96%" and roofline.show(0.4) == "0.4%" and roofline.show(None) == "-"
    share = next(c for c in BREAKDOWN_COLUMNS if c.key == "share")  # a fraction of the layer's time
    assert share.show(0.9996) == "99.96%" and share.show(1.0) == "100.0%" and share.show(None) == "-"
