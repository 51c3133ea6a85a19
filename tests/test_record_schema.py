"""The versioned JSON record: every export kind (run, serve, train, micro, `runs --out`, `compare --json`) is
valid against the JSON Schema the package ships, with its spec and environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_helpers import cell, make_run, ok_result
from typer.testing import CliRunner

from transbench import __version__
from transbench.cli import app
from transbench.store import schema

jsonschema = pytest.importorskip("jsonschema")  # the `test` extra

QUICK = ["--device", "cpu", "--min-time", "0.01", "--warmup", "1"]
COMMANDS = {
    "run": ["run", "--model", "bert-tiny", "--batch", "1", "--seq", "8", "--backend", "sdpa", *QUICK],
    "serve": ["serve", "--model", "bert-tiny", "--device", "cpu", "--lengths", "lognormal:12:32", "--max-batch-size",
              "4", "--duration", "1", "--warmup", "0.3", "--rate", "20", "--backend", "sdpa", "--slo-ms", "1000"],
    "train": ["train", "--model", "gpt2-tiny", "--batch", "2", "--seq", "16", "--steps", "2", "--warmup-steps", "1",
              "--device", "cpu", "--optim", "sgd", "--timeout", "120"],
    "micro": ["micro", "gemm", "--sizes", "64", "--model", "", "--device", "cpu", "--min-time", "0.01"],
    "generate": ["run", "--model", "gpt2-tiny", "--task", "generate", "--new-tokens", "3", "--batch", "1", "--seq", "8",
                 "--backend", "sdpa", *QUICK],
    "bandwidth": ["micro", "bandwidth", "--sizes", "4096", "--device", "cpu", "--min-time", "0.01"],
    "breakdown": ["micro", "breakdown", "--model", "bert-tiny", "--batch", "2", "--seq", "8", "--device", "cpu",
                  "--min-time", "0.01"],
    "layer": ["micro", "layer", "--model", "bert-tiny", "--batch", "2", "--seq", "8", "--device", "cpu",
              "--min-time", "0.01"],
}


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def valid(doc: dict) -> dict:
    jsonschema.validate(doc, schema.record_schema(), cls=jsonschema.Draft202012Validator)
    return doc


def test_the_shipped_schema_is_the_generated_one_and_a_valid_schema():
    shipped = Path(schema.__file__).with_name("record.schema.json")
    assert json.loads(shipped.read_text()) == schema.record_schema()
    jsonschema.Draft202012Validator.check_schema(schema.record_schema())


def test_python_m_schema_prints_the_schema_and_nothing_on_stderr(tmp_path):
    """docs/results.md and ci-gate.md give `python -m transbench.store.schema`: it must print the shipped schema
    without runpy's warning about a module the package had imported already."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "transbench.store.schema"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)  # conftest's PYTHONPATH
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert json.loads(out.stdout) == schema.record_schema()
    # a reader that went away (`| head -1` once it has its line): a BrokenPipeError traceback was the output
    proc = subprocess.Popen([sys.executable, "-m", "transbench.store.schema"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # before the module has imported and printed: every write meets a closed pipe
    assert proc.wait(timeout=120) == 0 and proc.stderr.read() == b""


def test_a_schema_from_a_key_catalogue_mapping():
    """The generator takes any mapping of result key -> JSON type (the result-key catalogue's)."""
    s = schema.record_schema({"run_id": "string", "latency_ms": "number", "batch_size": "integer"})
    props = s["$defs"]["cell"]["properties"]
    assert props["latency_ms"] == {"type": ["number", "null"]} and "tflops" not in props


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store with a run of every kind, each exported with --json."""
    tmp = tmp_path_factory.mktemp("record")
    db = tmp / "all.db"
    out = {}
    for kind, args in COMMANDS.items():
        out[kind] = tmp / f"{kind}.json"
        res = invoke(*args, "--db", db, "--name", kind, "--json", out[kind])
        assert res.exit_code == 0, (kind, res.output)
    return db, out


@pytest.mark.parametrize("kind", list(COMMANDS))
def test_every_export_kind_is_valid(store, kind):
    db, out = store
    doc = valid(json.loads(out[kind].read_text()))
    assert doc["schema_version"] == schema.SCHEMA_VERSION and doc["transbench_version"] == __version__
    assert doc["kind"] == "record" and len(doc["runs"]) == 1 and doc["runs"][0]["name"] == kind
    assert doc["spec"] == doc["runs"][0]["spec"] and doc["spec"]
    env = doc["environment"]
    assert env["hostname"] and env["cpu_threads"] >= 1 and "torch" in env["packages"] and env["gpus"] == []
    assert doc["cells"] and all(c["run_name"] == kind for c in doc["cells"])
    ok = [c for c in doc["cells"] if c["status"] == "ok"]
    assert ok and all(c.get("threads", 0) >= 1 for c in ok), [c.get("threads") for c in doc["cells"]]


@pytest.mark.parametrize("kind", list(COMMANDS))
def test_every_key_an_export_holds_is_declared(store, kind):
    # docs/records.md and the schema are generated from the catalogue (keys.py): keys written but not declared (a
    # micro gemm's m, n, k; a training cell's lr; serve's lengths) were in no document and typed by nothing
    import re

    from transbench.keys import KEYS

    _, out = store
    cells = json.loads(out[kind].read_text())["cells"]
    asked = re.compile(r"latency_p\d+_(upper_)?ms")  # a --percentile of the user's (any in 0..100) names its key
    undeclared = sorted({k for c in cells for k in c if k not in KEYS and not asked.fullmatch(k)})
    assert not undeclared, undeclared


def test_runs_out_writes_the_record_of_every_run(store, tmp_path):
    db, _ = store
    path = tmp_path / "all.json"
    res = invoke("runs", "--db", db, "--out", path)
    assert res.exit_code == 0, res.output
    doc = valid(json.loads(path.read_text()))
    assert [r["name"] for r in doc["runs"]] == list(COMMANDS) and doc["spec"] is None
    assert {c["run_name"] for c in doc["cells"]} == set(COMMANDS)


def test_compare_json_markdown_and_github_benchmark(tmp_path):
    db = str(tmp_path / "c.db")
    a = [1.0 + 0.01 * i for i in range(5)]
    make_run(db, "a", [(cell("eager", 1), ok_result(a, 1)), (cell("sdpa", 1), ok_result(a, 1))])
    make_run(db, "b", [(cell("eager", 1), ok_result([x * 10 for x in a], 1)), (cell("sdpa", 1), ok_result(a, 1))])
    js, md, gh = tmp_path / "c.json", tmp_path / "c.md", tmp_path / "gh.json"
    res = invoke("compare", "a", "b", "--db", db, "--json", js, "--markdown", md, "--github-benchmark", gh)
    assert res.exit_code == 1, res.output
    doc = valid(json.loads(js.read_text()))
    assert doc["kind"] == "comparison" and doc["regressions"] == 1 and doc["counts"]["slower"] == 1
    slower = next(c for c in doc["cells"] if c["verdict"] == "slower")
    assert slower["method"] == "ranks" and slower["n_a"] == slower["n_b"] == 5 and slower["interval"][0] > 5
    text = md.read_text()
    assert text.startswith("**transbench compare: 1 regression(s)** (exit 1)") and "| slower |" in text
    entries = json.loads(gh.read_text())
    assert {e["unit"] for e in entries} == {"ms"} and all(isinstance(e["value"], float) for e in entries)
    assert {e["name"] for e in entries} == {"activation=None backend=eager batch=1 dtype=fp32 embeddings=True "
                                            "model=bert-tiny nproc=1 scenario=inference seed=0 seq=8 seq_stdev=0 "
                                            "task=base",
                                            "activation=None backend=sdpa batch=1 dtype=fp32 embeddings=True "
                                            "model=bert-tiny nproc=1 scenario=inference seed=0 seq=8 seq_stdev=0 "
                                            "task=base"}
    assert any(e["extra"].startswith("slower against a") for e in entries)
    # the document alone on stdout, the gate's exit code kept
    res = invoke("compare", "a", "b", "--db", db, "--json", "-")
    assert res.exit_code == 1 and valid(json.loads(res.stdout))["regressions"] == 1
    assert invoke("compare", "a", "b", "--db", db, "--json", "-", "--markdown", "-").exit_code == 2


@pytest.mark.parametrize("key, value", [
    ("busy_processes", "lots"), ("busy_processes", [1, 2]), ("busy_processes", [{"pid": 1, "name": "x"}]),
    ("busy_processes", [{"pid": "1", "name": "x", "cores": 1.0}]), ("repeat_medians_ms", ["a", -1]),
    ("repeat_medians_ms", [1.0, -2.0]), ("repeat_medians_ms", 3.0), ("repeat_medians_ms", [True, 1.0])])
def test_a_stored_list_its_schema_refuses_is_damage_not_exported(tmp_path, key, value):
    # `runs --out` wrote the value as it was stored, and its output failed the package's own schema
    import sqlite3

    db = tmp_path / "s.db"
    make_run(str(db), "A", [(cell("eager", 1), ok_result([1.0, 1.1, 1.2], 1))])
    with sqlite3.connect(db) as con:
        row = json.loads(con.execute("SELECT record FROM cells").fetchone()[0])
        con.execute("UPDATE cells SET record = ?", (json.dumps({**row, key: value}),))
    con.close()
    res = invoke("runs", "--db", db, "--out", tmp_path / "r.json")
    assert res.exit_code == 2 and "damaged" in res.output and key in res.output, res.output
    assert not (tmp_path / "r.json").exists()


def test_a_stored_list_that_fits_its_schema_exports_valid(tmp_path):
    import sqlite3

    db = tmp_path / "s.db"
    make_run(str(db), "A", [(cell("eager", 1), ok_result([1.0, 1.1, 1.2], 1))])
    good = {"busy_processes": [{"pid": 7, "name": "make", "cores": 1.5}], "repeat_medians_ms": [1.0, 1.2]}
    with sqlite3.connect(db) as con:
        row = json.loads(con.execute("SELECT record FROM cells").fetchone()[0])
        con.execute("UPDATE cells SET record = ?", (json.dumps({**row, **good}),))
    con.close()
    res = invoke("runs", "--db", db, "--out", tmp_path / "r.json")
    assert res.exit_code == 0, res.output
    valid(json.loads((tmp_path / "r.json").read_text()))


def _json_values():
    from hypothesis import strategies as st

    leaves = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False) | st.text(max_size=8)
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["pid", "name", "cores", "x"]), inner, max_size=4), max_leaves=12)


def test_any_stored_list_value_exports_valid_or_is_damage_in_one_line(tmp_path_factory):
    # a property over the declared list keys: whatever a store holds there, `runs --out` writes a record its own
    # schema accepts, or refuses in one line (exit 2) and writes nothing
    import sqlite3

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    d = tmp_path_factory.mktemp("lists")
    db = d / "s.db"
    make_run(str(db), "A", [(cell("eager", 1), ok_result([1.0, 1.1, 1.2], 1))])
    with sqlite3.connect(db) as con:
        base = json.loads(con.execute("SELECT record FROM cells").fetchone()[0])
    con.close()

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(key=st.sampled_from(["busy_processes", "repeat_medians_ms"]), value=_json_values())
    def check(key, value):
        with sqlite3.connect(db) as con:
            con.execute("UPDATE cells SET record = ?", (json.dumps({**base, key: value}),))
        con.close()
        out = d / "r.json"
        out.unlink(missing_ok=True)
        res = invoke("runs", "--db", db, "--out", out)
        assert "Traceback" not in res.output
        if res.exit_code == 0:
            valid(json.loads(out.read_text()))
        else:
            assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "damaged" in res.output
            assert not out.exists()

    check()
