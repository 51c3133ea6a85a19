import sqlite3

from transbench.store import Store, export


def _cell(store, run_id, key, status="ok", **rec):
    store.put_cell(run_id, key, "inference", status, {"model": "m", "backend": key, "latency_ms": 2.0, **rec},
                   cell={"k": key}, samples=[1.0, 2.0, 3.0], info={"x": 1}, warnings=["w"])


def test_round_trip(db):
    s = Store(db)
    run_id, name = s.create_run(None, "inference", {"models": ["m"]}, {"gpus": []})
    _cell(s, run_id, "a")
    _cell(s, run_id, "b", status="wrong")
    s.close()
    s = Store(db)
    assert s.find_run(name)["run_id"] == run_id == s.find_run("last")["run_id"]
    cells = s.cells(run_id)
    assert [c["key"] for c in cells] == ["a", "b"]
    assert cells[0]["samples"] == [1.0, 2.0, 3.0] and cells[0]["warnings"] == ["w"]
    recs = export.records(s, [run_id])
    assert recs[0]["latency_ms"] == 2.0
    assert recs[1]["latency_ms"] is None and recs[1]["status"] == "wrong"  # no speed for a wrong cell
    assert set(export.RECORD_KEYS) <= set(recs[0])


def test_named_runs_share_an_id_and_merge_without_duplicates(tmp_path):
    a, b, c = (str(tmp_path / f"{x}.db") for x in "abc")
    for path, keys in ((a, ["1", "2"]), (b, ["2", "3"])):
        s = Store(path)
        run_id, _ = s.create_run("sweep", "inference", {}, {})
        for k in keys:
            _cell(s, run_id, k)
        s.close()
    target = Store(c)
    assert target.merge_from(a) == (1, 2)
    assert target.merge_from(b) == (0, 1)
    assert target.merge_from(b) == (0, 0)
    assert sorted(x["key"] for x in target.cells(target.find_run("sweep")["run_id"])) == ["1", "2", "3"]


def test_baseline_speedup_and_memory():
    recs = [
        {"scenario": "inference", "model": "m", "batch_size": 1, "backend": "eager", "status": "ok", "latency_ms": 4.0, "peak_mem_mb": 100.0},
        {"scenario": "inference", "model": "m", "batch_size": 1, "backend": "sdpa", "status": "ok", "latency_ms": 2.0, "peak_mem_mb": 75.0},
        {"scenario": "inference", "model": "m", "batch_size": 1, "backend": "bad", "status": "wrong", "latency_ms": None},
    ]
    export.apply_baseline(recs, "eager")
    assert recs[1]["speedup"] == 100.0 and recs[1]["mem_saved"] == 25.0
    assert "speedup" not in recs[0] and "speedup" not in recs[2]


def test_store_is_valid_sqlite_in_wal_mode(db):
    Store(db).close()
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
