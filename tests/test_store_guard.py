"""Bad stores and failing disks: one line, exit 2, no traceback, and every file left as it was."""

import errno
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from process_helpers import first_line
from test_cli_input import refused
from typer.testing import CliRunner

from transbench.cli import app
from transbench.errors import SpecError
from transbench.store import Store, StoreFull
from transbench.store import db as store_db

runner = CliRunner()
QUICK = ["--device", "cpu", "--min-time", "0.01", "--warmup", "1", "--backend", "sdpa", "--seq", "8"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(res, *needles):
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict:
    """Every file of the folder: its bytes and modification time."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file()}


def _store_with_cells(path, n=2, name="r"):
    s = Store(path)
    run_id, _ = s.create_run(name, "inference", {"models": ["m"]}, {"gpus": []})
    for i in range(n):
        s.put_cell(run_id, f"k{i}", "inference", "ok", {"latency_ms": 1.0 + i}, cell={"i": i}, samples=[1.0])
    s.close()
    return run_id


# --- files that are not stores of ours ----------------------------------------------------------------

def _random_bytes(p):
    p.write_bytes(os.urandom(8192))


def _foreign(p):
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE notes (id INTEGER, body TEXT)")
    con.execute("INSERT INTO notes VALUES (1, 'keep me')")
    con.commit()
    con.close()


def _foreign_wal(p):
    con = sqlite3.connect(p)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE events (t REAL)")
    con.commit()
    con.close()


def _foreign_marked(p):  # another application's own application_id, and tables named like ours
    con = sqlite3.connect(p)
    con.execute("PRAGMA application_id=1234")
    con.executescript(store_db.SCHEMA)
    con.commit()
    con.close()


def _foreign_same_table_names(p):  # runs and cells tables, but not ours
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, label TEXT)")
    con.execute("CREATE TABLE cells (id INTEGER, value REAL)")
    con.commit()
    con.close()


def _sqlite_header_only(p):  # the magic string, then nothing a database needs
    p.write_bytes(b"SQLite format 3\x00" + b"\x00" * 30)


def _newer_schema(p):
    _store_with_cells(p)
    con = sqlite3.connect(p)
    con.execute(f"PRAGMA user_version={store_db.SCHEMA_VERSION + 1}")
    con.commit()
    con.close()


def _newer_schema_unmarked(p):  # the version of a newer schema, without the marker: only marked files were checked
    _newer_schema(p)
    con = sqlite3.connect(p)
    con.execute("PRAGMA application_id=0")
    con.commit()
    con.close()


def _foreign_views(p):  # views alone, no table: read as an empty file, safe to start a store in
    con = sqlite3.connect(p)
    con.execute("CREATE VIEW runs AS SELECT 1 AS x")
    con.execute("CREATE VIEW notes AS SELECT 'keep me' AS body")
    con.commit()
    con.close()


def _marked_views(p):  # our marker over a view named as our table: a writer failed on CREATE TABLE, a traceback
    con = sqlite3.connect(p)
    con.execute(f"PRAGMA application_id={store_db.APP_ID}")
    con.execute("CREATE VIEW runs AS SELECT 1 AS x")
    con.commit()
    con.close()


BAD = {"random bytes": (_random_bytes, "not a SQLite database"),
       "foreign sqlite": (_foreign, "another application"),
       "foreign sqlite in WAL mode": (_foreign_wal, "another application"),
       "foreign application_id": (_foreign_marked, "another application"),
       "foreign runs/cells tables": (_foreign_same_table_names, "another application"),
       "truncated header": (_sqlite_header_only, "not a SQLite database"),
       "newer schema": (_newer_schema, "upgrade transbench"),
       "newer schema, unmarked": (_newer_schema_unmarked, "upgrade transbench"),
       "foreign sqlite of views alone": (_foreign_views, "another application"),
       "marked file of a view": (_marked_views, "damaged")}

COMMANDS = {"runs": lambda bad, tmp: ["runs", "--db", bad],
            "runs --spec": lambda bad, tmp: ["runs", "--db", bad, "--spec", "last"],
            "report": lambda bad, tmp: ["report", "--db", bad, "--out", tmp / "out"],
            "compare": lambda bad, tmp: ["compare", "a", "b", "--db", bad],
            "env --db": lambda bad, tmp: ["env", "--db", bad],
            "merge source": lambda bad, tmp: ["merge", bad, "--into", tmp / "target.db"],
            "merge target": lambda bad, tmp: ["merge", tmp / "good.db", "--into", bad]}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("bad", BAD)
def test_a_file_that_is_not_our_store_is_refused_and_left_as_it_was(tmp_path, bad, command):
    make, needle = BAD[bad]
    path = tmp_path / "bad.db"
    make(path)
    if command == "merge target":
        _store_with_cells(tmp_path / "good.db")
    before = snapshot(tmp_path)
    one_line_error(invoke(*COMMANDS[command](path, tmp_path)), needle, str(path))
    assert snapshot(tmp_path) == before  # no byte changed, no -wal/-shm file, no target created
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad", BAD)
def test_a_writer_refuses_a_file_that_is_not_our_store(tmp_path, bad):
    make, needle = BAD[bad]
    path = tmp_path / "bad.db"
    make(path)
    before = snapshot(tmp_path)
    with pytest.raises(SpecError, match=needle):
        Store(path)
    assert snapshot(tmp_path) == before


def test_a_store_damaged_past_its_header_gives_one_line(tmp_path):
    path = tmp_path / "t.db"
    _store_with_cells(path, n=40)
    data = bytearray(path.read_bytes())
    assert len(data) > 3 * 4096
    data[4096:len(data)] = os.urandom(len(data) - 4096)  # every page after the first: the header still says ours
    path.write_bytes(bytes(data))
    before = snapshot(tmp_path)
    one_line_error(invoke("runs", "--db", path), "damaged")
    assert snapshot(tmp_path) == before


# --- paths with no store ---------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["runs"], ["runs", "--spec", "last"], ["report", "--out", "{tmp}/out"],
                                  ["compare", "a", "b"], ["env"], ["merge", "{tmp}/none.db", "--into"]])
def test_readers_on_a_missing_store_say_so_and_create_nothing(tmp_path, args):
    missing = tmp_path / "missing.db"
    res = invoke(*[a.format(tmp=tmp_path) for a in args], *([] if args[0] == "merge" else ["--db"]), missing)
    one_line_error(res, "no store at")
    assert list(tmp_path.iterdir()) == []


def test_env_without_db_and_no_store_shows_the_datasheet_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("env")
    assert res.exit_code == 0, res.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [b"", b"not a store\n", b"SQLite format 3\x00" + b"\x00" * 200])
def test_env_without_db_describes_the_machine_beside_a_stray_file_it_cannot_read(tmp_path, monkeypatch, content):
    """env only looks in ./transbench.db for measured ceilings: an empty file or another program's there refused the
    whole command, exit 2, where a folder of that name was skipped. Now one note names it, and --json stays JSON."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "transbench.db").write_bytes(content)
    res = invoke("env", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["gpus"] or json.loads(res.stdout)["cpu_measured"] == {}
    notes = res.stderr.splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: measured ceilings left out: transbench.db"), res.stderr
    assert (tmp_path / "transbench.db").read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["transbench.db"]
    one_line_error(invoke("env", "--db", "transbench.db"), "transbench.db")  # a --db given must be a store


def test_an_empty_file_is_no_store_to_read_but_a_writer_may_start_one(tmp_path):
    path = tmp_path / "empty.db"
    path.touch()
    one_line_error(invoke("runs", "--db", path), "empty")
    assert path.read_bytes() == b""
    _store_with_cells(path)
    assert invoke("runs", "--db", path).exit_code == 0


# --- folders a writer cannot use -------------------------------------------------------------------

def test_a_missing_folder_is_named(tmp_path):
    target = tmp_path / "no" / "such" / "t.db"
    one_line_error(invoke("merge", _good(tmp_path), "--into", target), "does not exist", "mkdir -p")
    assert not (tmp_path / "no").exists()


def test_a_run_name_lock_that_cannot_be_taken_leaves_no_new_store(tmp_path, monkeypatch):
    """The run-name lock's folder is made after the store is opened: refused there, a new store was left behind."""
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(not_a_folder))
    db = tmp_path / "new.db"
    one_line_error(invoke("micro", "bandwidth", "--device", "cpu", "--sizes", "1024", "--ops", "copy", "--db", db,
                          "--name", "x"), "cannot lock run 'x'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


BANDWIDTH = ["micro", "bandwidth", "--device", "cpu", "--sizes", "1024", "--ops", "copy"]


def test_a_new_store_at_a_link_that_is_refused_keeps_the_link(tmp_path, monkeypatch):
    """`--db` a link to no file yet: SQLite made the link's target, and the refusal then unlinked the path itself,
    removing the user's link and leaving the new store behind."""
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(not_a_folder))
    (tmp_path / "stores").mkdir()
    link = tmp_path / "link.db"
    link.symlink_to(tmp_path / "stores" / "new.db")
    one_line_error(invoke(*BANDWIDTH, "--db", link, "--name", "x"), "cannot lock run 'x'", str(not_a_folder))
    assert link.is_symlink() and os.readlink(link) == str(tmp_path / "stores" / "new.db")
    assert list((tmp_path / "stores").iterdir()) == []


def _plant_links(folder: Path, store: Path, victim: Path) -> None:
    """Another user's lock folder in a shared temporary folder: links named as the store's run-name lock and its
    note, to a file of this user's."""
    key = store_db._lock_key(str(store), "x")
    for name in (f"{key}.lock", f"{key}.who"):
        (folder / name).symlink_to(victim)


def _world_writable(root: Path, store: Path, victim: Path) -> None:
    folder = root / f"transbench-locks-{os.getuid()}"
    folder.mkdir()
    _plant_links(folder, store, victim)
    folder.chmod(0o777)


def _a_link(root: Path, store: Path, victim: Path) -> None:
    (root / f"transbench-locks-{os.getuid()}").symlink_to(victim.parent)


def _another_owner(root: Path, store: Path, victim: Path) -> None:
    folder = root / f"transbench-locks-{os.getuid()}"
    folder.mkdir(mode=0o700)
    _plant_links(folder, store, victim)
    os.chown(folder, os.getuid() + 1, -1)


@pytest.mark.parametrize("plant", [_world_writable, _a_link, pytest.param(_another_owner, marks=pytest.mark.skipif(
    os.getuid() != 0, reason="giving a folder to another user takes root"))])
def test_a_lock_folder_not_ours_alone_is_refused_and_no_link_in_it_followed(tmp_path, monkeypatch, plant):
    """The run-name locks' folder, in a shared temporary folder, was taken as found: another user who made it first
    (or a link named so) could plant links in it, and the lock's note overwrote the file they led to."""
    root, home = tmp_path / "runtime", tmp_path / "home"
    root.mkdir()
    home.mkdir()
    victim = home / "notes.txt"
    victim.write_text("mine\n")
    store = tmp_path / "s.db"
    _store_with_cells(store)
    plant(root, store, victim)
    before = snapshot(tmp_path)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(root))
    one_line_error(invoke(*BANDWIDTH, "--db", store, "--name", "x"), "cannot lock run 'x'", "XDG_RUNTIME_DIR")
    assert victim.read_text() == "mine\n" and sorted(p.name for p in home.iterdir()) == ["notes.txt"]
    assert snapshot(tmp_path) == before


