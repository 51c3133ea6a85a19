"""Output paths the user names (--json, --csv, --plot, `runs --out`, `report --out`): checked before any work
(one `error:` line, exit 2), never written over the store or any other SQLite database, and a write that
fails after the run is stored says so and how to get the file again, never a traceback."""

import json
import os
import sqlite3
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_cli_input import QUICK, invoke, refused  # the one-line refusal's check, shared

from transbench import api
from transbench.errors import SpecError
from transbench.scenarios import micro
from transbench.store import export

TINY_RUN = ["run", "--model", "bert-tiny", "--batch", "1", "--seq", "8", "--backend", "sdpa", *QUICK]
GEMM = ["micro", "gemm", "--sizes", "64", "--model", "", "--device", "cpu", "--min-time", "0.01"]
BREAKDOWN = ["micro", "breakdown", "--model", "bert-tiny", "--batch", "1", "--seq", "8", "--device", "cpu",
             "--min-time", "0.01"]
LADDER = ["train", "--ladder", "-m", "bert-tiny", "--seq", "8", "--batch", "2", "--steps", "1", "--warmup", "1",
          "--max-batch-limit", "4", "--device", "cpu"]
ROOT = os.geteuid() == 0  # root passes permission checks: /proc files open for writing and fail on write


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A store holding one inference run named `a`, and its bytes."""
    db = tmp_path_factory.mktemp("stored") / "keep.db"
    res = invoke(*TINY_RUN, "--db", db, "--name", "a")
    assert res.exit_code == 0, res.output
    return db, db.read_bytes()


@pytest.fixture
def other_db(tmp_path):
    """Some other application's SQLite database."""
    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    return path, path.read_bytes()



# --- 1. never over the store or another SQLite database ---------------------------------------------------

@pytest.mark.slow
def test_runs_out_never_overwrites_the_store(stored, tmp_path):
    db, before = stored
    refused(invoke("runs", "--db", db, "--spec", "a", "--out", db), "it is the store")
    refused(invoke("runs", "--db", db, "--spec", "a", "--out", f"{db}-wal"), "it is the store")
    link = tmp_path / "link.yaml"
    link.symlink_to(db)
    refused(invoke("runs", "--db", db, "--spec", "a", "--out", link), "it is the store")
    assert db.read_bytes() == before
    spec = tmp_path / "a.yaml"
    res = invoke("runs", "--db", db, "--spec", "a", "--out", spec)
    assert res.exit_code == 0, res.output
    spec.write_text(spec.read_text().replace("bert-tiny", "an older model"))  # a spec of ours: replaced
    res = invoke("runs", "--db", db, "--spec", "a", "--out", spec)
    assert res.exit_code == 0, res.output
    assert "bert-tiny" in spec.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("option", ["--json", "--csv", "--plot", "--out"])
def test_no_output_overwrites_another_sqlite_database(stored, other_db, no_work, option, tmp_path):
    db, _ = stored
    path, before = other_db
    if option == "--plot":  # a database named like an image
        path = path.rename(tmp_path / "other.png")
    command = {"--out": ["runs", "--spec", "a"], "--plot": GEMM}.get(option, TINY_RUN)
    refused(invoke(*command, "--db", db, option, path), "SQLite database", str(path))
    assert path.read_bytes() == before


@pytest.mark.slow
def test_report_files_never_overwrite_a_sqlite_database(stored, other_db, tmp_path):
    db, _ = stored
    path, before = other_db
    out = tmp_path / "r"
    out.mkdir()
    path = path.rename(out / "report.md")
    refused(invoke("report", "a", "--db", db, "--out", out), "SQLite database")
    assert path.read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["report.md"]


def test_export_write_refuses_a_sqlite_database_from_python(other_db):
    """api.run and friends write through export.write without the CLI's up-front check."""
    path, before = other_db
    with pytest.raises(SpecError, match="SQLite database"):
        export.write([{"run_name": "x"}], json_path=str(path))
    assert path.read_bytes() == before


# --- 2. a write that fails after the run: one line, the run is stored -------------------------------------

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")


@pytest.mark.slow
@needs_dev_full
@pytest.mark.parametrize("command", [
    TINY_RUN,
    ["train", "-m", "bert-tiny", "--seq", "8", "--batch", "2", "--steps", "1", "--warmup", "1", "--device", "cpu"],
    ["serve", "--model", "bert-tiny", "--device", "cpu", "--lengths", "fixed:8", "--max-batch-size", "4",
     "--rate", "20", "--duration", "0.3", "--warmup", "0.1", "--backend", "sdpa"],
    GEMM,
], ids=["run", "train", "serve", "micro"])
def test_a_full_disk_after_the_run_is_one_line_naming_the_stored_run(tmp_path, command):
    db = tmp_path / "f.db"
    line = refused(invoke(*command, "--db", db, "--name", "full run", "--json", "/dev/full"),
                   "cannot write /dev/full: No space left on device", "run 'full run' is stored",
                   "--name 'full run'")
    (run,) = api.runs(str(db))
    assert run["name"] == "full run" and run["cells"] >= 1, line
    # What the line says works: the same command with the name and another path writes the export again.
    again = invoke(*command, "--db", db, "--name", "full run", "--json", tmp_path / "again.json")
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "again.json").read_text())["cells"]


