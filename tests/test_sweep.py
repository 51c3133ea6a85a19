"""Sweeps that survive: failures are statuses, OOM skips larger batches, kills lose at most one cell."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from transbench import api
from transbench.scenarios.inference import cells as grid
from transbench.cells import CellResult
from transbench.store.db import Merged
from transbench.runner.sweep import find_max_batch
from transbench.scenarios.inference.spec import RunSpec
from transbench.spec import dump_file, load_file

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def faults(extra_backends):
    extra_backends("fault_backends")


def statuses(outcome):
    return {(r["backend"], r["batch_size"]): r["status"] for r in outcome.records}


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


def test_oom_is_a_result_and_larger_batches_are_skipped(faults, db, quick, monkeypatch):
    monkeypatch.setenv("FAKE_MAX_BATCH", "2")
    spec = RunSpec(models=["bert-tiny"], backends=["fake-oom"], batches=[1, 2, 4, 8, 16], seqs=[8], **quick)
    st = statuses(api.run(spec, db))
    assert st == {("fake-oom", 1): "ok", ("fake-oom", 2): "ok", ("fake-oom", 4): "oom",
                  ("fake-oom", 8): "skipped", ("fake-oom", 16): "skipped"}


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
