import sqlite3

from transbench.store import Store, export
from transbench.store.db import Merged


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
    assert cells[0]["samples"].tolist() == [1.0, 2.0, 3.0] and cells[0]["warnings"] == ["w"]
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
    assert target.merge_from(a) == Merged(1, 2, [])
    assert target.merge_from(b) == Merged(0, 1, [])  # cell 2 is the same result in both: no word
    assert target.merge_from(b) == Merged(0, 0, [])
    assert sorted(x["key"] for x in target.cells(target.find_run("sweep")["run_id"])) == ["1", "2", "3"]


def test_a_cell_stored_twice_with_other_results_is_named_and_an_error_gives_way(tmp_path):
    """merge kept the first copy of a cell without a word, so one of two results vanished unseen; an error copy
    hid a later measured one, which --resume would have measured again."""
    a, b, c = (str(tmp_path / f"{x}.db") for x in "abc")
    for path, cells in ((a, [("1", "ok", 2.0), ('{"backend": "sdpa", "batch": 4}', "error", None)]),
                        (b, [("1", "ok", 3.0), ('{"backend": "sdpa", "batch": 4}', "ok", 5.0)])):
        s = Store(path)
        run_id, _ = s.create_run("sweep", "inference", {}, {})
        for key, status, ms in cells:
            _cell(s, run_id, key, status=status, latency_ms=ms)
        s.close()
    target = Store(c)
    assert target.merge_from(a) == Merged(1, 2, [])
    merged = target.merge_from(b)
    assert (merged.runs, merged.cells) == (0, 0)
    assert merged.differing == [
        f"run 'sweep' cell 1: {b} holds another result (ok against ok); kept the ok one already merged",
        f"run 'sweep' cell backend sdpa, batch 4: {b} holds another result (ok against error); kept {b}'s ok"]
    cells = {x["key"]: x for x in target.cells(target.find_run("sweep")["run_id"])}
    assert cells["1"]["record"]["latency_ms"] == 2.0
    assert cells['{"backend": "sdpa", "batch": 4}']["status"] == "ok"
    assert cells['{"backend": "sdpa", "batch": 4}']["record"]["latency_ms"] == 5.0
    target.close()
    from typer.testing import CliRunner

    from transbench.cli import app

    res = CliRunner().invoke(app, ["merge", a, b, "--into", str(tmp_path / "d.db")])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0] == f"merged into {tmp_path / 'd.db'}: 1 new run(s), 2 new cell(s)"
    assert res.stdout.count("warning: run 'sweep' cell") == 2


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


def test_samples_are_read_into_one_float_array_with_the_values_json_gives(db):
    """json.loads made a Python float of each sample, and report and compare read every cell twice: 6,000,000 samples
    of one cell (a 59 MB store) took them to 1.2 GB. decode_samples reads the text straight into a float64 array
    where it is a JSON list of numbers, with json's values; any other text (None) is left to json, which refuses it
    or reads it as before."""
    import json
    import random

    import numpy as np

    from transbench.report import data
    from transbench.store.db import decode_samples

    rng = random.Random(0)
    for _ in range(300):
        values = [rng.choice([rng.random() * 10 ** rng.randint(-300, 300), rng.randint(0, 10**6), 0.0])
                  for _ in range(rng.randint(0, 30))]
        text = json.dumps(values)
        assert decode_samples(text).tobytes() == np.asarray(values, dtype=np.float64).tobytes()
        at = rng.randrange(len(text))
        edited = text[:at] + rng.choice("0123456789.,eE+- []") + text[at + 1:]
        try:
            expected = np.asarray(json.loads(edited), dtype=np.float64)
        except (ValueError, TypeError):
            expected = None
        got = decode_samples(edited)
        assert got is None or (expected is not None and got.tobytes() == expected.tobytes()), edited
    for text in ("[01]", "[1.]", "[.5]", "[+1]", "[1,,2]", "[1 2]", "[[1]]", "[1,]", "[NaN]", "[1]]", "[", ""):
        assert decode_samples(text) is None, text

    s = Store(db)
    run_id, name = s.create_run(None, "inference", {}, {"gpus": []})
    s.put_cell(run_id, "a", "inference", "ok", {"latency_ms": 2.0}, cell={}, samples=[1.0, 2, 3e-3])
    s.put_cell(run_id, "b", "inference", "oom", {}, cell={})
    reads = []
    cells = s.cells
    s.cells = lambda *a, **k: reads.append(a) or cells(*a, **k)
    try:
        (ok, oom) = data.load(s, [name]).records
    finally:
        s.close()
    assert len(reads) == 1  # export.records read the run's cells a second time, its samples decoded again
    assert ok["_samples"].dtype == np.float64 and ok["_samples"].tolist() == [1.0, 2.0, 3e-3]
    assert isinstance(oom["_samples"], np.ndarray) and len(oom["_samples"]) == 0
