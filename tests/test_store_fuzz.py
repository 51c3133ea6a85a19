"""Stored results resumed, merged, listed and compared from stores and names that are not what the code
expects: damaged rows, half-made files, names that are other runs' ids or not UTF-8, runs of other grids or
other hardware. Bad input is one line on stderr, exit 2, no traceback, and every store byte-identical."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from report_helpers import bad_result, cell, make_run, ok_result
from test_cli_input import invoke, refused

from transbench import api
from transbench.cells import CellResult
from transbench.scenarios.inference import cells as grid
from transbench.runner.sweep import open_run
from transbench.scenarios.inference.spec import RunSpec
from transbench.store import Store
from transbench.store import db as store_db

ROOT = Path(__file__).resolve().parents[1]


def samples(median: float, n: int = 40) -> list[float]:
    return [median * (1 + 0.01 * ((i * 7) % 5 - 2)) for i in range(n)]


def digest(folder: Path) -> dict:
    """sha256 of every store file and its -wal (SQLite's -shm index is shared memory, not the store)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.endswith("-shm")}


def two_runs(db: Path, spec_a: dict | None = None, spec_b: dict | None = None) -> None:
    make_run(str(db), "A", [(cell("eager", 1), ok_result(samples(10.0), 1)),
                            (cell("eager", 2), ok_result(samples(20.0), 2))], spec=spec_a)
    make_run(str(db), "B", [(cell("eager", 1), ok_result(samples(10.0), 1)),
                            (cell("eager", 2), ok_result(samples(20.0), 2))], spec=spec_b)


def edit_store(db: Path, *statements: str) -> None:
    """Apply SQL to a store as another program would, committed."""
    con = sqlite3.connect(db)
    for sql in statements:
        con.execute(sql)
    con.commit()
    con.close()


# --- rows that are not what a store of ours holds -----------------------------------------------------------

DAMAGE = {
    "spec not JSON": ("UPDATE runs SET spec='not json' WHERE name='A'", "the spec of run 'A' is not JSON"),
    "spec a list": ("UPDATE runs SET spec='[]' WHERE name='A'", "the spec of run 'A' is a list, not an object"),
    "env null": ("UPDATE runs SET env='null' WHERE name='A'", "the env of run 'A' is null, not an object"),
    # merge adds a host to a run's `hosts`: an entry of another shape there was a traceback
    "hosts text": ("UPDATE runs SET env=json_set(env, '$.hosts', 'x') WHERE name='A'",
                   "the env of run 'A' is an environment whose hosts are a string, not a list"),
    "host entry": ("UPDATE runs SET env=json_set(env, '$.hosts', json('[1]')) WHERE name='A'",
                   "whose hosts hold an entry whose shape is a number, not an object"),
    "hostname list": ("UPDATE runs SET env=json_set(env, '$.hostname', json('[\"x\"]')) WHERE name='A'",
                      "the env of run 'A' is an environment whose hostname is a list, not text"),
    "record cut short": ("UPDATE cells SET record='{' WHERE rowid=1", "the record of cell 'backend eager"),
    "samples null": ("UPDATE cells SET samples='null' WHERE rowid=1", "the samples of cell 'backend eager"),
    "samples text": ("UPDATE cells SET samples='[\"x\"]' WHERE rowid=1", "something other than finite numbers"),
    "samples NaN": ("UPDATE cells SET samples='[NaN, 1.0]' WHERE rowid=1", "something other than finite numbers"),
    "batch -1": ("UPDATE cells SET record=json_set(record, '$.batch_size', -1) WHERE rowid=1",
                 "a record whose batch_size is -1, not a count"),
    "samples 1.5": ("UPDATE cells SET record=json_set(record, '$.n_samples', 1.5) WHERE rowid=1",
                    "a record whose n_samples is 1.5, not a count"),
    # A run's kind and its cells' scenarios hand-edited apart: compare paired an inference cell moved into a training
    # run with training cells, and a report filed it under a table of another kind.
    "kind of another run": ("UPDATE runs SET kind='training' WHERE name='A'",
                            "is 'inference', not a scenario of its run's kind, training"),
    "scenario of another kind": ("UPDATE cells SET scenario='micro-gemm' WHERE rowid=1",
                                 "is 'micro-gemm', not a scenario of its run's kind, inference (inference, generation, "
                                 "max-batch)"),
    "record of another scenario": ("UPDATE cells SET record=json_set(record, '$.scenario', 'generation') "
                                   "WHERE rowid=1", "a record of scenario 'generation', not its row's 'inference'"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_row_is_one_line_and_never_copied_by_merge(tmp_path, damage):
    sql, needle = DAMAGE[damage]
    db = tmp_path / "s.db"
    two_runs(db)
    edit_store(db, sql)
    target = tmp_path / "t.db"
    Store(target).close()
    before = digest(tmp_path)
    for args in (["compare", "A", "B", "--db", db], ["report", "A", "--db", db, "--out", tmp_path / "out"],
                 ["merge", db, "--into", target]):
        refused(invoke(*args), f"store {db} is damaged", needle)
    assert digest(tmp_path) == before  # the target got none of it; the report folder holds no file
    assert not any((tmp_path / "out").glob("*")) if (tmp_path / "out").exists() else True


@pytest.mark.parametrize("damage", ["record cut short", "samples NaN"])
def test_merge_into_a_damaged_store_is_refused_untouched(tmp_path, damage):
    """The sources were read back before a merge, the target not: a merge wrote beside its damage without a word."""
    sql, needle = DAMAGE[damage]
    target, source = tmp_path / "t.db", tmp_path / "s.db"
    two_runs(target)
    make_run(str(source), "C", [(cell("eager", 4), ok_result(samples(30.0), 4))])
    edit_store(target, sql)
    before = digest(tmp_path)
    refused(invoke("merge", source, "--into", target), f"store {target} is damaged", needle)
    assert digest(tmp_path) == before


def test_a_damaged_rows_line_escapes_the_line_separators_of_its_names(tmp_path):
    db = tmp_path / "s.db"
    two_runs(db)
    edit_store(db, "UPDATE runs SET name='A\u2028B\u2029C' WHERE name='A'",
               "UPDATE runs SET spec='[]' WHERE name='A\u2028B\u2029C'")
    line = refused(invoke("runs", "--db", db), "the spec of run 'A\\u2028B\\u2029C' is a list")
    assert "\u2028" not in line and "\u2029" not in line


# A stored text a damaged row's line quotes, and how it is put there (`{t}`: the text, quotes doubled for SQL)
QUOTED = {
    "key": "UPDATE cells SET key = '{{' || '{t}' || ',' WHERE rowid = 1",  # JSON cut short: damage naming the key
    "status": "UPDATE cells SET status = '{t}' WHERE rowid = 1",
    "cell date": "UPDATE cells SET created = '{t}' WHERE rowid = 1",
    "run kind": "UPDATE runs SET kind = '{t}' WHERE name = 'A'",
    "run date": "UPDATE runs SET created = '{t}' WHERE name = 'A'",
    "run name": "UPDATE runs SET name = '{t}', spec = '[]' WHERE name = 'A'",
}


@settings(max_examples=40, deadline=None)
@given(column=st.sampled_from(sorted(QUOTED)), piece=st.text(min_size=1, max_size=8), times=st.integers(1, 50_000))
def test_a_damaged_rows_line_quotes_a_stored_text_of_any_length_in_a_short_line(tmp_path_factory, column, piece,
                                                                                times):
    """A key of 200,000 brackets, cut short, was quoted whole: an error line of 200 KB."""
    tmp_path = tmp_path_factory.mktemp("quoted")
    db = tmp_path / "s.db"
    two_runs(db)
    text = (piece * times).replace("\0", "")
    if column not in ("key", "run name"):  # never a status, kind or date transbench writes
        text += "?"
    edit_store(db, QUOTED[column].format(t=text.replace("'", "''")))
    before = digest(tmp_path)
    for args in (["runs", "--db", db, "--out", tmp_path / "all.json"], ["compare", "A", "B", "--db", db]):
        line = refused(invoke(*args), f"store {db} is damaged")
        assert len(line) < 1_500 + len(str(db)), len(line)
    assert digest(tmp_path) == before


def test_a_stored_spec_that_does_not_read_back_is_damage(tmp_path):
    """`runs --spec` refused it in a spec file's words, as if the user had written it."""
    db = tmp_path / "s.db"
    two_runs(db, spec_a={"models": ["bert-tiny"], "batches": [1, 2]})
    edit_store(db, "UPDATE runs SET spec=json_set(spec, '$.batches', 'x') WHERE name='A'")
    before = digest(tmp_path)
    refused(invoke("runs", "--db", db, "--spec", "A"), f"store {db} is damaged: the spec of run 'A' does not read "
            "back (batches: expected a list of whole numbers")
    assert digest(tmp_path) == before


def test_text_stored_before_it_was_refused_as_not_utf8_is_reported_and_its_spec_is_damage(tmp_path):
    """A model folder or a trace named in bytes that are not UTF-8 was stored (as a lone surrogate's JSON escape)
    before spec.coerce refused such text: `report` of the run was a UnicodeEncodeError traceback, and `runs --spec`
    wrote a serve run's spec as TOML its --spec refused."""
    db = tmp_path / "s.db"
    two_runs(db)
    edit_store(db, "UPDATE cells SET key=replace(key, 'bert-tiny', 'bert-tiny\\udcff'), "
                   "record=replace(record, 'bert-tiny', 'bert-tiny\\udcff')")
    res = invoke("report", "A", "B", "--db", db, "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output
    assert "bert-tiny\\udcff" in (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    make_run(str(db), "S", [], kind="serve", spec={"model": "bert-tiny", "trace": "t\udcff.jsonl"})
    before = digest(tmp_path)
    for out in ("s.toml", "-"):
        refused(invoke("runs", "--db", db, "--spec", "S", "--out", tmp_path / out if out != "-" else out),
                f"store {db} is damaged: the spec of run 'S' does not read back (a setting holds text that is not "
                "UTF-8)")
    assert digest(tmp_path) == before


def test_merge_joins_a_host_whose_gpus_are_bare_names(tmp_path):
    """Older stores hold a GPU as its name alone, which every reader takes; merge's host entry took only objects."""
    source, target = tmp_path / "s.db", tmp_path / "t.db"
    two_runs(source)
    two_runs(target)
    edit_store(source, "UPDATE runs SET env=json_set(env, '$.hostname', 'other', '$.gpus', json('[\"NVIDIA X\"]'))")
    res = invoke("merge", source, "--into", target)
    assert res.exit_code == 0, res.output
    (run,) = [r for r in Store(target, readonly=True).runs() if r["name"] == "A"]
    assert {"hostname": "other", "scheduler": {}, "gpus": [{"index": None, "name": "NVIDIA X", "uuid": None}]} \
        in run["env"]["hosts"]


def test_a_store_with_a_trigger_is_refused_untouched(tmp_path):
    """A trigger's RAISE made a cell's insert a traceback, after `run` had opened its run (left with no cells)."""
    db, other = tmp_path / "s.db", tmp_path / "o.db"
    two_runs(db)
    two_runs(other)
    con = sqlite3.connect(db)
    con.execute("CREATE TRIGGER tr AFTER INSERT ON cells BEGIN SELECT RAISE(ABORT, 'boom'); END")
    con.execute('CREATE TRIGGER "t\nx" AFTER DELETE ON runs BEGIN SELECT 1; END')  # a name of two lines
    con.commit()
    con.close()
    before = digest(tmp_path)
    for args in (["run", "--model", "bert-tiny", "--batch", "1", "--seq", "8", "--device", "cpu", "--db", db],
                 ["runs", "--db", db], ["compare", "A", "B", "--db", db], ["merge", other, "--into", db],
                 ["merge", db, "--into", other]):
        refused(invoke(*args), f"store {db} holds triggers ('tr', 't\\nx'), which no transbench store has")
    assert digest(tmp_path) == before


def test_a_marked_file_without_our_tables_is_refused_untouched(tmp_path):
    """The application_id alone made a file 'ours': its first query failed with a traceback, after a writer
    had switched its journal to WAL (its header bytes changed)."""
    path = tmp_path / "marked.db"
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA application_id={store_db.APP_ID}")
    con.execute(f"PRAGMA user_version={store_db.SCHEMA_VERSION}")
    con.execute("CREATE TABLE runs (x)")
    con.commit()
    con.close()
    good = tmp_path / "good.db"
    two_runs(good)
    before = digest(tmp_path)
    for args in (["runs", "--db", path], ["compare", "A", "B", "--db", path], ["merge", path, "--into", good],
                 ["merge", good, "--into", path]):
        refused(invoke(*args), f"store {path} is damaged", "not laid out as a transbench store's")
    assert digest(tmp_path) == before


RUNS_COLUMNS = "run_id TEXT PRIMARY KEY, name TEXT UNIQUE NOT NULL, kind TEXT NOT NULL, created TEXT NOT NULL, " \
               "spec TEXT NOT NULL, env TEXT NOT NULL"
# Tables with our columns, laid out otherwise: each was read as a store, and then a traceback, a misread or a loss.
LAYOUTS = {
    "without rowid": f"CREATE TABLE runs ({RUNS_COLUMNS}) WITHOUT ROWID",  # reads ordered by rowid: a traceback
    "a check": f"CREATE TABLE runs ({RUNS_COLUMNS}, CHECK (kind != 'serve'))",  # a merge's insert was ignored
    "no keys": "CREATE TABLE runs (run_id TEXT, name TEXT, kind TEXT, created TEXT, spec TEXT, env TEXT)",
    "virtual": "CREATE VIRTUAL TABLE runs USING fts5(run_id, name, kind, created, spec, env)",
}


@pytest.mark.parametrize("layout", [*LAYOUTS, "generated column", "an index"])
def test_our_tables_laid_out_otherwise_are_refused_untouched(tmp_path, layout):
    """A merge into a store with a unique index on cells(status) replaced stored cells, exit 0; a hidden generated
    column was read as the count of cells; a table WITHOUT ROWID was a traceback in every reader."""
    path, good = tmp_path / "odd.db", tmp_path / "good.db"
    two_runs(path)
    two_runs(good)
    con = sqlite3.connect(path)
    if layout in LAYOUTS:
        con.execute("PRAGMA legacy_alter_table=ON")  # cells keep referring to `runs`
        con.execute("ALTER TABLE runs RENAME TO old_runs")
        con.execute(LAYOUTS[layout])
        con.execute("INSERT INTO runs SELECT run_id, name, kind, created, spec, env FROM old_runs")
        con.execute("DROP TABLE old_runs")
    elif layout == "generated column":
        con.execute("ALTER TABLE runs ADD COLUMN g INTEGER GENERATED ALWAYS AS (99) VIRTUAL")
    else:
        con.execute("CREATE INDEX ix ON cells(status)")
    con.commit()
    con.close()
    before = digest(tmp_path)
    for args in (["runs", "--db", path], ["compare", "A", "B", "--db", path], ["merge", path, "--into", good],
                 ["merge", good, "--into", path]):
        refused(invoke(*args), f"store {path} is damaged", "not laid out as a transbench store's")
    assert digest(tmp_path) == before


@pytest.mark.parametrize("column,sql", [
    ("name", "UPDATE runs SET name=CAST(x'41ff' AS TEXT) WHERE name='A'"),
    ("record", "UPDATE cells SET record=CAST(x'7b22ff223a317d' AS TEXT) WHERE rowid=1"),
])
def test_text_that_is_not_utf8_is_damage_in_one_line(tmp_path, column, sql):
    path, good = tmp_path / "s.db", tmp_path / "good.db"
    two_runs(path)
    two_runs(good)
    edit_store(path, sql)
    before = digest(tmp_path)
    listing = [["runs", "--db", path]] if column == "name" else []  # `runs` reads no record
    for args in (*listing, ["compare", "A", "B", "--db", path], ["merge", path, "--into", good],
                 ["merge", good, "--into", path], ["report", "A", "B", "--db", path, "--out", tmp_path / "r"]):
        refused(invoke(*args), f"store {path} is damaged: a value of column '{column}' is not UTF-8 text")
    assert digest(tmp_path) == before


def test_a_marked_file_with_no_tables_yet_is_started_by_a_writer(tmp_path):
    """A writer killed between marking a new file and creating its tables left a marked file that every later
    writer took for a whole store, and failed on."""
    path = tmp_path / "half.db"
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA application_id={store_db.APP_ID}")
    con.commit()
    con.close()
    s = Store(path)
    s.create_run("x", "inference", {}, {})
    s.close()
    assert [r["name"] for r in api.runs(str(path))] == ["x"]


# --- names ---------------------------------------------------------------------------------------------------

def test_a_name_that_is_not_utf8_is_no_run_and_never_stored(tmp_path):
    """A shell passes undecodable bytes as lone surrogates: find_run and create_run raised UnicodeEncodeError."""
    db = tmp_path / "s.db"
    two_runs(db)
    before = digest(tmp_path)
    refused(invoke("compare", "A", "b\udcff", "--db", db), "no run 'b\\udcff'")
    refused(invoke("report", "\udcff", "--db", db, "--out", tmp_path / "out"), "no run '\\udcff'")
    new = tmp_path / "new.db"
    refused(invoke("run", "--model", "bert-tiny", "--device", "cpu", "--db", new, "--name", "a\udcffb"),
            "is not UTF-8 text")
    assert not new.exists()  # refused before the store was created
    assert digest(tmp_path) == before


def test_a_name_never_stands_for_another_run(tmp_path):
    """A new run named like another run's id (12 hex digits) resumed that other run and stored its cells
    there; a reference to such a name found the other run."""
    db = tmp_path / "s.db"
    make_run(str(db), "first", [(cell("eager", 1), ok_result(samples(10.0), 1))], spec={"batches": [1]})
    first_id = hashlib.sha256(b"first").hexdigest()[:12]
    store = Store(db)
    try:
        run_id, name, done = open_run(store, "inference", {"batches": [1]}, first_id, lambda: {})
        assert (name, done) == (first_id, 0) and run_id != first_id
        assert open_run(store, "inference", {"batches": [1]}, "last", lambda: {})[1] == "last"  # not the newest
        assert store.find_run(first_id)["run_id"] == run_id  # the name wins over the other run's id
        assert store.find_run("first")["run_id"] == first_id
    finally:
        store.close()



def test_runs_spec_takes_a_name_before_another_runs_id(tmp_path):
    """`runs --spec REF` matched ids and names in store order: the run named like another run's id printed the
    other run's spec."""
    db = tmp_path / "s.db"
    make_run(str(db), "first", [(cell("eager", 1), ok_result(samples(10.0), 1))], spec={"batches": [1]})
    first_id = hashlib.sha256(b"first").hexdigest()[:12]
    make_run(str(db), first_id, [(cell("eager", 7), ok_result(samples(10.0), 7))], spec={"batches": [7]})
    for ref, batch in ((first_id, 7), ("first", 1), ("last", 7)):
        res = invoke("runs", "--spec", ref, "--db", db)
        assert res.exit_code == 0 and f"- {batch}\n" in res.output, (ref, res.output)


def test_resume_of_a_name_no_run_has_is_refused_though_it_is_another_runs_id(tmp_path):
    """`run --resume --name X` looked X up as a reference: X another run's id found that run, and a new run named
    X was measured, exit 0, where no run of that name could be resumed."""
    db = tmp_path / "s.db"
    run_id = make_run(str(db), "first", [(cell("eager", 1), ok_result(samples(10.0), 1))], spec={"batches": [1]})
    before = digest(tmp_path)
    refused(invoke("run", "--model", "bert-tiny", "--device", "cpu", "--db", db, "--resume",
                   "--name", run_id), "nothing to resume")
    assert digest(tmp_path) == before


def test_a_run_read_back_by_its_id_is_never_the_run_named_like_that_id(tmp_path):
    """The records of a run that was written or looked up were read back through its id as a reference, and a name
    wins over an id: where another run was named like that id, `run` printed and exported (--json) that other
    run's cells as its own, and compare and report of the run ended in a traceback (records and cells of two runs)
    or read the other run's figures."""
    db = tmp_path / "s.db"
    first_id = hashlib.sha256(b"first").hexdigest()[:12]
    make_run(str(db), first_id, [(cell("eager", 1), ok_result(samples(10.0), 1)),
                                 (cell("eager", 7), ok_result(samples(10.0), 7))], spec={"batches": [1, 7]})
    assert make_run(str(db), "first", [(cell("eager", 1), ok_result(samples(10.0), 1))],
                    spec={"batches": [1]}) == first_id
    store = Store(db, readonly=True)
    try:
        from transbench.store import export
        assert [r["batch_size"] for r in export.records(store, [first_id], by_id=True)] == [1]
        assert [r["name"] for r in export.runs_of([{"run_id": first_id}], str(db))] == ["first"]
    finally:
        store.close()
    res = invoke("compare", "first", first_id, "--db", db, "--json", tmp_path / "c.json")
    assert res.exit_code == 0, res.output
    compared = json.loads((tmp_path / "c.json").read_text())
    assert [c["verdict"] for c in compared["cells"]] == ["same"] and len(compared["unmatched"]) == 1
    assert invoke("report", "first", "--db", db, "--out", tmp_path / "r").exit_code == 0


@pytest.mark.parametrize("kind, spec, command, wrong", [
    ("inference", {"batches": [1]}, "run", ["serve"]),
    ("serve", {"model": "bert-tiny", "backends": ["sdpa"], "rates": [5.0]}, "serve", ["run"]),
    ("training", {"model": "bert-tiny", "batches": [2]}, "train", ["serve"]),
    ("micro", {"micro": "gemm", "sizes": [64]}, "micro gemm", ["train"]),  # the sub-command its `micro` key names
])
def test_runs_spec_on_stdout_is_the_file_it_writes_and_names_its_command(tmp_path, kind, spec, command, wrong):
    """`runs --spec X` printed no first line naming the kind of run (and a serve, train or micro spec as JSON), so
    `runs --spec X > s.yaml` given to another command's --spec was refused for its unknown keys instead of in one
    line naming the command it belongs to. stdout is the text `--out f.yaml` writes, mark and all."""
    db, written, redirected = tmp_path / "s.db", tmp_path / "f.yaml", tmp_path / "s.yaml"
    make_run(str(db), "r", [(cell("eager", 1), ok_result(samples(10.0), 1))], kind=kind, spec=spec)
    printed = invoke("runs", "--spec", "r", "--db", db)
    assert printed.exit_code == 0, printed.output
    assert invoke("runs", "--spec", "r", "--db", db, "--out", written).exit_code == 0
    assert printed.stdout == written.read_text() and printed.stdout.startswith("# written by transbench runs")
    redirected.write_text(printed.stdout)
    refused(invoke(*wrong, "--spec", redirected, "--db", tmp_path / "t.db"), f"written from a", f"{kind} run",
            f"`transbench {command} --spec`")


# --- merge ---------------------------------------------------------------------------------------------------

def test_merge_refuses_a_run_of_that_name_with_another_grid_or_kind(tmp_path):
    """Named runs share an id, so merge joined another grid's (or another kind's) cells into a run."""
    target, other, train, shard = (tmp_path / n for n in ("t.db", "o.db", "k.db", "s2.db"))
    make_run(str(target), "S", [(cell("eager", 1), ok_result(samples(10.0), 1))],
             spec={"batches": [1, 2], "shard": "1/2", "timeout": 10})
    make_run(str(other), "S", [(cell("eager", 1, seq=16), ok_result(samples(10.0), 1))],
             spec={"batches": [1, 2], "seqs": [16], "shard": "1/2"})
    make_run(str(train), "S", [(cell("eager", 4), ok_result(samples(10.0), 4))], kind="training",
             spec={"batches": [1, 2], "shard": "1/2", "timeout": 10})
    before = digest(tmp_path)
    refused(invoke("merge", other, "--into", target), "another run than the one of that name", "seqs [16] vs null")
    refused(invoke("merge", train, "--into", target), "kind training vs inference")
    assert digest(tmp_path) == before
    # the other shard of the same sweep (another --shard, another --timeout) still joins
    make_run(str(shard), "S", [(cell("eager", 2), ok_result(samples(20.0), 2))],
             spec={"batches": [1, 2], "shard": "2/2", "timeout": 99})
    res = invoke("merge", shard, "--into", target)
    assert res.exit_code == 0 and "0 new run(s), 1 new cell(s)" in res.output, res.output


def test_merge_refuses_a_run_named_last(tmp_path):
    """`run` refuses the name 'last' (every command reads it as the newest run); a hand-made store's run of that name
    was merged, and `compare last` then read another run."""
    target, other = tmp_path / "t.db", tmp_path / "o.db"
    make_run(str(target), "A", [(cell("eager", 1), ok_result(samples(10.0), 1))])
    make_run(str(other), "last", [(cell("eager", 1), ok_result(samples(10.0), 1))])
    before = digest(tmp_path)
    refused(invoke("merge", other, "--into", target), "a run named 'last'", "nothing was merged")
    assert digest(tmp_path) == before


def test_merge_refuses_one_run_under_two_names_and_shards_of_other_library_versions(tmp_path):
    """A run renamed in one copy joined its cells to the other name's run, exit 0; a shard that ran another torch
    mixed two versions' cells under one environment."""
    import sqlite3

    target, renamed, old = (tmp_path / n for n in ("t.db", "r.db", "v.db"))
    env = {"torch": "2.13.0", "transformers": "5.24.0", "gpus": []}
    make_run(str(target), "S", [(cell("eager", 1), ok_result(samples(10.0), 1))], spec={"batches": [1, 2]}, env=env)
    make_run(str(renamed), "S", [(cell("eager", 2), ok_result(samples(20.0), 2))], spec={"batches": [1, 2]}, env=env)
    with sqlite3.connect(renamed) as conn:
        conn.execute("UPDATE runs SET name = 'Q'")
    conn.close()
    make_run(str(old), "S", [(cell("eager", 2), ok_result(samples(20.0), 2))], spec={"batches": [1, 2]},
             env={**env, "torch": "2.1.0"})
    before = digest(tmp_path)
    refused(invoke("merge", renamed, "--into", target), "has the id of run 'S'", "one run under two names")
    refused(invoke("merge", old, "--into", target), "another run than the one of that name", "torch 2.1.0 vs 2.13.0")
    assert digest(tmp_path) == before


def test_cells_of_a_run_the_store_does_not_list_are_damage_to_every_reader(tmp_path):
    """merge alone refused them; `runs --out` exported the other cells, exit 0, and `report` called them unmatched."""
    db = tmp_path / "o.db"
    make_run(str(db), "a", [(cell("eager", 1), ok_result(samples(10.0), 1))])
    make_run(str(db), "b", [(cell("eager", 1), ok_result(samples(11.0), 1))])
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM runs WHERE name = 'b'")
    conn.close()
    into = tmp_path / "into.db"
    make_run(str(into), "c", [(cell("eager", 2), ok_result(samples(20.0), 2))])
    before = digest(tmp_path)
    for args in (["runs", "--db", db, "--out", tmp_path / "r.json"], ["runs", "--db", db],
                 ["report", "a", "--db", db, "--out", tmp_path / "rep"], ["merge", db, "--into", into]):
        refused(invoke(*args), "is damaged", "which it does not list")
    assert digest(tmp_path) == before


def test_a_refused_merge_of_several_sources_writes_nothing(tmp_path):
    """Sources were merged one by one: the first was in the target before the second was refused (exit 2, the
    target changed), and a new target was left behind empty when a source was refused."""
    first, clash, target = (tmp_path / n for n in ("a.db", "b.db", "t.db"))
    make_run(str(first), "S", [(cell("eager", 1), ok_result(samples(10.0), 1))], spec={"seqs": [8]})
    make_run(str(clash), "S", [(cell("eager", 1, seq=16), ok_result(samples(10.0), 1))], spec={"seqs": [16]})
    make_run(str(target), "T", [(cell("eager", 2), ok_result(samples(20.0), 2))])
    before = digest(tmp_path)
    refused(invoke("merge", first, clash, "--into", target), "another run than the one of that name",
            "seqs [16] vs [8]")
    assert digest(tmp_path) == before
    new = tmp_path / "new.db"
    refused(invoke("merge", first, clash, "--into", new), "another run than the one of that name")
    assert not new.exists() and digest(tmp_path) == before


# --- compare ------------------------------------------------------------------------------------------------

def test_compare_does_not_judge_one_machine_against_another(tmp_path):
    """A cpu run against a cuda run (or an A100 against an H100) was paired cell by cell: `faster` one way,
    `slower` (exit 1) the other, with no word that the machines differed."""
    db = tmp_path / "s.db"
    c = cell("eager", 1)
    make_run(str(db), "cpu", [(c, ok_result(samples(10.0), 1)), (cell("eager", 2), bad_result("error", "x"))])
    make_run(str(db), "h100", [(replace(c, device="cuda"), ok_result(samples(1.0), 1, gpu="NVIDIA H100")),
                               (replace(cell("eager", 2), device="cuda"), bad_result("error", "x"))])
    make_run(str(db), "a100", [(replace(c, device="cuda:1"), ok_result(samples(1.0), 1, gpu="NVIDIA A100")),
                               (replace(cell("eager", 2), device="cuda"), bad_result("error", "x"))])
    make_run(str(db), "h100-again", [(replace(c, device="cuda:1"), ok_result(samples(1.5), 1, gpu="NVIDIA H100"))])
    before = digest(tmp_path)
    for a, b, says in (("cpu", "h100", "B ran it on cuda (NVIDIA H100), A on cpu"),
                       ("h100", "cpu", "B ran it on cpu, A on cuda (NVIDIA H100)"),
                       ("h100", "a100", "B ran it on cuda (NVIDIA A100), A on cuda (NVIDIA H100)")):
        refused(invoke("compare", a, b, "--db", db), "ran on other hardware", says)
    assert digest(tmp_path) == before
    res = invoke("compare", "h100", "h100-again", "--db", db)  # another GPU index of the same model: compared
    assert res.exit_code == 1 and "1 slower" in res.output, res.output


def test_compare_does_not_judge_cpu_cells_of_other_thread_counts(tmp_path):
    """A CPU run of 1 thread against one of 2 (`--threads`) was paired cell by cell and judged `slower` or
    `faster` for the cores each was given, without a word."""
    db = tmp_path / "s.db"
    c = cell("eager", 1)
    make_run(str(db), "one", [(c, ok_result(samples(10.0), 1, threads=1))])
    make_run(str(db), "two", [(c, ok_result(samples(6.0), 1, threads=2))])
    make_run(str(db), "two-again", [(c, ok_result(samples(6.1), 1, threads=2))])
    before = digest(tmp_path)
    refused(invoke("compare", "one", "two", "--db", db), "ran on other hardware",
            "B ran it on cpu with 2 threads, A on cpu with 1 thread")
    assert digest(tmp_path) == before
    res = invoke("compare", "two", "two-again", "--db", db)  # the same threads: compared
    assert res.exit_code in (0, 1) and "ran on other hardware" not in res.output, res.output


def test_min_effect_out_of_range_says_the_range(tmp_path):
    db = tmp_path / "s.db"
    two_runs(db)
    refused(invoke("compare", "A", "B", "--db", db, "--min-effect", "10"), "below 10")


# --- resume ---------------------------------------------------------------------------------------------------

def test_resume_without_a_name_refuses_options_it_would_ignore(tmp_path):
    """`run --resume --batch 1,4` resumed the newest run with its own grid (batch 1), measured nothing, and said
    "resumed"."""
    db = tmp_path / "s.db"
    spec = grid.validate(RunSpec(models=["bert-tiny"], backends=["eager"], batches=[1], seqs=[8], device="cpu",
                                 min_time=0.01, warmup=1))
    make_run(str(db), "inference-old", [(c, ok_result(samples(10.0), c.batch)) for c in grid.expand(spec)],
             spec=api.spec_to_store(spec))
    (tmp_path / "sweep.yaml").write_text("batches: [1, 2]\n")
    before = digest(tmp_path)
    refused(invoke("run", "--resume", "--batch", "1,4", "--db", db), "'inference-old'", "batches [1] -> [1, 4]")
    refused(invoke("run", "--resume", "--spec", tmp_path / "sweep.yaml", "--db", db), "batches [1] -> [1, 2]")
    assert digest(tmp_path) == before
    res = invoke("run", "--resume", "--batch", "1", "--device", "cpu", "--db", db)  # the same options: resumed
    assert res.exit_code == 0 and "(resumed)" in res.output, res.output


@pytest.mark.parametrize("edit,says", [("json_set(cell, '$.batch', '1')", 'a Cell whose batch is "1", not int'),
                                       ("json_set(cell, '$.batch', json('null'))",
                                        "a Cell whose batch is null, not int"),
                                       ("json_set(cell, '$.seq', 8.5)", "a Cell whose seq is 8.5, not int")])
def test_a_resume_refuses_a_stored_cell_of_the_wrong_field_types(tmp_path, edit, says):
    """An `oom` cell whose `cell` column was edited to batch "1": the resume that skips larger batches compared it with
    numbers, a TypeError traceback, exit 1."""
    db = tmp_path / "s.db"
    spec = grid.validate(RunSpec(models=["bert-tiny"], backends=["eager"], batches=[1, 2], seqs=[8], device="cpu",
                                 min_time=0.01, warmup=1, name="r"))
    cells = grid.expand(spec)
    make_run(str(db), "r", [(cells[0], CellResult("oom", error="out of memory")),
                            (cells[1], CellResult("error", error="killed"))], spec=api.spec_to_store(spec))
    edit_store(db, f"UPDATE cells SET cell={edit} WHERE status='oom'")
    before = digest(tmp_path)
    refused(invoke("run", "--model", "bert-tiny", "--backend", "eager", "--batch", "1,2", "--seq", "8", "--device",
                   "cpu", "--min-time", "0.01", "--warmup", "1", "--name", "r", "--db", db),
            f"store {db} is damaged: the cell of cell 'backend eager, batch 1", says)
    assert digest(tmp_path) == before


def test_resume_says_a_bad_value_came_from_the_stored_spec(tmp_path):
    """`run --resume` of the newest run whose stored spec holds threads -5 said `--threads must be between 1 and
    4096`, an option the user never typed."""
    db = tmp_path / "s.db"
    spec = grid.validate(RunSpec(models=["bert-tiny"], backends=["eager"], batches=[1], seqs=[8], device="cpu",
                                 min_time=0.01, warmup=1))
    make_run(str(db), "inference-old", [(c, ok_result(samples(10.0), c.batch)) for c in grid.expand(spec)],
             spec=api.spec_to_store(spec))
    edit_store(db, "UPDATE runs SET spec=json_set(spec, '$.threads', -5)")
    before = digest(tmp_path)
    refused(invoke("run", "--resume", "--db", db), "cannot resume run 'inference-old' with the spec stored with it:",
            "--threads")
    assert digest(tmp_path) == before


# --- a killed sweep's -wal file -----------------------------------------------------------------------------

def test_readers_leave_a_killed_sweeps_wal_file_as_it_is(tmp_path):
    """A reader's plain connection, the last to close, checkpointed the -wal file of a killed sweep into the
    store and deleted it: a refused `compare` rewrote the store's bytes."""
    db = tmp_path / "s.db"
    two_runs(db)
    code = (f"import os, sys; sys.path[:0] = [{str(ROOT / 'src')!r}, {str(ROOT / 'tests')!r}]\n"
            "from report_helpers import cell, ok_result\n"
            "from transbench.runner.sweep import store_result\n"
            "from transbench.store import Store\n"
            f"s = Store({str(db)!r})\n"
            "store_result(s, s.find_run('A')['run_id'], cell('eager', 4), ok_result([1.0] * 30, 4))\n"
            "os._exit(0)\n")  # killed: no close, no checkpoint
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert os.path.getsize(f"{db}-wal") > 0
    before = digest(tmp_path)
    refused(invoke("compare", "A", "nope", "--db", db), "no run 'nope'")
    res = invoke("runs", "--db", db)
    assert res.exit_code == 0 and " 3 " in res.output, res.output  # the cell in the -wal file is read
    assert digest(tmp_path) == before


def test_a_run_is_not_resumed_on_another_device_type(tmp_path):
    """A run's stored spec says `--device auto`: killed on a GPU host and resumed where no GPU is visible, it had
    the same grid and measured its other cells on the CPU, into the same run."""
    db = tmp_path / "s.db"
    spec = grid.validate(RunSpec(models=["bert-tiny"], backends=["eager"], batches=[1, 2], seqs=[8], device="auto",
                                 min_time=0.01, warmup=1, name="gpu-run"))
    gpu_cell = replace(grid.expand(spec)[0], device="cuda")  # as the GPU host expanded it
    make_run(str(db), "gpu-run", [(gpu_cell, ok_result(samples(1.0), 1, gpu="NVIDIA H100"))],
             spec=api.spec_to_store(spec))
    before = digest(tmp_path)
    refused(invoke("run", "--model", "bert-tiny", "--backend", "eager", "--batch", "1,2", "--seq", "8",
                   "--min-time", "0.01", "--warmup", "1", "--name", "gpu-run", "--db", db),
            "stored cells ran on cuda", "would run on cpu here")
    assert digest(tmp_path) == before


def test_a_run_made_meanwhile_by_another_process_is_resumed(tmp_path, monkeypatch):
    """Two shards started at once into one --db with one --name: both looked the name up, found nothing, and the
    second one's insert raised sqlite3.IntegrityError (a traceback)."""
    db = tmp_path / "s.db"
    make_run(str(db), "sweep", [(cell("eager", 1), ok_result(samples(10.0), 1))], spec={"batches": [1, 2]})
    store = Store(db)
    looked = []

    def late(self, name):  # the other process inserts right after this process looked
        looked.append(name)
        if len(looked) == 1:
            return None
        row = self.conn.execute("SELECT run_id, name, kind, spec FROM runs WHERE name=?", (name,)).fetchone()
        return {"run_id": row[0], "name": row[1], "kind": row[2], "spec": json.loads(row[3])}

    monkeypatch.setattr(Store, "run_named", late, raising=False)
    monkeypatch.setattr(Store, "find_run", late)  # the look-up by name, whichever open_run uses
    try:
        run_id, name, done = open_run(store, "inference", {"batches": [1, 2], "shard": "2/2"}, "sweep", lambda: {})
    finally:
        store.close()
    assert (run_id, name, done) == (hashlib.sha256(b"sweep").hexdigest()[:12], "sweep", 1)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_a_store_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path):
    """A FIFO as --db blocked the header read for ever (readers and writers); /dev/null read as an empty file,
    and `merge --into /dev/null` then made /dev/null-journal."""
    import signal

    fifo = tmp_path / "pipe.db"
    os.mkfifo(fifo)
    good = tmp_path / "good.db"
    two_runs(good)

    def hung(*_):
        raise TimeoutError("blocked on the FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        for args in (["runs", "--db", fifo], ["compare", "A", "B", "--db", fifo], ["merge", good, "--into", fifo],
                     ["merge", fifo, "--into", tmp_path / "t.db"]):
            refused(invoke(*args), f"store {fifo} is not a regular file")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.db", "pipe.db"]


@pytest.mark.parametrize("name,says", [(":memory:", "is SQLite's name for a database that is not a plain file"),
                                       ("file:x.db", "is SQLite's name for a database that is not a plain file"),
                                       ("s.db/", "ends in a folder separator: give a file path, e.g. --db"),
                                       ("s.db/.", "ends in '.', which names a folder: give a file path, e.g. "
                                                  "--db s.db"),
                                       ("s.db/..", "ends in '..', which names a folder"),
                                       ("s.db-wal", "is named as SQLite names the side files of a store (-wal)"),
                                       ("s.db-journal", "(-journal): SQLite would delete or rewrite it when"),
                                       ("new.db-shm", "(-shm)")])
def test_a_store_name_sqlite_reads_otherwise_is_refused(tmp_path, monkeypatch, name, says):
    """`merge --into :memory:` said it merged and kept nothing; `--into s.db-journal` was deleted by SQLite at the next
    write to s.db; `--db s.db/` made a new s.db beside its refusal."""
    monkeypatch.chdir(tmp_path)
    two_runs(tmp_path / "s.db")
    source = tmp_path / "src.db"
    two_runs(source)
    before = digest(tmp_path)
    for args in (["merge", source, "--into", name], ["runs", "--db", name], ["compare", "A", "B", "--db", name]):
        refused(invoke(*args), says)
    assert digest(tmp_path) == before


def test_an_unnamed_run_whose_name_cannot_be_held_writes_nothing(tmp_path, monkeypatch):
    """Its run row was inserted before its name's lock was taken: a lock refused left an empty run, exit 2."""
    db = tmp_path / "s.db"
    two_runs(db)
    before = digest(tmp_path)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "no-such-folder"))
    for store in (db, tmp_path / "new.db"):
        refused(invoke("run", "--model", "bert-tiny", "--backend", "eager", "--batch", "1", "--seq", "8", "--device",
                       "cpu", "--db", store), "cannot lock run 'inference-", "check that folder's permissions")
    assert digest(tmp_path) == before


@pytest.mark.slow
def test_a_shard_counts_only_its_own_stored_cells(tmp_path, quick):
    """Two shards of one run in one store: the second said "resuming: 2 of 2 cells already stored" (its sibling's
    cells) before running all of its own."""
    db = str(tmp_path / "s.db")

    def spec(i):
        return RunSpec(models=["bert-tiny"], backends=["sdpa"], batches=[1, 2], seqs=[8, 16], shard=f"{i}/2",
                       name="sharded", **quick)
    sizes = [len(grid.expand(grid.validate(spec(i)))) for i in (1, 2)]
    assert all(sizes)
    seen = []
    for i in (1, 2):
        assert not api.run(spec(i), db, on_start=lambda cells, done: seen.append((len(cells), done))).resumed
    assert seen == [(sizes[0], 0), (sizes[1], 0)]
    assert api.run(spec(2), db, on_start=lambda cells, done: seen.append((len(cells), done))).resumed
    assert seen[-1] == (sizes[1], sizes[1])


_JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                     max_size=3), max_leaves=5)


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from(["batch", "seq", "seq_stdev", "model", "embeddings", "activation", "new_tokens"]),
       value=_JSONISH)
