"""transbench report: tables in the seeds' engine README shape, plots, and failed cells never shown as speeds."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from report_helpers import bad_result, cell, make_run, ok_result
from typer.testing import CliRunner

from transbench import api
from transbench.cli import app
from transbench.errors import SpecError
from transbench.report import build_report, plots
from transbench.report.data import load
from transbench.report.document import num
from transbench.runner.sweep import store_result
from transbench.scenarios.inference.spec import RunSpec
from transbench.store import Store

# Speeds planted in the records of failed cells: none of them may appear anywhere in a report.
# Values no real tiny cell can have, so a match means a leak.
PLANTED = {"latency_ms": 98765.4321, "throughput_per_s": 87654.321, "tflops": 76543.21, "latency_p99_ms": 65432.1}
BAD = {  # (backend, batch, seq) -> status
    ("eager", 4, 16): "oom", ("sdpa", 4, 16): "wrong", ("eager", 4, 8): "timeout", ("sdpa", 4, 8): "error",
}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A real run of bert-tiny (eager, sdpa x batch 1, 2 x seq 8, 16) plus failed cells at batch 4."""
    db = str(tmp_path_factory.mktemp("store") / "t.db")
    outcome = api.run(RunSpec(models=["bert-tiny"], backends=["eager", "sdpa"], batches=[1, 2], seqs=[8, 16],
                              min_time=0.01, min_count=3, warmup=1, name="tiny"), db=db)
    assert all(r["status"] == "ok" for r in outcome.records), outcome.records
    store = Store(db)
    for (backend, batch, seq), status in BAD.items():
        error = {"oom": "CUDA out of memory", "wrong": "rel_err 0.5 over the fp32 tolerance 0.001",
                 "timeout": "passed its 900 s deadline", "error": "RuntimeError: boom | second line\nthird"}[status]
        store_result(store, outcome.run_id, cell(backend, batch, seq), bad_result(status, error, **PLANTED))
    store.close()
    out = tmp_path_factory.mktemp("report")
    paths = build_report(db, ["tiny"], out)
    return {"db": db, "outcome": outcome, "paths": paths, "md": paths.markdown.read_text(),
            "html": paths.html.read_text()}