def test_a_relative_runtime_folder_is_ignored(tmp_path, monkeypatch):
    """A relative $XDG_RUNTIME_DIR named another lock folder from each working directory: two writers of one store
    started in two folders missed each other's locks (the XDG spec says to ignore it)."""
    import tempfile

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "run")
    assert store_db._lock_folder_path().parent == Path(tempfile.gettempdir())


def _gone(path: Path, how: str) -> None:
    wal = Path(f"{path}-wal")
    if how == "moved":
        path.rename(path.with_name("moved.db"))
        if wal.exists():
            wal.rename(path.with_name("moved.db-wal"))
        return
    path.unlink()
    wal.unlink(missing_ok=True)
    if how == "replaced":  # another store made at the path: a new file, while the writer still holds the old one
        _store_with_cells(path, name="other")


@pytest.mark.parametrize("how", ["removed", "moved", "replaced"])
def test_a_store_removed_during_a_run_stops_it_in_one_line(tmp_path, how):
    """The connection went on writing to the file it had opened, which no path reached any more: the run printed
    `stored in S as run R`, exit 0, and every cell was lost."""
    path = tmp_path / "s.db"
    store = Store(path)
    try:
        run_id, _ = store.create_run("r", "inference", {"models": ["m"]}, {"gpus": []})
        store.put_cell(run_id, "k0", "inference", "ok", {"latency_ms": 1.0}, cell={"i": 0}, samples=[1.0])
        _gone(path, how)
        with pytest.raises(SpecError, match="removed, moved or replaced by another file while this command wrote"):
            store.put_cell(run_id, "k1", "inference", "ok", {"latency_ms": 2.0}, cell={"i": 1}, samples=[1.0])
    finally:
        store.close()
    if how == "replaced":
        other = Store(path, readonly=True)
        assert [r["name"] for r in other.runs()] == ["other"]
        other.close()


