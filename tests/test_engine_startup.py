"""What a new shape's first call costs: the tuning budget (fake clock), `transbench tune`, generator graph reuse."""
import pytest
import torch

from transbench.engine import tuning


class _Clock:
    """A clock that only timing work advances: a candidate's first sample costs `cost` seconds (its compile, as on
    a GPU), its later samples nothing. `timed`: every sample, `first`: each candidate's first."""

    def __init__(self, cost: float):
        self.now, self.cost, self.timed, self.first = 0.0, cost, [], []

    def __call__(self) -> float:
        return self.now

    def timer(self, times):
        def time_one(fn, reps):
            name = fn()
            self.timed.append(name)
            if name not in self.first:
                self.first.append(name)
                self.now += self.cost
            return times[name]
        return time_one


def _cands(*names):
    return {n: (lambda n=n: n) for n in names}


def test_a_budgeted_call_runs_an_untuned_op_at_once_and_tunes_it_after_until_the_deadline(tmp_path):
    """Under a budget nothing is timed before the op runs (it takes the rule's route here: nothing is tuned near
    it); after the forward the call times candidates until the deadline and keeps the fastest so far apart from
    complete choices (a partial entry, with every time on disk); a later budgeted process goes on from there, and an
    unbudgeted one (`transbench tune`) times every candidate."""
    clock = _Clock(cost=1.0)
    times = {"cublas": 2.0, "t1": 1.5, "t2": 1.0, "t3": 0.5}
    t = tuning.Tuner(tmp_path / "t.json", timer=clock.timer(times), clock=clock)
    with t.budget(2.5), t.recording() as keys:
        assert t.choose("op1", _cands(*times)) == "cublas" and clock.timed == []
        assert t.tune_pending(keys)  # the route changed: the caller runs its forward again
        # cublas (its share), t1, t2, t3: each first sample costs 1 s; t3 would start past the deadline (3 s > 2.5)
        assert clock.first == ["cublas", "t1", "t2"]
        assert t.choose("op1", _cands(*times)) == "t2"
    assert t.table == {} and sorted(t.routes(keys).values()) == ["t2"]  # what runs is reported all the same
    (full,) = keys
    assert t.progress[full] == {"cublas": 2.0, "t1": 1.5, "t2": 1.0}
    later = tuning.Tuner(tmp_path / "t.json", timer=clock.timer(times), clock=clock)
    assert later.interim == {full: "t2"} and later.progress == t.progress
    n = len(clock.timed)
    with later.budget(2.5), later.recording() as keys:
        assert later.choose("op1", _cands(*times)) == "t2" and len(clock.timed) == n  # warm: timed nothing first
        assert later.tune_pending(keys)
    assert clock.timed[n:] == ["t3"] * tuning.ROUNDS  # only what was left; then the choice is complete
    assert later.table == {full: "t3"} and later.interim == later.progress == {}
    fresh = tuning.Tuner(tmp_path / "u.json", timer=clock.timer(times), clock=clock)
    n = len(clock.timed)
    with fresh.budget(None):
        assert fresh.choose("op1", _cands(*times)) == "t3"
    assert clock.timed[n:] == list(times) * tuning.ROUNDS


def test_an_engine_without_graphs_tunes_under_the_same_budget(tmp_path):
    """A first call without CUDA graphs is held to the budget a captured one is: it runs, tunes what it met, and
    runs again on the routes it found; after it the routes stay (a later call times nothing and runs them)."""
    from transbench.engine.graphs import GraphCache
    clock = _Clock(cost=1.0)
    times = {"cublas": 2.0, "t1": 1.5, "t2": 1.0}
    t = tuning.Tuner(tmp_path / "t.json", timer=clock.timer(times), clock=clock)
    cache = GraphCache(enabled=False, tune_budget_s=1.5, tuner=t)
    assert not cache.enabled
    ran = []

    def forward():
        ran.append(t.choose("op", _cands(*times)))
        return ran[-1]
    assert cache("k", forward) == "t1" and ran == ["cublas", "t1"]
    # cublas's share (1 s), then t1 (2 s, past the 1.5 s budget): t2 waits for a later process
    assert clock.first == ["cublas", "t1"]
    assert t.deadline is None and t.pending == {}  # the budget covers the call only
    n = len(clock.timed)
    assert cache("k", forward) == "t1" and len(clock.timed) == n  # settled: the process keeps its route