@pytest.mark.slow
def test_a_plot_that_fails_after_the_run_is_one_line(tmp_path, monkeypatch):
    # The folder exists when checked and is gone when the plot is written.
    folder = tmp_path / "plots"
    folder.mkdir()
    real = micro.plot_micro

    def plot_after_rmdir(outcome, db, path):
        folder.rmdir()
        return real(outcome, db, path)

    monkeypatch.setattr(micro, "plot_micro", plot_after_rmdir)
    refused(invoke(*GEMM, "--db", tmp_path / "g.db", "--name", "g", "--plot", folder / "r.png"),
            "cannot write", "r.png", "run 'g' is stored", "--name g")


# --- 3. --plot is checked before any work -----------------------------------------------------------------

@pytest.mark.parametrize("command", [GEMM, BREAKDOWN, LADDER], ids=["gemm", "breakdown", "ladder"])
@pytest.mark.parametrize("plot,needles", [
    ("nodir/x.png", ["folder", "does not exist"]),
    ("x.txt", ["'.txt' is not an image format", ".png"]),
    ("noext", ["has no suffix", ".png"]),
    (".", ["it is a folder"]),
    ("", ["--plot is empty"]),
])
def test_plot_paths_are_checked_before_any_work(tmp_path, monkeypatch, no_work, command, plot, needles):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "p.db"
    refused(invoke(*command, "--db", db, "--plot", plot), *needles)
    assert not db.exists() and sorted(os.listdir(tmp_path)) == []  # no ./.png, nothing created


def test_a_plot_and_an_export_may_not_share_a_file(tmp_path, no_work):
    refused(invoke(*GEMM, "--db", tmp_path / "p.db", "--json", tmp_path / "x.png", "--plot", tmp_path / "x.png"),
            "--json and --plot both write")


def test_the_ladders_default_plot_is_checked_before_the_ladder(tmp_path, monkeypatch, no_work):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ladder-bert-tiny.png").mkdir()  # the default name is taken by a folder
    refused(invoke(*LADDER, "--db", tmp_path / "p.db"), "ladder-bert-tiny.png", "it is a folder")


@pytest.mark.skipif(not os.path.exists("/proc/version"), reason="Linux /proc")
def test_a_proc_file_is_not_an_image(tmp_path, no_work):
    refused(invoke(*GEMM, "--db", tmp_path / "p.db", "--plot", "/proc/version"), "/proc/version")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux /proc")
@pytest.mark.parametrize("option", ["--json", "--csv"])
@pytest.mark.parametrize("path", ["/proc/self/status", "/proc/new.csv", "/proc/sys/kernel/hostname"])
def test_a_file_of_the_kernel_is_refused_before_any_work(tmp_path, no_work, option, path):
    """/proc takes no new file, so `--csv /proc/self/status` failed once written, after the measuring; as root,
    a few of its files are writable in place."""
    db = tmp_path / "k.db"
    refused(invoke(*GEMM, "--db", db, option, path), path, "kernel's proc file system")
    assert not db.exists()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux /proc")
def test_kernel_fs_names_the_kernels_file_systems_only(tmp_path):
    assert export.kernel_fs("/proc/self/status") == "proc"
    assert export.kernel_fs("/proc/no/such/file") == "proc"
    assert export.kernel_fs(tmp_path / "x.csv") is None
    # /dev/stdout leads through /proc/self/fd; a pipe or a terminal is written as given.
    export.check_output("/dev/stdout", "--json")


# --- 4. runs --out, report --out and empty paths ----------------------------------------------------------

def test_runs_out_at_a_folder_names_the_file_that_option_writes_there(tmp_path):
    """`runs --out FOLDER` without --spec (the JSON record) was told to give FOLDER/spec.yaml, which it then refused
    for not ending in .json."""
    from report_helpers import cell, make_run, ok_result

    db = tmp_path / "s.db"
    make_run(str(db), "a", [(cell("eager", 1), ok_result([1.0, 1.1, 1.2], 1))])
    (tmp_path / "d.json").mkdir()
    for folder in (tmp_path, tmp_path / "d.json"):
        refused(invoke("runs", "--db", db, "--out", folder), "it is a folder", f"such as {folder / 'runs.json'}")
    refused(invoke("runs", "--db", db, "--spec", "a", "--out", tmp_path), f"such as {tmp_path / 'spec.yaml'}")
    assert invoke("runs", "--db", db, "--out", tmp_path / "d.json" / "runs.json").exit_code == 0


_SCALARS = (st.integers(-2**63, 2**63 - 1) | st.floats() | st.booleans()
            | st.text(st.characters(blacklist_categories=("Cs",)), max_size=8))


@settings(max_examples=60, deadline=2000)
@given(data=st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=6),
                            _SCALARS | st.lists(_SCALARS, max_size=3), max_size=4))