KILLED = """
import os, sys
from transbench.store import Store
s = Store(sys.argv[1])
run_id, _ = s.create_run("killed", "inference", {"models": ["m"]}, {"gpus": []})
s.put_cell(run_id, "k0", "inference", "ok", {"latency_ms": 1.0}, cell={"i": 0}, samples=[1.0])
os._exit(0)  # as kill -9 leaves it: the run and its cell in the -wal file, no checkpoint
"""


def test_a_killed_sweeps_wal_beside_a_links_target_is_read(tmp_path):
    """SQLite keeps the side files beside the file a link leads to; the readers looked for the -wal file beside the
    link, found none, and read the store as immutable: the killed sweep's run was left out of `runs`, and `merge`
    dropped it, exit 0."""
    import subprocess
    import sys

    (tmp_path / "stores").mkdir()
    real = tmp_path / "stores" / "real.db"
    _store_with_cells(real, name="done")
    link = tmp_path / "link.db"
    link.symlink_to(real)
    subprocess.run([sys.executable, "-c", KILLED, str(link)], check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
    assert Path(f"{real}-wal").stat().st_size > 0 and not Path(f"{link}-wal").exists()

    def stored():  # the store and its -wal file (-shm is SQLite's shared-memory index, which a reader maps)
        return {k: v for k, v in snapshot(tmp_path / "stores").items() if not k.endswith("-shm")}

    before = stored()
    res = invoke("runs", "--db", link)
    assert res.exit_code == 0 and "killed" in res.stdout, res.output
    target = tmp_path / "all.db"
    assert invoke("merge", link, "--into", target).exit_code == 0
    merged = Store(target, readonly=True)
    assert sorted(r["name"] for r in merged.runs()) == ["done", "killed"]
    merged.close()
    assert stored() == before


def _side_folder(p: Path) -> None:
    p.mkdir()


def _side_link(p: Path) -> None:
    victim = p.parent / "notes.txt"
    victim.write_text("mine\n")
    p.symlink_to(victim)


def _side_fifo(p: Path) -> None:
    os.mkfifo(p)


@pytest.mark.parametrize("suffix", store_db.SIDE_FILES)
@pytest.mark.parametrize("make", [_side_folder, _side_link, _side_fifo])
def test_a_side_file_that_is_not_a_file_is_said_as_such(tmp_path, suffix, make):
    """A folder, a link or a pipe named as the store's -wal, -shm or -journal failed inside SQLite, said as "store S
    is damaged ...: restore it from a copy" or "check that the file and its folder are writable"."""
    store = tmp_path / "s.db"
    _store_with_cells(store)
    make(tmp_path / f"s.db{suffix}")
    before = snapshot(tmp_path)
    source = tmp_path.parent / f"{tmp_path.name}-source.db"
    _store_with_cells(source, name="other")
    for args in (["runs", "--db", store], ["compare", "a", "b", "--db", store], ["merge", source, "--into", store],
                 [*BANDWIDTH, "--db", store]):
        line = one_line_error(invoke(*args), f"s.db{suffix} beside it, which is not a regular file")
        assert "damaged" not in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("emptied", [False, True])
def test_a_wal_file_whose_store_is_gone_is_kept_and_said(tmp_path, emptied):
    """A store moved or removed without the -wal file of its killed sweep: `run` made a new store at the path, and
    SQLite deleted that -wal file, the only copy of the sweep's newest cells."""
    import subprocess
    import sys

    moved = tmp_path / "moved"
    moved.mkdir()
    store = moved / "s.db"
    _store_with_cells(store)
    killed = (f"import os, sqlite3\nc = sqlite3.connect({str(store)!r})\nc.execute('PRAGMA wal_autocheckpoint=0')\n"
              "c.execute(\"UPDATE runs SET name = 'newest'\")\nc.commit()\nos._exit(0)")
    subprocess.run([sys.executable, "-c", killed], check=True, timeout=120)
    (moved / "s.db-wal").rename(tmp_path / "s.db-wal")  # the store moved away, its -wal file left behind
    if emptied:  # or a zero-length file in its place
        (tmp_path / "s.db").touch()
    source = tmp_path.parent / f"{tmp_path.name}-source.db"
    _store_with_cells(source, name="other")
    before = snapshot(tmp_path)
    for args in (["runs", "--db", tmp_path / "s.db"], [*BANDWIDTH, "--db", tmp_path / "s.db"],
                 ["merge", source, "--into", tmp_path / "s.db"]):
        one_line_error(invoke(*args), f"store {tmp_path / 's.db'} is an empty file" if emptied
                       else f"no store at {tmp_path / 's.db'}", "but s.db-wal beside it", "put that store back")
    assert snapshot(tmp_path) == before


# A process that holds a store exclusively, its write in the -wal file, as a sqlite3 shell with
# `PRAGMA locking_mode=EXCLUSIVE` holds it: no other process reads the store until it ends.
HOLDER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA locking_mode=EXCLUSIVE")
con.execute("UPDATE runs SET name = name")
print("held", flush=True)
time.sleep(300)
"""


def locked_refusal(res, store, wait: str = "1") -> str:
    """The refusal of a command that waited for a locked store: the wait said first, then one line of error."""
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [x for x in res.stderr.strip().splitlines() if not x.startswith("note:")]  # as refused() reads them
    assert len(lines) == 2, res.stderr
    assert lines[0] == f"store {store} is locked by another process: waiting up to {wait} s for it (Ctrl-C stops)"
    assert lines[1].startswith(f"error: store {store} is locked by another process"), lines[1]
    return lines[1]


def test_a_store_another_process_holds_is_locked_not_damaged(tmp_path, monkeypatch):
    """Said "store S is damaged (database is locked): restore it from a copy", which would have the user throw a
    whole store away for a lock that ends with its process. Readers wait for it as writers do, aloud (they waited
    sqlite3's default 5 s in silence)."""
    import subprocess
    import sys

    store = tmp_path / "s.db"
    _store_with_cells(store)
    monkeypatch.setattr(store_db, "LOCK_WAIT", 1.0)
    monkeypatch.setattr(store_db, "LOCK_NOTICE", 0.1)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(store)], stdout=subprocess.PIPE, text=True)
    try:
        assert first_line(holder) == "held"
        before = snapshot(tmp_path)
        for args in (["runs", "--db", store], ["merge", store, "--into", tmp_path / "t.db"]):
            line = locked_refusal(invoke(*args), store)
            assert "damaged" not in line
        assert snapshot(tmp_path) == before
    finally:
        holder.kill()
        holder.wait()


