import pytest
import torch

from transbench.measure import peaks, timer


def test_stats_on_fixed_samples():
    s = timer.summarize([float(x) for x in range(1, 11)])
    assert s.median_ms == 5.5
    assert s.p90_ms == pytest.approx(9.1)
    assert s.p99_ms == pytest.approx(9.91)
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
