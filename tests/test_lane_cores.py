"""Lanes over several GPUs share one host: each lane's workers keep to a slice of its cores (runner/sweep.py
lane_cores), so a lane building its model does not slow the kernel launches of another."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transbench.cells import Cell
from transbench.runner import launch, sweep, worker


@pytest.mark.parametrize("cores, lanes, sizes", [(64, 4, [16] * 4), (10, 4, [3, 3, 2, 2]), (4, 4, [1] * 4),
                                                 (7, 2, [4, 3])])
def test_each_lane_gets_a_disjoint_slice_of_the_cores(monkeypatch, cores, lanes, sizes):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(100, 100 + cores)), raising=False)
    shares = sweep.lane_cores(lanes)
    assert [len(s) for s in shares] == sizes
    flat = [c for s in shares for c in s]
    assert sorted(flat) == list(range(100, 100 + cores)) and len(set(flat)) == cores


@pytest.mark.parametrize("cores, lanes", [(8, 1), (3, 4)])
def test_one_lane_or_too_few_cores_pins_nothing(monkeypatch, cores, lanes):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert sweep.lane_cores(lanes) == [None] * lanes


def test_a_lane_runs_its_worker_on_its_cores_with_that_many_threads():
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    mine = sorted(os.sched_getaffinity(0))
    lane = sweep._Lane(None, sweep.Target(Cell, measure="repeat_target:measure"), cpus=mine[:1])
    assert lane.threads == 1 and lane.env["TRANSBENCH_CPUS"] == str(mine[0])
    try:
        result = lane.run(Cell("bert-tiny", "base", "sdpa", "fp32", 1, 8), 120)
    finally:
        lane.close()
    assert result.status == "ok", result.error
    assert result.record["cpus"] == mine[:1] and result.record["torch_threads"] == 1
    assert result.info["lane_cpus"] == f"1 cores from {mine[0]}"


def test_a_physical_cores_hyperthreads_stay_in_one_lane(monkeypatch):
    # 8 logical CPUs on 4 cores, siblings numbered as Linux does on x86 (cpu i and i + 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(sweep, "_siblings", lambda c: frozenset({c % 4, c % 4 + 4}))
    shares = sweep.lane_cores(2)
    assert shares == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_fewer_physical_cores_than_lanes_splits_the_logical_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.setattr(sweep, "_siblings", lambda c: frozenset({c % 2, c % 2 + 2}))
    assert sweep.lane_cores(4) == [[0], [1], [2], [3]]


def test_siblings_read_from_this_machine_include_the_cpu_itself():
    cpu = sorted(os.sched_getaffinity(0))[0] if hasattr(os, "sched_getaffinity") else 0
    assert cpu in sweep._siblings(cpu)


# What a user's environment may hold under the lane's variable: core lists, numbers past a C long, any text.
USER_CPUS = st.one_of(st.text(max_size=40), st.lists(st.integers(-2**70, 2**70), max_size=5).map(
    lambda xs: ",".join(map(str, xs))))
ORIGINAL_CPUS = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()


@settings(max_examples=50, deadline=None)
@given(value=USER_CPUS, mine=st.one_of(st.none(), st.lists(st.integers(0, 63), min_size=1, max_size=4, unique=True)))
def test_the_users_transbench_cpus_never_reaches_a_worker(value, mine):
    saved = os.environ.get("TRANSBENCH_CPUS")
    os.environ["TRANSBENCH_CPUS"] = value.replace("\0", "")
    try:
        lane = sweep._Lane(None, sweep.Target(Cell, measure="repeat_target:measure"), cpus=mine)
        # the worker's environment (and a cell's ranks', runner/launch.py) carries the lane's own cores, or none
        assert launch.environment(lane.env)["TRANSBENCH_CPUS"] == ",".join(map(str, mine or []))
        worker.apply_cpus()  # whatever the variable holds, a worker starts: a core list it cannot use is no error
    finally:
        if saved is None:
            os.environ.pop("TRANSBENCH_CPUS", None)
        else:
            os.environ["TRANSBENCH_CPUS"] = saved
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, ORIGINAL_CPUS)



def test_a_cpu_list_in_the_users_environment_does_not_fail_the_cells(monkeypatch):
    monkeypatch.setenv("TRANSBENCH_CPUS", "99999999999999999999")  # past a C long: every worker died at start-up
    lane = sweep._Lane(None, sweep.Target(Cell, measure="repeat_target:measure"))
    try:
        result = lane.run(Cell("bert-tiny", "base", "sdpa", "fp32", 1, 8), 120)
    finally:
        lane.close()
    assert result.status == "ok", result.error