def _rows(path) -> list:
    con = sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro", uri=True)
    try:
        return [con.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in ("runs", "cells")]
    finally:
        con.close()


def _write_locked(path):
    """Another holder of the store's write lock, as an SQLite browser with unsaved edits holds it."""
    con = sqlite3.connect(path, check_same_thread=False)
    con.execute("BEGIN EXCLUSIVE")
    return con


def test_a_store_locked_for_the_whole_wait_is_said_at_once_then_refused(tmp_path, monkeypatch):
    """A writer waited 60 s for another process's write lock without a word (a hang), then was refused."""
    store = tmp_path / "s.db"
    _store_with_cells(store)
    monkeypatch.setattr(store_db, "LOCK_WAIT", 1.0)
    monkeypatch.setattr(store_db, "LOCK_NOTICE", 0.1)
    before = _rows(store)
    holder = _write_locked(store)
    try:
        res = invoke(*BANDWIDTH, "--db", store, "--name", "x")
    finally:
        holder.rollback()
        holder.close()
    locked_refusal(res, store)
    assert _rows(store) == before  # the refused run left no run, no cell


def test_a_store_lock_released_during_the_wait_lets_the_command_go_on(tmp_path, monkeypatch):
    import threading

    store = tmp_path / "s.db"
    _store_with_cells(store)
    monkeypatch.setattr(store_db, "LOCK_NOTICE", 0.1)
    monkeypatch.setattr(store_db, "LOCK_WAIT", 20.0)  # a release that never came fails in 20 s
    holder = _write_locked(store)
    release = threading.Timer(1.0, holder.rollback)
    release.start()
    try:
        res = invoke(*BANDWIDTH, "--db", store, "--name", "x")
    finally:
        release.join()
        holder.close()
    assert res.exit_code == 0, res.output
    assert f"store {store} is locked by another process: waiting up to 20 s" in res.stderr.splitlines()[0]
    runs, cells = _rows(store)
    (run_id,) = [r[0] for r in runs if r[1] == "x"]
    assert [c for c in cells if c[0] == run_id and c[3] == "ok"], cells


