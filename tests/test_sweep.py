"""Sweeps that survive: failures are statuses, OOM skips larger batches, kills lose at most one cell. A sweep stopped
mid-run (Ctrl-C or SIGTERM, a full disk while an output is written, a temporary folder that takes no file, a cell's
process killed by the OS) ends in one line, leaves no process or temporary file behind, never leaves a half-written
output in place of a good one, and resumes."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from transbench import api
from transbench.scenarios.inference import cells as grid
from transbench.cells import Cell, CellResult
from transbench.errors import SpecError
from transbench.runner import launch
from transbench.store.db import Merged
from transbench.runner.sweep import SweepOptions, find_max_batch, max_batch_key, open_run, search_max_batch
from transbench.scenarios import micro
from transbench.scenarios.inference.spec import RunSpec
from transbench.spec import dump_file, load_file
from transbench.store import Store, export

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def faults(extra_backends):
    extra_backends("fault_backends")


def statuses(outcome):
    return {(r["backend"], r["batch_size"]): r["status"] for r in outcome.records}


@pytest.mark.slow
def test_raise_hang_and_signal_each_get_a_status_and_the_sweep_completes(faults, db, quick):
    spec = RunSpec(models=["bert-tiny"], backends=["fail-raises", "fail-hangs", "fail-segv", "sdpa"],
                   batches=[1], seqs=[8], timeout=15, **quick)
    out = api.run(spec, db)
    st = statuses(out)
    assert st == {("fail-raises", 1): "error", ("fail-hangs", 1): "timeout", ("fail-segv", 1): "error", ("sdpa", 1): "ok"}
    errors = {r["backend"]: r["error"] for r in out.records}
    assert "always fails" in errors["fail-raises"]
    assert "deadline" in errors["fail-hangs"]
    assert "signal 11" in errors["fail-segv"]


@pytest.mark.slow
def test_a_resume_measures_a_crashed_cell_again_and_keeps_every_other_answer(faults, db, quick, monkeypatch):
    """A cell stored `error` after a crash (here its worker killed by SIGSEGV) was skipped by every resume as
    finished, so the run kept the hole unless renamed. A resume now measures it again; `ok`, `wrong` and the other
    answers stay as stored."""
    spec = RunSpec(models=["bert-tiny"], backends=["crash-once", "wrong-output", "sdpa"], batches=[1], seqs=[8],
                   name="r", **quick)
    monkeypatch.setenv("FAULT_CRASH", "1")
    first = api.run(spec, db)
    assert statuses(first) == {("crash-once", 1): "error", ("wrong-output", 1): "wrong", ("sdpa", 1): "ok"}
    con = sqlite3.connect(db)
    before = dict(con.execute("SELECT json_extract(record, '$.backend'), created FROM cells"))
    con.close()
    monkeypatch.setenv("FAULT_CRASH", "0")
    again = api.run(spec, db)
    assert statuses(again) == {("crash-once", 1): "ok", ("wrong-output", 1): "wrong", ("sdpa", 1): "ok"}
    con = sqlite3.connect(db)
    after = dict(con.execute("SELECT json_extract(record, '$.backend'), created FROM cells"))
    assert con.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 3  # replaced, not added
    con.close()
    assert after["sdpa"] == before["sdpa"] and after["wrong-output"] == before["wrong-output"]
    assert after["crash-once"] != before["crash-once"]


@pytest.mark.slow
def test_oom_is_a_result_and_larger_batches_are_skipped(faults, db, quick, monkeypatch):
    monkeypatch.setenv("FAKE_MAX_BATCH", "2")
    spec = RunSpec(models=["bert-tiny"], backends=["fake-oom"], batches=[1, 2, 4, 8, 16], seqs=[8], **quick)
    st = statuses(api.run(spec, db))
    assert st == {("fake-oom", 1): "ok", ("fake-oom", 2): "ok", ("fake-oom", 4): "oom",
                  ("fake-oom", 8): "skipped", ("fake-oom", 16): "skipped"}


@pytest.mark.slow
def test_wrong_output_is_caught_and_shows_no_speed(faults, db, quick):
    out = api.run(RunSpec(models=["bert-tiny"], backends=["wrong-output"], batches=[2], seqs=[8], **quick), db)
    rec = out.records[0]
    assert rec["status"] == "wrong" and rec["rel_err"] > 0.1
    assert rec["latency_ms"] is None and rec["throughput_per_s"] is None


def test_max_batch_search_against_a_fake_allocator_limit():
    tried = []

    def probe(batch):
        tried.append(batch)
        return CellResult("ok" if batch <= 37 else "oom", record={"throughput_per_s": float(batch)})

    result, best = find_max_batch(probe, limit=4096)
    assert best == 37 and result.record["throughput_per_s"] == 37.0
    assert tried[:7] == [1, 2, 4, 8, 16, 32, 64]  # doubling, then bisection between 32 and 64
    assert len(tried) <= 7 + 5
    tried.clear()

    def big(batch):
        tried.append(batch)
        return CellResult("ok" if batch <= 5000 else "oom")

    # Large batches: bisection stops within 1/32 of the limit, below it, in a handful of probes.
    result, best = find_max_batch(big, start=4096)
    assert 5000 - 4096 // 32 <= best <= 5000 and tried[0] == 4096 and len(tried) <= 7
    assert find_max_batch(lambda b: CellResult("oom"), 64)[1] is None
    assert find_max_batch(lambda b: CellResult("ok"), 64)[1] == 64  # capped at the limit
    # A start that is no power of two under the cap still probes the cap (the ladder's 384 under 512).
    tried.clear()
    assert find_max_batch(big, limit=4800, start=384)[1] == 4800 and tried[-1] == 4800
    tried.clear()
    assert 384 <= find_max_batch(probe := lambda b: (tried.append(b), CellResult("ok" if b <= 450 else "oom"))[1],
                                 limit=512, start=384)[1] <= 450 and tried[:2] == [384, 512]


@pytest.mark.slow
def test_max_batch_end_to_end(faults, db, quick, monkeypatch):
    monkeypatch.setenv("FAKE_MAX_BATCH", "5")
    api.run(RunSpec(models=["bert-tiny"], backends=["fake-oom"], batches=[1], seqs=[8], max_batch=True,
                    max_batch_limit=64, **quick), db)
    recs = api.records(db)
    mb = [r for r in recs if r["scenario"] == "max-batch"]
    assert len(mb) == 1 and mb[0]["batch_size"] == 5 and mb[0]["throughput_per_s"] > 0


def _count(db):
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        con.close()


@pytest.mark.slow
def test_sweep_killed_with_sigkill_then_resumed_has_every_cell_once(db):
    args = [sys.executable, "-m", "transbench", "run", "--model", "bert-tiny", "--backend", "eager,sdpa",
            "--batch", "1,2,3,4", "--seq", "8,16", "--device", "cpu", "--min-time", "0.2", "--warmup", "1",
            "--db", db, "--name", "killed"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while _count(db) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the parent and its worker, mid-sweep
    proc.wait()
    stored = _count(db)
    assert 3 <= stored < 16
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    con = sqlite3.connect(db)
    keys = [k for (k,) in con.execute("SELECT key FROM cells")]
    assert len(keys) == len(set(keys)) == 16
    assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1


def test_shards_are_disjoint_and_cover_the_grid():
    spec = grid.validate(RunSpec(models=["bert-tiny", "gpt2-tiny"], backends=["eager", "sdpa"], batches=[1, 2, 4],
                                 seqs=[8, 16], device="cpu"))
    full = {c.key() for c in grid.expand(spec)}
    parts = [{c.key() for c in grid.expand(RunSpec.from_dict({**spec.to_dict(), "shard": f"{i}/3"}))} for i in (1, 2, 3)]
    assert all(parts)
    assert sum(len(p) for p in parts) == len(full) and set().union(*parts) == full
    again = {c.key() for c in grid.expand(RunSpec.from_dict({**spec.to_dict(), "shard": "2/3"}))}
    assert again == parts[1]  # deterministic


@pytest.mark.slow
def test_shards_merge_into_one_run(tmp_path, quick):
    dbs = []
    for i in (1, 2):
        path = str(tmp_path / f"s{i}.db")
        api.run(RunSpec(models=["bert-tiny"], backends=["sdpa"], batches=[1, 2], seqs=[8, 16], shard=f"{i}/2",
                        name="sharded", **quick), path)
        dbs.append(path)
    target = str(tmp_path / "all.db")
    assert api.merge(target, dbs + dbs) == Merged(1, 4, [])  # each source twice: the same cells, no word
    recs = api.records(target, ["sharded"])
    assert sorted((r["batch_size"], r["seq_len"]) for r in recs) == [(1, 8), (1, 16), (2, 8), (2, 16)]


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_spec_file_round_trip_and_stored_spec_reproduces_the_grid(tmp_path, suffix, quick, db):
    spec = RunSpec(models=["bert-tiny"], backends=["eager", "sdpa"], dtypes=["fp32"], batches=[1, 2], seqs=[8],
                   seq_stdev=2.0, activation="gelu-tanh", embeddings=False, **quick)
    path = str(tmp_path / f"s{suffix}")
    dump_file(spec, path)
    assert RunSpec.from_dict(load_file(path)) == spec
    out = api.run(RunSpec.from_dict(load_file(path)), db)
    stored = api.runs(db)[0]["spec"]
    again = tmp_path / f"again{suffix}"
    dump_file(RunSpec.from_dict(stored), str(again))
    a = grid.expand(grid.validate(RunSpec.from_dict(load_file(str(again)))))
    assert [(json.loads(c.key())["backend"], json.loads(c.key())["batch"]) for c in a] == \
        [(r["backend"], r["batch_size"]) for r in out.records]
    assert all(r["seq_stdev"] == 2.0 and r["embeddings"] is False for r in out.records)  # identity is exported


def test_spec_file_rejects_unknown_keys(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("modles: [bert-tiny]\n")
    with pytest.raises(ValueError, match="unknown spec key"):
        RunSpec.from_dict(load_file(str(p)))


@pytest.mark.slow
def test_variable_lengths_count_real_tokens(db, quick):
    out = api.run(RunSpec(models=["bert-tiny"], backends=["sdpa"], batches=[8], seqs=[32], seq_stdev=8.0, **quick), db)
    rec = out.records[0]
    assert rec["status"] == "ok"
    real = rec["tokens_per_s"] * rec["latency_ms"] / 1e3
    assert real < 8 * 40 and real == pytest.approx(round(real))  # a whole number of real tokens, not 8 x padded width
    from transbench.store import Store

    s = Store(db)
    info = s.cells(s.find_run("last")["run_id"])[0]["info"]
    assert info["real_tokens"] == pytest.approx(real)
    assert info["real_tokens"] != 8 * 32


@pytest.mark.slow
@pytest.mark.parametrize("embeddings", [True, False])
def test_variable_lengths_when_the_reference_rows_are_shorter_than_the_batch(db, quick, embeddings):
    # Seeded so the longest sequence is not among the reference rows: outputs must still line up.
    from transbench.scenarios.inference.measure import reference_rows
    from transbench.scenarios.inputs import make_inputs, point_seed

    lens = make_inputs(1000, 8, 40, stdev=20.0, max_len=128, seed=point_seed("bert-tiny", 8, 40, 20.0, 0)).lengths
    assert max(lens[i] for i in reference_rows(8)) < max(lens)
    out = api.run(RunSpec(models=["bert-tiny"], backends=["sdpa", "fused"], batches=[8], seqs=[40], seq_stdev=20.0,
                          embeddings=embeddings, **quick), db)
    assert [r["status"] for r in out.records] == ["ok", "ok"] and all(r["rel_err"] < 1e-4 for r in out.records)


@pytest.mark.slow
def test_gpu_lanes_run_every_cell_once(db, quick):
    # The lanes themselves, on CPU workers: `--gpus` is refused by validate() on a machine without those GPUs.
    from transbench.runner.sweep import SweepOptions, run_grid
    from transbench.store import Store, export

    spec = grid.validate(RunSpec(models=["bert-tiny"], backends=["eager", "sdpa"], batches=[1, 2], seqs=[8], **quick))
    s = Store(db)
    run_id, _ = s.create_run("lanes", "inference", spec.to_dict(), {})
    from transbench.api import inference_target

    run_grid(s, run_id, grid.expand(spec), inference_target(spec), SweepOptions(spec.timeout, gpus=[0, 1]))
    recs = export.records(s, [run_id])
    assert sorted((r["backend"], r["batch_size"]) for r in recs) == [("eager", 1), ("eager", 2), ("sdpa", 1), ("sdpa", 2)]
    assert all(r["status"] == "ok" for r in recs)
    assert {c["info"]["lane_gpu"] for c in s.cells(run_id)} <= {0, 1}


def test_interference_warnings(monkeypatch):
    from transbench.measure import device
    from transbench.runner import worker

    monkeypatch.setattr(device, "nvml_other_processes", lambda i: [4242])
    w = worker._interference()
    assert any("4242" in x for x in w)  # throttling is read during the timed region: tests/test_isolation.py


# --- a sweep stopped mid-run: Ctrl-C or SIGTERM, a full disk, no temporary folder, a cell killed by the OS ------------

def _children(pid: int) -> list[int]:
    """Every live descendant of `pid` (Linux /proc)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out += kids.get(p, [])
        todo += kids.get(p, [])
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _stored_count(db: Path) -> int:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return con.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def _as_from_a_terminal() -> None:
    """The command's Ctrl-C and hang-up as a terminal gives them: a suite run under `nohup` or as a background job of
    a script has SIGHUP or SIGINT ignored, a child inherits that, and the command rightly keeps an ignored signal
    (cli/app.py), so the signal tests failed there."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


class _Sweep:
    """A `transbench` command in its own process, its output in files (a process left behind holding a pipe would
    block a reader), its temporary files in a folder of its own."""

    def __init__(self, tmp_path: Path, args: list[str], **env):
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir(exist_ok=True)
        self.out, self.err = tmp_path / "stdout", tmp_path / "stderr"
        self.env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'tests'}", "TMPDIR": str(self.tmp),
                    "TRANSBENCH_EXTRA_BACKENDS": "fault_backends", **env}
        self.args = [sys.executable, "-m", "transbench", *args]
        self.seen: list[int] = []

    def start(self):
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         preexec_fn=_as_from_a_terminal)
        return self

    def wait_for(self, ready, limit: float = 120.0) -> None:
        deadline = time.monotonic() + limit
        while not ready() and self.proc.poll() is None and time.monotonic() < deadline:
            self.seen = sorted(set(self.seen) | set(_children(self.proc.pid)))
            time.sleep(0.05)
        assert self.proc.poll() is None, self.err.read_text()
        self.seen = sorted(set(self.seen) | set(_children(self.proc.pid)))

    def stop_with(self, sig: int, limit: float = 20.0) -> float:
        """Send `sig` to the command's process alone (`kill PID`, a batch scheduler); seconds until it ended."""
        start = time.monotonic()
        os.kill(self.proc.pid, sig)
        try:
            self.proc.wait(limit)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the command did not end within {limit} s of signal {sig}")
        return time.monotonic() - start

    def cleanup(self) -> None:
        for pid in self.seen:  # only processes this test started
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def sweeps():
    started: list[_Sweep] = []

    def make(tmp_path, args, **env):
        s = _Sweep(tmp_path, args, **env)
        started.append(s)
        return s

    yield make
    for s in started:
        s.cleanup()


