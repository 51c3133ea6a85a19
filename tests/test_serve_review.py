"""Serving and generation, found in review: lengths that are not whole tokens, loads that outlast their deadline, a
batcher wait that blocked the load, achieved rate biased above the offered one at a light load, length files (folders,
binary, byte-order marks, unreadable, huge), the generation prompt limit's message, --seq-stdev with generation, and
the report's generation table."""

import hashlib
import statistics
import threading

import pytest
from typer.testing import CliRunner

from transbench.cli import app
from transbench.errors import SpecError
from transbench.scenarios.serve import lengths as serve_lengths, load as serve_load
from transbench.scenarios.serve.batcher import BatchPolicy
from transbench.scenarios.serve.load import LoadPlan, Request, Served, Trace, run_load
from transbench.scenarios.serve.stats import account

runner = CliRunner()


def serve_refusal(tmp_path, *args):
    db = tmp_path / "bad.db"
    res = runner.invoke(app, ["serve", "--model", "bert-tiny", "--device", "cpu", *map(str, args), "--db", str(db)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert not db.exists()
    return res.output


@pytest.mark.parametrize("lengths, message", [
    # fixed:0.5 was truncated to requests of 0 tokens (an `error` cell, exit 0); fixed:1.5 silently to 1
    ("fixed:0.5", "length '0.5' is not a whole number of tokens"),
    ("fixed:1.5", "length '1.5' is not a whole number of tokens"),
    ("normal:8:64.5", "max '64.5' is not a whole number of tokens"),
    ("lognormal:8:20.9:0.5", "max '20.9' is not a whole number of tokens"),
])
def test_lengths_are_whole_tokens(tmp_path, lengths, message):
    assert message in serve_refusal(tmp_path, "--rate", "10", "--lengths", lengths)
    assert serve_lengths.parse("fixed:1e1", 128).draw(3, 0) == [10, 10, 10]  # a whole number in any spelling


@pytest.mark.parametrize("args, message", [
    # 20 expected arrivals at 0.01/s is a 2,000 s window: the cell could only time out after 900 s
    (["--rate", "0.01"], "--rate 0.01 plans arrivals over 2,002 s"),
    # arrivals 1e301 s out: the arrivals thread's sleep overflowed and the load waited for the deadline
    (["--rate", "1e-300"], "--rate 1e-300 plans arrivals over 2e+301 s"),
    (["--rate", "1", "--timeout", "15"], "not within --timeout 15 s"),
    (["--concurrency", "1", "--duration", "900"], "--warmup + --duration is 902 s, not within --timeout 900 s"),
    (["--offline", "--warmup", "30", "--timeout", "30"], "--warmup + --duration is 40 s, not within --timeout 30 s"),
])
def test_a_load_longer_than_its_timeout_is_refused(tmp_path, args, message):
    assert message in serve_refusal(tmp_path, *args, "--lengths", "fixed:8")


@pytest.mark.parametrize("max_wait_s", [1e6, 1e12])
def test_a_long_batcher_wait_ends_at_the_drain_limit(monkeypatch, max_wait_s):
    """A batch that never fills and whose wait never runs out: the load abandons it at the drain limit. Before, a
    1e6 s wait blocked the load until the cell's deadline, and 1e12 s raised OverflowError (an `error` cell)."""
    monkeypatch.setattr(serve_load, "DRAIN_LIMIT_S", 0.3)
    plan = LoadPlan([8], arrivals=[0.0, 0.01], warmup_s=0.0)
    out = {}

    def load():
        try:
            out["trace"] = run_load(lambda batch: None, plan, BatchPolicy(32, max_wait_s))
        except Exception as exc:  # noqa: BLE001 - the test reports it
            out["error"] = exc

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "the load blocked past its drain limit"
    assert "error" not in out, out.get("error")
    trace = out["trace"]
    assert trace.served == [] and [r.rid for r in trace.unserved] == [0, 1]
    assert 0.3 <= trace.end < 2.0
    rec, samples, _ = account(trace, slo_ms=1e9, offered_rate=None)
    assert rec["unserved"] == 2 and rec["goodput"] == 0.0 and len(samples) == 2


def test_achieved_rate_is_unbiased_at_a_light_load():
    """Poisson arrivals served at once: achieved_rate averages to offered_rate. Measured to the last result, the
    window lost the gap after the last arrival, and a 20-arrival window read ~5% high (E[n / T'] > rate)."""
    from transbench.scenarios.serve.measure import plan_for
    from transbench.scenarios.serve.cell import ServeCell

    lengths = serve_lengths.parse("fixed:8", 128).to_dict()
    for rate, duration in ((2.0, 1.0), (1.0, 20.0)):
        ratios, busy = [], []
        for seed in range(300):
            cell = ServeCell("bert-tiny", "classification", "sdpa", "fp32", "rate", rate=rate, lengths=lengths,
                             duration=duration, warmup=2.0, seed=seed)
            plan, offered = plan_for(cell)
            reqs = [Request(i, t, 8) for i, t in enumerate(plan.arrivals)]
            served = [Served(r, r.arrival, r.arrival + 0.001, 1) for r in reqs]
            end = served[-1].done if served else plan.span_s
            trace = Trace(served, [], [(s.start, s.done, 1) for s in served], plan, end)
            rec, _, _ = account(trace, None, offered)
            if rec.get("achieved_rate") is not None:
                ratios.append(rec["achieved_rate"] / offered)
                busy.append(rec["busy_share"] / (rate * 0.001))
        assert statistics.fmean(ratios) == pytest.approx(1.0, abs=0.02), (rate, statistics.fmean(ratios))
        assert statistics.fmean(busy) == pytest.approx(1.0, abs=0.02)


def test_a_saturated_load_keeps_its_window_to_the_last_result():
    plan = LoadPlan([8], arrivals=[0.0, 0.1], span_s=0.5, warmup_s=0.0)
    reqs = [Request(0, 0.0, 8), Request(1, 0.1, 8)]
    trace = Trace([Served(reqs[0], 0.0, 1.0, 1), Served(reqs[1], 1.0, 2.0, 1)], [], [(0.0, 1.0, 1), (1.0, 2.0, 1)],
                  plan, 2.0)
    rec, _, _ = account(trace, None, 4.0)
    assert rec["achieved_rate"] == pytest.approx(1.0) and rec["busy_share"] == pytest.approx(1.0)


def test_generation_prompt_limit_names_what_the_new_tokens_leave(tmp_path):
    out = serve_refusal(tmp_path, "--model", "gpt2-tiny", "--task", "generate", "--rate", "10", "--lengths",
                        "fixed:127")
    # was "max 127 is above the model's 96 positions": gpt2-tiny has 128
    assert "max 127 is above the 96 positions a prompt has (gpt2-tiny's 128 less --new-tokens 32); " \
           "lower it to 96 or less" in out


def test_length_files_that_are_not_token_counts(tmp_path, monkeypatch):
    folder = tmp_path / "lens"
    folder.mkdir()
    assert "is a folder" in serve_refusal(tmp_path, "--rate", "10", "--lengths", f"counts:{folder}")
    binary = tmp_path / "b.bin"
    binary.write_bytes(b"12\n\x00\x01\xff\n")
    assert "is a binary file" in serve_refusal(tmp_path, "--rate", "10", "--lengths", f"counts:{binary}")
    bom = tmp_path / "bom.txt"  # Notepad and Excel save UTF-8 with a byte-order mark; int() refused its first line
    bom.write_bytes(b"\xef\xbb\xbf5\r\n7\r\n")
    assert serve_lengths.parse(f"counts:{bom}", 128).counts == (5, 7)
    huge = tmp_path / "huge.txt"
    huge.write_text("8\n" * 100)
    monkeypatch.setattr(serve_lengths, "MAX_FILE_BYTES", 100)
    with pytest.raises(SpecError, match="MiB is above the 0 MiB read for a length file"):
        serve_lengths.parse(f"counts:{huge}", 128)
    monkeypatch.undo()

    real_open = type(bom).open

    def unreadable(self, *a, **k):  # root reads any file: the permission error is simulated
        if self.name == "locked.txt":
            raise PermissionError(13, "Permission denied")
        return real_open(self, *a, **k)

    locked = tmp_path / "locked.txt"
    locked.write_text("5\n")
    monkeypatch.setattr(type(bom), "open", unreadable)
    with pytest.raises(SpecError, match=r"locked.txt: cannot be read \(Permission denied\)"):
        serve_lengths.parse(f"counts:{locked}", 128)


def test_a_large_counts_file_is_carried_as_a_histogram(tmp_path):
    """200,000 requests: the cell carries one entry per distinct count (it carried every line: 11 MB stored per cell
    for 3,000,000), draws keep the file's distribution, and the key's digest is the one of before (resumes match)."""
    import random

    rng = random.Random(5)
    counts = [rng.choice((4, 4, 4, 9, 30)) for _ in range(200_000)]
    path = tmp_path / "trace.txt"
    path.write_text("\n".join(map(str, counts)) + "\n")
    ln = serve_lengths.parse(f"counts:{path}", 128)
    assert len(ln.to_dict()["counts"]) == 3 and ln.max == 30 and ln.shortest == 4
    assert ln.mean == pytest.approx(statistics.fmean(counts))
    digest = hashlib.sha256("\n".join(map(str, counts)).encode()).hexdigest()[:12]
    assert ln.label == f"counts:trace.txt@{digest}"
    drawn = ln.draw(50_000, seed=2)
    assert drawn == serve_lengths.Lengths.from_dict(ln.to_dict()).draw(50_000, seed=2)
    assert drawn.count(4) / len(drawn) == pytest.approx(0.6, abs=0.01)
    assert drawn.count(30) / len(drawn) == pytest.approx(0.2, abs=0.01)


def test_seq_stdev_with_generate_is_refused(tmp_path):
    db = tmp_path / "g.db"
    res = runner.invoke(app, ["run", "--model", "gpt2-tiny", "--task", "generate", "--device", "cpu", "--seq", "8",
                              "--new-tokens", "2", "--seq-stdev", "2", "--db", str(db)])
    # was: every cell `unsupported` ("generation runs equal-length prompts"), exit 0
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "--seq-stdev 2: generation runs equal-length prompts" in res.output and not db.exists()


def test_report_generation_table_shows_tokens_per_s_and_new_tokens():
    from transbench.report.serve import load_tables

    base = {"run_name": "g", "model": "gpt2-tiny", "task": "generate", "dtype": "fp32", "lengths": "fixed:8",
            "max_batch_size": 2, "max_wait_ms": 2.0, "slo_ms": None, "backend": "sdpa", "mode": "rate", "status": "ok",
            "offered_rate": 4.0, "achieved_rate": 4.0, "latency_p50_ms": 30.0, "ttft_p50_ms": 5.0}
    tables = load_tables([{**base, "rate": 4.0, "new_tokens": 8, "tokens_per_s": 32.0},
                          {**base, "rate": 4.0, "new_tokens": 64, "tokens_per_s": 256.0}])
    assert len(tables) == 2  # a request of 8 tokens and one of 64 are two settings, not one table's rows
    for table, tokens in zip(tables, ("32", "256")):
        assert "tokens/s" in table.headers and "new_tokens=" in table.title
        assert tokens in str(table.rows[0][table.headers.index("tokens/s")])


def test_max_rate_search_never_probes_a_rate_whose_load_would_outlast_the_deadline():
    # A model too slow for the target bisected down to rates whose stretched window (20 expected arrivals) passed
    # --timeout: each such probe could only wait out the whole deadline and end `timeout`.
    from transbench.scenarios.serve.search import find_max_rate

    probed = []
    best, trail = find_max_rate(lambda r: probed.append(r) or 50.0, slo_ms=10.0, capacity=8.0, lowest=1.0)
    assert best is None and probed and min(probed) > 1.0
    assert [t[0] for t in trail] == probed == [4.0, 2.0]  # 1.0 would be next: not run
    best, trail = find_max_rate(lambda r: 50.0, slo_ms=10.0, capacity=8.0)  # no floor: the usual 8 probes
    assert len(trail) == 8