class _Locked:
    """A connection whose every statement but a PRAGMA meets another process's lock, waiting out its busy timeout on
    a clock of its own: the wait loop as SQLite drives it, with no lock, no sleep and no signal."""

    def __init__(self, interrupt_at: int | None = None):
        self.now, self.timeouts, self.attempts, self.interrupt_at = 0.0, [], 0, interrupt_at

    def execute(self, sql):
        if sql.startswith("PRAGMA busy_timeout="):
            self.timeouts.append(int(sql.split("=")[1]))
            return None
        self.attempts += 1
        self.now += self.timeouts[-1] / 1000  # SQLite's busy handler waits the whole timeout
        if self.attempts == self.interrupt_at:
            # Ctrl-C pressed during this slice: Python raises it as the statement returns, never inside it
            raise KeyboardInterrupt
        raise sqlite3.OperationalError("database is locked")


def _wait(monkeypatch, con):
    monkeypatch.setattr(store_db, "time", type("Clock", (), {"monotonic": staticmethod(lambda: con.now)}))
    return store_db._wait_for_lock(con, "s.db", lambda: con.execute("BEGIN IMMEDIATE"))


def test_the_lock_wait_is_said_once_and_taken_in_slices_until_its_end(monkeypatch, capsys):
    """SQLite's busy wait is one C call that Python cannot interrupt: Ctrl-C pressed in it took effect only at its
    end, up to 60 s later. After the first LOCK_NOTICE the wait is said, and no statement waits more than a slice."""
    con = _Locked()
    with pytest.raises(sqlite3.OperationalError):
        _wait(monkeypatch, con)
    wait_ms, notice_ms, slice_ms = (int(store_db.LOCK_WAIT * 1000), int(store_db.LOCK_NOTICE * 1000),
                                    int(store_db.LOCK_SLICE * 1000))
    assert con.timeouts[0] == notice_ms
    assert all(0 < t <= slice_ms for t in con.timeouts[1:-1]), con.timeouts
    assert con.timeouts[-1] == wait_ms  # the statements after the wait keep SQLite's whole wait
    assert con.now == pytest.approx(store_db.LOCK_WAIT)  # refused at the end of the wait, not before or after
    assert capsys.readouterr().err == ("store s.db is locked by another process: waiting up to 60 s for it "
                                       "(Ctrl-C stops)\n")


