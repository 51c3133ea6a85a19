"""Audit of the figures a record shows: each one consistent with the raw data it keeps, with docs/measurement.md's
definitions, and the same in every output; a cell's figures independent of the cells before it. Each test
here failed before the fix it names."""

from __future__ import annotations

import numpy as np
import pytest

from transbench.measure import peaks
from transbench.report.data import ReportData
from transbench.report.document import num
from transbench.report.tables import micro_tables, training_table
from transbench.scenarios.serve.load import LoadPlan, Request, Served, Trace
from transbench.scenarios.serve.stats import account

# --- MFU: the peak of the GPU the record names ------------------------------------------------------------


def test_peak_row_is_the_named_gpus():
    cases = [("NVIDIA L40", 44.5, "L40"),  # was the L4's row: "l4" is inside "l40"
             ("NVIDIA GeForce RTX 3090 Ti", 23.6, None),  # was the 3090's peaks
             ("NVIDIA H200 NVL", 139.8, "H200 NVL"),  # was the H200 SXM's
             ("NVIDIA L40S", 44.5, "L40S"), ("NVIDIA L4", 22.0, "L4"), ("NVIDIA GeForce RTX 3090", 23.6, "RTX 3090"),
             ("NVIDIA H100 80GB HBM3", 79.2, "H100 SXM"), ("NVIDIA A100-SXM4-80GB", 79.2, "A100 80GB")]
    found = {name: (row.gpu if (row := peaks.lookup(name, mem)) else None) for name, mem, _ in cases}
    assert found == {name: gpu for name, _, gpu in cases}


def test_mfu_of_an_l40_is_against_the_l40s_peak():
    # 90.525 TFLOPS of fp16 is half an L40's 181.05 dense peak; against the L4's 121 it read 0.75
    assert peaks.mfu(90.525e12, "NVIDIA L40", "fp16", 44.5) == pytest.approx(0.5)


# --- the report's percentages ------------------------------------------------------------------------------


def test_percentages_never_round_onto_0_or_100():
    assert num(0.0004, "pct") == "0.04%"  # a tiny model's MFU printed 0.0%
    assert num(8.53e-6, "pct") == "0.00085%"  # two significant digits, not "0.001%"
    assert num(0.9996, "pct") == "99.96%"  # a goodput with misses printed 100.0%
    assert num(0.372, "pct") == "37.2%" and num(0.0, "pct") == "0.0%" and num(1.0, "pct") == "100.0%"


def test_the_cli_tables_print_percentages_as_the_report_does():
    from transbench.cli.tables import pct
    assert pct(0.0004) == "0.04%" and pct(0.9996) == "99.96%" and pct(None) == "-"  # were "0.0%" and "100.0%"


def _data(records: list[dict]) -> ReportData:
    for r in records:
        r.setdefault("run_id", "r1")
        r.setdefault("run_name", "r")
        r.setdefault("status", "ok")
    return ReportData([{"run_id": "r1", "name": "r"}], records, {})


def test_micro_share_is_a_percentage_like_the_cli_prints():
    recs = [{"scenario": "micro-breakdown", "model": "bert-tiny", "part": p, "latency_ms": ms, "share": share}
            for p, ms, share in (("qkv", 0.3, 0.3), ("layer", 1.0, 1.0))]
    table = micro_tables(_data(recs))[0]
    col = table.headers.index("share")
    assert [row[col] for row in table.rows] == ["30.0%", "100.0%"]  # were "0.300" and "1.00"


def test_training_table_tells_apart_cells_that_differ_in_an_axis():
    base = {"scenario": "training", "model": "bert-tiny", "backend": "sdpa", "dtype": "fp32", "batch_size": 2,
            "seq_len": 16, "world_size": 1, "strategy": "none", "optim": "adamw", "compile": False}
    recs = [{**base, "grad_ckpt": False, "latency_ms": 10.0, "mfu": 0.2, "hfu": 0.2},
            {**base, "grad_ckpt": True, "latency_ms": 13.0, "mfu": 0.15, "hfu": 0.2}]
    table = training_table(_data(recs))
    assert "grad ckpt" in table.headers and "HFU" in table.headers
    assert "compile" not in table.headers  # the same in every row
    ms = table.headers.index("step ms")
    labels = [tuple(row[:ms]) for row in table.rows]
    assert len(set(labels)) == 2  # two rows with one label and different numbers before
    assert [row[table.headers.index("HFU")] for row in table.rows] == ["20.0%", "20.0%"]


# --- serve: the contract's keys over the stored samples ------------------------------------------------------