def _table(md: str, title_part: str) -> list[str]:
    """The lines of the markdown table whose title contains title_part."""
    lines = md.split(title_part, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


@pytest.mark.slow
def test_engine_tables_have_the_seed_readme_shape(stored):
    md = stored["md"]
    for seq in (8, 16):
        lines = _table(md, f"bert-tiny · base · fp32 · sequence length {seq}")
        assert lines[0] == ("| Batch size | eager Latency (ms) | eager QPS (seq/s) | sdpa Latency (ms) | "
                            "sdpa QPS (seq/s) |")
        assert [line.split("|")[1].strip() for line in lines[2:]] == ["1", "2", "4"]
        for batch in (1, 2):
            rec = {r["backend"]: r for r in stored["outcome"].records if r["batch_size"] == batch and r["seq_len"] == seq}
            row = f"| {batch} | {num(rec['eager']['latency_ms'])} | {num(rec['eager']['throughput_per_s'])} | " \
                  f"{num(rec['sdpa']['latency_ms'])} | {num(rec['sdpa']['throughput_per_s'])} |"
            assert row in lines
    assert "| 4 | OOM | OOM | wrong | wrong |" in _table(md, "sequence length 16")
    assert "| 4 | timeout | timeout | error | error |" in _table(md, "sequence length 8")


@pytest.mark.slow
def test_failed_cells_show_their_status_and_never_a_number(stored):
    page = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", stored["html"])
    for text in (stored["md"], page):
        for value in PLANTED.values():
            for shown in {num(value), f"{value:g}", f"{value:.2f}", str(value)}:
                assert shown not in text, f"{shown} of a failed cell is in the report"
    detail = _table(stored["md"], "#### every inference cell")
    bad_rows = [r for r in detail if re.search(r"\| (OOM|wrong|timeout|error) \|", r)]
    assert len(bad_rows) == 4
    for row in bad_rows:
        status = row.split("|")[7].strip()
        # every measured column of the row says the status (or nothing), never a figure
        measured = [c.strip() for c in row.split("|")[8:-1]]
        assert all(c in (status, "") for c in measured), row
    problems = _table(stored["md"], "#### cells without a valid measurement")
    assert len(problems) == 2 + 4
    assert "RuntimeError: boom \\| second line third" in stored["md"]  # pipe escaped, one line
    assert "CUDA out of memory" in stored["md"]


@pytest.mark.slow
def test_no_plot_point_for_a_failed_cell(stored):
    figures = stored["paths"].figures
    names = {f.path.name for f in figures}
    assert {"latency_throughput_bert-tiny-base-fp32.png", "speedup_bert-tiny-base-fp32.png",
            "latency_dist_bert-tiny-base-fp32.png", "tflops_heatmap_bert-tiny-base-fp32.png"} <= names
    for f in figures:
        assert f.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f.path.name in stored["md"]
        assert not [p for p in f.points if p.get("batch") == 4], f"{f.path.name} plots a failed cell"
    by_name = {f.path.name: f for f in figures}
    lat = [p for p in by_name["latency_throughput_bert-tiny-base-fp32.png"].points if p["plot"] == "latency_ms"]
    assert len(lat) == 8  # every ok cell is there
    assert len(by_name["latency_dist_bert-tiny-base-fp32.png"].points) == 8
    speed = by_name["speedup_bert-tiny-base-fp32.png"].points
    assert {p["series"] for p in speed} == {"sdpa"} and len(speed) == 4  # against eager, the default baseline


@pytest.mark.slow
def test_baseline_option(stored, tmp_path):
    store = Store(stored["db"])
    try:
        data = load(store, ["tiny"], baseline="sdpa")
        with pytest.raises(SpecError, match="baseline 'flash' is not a backend"):
            load(store, ["tiny"], baseline="flash")
    finally:
        store.close()
    assert {r["backend"] for r in data.records if r["speedup"] is not None} == {"eager"}
    (speed,) = plots.speedup_memory(data, tmp_path)
    assert {p["series"] for p in speed.points} == {"eager"} and len(speed.points) == 4
    assert "vs sdpa" in speed.title


@pytest.mark.slow
def test_cli_report_and_its_errors(stored, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["report", "last", "--db", stored["db"], "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r" / "report.md").is_file() and (tmp_path / "r" / "report.html").is_file()
    res = runner.invoke(app, ["report", "nope", "--db", stored["db"], "--out", str(tmp_path / "x")])
    assert res.exit_code == 2
    assert res.output.strip().startswith("error: no run 'nope'") and len(res.output.strip().splitlines()) == 1
    res = runner.invoke(app, ["report", "--db", str(tmp_path / "missing.db"), "--out", str(tmp_path / "y")])
    assert res.exit_code == 2 and "no store at" in res.output and not (tmp_path / "missing.db").exists()
    Store(tmp_path / "empty.db").close()  # a store with no runs yet
    res = runner.invoke(app, ["report", "--db", str(tmp_path / "empty.db"), "--out", str(tmp_path / "y")])
    assert res.exit_code == 2 and "no runs yet" in res.output
    res = runner.invoke(app, ["report", "tiny", "--compare", "--db", stored["db"], "--out", str(tmp_path / "z")])
    assert res.exit_code == 2 and "needs two runs" in res.output and not (tmp_path / "z").exists()
    # an --out that is a file, or a folder that cannot be made: one line, and the user's file untouched
    (tmp_path / "notes.txt").write_text("mine")
    for out, message in ((tmp_path / "notes.txt", "is a file"), (tmp_path / "notes.txt" / "r", "which is a file, not a folder")):
        res = runner.invoke(app, ["report", "last", "--db", stored["db"], "--out", str(out)])
        assert res.exit_code == 2 and message in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_baseline_for_runs_of_no_backend_is_refused_without_offering_none(tmp_path):
    """A micro run's records name no backend: `report MICRO --baseline eager` and api.records said "use one of None"."""
    db = str(tmp_path / "s.db")
    store = Store(db)
    micro_id, _ = store.create_run("micro", "micro", {}, {})
    store.put_cell(micro_id, "g1", "micro-gemm", "ok", {"scenario": "micro-gemm", "dtype": "fp32", "m": 256,
                   "n": 256, "k": 256, "tflops": 0.5, "latency_ms": 0.067}, cell={})
    store.close()
    res = CliRunner().invoke(app, ["report", "micro", "--db", db, "--baseline", "eager", "--out", tmp_path / "out"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.stderr.strip() == ("error: baseline 'eager' is not a backend of these runs: they measure none: leave "
                                  "the baseline out")
    with pytest.raises(SpecError, match="they measure none") as exc:
        api.records(db, ["micro"], baseline="eager")
    assert "None" not in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_generation_training_micro_and_max_batch_tables(tmp_path):
    db = str(tmp_path / "s.db")
    gen = ok_result([30.0, 31.0, 32.0], 1, prefill_ms=4.25, decode_ms_per_token=0.2125, kv_cache_mb=3.5,
                    kv_cache_analytic_mb=3.375)
    make_run(db, "gen", [(cell("sdpa", 1, 32, model="gpt2-tiny", task="generate"), gen),
                         (cell("eager", 1, 32, model="gpt2-tiny", task="generate"), bad_result("oom", "oom"))])
    store = Store(db)
    train_id, _ = store.create_run("train", "training", {}, {})
    for n, sps, status in ((1, 100.0, "ok"), (2, 190.0, "ok"), (4, 360.0, "ok"), (8, 5432.1, "timeout")):
        rec = {"scenario": "training", "model": "bert-tiny", "task": "mlm", "backend": "sdpa", "dtype": "bf16",
               "batch_size": 8, "seq_len": 128, "world_size": n, "strategy": "ddp" if n > 1 else "none",
               "samples_per_s": sps, "tflops_per_gpu": 1.5, "latency_ms": 80.0 * 8 * n / sps}
        store.put_cell(train_id, f"t{n}", "training", status, rec, cell={}, samples=[1.0])
    micro_id, _ = store.create_run("micro", "micro", {}, {})
    gemm = {"scenario": "micro-gemm", "dtype": "fp32", "shape": "square", "peak_tflops": None}
    store.put_cell(micro_id, "g1", "micro-gemm", "ok", {**gemm, "m": 256, "n": 256, "k": 256, "tflops": 0.5,
                   "latency_ms": 0.067, "intensity": 42.7}, cell={})
    store.put_cell(micro_id, "g2", "micro-gemm", "oom", {**gemm, "m": 65536, "n": 65536, "k": 65536,
                   "tflops": 4321.98, "intensity": 21845.3}, cell={})
    store.close()

    paths = build_report(db, ["gen", "train", "micro"], tmp_path / "out", compare_runs=False)
    md = paths.markdown.read_text()
    gen_rows = _table(md, "#### generation")
    assert "prefill ms" in gen_rows[0] and "KV cache MiB" in gen_rows[0]
    assert any("4.25" in r and "0.212" in r for r in gen_rows)
    assert any("| OOM |" in r for r in gen_rows)
    train_rows = _table(md, "#### training")
    assert len(train_rows) == 2 + 4 and any("| 8 | ddp | timeout |" in r for r in train_rows)
    assert "5432" not in md
    micro_rows = _table(md, "#### micro-gemm")
    assert micro_rows[0] == "| run | dtype | shape | m | n | k | latency\\_ms | tflops | intensity | status |"
    # the sizes say which point failed; what was measured says OOM
    assert "| micro | fp32 | square | 65536 | 65536 | 65536 | OOM | OOM | OOM | OOM |" in micro_rows
    assert "4322" not in md and "4321" not in md
    scaling = next(f for f in paths.figures if f.path.name == "training_scaling.png")
    eff = {p["world_size"]: p["value"] for p in scaling.points if p["plot"] == "efficiency"}
    assert eff == pytest.approx({1: 1.0, 2: 0.95, 4: 0.9})  # the timed-out 8-GPU cell is not drawn
    roof = [f for f in paths.figures if f.path.name.startswith("roofline")]
    assert len(roof) == 1 and [(p["label"], p["value"]) for p in roof[0].points] == [("n=256", 0.5)]


@pytest.mark.slow
def test_a_failing_plot_leaves_the_rest_of_the_report(stored, tmp_path, monkeypatch):
    def broken(data, out):
        raise ValueError("no such axis")

    monkeypatch.setattr(plots, "PLOTS", (broken, plots.latency_throughput))
    paths = build_report(stored["db"], ["tiny"], tmp_path)
    assert paths.plot_failures == ["plot broken failed: ValueError: no such axis"]
    md = paths.markdown.read_text()
    assert "plot broken failed" in md and "latency_throughput_bert-tiny-base-fp32.png" in md


@pytest.mark.slow
def test_runs_of_one_grid_share_columns_and_same_points_stay_apart(tmp_path):
    db = str(tmp_path / "s.db")
    for name, batch in (("p1", 1), ("p256", 256)):  # different points of one grid
        make_run(db, name, [(cell(b, batch, 8), ok_result([ms * batch] * 3, batch))
                            for b, ms in (("eager", 4.0), ("sdpa", 2.0))])
    for name, ms in (("a", 2.0), ("b", 2.5)):  # the same point twice
        make_run(db, name, [(cell("sdpa", 1, 8), ok_result([ms] * 3, 1))])
    for name, gpu in (("h100", "H100"), ("h200", "H200")):  # different points, but other hardware
        make_run(db, name, [(cell("sdpa", 1 if gpu == "H100" else 2, 8), ok_result([1.0] * 3, 1, gpu=gpu))])

    md = build_report(db, ["p1", "p256"], tmp_path / "grid").markdown.read_text()
    lines = _table(md, "sequence length 8")
    assert lines[0] == ("| Batch size | eager Latency (ms) | eager QPS (seq/s) | sdpa Latency (ms) | "
                        "sdpa QPS (seq/s) |")
    assert lines[2:] == ["| 1 | 4.00 | 250.0 | 2.00 | 500.0 |", "| 256 | 1024 | 250.0 | 512.0 | 500.0 |"]

    md = build_report(db, ["a", "b"], tmp_path / "same").markdown.read_text()
    lines = _table(md, "sequence length 8")
    assert lines[0] == ("| Batch size | a/sdpa Latency (ms) | a/sdpa QPS (seq/s) | b/sdpa Latency (ms) | "
                        "b/sdpa QPS (seq/s) |")
    assert lines[2:] == ["| 1 | 2.00 | 500.0 | 2.50 | 400.0 |"]

    md = build_report(db, ["h100", "h200"], tmp_path / "gpus").markdown.read_text()
    assert "h100/sdpa Latency (ms)" in _table(md, "sequence length 8")[0]


def test_names_are_escaped_in_markdown(tmp_path):
    from markdown_it import MarkdownIt

    db = str(tmp_path / "s.db")
    run = "x[/bold]y *bold* _it_ `code` <b>html</b> a|b [link](http://e.x) ~~gone~~ \\"
    model = "m_*model*_<i>"
    make_run(db, run, [(cell("eager", 1, 8, model=model), ok_result([1.0, 1.1, 1.2], 1)),
                       (cell("sdpa", 1, 8, model=model), bad_result("error", "RuntimeError: <script>*x*</script>"))])
    paths = build_report(db, [run], tmp_path / "r")
    md = paths.markdown.read_text()
    for raw in ("*bold*", "_it_", "`code`", "<b>", "[link]", "~~gone~~", "<i>", "<script>"):
        assert raw not in md, raw
    html = MarkdownIt("commonmark").enable("table").enable("strikethrough").render(md)
    for markup in ("<em>", "<strong>", "<code>", "<a ", "<b>", "<i>", "<script>", "<s>", "<del>"):
        assert markup not in html, markup  # a name never becomes markup
    assert html.count("x[/bold]y *bold* _it_ `code` &lt;b&gt;html&lt;/b&gt; a|b [link](http://e.x) ~~gone~~ \\") >= 2
    assert "m_*model*_&lt;i&gt; · base · fp32" in html  # the table title, literally
    assert "RuntimeError: &lt;script&gt;*x*&lt;/script&gt;" in html


@pytest.mark.slow
def test_host_ms_gets_a_column_only_where_it_was_measured(tmp_path):
    """GPU cells carry host_ms (measure/record.py); CPU cells do not, and their table keeps its columns."""
    db = str(tmp_path / "h.db")
    make_run(db, "gpu", [(cell("sdpa", 1, 8), ok_result([1.0] * 3, 1, host_ms=0.97)),
                         (cell("sdpa", 2, 8), ok_result([2.0] * 3, 2, host_ms=0.25))])
    make_run(db, "cpu", [(cell("sdpa", 1, 8), ok_result([1.0] * 3, 1))])
    gpu = build_report(db, ["gpu"], tmp_path / "g").markdown.read_text()
    cpu = build_report(db, ["cpu"], tmp_path / "c").markdown.read_text()
    lines = _table(gpu, "every inference cell")
    head = [c.strip() for c in lines[0].split("|")]
    assert "host ms" in head and "host-bound" in gpu
    column = head.index("host ms")
    assert sorted(line.split("|")[column].strip() for line in lines[2:]) == [num(0.25), num(0.97)]
    assert "host ms" not in _table(cpu, "every inference cell")[0] and "host-bound" not in cpu


# --- runs --spec of a micro run, a report of runs without a common cell or of one run named twice ---------------------

@pytest.mark.slow
def test_runs_spec_of_a_micro_run_reads_back_with_micro_spec(tmp_path):
    # `runs --spec RUN --out f.yaml` wrote a micro gemm run's spec that `micro gemm --spec f.yaml` refused twice:
    # its `micro: gemm` key was unknown, and the resolved default --tokens 256 was "--tokens ... no model".
    db, db2, out = str(tmp_path / "t.db"), str(tmp_path / "u.db"), str(tmp_path / "m.yaml")
    fast = ["--device", "cpu", "--min-time", "0.01"]
    runner = CliRunner()
    res = runner.invoke(app, ["micro", "gemm", "--sizes", "32", "--model", "", *fast, "--db", db, "--name", "m"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["runs", "--db", db, "--spec", "m", "--out", out])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["micro", "gemm", "--spec", out, "--db", db2, "--name", "again"])
    assert res.exit_code == 0, res.output
    # the same spec resumes the run it came from (nothing measured again, no "another grid" refusal)
    res = runner.invoke(app, ["micro", "gemm", "--spec", out, "--db", db, "--name", "m"])
    assert res.exit_code == 0, res.output
    # another sub-command's spec is one line naming the right one
    res = runner.invoke(app, ["micro", "bandwidth", "--spec", out, "--db", db2])
    assert res.exit_code == 2 and "transbench micro gemm" in res.output and "Traceback" not in res.output
    stdout = runner.invoke(app, ["runs", "--db", db, "--spec", "m"])
    assert stdout.exit_code == 0 and yaml.safe_load(stdout.output)["micro"] == "gemm"  # the text a .yaml file gets


@pytest.mark.slow
def test_report_of_runs_without_a_common_cell_says_why_not_an_empty_table(tmp_path):
    # `compare a b` refuses two runs that share no cell (exit 2); `report a b` compared them into an empty table
    # under "b vs a: 2 unmatched". It now says why, in the words of compare's refusal.
    from transbench.report import build_report

    db = str(tmp_path / "t.db")
    samples = [1.0 + 0.01 * (i % 7) for i in range(30)]
    make_run(db, "a", [(cell("eager", 1, model="bert-tiny"), ok_result(samples, 1))])
    make_run(db, "b", [(cell("eager", 1, model="gpt2-tiny"), ok_result(samples, 1))])
    paths = build_report(db, ["a", "b"], tmp_path / "out")
    md = paths.markdown.read_text()
    comparison = md[md.index("## Comparison"):]
    assert "runs 'a' and 'b' share no cell to compare: no cell of one has the settings" in comparison
    assert "| A ms |" not in comparison and "cells in one run only" in comparison
    assert "share no cell to compare" in paths.html.read_text()


@pytest.mark.slow
def test_report_of_one_run_named_twice_refuses_the_comparison_it_cannot_make(tmp_path):
    """`report a a --alpha 0.1` (or `report a last`, a being the newest) dropped the copy and wrote a report
    with no comparison: the options that shape one were taken without a word."""
    db = str(tmp_path / "r.db")
    make_run(db, "a", [(cell("eager", 1), ok_result([1.0] * 30, 1))])
    for args in (["a", "a", "--alpha", "0.1"], ["a", "last"], ["a", "a", "--compare"]):
        res = CliRunner().invoke(app, ["report", *args, "--db", db, "--out", str(tmp_path / "out")])
        assert res.exit_code == 2, res.output
        assert res.stderr.startswith(f"error: runs '{args[0]}' and '{args[1]}' are one run ('a')"), res.stderr
        assert not (tmp_path / "out").exists()
    res = CliRunner().invoke(app, ["report", "a", "a", "--no-compare", "--db", db, "--out", str(tmp_path / "out")])
    assert res.exit_code == 0 and (tmp_path / "out" / "report.md").is_file(), res.output


def test_a_list_in_a_micro_record_reads_as_json_as_csv_writes_it(tmp_path):
    db = str(tmp_path / "s.db")
    store = Store(db)
    micro_id, _ = store.create_run("busy", "micro", {}, {})
    store.put_cell(micro_id, "g1", "micro-gemm", "ok",
                   {"scenario": "micro-gemm", "dtype": "fp32", "shape": "square", "m": 8, "n": 8, "k": 8, "tflops": 0.5,
                    "latency_ms": 0.067, "busy_processes": [{"pid": 7, "name": "python", "cores": 0.5}]}, cell={})
    store.close()
    md = build_report(db, ["busy"], tmp_path / "out", compare_runs=False).markdown.read_text()
    row = next(r for r in _table(md, "#### micro-gemm") if "python" in r)
    # Python's repr ([{'pid': 7, ...}], True) was in the table, a format no reader parses; now --csv's JSON
    assert '{"pid": 7, "name": "python", "cores": 0.5}' in row and "'pid'" not in row