def test_ctrl_c_during_the_lock_wait_ends_it_within_a_slice(monkeypatch, capsys):
    con = _Locked(interrupt_at=5)
    with pytest.raises(KeyboardInterrupt):
        _wait(monkeypatch, con)
    assert con.attempts == 5  # no statement after the interruption but the timeout's reset
    assert con.timeouts[-1] == int(store_db.LOCK_WAIT * 1000)
    assert capsys.readouterr().err.count("\n") == 1


def test_a_lock_wait_ended_by_ctrl_c_ends_the_command_as_ctrl_c_does(tmp_path, monkeypatch):
    """A writer interrupted while it waited for the write lock: one line, exit 130, nothing stored."""
    store = tmp_path / "s.db"
    _store_with_cells(store)
    before = _rows(store)
    monkeypatch.setattr(store_db, "LOCK_NOTICE", 0.05)
    said = []
    err = type("Err", (), {"write": staticmethod(said.append), "flush": staticmethod(lambda: None)})

    def clock():  # the first reading after the wait was said is taken between two slices: Ctrl-C lands there
        if said:
            raise KeyboardInterrupt
        return time.monotonic()

    holder = _write_locked(store)
    try:
        monkeypatch.setattr(store_db, "sys", type("Sys", (), {"stderr": err}))
        monkeypatch.setattr(store_db, "time", type("Clock", (), {"monotonic": staticmethod(clock)}))
        res = invoke(*BANDWIDTH, "--db", store, "--name", "x")
    finally:
        holder.rollback()
        holder.close()
    assert said == [f"store {store} is locked by another process: waiting up to 60 s for it (Ctrl-C stops)\n"]
    assert res.exit_code == 130, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted"), lines
    assert _rows(store) == before


@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_a_side_file_this_user_cannot_read_is_said_as_such(tmp_path, unopenable, suffix):
    """A killed sweep's -wal file (or the -shm beside it) that this user may not read: SQLite says "unable to open
    database file", which was "store S is damaged: restore it from a copy"."""
    store = tmp_path / "s.db"
    _store_with_cells(store)
    for side in ("-wal", "-shm"):
        (tmp_path / f"s.db{side}").write_bytes(b"\0" * 4096)  # as a kill -9 leaves them
    side = tmp_path / f"s.db{suffix}"
    side.chmod(0)
    unopenable(side, os.R_OK)
    before = snapshot(tmp_path)
    for args in (["runs", "--db", store], ["compare", "a", "b", "--db", store]):
        line = one_line_error(invoke(*args), f"cannot read s.db{suffix} beside store {store} (no permission)")
        assert "damaged" not in line
    assert snapshot(tmp_path) == before


def _good(tmp_path):
    good = tmp_path / "good.db"
    _store_with_cells(good)
    return good


def test_a_store_in_a_read_only_folder_is_read(tmp_path, monkeypatch):
    # A plain connection needs to create WAL's -shm file beside the store: readers open it read-only instead.
    path = _good(tmp_path)
    before = snapshot(tmp_path)
    real = os.access
    monkeypatch.setattr(store_db.os, "access", lambda p, mode: False if mode == os.W_OK else real(p, mode))
    assert store_db._reader(str(path))[1] is True
    res = invoke("runs", "--db", path)
    assert res.exit_code == 0 and "r" in res.stdout, res.output
    assert snapshot(tmp_path) == before


