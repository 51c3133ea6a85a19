"""Tails you can trust: MLPerf LoadGen's early-stopping rule against its published values, and the serve
record's percentiles, TPOT and multi-objective goodput on hand-built request logs."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transbench.errors import SpecError
from transbench.scenarios.serve import tails
from transbench.scenarios.serve.load import LoadPlan, Request, Served, Trace
from transbench.scenarios.serve.stats import account, name, parse_percentiles, parse_slo, tpot_ms


# --- LoadGen's early stopping -------------------------------------------------------------------------------

def test_minimum_requests_match_loadgen():
    """LoadGen's minimums at its default confidence 0.99: 64 queries for p90, 662 for p99."""
    assert tails.min_requests(0.90) == 64
    assert tails.min_requests(0.99) == 662
    assert tails.allowed_overs(63, 0.90) is None and tails.allowed_overs(64, 0.90) == 0
    assert tails.allowed_overs(661, 0.99) is None and tails.allowed_overs(662, 0.99) == 0


@pytest.mark.parametrize("n, discarded", [(2048, 172), (2116, 178), (2145, 181), (7469, 685)])
def test_discards_match_loadgen_summaries(n, discarded):
    """LoadGen's SingleStream summaries print "Processed at least 64 queries (n). Would discard k highest latency
    queries" for its p90 estimate: the same k here."""
    assert tails.allowed_overs(n, 0.90) == discarded


def test_upper_estimate_is_the_value_above_the_discarded():
    values = list(range(1, 2049))  # 1..2048 ms, shuffled order must not matter
    est = tails.upper_estimate(values[::-1], 0.90)
    assert est == 2048 - 172  # 172 values above it
    assert est >= values[int(0.9 * 2047)]  # an upper bound: never below the empirical p90
    assert tails.upper_estimate(values[:63], 0.90) is None


def test_verdict_never_passes_without_enough_requests():
    assert tails.verdict(20, 0, 0.99) == (False, False)  # 20 perfect requests say nothing about a p99
    assert tails.verdict(662, 0, 0.99) == (True, True)
    assert tails.verdict(662, 1, 0.99) == (True, False)
    n = 10_000
    allowed = tails.allowed_overs(n, 0.99)
    assert 60 < allowed < 100  # fewer than the empirical 1% (100): the margin the confidence asks
    assert tails.verdict(n, allowed, 0.99) == (True, True) and tails.verdict(n, allowed + 1, 0.99) == (True, False)


def test_a_million_requests_is_quick():
    import time

    t0 = time.perf_counter()
    assert tails.allowed_overs(1_000_000, 0.90) > 99_000
    assert time.perf_counter() - t0 < 5


# --- percentiles, TPOT, goodput -------------------------------------------------------------------------

def test_percentile_names_are_unique():
    assert [name(q) for q in (50, 90, 99, 99.9, 5, 2.5, 99.99)] == ["p50", "p90", "p99", "p999", "p05", "p025", "p9999"]
    assert name(9.99) != name(99.9)


@pytest.mark.parametrize("text, message", [("50,abc", "'abc' is not a number"), ("0", "above 0 and below 100"),
                                            ("100", "above 0 and below 100"), ("50,50", "lists 50 twice"),
                                            ("99.12345", "at most 4 decimals")])
def test_bad_percentiles(text, message):
    with pytest.raises(SpecError, match=message):
        parse_percentiles(text)


@given(st.floats(99.99995, 100, exclude_max=True) | st.floats(0, 5e-5, exclude_min=True))
def test_a_percentile_refused_is_shown_as_given(q):
    # a list of floats (the command line's, the API's) was shown through :g, so 99.99999999 read "100 must be below 100"
    with pytest.raises(SpecError) as info:
        parse_percentiles([q])
    assert f"--percentiles: {q:g} must be" in str(info.value) if float(f"{q:g}") == q else \
        f"--percentiles: {q!r} must be" in str(info.value)


@pytest.mark.parametrize("text, message", [("ttft", "not METRIC:MS"), ("latency:5", "not METRIC:MS"),
                                            ("ttft:x", "not a number"), ("ttft:0", "above 0"),
                                            ("e2e:5,e2e:6", "names e2e twice"), ("tpot:nan", "finite")])
def test_bad_slo(text, message):
    with pytest.raises(SpecError, match=message):
        parse_slo(text)


def _gen(rid, arrival, steps):
    return Served(Request(rid, arrival, 8), arrival, steps[-1], 1, list(steps))