def test_a_stored_cell_field_of_any_value_reads_back_or_is_named(field, value):
    """Store.cells(run_id, Cell) checks the `cell` column against the fields' types: any value either builds a cell
    whose field has its declared type, or is named in the one line of damage."""
    import typing

    from transbench.cells import Cell, _fits, _members

    stored = {**cell("eager", 1).to_dict(), field: value}
    problem = Cell.field_problem(stored)
    hint = typing.get_type_hints(Cell)[field]
    if problem is None:
        assert _fits(value, hint), (field, value)
    else:
        assert f"whose {field} is" in problem and any(getattr(t, "__name__", "") in problem for t in _members(hint))


@settings(max_examples=60, deadline=None)
@given(stem=st.text(alphabet="abcdefgh_-.0123", min_size=1, max_size=12),
       tail=st.sampled_from(["-wal", "-shm", "-journal", "/", "/.", "/.."]))
def test_any_store_name_sqlite_reads_as_another_file_is_refused_in_one_line(tmp_path_factory, stem, tail):
    """A store named as SQLite names a store's side files, or ending in a folder separator (or in /. or /..): SQLite
    deleted, rewrote or opened another file than the one named. Refused before anything is made."""
    folder = tmp_path_factory.mktemp("names")
    name = str(folder / stem) + tail
    res = invoke("runs", "--db", name)
    refused(res, f"store {name}")
    assert list(folder.iterdir()) == []


