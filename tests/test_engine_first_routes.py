"""How a process that finds no tuned entry for an op chooses its route, and how tuning goes on across calls and
processes within each call's budget (engine/tuning.py: Tuner.choose, Tuner.tune_pending, rule_route), on the CPU
with fake timers and a fake clock: the nearest tuned shape's route, the rule where nothing comparable is tuned,
routes that are no candidate or fail at this shape rejected, the budget held call after call while the table grows,
the op with the largest share of the forward tuned first, and a captured first call recaptured with what it found."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transbench.engine import tuning

FP16 = "torch.float16"


class Clock:
    """A clock that only timing advances: a candidate's first sample costs `compile_s` (its compile), later samples
    nothing. `first`: each candidate's first sample, in order; `calls`: every call of a candidate outside the timer
    (a borrowed route's trial run, the forward itself)."""

    def __init__(self, compile_s: float = 1.0):
        self.now, self.compile_s, self.first, self.samples = 0.0, compile_s, [], []

    def __call__(self) -> float:
        return self.now

    def timer(self, times):
        def time_one(fn, reps):
            name = fn()
            self.samples.append(name)
            if name not in self.first:
                self.first.append(name)
                self.now += self.compile_s
            return times[name]
        return time_one


def cands(*names, fails=(), log=None):
    """Candidates that return their name (a failing one raises, as a kernel refusing a shape does); `log` collects
    every call."""
    def make(n):
        def run():
            if log is not None:
                log.append(n)
            if n in fails:
                raise ValueError(f"{n} does not fit this shape")
            return n
        return run
    return {n: make(n) for n in names}


def gemm(m, n=768, k=768, op="linear|bias=True", form=""):
    return f"{op}|{m}x{n}x{k}|{FP16}{form}"


LARGE = ["cublas", "triton128x256x64", "triton64x32x128"]  # a large-M GEMM's routes (no split-K)
SMALL = [*LARGE, "splitk64x64x128"]  # split-K is offered from M <= 256 only


def seeded(path, entries) -> tuning.Tuner:
    """A tuner whose table holds {op: (route, candidate names)} as complete entries (written as on disk)."""
    t = tuning.Tuner(path)
    path.write_text(json.dumps({t.key(op, names): route for op, (route, names) in entries.items()}))
    return tuning.Tuner(path)


# --- the rule ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op, names, route", [
    # an e4m3 input: our fp8 GEMM's first config, ahead of _scaled_mm (listed first)
    (gemm(32768, form="|fp8 input"), ["fp8", "fp8+add", "fp8+triton128x256", "fp8+triton128x128", "cublas"],
     "fp8+triton128x256"),
    (gemm(32768, 3072, op="linear_gelu|exact", form="|fp8 input"), ["fp8+gelu_q", "fp8+triton_gelu_q128x256",
                                                                     "cublas+triton_gelu"], "fp8+triton_gelu_q128x256"),
    # an fp8 layer whose input is fp16: no quantize pass, the library's fp16 route
    (gemm(32768, op="linear_add_ln|store=False|quant"), ["fp8+ln", "fp8+triton+ln128x256", "cublas+ln",
                                                         "cublas_addmm+ln", "triton128x256x64"], "cublas+ln"),
    # exact GELU from RULE_TRITON_MIN_ROWS rows: our GEMM with GELU in its epilogue; fewer rows: the library's
    (gemm(4096, 3072, op="linear_gelu|exact"), ["cublas+triton_gelu", "triton128x256x64", "splitk64x64x128"],
     "triton128x256x64"),
    (gemm(128, 3072, op="linear_gelu|exact"), ["cublas+triton_gelu", "triton128x256x64", "splitk64x64x128"],
     "cublas+triton_gelu"),
    (gemm(4096, 3072, op="linear_gelu|tanh"), ["cublas+triton_gelu", "cublaslt_gelu", "triton128x256x64"],
     "cublas+triton_gelu"),
    ("dense|256x128x12x64|torch.float16|causal=False|fp8 output", ["flash", "cudnn", "efficient", "triton64x64x4",
                                                                  "fp8+triton64x64x4"], "flash"),
    # a decode step's projection at a few rows: our GEMV's first config, over cuBLAS and our GEMMs
    ("norm_linear|ln=True|act=tanh|res=False|1x3072x768|torch.float16", ["cublas", "gemv4x4", "gemv2x4",
                                                                          "splitk16x64x128"], "gemv4x4"),
    # decode attention: its first config (one warp), all candidates ours
    ("decode_attention|4x384x16x64|torch.float16", ["decode64x64x1", "decode32x32x1", "decode64x64x2",
                                                     "decode128x128x4", "decode64x64x4"], "decode64x64x1"),
    # nothing the rule names is listed (a tuner that offers fp8 routes only): the first candidate
    (gemm(2048), ["fp8", "fp8+add"], "fp8"),
])
def test_the_rule_picks_from_the_shape_and_the_candidates(op, names, route):
    assert tuning.rule_route(op, names) == route


