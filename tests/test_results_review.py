"""Review of the result commands (compare, report, runs, merge) as a CI gate uses them: each test here failed
before its fix (CPU only)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from report_helpers import cell, make_run, ok_result
from typer.testing import CliRunner

from transbench.cli import app
from transbench.report import CompareConfig, compare
from transbench.report.compare import compare_records, comparison_table, judge


def test_a_run_compared_with_itself_is_never_a_regression_at_any_level():
    # Identical samples: the exact bootstrap interval of the ratio holds 1 at any level, but the 2,000 draws' Monte
    # Carlo error moved a 1% interval (--alpha 0.99 --min-effect 0) off 1: `slower` or `faster` for 1 pair in 50.
    rng = np.random.default_rng(1)
    for _ in range(50):
        x = list(rng.lognormal(0, 0.1, int(rng.integers(25, 5000))))
        med = float(np.median(x))
        for alpha in (0.05, 0.5, 0.9, 0.99):
            _, (lo, hi), verdict, _ = judge(x, x, med, med, CompareConfig(alpha, 0.0))
            assert verdict == "same" and lo <= 1 <= hi, (len(x), alpha, lo, hi)


def test_a_real_change_is_still_judged_at_a_narrow_level():
    # the guard is for identical block medians only: a 10% slowdown is `slower` at any level
    rng = np.random.default_rng(2)
    a = list(rng.lognormal(0, 0.02, 900))
    b = [v * 1.1 for v in rng.lognormal(0, 0.02, 900)]
    assert judge(a, b, float(np.median(a)), float(np.median(b)), CompareConfig(0.99, 0.0))[2] == "slower"


@pytest.mark.parametrize("alpha, min_effect, shown", [
    (0.05, 0.03, "(95% interval, min effect 3%)"),
    (0.001, 0.001, "(99.9% interval, min effect 0.1%)"),  # was "(100% interval, min effect 0%)"
    (0.0001, 0.0, "(99.99% interval, min effect 0%)"),
    (0.05, -0.0, "(95% interval, min effect 0%)"),  # was "min effect -0%"
])
def test_the_interval_level_and_min_effect_are_shown_as_given(alpha, min_effect, shown):
    cfg = CompareConfig(alpha, min_effect)
    rec = {"scenario": "inference", "_key": "k", "status": "ok", "latency_ms": 1.0, "_samples": [1.0] * 25}
    cmp = compare_records({"name": "a"}, [rec], {"name": "b"}, [dict(rec)], cfg)
    assert cmp.summary().endswith(shown)
    assert shown[1:].split(",")[0] in comparison_table(cmp).headers


def test_the_note_names_the_side_without_a_latency():
    a = {"scenario": "inference", "_key": "k", "status": "ok", "latency_ms": 1.0, "_samples": [1.0] * 25}
    b = {"scenario": "inference", "_key": "k", "status": "ok", "latency_ms": None, "_samples": []}
    cmp = compare_records({"name": "a"}, [a], {"name": "b"}, [b], CompareConfig())
    assert (cmp.cells[0].verdict, cmp.cells[0].note) == ("n/a", "no latency in B")  # was "... in either run"
    cmp = compare_records({"name": "b"}, [b], {"name": "a"}, [a], CompareConfig())
    assert cmp.cells[0].note == "no latency in A"


@pytest.mark.parametrize("scenario, option", [("inference", "--min-time"), ("serve", "--duration"),
                                              ("training", "--steps")])
def test_the_n_a_note_names_an_option_of_the_command_that_ran_the_cell(scenario, option):
    # serve has no --min-time (its samples are its requests: --duration, --rate), train none either (--steps)
    x = [1.0, 1.1, 0.9] * 4
    _, _, verdict, note = judge(x, x, 1.0, 1.0, CompareConfig(), scenario)
    assert verdict == "n/a" and option in note
    assert ("--min-time" in note) == (option == "--min-time")


def test_compare_n_a_note_for_inference_cells(tmp_path):
    db = str(tmp_path / "t.db")
    few = ok_result([1.0, 1.1, 1.2, 1.05, 0.95], 1)
    for name in ("a", "b"):
        make_run(db, name, [(cell("eager", 1), few)])
    cmp = compare(db, "a", "b")
    assert "--min-time" in cmp.cells[0].note  # an inference cell keeps the --min-time hint


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
    assert stdout.exit_code == 0 and json.loads(stdout.output)["micro"] == "gemm"


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