_BAD_TEXT = st.one_of(
    st.sampled_from(["nan", "-inf", "1e400", "9" * 30, "-1", "\x00", "٣", "1\u202e2", "x" * 5000, "", " ", "2^99"]),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=8))
_OPTIONS = [("run", "--batch"), ("run", "--seq"), ("run", "--seq-stdev"), ("run", "--timeout"), ("run", "--seed"),
            ("run", "--name"), ("run", "--model"), ("serve", "--rate"), ("serve", "--max-wait-ms"),
            ("serve", "--slo-ms"), ("micro gemm", "--sizes"), ("micro gemm", "--tokens"), ("train", "--lr")]
_SPEC_VALUES = st.one_of(st.none(), st.booleans(), st.floats(), st.integers(min_value=-2**80, max_value=2**80),
                         st.text(max_size=6), st.lists(st.one_of(st.none(), st.booleans(), st.floats()), max_size=2),
                         st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))


@settings(max_examples=60, deadline=None)
@given(where=st.sampled_from(_OPTIONS), value=_BAD_TEXT, key=st.sampled_from(["batches", "seqs", "timeout", "seed",
                                                                               "name", "seq_stdev", "models"]),
       spec_value=_SPEC_VALUES, in_file=st.booleans())
def test_any_refused_setting_leaves_the_store_readable_and_unchanged(tmp_path_factory, where, value, key, spec_value,
                                                                    in_file):
    """A refused run may not write a row (an error record rebuilt from its bad setting) that later makes `runs`,
    `report`, `compare` or `merge` refuse the store: odd unicode, NaN, huge integers, long text, NUL bytes on the
    command line, or a value of the wrong type in a spec file. A value that is taken reaches the sweep, which stops
    there (nothing is measured), and is left out."""
    from hypothesis import assume

    import importlib

    folder = tmp_path_factory.mktemp("refused")
    db = folder / "t.db"
    two_runs(db)
    before = digest(folder)

    def reached(*args, **kwargs):
        raise AssertionError("reached the sweep")

    with pytest.MonkeyPatch.context() as patch:
        for name in ("runner.sweep", "scenarios.serve.run", "scenarios.inference.run", "scenarios.micro.run"):
            patch.setattr(importlib.import_module(f"transbench.{name}"), "open_run", reached)
        if in_file:
            spec = folder / "s.json"
            spec.write_text(json.dumps({key: spec_value}))
            res = invoke("run", "--spec", spec, "--db", db, "--device", "cpu")
        else:
            res = invoke(*where[0].split(), f"{where[1]}={value}", "--db", db)
    assume(res.exit_code != 1 or "reached the sweep" not in repr(res.exception))
    refused(res)
    if in_file:
        spec.unlink()
    assert digest(folder) == before
    for command in (["runs", "--db", db], ["compare", "A", "B", "--db", db]):
        assert invoke(*command).exit_code in (0, 1), command  # 1: compare's verdict, never a refusal (2)
    store = Store(str(db), readonly=True)
    try:
        assert [len(store.cells(r["run_id"])) for r in store.runs()] == [2, 2]
    finally:
        store.close()