def test_a_read_only_file_system_is_named(tmp_path, monkeypatch):
    # os.access answers EROFS for W_OK on a read-only mount; root passes permission checks, so mock it.
    folder = tmp_path / "ro"
    folder.mkdir()
    real = os.access
    monkeypatch.setattr(store_db.os, "access", lambda p, mode: False if Path(p) == folder else real(p, mode))
    one_line_error(invoke("merge", _good(tmp_path), "--into", folder / "t.db"), "not writable", "read-only file system")
    assert list(folder.iterdir()) == []


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores folder permissions")
def test_a_folder_without_write_permission_is_named(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        one_line_error(invoke("merge", _good(tmp_path), "--into", folder / "t.db"), "not writable")
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_a_read_only_store_is_named_to_writers_and_still_read(tmp_path, monkeypatch):
    good, other = _good(tmp_path), _good_other(tmp_path)
    real = os.access
    monkeypatch.setattr(store_db.os, "access", lambda p, mode: False if Path(p) == good else real(p, mode))
    before = snapshot(tmp_path)
    one_line_error(invoke("merge", other, "--into", good), "read-only")
    assert snapshot(tmp_path) == before
    assert invoke("runs", "--db", good).exit_code == 0


def _good_other(tmp_path):
    other = tmp_path / "other.db"
    _store_with_cells(other, name="other")
    return other


# --- the disk filling up ---------------------------------------------------------------------------

def _sqlite_full_error() -> sqlite3.OperationalError:
    """A real SQLITE_FULL from SQLite: a page cap reached, as a full disk reports it."""
    con = sqlite3.connect(":memory:")
    con.execute("PRAGMA max_page_count=2")
    try:
        con.execute("CREATE TABLE t (x)")
        con.executemany("INSERT INTO t VALUES (?)", [("x" * 4000,)] * 10)
    except sqlite3.OperationalError as exc:
        return exc
    finally:
        con.close()
    raise AssertionError("the page cap did not fill the database")


def _full_after(monkeypatch, stored: int):
    """Lets `stored` cells reach the store; the next write fails as on a full disk."""
    real, error = Store.put_cell, _sqlite_full_error()
    count = {"n": 0}

    class FullConnection:
        def __init__(self, conn):
            self.conn = conn

        def execute(self, *args):
            raise error

        def __enter__(self):
            return self.conn.__enter__()

        def __exit__(self, *exc):
            return self.conn.__exit__(*exc)

    def put_cell(self, *args, **kwargs):
        count["n"] += 1
        if count["n"] > stored and not isinstance(self.conn, FullConnection):
            self.conn = FullConnection(self.conn)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Store, "put_cell", put_cell)
    monkeypatch.setattr(Store, "close", lambda self: getattr(self.conn, "conn", self.conn).close())


def test_disk_full_while_storing_a_cell_raises_store_full_and_keeps_earlier_cells(tmp_path, monkeypatch):
    path = tmp_path / "t.db"
    s = Store(path)
    run_id, _ = s.create_run("r", "inference", {}, {})
    s.put_cell(run_id, "a", "inference", "ok", {"latency_ms": 1.0}, cell={})
    pages = s.conn.execute("PRAGMA page_count").fetchone()[0]
    s.conn.execute(f"PRAGMA max_page_count={pages}")
    with pytest.raises(StoreFull, match="full.*resume"):
        s.put_cell(run_id, "b", "inference", "ok", {"latency_ms": 1.0}, cell={}, samples=[0.5] * 100_000)
    s.close()
    s = Store(path)
    assert [c["key"] for c in s.cells(run_id)] == ["a"]  # the failed cell is absent, not half stored
    assert s.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    s.put_cell(run_id, "b", "inference", "ok", {"latency_ms": 1.0}, cell={})  # room again: it goes on
    assert s.finished_keys(run_id) == {"a", "b"}
    s.close()


def test_enospc_from_the_file_system_is_store_full(tmp_path, monkeypatch):
    s = Store(tmp_path / "t.db")
    run_id, _ = s.create_run("r", "inference", {}, {})

    class Full:
        def execute(self, *a):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    real, s.conn = s.conn, Full()
    with pytest.raises(StoreFull, match="disk holding store .* is full"):
        s.put_cell(run_id, "a", "inference", "ok", {}, cell={})
    real.close()


@pytest.mark.slow
def test_a_sweep_stops_on_a_full_disk_with_one_line_and_resumes(tmp_path, monkeypatch):
    path = tmp_path / "t.db"
    _full_after(monkeypatch, stored=1)
    res = invoke("run", "--model", "bert-tiny", "--batch", "1,2", *QUICK, "--db", path, "--name", "full")
    one_line_error(res, "full", "resume")
    s = Store(path, readonly=True)
    run_id = s.find_run("full")["run_id"]
    assert len(s.cells(run_id)) == 1 and s.cells(run_id)[0]["status"] == "ok"
    s.close()
    monkeypatch.undo()
    res = invoke("run", "--model", "bert-tiny", "--batch", "1,2", *QUICK, "--db", path, "--name", "full")
    assert res.exit_code == 0 and "(resumed)" in res.output, res.output
    s = Store(path, readonly=True)
    assert [c["cell"]["batch"] for c in s.cells(run_id)] == [1, 2]
    s.close()


