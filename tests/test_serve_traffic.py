"""Traffic shapes: gamma and constant arrivals, trace files (Mooncake's format) and their replay, no coordinated
omission under every arrival kind, the load generator's own lag, and bad traffic options refused in one line."""

import json
import os
import statistics
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transbench.errors import SpecError
from transbench.scenarios.serve import arrivals, trace as serve_trace
from transbench.scenarios.serve.batcher import BatchPolicy
from transbench.scenarios.serve.load import LoadPlan, run_load
from transbench.scenarios.serve.stats import account

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "small.jsonl"


@pytest.mark.parametrize("b", [0.25, 1.0, 4.0])
def test_gamma_gaps_mean_and_variance(b):
    """vLLM's burstiness: shape B, scale 1/(rate B): mean gap 1/rate, variance 1/(B rate^2)."""
    rate = 200.0
    times = arrivals.parse(f"gamma:{b}").times(rate, 200.0, seed=1)
    gaps = [y - x for x, y in zip([0.0, *times], times)]
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.05)
    assert statistics.pvariance(gaps) == pytest.approx(1 / (b * rate**2), rel=0.12)


def test_gamma_one_is_poisson_and_constant_is_even():
    assert arrivals.parse("gamma:1") == arrivals.parse("poisson")
    times = arrivals.parse("constant").times(10.0, 1.0, seed=0)
    assert times == pytest.approx([0.1 * i for i in range(1, 10)])
    assert arrivals.parse("constant").times(10.0, 1.0, seed=5) == times  # no randomness


@pytest.mark.parametrize("text", ["gamma", "gamma:", "gamma:x", "gamma:0", "gamma:-1", "gamma:inf", "poisson:2",
                                  "uniform", ""])
def test_bad_arrivals(text):
    with pytest.raises(SpecError, match="--arrivals"):
        arrivals.parse(text)


def test_example_trace_reads(tmp_path):
    t = serve_trace.read(str(EXAMPLE))
    assert len(t.times_s) == 200 and t.times_s[0] == 0.0 and max(t.inputs) <= 64
    assert t.source.startswith("small.jsonl@") and t.plan(2.0)[-1] == pytest.approx(t.times_s[-1] / 2)
    # Mooncake's lines read as they are: hash_ids (and any other field) ignored
    f = tmp_path / "mooncake.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": [0, 1, 2]}\n'
                 '{"timestamp": 27482, "input_length": 7319, "output_length": 490, "hash_ids": [0, 14]}\n')
    m = serve_trace.read(str(f))
    assert m.times_s == (0.0, 27.482) and m.inputs == (6755, 7319) and m.outputs == (500, 490)
    f.write_text(f.read_text() + "\n")  # another file, another digest: a resumed run refuses it
    assert serve_trace.read(str(f)).digest != m.digest


@pytest.mark.parametrize("text, message", [
    ("not json\n", "line 1: not JSON"),
    ("[1, 2]\n", "line 1: not a JSON object"),
    ('{"timestamp": 0, "input_length": 5}\n', "'output_length' must be a number"),
    ('{"timestamp": "0", "input_length": 5, "output_length": 1}\n', "'timestamp' must be a number"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 1}\n', "not a whole number of tokens of at least 1"),
    ('{"timestamp": 0, "input_length": 2.5, "output_length": 1}\n', "not a whole number"),
    ('{"timestamp": 5, "input_length": 2, "output_length": 1}\n{"timestamp": 4, "input_length": 2, "output_length": 1}\n',
     "line 2: timestamp 4 is before"),
    ("\n\n", "holds no requests"),
    # math.isfinite of a 400-digit int raised OverflowError, a traceback
    (f'{{"timestamp": 1{"0" * 400}, "input_length": 8, "output_length": 4}}\n', "line 1: 'timestamp' is past"),
    (f'{{"timestamp": 0, "input_length": 8, "output_length": {2**53 + 1}}}\n', "line 1: 'output_length' is past"),
    ('{"timestamp": 1e300, "input_length": 8, "output_length": 4}\n', "line 1: 'timestamp' is past"),
    ('{"timestamp": NaN, "input_length": 8, "output_length": 4}\n', "'timestamp' must be a number"),
    # json keeps the last of two without a word: read as 8,000 tokens
    ('{"timestamp": 0, "input_length": 8, "input_length": 8000, "output_length": 4}\n',
     "line 1: 'input_length' is given twice: keep one"),
    ('{"timestamp": 0, "input_length": 8, "output_length": 4}\n{"timestamp": 1, "input_length": 8, '
     '"output_length": 4, "output\\u005flength": 9}\n', "line 2: 'output_length' is given twice: keep one"),
])
def test_bad_trace_lines(tmp_path, text, message):
    f = tmp_path / "t.jsonl"
    f.write_text(text)
    with pytest.raises(SpecError, match=message):
        serve_trace.read(str(f))


