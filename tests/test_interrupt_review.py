"""What a user's results go through when a sweep is stopped mid-run: Ctrl-C or SIGTERM to the sweep, a full disk
while an output is written, a temporary folder that takes no file, a cell's process killed by the OS. Each ends in
one line, leaves no process or temporary file behind, never leaves a half-written output in place of a good one, and
the run resumes."""

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
import time
from pathlib import Path

import pytest

from transbench import api
from transbench.errors import SpecError
from transbench.runner import launch
from transbench.scenarios.inference.spec import RunSpec
from transbench.store import export

ROOT = Path(__file__).resolve().parents[1]


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


def _count(db: Path) -> int:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return con.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


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
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
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
    s.wait_for(lambda: _count(db) >= 1)  # sdpa is stored; fail-hangs is next, in the same worker
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


def test_sigterm_mid_training_cell_stops_its_process_tree_and_removes_its_folder(tmp_path, sweeps):
    """A launched cell (train: its own process, or torchrun's ranks) was left to its parent-death signal and its
    temporary folder (cell.json, the ranks' logs) stayed behind."""
    db = tmp_path / "t.db"
    args = ["train", "--model", "bert-tiny", "--task", "mlm", "--seq", "8", "--batch", "1", "--steps", "2",
            "--device", "cpu", "--db", str(db), "--name", "t"]
    s = sweeps(tmp_path, args, TRANSBENCH_TEST_HANG_RANK="0").start()
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
    path.write_text("the previous good export\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    recs = [{"run_name": "a", "backend": "sdpa", "status": "ok", "latency_ms": 1.0}] * 20
    _fill_up(monkeypatch, tmp_path, exc())
    with pytest.raises(SpecError if exc is _disk_full else KeyboardInterrupt) as info:
        export.write(recs, **{option: str(path)})
    monkeypatch.undo()
    if exc is _disk_full:
        assert "No space left on device" in str(info.value) and "rerun the same command" in str(info.value)
    assert path.read_text() == "the previous good export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary file left


def test_an_export_replaces_the_file_whole_and_keeps_its_permissions_and_links(tmp_path):
    recs = [{"run_name": "a", "backend": "sdpa", "status": "ok"}]
    target = tmp_path / "real.json"
    target.write_text("old")
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
    out.write_text("the previous spec\n")
    _fill_up(monkeypatch, out.parent, exc(), room=10)
    result = CliRunner().invoke(app, ["runs", "--db", db, "--spec", "a", "--out", str(out)])
    monkeypatch.undo()
    assert result.exit_code == (2 if exc is _disk_full else 130), result.output
    assert out.read_text() == "the previous spec\n"
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

    with pytest.raises(KeyboardInterrupt):
        run_grid(store, run_id, grid.expand(spec), inference_target(spec), SweepOptions(120, gpus=[0, 1]), on_cell)
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