def test_shape_signatures_keep_the_model_dimensions_and_blank_the_varying_ones():
    t = tuning.Tuner
    dev = "NVIDIA H100|torch 2.11"
    assert tuning.shape_of(f"{dev}|{gemm(512)}|abcd") == (f"{dev}|linear|bias=True|*x768x768|{FP16}", (512,))
    assert tuning.shape_of(f"{dev}|dense|8x512x12x64|{FP16}|causal=False|ef01") == (
        f"{dev}|dense|*x*x12x64|{FP16}|causal=False", (8, 512))
    assert tuning.shape_of(f"{dev}|decode_attention|4x384x16x64|{FP16}|ef01") == (
        f"{dev}|decode_attention|*x*x16x64|{FP16}", (4, 384))
    assert tuning.shape_of(f"{dev}|no shape here|ef01") is None and t.op_name(f"{dev}|{gemm(8)}|ab") == gemm(8)


# Dimensions a table left on disk may hold where a shape's belong: huge, zero, another script's digits, empty.
HOSTILE_DIMS = st.one_of(st.integers(0, 10**20).map(str), st.integers(10**300, 10**400).map(str),
                         st.integers(4300, 6000).map(lambda n: "9" * n), st.sampled_from(["", "\u0663", "-5", "1e3"]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dims=st.lists(st.lists(HOSTILE_DIMS, min_size=1, max_size=4), min_size=1, max_size=4),
       route=st.text(max_size=20))
def test_any_shape_a_table_holds_lends_its_route_or_is_passed_over(tmp_path_factory, dims, route):
    """A table edited by hand or by another program: a key of a dimension of 5,000 digits was int()'s ValueError,
    and one of 10^400 a math domain error, tracebacks of the first budgeted call that looked for a neighbour."""
    path = tmp_path_factory.mktemp("table") / "t.json"
    dev = tuning.Tuner._device_key()
    digest = tuning.Tuner(path).key(gemm(1), LARGE).rsplit("|", 1)[1]
    path.write_text(json.dumps({f"{dev}|linear|bias=True|{'x'.join([*d, '768', '768'])}|{FP16}|{digest}": route
                                for d in dims}))
    t = tuning.Tuner(path)
    with t.budget(0.0):
        assert t.choose(gemm(1024), cands(*LARGE)) in LARGE


# --- a route borrowed from the nearest tuned shape --------------------------------------------------------------------

def test_an_untuned_shape_takes_the_nearest_tuned_shapes_route(tmp_path):
    """Tuned: M = 4096 and 16384 of this GEMM, and shapes that are not comparable (other N x K, another dtype, an
    fp8 input, another op). M = 12000 takes 16384's route (nearest in log scale), run once first; nothing is timed
    before the op runs, and the op stays pending: a borrowed route is no complete entry."""
    t = seeded(tmp_path / "t.json", {
        gemm(4096): ("triton64x32x128", LARGE), gemm(16384): ("triton128x256x64", LARGE),
        gemm(12000, 3072, 768): ("cublas", LARGE), gemm(12000).replace(FP16, "torch.bfloat16"): ("cublas", LARGE),
        gemm(12000, form="|fp8 input"): ("cublas", LARGE), gemm(12000, op="linear|bias=False"): ("cublas", LARGE)})
    clock = Clock()
    t.timer, t.clock = clock.timer({}), clock
    log = []
    with t.budget(1.0), t.recording() as keys:
        assert t.choose(gemm(12000), cands(*LARGE, log=log)) == "triton128x256x64"
        assert log == ["triton128x256x64"] and clock.samples == []  # a trial run, no timing
        assert t.choose(gemm(12000), cands(*LARGE, log=log)) == "triton128x256x64" and len(log) == 1
        assert [t.op_name(k) for k in t.neighbours(next(iter(keys)))] == [gemm(16384), gemm(4096)]
        assert set(t.pending) == keys and t.pending[next(iter(keys))].calls == 2
    assert t.origins(keys) == {"table": 0, "tuned": 0, "partial": 0, "neighbour": 1, "rule": 0}
    assert next(iter(keys)) not in t.table


def test_a_shape_too_far_from_every_tuned_one_takes_the_rule(tmp_path):
    """Only shapes within NEIGHBOUR_MAX_RATIO lend their routes: M = 128's split-K choice says nothing of 32768."""
    far = 32768 / (tuning.NEIGHBOUR_MAX_RATIO * 1.01)
    t = seeded(tmp_path / "t.json", {gemm(128): ("triton64x32x128", SMALL), gemm(int(far)): ("triton64x32x128", LARGE)})
    with t.budget(0.0), t.recording() as keys:
        assert t.choose(gemm(32768), cands(*LARGE)) == "cublas"
    assert t.origins(keys)["rule"] == 1 and t.neighbours(next(iter(keys))) == []


def test_neighbour_routes_that_are_no_candidate_here_or_fail_here_are_rejected(tmp_path):
    """The nearest tuned shape chose split-K, which is not offered at M = 1024; the next one chose a tile config that
    fails at this shape: it is run once, raises, is kept as failed for this key (on disk: no later process runs it
    again), and the op takes the rule's route. The same op tuned among other candidates (an older version's digest)
    lends its route as a neighbour would, never as a complete entry."""
    t = seeded(tmp_path / "t.json", {gemm(512): ("splitk64x64x128", SMALL), gemm(2560): ("triton64x32x128", LARGE)})
    log = []
    with t.budget(0.0), t.recording() as keys:
        assert t.choose(gemm(1024), cands(*LARGE, fails={"triton64x32x128"}, log=log)) == "cublas"
    assert log == ["triton64x32x128", "cublas"] and t.origins(keys)["rule"] == 1
    (full,) = keys
    later = tuning.Tuner(tmp_path / "t.json")
    assert later.progress[full] == {"triton64x32x128": None}
    log.clear()
    with later.budget(0.0):
        assert later.choose(gemm(1024), cands(*LARGE, fails={"triton64x32x128"}, log=log)) == "cublas"
    assert log == ["cublas"]  # the failed route was not tried again

    older = seeded(tmp_path / "o.json", {gemm(1024): ("triton64x32x128", ["cublas", "triton64x32x128"]),
                                         gemm(900): ("gone", ["cublas", "gone"])})
    with older.budget(0.0), older.recording() as keys:
        assert older.choose(gemm(1024), cands(*LARGE)) == "triton64x32x128"
        assert set(older.pending) == keys  # still to be tuned
    assert older.origins(keys)["neighbour"] == 1 and not keys & set(older.table)


def test_a_partial_entry_is_taken_as_it_is(tmp_path):
    """The fastest of the candidates a budgeted call timed for this very key runs without a trial."""
    t = tuning.Tuner(tmp_path / "t.json")
    key = t.key(gemm(4096), LARGE)
    (tmp_path / "t.json").write_text(json.dumps({tuning.PARTIAL + key: "triton64x32x128",
                                                 tuning.PROGRESS + key: "cublas=2;triton64x32x128=1"}))
    t = tuning.Tuner(tmp_path / "t.json")
    log = []
    with t.budget(0.0), t.recording() as keys:
        assert t.choose(gemm(4096), cands(*LARGE, log=log)) == "triton64x32x128" and log == []
    assert t.origins(keys)["partial"] == 1 and t.progress[key] == {"cublas": 2.0, "triton64x32x128": 1.0}


# --- tuning carried on across calls and processes ---------------------------------------------------------------------

NAMES = [f"c{i}" for i in range(10)]
TIMES = {n: 10.0 - i for i, n in enumerate(NAMES)}  # the last listed is fastest


def test_each_call_holds_its_budget_and_later_processes_go_on_until_the_entry_is_complete(tmp_path):
    """Ten candidates, 1 s each to compile, a 3.5 s budget a call: each process times at most what fits (the
    candidate started before the deadline finishes), never one an earlier process timed, saves its times, and runs
    the fastest found so far; the third completes the entry, which later processes find and run without timing."""
    path, budget = tmp_path / "t.json", 3.5
    seen, ran = set(), []
    for process in range(5):
        clock = Clock(compile_s=1.0)
        t = tuning.Tuner(path, timer=clock.timer(TIMES), clock=clock)
        with t.budget(budget), t.recording() as keys:
            t.choose("op", cands(*NAMES))
            t.tune_pending(keys)
            ran.append(t.choose("op", cands(*NAMES)))
        assert clock.now <= budget + clock.compile_s
        assert not seen & set(clock.first)
        seen |= set(clock.first)
        (key,) = keys
        disk = json.loads(path.read_text())
        if process < 2:  # the table grows call by call: every time so far, no complete entry yet
            assert len(tuning._read_progress(disk[tuning.PROGRESS + key])) == len(seen) and key not in disk
            assert t.origins(keys)["partial"] == 1
        else:
            assert disk[key] == "c9" and not any(k.startswith(tuning.PROGRESS) for k in disk)
            assert t.origins(keys)["tuned" if process == 2 else "table"] == 1
    assert len(seen) == 10 and clock.first == []
    # the rule's route (the first listed) timed with the first three others, then the fastest so far each time
    assert ran == ["c3", "c7", "c9", "c9", "c9"]


def test_the_op_with_the_largest_share_of_the_forward_is_tuned_first(tmp_path):
    """Two ops equally fast on their current routes, one met 12 times a forward (every layer), one once (the
    pooler): the budget goes to the first; the second only has its current route timed (its share)."""
    clock = Clock(compile_s=1.0)
    t = tuning.Tuner(tmp_path / "t.json", timer=clock.timer({"a": 1.0, "a2": 0.5, "a3": 0.4, "b": 1.0, "b2": 0.1}),
                     clock=clock)
    with t.budget(3.5), t.recording() as keys:
        t.choose("pooler", cands("b", "b2"))
        for _ in range(12):
            t.choose("layer", cands("a", "a2", "a3"))
        assert t.tune_pending(keys)
    assert clock.first == ["b", "a", "a2", "a3"]  # shares first (b, then a), then a's candidates
    assert t.table == {t.key("layer", ["a", "a2", "a3"]): "a3"}
    assert t.interim == {t.key("pooler", ["b", "b2"]): "b"}  # b2 waits for a later call


def test_a_call_with_no_time_left_after_its_forward_times_nothing_and_saves_nothing_new(tmp_path):
    clock = Clock()
    t = tuning.Tuner(tmp_path / "t.json", timer=clock.timer(TIMES), clock=clock)
    with t.budget(2.0), t.recording() as keys:
        t.choose("op", cands(*NAMES))
        clock.now = 2.0  # the forward's compiles spent the budget
        assert not t.tune_pending(keys)
    assert clock.samples == [] and t.pending == {} and t.progress == {}


def test_a_settled_route_stays_for_the_process_while_the_table_learns(tmp_path):
    """Once a call has returned, its routes are the process's: another engine (or call) meeting the op runs the
    same kernel and tunes nothing more of it; what a later tuning finds serves later processes."""
    clock = Clock()
    t = tuning.Tuner(tmp_path / "t.json", timer=clock.timer(TIMES), clock=clock)
    with t.budget(0.0), t.recording() as keys:
        first = t.choose("op", cands(*NAMES))
    t.settle(keys)
    with t.budget(100.0), t.recording() as again:
        assert t.choose("op", cands(*NAMES)) == first
        assert t.pending == {} and not t.tune_pending(again)
    assert clock.samples == []
    (key,) = keys
    t.table[key] = "c9"  # say a race in another engine's call had completed it
    assert t.choose("op", cands(*NAMES)) == first


def test_a_save_keeps_what_another_process_saved_meanwhile(tmp_path):
    path = tmp_path / "t.json"
    a, b = tuning.Tuner(path, timer=Clock().timer(TIMES)), tuning.Tuner(path, timer=Clock().timer(TIMES))
    with a.budget(None):
        a.choose("op a", cands("c1", "c2"))
    with b.budget(None):
        b.choose("op b", cands("c3", "c4"))
    assert sorted(tuning.Tuner(path).table.values()) == ["c2", "c4"]


# --- a captured first call -----------------------------------------------------------------------------------------

def test_a_captured_first_call_tunes_after_its_capture_and_captures_again_with_what_it_found(tmp_path, monkeypatch):
    """GraphCache._capture under a budget: the first capture runs the ops on borrowed routes, the call then tunes
    the ops pending (within the budget), captures again because a route changed, and records where each route of
    the graph it keeps came from."""
    from transbench.engine import graphs

    class Graph:
        def replay(self):
            return 1.0

    built = []

    def fake_graph(self, fn, args, static):
        fn()  # the warm-up, where the ops choose their routes
        built.append(fn())
        return graphs._Entry(Graph(), static, built[-1])

    monkeypatch.setattr(graphs.GraphCache, "_graph", fake_graph)
    monkeypatch.setattr(graphs, "replay_ms", lambda run: run())
    clock = Clock(compile_s=1.0)
    t = seeded(tmp_path / "t.json", {gemm(1024): ("triton64x32x128", LARGE)})
    t.timer, t.clock = clock.timer({"cublas": 1.0, "triton128x256x64": 2.0, "triton64x32x128": 3.0, "flash": 1.0,
                                    "cudnn": 0.5}), clock
    cache = graphs.GraphCache(enabled=False, tune_budget_s=3.0, tuner=t)

    def forward():
        return (t.choose(gemm(2048), cands(*LARGE)),
                t.choose("dense|16x128x12x64|torch.float16|causal=False", cands("flash", "cudnn")))
    e = cache._capture(forward, (), [])
    assert built[0] == ("triton64x32x128", "flash")  # the neighbour's route, the rule's
    # the GEMM's share (3 s a call) beats attention's: its route, then cublas; the budget ends there
    assert clock.first == ["triton64x32x128", "flash", "cublas"]
    assert built[1:] == [("cublas", "flash")] and e.out == ("cublas", "flash")
    assert e.routes == {gemm(2048): "cublas", "dense|16x128x12x64|torch.float16|causal=False": "flash"}
    assert e.origins == {"table": 0, "tuned": 0, "partial": 1, "neighbour": 0, "rule": 1}
    assert t.settled == set(t.current) and t.pending == {}


def test_the_budget_holds_for_an_untimed_first_call_of_many_ops(tmp_path):
    """Twenty ops, each with ten candidates, a 5 s budget: the call never starts timing past it, whatever the
    ops' count (one candidate started before the deadline may end past it)."""
    clock = Clock(compile_s=0.7)
    ops = {f"op{i}": [f"o{i}c{j}" for j in range(10)] for i in range(20)}
    t = tuning.Tuner(tmp_path / "t.json", timer=clock.timer({n: 1.0 for names in ops.values() for n in names}),
                     clock=clock)
    with t.budget(5.0), t.recording() as keys:
        for op, names in ops.items():
            t.choose(op, cands(*names))
        t.tune_pending(keys)
    assert 5.0 <= clock.now <= 5.0 + 0.7 and len(clock.first) == math.ceil(5.0 / 0.7)


def test_a_fused_cell_records_where_its_routes_came_from(monkeypatch):
    """The cell's info sums each captured shape's origins (route_origins), next to engine_tuning."""
    from transformers import BertConfig, BertModel

    from transbench.backends import fused
    from transbench.cells import Cell
    from transbench.engine.compiled import CompiledModel
    from transbench.scenarios.inputs import make_inputs

    counts = [{"table": 3, "tuned": 0, "partial": 1, "neighbour": 2, "rule": 1},
              {"table": 0, "tuned": 2, "partial": 0, "neighbour": 0, "rule": 5}]
    monkeypatch.setattr(CompiledModel, "tuning", lambda self: {
        f"fwd|{i}": {"routes": {}, "origins": c, "races": []} for i, c in enumerate(counts)})
    m = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                             vocab_size=300, max_position_embeddings=64)).eval()
    ran = fused.BACKEND.prepare(m, make_inputs(300, 2, 12, token_types=True, seed=1),
                                Cell("b", "base", "fused", "fp32", 2, 12)).what_ran()
    assert ran["route_origins"] == {"table": 3, "tuned": 2, "partial": 1, "neighbour": 2, "rule": 6}