def test_serve_record_has_median_and_sample_count_of_its_samples():
    rng = np.random.default_rng(0)
    arrivals = sorted(rng.uniform(0.5, 2.0, 41).tolist())
    plan = LoadPlan([8], arrivals=arrivals, warmup_s=0.5)
    served = [Served(Request(i, t, 8), t, t + float(d), 1) for i, (t, d) in
              enumerate(zip(arrivals, rng.exponential(0.01, len(arrivals))))]
    trace = Trace(served, [], [(s.start, s.done, 1) for s in served], plan, max(s.done for s in served))
    rec, samples, _ = account(trace, slo_ms=20, offered_rate=27.0)
    a = np.array(samples)
    assert rec["latency_ms"] == pytest.approx(np.percentile(a, 50))  # was absent: empty in --json / --csv
    assert rec["n_samples"] == len(samples) == rec["requests"] == 41
    for key, q in (("latency_p50_ms", 50), ("latency_p90_ms", 90), ("latency_p99_ms", 99), ("latency_p999_ms", 99.9)):
        # 41 requests carry p50 and p90, not p99 or p99.9 (measure/timer.carried): those are empty
        assert rec[key] == (pytest.approx(np.percentile(a, q)) if q <= 90 else None), key


# --- serve: a cell's peak memory does not depend on the cells before it -------------------------------------


class FakeDevice:
    """The allocator's counters as the serve scenario reads them (measure/memory), on the CPU: what the cell's
    model holds, plus what the fp32 reference borrows while it runs on the device."""

    MODEL_MB, REFERENCE_MB = 10.0, 400.0

    def __init__(self):
        self.held = self.peak = self.base = 0.0

    def reset_peak(self, device):
        self.base = self.peak = self.held

    def restart_peak(self, device):
        self.peak = self.held

    def snapshot(self, device):
        return {"peak_mem_mb": self.peak - self.base, "peak_reserved_mb": None, "device_used_mb": None}

    def borrow(self, mb):
        self.peak = max(self.peak, self.held + mb)


@pytest.mark.slow
def test_serve_peak_memory_is_the_same_with_the_reference_cached(monkeypatch):
    """The gate's fp32 reference ran on the device after the cell's peak started, unless the worker had it
    cached from an earlier cell: the same serve cell read the reference model's size more when it came first."""
    from transbench.measure import memory
    from transbench.scenarios.inference import measure as inference
    from transbench.scenarios.serve import measure as serve, lengths as serve_lengths

    fake = FakeDevice()
    for name in ("reset_peak", "restart_peak", "snapshot"):
        monkeypatch.setattr(memory, name, getattr(fake, name))
    real_model_for, real_reference = serve.model_for, serve.reference

    def model_for(*args):
        model = real_model_for(*args)
        fake.held = fake.base + fake.MODEL_MB
        fake.peak = max(fake.peak, fake.held)
        return model

    def reference(cache, cell, inputs, device):
        key = (cell.model_key(), cell.batch, cell.seq, cell.seq_stdev, cell.embeddings)
        if key not in cache.refs:  # computing it moves the fp32 model to the device
            fake.borrow(fake.REFERENCE_MB)
        return real_reference(cache, cell, inputs, device)

    monkeypatch.setattr(serve, "model_for", model_for)
    monkeypatch.setattr(serve, "reference", reference)
    lengths = serve_lengths.parse("fixed:8", 128).to_dict()
    cell = serve.ServeCell("bert-tiny", "classification", "sdpa", "fp32", "rate", rate=200.0, lengths=lengths,
                           max_batch_size=2, max_wait_ms=1.0, duration=0.2, warmup=0.05, device="cpu")
    cache = inference.ModelCache()
    first, second = serve.run(cell, cache), serve.run(cell, cache)
    assert first.status == second.status == "ok", (first.error, second.error)
    assert first.record["peak_mem_mb"] == second.record["peak_mem_mb"] == fake.MODEL_MB  # first read 410


def test_an_fp8_cell_that_ran_no_fp8_gemm_is_measured_against_the_fp16_peak():
    # Under engine/ops.py FP8_MIN_ROWS tokens the fused fp8 cell runs the fp16 forward (info fp8_gemm_ops 0); against
    # the fp8 peak (1,978.9 TFLOPS on an H100 SXM, twice fp16's) its MFU read half of what it reached.
    import torch

    from transbench.cells import Cell
    from transbench.measure import record, timer
    from transbench.measure.device import GpuInfo
    from transbench.scenarios.inference.measure import peak_dtype

    cell = Cell("bert-base-uncased", "base", "fused", "fp8", 1, 128, device="cuda:0")
    s = timer.sample_steps(lambda: 1.0, torch.device("cpu"), timer.TimerConfig(warmup=0, min_time_s=0.0, min_count=3))
    gpu = GpuInfo("NVIDIA H100 80GB HBM3", 79.2, 0)
    mfus = {}
    for ops in (0, 48, None):  # none ran in fp8; some did; a backend that counts none (not the engine)
        info = {} if ops is None else {"fp8_gemm_ops": ops}
        dtype = peak_dtype(cell, info)
        mfus[ops] = record.timing_record(s, items=1, flops=1e12, gpu=gpu, dtype=dtype)[0]["mfu"]
        assert (info.get("mfu_peak_dtype") == "fp16") == (ops == 0)
    assert mfus[0] == pytest.approx(1e12 / 1e-3 / 989.4e12) and mfus[48] == pytest.approx(1e12 / 1e-3 / 1978.9e12)
    assert mfus[None] == mfus[48]
    assert peak_dtype(Cell("bert-base-uncased", "base", "fused", "fp16", 1, 128), {"fp8_gemm_ops": 0}) == "fp16"