def _one_line(text: str, start: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), text
    assert "Traceback" not in text
    return lines[0]


# --- a signal to the sweep mid-cell -------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("sig, code, word, resume", [(signal.SIGTERM, 143, "stopped", True),
                                                     (signal.SIGINT, 130, "interrupted", False),
                                                     (signal.SIGHUP, 129, "stopped by SIGHUP", False)])
def test_a_signal_to_the_sweep_mid_cell_ends_it_at_once_with_one_line_and_it_resumes(tmp_path, sweeps, sig, code,
                                                                                      word, resume):
    """`kill PID` (SIGTERM, what a batch scheduler or `timeout` sends) ended the sweep with no word, exit -15, and left
    its worker running the cell (here a hung one, for an hour) and its log file in the temporary folder; a SIGINT to
    the sweep alone waited 10 s for the cell before killing its worker. SIGHUP (the terminal or ssh session closed)
    ended it as SIGTERM did, exit -1."""
    db = tmp_path / "t.db"
    args = ["run", "--model", "bert-tiny", "--backend", "sdpa,fail-hangs", "--batch", "1", "--seq", "8", "--device",
            "cpu", "--min-time", "0.05", "--warmup", "1", "--timeout", "60", "--db", str(db), "--name", "a"]
    s = sweeps(tmp_path, args).start()
    s.wait_for(lambda: _stored_count(db) >= 1)  # sdpa is stored; fail-hangs is next, in the same worker
    time.sleep(1.5)
    workers = [p for p in s.seen if _alive(p)]
    assert workers
    took = s.stop_with(sig)
    assert s.proc.returncode == code, s.err.read_text()
    line = _one_line(s.err.read_text(), word)
    assert "--name" in line
    assert took < 8, f"{took:.1f} s after the signal"
    time.sleep(0.5)
    assert not [p for p in workers if _alive(p)], "a worker outlived the sweep"
    assert not list(s.tmp.glob("transbench-worker-*")), "a worker's log file was left behind"
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert con.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 1
    con.close()
    if not resume:  # the same path as SIGTERM's from here: one resume is enough
        return
    # The same command resumes it (--timeout may change on a resume: the hung cell now ends as `timeout` in 3 s).
    resumed = [*s.args[:s.args.index("--timeout")], "--timeout", "3", *s.args[s.args.index("--timeout") + 2:]]
    done = subprocess.run(resumed, env=s.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "resuming: 1 of 2 cells already stored" in done.stdout
    con = sqlite3.connect(db)
    rows = dict(con.execute("SELECT json_extract(record, '$.backend'), status FROM cells"))
    con.close()
    assert rows == {"sdpa": "ok", "fail-hangs": "timeout"}


@pytest.mark.slow
def test_a_sweep_killed_by_sigkill_takes_its_worker_with_it(tmp_path, sweeps):
    """`kill -9` (or the OOM killer) runs no cleanup: the worker of a hung cell was left running for ever, its parent
    gone, holding its device and memory."""
    db = tmp_path / "t.db"
    args = ["run", "--model", "bert-tiny", "--backend", "sdpa,fail-hangs", "--batch", "1", "--seq", "8", "--device",
            "cpu", "--min-time", "0.05", "--warmup", "1", "--timeout", "600", "--db", str(db), "--name", "a"]
    s = sweeps(tmp_path, args).start()
    s.wait_for(lambda: _stored_count(db) >= 1)  # fail-hangs is next, in the same worker
    time.sleep(1.5)
    workers = [p for p in s.seen if _alive(p)]
    assert workers
    s.stop_with(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while [p for p in workers if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in workers if _alive(p)], "a worker outlived the sweep killed by SIGKILL"


@pytest.mark.slow
def test_sigterm_mid_training_cell_stops_its_process_tree_and_removes_its_folder(tmp_path, sweeps):
    """A launched cell (train: its own process, or torchrun's ranks) was left to its parent-death signal and its
    temporary folder (cell.json, the ranks' logs) stayed behind."""
    db = tmp_path / "t.db"
    args = ["train", "--model", "bert-tiny", "--task", "mlm", "--seq", "8", "--batch", "1", "--steps", "1000000",
            "--device", "cpu", "--db", str(db), "--name", "t"]  # steps for hours: busy when the signal comes
    s = sweeps(tmp_path, args).start()
    s.wait_for(lambda: any((d / "rank0.log").exists() for d in s.tmp.glob("transbench-launch-*")))
    time.sleep(0.5)
    s.stop_with(signal.SIGTERM)
    assert s.proc.returncode == 143, s.err.read_text()
    _one_line(s.err.read_text(), "stopped")
    time.sleep(0.5)
    assert not [p for p in s.seen if _alive(p)], "a rank outlived the sweep"
    assert not list(s.tmp.glob("transbench-launch-*")), "the cell's folder was left behind"


# --- outputs written whole or not at all ------------------------------------------------------------------------

class _FillingFile:
    """A text file on a disk that fills after `room` characters: the write fails part-way (or Ctrl-C lands there)."""

    def __init__(self, f, room: int, exc: BaseException):
        self.f, self.room, self.exc = f, room, exc

    def write(self, text):
        if len(text) > self.room:
            self.f.write(text[:self.room])
            self.f.flush()
            raise self.exc
        self.room -= len(text)
        return self.f.write(text)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def _fill_up(monkeypatch, folder: Path, exc: BaseException, room: int = 10, binary: bool = False) -> None:
    """Every text file (and binary one, where `binary`) opened for writing in `folder` from here on fills after `room`
    characters."""
    real = io.open

    def opener(file, mode="r", *args, **kwargs):
        f = real(file, mode, *args, **kwargs)
        inside = isinstance(file, (str, os.PathLike)) and Path(os.path.abspath(file)).parent == folder
        kind = binary or "b" not in mode
        return _FillingFile(f, room, exc) if inside and kind and set(mode) & set("wxa") else f

    monkeypatch.setattr(builtins, "open", opener)
    monkeypatch.setattr(io, "open", opener)


def _disk_full():
    return OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("exc", [_disk_full, KeyboardInterrupt])
@pytest.mark.parametrize("option", ["json_path", "csv_path"])
def test_an_export_that_fails_part_way_leaves_the_previous_file_as_it_was(tmp_path, monkeypatch, exc, option):
    """`--json out.json` was opened for writing in place: a disk that filled, or a Ctrl-C, part-way through left a
    truncated file where the good one of the last run had been."""
    path = tmp_path / "out.file"
    # the last run's export (an export of ours: one of the user's would be refused, store/export.py ours)
    export.write([{"run_name": "old", "backend": "eager", "status": "ok"}], **{option: str(path)})
    good = path.read_text()
    before = sorted(p.name for p in tmp_path.iterdir())
    recs = [{"run_name": "a", "backend": "sdpa", "status": "ok", "latency_ms": 1.0}] * 20
    _fill_up(monkeypatch, tmp_path, exc())
    with pytest.raises(SpecError if exc is _disk_full else KeyboardInterrupt) as info:
        export.write(recs, **{option: str(path)})
    monkeypatch.undo()
    if exc is _disk_full:
        assert "No space left on device" in str(info.value) and "rerun the same command" in str(info.value)
    assert path.read_text() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary file left


def test_an_export_replaces_the_file_whole_and_keeps_its_permissions_and_links(tmp_path):
    recs = [{"run_name": "a", "backend": "sdpa", "status": "ok"}]
    target = tmp_path / "real.json"
    target.write_text("[]\n")  # an older export of no records: ours, so replaced (store/export.py ours)
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target.name)
    export.write(recs, json_path=str(link))
    assert link.is_symlink() and json.loads(target.read_text())["cells"][0]["backend"] == "sdpa"
    assert (target.stat().st_mode & 0o777) == 0o640
    fresh = tmp_path / "new.csv"
    export.write(recs, csv_path=str(fresh))
    umask = os.umask(0)
    os.umask(umask)
    assert (fresh.stat().st_mode & 0o777) == 0o666 & ~umask  # as `open(path, "w")` made it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "new.csv", "real.json"]


@pytest.mark.slow
@pytest.mark.parametrize("exc", [_disk_full, KeyboardInterrupt])
def test_a_report_that_fails_part_way_leaves_the_previous_report_as_it_was(tmp_path, monkeypatch, exc):
    from report_helpers import cell, make_run, ok_result

    db = str(tmp_path / "t.db")
    make_run(db, "a", [(cell("eager", b), ok_result([1.0, 1.1, 1.2], b)) for b in (1, 2)])
    out = tmp_path / "report"
    api.report(db, ["a"], str(out))
    good = {p.name: p.read_bytes() for p in out.iterdir()}
    assert any(name.endswith(".png") for name in good)
    # The PNG plots too: matplotlib wrote each in place, so the report's first plot was left truncated.
    _fill_up(monkeypatch, out, exc(), room=100, binary=True)
    with pytest.raises(SpecError if exc is _disk_full else KeyboardInterrupt):
        api.report(db, ["a"], str(out))
    monkeypatch.undo()
    now = {p.name: p.read_bytes() for p in out.iterdir()}
    assert now == good


@pytest.mark.parametrize("exc", [_disk_full, KeyboardInterrupt])
def test_runs_spec_out_that_fails_part_way_leaves_the_previous_file_as_it_was(tmp_path, monkeypatch, exc):
    """`transbench runs --spec a --out a.yaml` wrote the file in place: a full disk left half a spec."""
    from report_helpers import cell, make_run, ok_result

    from transbench.cli.app import app
    from typer.testing import CliRunner

    db = str(tmp_path / "t.db")
    make_run(db, "a", [(cell("eager", 1), ok_result([1.0, 1.1, 1.2], 1))])
    out = tmp_path / "specs" / "a.yaml"
    out.parent.mkdir()
    previous = f"{export.SPEC_MARK}: run 'a' (inference)\nmodels: [older]\n"  # ours: replaced (export.ours)
    out.write_text(previous)
    _fill_up(monkeypatch, out.parent, exc(), room=10)
    result = CliRunner().invoke(app, ["runs", "--db", db, "--spec", "a", "--out", str(out)])
    monkeypatch.undo()
    assert result.exit_code == (2 if exc is _disk_full else 130), result.output
    assert out.read_text() == previous
    assert [p.name for p in out.parent.iterdir()] == ["a.yaml"]
    ok = CliRunner().invoke(app, ["runs", "--db", db, "--spec", "a", "--out", str(out)])
    assert ok.exit_code == 0 and "backends:" in out.read_text()


# --- temporary files the sweep needs ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["run", "train"])
def test_a_temporary_folder_that_takes_no_file_is_one_line_and_the_store_is_whole(tmp_path, monkeypatch, kind):
    """A full /tmp (another file system than the store's) was an OSError traceback from the worker's log file
    (run, serve, micro) or the launched cell's folder (train)."""

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", full)
    monkeypatch.setattr(tempfile, "mkdtemp", full)
    db = str(tmp_path / "t.db")
    with pytest.raises(SpecError) as info:
        if kind == "run":
            api.run(RunSpec(models=["bert-tiny"], backends=["sdpa"], batches=[1], seqs=[8], device="cpu",
                            name="a"), db)
        else:
            api.train(api.TrainSpec(models=["bert-tiny"], tasks=["mlm"], batches=[1], seqs=[8], steps=2,
                                    device="cpu", name="a"), db)
    message = str(info.value)
    assert "\n" not in message and "No space left on device" in message and "TMPDIR" in message, message
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert con.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 0  # nothing stored for the cell it could not run
    con.close()


# --- a cell's process killed by the OS -----------------------------------------------------------------------------

def test_a_launched_cell_killed_by_a_signal_says_so():
    """A training cell whose process the OS killed (the OOM killer's SIGKILL) read 'exited with code -9 and no
    result: ' (a colon before nothing); a run's worker says 'killed by signal 9'."""
    launched = launch.Launched({}, -9, False, {"launcher.log": "", "rank0.log": ""}, 1.0)
    result = launch.outcome(launched, launch.LaunchConfig())
    assert result.status == "error"
    assert "killed by signal 9" in result.error and not result.error.rstrip().endswith(":"), result.error
    launched = launch.Launched({}, 1, False, {"rank0.log": "RuntimeError: boom\n"}, 1.0)
    error = launch.outcome(launched, launch.LaunchConfig()).error
    assert error == "exited with code 1 and no result: RuntimeError: boom"


# --- an interrupted sweep on several lanes (--gpus) ---------------------------------------------------------------

@pytest.mark.slow
def test_an_interrupted_sweep_on_several_lanes_stores_no_cell_it_did_not_finish(tmp_path, extra_backends):
    """With --gpus each lane runs in its own thread, and Ctrl-C (or SIGTERM) reaches the main thread only: run_grid
    raised while the lanes went on, the hung lane's worker was left running (orphaned once the process ended), and the
    lane stored its interrupted cell as `error: worker process killed by signal 15` as the interpreter shut the
    worker down; a resume then skipped that cell as finished."""
    import threading

    from transbench.api import inference_target
    from transbench.scenarios.inference import cells as grid
    from transbench.runner.sweep import SweepOptions, run_grid
    from transbench.store import Store

    extra_backends("fault_backends")
    spec = grid.validate(RunSpec(models=["bert-tiny"], backends=["fail-hangs", "sdpa"], batches=[1], seqs=[8],
                                 device="cpu", min_time=0.01, min_count=3, warmup=1, timeout=120))
    store = Store(str(tmp_path / "t.db"))
    run_id, _ = store.create_run("lanes", "inference", spec.to_dict(), {})
    main = threading.main_thread().ident

    def on_cell(cell, result):  # sdpa is stored: the other lane hangs in fail-hangs; Ctrl-C a second later
        threading.Timer(1.0, signal.pthread_kill, (main, signal.SIGINT)).start()

    # Ctrl-C as Python sets it up from a terminal: a suite run under a background job of a script has it ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_grid(store, run_id, grid.expand(spec), inference_target(spec), SweepOptions(120, gpus=[0, 1]), on_cell)
    finally:
        signal.signal(signal.SIGINT, previous)
    # Not Thread.is_alive: on CPython 3.11 an interrupted join marks the thread it waited for as ended (bpo-45274).
    lanes = [t for t in threading.enumerate() if "guarded_lane" in t.name]
    workers = [p for p in __import__("multiprocessing").active_children() if p.is_alive()]
    try:
        assert not workers, "a lane's worker outlived the sweep"
        time.sleep(1.0)
        assert {c["record"]["backend"]: c["status"] for c in store.cells(run_id)} == {"sdpa": "ok"}
    finally:
        for p in workers:
            p.kill()
        for t in lanes:
            t.join(15)
        store.close()


def test_an_export_to_standard_output_on_a_pipe_is_written_in_place(tmp_path):
    """/dev/stdout on a pipe is no file to replace (its real path, '/proc/PID/fd/pipe:[N]', does not exist)."""
    code = ("import sys; from transbench.store import export; "
            "export.write([{'run_name': 'a', 'backend': 'sdpa', 'status': 'ok'}], json_path='/dev/stdout')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cells"][0]["backend"] == "sdpa"
    assert list(tmp_path.iterdir()) == []


# --- the max-batch search at and past its cap, and a search stopped by something other than an OOM --------------------

# --- the max-batch search ------------------------------------------------------------------------------

def test_a_search_that_starts_above_its_cap_answers_at_the_cap():
    """A ladder's --batch 64 under --max-batch-limit 32 started the search above its cap: UnboundLocalError."""
    tried = []

    def probe(b):
        tried.append(b)
        return CellResult("ok", record={"throughput_per_s": float(b)})

    result, best = find_max_batch(probe, limit=32, start=64, known=CellResult("ok"))
    assert best == 32 and tried == [32] and result.record["throughput_per_s"] == 32.0


def test_run_refuses_a_batch_above_the_max_batch_cap(tmp_path, quick):
    db = tmp_path / "t.db"
    spec = RunSpec(models=["bert-tiny"], backends=["eager"], batches=[4], seqs=[8], max_batch=True,
                   max_batch_limit=2, **quick)
    with pytest.raises(SpecError, match="--batch 4 is above max_batch_limit 2"):
        api.run(spec, str(db))
    assert not db.exists()  # refused before the store was made, not a traceback after the first cell


class _Lane:
    """Batches up to 4 run; 8 times out (a worker killed at its deadline, not out of memory)."""

    def __init__(self):
        self.tried = []

    def run(self, cell, timeout):
        self.tried.append(cell.batch)
        if cell.batch <= 4:
            return CellResult("ok", record={"throughput_per_s": float(cell.batch), "latency_ms": 1.0})
        return CellResult("timeout", error="no result within the 1 s deadline")


def test_a_search_stopped_by_a_timeout_says_its_answer_may_be_low(tmp_path):
    store = Store(str(tmp_path / "t.db"))
    try:
        run_id, _, _ = open_run(store, "inference", {"grid": 1}, "mb", lambda: {})
        first = Cell(model="bert-tiny", task="base", backend="eager", dtype="fp32", batch=1, seq=8)
        lane = _Lane()
        search_max_batch(store, run_id, first, lane, SweepOptions(max_batch=True, max_batch_limit=64), 1, set(),
                         threading.Lock(), lambda c, r: None)
        cell = next(c for c in store.cells(run_id) if c["key"] == max_batch_key(first))
    finally:
        store.close()
    assert lane.tried == [1, 2, 4, 8]
    assert cell["status"] == "ok" and cell["record"]["batch_size"] == 4
    assert cell["info"]["stopped_at"] == 8 and any("stopped at batch 8" in w and "timeout" in w
                                                   for w in cell["warnings"]), cell["warnings"]


@pytest.mark.slow
def test_a_deadline_past_what_the_os_can_wait_is_no_deadline(tmp_path):
    """`run --timeout 1e10` (or 1e7) stored its run, then ended in an OverflowError traceback waiting for the cell."""
    import torch

    from transbench.runner.worker import Worker
    from transbench.scenarios.micro import run as micro_run

    opts = micro.BandwidthOptions(sizes=[16], ops=["copy"], device="cpu", min_time=0.01).resolved(torch.device("cpu"))
    [cell] = micro_run.cells("bandwidth", opts, "cpu", str(tmp_path / "t.db"))
    worker = Worker()
    try:
        result = worker.run("transbench.scenarios.micro.run:measure", cell.to_dict(), 1e10)
    finally:
        worker.stop()
    assert result.status == "ok" and result.record["gbps"] > 0
