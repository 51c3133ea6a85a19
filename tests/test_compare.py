"""transbench compare: cells matched on their stored key; the verdict from a bootstrap interval of the
ratio of block medians; exit code 1 on a regression, 2 on bad input."""

from __future__ import annotations

import importlib
import json
import math
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from process_helpers import first_line
from report_helpers import bad_result, cell, make_run, ok_result
from typer.testing import CliRunner

from transbench import api
from transbench.cells import Cell
from transbench.cli import app
from transbench.errors import SpecError
from transbench.report import CompareConfig, build_report, compare
from transbench.report.compare import (MIN_BLOCKS, autocorrelation_time, block_medians, compare_records,
                                       comparison_table, judge,
                                       percent, rank_counts, rank_interval, ratio_interval, settings,
                                       t_quantile, unmatched_reasons, unmatched_table, _differ, _text)
from transbench.runner.sweep import store_result
from transbench.store import Store

compare_module = importlib.import_module("transbench.report.compare")  # the package's `compare` is the function


def noisy(median: float, n: int = 40, spread: float = 0.02, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [median * (1 + rng.gauss(0, spread)) for _ in range(n)]


def drifting(median: float, n: int = 2000, seed: int = 0, phi: float = 0.95, spread: float = 0.02,
             drift: float = 0.04) -> list[float]:
    """Per-call samples as a GPU gives them: AR(1) noise (each call close to the one before; marginal
    spread 2%) on a slow drift of +-4% (clock and temperature) whose phase differs from run to run."""
    rng = random.Random(seed)
    phase = rng.uniform(0, 2 * math.pi)
    e, out = 0.0, []
    for i in range(n):
        e = phi * e + rng.gauss(0, spread * math.sqrt(1 - phi * phi))
        out.append(median * (1 + e + drift * math.sin(phase + 2 * math.pi * i / n)))
    return out


def verdict(a: list[float], b: list[float], cfg: CompareConfig = CompareConfig()):
    return judge(a, b, float(np.median(a)), float(np.median(b)), cfg)


@pytest.mark.slow
def test_one_drifting_autocorrelated_distribution_is_same():
    """Never `slower` or `faster`. The drift spans each run (+-4%, phase at random), so a run's 2,000 calls are worth
    about a dozen independent ones: where its blocks of two correlation times are too few to bound B/A within the
    min effect the verdict is `n/a`, not `same` (it was `same` for all 20 under sqrt(n) blocks, which took blocks of
    44 calls of this drift for independent draws)."""
    holds_one = naive_holds_one = judged = 0
    for seed in range(20):
        a, b = drifting(10.0, seed=2 * seed), drifting(10.0, seed=2 * seed + 1)
        ratio, interval, v, _ = verdict(a, b)
        assert v in ("same", "n/a"), (seed, interval)
        if v == "same":
            lo, hi = interval
            judged += 1
            assert lo < ratio < hi, (seed, lo, hi)
            holds_one += lo < 1 < hi
        # The same interval over single samples, as if they were independent, is tight and misses 1 in
        # most pairs: that overconfidence is what the blocks take out.
        lo1, hi1 = ratio_interval(np.array(a), np.array(b), 0.05)
        naive_holds_one += lo1 < 1 < hi1
    assert judged >= 5 and holds_one == judged and naive_holds_one <= 8


def test_ten_percent_regression_and_improvement():
    """Under AR(1) noise (phi 0.95) every 10% change is caught; under the drift that spans each run as well, none is
    called the wrong way (some are `n/a`: a dozen independent calls a run do not bound a 10% change every time)."""
    for seed in range(5):
        a = drifting(10.0, seed=seed, drift=0)
        ratio, (lo, hi), v, _ = verdict(a, drifting(11.0, seed=100 + seed, drift=0))
        assert v == "slower" and 1.03 < lo < ratio < hi and ratio == pytest.approx(1.1, abs=0.03)
        ratio, (lo, hi), v, _ = verdict(a, drifting(9.0, seed=200 + seed, drift=0))
        assert v == "faster" and lo < ratio < hi < 0.97 and ratio == pytest.approx(0.9, abs=0.03)
        a = drifting(10.0, seed=seed)
        assert verdict(a, drifting(11.0, seed=100 + seed))[2] in ("slower", "n/a")
        assert verdict(a, drifting(9.0, seed=200 + seed))[2] in ("faster", "n/a")


def ar1(n: int, seed: int, phi: float = 0.9, spread: float = 0.05, median: float = 10.0) -> np.ndarray:
    """Consecutive per-call timings with AR(1) noise: each call close to the one before (phi 0.9: a correlation time
    of (1 + phi) / (1 - phi) = 19 calls), marginal spread 5%."""
    rng = np.random.default_rng(seed)
    e, out = rng.normal(0, spread), np.empty(n)
    for i in range(n):
        e = phi * e + rng.normal(0, spread * math.sqrt(1 - phi * phi))
        out[i] = e
    return median * (1 + out)


def gate_failures(n: int, pairs: int, cfg: CompareConfig, shift_a: float = 0.0) -> tuple[int, int]:
    """(slower, faster) verdicts over `pairs` no-change pairs of AR(1) runs; `shift_a`: a quarter of A's calls (its
    third quarter: a clock boost, another process's pause) moved by that fraction."""
    slower = faster = 0
    for t in range(pairs):
        a, b = ar1(n, 2 * t), ar1(n, 2 * t + 1)
        a[n // 2:3 * n // 4] *= 1 + shift_a
        v = verdict(a.tolist(), b.tolist(), cfg)[2]
        slower += v == "slower"
        faster += v == "faster"
    return slower, faster


@pytest.mark.parametrize("n, cfg, shift_a, most", [
    # A level of 5% (alpha 0.05 two-sided, min effect 0): each direction should be called 2.5% of the time (5 in
    # 200). sqrt(n) blocks of 10 calls, half a correlation time, were taken as independent: 20 + 21 of 200 (10% each
    # way). Now 6 + 12: tau estimated from 100 calls runs low (Sokal's window is biased down on short series).
    (100, CompareConfig(min_effect=0), 0.0, 13),
    # A quarter of A 10% fast (the level shift inside A alone), default gate: B read `slower` 12 times in 200 (6%)
    (50, CompareConfig(), -0.10, 6),
])
def test_autocorrelated_no_change_pairs_fail_the_gate_near_the_nominal_rate(n, cfg, shift_a, most):
    slower, faster = gate_failures(n, 200, cfg, shift_a)
    assert slower <= most and faster <= most, (slower, faster)


def test_autocorrelated_samples_count_as_their_effective_size():
    """Independent samples keep sqrt(n) blocks; AR(1) samples with phi 0.9 get blocks of at least 2 tau (tau about
    19): 100 of them are too few for 5 such blocks, and the verdict comes from a t-interval over the blocks there
    are, its note saying how many independent samples the calls were worth."""
    independent = np.random.default_rng(3).normal(10, 0.5, 400)
    assert autocorrelation_time(independent) == 1.0 and len(block_medians(independent.tolist())) == 20
    a = ar1(400, 1)
    assert 8 < autocorrelation_time(a) < 40 and len(block_medians(a.tolist())) < 20
    ratio, interval, v, note = verdict(ar1(100, 1).tolist(), ar1(100, 2).tolist())
    assert "autocorrelated" in note and "100 (about" in note and v in ("same", "n/a"), note
    # far too short for its correlation: two blocks or fewer, no verdict; the note names the remedies
    ratio, interval, v, note = verdict(ar1(30, 1, phi=0.99).tolist(), ar1(30, 2, phi=0.99).tolist())
    assert v == "n/a" and "--repeat" in note and "--min-time" in note, note


@pytest.mark.parametrize("n", [25, 100, 1000])
def test_a_real_ten_percent_change_under_independent_noise_is_still_caught(n):
    for seed in range(10):
        a, b = ar1(n, 2 * seed, phi=0.0, spread=0.02), ar1(n, 2 * seed + 1, phi=0.0, spread=0.02, median=11.0)
        assert verdict(a.tolist(), b.tolist())[2] == "slower", seed
        assert verdict(b.tolist(), a.tolist())[2] == "faster", seed


def test_a_real_change_under_ar1_noise_is_caught_given_enough_samples():
    a, b = ar1(2000, 1), ar1(2000, 2, median=11.0)
    assert verdict(a.tolist(), b.tolist())[2] == "slower"

def test_min_effect_and_alpha():
    a_tight, b_tight = noisy(10.0, spread=0.002, seed=5), noisy(10.2, spread=0.002, seed=6)
    ratio, (lo, hi), v, note = verdict(a_tight, b_tight)
    # a real 2% change, but under the 3% min effect: not a regression; with a 1% threshold it is one
    assert v == "same" and lo > 1 and "min effect" in note
    assert verdict(a_tight, b_tight, CompareConfig(min_effect=0.01))[2] == "slower"
    # a wider interval (99.9%) holds the 95% one
    lo99, hi99 = verdict(a_tight, b_tight, CompareConfig(alpha=0.001))[1]
    assert lo99 <= lo and hi99 >= hi


def test_block_medians_keep_time_order(monkeypatch):
    x = [float(i) for i in range(103)]  # a ramp: one long correlation, so a single block
    assert len(block_medians(x)) < MIN_BLOCKS
    monkeypatch.setattr(compare_module, "autocorrelation_time", lambda samples: 1.0)
    # taken as independent: 10 blocks of 10; the 3 oldest samples are left out
    assert block_medians(x).tolist() == [7.5 + 10 * i for i in range(10)]
    assert len(block_medians([1.0] * 24)) == 4 and len(block_medians([1.0] * 25)) == MIN_BLOCKS


def test_deterministic():
    a, b = drifting(10.0, seed=1), drifting(10.3, seed=2)
    assert verdict(a, b) == verdict(a, b)


def test_100000_samples_per_side():
    a, b = drifting(0.05, n=100_000, seed=1, drift=0), drifting(0.05, n=100_000, seed=2, drift=0)
    start = time.perf_counter()
    ratio, (lo, hi), v, _ = verdict(a, b)
    assert v == "same" and lo < 1 < hi
    assert verdict(a, [x * 1.1 for x in b])[2] == "slower"
    assert time.perf_counter() - start < 10  # about 0.1 s on a 2-core CI machine: no exact-test combinatorics


def _tau_by_lookup(samples) -> float:
    """autocorrelation_time with each sample's mid-rank looked up in time order, as it was read before."""
    x = np.asarray(samples, dtype=np.float64)
    n = len(x)
    ordered = np.sort(x)
    r = (np.searchsorted(ordered, x, "left") + np.searchsorted(ordered, x, "right")) / 2.0
    r -= r.mean()
    spectrum = np.fft.rfft(r, 2 * n)
    acf = np.fft.irfft(spectrum * np.conj(spectrum))[:n]
    if acf[0] <= 0:
        return 1.0
    rho = acf / acf[0]
    if rho[1] <= compare_module.DEPENDENT_Z / math.sqrt(n):
        return 1.0
    taus = 2 * np.cumsum(rho) - 1
    window = np.arange(n)
    closed = np.flatnonzero((window >= compare_module.WINDOW * taus) & (window >= 1) & (window <= n // 2))
    return max(1.0, float(taus[closed[0]] if len(closed) else taus[1:n // 2 + 1].max()))


@hypothesis_settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.5, 0.6, 0.7, 1.0, 2.5]) | st.floats(0.1, 10.0), min_size=4, max_size=300),
       st.booleans())
def test_the_correlation_time_ranks_samples_by_mid_rank(samples, ramp):
    """The ranks are read in sorted order and put back: the same mid-ranks (ties share one) as looking each sample
    up in time order, hence the same tau."""
    if ramp:  # correlated: a slow ramp with ties, where a rank put back in the wrong place changes tau
        samples = sorted(samples)
    assert autocorrelation_time(samples) == _tau_by_lookup(samples)


def test_the_correlation_time_of_many_samples_is_kept_by_their_content(monkeypatch):
    """From MEMO_SAMPLES samples tau is computed once per content: a pair's samples were ranked and transformed three
    times. Equal samples in another list get the kept tau; samples changed in place are not served the old one."""
    n = compare_module.MEMO_SAMPLES
    rng = np.random.default_rng(3)
    ramp = (np.cumsum(rng.normal(size=n)) + 1000.0).tolist()  # a random walk: strongly correlated
    independent = (1.0 + rng.random(n)).tolist()
    tau = compare_module._autocorrelation_time(np.asarray(ramp))
    computed = []
    compute = compare_module._autocorrelation_time
    monkeypatch.setattr(compare_module, "_autocorrelation_time", lambda x: computed.append(len(x)) or compute(x))
    assert tau > 2 and [autocorrelation_time(list(ramp)) for _ in range(3)] == [tau] * 3
    assert len(computed) <= 1  # kept (or kept already by another test of these samples)
    ramp[:] = independent  # the same list, other samples
    assert autocorrelation_time(ramp) == compare_module._autocorrelation_time(np.asarray(independent)) == 1.0
    for size in range(compare_module.MEMO_KEPT + 2):  # the kept taus are bounded
        autocorrelation_time(independent + [2.0] * size)
    assert len(compare_module._TAUS) <= compare_module.MEMO_KEPT


@pytest.mark.slow
def test_the_correlation_time_of_millions_of_samples_is_seconds():
    """Each sample was looked up in the sorted samples in time order, jumping about memory: 6,000,000 samples of one
    cell (a 59 MB store) took 26 s a call, three calls a pair, and compare and report over a minute."""
    x = np.round(0.6 + np.random.default_rng(0).random(6_000_000) * 0.1, 6)
    start = time.perf_counter()
    assert autocorrelation_time(x) == 1.0
    assert time.perf_counter() - start < 15  # about 6 s on a busy 2-core machine; 26 s before


def test_too_few_samples_is_na():
    for n in (1, 3):  # no order of so few samples is evidence at alpha 0.05: no interval at all
        ratio, interval, v, note = verdict(noisy(1.0, n=n), noisy(1.01, n=n))
        assert v == "n/a" and interval is None and f"{n} + {n} samples" in note and "time longer" in note
        assert "needs 4 per cell" in note  # how many would: 1 / C(8, 4) < 0.025
    # overlapping sides whose rank interval reaches past the min effect: n/a, saying what gives an interval
    ratio, interval, v, note = verdict(noisy(1.0, n=24, spread=0.05), noisy(1.01, n=24, spread=0.05, seed=1))
    assert v == "n/a" and interval[0] < 1 < 1.03 < interval[1] and "25 per cell" in note and "time longer" in note
    assert judge([], [1.0] * 30, 1.0, 1.0, CompareConfig())[2] == "n/a"
    # 25 samples are 5 blocks of 5: enough for a verdict on a 2x change
    assert verdict(noisy(1.0, n=25), noisy(2.0, n=25))[2] == "slower"
    # tight samples of one distribution: the rank interval lies within the min effect
    assert verdict(noisy(1.0, n=20, spread=0.002), noisy(1.0, n=20, spread=0.002, seed=3))[2] == "same"


def test_too_few_samples_apart_beyond_the_min_effect_get_a_verdict():
    """A regression that cuts a cell's samples under --min-time (500x slower: 5 samples) was `n/a`, exit 0."""
    a = noisy(1.0, n=40)
    ratio, interval, v, note = verdict(a, noisy(500.0, n=5))
    assert v == "slower" and interval[0] > 400 and "40 + 5 samples" in note and "rank" in note
    assert verdict(noisy(500.0, n=5), a)[2] == "faster"
    assert verdict(a, [2.0])[2] == "slower"  # 1 / C(41, 1) = 0.024 < alpha / 2
    assert verdict(noisy(1.0, n=20), [2.0])[2] == "n/a"  # 1 / C(21, 1) = 0.048: no evidence at alpha 0.05
    assert verdict(noisy(1.0, n=3), [2.0])[2] == "n/a"  # 1 / C(4, 1): this order is no evidence
    assert verdict(noisy(1.0, n=20), [1.02] * 5)[2] == "n/a"  # above every A sample, but not by the min effect


def test_ten_times_slower_with_five_samples_a_side_is_slower():
    for seed in range(10):
        a, b = noisy(1.0, n=5, spread=0.1, seed=seed), noisy(10.0, n=5, spread=0.3, seed=100 + seed)
        ratio, (lo, hi), v, note = verdict(a, b)
        assert v == "slower" and lo > 1.03 and "5 + 5 samples" in note
        assert verdict(b, a)[2] == "faster"


def test_a_gross_regression_with_an_outlier_inside_its_range_is_slower():
    """115x slower, 18 against 11 samples, and one baseline call preempted for 120 ms (inside B's range): the
    samples overlap, so the old rule (every sample apart) said n/a and the gate passed."""
    a = noisy(0.81, n=17, spread=0.08, seed=1) + [120.0]
    b = noisy(93.65, n=11, spread=0.15, seed=2)
    ratio, (lo, hi), v, note = verdict(a, b)
    assert v == "slower" and lo > 50 and ratio == pytest.approx(115, rel=0.1)


def test_rank_counts_are_the_exact_null_distribution():
    import itertools

    for m in range(6):
        for n in range(6):
            got = rank_counts(m, n, m * n)
            want = [0] * (m * n + 1)
            for where in itertools.combinations(range(m + n), m):  # the positions of A's samples in the order
                want[sum(sum(1 for j in where if j < i) for i in range(m + n) if i not in where)] += 1
            assert got == want, (m, n)
    assert sum(rank_counts(24, 10_000, 24 * 10_000)) == math.comb(10_024, 24)


def test_rank_interval_is_the_rank_test_inverted():
    """A ratio just outside the interval is refused by the exact one-sided rank test of B against ratio x A,
    one just inside is not (the test counted here, from rank_counts)."""
    rng = np.random.default_rng(0)
    for _ in range(30):
        m, n = (int(x) for x in rng.integers(4, 15, 2))
        a, b = rng.lognormal(0, 0.1, m), rng.lognormal(0.05, 0.1, n)
        lo, hi = rank_interval(a, b, 0.05)
        counts, total = rank_counts(m, n, m * n), math.comb(m + n, m)

        def p_above(r):  # P(U >= observed) for the count of pairs with b > r x a
            u = int(sum((bj > r * a).sum() for bj in b))
            return sum(counts[u:]) / total

        assert p_above(lo * 0.999) <= 0.025 < p_above(lo * 1.001)


def test_t_quantile():
    for df, want in ((1, 12.7062047), (2, 4.3026527), (10, 2.2281389), (100, 1.9839715)):
        assert t_quantile(0.975, df) == pytest.approx(want, abs=1e-6)


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
    assert slow.ratio == pytest.approx(1.2, rel=0.02) and 1.03 < slow.interval[0] < 1.2 < slow.interval[1]
    assert [r["batch_size"] for r in cmp.only_a] == [8] and [r["batch_size"] for r in cmp.only_b] == [16]
    assert {c.verdict for c in cmp.regressions} == {"slower", "broken"}


def test_cli_exit_codes(two_runs, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["compare", "before", "after", "--db", two_runs])
    assert res.exit_code == 1, res.output
    assert "slower" in res.output and "broken" in res.output and "missing in B" in res.output
    res = runner.invoke(app, ["compare", "before-2", "same", "--db", two_runs])
    assert res.exit_code == 0, res.output
    assert "2 same" in res.output
    # a 25% threshold makes the 20% change not count; the broken cell still fails the gate
    res = runner.invoke(app, ["compare", "before", "after", "--db", two_runs, "--min-effect", "0.25"])
    assert res.exit_code == 1 and "1 broken" in res.output and "slower" not in res.output.split("verdict")[-1]
    store_bytes = open(two_runs, "rb").read()
    for args, says in ((["before", "nope"], "error: no run 'nope'"),
                       (["before", "after", "--alpha", "2"], "error: --alpha 2.0"),
                       (["before", "after", "--min-effect", "-1"], "error: --min-effect -1.0")):
        res = runner.invoke(app, ["compare", *args, "--db", two_runs])
        # one line on stderr, nothing on stdout
        assert res.exit_code == 2 and res.stderr.startswith(says) and res.stderr.count("\n") == 1, res.output
        assert res.stdout == ""
    assert open(two_runs, "rb").read() == store_bytes
    missing = tmp_path / "typo.db"
    res = runner.invoke(app, ["compare", "before", "after", "--db", str(missing)])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.startswith(f"error: no store at {missing}: check the path") and res.stderr.count("\n") == 1
    assert not missing.exists()


@pytest.mark.slow
def test_100000_samples_through_the_cli(tmp_path):
    db = str(tmp_path / "big.db")
    make_run(db, "a", [(cell("eager", 1), ok_result(drifting(0.05, n=100_000, seed=1, drift=0), 1))])
    make_run(db, "b", [(cell("eager", 1), ok_result(drifting(0.05, n=100_000, seed=2, drift=0), 1))])
    res = CliRunner().invoke(app, ["compare", "a", "b", "--db", db])
    assert res.exit_code == 0 and "1 same" in res.output, res.output


def keyed_run(db: str, name: str, cells: list[tuple[dict, Cell, list[float]]]) -> None:
    """A run whose cells are stored under JSON-object keys (the settings by name), as a key holding every
    setting that changes what is measured may be written."""
    store = Store(db)
    try:
        run_id, _ = store.create_run(name, "inference", {}, {"torch": "test", "gpus": []})
        for key, c, samples in cells:
            store_result(store, run_id, c, ok_result(samples, c.batch), key=json.dumps(key, sort_keys=True))
    finally:
        store.close()


def test_matched_on_the_stored_key(tmp_path):
    db = str(tmp_path / "k.db")

    def entry(stdev: float, batch: int, median: float, seed: int, min_time: float = 1.0):
        c = Cell("bert-tiny", "base", "eager", "fp32", batch, 64, seq_stdev=stdev, min_time=min_time)
        key = {"model": c.model, "task": c.task, "backend": c.backend, "dtype": c.dtype, "batch": batch,
               "seq": c.seq, "seq_stdev": stdev}
        return key, c, noisy(median, seed=seed)

    # padded and variable-length cells of one grid point are told apart by the key, not merged
    keyed_run(db, "padded", [entry(0.0, 1, 10.0, 1), entry(16.0, 1, 7.0, 2), entry(0.0, 8, 30.0, 3)])
    # B timed for longer (min_time is not in the key: still matched); its varlen cell got 10% slower
    keyed_run(db, "varlen", [entry(0.0, 1, 10.0, 11, 2.0), entry(16.0, 1, 7.7, 12, 2.0),
                             entry(32.0, 8, 30.0, 13, 2.0)])
    cmp = compare(db, "padded", "varlen")
    got = {(settings(c.record_a)["seq_stdev"], c.record_a["batch_size"]): c.verdict for c in cmp.cells}
    assert got == {(0.0, 1): "same", (16.0, 1): "slower"}
    assert [(settings(r)["seq_stdev"], r["batch_size"]) for r in cmp.only_a] == [(0.0, 8)]
    assert [(settings(r)["seq_stdev"], r["batch_size"]) for r in cmp.only_b] == [(32.0, 8)]
    res = CliRunner().invoke(app, ["compare", "padded", "varlen", "--db", db])
    assert res.exit_code == 1, res.output
    # the settings that vary between the matched cells are shown per row; those all share, once
    assert "seq_stdev=0" in res.output and "seq_stdev=16" in res.output
    assert "every cell: backend=eager batch=1 dtype=fp32 model=bert-tiny seq=64 task=base" in " ".join(
        res.output.split())
    # an unmatched cell says why: the other run has it only with another setting
    assert "not in B (B has seq_stdev=32)" in " ".join(res.output.split())


def test_object_keys_name_their_settings(two_runs):
    cmp = compare(two_runs, "before", "after")
    got = settings(cmp.cells[0].record_a)
    assert {k: got[k] for k in ("model", "task", "backend", "dtype", "batch", "seq")} == \
        {"model": "bert-tiny", "task": "base", "backend": "eager", "dtype": "fp32", "batch": 1, "seq": 8}
    table = comparison_table(cmp)
    assert table.headers[0] == "cell" and [r[0] for r in table.rows] == [
        "backend=eager batch=1", "backend=eager batch=2", "backend=sdpa batch=1"]
    assert "every cell:" in table.title and "model=bert-tiny" in table.title and "seq=8" in table.title
    why = {r[1]: r[3] for r in unmatched_table(cmp).rows}
    assert any(v == "not in B (B has batch=16)" for v in why.values()), why


# A cell's settings as a stored key holds them: a few names, values alike under == but not of one type among them
_SETTING = st.one_of(st.none(), st.sampled_from([0, 1, 2, 1.0, True, False, "a", "b", float("nan")]),
                     st.lists(st.sampled_from([1, "a"]), max_size=2))
_CELL = st.tuples(st.sampled_from(["inference", "generation"]),
                  st.dictionaries(st.sampled_from(["backend", "batch", "seq", "dtype", "seed"]), _SETTING))


def _unmatched(scenario: str, named: dict) -> dict:
    return {"scenario": scenario, "_key": json.dumps(named), "status": "ok"}


def _why_unmatched(rec: dict, others: list[tuple[object, dict]], other: str) -> str:
    """The reference unmatched_reasons is held to: the other run's nearest cell (same scenario, fewest differing
    settings, the earliest among equals), found by looking at every other cell; shown where at most two differ."""
    mine = settings(rec)
    best: list[str] | None = None
    best_settings: dict = {}
    for scenario, theirs in others:
        if scenario != rec.get("scenario"):
            continue
        diff = _differ(mine, theirs)
        if best is None or len(diff) < len(best):
            best, best_settings = diff, theirs
    shown = _text(best_settings, best) if best and len(best) <= 2 else ""
    return f"not in {other} ({other} has {shown})" if shown else f"not in {other}"


@hypothesis_settings(max_examples=300, deadline=None)
@given(mine=st.lists(_CELL, max_size=8), theirs=st.lists(_CELL, max_size=8))
def test_the_nearest_cell_found_through_the_index_is_the_one_a_look_at_every_cell_finds(mine, theirs):
    recs = [_unmatched(*c) for c in mine]
    others = [(o["scenario"], settings(o)) for o in (_unmatched(*c) for c in theirs)]
    assert unmatched_reasons(recs, others, "B") == [_why_unmatched(r, others, "B") for r in recs]


def test_thousands_of_cells_in_one_run_only_are_listed_in_seconds(two_runs):
    """Each unmatched cell's nearest cell was sought among all the other run's: two runs of 3,000 cells sharing
    none took a minute to list (10,000, ten); through an index it is linear in the cells."""
    cmp = compare(two_runs, "before", "after")
    def grid(side: int) -> list[dict]:
        return [_unmatched("inference", {"backend": "eager", "batch": b, "seq": 8 + side + 2 * s})
                for b in range(60) for s in range(50)]
    cmp.only_a, cmp.only_b = grid(0), grid(1)
    start = time.perf_counter()
    rows = unmatched_table(cmp).rows
    assert time.perf_counter() - start < 10
    assert len(rows) == 6000 and rows[0][3] == "not in B (B has seq=9)"


@given(st.floats(0, 10, exclude_max=True))
@example(9.9999)
def test_any_min_effect_reads_as_a_plain_percentage(min_effect):
    text = percent(min_effect)
    assert text.endswith("%") and "e+" not in text, text
    assert math.isclose(float(text[:-1]), min_effect * 100, rel_tol=0.01, abs_tol=1e-300)


def test_output_fits_100_columns(tmp_path):
    db = str(tmp_path / "w.db")
    long_model = "/data/checkpoints/" + "a-rather-long-checkpoint-folder-name-" * 3 + "final"
    rows_a = [(cell(b, n, model=m), ok_result(noisy(10.0 * n, seed=n), n))
              for m in ("bert-tiny", long_model) for b in ("eager", "sdpa") for n in (1, 2)]
    rows_b = [(c, ok_result(noisy(10.0 * c.batch * (1.2 if c.backend == "sdpa" else 1), n=12, seed=9), c.batch))
              for c, _ in rows_a]
    make_run(db, "a", rows_a + [(cell("eager", 64, model=long_model), ok_result(noisy(500.0), 64))])
    make_run(db, "b", rows_b)
    res = CliRunner().invoke(app, ["compare", "a", "b", "--db", db])
    # 12 samples in B: the exact rank interval; within the min effect for eager, above it for sdpa's 20% slowdown
    assert res.exit_code == 1 and "4 same, 4 slower" in res.output, res.output
    lines = res.output.splitlines()
    assert max(len(x) for x in lines) <= 100 and "\u2026" not in res.output
    assert "4 same, 4 slower, 1 missing in B" in res.output and "rank interval" in res.output
    # a folded value is whole: its pieces, read down its column, give it back
    flat = "".join(x.strip("│┃ ") for x in lines)
    assert "a-rather-long" in flat and "final" in flat


@pytest.mark.slow
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


def test_runs_that_share_no_cell_are_refused_not_passed(tmp_path):
    """A CI gate pointed at the wrong runs compared nothing: that is bad input (exit 2), not a pass."""
    db = str(tmp_path / "n.db")
    make_run(db, "bert", [(cell("eager", 1), ok_result(noisy(10.0, seed=1), 1))])
    make_run(db, "other", [(cell("eager", 1, model="gpt2-tiny"), ok_result(noisy(10.0, seed=2), 1))])
    make_run(db, "train", [(cell("eager", 4), ok_result(noisy(10.0, seed=3), 4))], kind="training")
    runner = CliRunner()
    for b, says in (("other", "no cell of one has the settings"), ("train", "'bert' holds inference cells, 'train' training cells")):
        res = runner.invoke(app, ["compare", "bert", b, "--db", db])
        assert res.exit_code == 2 and res.stdout == "", res.output
        assert res.stderr.startswith(f"error: runs 'bert' and '{b}' share no cell to compare") and says in res.stderr
        assert res.stderr.count("\n") == 1
    # a run against itself judged every cell `same` and passed: it checks nothing (a name mistyped in a CI step)
    for a, b in (("bert", "bert"), ("train", "last")):
        res = runner.invoke(app, ["compare", a, b, "--db", db])
        assert res.exit_code == 2 and "are one run" in res.stderr and res.stderr.count("\n") == 1, res.output
    with pytest.raises(SpecError, match="a comparison needs two different runs"):
        compare(db, "other", "other")


def test_runs_whose_shared_cells_all_failed_compared_nothing_and_are_refused(tmp_path):
    """Every shared cell failed in both runs: each verdict was n/a and the gate exited 0 having measured nothing."""
    db = str(tmp_path / "f.db")
    failed = [(cell("eager", b), bad_result("error", "boom")) for b in (1, 2)]
    make_run(db, "a", failed)
    make_run(db, "b", [failed[0], (cell("eager", 2), bad_result("oom", "out of memory"))])
    res = CliRunner().invoke(app, ["compare", "a", "b", "--db", db])
    assert res.exit_code == 2 and res.stdout == "", res.output
    assert res.stderr == ("error: runs 'a' and 'b' share no cell to compare: the 2 cell(s) they share ran ok in "
                          "neither (A: 2 error; B: 1 error, 1 oom): fix what failed and run them again\n"), res.stderr
    # One cell measured in either run is a comparison: a cell that broke or got fixed is what a gate is for.
    make_run(db, "c", [(cell("eager", 1), ok_result(noisy(10.0, seed=4), 1)), failed[1]])
    res = CliRunner().invoke(app, ["compare", "a", "c", "--db", db])
    assert res.exit_code == 0 and "1 fixed" in res.stdout, res.output


def test_a_115x_regression_with_few_stored_samples_fails_the_gate(tmp_path):
    """The case that passed the gate: a run 115x slower than its baseline, 18 against 11 stored samples (one
    baseline call preempted into B's range), and a 10x slower cell with 5 samples a side: `slower`, exit 1."""
    db = str(tmp_path / "g.db")
    base = noisy(0.81, n=17, spread=0.08, seed=1) + [120.0]
    five = noisy(1.0, n=5, spread=0.05, seed=3)
    make_run(db, "base", [(cell("sdpa", 1), ok_result(base, 1)), (cell("eager", 1), ok_result(five, 1))])
    make_run(db, "slow", [(cell("sdpa", 1), ok_result(noisy(93.65, n=11, spread=0.15, seed=2), 1)),
                          (cell("eager", 1), ok_result([x * 10 for x in noisy(1.0, n=5, spread=0.05, seed=4)], 1))])
    res = CliRunner().invoke(app, ["compare", "base", "slow", "--db", db])
    assert res.exit_code == 1 and "2 slower" in res.output and "18 + 11 samples" in res.output, res.output
# --- the compare gate at any level, its notes on n/a cells ------------------------------------------------------------

@pytest.mark.slow
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
    # every pair n/a: the gate judged nothing, and must not pass (it passed a 10x regression at 3 samples a side);
    # the refusal carries the cell's note, with an inference cell's --min-time hint
    with pytest.raises(SpecError, match="no pair of cells got a verdict .*--min-time"):
        compare(db, "a", "b")
    few10x = ok_result([10 * x for x in (1.0, 1.1, 1.2)], 1)
    make_run(db, "c", [(cell("eager", 1), ok_result([1.0, 1.1, 1.2], 1))])
    make_run(db, "d", [(cell("eager", 1), few10x)])
    res = CliRunner().invoke(app, ["compare", "c", "d", "--db", db])
    assert res.exit_code == 2 and "no pair of cells got a verdict" in res.stderr, res.output


def test_a_cell_of_a_that_b_lacks_fails_the_gate(tmp_path):
    # B ran half the grid (it crashed part way, or is one shard): 2 same and 2 unmatched passed, exit 0
    db = str(tmp_path / "m.db")
    make_run(db, "a", [(cell(b, n), ok_result(noisy(5.0 * n, seed=n), n)) for b in ("eager", "sdpa") for n in (1, 2)])
    make_run(db, "b", [(cell(b, 1), ok_result(noisy(5.0, seed=9), 1)) for b in ("eager", "sdpa")])
    make_run(db, "c", [(cell(b, n), ok_result(noisy(5.0 * n, seed=n + 3), n)) for b in ("eager", "sdpa")
                       for n in (1, 2, 4)])
    res = CliRunner().invoke(app, ["compare", "a", "b", "--db", db, "--json", "-"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and doc["missing_in_b"] == 2 and doc["failed"] and doc["regressions"] == 0
    assert compare(db, "a", "b").summary().startswith("b vs a: 2 same, 2 missing in B")
    res = CliRunner().invoke(app, ["compare", "a", "c", "--db", db])  # B's extra cells are no regression
    assert res.exit_code == 0 and "2 only in B" in res.output, res.output


@pytest.mark.parametrize("failed_a, failed_b, n, verdict", [
    (0, 121, 201, "broken"),  # a server that sheds 60% of its load answers the rest as fast
    (0, 10, 20, "broken"),
    (0, 1, 200, "same"),  # 0.5 points: under the 3-point min effect
    (5, 9, 100, "same"),  # 4 points, within chance (z 1.1)
    (60, 0, 200, "same"),  # fewer failures: no regression
])
def test_a_load_test_whose_failures_grew_is_broken_whatever_its_latency(tmp_path, failed_a, failed_b, n, verdict):
    """serve --url times the answered requests alone: B's latency is the same while it fails more of them, and the
    gate passed it (exit 0). compare.more_failures judges the failed share."""
    db = str(tmp_path / "f.db")
    for name, failed in (("A", failed_a), ("B", failed_b)):
        make_run(db, name, [(cell("eager", 1), ok_result(noisy(10.0, seed=len(name)), 1, n_requests=n,
                                                          failed=failed, error_rate=failed / n))])
    res = CliRunner().invoke(app, ["compare", "A", "B", "--db", db, "--json", str(tmp_path / "c.json")])
    (c,) = json.loads((tmp_path / "c.json").read_text())["cells"]
    assert c["verdict"] == verdict, c
    assert res.exit_code == (1 if verdict == "broken" else 0), res.output
    if verdict == "broken":
        assert f"B failed {failed_b / n:.1%} of its requests" in c["note"]


@pytest.mark.parametrize("reps_a,reps_b,alpha", [
    ([1.0, 1.3], [1.0, 1.3], 1e-6),  # two repeats at a strict --alpha: a log ratio of about +-1,000
    ([1.0, 1e300], [1.0, 1e300], 0.05),
    ([0.0, 1.0], [1.0, 1.0], 0.05),  # a repeat's median of 0 ms: no log ratio
])
def test_repeats_that_bound_no_ratio_are_na_not_a_traceback(reps_a, reps_b, alpha):
    """math.exp of the interval's bound raised OverflowError in compare and report."""
    samples = [1.0] * 40
    ratio, interval, verdict, note = judge(samples, samples, 1.0, 1.0, CompareConfig(alpha, 0.0), None, reps_a, reps_b)
    assert (interval, verdict) == (None, "n/a") and note


@pytest.mark.parametrize("zero_side", ["A", "B"])
def test_a_side_of_0_ms_calls_is_na_either_way(zero_side):
    """A clock coarser than the call reads 0 ms: B all 0 ms was `faster` within the interval (0, 0), while A all 0 ms
    was n/a; neither side bounds B/A."""
    timed, zero = [1.0 + 0.01 * i for i in range(40)], [0.0] * 40
    a, b = (zero, timed) if zero_side == "A" else (timed, zero)
    _, interval, verdict, note = judge(a, b, float(np.median(a)), float(np.median(b)), CompareConfig())
    assert (interval, verdict) == (None, "n/a") and "0 ms" in note


def test_samples_at_the_ends_of_the_floats_are_compared_and_shown_in_one_width(tmp_path):
    """Samples the store takes (finite, 0 or more) whose ratios pass any float: no interval of inf, and a median of
    1e300 ms shown in 301 digits, wider than any terminal."""
    import re

    db = str(tmp_path / "x.db")
    make_run(db, "a", [(cell("eager", 1), ok_result([1e-300 * (1 + i / 100) for i in range(40)], 1))])
    make_run(db, "b", [(cell("eager", 1), ok_result([1e300 * (1 + i / 100) for i in range(40)], 1))])
    res = CliRunner().invoke(app, ["compare", "a", "b", "--db", db])
    assert "Traceback" not in res.output and not re.search(r"\binf\b", res.output), res.output
    assert "1.195e+300" in res.output and not re.search(r"\d{20}", res.output), res.output
    assert "B/A is past the largest float" in res.output
    interval = rank_interval(np.array([1e-300, 2e-300, 3e-300] * 4), np.array([1e300, 2e300, 3e300] * 4), 0.05)
    assert interval is not None and not math.isfinite(interval[1])  # its callers say n/a, and why


def test_b_over_a_lies_inside_its_interval_where_either_run_was_repeated(tmp_path):
    # A repeated run's latency_ms is its middle repeat's median while its interval came from every repeat's samples
    # (or, both repeated, from the repeats' log means): B/A 1.019 was printed beside 1.020-1.049
    db = str(tmp_path / "r.db")
    # the middle repeat's median (the lower of two) stands apart from the pooled samples' median
    rep = ok_result(noisy(10.0, n=80, seed=1), 1, latency_ms=9.0, repeat_medians_ms=[9.0, 11.0], repeats=2)
    make_run(db, "rep", [(cell("eager", 1), rep)])
    make_run(db, "one", [(cell("eager", 1), ok_result(noisy(10.4, n=80, seed=3), 1))])
    make_run(db, "rep2", [(cell("eager", 1), ok_result(noisy(10.0, n=80, seed=4), 1, latency_ms=9.9,
                                                      repeat_medians_ms=[9.9, 10.6], repeats=2))])
    for a, b in (("rep", "one"), ("one", "rep"), ("rep", "rep2")):
        (c,) = compare(db, a, b).cells
        lo, hi = c.interval
        assert lo <= c.ratio <= hi, (a, b, c.ratio, c.interval)
        assert c.ratio == pytest.approx(c.median_b / c.median_a)
    (c,) = compare(db, "rep", "rep2").cells
    assert c.method == "repeats" and c.median_a == pytest.approx((9.0 * 11.0) ** 0.5)


def test_a_missing_run_is_named_in_quotes_by_every_command_that_reads_one(two_runs):
    # troubleshooting.md's line is `error: no run 'zz' in t.db`: runs --spec and api.records said `no run zz`
    runner = CliRunner()
    for args in (["runs", "--spec", "nope"], ["compare", "before", "nope"], ["report", "nope"]):
        res = runner.invoke(app, [*args, "--db", two_runs])
        assert res.exit_code == 2 and res.stderr.startswith(f"error: no run 'nope' in {two_runs}"), res.output
    with pytest.raises(SpecError, match=r"no run 'nope', 'no pe' in"):
        api.records(two_runs, ["nope", "no pe"])


def _max_rate_search(db: str, name: str, offline_ms: float, max_rate: float, probes: list[float]) -> None:
    """A `serve --find-max-rate` run as serve/run.py stores it: the offline cell, a cell per rate probe, the answer."""
    store = Store(db)
    run_id, _ = store.create_run(name, "serve", {"find_max_rate": True, "slo_ms": 10.0}, {"gpus": []})
    base = {"model": "bert-tiny", "task": "base", "backend": "eager", "dtype": "fp32", "lengths": "fixed:32",
            "max_batch_size": 8, "max_wait_ms": 2.0, "slo_ms": 10.0, "seed": 0, "activation": None}
    for mode, rate in [("offline", None), *(("rate", r) for r in probes)]:
        ident = {**base, "scenario": "serve", "mode": mode, **({"rate": rate} if rate else {})}
        samples = noisy(offline_ms if rate is None else 2.0, seed=int(rate or 0))
        store.put_cell(run_id, json.dumps(ident, sort_keys=True), "serve", "ok",
                       {**ident, "device": "cpu", "latency_ms": float(np.median(samples))}, cell={}, samples=samples)
    ident = {**base, "scenario": "serve-max-rate", "mode": "max-rate"}
    store.put_cell(run_id, json.dumps(ident, sort_keys=True), "serve-max-rate", "ok",
                   {**ident, "max_rate": max_rate, "percentile": 99.0}, cell={})
    store.close()


@pytest.mark.parametrize("offline_b,exit_code", [(5.0, 0), (5.6, 1)])
def test_the_probes_of_two_max_rate_searches_are_a_search_not_cells_missing_in_b(tmp_path, offline_b, exit_code):
    """Each probe's rate follows from the one before, so a rerun of one server probes other rates: every probe of A
    was `missing in B` and the gate failed, exit 1, on no change. The offline cells are judged; the answers shown."""
    db = str(tmp_path / "s.db")
    _max_rate_search(db, "a", 5.0, 540.5, [298.22, 447.34, 521.89, 559.17, 540.53])
    _max_rate_search(db, "b", offline_b, 541.2, [298.3, 447.45, 522.0, 559.3, 541.2])
    cmp = compare(db, "a", "b")
    assert not cmp.only_a and not cmp.only_b
    offline, answer = sorted(cmp.cells, key=lambda c: c.record_a["scenario"])
    assert offline.verdict == ("slower" if exit_code else "same"), offline
    assert answer.verdict == "n/a" and "max rate 540.5/s in A, 541.2/s in B" in answer.note, answer.note
    res = CliRunner().invoke(app, ["compare", "a", "b", "--db", db])
    assert res.exit_code == exit_code and "missing in B" not in res.output, res.output


def test_a_b_that_lacks_cells_of_a_fails_the_gate_where_its_one_pair_is_na(tmp_path):
    """A run B that crashed after one cell of a few samples: its pair is n/a, and compare refused the runs as judging
    nothing (exit 2) without a word of the cells B lacks. Those fail the gate (exit 1) and are listed."""
    db = str(tmp_path / "c.db")
    make_run(db, "a", [(cell("eager", b), ok_result(noisy(10.0, seed=b), b)) for b in (1, 2, 4)])
    make_run(db, "b", [(cell("eager", 1), ok_result([10.0, 12.0], 1))])
    res = CliRunner().invoke(app, ["compare", "a", "b", "--db", db, "--json", str(tmp_path / "c.json")])
    assert res.exit_code == 1, res.output
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["missing_in_b"] == 2 and doc["counts"] == {"n/a": 1} and doc["failed"]
    # with nothing missing, every pair n/a is still no comparison
    make_run(db, "c", [(cell("eager", b), ok_result([10.0, 12.0], b)) for b in (1, 2, 4)])
    res = CliRunner().invoke(app, ["compare", "a", "c", "--db", db])
    assert res.exit_code == 2 and "no pair of cells got a verdict" in res.output, res.output


def _gate_runs(tmp_path) -> str:
    """Runs `a` and `b` of one distribution (exit 0) and `slow`, 50% slower (exit 1)."""
    db = str(tmp_path / "gate.db")
    make_run(db, "a", [(cell("eager", n), ok_result(noisy(10.0 * n, seed=n), n)) for n in (1, 2)])
    make_run(db, "b", [(cell("eager", n), ok_result(noisy(10.0 * n, seed=10 + n), n)) for n in (1, 2)])
    make_run(db, "slow", [(cell("eager", n), ok_result(noisy(15.0 * n, seed=20 + n), n)) for n in (1, 2)])
    return db


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("extra", [[], ["--json", "-"], ["--markdown", "-"]])
def test_a_stdout_that_cannot_be_written_is_not_read_as_a_regression(tmp_path, extra):
    """stdout on a full disk exited 1, the gate's "regression", where the runs were the same: now one line and
    exit 3, whatever the verdict would have been."""
    db = _gate_runs(tmp_path)
    for run_b in ("b", "slow"):
        with open("/dev/full", "w") as full:
            out = subprocess.run([sys.executable, "-m", "transbench", "compare", "a", run_b, "--db", db, *extra],
                                 stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
        assert out.returncode == 3 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1 and "No space left on device" in out.stderr and "exit 3" in out.stderr


@pytest.mark.parametrize("extra", [[], ["--json", "-"]])
def test_a_pipe_closed_early_ends_quietly_with_the_verdicts_exit(tmp_path, extra):
    """`compare a b | head -1` exited 1 (rich's answer to a broken pipe) where B was no regression."""
    db = _gate_runs(tmp_path)
    for run_b, code in (("b", 0), ("slow", 1)):
        for read in (0, 1):  # closed before a word was written; after its first line
            proc = subprocess.Popen([sys.executable, "-m", "transbench", "compare", "a", run_b, "--db", db, *extra],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if read:
                first_line(proc)
            proc.stdout.close()
            err = proc.stderr.read().decode()
            assert proc.wait(timeout=120) == code and err == "", (run_b, read, err)
            proc.stderr.close()


# Values of each JSON type; a key retyped takes one its declared type is not (null is every key's "does not apply")
JSON_VALUES = {"string": "x", "number": 2.5, "integer": 3, "boolean": True, "array": [1], "object": {"a": 1}}
_RECORD_TEXT = {"scenario": "string", "status": "string", "model": "string", "backend": "string", "dtype": "string",
                "device": "string", "latency_ms": "number", "batch_size": "integer", "seq_len": "integer"}


def _wrong_values(key: str) -> list:
    declared = _RECORD_TEXT[key]
    wrong = {"string": ("number", "integer", "boolean", "array", "object"),
             "number": ("string", "boolean", "array", "object"), "integer": ("string", "number", "boolean", "array",
                                                                              "object")}[declared]
    return [JSON_VALUES[t] for t in wrong]


@pytest.fixture(scope="module")
def stored_pair(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("records") / "pair.db")
    make_run(db, "a", [(cell("eager", n), ok_result(noisy(10.0 * n, seed=n), n)) for n in (1, 2)])
    make_run(db, "b", [(cell("eager", n), ok_result(noisy(10.0 * n, seed=10 + n), n)) for n in (1, 2)])
    return db


@hypothesis_settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(_RECORD_TEXT)), data=st.data(), run=st.sampled_from(["a", "b"]),
       removed=st.booleans(), every=st.booleans())
@example(key="scenario", data=None, run="a", removed=True, every=True)
def test_a_record_missing_or_retyping_a_required_key_is_refused_in_one_line(stored_pair, tmp_path_factory, key, data,
                                                                            run, removed, every):
    """A stored record without its `scenario` read as a cell of no scenario: compare said the runs "share no cell"
    (exit 2, the damage unsaid). Any record key removed (of the required, store.db.RECORD_REQUIRED) or given another
    JSON type (of those the catalogue types) is refused as damage: one line naming the store, the run and the key,
    exit 2, nothing written."""
    import shutil
    import sqlite3

    from transbench.store.db import RECORD_REQUIRED

    if removed and key not in RECORD_REQUIRED:
        removed = False  # an optional key may be left out: a record of another scenario has none of it
    value = None if removed else (data.draw(st.sampled_from(_wrong_values(key))) if data is not None
                                  else _wrong_values(key)[0])
    db = str(tmp_path_factory.mktemp("edited") / "s.db")
    shutil.copy(stored_pair, db)
    con = sqlite3.connect(db)
    run_id = con.execute("SELECT run_id FROM runs WHERE name = ?", (run,)).fetchone()[0]
    rows = con.execute("SELECT rowid, record FROM cells WHERE run_id = ?", (run_id,)).fetchall()
    for rowid, text in rows if every else rows[:1]:
        record = json.loads(text)
        if removed:
            del record[key]
        else:
            record[key] = value
        con.execute("UPDATE cells SET record = ? WHERE rowid = ?", (json.dumps(record), rowid))
    con.commit()
    con.close()
    before = open(db, "rb").read()
    res = CliRunner().invoke(app, ["compare", "a", "b", "--db", db])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert res.output.startswith("error: store ") and res.output.count("\n") == 1, res.output
    assert "is damaged" in res.output and f"of run '{run}'" in res.output and key in res.output, res.output
    assert "share no cell" not in res.output and "Traceback" not in res.output
    assert open(db, "rb").read() == before


@pytest.mark.parametrize("run_a, run_b, empty", [("a", "empty", "'empty' holds"), ("empty", "a", "'empty' holds")])
def test_a_run_without_cells_is_named_not_sent_to_compare_grids(tmp_path, run_a, run_b, empty):
    """A run that stored no cell (stopped before its first) was refused as "no cell of one has the settings of a cell
    of the other", which sends the reader to compare two grids: the line names the run that holds none."""
    db = str(tmp_path / "e.db")
    make_run(db, "a", [(cell("eager", n), ok_result(noisy(10.0 * n, seed=n), n)) for n in (1, 2)])
    make_run(db, "empty", [])
    res = CliRunner().invoke(app, ["compare", run_a, run_b, "--db", db])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert empty in res.output and "no cell that compare judges" in res.output
    assert "settings of a cell" not in res.output
