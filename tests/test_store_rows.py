"""Rows of a store of ours that hold what no transbench writes (edited by hand, half written by another program):
every command that reads them refuses in one line naming the store, exit 2, and leaves every file as it was; a
merge copies none of it. What transbench writes (store.db: Store.put_cell through sweep.store_result) is read."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path

import pytest
from report_helpers import judged_pairs, make_run, ok_result
from test_store_guard import invoke, one_line_error

from transbench import api
from transbench.keys import STATUSES
from transbench.scenarios.inference import cells as grid
from transbench.scenarios.inference.spec import RunSpec
from transbench.store import Store
from transbench.store import db as store_db

# A grid `run --resume` repeats as it is: its cells are all stored, so a resume measures nothing and only reads.
SPEC = grid.validate(RunSpec(models=["bert-tiny"], backends=["eager"], batches=[1, 2], seqs=[8], device="cpu",
                             min_time=0.01, warmup=1))


def samples(median: float, n: int = 40) -> list[float]:
    return [median * (1 + 0.01 * ((i * 7) % 5 - 2)) for i in range(n)]


def digest(folder: Path) -> dict:
    """sha256 of every file (SQLite's -shm index is shared memory, not the store)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.endswith("-shm")}


def two_runs(db: Path, a=samples(10.0), b=samples(10.0)) -> None:
    """Runs B, then A (the newest: the run `run --resume` takes up), of the same two cells."""
    for name, s in (("B", b), ("A", a)):
        make_run(str(db), name, [(c, ok_result(s, c.batch)) for c in grid.expand(SPEC)],
                 spec=api.spec_to_store(SPEC))


A_CELL = "rowid = (SELECT MIN(c.rowid) FROM cells c JOIN runs r ON c.run_id = r.run_id WHERE r.name = 'A')"


def _record(**changes):
    """Sets record keys of A's first cell, written as Python's json writes them (NaN and Infinity included)."""
    def damage(con):
        (text,) = con.execute(f"SELECT record FROM cells WHERE {A_CELL}").fetchone()
        con.execute(f"UPDATE cells SET record = ? WHERE {A_CELL}", (json.dumps({**json.loads(text), **changes}),))
    return damage


def _sql(statement):
    return lambda con: con.execute(statement)


BIG = "9" * 400  # json reads it as an int that no float holds

# damage -> (how, what the one line says, whether it is in a run's row: plain `runs` reads only those)
DAMAGE = {
    "negative samples": (_sql(f"UPDATE cells SET samples = '[-1, -2, -3]' WHERE {A_CELL}"),
                         ["the samples of cell 'backend eager", "a negative time (-1 ms)"], False),
    "a sample of 400 digits": (_sql(f"UPDATE cells SET samples = '[1.0, {BIG}]' WHERE {A_CELL}"),
                               ["the samples of cell", "something other than finite numbers"], False),
    "status not one transbench writes": (_sql(f"UPDATE cells SET status = 'bogus' WHERE {A_CELL}"),
                                         ["the status of cell", "'bogus', not one of ok, oom"], False),
    "status a number": (_sql(f"UPDATE cells SET status = 5 WHERE {A_CELL}"),  # TEXT affinity stores '5'
                        ["the status of cell", "'5', not one of"], False),
    "negative latency": (_record(latency_ms=-5), ["the record of cell", "latency_ms is -5, not a finite number of 0 "
                                                  "or more (ms)"], False),
    "infinite latency": (_record(latency_ms=float("inf")), ["latency_ms is inf"], False),
    "NaN throughput": (_record(throughput_per_s=float("nan")), ["throughput_per_s is nan"], False),
    "negative MFU": (_record(mfu=-0.5), ["mfu is -0.5, not a finite number of 0 or more (fraction)"], False),
    "a latency of 400 digits": (_sql(f"UPDATE cells SET record = replace(record, '\"latency_ms\": ', "
                                     f"'\"latency_ms\": {BIG}, \"was\": ') WHERE {A_CELL}"),
                                ["latency_ms is an integer too large for a number"], False),
    "key cut short": (_sql(f"UPDATE cells SET key = substr(key, 1, 20) WHERE {A_CELL}"),
                      ["the key of cell", "JSON cut short or edited"], False),
    "cell date a number": (_sql(f"UPDATE cells SET created = 5 WHERE {A_CELL}"),
                           ["the date of cell", "'5', not an ISO 8601 date"], False),
    "run date a number": (_sql("UPDATE runs SET created = 5 WHERE name = 'A'"),
                          ["the date of run 'A' is '5', not an ISO 8601 date"], True),
    "run kind not one transbench writes": (_sql("UPDATE runs SET kind = 'bogus' WHERE name = 'A'"),
                                           ["the kind of run 'A' is 'bogus', not one of inference, training"], True),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_row_transbench_never_writes_is_refused_by_every_reader_and_never_merged(tmp_path, damage):
    how, needles, run_row = DAMAGE[damage]
    db = tmp_path / "s.db"
    two_runs(db)
    con = sqlite3.connect(db)
    how(con)
    con.commit()
    con.close()
    target = tmp_path / "t.db"
    make_run(str(target), "T", [(grid.expand(SPEC)[0], ok_result(samples(5.0), 1))])
    before = digest(tmp_path)
    # plain `runs` reads the runs' rows only; its --out record reads every cell
    listing = ["runs", "--db", db] if run_row else ["runs", "--db", db, "--out", tmp_path / "all.json"]
    for args in (listing, ["compare", "A", "B", "--db", db], ["report", "A", "--db", db, "--out", tmp_path / "out"],
                 ["merge", db, "--into", target], ["run", "--resume", "--db", db]):
        one_line_error(invoke(*args), f"store {db} is damaged", *needles)
        assert digest(tmp_path) == before, args  # the store, the merge target: no byte changed, nothing written


def test_what_transbench_writes_is_read(tmp_path):
    """The checks refuse nothing the tool writes: every status, 0 ms samples, a key of no JSON form (Store.put_cell
    takes any text), figures with no unit that may be negative, and an unmarked store of this schema."""
    db = tmp_path / "s.db"
    two_runs(db)
    s = Store(db)
    run_id = s.find_run("A")["run_id"]
    for status in STATUSES:
        s.put_cell(run_id, f"plain key {status}", "inference", status,
                   {"latency_ms": 0.0, "speedup": -12.5, "similarity_spearman": -0.2, "loss_end": -1.0,
                    "activations_mb": -3.0, "temp_c": -5.0, "rel_err": float("inf")},
                   cell={}, samples=[0.0, 0.0, 1.5])
    s.close()
    assert len(api.records(str(db), ["A"])) == 2 + len(STATUSES)
    assert invoke("merge", db, "--into", tmp_path / "t.db").exit_code == 0
    res = invoke("compare", "A", "B", "--db", db)
    assert res.exit_code in (0, 1) and "Traceback" not in res.output, res.output


@pytest.mark.parametrize("extra, samples_ms, says", [
    ({"tokens_per_s": -12.75}, None, "tokens_per_s is -12.75, not a finite number of 0 or more"),
    ({"tpot_p50_ms": float("inf")}, None, "tpot_p50_ms is inf"),
    ({"model": 12345}, None, "model is a number, not text"),
    ({}, [1.0, float("nan")], "something other than finite numbers"),
    ({}, [1.0, -2.0], "a negative time (-2 ms)"),
])
def test_a_cell_the_store_would_refuse_is_kept_as_an_error_without_its_figures(tmp_path, extra, samples_ms, says):
    """What an endpoint answers reaches the record (its usage counts, its model's name): a figure the store refuses
    on reading, once written, made every later read of the whole store refuse it. The writer checks with the
    reader's rules (db.cell_problem): the cell is an error, the store stays readable."""
    db = tmp_path / "s.db"
    result = ok_result(samples(10.0), 1, **extra)
    if samples_ms is not None:
        result.samples_ms = samples_ms
    make_run(str(db), "A", [(grid.expand(SPEC)[0], result)])
    (rec,) = api.records(str(db), ["A"])
    assert rec["status"] == "error" and says in rec["error"] and rec.get("latency_ms") is None
    assert invoke("runs", "--db", db, "--out", tmp_path / "all.json").exit_code == 0


def test_a_negative_seed_is_stored_and_read_as_it_ran(tmp_path):
    """`--seed -1` is taken (any 64-bit integer seeds) and measured; its cell is kept ok with its seed, and the store
    stays readable: the seed was read back as a count, so the cell became an error whose record the reader refused,
    and every later `runs --out`, `report` and `merge` of the store with it."""
    db = tmp_path / "s.db"
    spec = grid.validate(RunSpec(models=["bert-tiny"], backends=["eager"], batches=[1], seqs=[8], device="cpu",
                                 min_time=0.01, warmup=1, seed=-1))
    make_run(str(db), "A", [(grid.expand(spec)[0], ok_result(samples(10.0), 1))])
    (rec,) = api.records(str(db), ["A"])
    assert rec["status"] == "ok" and rec["seed"] == -1
    assert invoke("runs", "--db", db, "--out", tmp_path / "all.json").exit_code == 0
    assert invoke("merge", db, "--into", tmp_path / "t.db").exit_code == 0


def test_a_figure_of_no_bound_that_is_not_finite_is_stored_as_none_and_exported_as_strict_json(tmp_path):
    """A cosine of NaN vectors (`reference_cosine_min`, a key with no declared bound) reached `runs --out f.json`
    as a bare NaN, which strict JSON readers refuse; stored and exported, an undefined figure is null."""
    db = tmp_path / "s.db"
    result = ok_result(samples(10.0), 1, reference_cosine_min=float("nan"), rel_err=float("inf"))
    result.info = {"cosines": [float("nan"), 1.0]}
    make_run(str(db), "A", [(grid.expand(SPEC)[0], result)])
    (rec,) = api.records(str(db), ["A"])
    assert rec["status"] == "ok" and rec["reference_cosine_min"] is None and rec["rel_err"] is None
    out = tmp_path / "all.json"
    assert invoke("runs", "--db", db, "--out", out).exit_code == 0
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the export"))


@pytest.mark.parametrize("n", [40, 12])  # blocks (rules 1-3), ranks (rule 4)
def test_samples_of_0_ms_are_no_interval_not_nan(tmp_path, n):
    """Both runs' block medians at 0 ms made the interval nan-nan, and compare said `same`. Every pair is n/a: the
    gate judged nothing, and compare refuses (exit 2) with the pairs' note."""
    db = tmp_path / "s.db"
    coarse = [0.0] * (n // 2) + [0.002] * (n - n // 2)
    two_runs(db, coarse, coarse)
    res = invoke("compare", "A", "B", "--db", db, "--json", tmp_path / "c.json")
    assert "Traceback" not in res.output and "nan" not in res.output and "RuntimeWarning" not in res.output, res.output
    assert res.exit_code == 2 and "no pair of cells got a verdict" in res.output and "samples of 0 ms" in res.output
    cmp = judged_pairs(db, "A", "B")
    for c in cmp.cells:
        assert c.verdict == "n/a" and c.interval is None and "samples of 0 ms" in c.note, c


def test_an_unmarked_store_of_a_newer_schema_is_not_written(tmp_path):
    """Only a marked file was checked for a newer schema: `run --db` wrote into an unmarked one and reset its
    user_version to 1."""
    path = tmp_path / "s.db"
    two_runs(path)
    con = sqlite3.connect(path)
    con.execute("PRAGMA application_id = 0")
    con.execute(f"PRAGMA user_version = {store_db.SCHEMA_VERSION + 1}")
    con.commit()
    con.close()
    head = path.read_bytes()[:100]
    assert int.from_bytes(head[68:72], "big") == 0 and int.from_bytes(head[60:64], "big") == 2
    before = digest(tmp_path)
    for args in (["run", "--model", "bert-tiny", "--batch", "1", "--seq", "8", "--device", "cpu", "--min-time", "0.01",
                  "--warmup", "1", "--db", path, "--name", "new"], ["run", "--resume", "--db", path]):
        one_line_error(invoke(*args), f"store {path} has schema version 2, newer than this transbench knows (1)",
                       "upgrade transbench")
    assert digest(tmp_path) == before


@pytest.mark.parametrize("marked", [True, False])
def test_a_newer_schema_version_in_a_killed_writers_wal_is_refused(tmp_path, marked):
    """The version was read from the main file's header alone: a newer transbench killed with its version still in the
    -wal file (no checkpoint yet) left a store that every command read by this schema, and `run` wrote into."""
    import subprocess
    import sys

    path = tmp_path / "s.db"
    two_runs(path)
    unmark = "" if marked else "c.execute('PRAGMA application_id = 0')\n"
    writer = (f"import os, sqlite3\nc = sqlite3.connect({str(path)!r})\nc.execute('PRAGMA wal_autocheckpoint=0')\n"
              f"{unmark}c.execute('PRAGMA user_version = {store_db.SCHEMA_VERSION + 1}')\nc.commit()\nos._exit(0)")
    subprocess.run([sys.executable, "-c", writer], check=True, timeout=120)
    head = path.read_bytes()[:100]
    assert int.from_bytes(head[60:64], "big") == store_db.SCHEMA_VERSION  # the new version is in the -wal file only
    assert (tmp_path / "s.db-wal").stat().st_size
    before = digest(tmp_path)
    refusal = f"store {path} has schema version 2, newer than this transbench knows (1)"
    for args in (["runs", "--db", path], ["compare", "A", "B", "--db", path],
                 ["merge", path, "--into", tmp_path / "m.db"],
                 ["run", "--model", "bert-tiny", "--batch", "1", "--seq", "8", "--device", "cpu", "--min-time", "0.01",
                  "--warmup", "1", "--db", path, "--name", "new"]):
        one_line_error(invoke(*args), refusal, "upgrade transbench")
    assert digest(tmp_path) == before


def test_every_run_kind_a_command_writes_is_declared(tmp_path):
    """The kinds the commands pass to open_run are the ones a stored run is read with (store.db.RUN_KINDS); a kind
    of no command is not written, so what is stored reads back."""
    src = Path(__file__).resolve().parents[1] / "src" / "transbench"
    written = {m for p in src.rglob("*.py") for m in re.findall(r'open_run\(store, "([a-z-]+)"', p.read_text())}
    assert written == set(store_db.RUN_KINDS)
    from transbench.scenarios.micro.run import KINDS as MICRO
    assert {scenario for *_, scenario in MICRO.values()} == set(store_db.RUN_KINDS["micro"])
    s = Store(tmp_path / "s.db")
    try:
        with pytest.raises(ValueError, match="not one of inference"):
            s.create_run("x", "train", {}, {})
        assert s.runs() == []
    finally:
        s.close()


def test_a_cell_whose_own_settings_the_store_would_refuse_is_not_written(tmp_path):
    """A cell the store refuses is kept as an error without its figures; where its settings themselves break the
    store's rules (validation refuses every such setting known), the rebuilt error record would break them too:
    refused in one line, and nothing of the cell written, so the store stays readable."""
    from dataclasses import replace

    from transbench.errors import SpecError
    from transbench.runner.sweep import store_result
    from transbench.store.db import Store

    db = tmp_path / "s.db"
    make_run(str(db), "A", [(grid.expand(SPEC)[0], ok_result(samples(10.0), 1))])
    cell = replace(grid.expand(SPEC)[0], batch=-3)  # a count the store reads as damaged, past validation
    s = Store(str(db))
    run_id = s.run_named("A")["run_id"]
    with pytest.raises(SpecError, match="nothing of the cell was stored"):
        store_result(s, run_id, cell, ok_result(samples(10.0), 1, tokens_per_s=-1.0))
    s.close()
    assert len(api.records(str(db), ["A"])) == 1 and invoke("runs", "--db", db).exit_code == 0


def test_a_run_of_no_date_is_refused_by_last_not_passed_over(tmp_path):
    """A damaged page read a run's date as NULL, which sorts below every date: `report` (its run 'last') reported the
    run before it as the newest, exit 0, where `runs` refused the store."""
    db = tmp_path / "s.db"
    two_runs(db)
    con = sqlite3.connect(db)
    # NOT NULL holds against an UPDATE: the table's CREATE text is lifted for it and put back as it was
    (sql,) = con.execute("SELECT sql FROM sqlite_master WHERE name = 'runs'").fetchone()
    con.execute("PRAGMA writable_schema = ON")
    con.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'runs'", (sql.replace("created TEXT NOT NULL",
                                                                                     "created TEXT"),))
    con.commit()
    con.close()
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET created = NULL WHERE name = 'A'")
    con.execute("PRAGMA writable_schema = ON")
    con.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'runs'", (sql,))
    con.commit()
    con.close()
    before = digest(tmp_path)
    for args in (["report", "--db", db, "--out", tmp_path / "out"], ["compare", "B", "last", "--db", db]):
        one_line_error(invoke(*args), f"store {db} is damaged",
                       "run 'A' has an id, name, kind or date that is not text")
    assert digest(tmp_path) == before