def test_a_field_a_trace_ignores_may_be_given_twice(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 8, "output_length": 4, "hash_ids": [1], "hash_ids": [2]}\n'
                 '{"timestamp": 5, "input_length": 9, "output_length": 3, "note": "timestamp"}\n')
    t = serve_trace.read(str(f))
    assert (t.inputs, t.outputs, t.times_s) == ((8, 9), (4, 3), (0.0, 0.005))


def test_bad_trace_files(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        serve_trace.read(str(tmp_path / "missing.jsonl"))
    with pytest.raises(SpecError, match="is a folder"):
        serve_trace.read(str(tmp_path))
    if os.path.exists("/dev/zero"):  # there, but no file: it said "no such file"
        with pytest.raises(SpecError, match="is not a regular file"):
            serve_trace.read("/dev/zero")
    (tmp_path / "b.bin").write_bytes(b"\0\1\2")
    with pytest.raises(SpecError, match="binary"):
        serve_trace.read(str(tmp_path / "b.bin"))


# --- the load under every arrival kind ----------------------------------------------------------------------

def _stalling(service_s: float, stall_at: float, stall_s: float):
    state = {"t0": None, "stalled": False}

    def serve_batch(batch):
        now = time.perf_counter()
        state["t0"] = state["t0"] or now
        if not state["stalled"] and now - state["t0"] >= stall_at:
            state["stalled"] = True
            time.sleep(stall_s)
        time.sleep(service_s)

    return serve_batch


def _plans():
    rate, span = 100.0, 2.5
    tr = serve_trace.read(str(EXAMPLE))
    speed = len(tr.times_s) / tr.times_s[-1] / rate  # the example trace at ~100 requests/s
    return {"poisson": arrivals.parse("poisson").times(rate, span, 5),
            "gamma": arrivals.parse("gamma:0.5").times(rate, span, 5),
            "constant": arrivals.parse("constant").times(rate, span, 5),
            "trace": [t for t in tr.plan(speed) if t < span]}


@pytest.mark.parametrize("kind", ["poisson", "gamma", "constant", "trace"])
def test_no_coordinated_omission_for_every_arrival_kind(kind):
    """A model that stalls for 0.6 s: every request planned during the stall waits for its end, whatever the
    arrivals, so the tail carries the stall; the generator's lag behind its plan is recorded and stays small."""
    times = _plans()[kind]
    trace = run_load(_stalling(0.001, stall_at=0.8, stall_s=0.6), LoadPlan([16], arrivals=times, span_s=times[-1]),
                     BatchPolicy(4, 0.0))
    start, end, _ = max(trace.batches, key=lambda b: b[1] - b[0])
    assert end - start >= 0.6
    during = [s for s in trace.served if start < s.request.arrival < end]
    assert len(during) >= 10  # ~60 planned arrivals fall in the stall, issued on time regardless of it
    assert all(s.done >= end for s in during)  # each carries the rest of the stall from its planned arrival
    assert max(s.done - s.request.arrival for s in during) >= 0.5
    assert len(trace.lags) == len(times)
    rec, _, _ = account(trace, None, None, percentiles=[50, 99])
    assert rec["latency_max_ms"] >= 500 and rec["client_lag_max_ms"] < 200
    assert rec["client_lag_p99_ms"] <= rec["client_lag_max_ms"]


def test_trace_replay_timing():
    """Requests are issued at the trace's times (scaled by --trace-speed), not as the server frees up."""
    tr = serve_trace.read(str(EXAMPLE))
    times = tr.plan(4.0)[:60]
    trace = run_load(lambda batch: time.sleep(0.0005), LoadPlan(list(tr.inputs), arrivals=times,
                                                               outputs=list(tr.outputs), span_s=times[-1]),
                     BatchPolicy(8, 0.0))
    assert [s.request.arrival for s in sorted(trace.served, key=lambda s: s.request.rid)] == times
    assert [s.request.length for s in sorted(trace.served, key=lambda s: s.request.rid)] == list(tr.inputs[:60])
    lags = [lag for _, lag in trace.lags]
    assert statistics.median(lags) < 0.02  # issued on its planned time (the machine may be busy: a loose bound)


def test_trace_outputs_end_each_request_at_its_own_token():
    """Generation: a batch decodes for its longest request; each is done at its own last token."""
    def gen(batch):
        t = time.perf_counter()
        return [t + 0.001 * k for k in range(1, 6)]  # 5 tokens for the batch

    trace = run_load(gen, LoadPlan([8], arrivals=[0.0, 0.0], outputs=[2, 5], span_s=0.01), BatchPolicy(2, 0.005))
    by = {s.request.rid: s for s in trace.served}
    assert len(by[0].steps) == 2 and len(by[1].steps) == 5 and by[0].done < by[1].done


# --- the command line -------------------------------------------------------------------------------------

def _refused(tmp_path, *args):
    from typer.testing import CliRunner

    from transbench.cli import app

    db = tmp_path / "bad.db"
    res = CliRunner().invoke(app, ["serve", "--model", "bert-tiny", "--device", "cpu", *map(str, args), "--db", str(db)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert not db.exists()
    return res.output


@pytest.mark.parametrize("args, message", [
    (["--rate", "10", "--arrivals", "gamma:0"], "--arrivals gamma:0: burstiness must be at least 0.01"),
    # draws of exactly 0 (every one at this shape): the plan of arrivals never ended, its list growing
    (["--rate", "10", "--arrivals", "gamma:1e-300"], "--arrivals gamma:1e-300: burstiness must be at least 0.01"),
    (["--rate", "10", "--arrivals", "gamma:0.001"], "burstiness must be at least 0.01"),
    (["--rate", "10", "--arrivals", "bursty"], "--arrivals 'bursty' is not understood"),
    (["--concurrency", "2", "--arrivals", "constant"], "--arrivals constant shapes a rate's arrivals"),
    (["--rate", "10", "--slo", "ttft:200"], "ttft and tpot are generation's"),
    (["--rate", "10", "--slo", "e2e"], "is not METRIC:MS"),
    (["--rate", "10", "--slo", "e2e:20", "--slo-ms", "20"], "give it once"),
    (["--rate", "10", "--percentiles", "50,abc"], "cannot read '50,abc'"),
    (["--rate", "10", "--percentiles", "50,100"], "--percentiles: 100 must be above 0 and below 100"),
    (["--rate", "10", "--goodput-target", "0.99"], "--goodput-target is the share meeting the objectives"),
    (["--rate", "10", "--slo", "e2e:20", "--goodput-target", "1.5"], "--goodput-target is a share above 0"),
    (["--rate", "10", "--slo", "e2e:20", "--goodput-target", "0.9", "--percentile", "99"], "give one"),
    (["--rate", "10", "--prepare-budget", "-1"], "--prepare-budget must be at least 0"),
    (["--rate", "10", "--trace-speed", "2"], "--trace-speed applies to --trace"),
    (["--rate", "10", "--trace", str(EXAMPLE)], "give one load"),
    (["--trace", "no-such.jsonl"], "--trace no-such.jsonl: no such file"),
    (["--trace", str(EXAMPLE), "--trace-speed", "0"], "--trace-speed must be a finite number above 0"),
    (["--trace", str(EXAMPLE), "--lengths", "fixed:8"], "--lengths and --trace both say"),
    # a replay lasts as long as its timestamps: --duration was ignored without a word, and stored with the cell
    (["--trace", str(EXAMPLE), "--duration", "5"], "--duration and --trace both say how long the load lasts"),
    (["--trace", str(EXAMPLE), "--warmup", "100"], "is not shorter than the trace's"),
    (["--trace", str(EXAMPLE), "--trace-speed", "0.001"], "not within --timeout"),
])
def test_bad_traffic_options_are_one_line(tmp_path, args, message):
    assert message in _refused(tmp_path, *args)


@pytest.mark.parametrize("option, text", [
    ("--trace", f'{{"timestamp": 1{"0" * 400}, "input_length": 8, "output_length": 4}}\n'),
    ("--lengths", f"5\n1{'0' * 400}\n"),  # the mean, a float, overflowed before the count met the model's limit
])
def test_a_huge_number_in_a_traffic_file_is_one_line_naming_its_line(tmp_path, option, text):
    f = tmp_path / "f.txt"
    f.write_text(text)
    args = ["--trace", f] if option == "--trace" else ["--rate", "5", "--lengths", f"counts:{f}"]
    out = _refused(tmp_path, *args)
    assert f"{f} line {1 if option == '--trace' else 2}: " in out and "is past 9,007,199,254,740,992" in out


def test_a_trace_whose_requests_are_all_at_time_zero_says_so(tmp_path):
    """`lower --warmup` was the advice, with --warmup 0."""
    f = tmp_path / "zero.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 8, "output_length": 1}\n' * 3)
    assert "every request is at one timestamp, so the trace spans no time" in _refused(tmp_path, "--trace", f,
                                                                                       "--warmup", "0")
    f.write_text('{"timestamp": 5000, "input_length": 8, "output_length": 1}\n')  # one request: said at time 0
    assert "every request is at one timestamp" in _refused(tmp_path, "--trace", f, "--warmup", "0")


@settings(max_examples=12, deadline=None)
@given(last_ms=st.floats(min_value=0.0, max_value=1e-3, exclude_max=True, allow_subnormal=True),
       speed=st.sampled_from([1.0, 1e3, 1e300, 1e308]))
def test_a_trace_spanning_under_a_microsecond_is_refused_not_measured(tmp_path_factory, last_ms, speed):
    """Timestamps 0 and 1e-320 ms, or a 2-s trace at --trace-speed 1e308, span more than 0 s: the cell measured,
    its offered rate (requests over the span) overflowed to inf, and it was stored an `error`, exit 0."""
    tmp_path = tmp_path_factory.mktemp("span")
    f = tmp_path / "short.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 8, "output_length": 1}\n'
                 f'{{"timestamp": {last_ms!r}, "input_length": 8, "output_length": 1}}\n')
    # all at time 0 (a span that rounds to 0) or under a microsecond: refused in one line either way
    assert "trace spans" in _refused(tmp_path, "--trace", f, "--warmup", "0", "--trace-speed", speed)


@pytest.mark.parametrize("args", [["--trace", "~nosuchuser-tb/t.jsonl"],
                                  ["--rate", "5", "--lengths", "counts:~nosuchuser-tb/c.txt"]])
def test_a_path_under_a_user_who_does_not_exist_is_one_line(tmp_path, args):
    """Path.expanduser raises RuntimeError for `~user` of no such user: each of these was a traceback."""
    assert "cannot expand '~nosuchuser-tb' (no such user, or no home folder)" in _refused(tmp_path, *args)


def test_trace_too_long_for_the_model(tmp_path):
    f = tmp_path / "long.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1}\n'
                 '{"timestamp": 10, "input_length": 8, "output_length": 1}\n')
    assert "1 requests ask for more than the model's 128 positions (the longest 600 tokens)" in \
        _refused(tmp_path, "--trace", f, "--warmup", "0")


def test_trace_replay_on_bert_tiny_and_a_changed_trace_refused(tmp_path):
    """`--trace` end to end: the cell names the trace's digest, carries its requests' count and the generator's
    lag; rerunning the run's name over a changed file is refused, not mixed into it."""
    from typer.testing import CliRunner

    from transbench.cli import app

    f = tmp_path / "t.jsonl"
    f.write_text(EXAMPLE.read_text())
    db, js = tmp_path / "s.db", tmp_path / "s.json"
    args = ["serve", "--model", "bert-tiny", "--device", "cpu", "--trace", str(f), "--trace-speed", "4",
            "--warmup", "0", "--max-batch-size", "4", "--slo-ms", "1000", "--db", str(db), "--name", "tr"]
    res = CliRunner().invoke(app, [*args, "--json", str(js)])
    assert res.exit_code == 0, res.output
    (rec,) = json.loads(js.read_text())["cells"]
    assert rec["status"] == "ok", rec["error"]
    assert rec["mode"] == "trace" and rec["trace"].startswith("t.jsonl@") and rec["trace_speed"] == 4.0
    assert rec["n_requests"] == 200 and rec["tail_valid"] is False and rec["slo_met"] is False  # 200 < 662
    assert rec["latency_p99_upper_ms"] is None and rec["latency_p50_upper_ms"] is not None
    assert rec["client_lag_max_ms"] is not None and rec["shapes_prepared_under_load"] >= 0
    f.write_text(EXAMPLE.read_text().replace('"input_length": 9,', '"input_length": 10,', 1))
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "already holds a different grid" in res.output, res.output


def test_find_max_rate_against_goodput_with_gamma_arrivals(tmp_path, extra_backends):
    """--find-max-rate against --slo's goodput at a target share, probes in bursty gamma arrivals: each probe's
    verdict is LoadGen's at that share (0.9: 64 requests suffice), and the summary names the target."""
    from transbench import api
    from transbench.scenarios.serve.spec import ServeSpec

    extra_backends("serve_backends")
    said = []
    spec = ServeSpec(model="bert-tiny", backends=["sleepy"], device="cpu", lengths="fixed:8", max_batch_size=2,
                     duration=0.5, warmup=0.1, find_max_rate=True, slo="e2e:100", goodput_target=0.9,
                     arrivals="gamma:0.5", name="gp")
    recs = api.serve(spec, str(tmp_path / "g.db"), on_progress=lambda cell, text: said.append(text)).records
    probes = [r for r in recs if r["mode"] == "rate"]
    (summary,) = [r for r in recs if r["scenario"] == "serve-max-rate"]
    assert probes and all(r["arrivals"] == "gamma:0.5" and r["tail_percentile"] == pytest.approx(90) for r in probes)
    passed = [r for r in probes if r["status"] == "ok" and r["slo_met"]]
    assert all(r["n_requests"] >= 64 and r["slo_misses"] <= r["slo_allowed_misses"] for r in passed)
    assert summary["status"] == "ok" and summary["goodput_target"] == 0.9 and summary["slo"] == "e2e:100"
    assert summary["max_rate"] == pytest.approx(max(r["rate"] for r in passed) if passed else 0.0)
    assert any("preparing" in s for s in said)  # the worker's progress reached the caller


@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.sampled_from(["a", "{}", " ", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x85", "\u2028",
                                      "\u2029"]), max_size=30).map("".join))
def test_a_trace_is_split_into_lines_one_at_a_time_as_splitlines_splits_it(text):
    """The trace's lines, read one at a time: text.splitlines() held a list of every line, 25 bytes of memory for each
    byte of a file of blank lines (a 60 MB file 1.5 GB). The lines and their numbers stay as they were."""
    assert list(serve_trace._lines(text)) == text.splitlines()


def test_a_trace_of_blank_lines_is_read_in_little_memory(tmp_path):
    import resource

    path = tmp_path / "blank.jsonl"
    path.write_text("  \n" * 5_000_000)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(SpecError, match="holds no requests"):
        serve_trace.read(str(path))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: 380 MB before