@example(data={"min_time": float("nan"), "rate": float("-inf"), "models": ["./\U0001F600", "a\x7fb"], "x y": 1})
def test_a_stored_spec_written_as_toml_is_read_back_as_it_was(data):
    """`runs --spec RUN --out s.toml` of a stored spec holding NaN or infinity, a character past U+FFFF (a model
    folder named with an emoji) or DEL wrote a file its own --spec refused as invalid TOML."""
    from transbench.spec import _parse, dump_text

    back = _parse("s.toml", ".toml", dump_text(data, ".toml"))
    assert json.dumps(back, sort_keys=True) == json.dumps(data, sort_keys=True)  # NaN equal to NaN as text


@pytest.mark.slow
def test_runs_out_is_checked(stored, tmp_path):
    db, before = stored
    refused(invoke("runs", "--db", db, "--spec", "a", "--out", tmp_path / "nodir" / "x.yaml"), "does not exist")
    refused(invoke("runs", "--db", db, "--spec", "a", "--out", tmp_path), "it is a folder")
    refused(invoke("runs", "--db", db, "--spec", "a", "--out", ""), "--out is empty")
    assert db.read_bytes() == before


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux /proc")
def test_report_into_a_folder_that_takes_no_files(stored):
    db, _ = stored
    refused(invoke("report", "a", "--db", db, "--out", "/proc"), "/proc", "kernel's proc file system")


@pytest.mark.slow
@pytest.mark.parametrize("name,make", [
    ("report.md", lambda p: p.mkdir()),
    ("report.html", lambda p: os.mkfifo(p)),
    ("report.md", lambda p: p.symlink_to("/nonexistent/x")),
    ("latency_throughput_bert-tiny-base-fp32.png", lambda p: p.mkdir()),
], ids=["folder", "fifo", "link to nothing", "a plot's name taken by a folder"])
def test_a_report_files_name_taken_by_no_file_is_refused_before_any_plot(stored, tmp_path, name, make):
    """report.md a folder failed after the plots were written; a plot's name taken by a folder lost that plot."""
    db, _ = stored
    out = tmp_path / "rep"
    out.mkdir()
    make(out / name)
    refused(invoke("report", "a", "--db", db, "--out", out), f"cannot write {out / name}", "remove it")
    assert os.listdir(out) == [name]


@pytest.mark.slow
def test_report_out_empty_is_refused_not_the_current_folder(stored, tmp_path, monkeypatch):
    db, _ = stored
    monkeypatch.chdir(tmp_path)
    refused(invoke("report", "a", "--db", db, "--out", ""), "--out is empty")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("option", ["--json", "--csv"])
@pytest.mark.parametrize("command", [TINY_RUN, GEMM, BREAKDOWN, ["train", "-m", "bert-tiny", "--device", "cpu"]],
                         ids=["run", "gemm", "breakdown", "train"])
def test_empty_export_paths_are_refused(tmp_path, no_work, command, option):
    db = tmp_path / "e.db"
    refused(invoke(*command, "--db", db, option, ""), f"{option} is empty")
    assert not db.exists()


@pytest.mark.slow
def test_an_existing_export_is_overwritten(stored, tmp_path):
    """Re-running a command rewrites its exports: no prompt, no refusal. Only its own: another file there is
    refused (tests/test_output_ownership.py)."""
    db, _ = stored
    js = tmp_path / "r.json"
    js.write_text('{"schema_version": 1, "transbench_version": "0.0.1", "kind": "record", "cells": "old"}')
    res = invoke(*TINY_RUN, "--db", db, "--name", "a", "--json", js)
    assert res.exit_code == 0, res.output
    assert json.loads(js.read_text())["schema_version"] == 1 and json.loads(js.read_text())["cells"] != "old"
    js.write_text("old")
    refused(invoke(*TINY_RUN, "--db", db, "--name", "a", "--json", js), "is not a file transbench wrote")
    assert js.read_text() == "old"


def test_check_output_needs_no_write_permission_on_the_folder_of_an_existing_file(tmp_path):
    """/dev/stdout for a user: the file is writable, its folder is not."""
    if ROOT:
        pytest.skip("root may write anywhere")
    folder = tmp_path / "ro"
    folder.mkdir()
    target = folder / "out.json"
    target.write_text("")
    folder.chmod(0o500)
    try:
        export.check_output(str(target), "--json")
    finally:
        folder.chmod(0o700)
    assert Path(target).exists()


def test_csv_cells_are_written_as_stored_even_where_a_spreadsheet_reads_a_formula(tmp_path):
    """docs/results.md: the CSV is data for scripts; a quote before `=`, `+`, `-` or `@` would change a run name
    and turn -0.5 into text, so cells are written as stored, quoted only where CSV needs it."""
    import csv

    path = tmp_path / "r.csv"
    recs = [{"run_id": "1", "run_name": '=HYPERLINK("x"),|`a`', "scenario": "inference", "model": "@m",
             "seq_stdev": -0.5, "error": "line one\nline two"}]
    export.write(recs, csv_path=str(path))
    (row,) = list(csv.DictReader(path.open(newline="")))
    assert (row["run_name"], row["model"], row["seq_stdev"], row["error"]) == (
        '=HYPERLINK("x"),|`a`', "@m", "-0.5", "line one\nline two")