def test_a_table_of_plain_entries_loads_and_stays_readable_by_older_code(tmp_path):
    """Every entry is a plain string, as before partial entries existed: an older file loads, and a file with
    partial entries and times is a flat str -> str table whose prefixed keys an older reader never looks up."""
    import json

    clock = _Clock(cost=1.0)
    times = {"cublas": 2.0, "t1": 1.0}
    path = tmp_path / "t.json"
    old_key = tuning.Tuner(path).key("op0", _cands(*times))
    path.write_text(json.dumps({old_key: "t1", "junk": {"not": "an entry"}}))  # what older code wrote, and noise
    t = tuning.Tuner(path, timer=clock.timer(times), clock=clock)
    assert t.table == {old_key: "t1"} and t.interim == {}
    with t.budget(0.5), t.recording() as keys:
        assert t.choose("op0", _cands(*times)) == "t1" and clock.timed == []
        assert t.choose("op9", _cands(*times)) == "cublas"
        t.tune_pending(keys)
    disk = json.loads(path.read_text())
    assert all(isinstance(v, str) for v in disk.values()) and disk[old_key] == "t1"
    (partial,) = [k for k in disk if k.startswith(tuning.PARTIAL)]
    assert partial[len(tuning.PARTIAL):] == t.key("op9", _cands(*times))
    (timed,) = [k for k in disk if k.startswith(tuning.PROGRESS)]
    assert timed[len(tuning.PROGRESS):] == t.key("op9", _cands(*times)) and disk[timed] == "cublas=2"


def test_a_budget_long_enough_times_every_candidate(tmp_path):
    clock = _Clock(cost=0.01)
    times = {"cublas": 2.0, "t1": 1.0}
    t = tuning.Tuner(tmp_path / "t.json", timer=clock.timer(times), clock=clock)
    with t.budget(100.0), t.recording() as keys:
        assert t.choose("op", _cands(*times)) == "cublas"
        assert t.tune_pending(keys) and t.choose("op", _cands(*times)) == "t1"
    assert sorted(clock.timed) == sorted(["cublas", "t1"] * tuning.ROUNDS) and t.interim == {} and len(t.table) == 1
    assert t.deadline is None  # the budget ends with its block


def test_no_whole_forward_is_raced_past_the_deadline(tmp_path):
    clock = _Clock(cost=1.0)
    times = {"x": 1.0, "x2": 1.1}
    t = tuning.Tuner(tmp_path / "t.json", timer=clock.timer(times), clock=clock)
    builds = []

    def build():
        builds.append(t.choose("op", _cands("x", "x2")))
        return builds[-1]
    with t.budget(1e9), t.recording() as keys:  # choices complete, then the budget runs out before the races
        t.choose("op", _cands("x", "x2"))
        clock.now = 2e9
        assert t.refine(keys, build, lambda b: 1.0) == "x"
    assert builds == ["x"] and t.races == []


class _CountingCache:
    """GraphCache stand-in that 'captures' (counts) the first call of each key and replays (calls fn) after."""

    captures: list = []

    def __init__(self, enabled, max_entries=32, tune_budget_s=None, *tuning):
        self.entries = {}

    def __call__(self, key, fn, *args):
        if key not in self.entries:
            _CountingCache.captures.append(key)
            self.entries[key] = True
        return fn(*args)

    def release(self):
        self.entries.clear()

    def tuning(self):
        return {}


def _greedy(gen, prompt, new):
    logits, toks = gen.prefill(prompt), []
    for _ in range(new):
        toks.append(logits.argmax(-1))
        logits = gen.decode(toks[-1])
    return torch.stack(toks, 1)


