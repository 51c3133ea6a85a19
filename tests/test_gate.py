"""What a gate and a CPU figure rest on: --threads set before any work and recorded per cell; other busy
processes recorded and warned about; --repeat as fresh processes per cell with an interval over the repeats,
which compare uses; energy integrated from sampled power where the board keeps no counter."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import pytest
from report_helpers import cell, make_run, ok_result
from typer.testing import CliRunner

from transbench import api
from transbench.cells import Cell, CellResult
from transbench.cli import app
from transbench.errors import SpecError
from transbench.measure import context, load, timer
from transbench.report import CompareConfig, compare
from transbench.report.compare import judge, repeat_interval
from transbench.runner import sweep
from transbench.runner.repeat import combine
from transbench.scenarios.inference.spec import RunSpec
from transbench.store import Store

TINY = ["run", "--model", "bert-tiny", "--batch", "1", "--seq", "8", "--backend", "sdpa", "--device", "cpu",
        "--min-time", "0.01", "--warmup", "1"]
BUSY_LOOP = "import time\nend = time.time() + {s}\nwhile time.time() < end:\n    pass\n"


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def busy_child():
    """A bounded busy loop in a child process (it ends by itself after 60 s, and is killed when the test ends)."""
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP.format(s=60)])
    time.sleep(0.3)  # it is running
    yield proc
    proc.kill()
    proc.wait()


# --- threads -----------------------------------------------------------------------------------------------

def test_threads_are_applied_before_the_work_and_recorded(tmp_path):
    db, js = tmp_path / "t.db", tmp_path / "t.json"
    res = invoke(*TINY, "--threads", "1", "--db", db, "--json", js, "--name", "one")
    assert res.exit_code == 0, res.output
    (rec,) = json.loads(js.read_text())["cells"]
    assert rec["threads"] == 1 and rec["load_avg"] is None or rec["load_avg"] >= 0
    spec = Store(str(db), readonly=True).find_run("one")["spec"]
    assert spec["threads"] == 1 and spec["repeat"] == 1


def test_the_default_threads_are_the_cores_this_process_may_use(monkeypatch):
    """A lane's workers get the affinity count (torch's own default is the machine's cores) through the
    variables OpenMP and MKL read at start and TRANSBENCH_THREADS, which the worker applies before any cell."""
    monkeypatch.setattr(load, "available_cores", lambda: 3)
    lane = sweep._Lane(None, sweep.Target(Cell, measure="repeat_target:measure"))
    assert lane.threads == 3 and lane.env["OMP_NUM_THREADS"] == lane.env["MKL_NUM_THREADS"] == "3"
    assert lane.env["TRANSBENCH_THREADS"] == "3"
    lane = sweep._Lane(None, sweep.Target(Cell, measure="repeat_target:measure"), threads=1)
    try:
        result = lane.run(Cell("bert-tiny", "base", "sdpa", "fp32", 1, 8), 120)
    finally:
        lane.close()
    assert result.status == "ok", result.error
    assert result.record["torch_threads"] == 1 and result.record["threads"] == 1  # applied in the worker, recorded


@pytest.mark.parametrize("option, value, says", [("--threads", "0", "--threads must be between 1"),
                                                 ("--repeat", "0", "--repeat must be between 1"),
                                                 ("--repeat", "1000", "--repeat must be between 1 and 100")])
def test_bad_threads_and_repeat_are_one_line(tmp_path, option, value, says):
    res = invoke(*TINY, option, value, "--db", tmp_path / "x.db")
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and says in res.stderr, res.output
    assert res.stderr.count("\n") == 1 and not (tmp_path / "x.db").exists()


# serve and train take run's --threads (one declaration, measure/load.threads_setting): tiny CPU cells of each
SERVE_TINY = ["serve", "--model", "bert-tiny", "--device", "cpu", "--backend", "sdpa", "--lengths", "fixed:8",
              "--max-batch-size", "2", "--rate", "20", "--duration", "0.5", "--warmup", "0.1"]
TRAIN_TINY = ["train", "--model", "bert-tiny", "--device", "cpu", "--batch", "1", "--seq", "8", "--steps", "1",
              "--warmup", "1"]


@pytest.mark.parametrize("command", [SERVE_TINY, TRAIN_TINY], ids=["serve", "train"])
def test_serve_and_train_apply_threads_in_the_cell(tmp_path, command):
    """--threads 1 reaches torch where the cell computes (a serve worker; a training cell's rank, which says so in
    the cell's info) and is stored with the run's spec; the default would be the cores this process may use."""
    db, js = tmp_path / "t.db", tmp_path / "t.json"
    res = invoke(*command, "--threads", "1", "--db", db, "--json", js, "--name", "one")
    assert res.exit_code == 0, res.output
    (rec,) = [r for r in json.loads(js.read_text())["cells"] if r["status"] == "ok"]
    assert rec["threads"] == 1  # serve: torch.get_num_threads() in its worker
    store = Store(str(db), readonly=True)
    run = store.find_run("one")
    assert run["spec"]["threads"] == 1
    if command is TRAIN_TINY:
        (stored,) = store.cells(run["run_id"])
        assert stored["info"]["torch_threads"] == 1
    store.close()


@pytest.mark.parametrize("command", ["serve", "train"])
@pytest.mark.parametrize("value, says", [("0", "--threads must be between 1"), ("-1", "--threads must be between 1"),
                                         ("x", "--threads 'x': expected an integer"),
                                         (str(10**9), "--threads must be between 1 and 4096")])
def test_bad_threads_of_serve_and_train_are_one_line(tmp_path, command, value, says):
    args = SERVE_TINY if command == "serve" else TRAIN_TINY
    res = invoke(*args, "--threads", value, "--db", tmp_path / "x.db")
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and says in res.stderr, res.output
    assert res.stderr.count("\n") == 1 and not (tmp_path / "x.db").exists()


# --- load --------------------------------------------------------------------------------------------------

def test_a_busy_process_is_seen_and_named(busy_child):
    busy = load.check(0.5)
    mine = [p for p in busy.processes if p["pid"] == busy_child.pid]
    assert mine and mine[0]["cores"] >= load.BUSY_CORE_SHARE, busy.processes  # its share of a shared machine
    line = load.warning(load.Busy(0.5, mine), 2)
    assert line.startswith("busy: other processes used") and f"pid {busy_child.pid}" in line
    assert "quiet machine" in line and "fewer threads than free cores" in line
    assert load.competing(load.Busy(0.5, [{**mine[0], "cores": 0.9}]), threads=2, cores=2)  # 2 threads, 1.1 cores free
    assert not load.competing(load.Busy(0.5, [{**mine[0], "cores": 0.9}]), threads=1, cores=2)


def test_the_benchmark_itself_is_not_a_busy_neighbour():
    """A worker's own children (torch.compile's compile workers) are its work, not load beside it."""
    child = subprocess.Popen([sys.executable, "-c", BUSY_LOOP.format(s=5)])
    try:
        time.sleep(0.2)
        assert all(p["pid"] != child.pid for p in load.check(0.4, descendants=True).processes)
        assert any(p["pid"] == child.pid for p in load.check(0.4).processes)
    finally:
        child.kill()
        child.wait()


def test_busy_neighbours_are_warned_about_before_the_sweep_and_recorded_per_cell(busy_child, tmp_path):
    lines: list[str] = []
    spec = RunSpec(models=["bert-tiny"], backends=["sdpa"], batches=[1], seqs=[8], device="cpu", min_time=0.3,
                   warmup=1)
    out = api.run(spec, str(tmp_path / "l.db"), on_warning=lines.append)
    # named, or among the "N more" on a machine shared with busier processes (the warning names the 3 busiest)
    assert lines and lines[0].startswith("busy:") and (f"pid {busy_child.pid}" in lines[0] or "more)" in lines[0])
    assert "just before this sweep" in lines[0]
    (rec,) = out.records
    # Over the cell's timed region. On a quiet machine the loop takes a core and is named; on one shared with more
    # runnable processes than cores it may get under BUSY_CORE_SHARE of one, and the others are named instead.
    assert rec["busy_processes"] and all(p["cores"] >= load.BUSY_CORE_SHARE for p in rec["busy_processes"])
    assert rec["threads"] == load.available_cores() and rec["load_avg"] is not None
    store = Store(str(tmp_path / "l.db"), readonly=True)
    (stored,) = store.cells(out.run_id)
    # The cell is warned about by the rule (load.competing) on its own region's figures: on a CI machine shared with
    # more runnable processes than cores, the loop and the rest together took under BUSY_TOTAL of a core there once.
    warned = any(w.startswith("busy: other processes used") for w in stored["warnings"])
    region = load.Busy(processes=rec["busy_processes"], total=rec["busy_cores"])
    assert warned == load.competing(region, rec["threads"]), (rec["busy_cores"], stored["warnings"])


def test_load_readers_degrade_without_proc(monkeypatch):
    def missing(*a, **k):
        raise FileNotFoundError

    monkeypatch.setattr(load.os, "listdir", missing)
    monkeypatch.setattr("builtins.open", missing)
    assert load.cpu_times() == {} and load.load_avg() is None
    assert load.busy_between({}, {}, 1.0).processes == []


def test_the_noisy_warning_names_the_fix_that_works_on_a_cpu():
    from transbench.measure import record, timer

    s = timer.Sampled([1.0, 1.3, 0.8, 1.5], timer.summarize([1.0, 1.3, 0.8, 1.5]), 4, context.DeviceContext())
    (line,) = record.noisy_warnings(s)
    assert line.startswith("noisy: IQR/median") and "fewer threads than free cores" in line and "quiet machine" in line
    assert "timing longer does not" in line


# --- repeats -----------------------------------------------------------------------------------------------

def test_repeats_run_cell_by_cell_each_in_a_fresh_process(tmp_path):
    db = str(tmp_path / "r.db")
    store = Store(db)
    run_id, _ = store.create_run("r", "inference", {}, {})
    cells = [Cell("bert-tiny", "base", "sdpa", "fp32", 1, s) for s in (8, 16)]
    seen: list = []
    try:
        sweep.run_grid(store, run_id, cells, sweep.Target(Cell, measure="repeat_target:measure"),
                       sweep.SweepOptions(timeout=120, threads=1, repeat=3), lambda c, r: seen.append((c, r)))
        stored = store.cells(run_id)
    finally:
        store.close()
    assert [c.seq for c, _ in seen] == [8, 16]
    for c, r in seen:
        assert r.status == "ok" and r.record["repeats"] == 3 and len(r.record["repeat_medians_ms"]) == 3
        assert r.info["repeat_samples"] == [12, 12, 12] and len(r.samples_ms) == 36 and r.record["n_samples"] == 36
        meds = r.record["repeat_medians_ms"]
        assert r.record["latency_repeat_min_ms"] == min(meds) and r.record["latency_repeat_max_ms"] == max(meds)
        assert r.record["latency_ms"] == sorted(meds)[1]  # the median repeat's figures
    # every repeat a process of its own; cell 8's three repeats all before cell 16's
    times = [(s["record"]["at"], s["key"]) for s in stored]
    assert len(stored) == 2 and all(s["record"]["repeats"] == 3 for s in stored)
    assert times == sorted(times)


def test_combine_keeps_a_failure_and_warns_of_a_spread():
    ok = [CellResult("ok", {"latency_ms": m}, [m] * 4) for m in (1.0, 1.2, 1.1)]
    r = combine(ok, 3)
    assert r.record["latency_ms"] == 1.1 and r.record["repeat_medians_ms"] == [1.0, 1.2, 1.1]
    assert any(w.startswith("repeats: the 3 processes' medians spread") for w in r.warnings)
    failed = combine([ok[0], CellResult("oom", error="out of memory")], 3)
    assert failed.status == "oom" and "repeat 2 of 3 ended oom" in failed.warnings[0]


def test_compare_uses_the_repeats_when_both_runs_have_them(tmp_path):
    db = str(tmp_path / "c.db")
    samples = [1.0, 1.01, 0.99] * 10  # 30 samples: blocks alone would call this `same`
    make_run(db, "a", [(cell(), ok_result(samples, 1, repeats=4, repeat_medians_ms=[1.0, 1.01, 0.99, 1.0]))])
    make_run(db, "b", [(cell(), ok_result(samples, 1, repeats=4, repeat_medians_ms=[1.10, 1.12, 1.11, 1.09]))])
    make_run(db, "c", [(cell(), ok_result(samples, 1))])
    cmp = compare(db, "a", "b")
    (c,) = cmp.cells
    assert c.method == "repeats" and c.verdict == "slower" and c.interval[0] > 1.03 and "4 + 4 repeats" in c.note
    (c,) = compare(db, "a", "c").cells  # one side without repeats: the samples decide
    assert c.method == "blocks" and c.verdict == "same"
    res = invoke("run", "--help")
    assert "--repeat" in res.output and "--threads" in res.output


def test_repeat_interval_is_a_welch_t_interval():
    lo, hi = repeat_interval([1.0, 1.02, 0.98], [1.0, 1.02, 0.98], 0.05)
    assert lo < 1 < hi and lo == pytest.approx(1 / hi)
    lo, hi = repeat_interval([1.0, 1.0], [2.0, 2.0], 0.05)
    assert lo == hi == pytest.approx(2.0)
    ratio, (lo, hi), v, _ = judge([1.0] * 5, [1.0] * 5, 1.0, 1.0, CompareConfig(), None, [1.0, 1.1, 0.9], [1.0, 1.1, 0.9])
    assert v == "same"


# --- energy ------------------------------------------------------------------------------------------------

def test_energy_integrates_a_power_trace():
    # 100 W for 1 s then a ramp to 300 W over 1 s: 100 + 200 J; the first reading held back to the start
    times, watts = [0.5, 1.0, 2.0], [100.0, 100.0, 300.0]
    assert context.integrate_energy(times, watts, 0.0, 2.0) == pytest.approx(50 + 50 + 200)
    assert context.integrate_energy(times, watts, 0.0, 3.0) == pytest.approx(300 + 300)  # the last carried on
    assert context.integrate_energy([1.0], [100.0], 0.0, 2.0) is None  # one reading is no trace


class NoCounterNvml:
    """A board that reports power but keeps no energy counter; power rises 10 W a reading."""

    NVML_CLOCK_SM = 1

    def __init__(self):
        self.power_mw = 100_000

    def nvmlDeviceGetClockInfo(self, h, which):
        return 1500

    def nvmlDeviceGetMaxClockInfo(self, h, which):
        return 1500

    def nvmlDeviceGetPowerUsage(self, h):
        self.power_mw += 10_000
        return self.power_mw

    def nvmlDeviceGetTemperature(self, h, which):
        return 50

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return 0

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")


def test_a_board_without_a_counter_gets_integrated_energy():
    nv = NoCounterNvml()
    with context.Monitor(nvml=nv, handle=object(), poll_s=0.01) as m:
        time.sleep(0.2)
    c = m.context
    assert c.energy_source == "integrated" and len(c.power_w) >= 3
    assert min(c.power_w) * c.seconds <= c.energy_j <= max(c.power_w) * c.seconds
    from transbench.measure import record, timer

    s = timer.Sampled([2.0] * 10, timer.summarize([2.0] * 10), 10, c)
    rec = record.context_record(s, items=4)
    assert rec["energy_source"] == "integrated" and rec["energy_j"] == pytest.approx(c.energy_j / 10)


def test_a_counter_is_marked_as_counted(monkeypatch):
    class Counter(NoCounterNvml):
        energy = 0.0

        def nvmlDeviceGetTotalEnergyConsumption(self, h):
            self.energy += 50_000.0
            return self.energy

    monkeypatch.setattr(context, "MIN_ENERGY_REGION_S", 0.0)
    with context.Monitor(nvml=Counter(), handle=object(), poll_s=0.01) as m:
        time.sleep(0.05)
    assert m.context.energy_source == "counter" and m.context.energy_j == pytest.approx(50.0)


def test_combine_spread_is_over_the_samples_it_stores_and_counts():
    # The median repeat's own p99 stood beside n_samples of all three repeats: 0.75 ms stored where the stored
    # samples' p99 was 2.03 ms. The median stays the median repeat's; the spread is the stored samples'.
    reps = [[1.0] * 10, [2.0] * 9 + [9.0], [3.0] * 10]
    results = [CellResult("ok", {"latency_ms": statistics.median(s), "latency_p90_ms": max(s), "latency_p99_ms": max(s),
                                 "latency_iqr_ms": 0.0, "n_samples": len(s)}, s) for s in reps]
    r = combine(results, 3)
    pooled = timer.summarize([x for s in reps for x in s])
    assert r.record["latency_ms"] == 2.0 and r.record["n_samples"] == 30 == len(r.samples_ms)
    assert r.record["latency_p99_ms"] == pooled.p99_ms and r.record["latency_p90_ms"] == pooled.p90_ms
    assert r.record["latency_iqr_ms"] == pooled.iqr_ms == 2.0
    bare = combine([CellResult("ok", {"latency_ms": m}, [m] * 4) for m in (1.0, 1.1)], 2)  # no spread keys: none added
    assert "latency_p99_ms" not in bare.record
