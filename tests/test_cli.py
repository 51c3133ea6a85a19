import csv
import json
import shutil
import sqlite3

import pytest
from typer.testing import CliRunner

from transbench.cli import app
from transbench.store.export import RECORD_KEYS

runner = CliRunner()
QUICK = ["--device", "cpu", "--min-time", "0.01", "--warmup", "1"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory):
    db = tmp_path_factory.mktemp("stored") / "keep.db"
    ok = invoke("run", "--model", "bert-tiny", "--batch", "1", "--seq", "8", *QUICK, "--backend", "sdpa", "--db", db)
    assert ok.exit_code == 0
    return db


@pytest.mark.slow
def test_run_writes_db_json_csv(tmp_path):
    db, js, cs = tmp_path / "r.db", tmp_path / "r.json", tmp_path / "r.csv"
    res = invoke("run", "--model", "bert-tiny,gpt2-tiny", "--batch", "1,2", "--seq", "8", *QUICK,
                 "--db", db, "--json", js, "--csv", cs, "--name", "e2e", "--baseline", "eager")
    assert res.exit_code == 0, res.output
    recs = json.loads(js.read_text())["cells"]
    assert len(recs) == 2 * 2 * 2  # models x backends x batches
    assert all(r["status"] == "ok" for r in recs)
    for r in recs:
        assert list(r)[: len(RECORD_KEYS)] == list(RECORD_KEYS)
        assert r["latency_ms"] > 0 and r["throughput_per_s"] == pytest.approx(r["batch_size"] / r["latency_ms"] * 1e3)
        assert r["tokens_per_s"] == pytest.approx(r["throughput_per_s"] * 8)
        assert r["rel_err"] < 1e-3 and r["n_samples"] >= 3 and r["mfu"] is None  # CPU: no datasheet peak
        assert (r["speedup"] is None) == (r["backend"] == "eager")
    rows = list(csv.DictReader(cs.open()))
    assert len(rows) == len(recs) and rows[0]["run_name"] == "e2e"
    con = sqlite3.connect(db)
    samples = json.loads(con.execute("SELECT samples FROM cells LIMIT 1").fetchone()[0])
    assert len(samples) >= 3  # raw samples are kept
    spec = json.loads(con.execute("SELECT spec FROM runs").fetchone()[0])
    assert spec["batches"] == [1, 2] and spec["dtypes"] == ["fp32"]
    assert "e2e" in invoke("runs", "--db", db).output


@pytest.mark.parametrize("args,needle", [
    (["--model", "no-such-model"], "unknown model"),
    (["--model", "/no/such/folder"], "unknown model"),
    (["--batch", "0"], "batch must be at least 1"),
    (["--seq", "-3"], "seq must be at least 1"),
    (["--batch", "two"], "cannot read"),
    (["--seq", "129"], "longer than bert-tiny allows"),
    (["--dtype", "fp12"], "unknown dtype"),
    (["--dtype", "tf32"], "tf32 needs a CUDA GPU"),
    (["--task", "poetry"], "unknown task"),
    (["--task", "causal-lm"], "needs a decoder (causal LM) family"),
    (["--backend", "warp-drive"], "unknown backend"),
    (["--device", "cuda:3"], "no CUDA GPU"),
    (["--activation", "relu"], "unknown activation"),
    (["--baseline", "sdpa", "--backend", "eager"], "not among the backends"),
    (["--shard", "3/2"], "bad --shard"),
    (["--spec", "/no/such.yaml"], "not found"),
    (["--min-count", "0"], "--min-count must be at least 1"),
    (["--min-time", "-1"], "must be 0 or more"),
    (["--timeout", "0"], "--timeout must be positive"),
    (["--seq-stdev", "-2"], "--seq-stdev must be 0 or more"),
    (["--task", "generate", "--model", "gpt2-tiny", "--new-tokens", "0"], "--new-tokens must be at least 1"),
    (["--task", "generate", "--model", "gpt2-tiny", "--seq", "100", "--new-tokens", "64"],
     "needs 163 positions, more than gpt2-tiny allows"),
    (["--task", "generate", "--model", "gpt2-tiny", "--seq", "8", "--new-tokens", "200"],
     "use --new-tokens 121 or less"),
    (["--task", "generate", "--model", "gpt2-tiny", "--seq", "200", "--new-tokens", "200"], "add up to 129 or less"),
    (["--backend", "compile", "--compile-mode", "ludicrous"], "unknown --compile-mode"),
    (["--gpus", "zero"], "cannot read"),
])
def test_bad_input_is_one_line_exit_2_and_store_untouched(stored_run, tmp_path, args, needle):
    db = tmp_path / "keep.db"
    shutil.copy(stored_run, db)
    before = sqlite3.connect(db).execute("SELECT COUNT(*) FROM cells").fetchone()[0]
    base = {"--model": "bert-tiny", "--batch": "1", "--seq": "8", "--device": "cpu"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    res = invoke("run", *[x for kv in base.items() for x in kv], "--db", db)
    assert res.exit_code == 2
    assert needle in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM cells").fetchone()[0] == before


def test_fp16_on_cpu_is_refused_when_the_cpu_cannot_run_it(tmp_path, monkeypatch):
    from transbench.measure import device

    monkeypatch.setattr(device, "dtype_runs", lambda dev, dtype: dtype == "fp32")
    res = invoke("run", "--model", "bert-tiny", "--dtype", "fp16", "--device", "cpu", "--db", tmp_path / "x.db")
    assert res.exit_code == 2 and "does not run on cpu" in res.output


@pytest.mark.slow
def test_models_and_env_commands():
    out = invoke("models").output
    for name in ("bert-base-uncased", "bert-large-uncased", "gpt2-xl", "bert-tiny"):
        assert name in out
    assert "30522" in out and "1600" in out
    env = invoke("env", "--json")
    info = json.loads(env.output)
    assert info["torch"] and "transformers" in info and info["gpus"] == []


@pytest.mark.slow
def test_local_checkpoint_folder(tmp_path):
    from transbench.models import build

    model = build.build_model(build.resolve("bert-tiny"), "base")
    model.save_pretrained(tmp_path / "ckpt")
    res = invoke("run", "--model", tmp_path / "ckpt", "--batch", "1", "--seq", "8", *QUICK, "--backend", "sdpa",
                 "--db", tmp_path / "c.db", "--json", tmp_path / "c.json")
    assert res.exit_code == 0, res.output
    rec = json.loads((tmp_path / "c.json").read_text())["cells"][0]
    assert rec["status"] == "ok" and rec["model"] == str(tmp_path / "ckpt")