# --- the schema marker ------------------------------------------------------------------------------

def test_a_new_store_carries_the_marker_in_its_file_header(tmp_path):
    path = tmp_path / "t.db"
    _store_with_cells(path)
    head = path.read_bytes()[:100]
    assert int.from_bytes(head[68:72], "big") == store_db.APP_ID
    assert int.from_bytes(head[60:64], "big") == store_db.SCHEMA_VERSION
    assert store_db.inspect(str(path)) == "ours"


def test_an_old_store_without_the_marker_still_opens(tmp_path):
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)  # what Store wrote before the marker: WAL, then the two tables
    con.execute("PRAGMA journal_mode=WAL")
    con.executescript(store_db.SCHEMA)
    con.execute("INSERT INTO runs VALUES ('id1', 'old', 'inference', '2025-01-01T00:00:00+00:00', '{}', '{}')")
    con.commit()
    con.close()
    before = snapshot(tmp_path)
    res = invoke("runs", "--db", path)
    assert res.exit_code == 0 and "old" in res.output, res.output
    assert snapshot(tmp_path) == before  # reading wrote nothing, not even the marker
    s = Store(path)  # a writer stamps it
    assert s.find_run("old")["run_id"] == "id1"
    s.close()
    assert int.from_bytes(path.read_bytes()[68:72], "big") == store_db.APP_ID


def test_readers_write_nothing_to_a_store_of_ours(tmp_path):
    path = _good(tmp_path)
    before = snapshot(tmp_path)
    assert invoke("runs", "--db", path).exit_code == 0
    s = Store(path, readonly=True)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        s.conn.execute("DELETE FROM cells")
    s.close()
    assert snapshot(tmp_path) == before


# --- merge --------------------------------------------------------------------------------------------

def test_merge_checks_every_source_before_writing(tmp_path):
    good, bad = _good(tmp_path), tmp_path / "bad.db"
    _random_bytes(bad)
    target = tmp_path / "target.db"
    one_line_error(invoke("merge", good, bad, "--into", target), "not a SQLite database")
    assert not target.exists()


def test_merge_refuses_a_run_name_that_is_another_run_in_the_target(tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    _store_with_cells(a, name="same")
    s = Store(b)
    s.conn.execute("INSERT INTO runs VALUES ('otherid', 'same', 'inference', '2025-01-01T00:00:00+00:00', '{}', '{}')")
    s.conn.commit()
    s.close()
    before = b.read_bytes()
    one_line_error(invoke("merge", a, "--into", b), "another run")
    assert b.read_bytes() == before


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(refusal=st.sampled_from([["--resume"], ["--resume", "--name", "zz"], ["--resume", "--name", "last run"]]),
       mtime=st.integers(0, 2**31), linked=st.booleans())
def test_a_zero_length_file_refused_as_a_store_stays_zero_length(tmp_path_factory, refusal, mtime, linked):
    """A writer marks an empty file as a store on opening it: refused before its first run, it left a user's
    zero-length file a 24 KiB store."""
    here = tmp_path_factory.mktemp("blank")
    blank = here / "kept.db"
    blank.touch()
    os.utime(blank, (mtime, mtime))
    db = here / "link.db" if linked else blank
    if linked:
        db.symlink_to(blank)
    refused(invoke("run", "--model", "bert-tiny", *QUICK, "--db", db, *refusal), "nothing to resume")
    assert blank.stat().st_size == 0 and blank.stat().st_mtime == mtime
    assert sorted(p.name for p in here.iterdir()) == sorted({"kept.db", db.name})


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(depth=st.integers(1, 3), content=st.binary(max_size=20))
def test_a_store_inside_a_file_is_said_as_such(tmp_path_factory, depth, content):
    here = tmp_path_factory.mktemp("inside")
    notes = here / "notes.txt"
    notes.write_bytes(content)
    db = notes.joinpath(*["sub"] * (depth - 1), "x.db")
    for args in (["run", "--model", "bert-tiny", *QUICK, "--db", db], ["merge", str(db), "--into", db]):
        line = refused(invoke(*args))
        assert "which is a file, not a folder" in line or "no store at" in line, line  # merge reads its source first
    refused(invoke("run", "--model", "bert-tiny", *QUICK, "--db", db), f"inside {notes}, which is a file")
    assert notes.read_bytes() == content and sorted(here.iterdir()) == [notes]