def test_a_fresh_generator_replays_the_graphs_captured_for_its_shape(monkeypatch):
    from transformers import GPT2Config, GPT2LMHeadModel

    from transbench.engine import base, compile_model

    monkeypatch.setattr(base, "GraphCache", _CountingCache)  # every graph cache of an engine (forward, generators)
    monkeypatch.setattr(_CountingCache, "captures", [])
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=500, n_positions=64)).eval()
    c = compile_model(m, dtype=torch.float32)
    prompt = torch.randint(0, 500, (1, 7))
    first = _greedy(c.generator(1, 20), prompt, 8)
    assert _CountingCache.captures == [("prefill", 7), "decode"]
    again = c.generator(1, 20)  # a new request: same shape, nothing captured again, same tokens
    assert torch.equal(_greedy(again, prompt, 8), first) and len(_CountingCache.captures) == 2
    c.generator(2, 20).prefill(prompt.repeat(2, 1))  # another batch size has graphs of its own
    assert _CountingCache.captures[2:] == [("prefill", 7)]

    # two generators of one shape share the cache: the older one may not decode over the newer one's sequence
    a, b = c.generator(1, 20), c.generator(1, 20)
    nxt = a.prefill(prompt).argmax(-1)
    b.prefill(torch.randint(0, 500, (1, 5)))
    with pytest.raises(ValueError, match="newer generator"):
        a.decode(nxt)
    c.release()
    assert c.engine.decode_states == {}
    _greedy(c.generator(1, 20), prompt, 2)  # after release() the shape is captured anew
    assert _CountingCache.captures[-2:] == [("prefill", 7), "decode"]


@pytest.mark.parametrize("args, says", [
    (["--model", "nope"], "unknown model 'nope'"),
    (["--model", "bert-base-uncased", "--dtype", "fp32"], "dtype fp32 cannot be tuned"),
    (["--model", "bert-base-uncased", "--seq", "128,1024"], "seq 1024 exceeds"),
    (["--model", "bert-base-uncased", "--batch", "0"], "batch must be at least 1"),
    (["--model", "bert-base-uncased", "--batch", "1,x"], "cannot read '1,x'"),
    (["--model", "bert-base-uncased", "--device", "cpu"], "tune needs a CUDA GPU"),
])
def test_tune_refuses_bad_input_in_one_line(args, says, tmp_path):
    from typer.testing import CliRunner

    from transbench.cli import app

    out = CliRunner().invoke(app, ["tune", *args, "--cache-dir", str(tmp_path)])
    assert out.exit_code == 2, out.output
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: ") and says in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_tune_shows_each_shape_and_the_races_that_settled_it(monkeypatch):
    """The CLI over api.tune (which needs a GPU: faked here): a line per shape as it finishes, each whole-forward
    race with its routes and times, and the summary table with races won out of tried."""
    from typer.testing import CliRunner

    from transbench import api
    from transbench.cli import app
    races = [{"trial": "fp8", "routes": {"dense|256x128x12x64": "fp8+triton64x64x4"}, "best_ms": 9.1, "trial_ms": 8.7,
              "won": True},
             {"trial": "rival", "routes": {"linear|bias=True|32768x2304x768": "cublas"}, "error": "RuntimeError: x"}]

    def fake(model, batches, seqs, dtype, device, cache_dir, progress):
        progress({"batch": batches[0], "seq": seqs[0], "seconds": 12.34, "routes": 7, "races": races})
    monkeypatch.setattr(api, "tune", fake)
    out = CliRunner().invoke(app, ["tune", "--model", "bert-base-uncased", "--batch", "256", "--seq", "128"])
    assert out.exit_code == 0, out.output
    assert "batch 256 x seq 128: 12.3 s" in out.output
    assert "race (fp8) dense|256x128x12x64: fp8+triton64x64x4: 8.7000 ms against 9.1000, won" in out.output
    assert "race (rival) linear|bias=True|32768x2304x768: cublas: RuntimeError: x" in out.output
    assert "1/2" in out.output.splitlines()[-2]  # the table's row: races won / tried


def test_tune_prints_markup_in_a_folder_name_and_an_error_as_written(monkeypatch, tmp_path):
    """The table title took the model's text as rich markup: a folder named "m[/bold]" raised a MarkupError
    (a traceback) after the whole tuning had run, and a race's error text lost its brackets."""
    from typer.testing import CliRunner

    from transbench import api
    from transbench.cli import app
    races = [{"trial": "rival", "routes": {"linear": "cublas"}, "error": "RuntimeError: [bold]x[/bold] [1, 2]"}]

    def fake(model, batches, seqs, dtype, device, cache_dir, progress):
        progress({"batch": 1, "seq": 8, "seconds": 1.0, "routes": 3, "races": races})
    monkeypatch.setattr(api, "tune", fake)
    out = CliRunner().invoke(app, ["tune", "--model", "m[/bold]", "--batch", "1", "--seq", "8"])
    assert out.exit_code == 0, out.output
    assert "tuned m[/bold] fp16" in out.output
    assert "race (rival) linear: cublas: RuntimeError: [bold]x[/bold] [1, 2]" in out.output