def test_tpot_ttft_and_goodput_on_a_hand_built_log():
    """Four generated requests: TPOT = (e2e - TTFT) / (tokens - 1); goodput counts those meeting every objective."""
    served = [_gen(0, 0.0, [0.10, 0.12, 0.14]),  # ttft 100, tpot 20, e2e 140
              _gen(1, 1.0, [1.30, 1.40]),  # ttft 300 (misses ttft:200), tpot 100 (misses tpot:50)
              _gen(2, 2.0, [2.05, 2.06, 2.07, 2.08, 2.09]),  # ttft 50, tpot 10, e2e 90
              _gen(3, 3.0, [3.01])]  # one token: no TPOT, meets tpot by default
    assert tpot_ms(served[0]) == pytest.approx(20) and tpot_ms(served[3]) is None
    plan = LoadPlan([8], arrivals=[0.0, 1.0, 2.0, 3.0], span_s=4.0)
    trace = Trace(served, [], [(s.start, s.done, 1) for s in served], plan, 4.0)
    rec, _, _ = account(trace, None, 1.0, objectives={"ttft": 200, "tpot": 50}, percentiles=[50])
    assert rec["goodput"] == 0.75 and rec["slo_misses"] == 1 and rec["goodput_rate"] == pytest.approx(3 / 4.0)
    assert rec["tpot_p50_ms"] == pytest.approx(20)  # of 20, 100, 10
    assert rec["ttft_p50_ms"] == pytest.approx(75)  # of 100, 300, 50, 10
    assert rec["n_requests"] == 4 and rec["tail_valid"] is False and rec["slo_met"] is False  # 4 < 662
    rec, _, _ = account(trace, None, 1.0, objectives={"e2e": 200}, percentiles=[50])
    assert rec["goodput"] == 0.75 and rec["slo_ms"] == 200  # request 1's e2e is 400 ms


def test_e2e_verdict_follows_the_upper_estimate():
    """--slo-ms: met exactly where LoadGen's p99 estimate is within it, and only with enough requests."""
    n = 2000
    lat = [1.0] * n
    for i in range(0, n, 100):  # 1% of requests at 50 ms: the empirical p99 is near 1 ms
        lat[i] = 50.0
    served = [Served(Request(i, i * 0.001, 8), i * 0.001, i * 0.001 + x / 1e3, 1) for i, x in enumerate(lat)]
    plan = LoadPlan([8], arrivals=[i * 0.001 for i in range(n)], span_s=n * 0.001)
    trace = Trace(served, [], [], plan, n * 0.001 + 0.05)
    rec, _, _ = account(trace, 10.0, None, percentiles=[50, 90, 99])
    assert rec["latency_p99_ms"] < 10  # the empirical percentile alone would pass
    assert rec["latency_p99_upper_ms"] == pytest.approx(50.0)  # 20 over 10 ms, more than the 8 allowed
    assert rec["tail_valid"] is True and rec["slo_met"] is False
    assert rec["latency_p90_upper_ms"] == pytest.approx(1.0) and rec["tail_min_requests"] == 662


def test_slo_in_the_cell_key_is_text():
    """The objectives reach records and reports as one canonical text (a dict could not group a report's rows)."""
    from transbench.scenarios.serve.cell import ServeCell
    from transbench.scenarios.serve.lengths import Lengths

    c = ServeCell("bert-tiny", "generate", "sdpa", "fp32", "rate", rate=1.0, slo={"ttft": 200.0, "tpot": 50.0},
                  lengths=Lengths("fixed", 8, 8).to_dict())
    assert c.identity()["slo"] == "tpot:50,ttft:200"
    assert c.objectives() == {"ttft": 200.0, "tpot": 50.0}
    assert ServeCell("bert-tiny", "generate", "sdpa", "fp32", "rate", rate=1.0, slo_ms=20).objectives() == {"e2e": 20}


def test_tail_valid_reads_as_a_verdict_in_every_table():
    """The serve table printed `tail valid` as on/off, as if it were a switch the user set; the training table's
    switches stay on/off. One rule (keys.flag) for the terminal, the training table and the report."""
    from rich.console import Console

    from transbench.cli.serve import _table
    from transbench.cli.train import training_table
    from transbench.keys import show

    recs = [{"backend": "eager", "mode": "rate", "rate": r, "status": "ok", "latency_p50_ms": 1.0,
             "latency_p99_ms": 2.0, "n_requests": n, "tail_valid": n >= 662} for r, n in ((1.0, 4), (2.0, 700))]
    console = Console(width=200, record=True, force_terminal=False)
    console.print(_table(recs, "serve x"))
    lines = [line for line in console.export_text().splitlines() if "│" in line]
    assert [line.split("│")[-2].strip() for line in lines] == ["no", "yes"]
    assert show("slo_met", True) == "yes" and show("grad_ckpt", True) == "on" and show("compile", False) == "off"
    console = Console(width=200, record=True, force_terminal=False)
    console.print(training_table([{"status": "ok", "grad_ckpt": True}, {"status": "ok", "grad_ckpt": False}],
                                 [("status", "status"), ("grad_ckpt", "grad ckpt")]))
    assert "on" in console.export_text() and "True" not in console.export_text()
