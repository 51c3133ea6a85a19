"""transbench compare: ratio of medians, Mann-Whitney verdict, exit code 1 on a regression."""

from __future__ import annotations

import random

import pytest
from report_helpers import bad_result, cell, make_run, ok_result
from typer.testing import CliRunner

from transbench.cli import app
from transbench.errors import SpecError
from transbench.report import CompareConfig, build_report, compare
from transbench.report.compare import judge, min_p_value


def noisy(median: float, n: int = 40, spread: float = 0.02, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [median * (1 + rng.gauss(0, spread)) for _ in range(n)]


def test_judge_known_shifts():
    cfg = CompareConfig()
    a = noisy(10.0, seed=1)
    ratio, p, verdict, _ = judge(a, noisy(12.0, seed=2), 10.0, 12.0, cfg)
    assert verdict == "slower" and ratio == pytest.approx(1.2) and p < 1e-6
    assert judge(a, noisy(8.0, seed=3), 10.0, 8.0, cfg)[2] == "faster"
    ratio, p, verdict, _ = judge(a, noisy(10.0, seed=4), 10.0, 10.0, cfg)
    assert verdict == "same" and p > 0.05
    # significant but smaller than --min-effect: not a regression; with a 1% threshold it is one
    a_tight, b_tight = noisy(10.0, spread=0.002, seed=5), noisy(10.2, spread=0.002, seed=6)
    assert judge(a_tight, b_tight, 10.0, 10.2, cfg)[2] == "same"
    assert judge(a_tight, b_tight, 10.0, 10.2, CompareConfig(min_effect=0.01))[2] == "slower"


def test_too_few_samples_cannot_be_significant():
    # 3 + 3 samples: the smallest two-sided p is 0.1, so even a 2x change is `same`, and the note says why
    assert min_p_value(3, 3) == pytest.approx(0.1)
    ratio, p, verdict, note = judge([1.0, 1.01, 1.02], [2.0, 2.01, 2.02], 1.01, 2.01, CompareConfig())
    assert verdict == "same" and ratio > 1.9 and "cannot reach" in note
    assert judge([1.0], [2.0], 1.0, 2.0, CompareConfig())[2] == "n/a"


def test_bad_options():
    with pytest.raises(SpecError, match="alpha"):
        CompareConfig(alpha=1.5)
    with pytest.raises(SpecError, match="min-effect"):
        CompareConfig(min_effect=-0.1)


@pytest.fixture
def two_runs(tmp_path):
    """A: three cells. B: eager b1 20% slower, eager b2 unchanged, sdpa b1 out of memory; plus one cell each
    that the other run lacks."""
    db = str(tmp_path / "c.db")
    make_run(db, "before", [
        (cell("eager", 1), ok_result(noisy(10.0, seed=1), 1)),
        (cell("eager", 2), ok_result(noisy(15.0, seed=2), 2)),
        (cell("sdpa", 1), ok_result(noisy(9.0, seed=3), 1)),
        (cell("sdpa", 8), ok_result(noisy(30.0, seed=4), 8)),
    ])
    make_run(db, "after", [
        (cell("eager", 1), ok_result(noisy(12.0, seed=11), 1)),
        (cell("eager", 2), ok_result(noisy(15.0, seed=12), 2)),
        (cell("sdpa", 1), bad_result("oom", "CUDA out of memory", latency_ms=1.0)),
        (cell("sdpa", 16), ok_result(noisy(50.0, seed=14), 16)),
    ])
    make_run(db, "same", [(cell("eager", 1), ok_result(noisy(10.0, seed=21), 1)),
                          (cell("eager", 2), ok_result(noisy(15.0, seed=22), 2))])
    make_run(db, "before-2", [(cell("eager", 1), ok_result(noisy(10.0, seed=31), 1)),
                              (cell("eager", 2), ok_result(noisy(15.0, seed=32), 2))])
    return db


def test_compare_runs(two_runs):
    cmp = compare(two_runs, "before", "after")
    verdicts = {(c.record_a["backend"], c.record_a["batch_size"]): c.verdict for c in cmp.cells}
    assert verdicts == {("eager", 1): "slower", ("eager", 2): "same", ("sdpa", 1): "broken"}
    slow = next(c for c in cmp.cells if c.verdict == "slower")
    assert slow.ratio == pytest.approx(1.2, rel=0.02) and slow.p_value < 0.05
    assert [r["batch_size"] for r in cmp.only_a] == [8] and [r["batch_size"] for r in cmp.only_b] == [16]
    assert {c.verdict for c in cmp.regressions} == {"slower", "broken"}


def test_cli_exit_codes(two_runs):
    runner = CliRunner()
    res = runner.invoke(app, ["compare", "before", "after", "--db", two_runs])
    assert res.exit_code == 1, res.output
    assert "slower" in res.output and "broken" in res.output and "only in A" in res.output
    res = runner.invoke(app, ["compare", "before-2", "same", "--db", two_runs])
    assert res.exit_code == 0, res.output
    assert "2 same" in res.output
    # a 25% threshold makes the 20% change not count; the broken cell still fails the gate
    res = runner.invoke(app, ["compare", "before", "after", "--db", two_runs, "--min-effect", "0.25"])
    assert res.exit_code == 1 and "1 broken" in res.output and "slower" not in res.output.split("verdict")[-1]
    res = runner.invoke(app, ["compare", "before", "nope", "--db", two_runs])
    assert res.exit_code == 2 and res.output.startswith("error: no run 'nope'")
    res = runner.invoke(app, ["compare", "before", "after", "--db", two_runs, "--alpha", "2"])
    assert res.exit_code == 2 and "alpha" in res.output


def test_report_with_two_runs_has_the_comparison(two_runs, tmp_path):
    paths = build_report(two_runs, ["before", "after"], tmp_path)
    md = paths.markdown.read_text()
    assert "## Comparison: after vs before" in md
    assert "| broken |" in md and "| slower |" in md and "cells in one run only" in md
    assert len(paths.comparisons) == 1 and len(paths.comparisons[0].regressions) == 2
    # two runs in one engine table: a column pair per run and backend
    assert "| Batch size | before/eager Latency (ms) |" in md and "after/sdpa QPS (seq/s)" in md
    line = next(x for x in md.splitlines() if x.startswith("| 1 |") and "OOM" in x)
    assert line.count("OOM") == 2  # after/sdpa at batch 1, and no number planted there
