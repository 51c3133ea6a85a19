"""A cell's identity holds every setting that changes what is measured; a run name means one grid."""

from __future__ import annotations

import json
import sqlite3

import pytest
from typer.testing import CliRunner

from transbench import api
from transbench.cells import Cell
from transbench.cli import app
from transbench.errors import SpecError
from transbench.runner.sweep import check_same_grid, max_batch_key
from transbench.scenarios.inference.spec import RunSpec

QUICK = {"min_time": 0.0, "min_count": 2, "warmup": 0, "device": "cpu"}


def test_settings_that_change_the_measurement_change_the_key():
    base = Cell("bert-tiny", "base", "sdpa", "fp32", 2, 16)
    variants = [dict(seq_stdev=4.0), dict(embeddings=False), dict(activation="gelu-tanh"), dict(seed=1),
                dict(nproc=2)]
    keys = {base.key()} | {Cell("bert-tiny", "base", "sdpa", "fp32", 2, 16, **v).key() for v in variants}
    assert len(keys) == 1 + len(variants)
    # timing settings do not change what is measured
    assert Cell("bert-tiny", "base", "sdpa", "fp32", 2, 16, min_time=5.0, warmup=9).key() == base.key()
    # new tokens matter for generation only, the compile mode for the compile backend only
    assert Cell("gpt2-tiny", "causal-lm", "sdpa", "fp32", 1, 8, new_tokens=4).key() == \
        Cell("gpt2-tiny", "causal-lm", "sdpa", "fp32", 1, 8, new_tokens=64).key()
    assert Cell("gpt2-tiny", "generate", "sdpa", "fp32", 1, 8, new_tokens=4).key() != \
        Cell("gpt2-tiny", "generate", "sdpa", "fp32", 1, 8, new_tokens=64).key()
    assert json.loads(Cell("m", "base", "compile", "fp32", 1, 8, compile_mode="max-autotune").key())["compile_mode"]


def test_oom_groups_and_max_batch_keys_leave_out_the_batch_only():
    a, b = Cell("m", "base", "sdpa", "fp16", 1, 8), Cell("m", "base", "sdpa", "fp16", 64, 8)
    assert a.oom_group() == b.oom_group() and a.key() != b.key()
    assert a.oom_group() != Cell("m", "base", "sdpa", "fp16", 1, 8, seq_stdev=2.0).oom_group()
    assert max_batch_key(a) == max_batch_key(b) and "max-batch" in max_batch_key(a)


def test_record_fields_export_the_identity():
    rec = Cell("m", "base", "sdpa", "fp16", 4, 8, seq_stdev=2.0, embeddings=False).record_fields()
    assert rec["batch_size"] == 4 and rec["seq_len"] == 8 and rec["seq_stdev"] == 2.0 and rec["embeddings"] is False


def test_a_different_grid_under_one_name_is_refused_with_what_differs():
    stored = {"batches": [1], "seqs": [8], "timeout": 10, "seq_stdev": 0.0}
    check_same_grid(stored, {**stored, "timeout": 99}, "r")  # where and how long cells run may change
    with pytest.raises(SpecError, match=r"seq_stdev 0.0 -> 4.0.*another --name"):
        check_same_grid(stored, {**stored, "seq_stdev": 4.0}, "r")


@pytest.mark.slow
def test_reusing_a_name_with_another_grid_exits_2_and_stores_nothing(tmp_path):
    db = str(tmp_path / "t.db")
    args = ["run", "--model", "bert-tiny", "--backend", "sdpa", "--batch", "1", "--seq", "8", "--device", "cpu",
            "--min-time", "0", "--min-count", "2", "--warmup", "0", "--db", db, "--name", "mine"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    before = sqlite3.connect(db).execute("SELECT key, record FROM cells").fetchall()
    other = CliRunner().invoke(app, [*args, "--seq-stdev", "2"])
    assert other.exit_code == 2 and "different grid" in other.output and "seq_stdev" in other.output
    assert sqlite3.connect(db).execute("SELECT key, record FROM cells").fetchall() == before
    again = CliRunner().invoke(app, args)  # the same grid resumes: nothing left to run
    assert again.exit_code == 0 and "1 of 1 cells already stored" in again.output


@pytest.mark.slow
def test_resume_skips_batches_above_an_oom_stored_before_a_kill(tmp_path):
    """A run killed after batch 2 ran out of memory: resumed, batch 4 is skipped, batch 1 runs."""
    from transbench.cells import CellResult
    from transbench.scenarios.inference import cells as grid
    from transbench.runner.sweep import open_run, store_result
    from transbench.store import Store

    db = str(tmp_path / "t.db")
    spec = RunSpec(models=["bert-tiny"], backends=["sdpa"], batches=[1, 2, 4], seqs=[8], name="killed", **QUICK)
    valid = grid.validate(spec)
    store = Store(db)
    run_id, _, _ = open_run(store, "inference", api.spec_to_store(valid), "killed", lambda: {})
    oom = next(c for c in grid.expand(valid) if c.batch == 2)
    store_result(store, run_id, oom, CellResult("oom", error="CUDA out of memory"))
    store.close()
    out = api.run(spec, db)
    assert out.resumed and {r["batch_size"]: r["status"] for r in out.records} == {1: "ok", 2: "oom", 4: "skipped"}


def test_a_max_batch_search_that_never_ran_out_of_memory_says_it_stopped_at_its_cap(tmp_path):
    import threading

    from transbench.cells import CellResult
    from transbench.runner.sweep import SweepOptions, search_max_batch
    from transbench.store import Store

    class AlwaysFits:
        def run(self, cell, timeout):
            return CellResult("ok", record={"latency_ms": 1.0})

    store = Store(str(tmp_path / "m.db"))
    run_id, _ = store.create_run("m", "inference", {}, {})
    probes = []
    search_max_batch(store, run_id, Cell("bert-tiny", "base", "sdpa", "fp32", 1, 8), AlwaysFits(),
                     SweepOptions(max_batch=True, max_batch_limit=64), 1, set(), threading.Lock(),
                     lambda c, r: probes.append(c.batch))
    (stored,) = store.cells(run_id)
    store.close()
    # then the answer itself, with its trail (info["probes"]), so its warnings reach the console
    assert probes == [1, 2, 4, 8, 16, 32, 64, 64] and stored["record"]["batch_size"] == 64
    assert stored["info"]["capped"] and "cap" in stored["warnings"][0] and "not the largest batch" in stored["warnings"][0]
