"""Synthetic stored runs for the report and compare tests: cells written through the same path the
runner uses (sweep.store_result), with chosen raw samples, so a known difference is in the data."""

from __future__ import annotations

import statistics

from transbench.cells import Cell, CellResult
from transbench.runner.sweep import store_result
from transbench.store import Store
from transbench.store.db import RUN_KINDS


def ok_result(samples: list[float], batch: int, **extra) -> CellResult:
    med = statistics.median(samples)
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [med, med, med]
    record = {"latency_ms": med, "latency_p90_ms": max(samples), "latency_p99_ms": max(samples),
              "latency_iqr_ms": q[2] - q[0], "n_samples": len(samples), "throughput_per_s": batch / med * 1e3,
              "tokens_per_s": None, "tflops": 1.0 / med, "mfu": None, "peak_mem_mb": 100.0 + batch, "rel_err": 1e-7,
              **extra}
    return CellResult("ok", record=record, samples_ms=list(samples))


def bad_result(status: str, error: str, **record) -> CellResult:
    # A speed in the record of a failed cell must never reach a report: put one in to prove it.
    return CellResult(status, record=record, samples_ms=[1.0, 1.1, 1.2], error=error)


def cell(backend: str = "eager", batch: int = 1, seq: int = 8, model: str = "bert-tiny", task: str = "base",
         dtype: str = "fp32") -> Cell:
    return Cell(model=model, task=task, backend=backend, dtype=dtype, batch=batch, seq=seq, device="cpu")


def make_run(db: str, name: str, results: list[tuple[Cell, CellResult]], kind: str = "inference",
             spec: dict | None = None, env: dict | None = None) -> str:
    store = Store(db)
    try:
        run_id, _ = store.create_run(name, kind, spec or {}, env or {"torch": "test", "gpus": []})
        for c, r in results:
            # an inference cell standing in for a cell of another kind of run is stored under that kind's scenario:
            # a store reads a cell whose scenario is not its run's as damage (store.db.RUN_KINDS)
            store_result(store, run_id, c, r, scenario=None if kind == "inference" else RUN_KINDS[kind][0])
    finally:
        store.close()
    return run_id


def judged_pairs(db, run_a: str, run_b: str):
    """Two stored runs compared as `compare` compares them, before its refusal of a comparison that judged nothing
    (every pair n/a): the pairs themselves, for tests of what each says."""
    from transbench.report.compare import CompareConfig, compare_records
    from transbench.report.data import load

    store = Store(str(db), readonly=True)
    try:
        da, db_ = load(store, [run_a]), load(store, [run_b])
    finally:
        store.close()
    return compare_records(da.runs[0], da.records, db_.runs[0], db_.records, CompareConfig())