def test_the_graph_bound_holds_every_packed_count_a_server_warms():
    """The LRU bound defaults to one (max_batch, max_seq) shape's packed token counts and its dense one, so a
    server that captured them all before its load (scenarios/serve/measure.py) never evicts one; 32 at least."""
    from dataclasses import replace

    from transformers import BertConfig, BertModel

    from transbench.engine import compile_model
    from transbench.scenarios.serve.measure import token_counts

    m = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                             vocab_size=100, max_position_embeddings=256)).eval()
    c = compile_model(m, dtype=torch.float32, max_batch=16)
    assert c.token_bucket == c.engine.bucket == 1 and c.graph_captures == 0  # CPU: no graphs, no rounding
    assert c.engine.graphs.max_entries == 16 * 256 + 1
    e = c.engine
    e.bucket = 128  # what CUDA rounds to
    assert e.graph_bound() == 33 == len(token_counts(16, 256, 256, 128))
    e.opts = replace(e.opts, max_batch=1, max_seq=128)
    assert e.graph_bound() == 32


def test_routes_chosen_out_of_time_are_reported_as_what_runs(tmp_path):
    """A forward captured within a budget of 0 runs routes nobody timed: Tuner.routes (what a graph's record says
    it runs) names them, and Tuner.origins says where they came from; a complete entry the process found later
    does not replace a route the process has settled."""
    clock = _Clock(cost=1.0)
    t = tuning.Tuner(tmp_path / "t.json", timer=clock.timer({"fp8": 2.0, "cublas": 1.0}), clock=clock)
    with t.budget(0.0), t.recording() as keys:
        assert t.choose("linear|op", _cands("fp8", "cublas")) == "cublas"  # the rule's: the first library route
        assert not t.tune_pending(keys) and clock.timed == []  # no time: nothing timed
    t.settle(keys)
    assert t.table == {} and t.routes(keys) == {"linear|op": "cublas"}
    assert t.origins(keys) == {"table": 0, "tuned": 0, "partial": 0, "neighbour": 0, "rule": 1}
    (full,) = keys
    t.table[full] = "fp8"
    assert list(t.routes(keys).values()) == ["cublas"]


def test_a_run_cell_tunes_its_shape_fully_and_serving_keeps_the_first_call_budget():
    """A cell's figures must not depend on the cells before it. Under the first-call budget a process's first fused
    cell spent it on Triton compiles and kept default routes that later cells did not (backends/fused.py), so a
    `run` cell's engine tunes with no budget; serving's probe cells and the demo keep the budget."""
    from dataclasses import replace
    from types import SimpleNamespace

    from transformers import BertConfig, BertModel

    from transbench import demo
    from transbench.backends import fused
    from transbench.cells import Cell
    from transbench.scenarios.serve.measure import probe_cell
    from transbench.scenarios.serve.cell import ServeCell

    m = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                             vocab_size=100, max_position_embeddings=64)).eval()

    def budget(cell):
        return fused._compile(m, cell).engine.graphs.tune_budget_s
    assert budget(Cell("tiny", "base", "fused", "fp32", 2, 16)) is None
    serving = probe_cell(ServeCell("tiny", "base", "fused", "fp32", "rate", rate=5.0), 4, 32)
    assert budget(serving) == tuning.TUNE_BUDGET_S > 0
    seen = []  # the demo's cell, as its fused backend receives it
    spy = replace(fused.BACKEND, prepare=lambda model, inputs, cell: seen.append(cell) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        demo._run_backend(spy, m, SimpleNamespace(name="tiny", family="bert"), "base", [1, 2, 3],
                          torch.device("cpu"), "fp32")
    assert seen and seen[0].first_call_budget
