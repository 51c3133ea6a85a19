"""--timeout bounds a cell's work, not its worker's start-up (spawning it, importing torch and the cell's code), in a
sweep's worker and in a launched cell's ranks; a start-up that hangs is still ended, by its own limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from transbench.runner import launch, worker
from transbench.runner.worker import Worker

TARGET = "slow_start_target:measure"
TESTS = str(Path(__file__).resolve().parent)


@pytest.fixture
def slow_start(monkeypatch):
    """A start-up of 3 s (the cell's module import) and 0.5 s of work: a 2 s --timeout holds the work alone."""
    monkeypatch.setenv("TB_TEST_START_S", "3")
    monkeypatch.setenv("TB_TEST_WORK_S", "0.5")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p))


def test_a_workers_start_up_is_not_its_first_cells_time(slow_start):
    w = Worker()
    try:
        result = w.run(TARGET, {"device": "cpu"}, timeout=2.0)
    finally:
        w.stop()
    assert result.status == "ok", result.error


def test_a_hung_start_up_ends_at_its_own_limit(slow_start, monkeypatch):
    monkeypatch.setattr(worker, "WORKER_START_S", 1.0)  # the start-up's limit: the longer of --timeout and this
    w = Worker()
    try:
        result = w.run(TARGET, {"device": "cpu"}, timeout=0.5)
    finally:
        w.stop()
    assert result.status == "timeout" and result.error == ("the worker did not start within 1 s (importing torch "
                                                           "and the cell's code)")


def test_the_cells_work_still_times_out_after_the_start_up(slow_start, monkeypatch):
    monkeypatch.setenv("TB_TEST_WORK_S", "30")
    w = Worker()
    try:
        result = w.run(TARGET, {"device": "cpu"}, timeout=1.0)
    finally:
        w.stop()
    assert result.status == "timeout" and result.error == "no result within the 1 s deadline"


def test_a_launched_cells_clock_starts_when_its_ranks_have_started(slow_start):
    cfg = launch.LaunchConfig(timeout=2.0)
    result = launch.outcome(launch.launch("slow_start_target", {"device": "cpu"}, cfg), cfg)
    assert result.status == "ok", (result.error, result.info.get("logs"))
    assert result.info["wall_s"] > 3  # its start-up was not counted against the 2 s


def test_a_launched_cells_hung_start_up_ends_at_its_own_limit(slow_start, monkeypatch):
    monkeypatch.setattr(worker, "WORKER_START_S", 1.0)
    cfg = launch.LaunchConfig(timeout=0.5)
    result = launch.outcome(launch.launch("slow_start_target", {"device": "cpu"}, cfg), cfg)
    assert result.status == "timeout" and result.error.startswith("the ranks did not start within 1 s"), result.error