def test_a_store_with_a_write_under_way_in_a_rollback_journal_is_refused_not_read_half_written(tmp_path):
    """A program writing the store in SQLite's rollback-journal mode, stopped part-way, leaves its uncommitted pages in
    the file and the old ones in s.db-journal: readers (immutable, no lock) listed, compared and merged the half-written
    rows as stored, exit 0. The file and its journal are left for SQLite to roll back."""
    live = tmp_path / "live.db"
    two_runs(live)
    con = sqlite3.connect(live, isolation_level=None)
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("PRAGMA cache_size=1")  # the write's pages spill into the file before its commit
    con.execute("BEGIN")
    con.execute("UPDATE runs SET name = name || ' (uncommitted)'")
    con.execute("UPDATE cells SET record = record || ' '")
    db = tmp_path / "s.db"
    # the file and its journal as a writer killed now leaves them
    db.write_bytes(live.read_bytes())
    (tmp_path / "s.db-journal").write_bytes((tmp_path / "live.db-journal").read_bytes())
    con.rollback()
    con.close()
    target = tmp_path / "t.db"
    make_run(str(target), "T", [(grid.expand(SPEC)[0], ok_result(samples(5.0), 1))])
    before = digest(tmp_path)
    for args in (["runs", "--db", db], ["compare", "A", "B", "--db", db], ["merge", db, "--into", target],
                 ["report", "A", "--db", db, "--out", tmp_path / "out"]):
        one_line_error(invoke(*args), f"store {db} has an unfinished write in s.db-journal", "was stopped",
                       "sqlite3")
    assert digest(tmp_path) == before
    sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs").fetchone()  # as sqlite3 opens it: the write rolled back
    res = invoke("runs", "--db", db)
    assert res.exit_code == 0 and "uncommitted" not in res.output, res.output


def test_a_rollback_journal_whose_writer_is_at_work_is_waited_for_as_a_lock(tmp_path, monkeypatch):
    """A live writer's journal (a new store's first transaction, before WAL is on: shards started at once on one new
    store) is no stopped write: the command waits for its lock, and reads the store once it is committed."""
    db = tmp_path / "s.db"
    two_runs(db)
    monkeypatch.setattr(store_db, "LOCK_WAIT", 0.5)
    monkeypatch.setattr(store_db, "LOCK_NOTICE", 0.1)
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("PRAGMA cache_size=1")
    con.execute("BEGIN")
    con.execute("UPDATE cells SET record = record || ' '")  # pages spilled: the writer holds the file exclusively
    try:
        res = invoke("runs", "--db", db)
    finally:
        con.rollback()
        con.close()
    assert res.exit_code == 2 and "unfinished" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith(f"error: store {db} is locked by another process")
    assert invoke("runs", "--db", db).exit_code == 0
