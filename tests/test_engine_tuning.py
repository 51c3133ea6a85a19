"""The tuner's logic on CPU, with a fake timer: choices alone, rivals, and the whole-forward refinement; and `tune`'s
bad input (families the engine cannot run, cache folders and tables it cannot use) as one line, exit code 2."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from transbench.cli import app
from transbench.engine import tuning


def _timer(costs):
    """A timer that reads each candidate's time from `costs` (candidates are named callables here)."""
    return lambda fn, reps: costs[fn()]


def _cands(*names):
    return {n: (lambda n=n: n) for n in names}


def test_choose_takes_the_fastest_keeps_close_rivals_and_persists(tmp_path):
    costs = {"a": 1.0, "b": 0.8, "c": 0.9, "d": 0.8 * (1 + tuning.RIVAL_MARGIN) * 1.01, "e": 0.95}
    t = tuning.Tuner(tmp_path / "t.json", timer=_timer(costs))
    assert t.choose("op|1x2x3", _cands("a", "b", "c", "d", "e")) == "b"
    (key,) = t.table
    # runners-up within RIVAL_MARGIN of 0.8 (d is just outside), the closest first, at most RIVALS_PER_OP
    assert list(t.rivals[key]) == ["c", "e", "a"][: tuning.RIVALS_PER_OP]
    assert t.rivals[key]["c"] == pytest.approx(0.9 / 0.8)

    def never(fn, reps):
        raise AssertionError("a second process must not time again")
    again = tuning.Tuner(tmp_path / "t.json", timer=never)
    assert again.choose("op|1x2x3", _cands("a", "b", "c", "d", "e")) == "b" and again.rivals == {}


def test_a_new_candidate_is_timed_not_hidden_by_an_older_choice(tmp_path):
    """A table written before a route existed must not keep that route from ever being timed."""
    costs = {"a": 1.0, "b": 0.8, "new": 0.5}
    tuning.Tuner(tmp_path / "t.json", timer=_timer(costs)).choose("op", _cands("a", "b"))
    later = tuning.Tuner(tmp_path / "t.json", timer=_timer(costs))
    assert later.choose("op", _cands("a", "b")) == "b"
    assert later.choose("op", _cands("a", "b", "new")) == "new"
    assert len(later.table) == 2


def test_candidates_are_timed_in_alternation_so_drift_cannot_choose(tmp_path):
    """Every sample a little slower than the one before (clocks settling): timed one candidate after the other,
    the first would win; in alternating rounds the truly faster one does."""
    calls = []

    def drifting(fn, reps):
        calls.append(fn())
        return {"first": 1.0, "faster": 0.8}[calls[-1]] + 0.1 * len(calls)
    t = tuning.Tuner(tmp_path / "t.json", timer=drifting)
    assert t.choose("op", _cands("first", "faster")) == "faster"
    assert calls == ["first", "faster"] * tuning.ROUNDS


def test_a_route_family_is_its_name_without_the_config():
    from transbench.engine.tuning import _family
    assert [_family(n) for n in ("triton128x256x64x4x8xTruexTrue", "splitk64x64x128x2x3x4", "cublas+ln", "fp8",
                                 "fp8+gelu_q", "fp8+triton_gelu_q128x256x128x3x8xTruexTrue")] == [
        "triton", "splitk", "cublas+ln", "fp8", "fp8+gelu_q", "fp8+triton_gelu_q"]


def test_rivals_include_the_best_of_each_other_route_family(tmp_path):
    """Four Triton tile sizes within 4% of the winner do not crowd out cuBLAS at 30%: in the whole forward the
    families differ most (PDL overlap), tile sizes least."""
    costs = {"triton1": 1.0, "triton2": 1.01, "triton3": 1.02, "triton4": 1.03, "triton5": 1.04, "cublas": 1.3,
             "splitk8": 1.6}
    t = tuning.Tuner(tmp_path / "t.json", timer=_timer(costs))
    t.choose("op", _cands(*costs))
    (rivals,) = t.rivals.values()
    assert list(rivals) == ["cublas", "triton2", "triton3", "triton4"][: tuning.RIVALS_PER_OP]  # splitk: > margin


def test_choose_skips_candidates_that_raise(tmp_path):
    def timer(fn, reps):
        return fn()
    t = tuning.Tuner(tmp_path / "t.json", timer=timer)

    def broken():
        raise ValueError("shape not supported")
    assert t.choose("op", {"broken": broken, "ok": lambda: 2.0}) == "ok"
    with pytest.raises(RuntimeError, match="no candidate ran"):
        t.choose("op2", {"broken": broken})


class _Model:
    """A 'forward' that asks the tuner for two ops; its whole time depends on the pair of choices, unlike the
    ops' times alone: in context, op1's rival is faster and op2's rival is not."""

    alone = {"x": 1.0, "x2": 1.1, "y": 2.0, "y2": 2.1}
    whole = {("x", "y"): 10.0, ("x2", "y"): 9.0, ("x", "y2"): 11.0, ("x2", "y2"): 9.5}

    def __init__(self, tuner):
        self.t = tuner
        self.builds = 0

    def build(self):
        self.builds += 1
        return (self.t.choose("op1", _cands("x", "x2")), self.t.choose("op2", _cands("y", "y2")))

    def time_ms(self, built):
        return self.whole[built]


def test_refine_keeps_a_rival_only_where_the_whole_forward_gains(tmp_path):
    t = tuning.Tuner(tmp_path / "t.json", timer=_timer(_Model.alone))
    model = _Model(t)
    with t.recording() as keys:
        best = t.refine(keys, model.build, model.time_ms)
    assert best == ("x2", "y")
    k1, k2 = t.key("op1", _cands("x", "x2")), t.key("op2", _cands("y", "y2"))
    assert keys == {k1, k2} and t.table[k1] == "x2" and t.table[k2] == "y"
    assert model.builds == 3 and t.rivals == {} and t.forced == {}  # one build, one trial per rival
    assert tuning.Tuner(tmp_path / "t.json").table == t.table  # the settled choices are on disk
    # a later forward of the same shape in this process tries nothing again
    assert t.refine({k1, k2}, model.build, model.time_ms) == ("x2", "y") and model.builds == 4


def test_refine_ignores_gains_under_the_threshold_and_can_be_switched_off(tmp_path, monkeypatch):
    t = tuning.Tuner(tmp_path / "t.json", timer=_timer(_Model.alone))
    model = _Model(t)
    monkeypatch.setattr(_Model, "whole", {("x", "y"): 10.0, ("x2", "y"): 10.0 * (1 - tuning.MIN_GAIN / 2),
                                          ("x", "y2"): 12.0, ("x2", "y2"): 12.0})
    with t.recording() as keys:
        assert t.refine(keys, model.build, model.time_ms) == ("x", "y")

    off = tuning.Tuner(tmp_path / "off.json", timer=_timer(_Model.alone))
    model = _Model(off)
    with off.recording() as keys:  # EngineOptions(refine=False)
        assert off.refine(keys, model.build, model.time_ms, enabled=False) == ("x", "y")
    assert model.builds == 1


def test_refine_races_the_all_library_forward_that_no_single_change_reaches(tmp_path):
    """Our kernels win each op alone and every single swap to a library route makes the forward slower, but all
    library routes together are fastest (H100 bert-base 8 x 512 lost to the cudagraph backend so): refine finds
    that forward first, then races each displaced route back, which here loses."""
    alone = {"triton1": 1.0, "cublas1": 1.2, "triton2": 2.0, "cublas2": 2.2, "splitk2": 2.1}
    whole = {("triton1", "triton2"): 10.0, ("cublas1", "triton2"): 10.5, ("triton1", "cublas2"): 10.5,
             ("cublas1", "cublas2"): 9.0, ("triton1", "splitk2"): 10.2, ("cublas1", "splitk2"): 9.9}
    t = tuning.Tuner(tmp_path / "t.json", timer=_timer(alone))
    built = []

    def build():
        built.append((t.choose("op1", _cands("triton1", "cublas1")),
                      t.choose("op2", _cands("triton2", "cublas2", "splitk2"))))
        return built[-1]
    with t.recording() as keys:
        assert t.refine(keys, build, whole.get) == ("cublas1", "cublas2")
    # the all-library forward, then the all-ours one (which here is the forward the choices alone gave)
    assert built[:3] == [("triton1", "triton2"), ("cublas1", "cublas2"), ("triton1", "triton2")]
    # then the displaced routes, one at a time from the new best (and splitk2, op2's remaining rival)
    assert set(built[3:]) == {("triton1", "cublas2"), ("cublas1", "triton2"), ("cublas1", "splitk2")}
    assert sorted(t.table.values()) == ["cublas1", "cublas2"] and t.rivals == {} and t.forced == {}
    assert [(r["trial"], r["won"]) for r in t.races[:2]] == [("library", True), ("ours", False)]
    assert t.races[0]["routes"] == {"op1": "cublas1", "op2": "cublas2"}
    assert t.races[0]["trial_ms"] == 9.0 and t.races[0]["best_ms"] == 10.0


def test_refine_races_the_all_ours_forward_and_keeps_a_record_of_every_trial(tmp_path):
    """Alone, cuBLAS wins op2; in the forward, our kernels pay only together (H100 bert-base 1 x 128: two tunings
    replayed in 0.3165 and 0.3913 ms, the faster with both LayerNorm GEMMs on Triton). No single swap and not the
    library forward get there; the all-ours forward does. Every trial is recorded with its times."""
    alone = {"triton1": 1.0, "cublas1": 1.2, "cublas2": 2.0, "splitk2": 2.1}
    whole = {("triton1", "cublas2"): 10.0, ("cublas1", "cublas2"): 10.3, ("triton1", "splitk2"): 9.0,
             ("cublas1", "splitk2"): 10.4}
    t = tuning.Tuner(tmp_path / "t.json", timer=_timer(alone))

    def build():
        return (t.choose("op1", _cands("triton1", "cublas1")), t.choose("op2", _cands("cublas2", "splitk2")))
    with t.recording() as keys:
        assert t.refine(keys, build, whole.get) == ("triton1", "splitk2")
    assert t.routes(keys) == {"op1": "triton1", "op2": "splitk2"}
    trials = [(r["trial"], r["routes"], r["won"]) for r in t.races]
    assert trials[:2] == [("library", {"op1": "cublas1"}, False), ("ours", {"op2": "splitk2"}, True)]
    # op2's displaced choice alone is raced back first, and loses (10.0 against 9.0); op1's rival loses too
    assert trials[2:] == [("rival", {"op2": "cublas2"}, False), ("rival", {"op1": "cublas1"}, False)]
    assert all(r["best_ms"] == 9.0 for r in t.races[2:])


def test_refine_races_the_all_fp8_forward(tmp_path):
    """fp8 routes lose alone (each pays its quantize pass) and the library and our forwards pick others; together
    they win (an fp8 output feeds the next fp8 GEMM with no quantize pass): refine's fp8 forward finds that."""
    alone = {"triton1": 1.0, "cublas1": 1.1, "fp8a": 1.2, "triton2": 2.0, "cublas2": 2.1, "fp8+ln": 2.2}
    whole = {("fp8a", "fp8+ln"): 8.0}
    t = tuning.Tuner(tmp_path / "t.json", timer=_timer(alone))

    def build():
        return (t.choose("op1", _cands("triton1", "cublas1", "fp8a")),
                t.choose("op2", _cands("triton2", "cublas2", "fp8+ln")))
    with t.recording() as keys:
        assert t.refine(keys, build, lambda forward: whole.get(forward, 10.0)) == ("fp8a", "fp8+ln")
    # (the all-ours forward is the one the choices alone gave: nothing to race)
    assert [(r["trial"], r["won"]) for r in t.races[:2]] == [("library", False), ("fp8", True)]
    assert t.races[1]["routes"] == {"op1": "fp8a", "op2": "fp8+ln"}
    assert t.routes(keys) == {"op1": "fp8a", "op2": "fp8+ln"}


def test_a_rival_that_fails_to_build_is_dropped(tmp_path):
    t = tuning.Tuner(tmp_path / "t.json", timer=_timer(_Model.alone))
    model = _Model(t)

    def build():
        if t.forced:
            raise RuntimeError("capture failed")
        return model.build()
    with t.recording() as keys:
        assert t.refine(keys, build, model.time_ms) == ("x", "y")
    assert t.forced == {} and t.rivals == {}
    assert t.races and all(r["error"] == "RuntimeError: capture failed" and "won" not in r for r in t.races)


def test_refine_races_the_closest_rivals_first_within_its_time_budget(tmp_path, monkeypatch):
    """Rivals of all ops in one queue, closest alone-time first; once RACE_BUDGET_S has passed, no more
    trials start (a long forward must not outlast the benchmark cell that builds it)."""
    t = tuning.Tuner(tmp_path / "t.json", timer=_timer({"x": 1.0, "x2": 1.3, "x3": 1.1, "y": 2.0, "y2": 2.1}))
    raced = []

    def build():
        choice = (t.choose("op1", _cands("x", "x2", "x3")), t.choose("op2", _cands("y", "y2")))
        if t.forced:
            raced.append(choice)
        return choice

    now = [0.0]

    def clock():  # each reading is 0.45 budgets later: the third trial would start 1.35 budgets in
        now[0] += tuning.RACE_BUDGET_S * 0.45
        return now[0]
    with t.recording() as keys:
        assert t.refine(keys, build, lambda built: 1.0, clock=clock) == ("x", "y")
    assert raced == [("x", "y2"), ("x3", "y")]  # 2.1/2.0 and 1.1/1.0 raced; x2 (1.3) was past the budget
    assert t.rivals == {}  # the rest is not tried again in this process


class _FakeEvents:
    """torch.cuda.Event / synchronize stand-ins on a clock that only the timed work advances."""

    def __init__(self, monkeypatch):
        self.now, self.calls = 0.0, 0
        clock = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = clock.now

            def elapsed_time(self, end):
                return end.t - self.t
        monkeypatch.setattr(tuning.torch.cuda, "Event", Event)
        monkeypatch.setattr(tuning.torch.cuda, "synchronize", lambda: None)

    def work(self, ms):
        def run():
            self.calls += 1
            self.now += ms
        return run


def test_replay_timing_reports_one_run_and_batches_short_ones(monkeypatch):
    clock = _FakeEvents(monkeypatch)
    assert tuning.replay_ms(clock.work(0.125)) == pytest.approx(0.125)
    # 0.125 ms runs: 4 per sample (capped), 15 samples (capped), after a warm-up and a one-run probe
    assert clock.calls == 2 + 4 * 15
    clock.calls = 0
    assert tuning.replay_ms(clock.work(200.0)) == pytest.approx(200.0)
    assert clock.calls == 2 + 3  # a long forward: one run per sample, the 3-sample minimum


class _Cyclic:
    """What a trial graph leaves when it loses its race: an object only a garbage collection frees."""

    def __init__(self):
        self.me = self


@pytest.mark.slow
def test_a_call_that_tuned_collects_the_trial_graphs_it_dropped_and_a_warm_call_does_not(tmp_path, monkeypatch):
    """engine/graphs.py GraphCache._capture: the lost trials' memory is freed before the call returns (on an H100 it
    stayed allocated until some later collection); a call whose routes are on disk pays for no collection."""
    import gc
    import weakref

    from transbench.engine import graphs

    class Graph:
        def replay(self):
            return 1.0  # every forward equally fast: a trial loses, and is dropped

    left = []

    def fake_graph(self, fn, args, static):
        fn()  # the warm-up, where the tuner times the op's candidates on a first call
        junk = _Cyclic()
        left.append(weakref.ref(junk))
        return graphs._Entry(Graph(), static, junk)

    monkeypatch.setattr(graphs.GraphCache, "_graph", fake_graph)
    monkeypatch.setattr(graphs, "replay_ms", lambda run: run())
    tuner = tuning.Tuner(tmp_path / "t.json", timer=_timer({"a": 1.0, "b": 0.9}))
    cache = graphs.GraphCache(enabled=False, tune_budget_s=None, tuner=tuner)

    def forward():
        return tuner.choose("op", _cands("a", "b"))
    enabled = gc.isenabled()
    gc.disable()  # only the collection under test may free anything
    try:
        kept = cache._capture(forward, (), [])
        assert len(tuner.races) == 1 and not tuner.races[0]["won"]  # rival "a" raced in a trial forward, lost
        assert len(left) == 2 and left[0]() is kept.out and left[1]() is None

        tuner = tuning.Tuner(tmp_path / "t.json", timer=_timer({}))  # a new process: the routes are on disk
        left.clear()
        warm = cache._capture(forward, (), [])
        assert len(left) == 1 and tuner.races == []
        del warm
        assert left[0]() is not None  # no collection ran
    finally:
        if enabled:
            gc.enable()


# --- tune's bad input: families the engine cannot run, cache folders and tables it cannot use -------------------------

runner = CliRunner()
FAST = ["--device", "cpu", "--min-time", "0.01"]


def refused(res, *needles) -> str:
    """Exit 2, exactly one line on stderr that starts with `error:` and holds every needle, no traceback."""
    assert res.exit_code == 2, res.output
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]

# --- tune: bad input, before any GPU is asked for -----------------------------------------------------------

def tune(*args):
    args = [str(a) for a in args]  # bert-tiny at seq 8 where the case does not name its own (given twice is refused)
    defaults = ([] if {"-m", "--model"} & set(args) else ["-m", "bert-tiny"]) + ([] if "--seq" in args else ["--seq", "8"])
    return runner.invoke(app, ["tune", *defaults, *args])


@pytest.mark.parametrize("args, words", [
    (["--batch", "1,1"], "--batch lists 1 twice"),
    (["--batch", "1", "--seq", "8,8"], "--seq lists 8 twice"),
    (["-m", "llama-tiny"], "llama-tiny is a llama model; the fused engine runs bert"),
    (["-m", "modernbert-tiny"], "the fused engine runs"),
    (["--cache-dir", ""], "--cache-dir is empty"),
    (["--cache-dir", "/proc/transbench-tuned"], "a file made in /proc failed"),
])
def test_tune_refuses_what_it_cannot_do_in_one_line(args, words):
    refused(tune(*args), words)


def test_tune_without_a_gpu_does_not_advise_the_cpu():
    line = refused(tune("--device", "cuda"), "tune needs a CUDA GPU")
    assert "--device cpu" not in line


@pytest.mark.parametrize("table, words", [
    ("folder", "it is a folder"),
    (b'{"NVIDIA H100|torch 2.13|linear": "triton', "it is not valid JSON"),  # truncated
    (b"\xff\xfe not text", "it is not valid JSON"),
    (b"[1, 2]", "it holds a JSON list"),
    (b'"text"', "it holds a JSON str"),
])
def test_tune_refuses_a_table_it_could_not_use_and_leaves_it_as_it_was(tmp_path, table, words):
    path = tmp_path / tuning.TABLE_NAME
    if table == "folder":
        path.mkdir()
    else:
        path.write_bytes(table)
    before = sorted(os.listdir(tmp_path))
    refused(tune("--cache-dir", tmp_path), f"cannot use the tuning table {path}", words)
    assert sorted(os.listdir(tmp_path)) == before
    if table != "folder":
        assert path.read_bytes() == table


def test_tune_refuses_a_cache_dir_under_a_file_and_creates_nothing(tmp_path, monkeypatch):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    refused(tune("--cache-dir", a_file / "tuned"), f"{a_file} is a file, not a folder")
    monkeypatch.setenv("TRANSBENCH_CACHE_DIR", str(a_file))  # the default folder, from the environment: named
    refused(tune(), "(from $TRANSBENCH_CACHE_DIR)", f"{a_file} is a file, not a folder")
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


@pytest.mark.parametrize("link", ["missing", "loop"])
def test_tune_refuses_a_cache_dir_that_is_a_link_to_nothing(tmp_path, link):
    """The save's mkdir cannot make a link to a missing folder or a loop of links: the check passed such a
    --cache-dir (exists() is False for it too), and the minutes of tuning were kept nowhere."""
    target = tmp_path / "there"
    if link == "missing":
        target.symlink_to(tmp_path / "gone")
    else:
        (tmp_path / "back").symlink_to(target)
        target.symlink_to(tmp_path / "back")
    for cache_dir in (target, target / "sub"):
        refused(tune("--cache-dir", cache_dir), f"{target} is a symbolic link to nothing")
    assert not (tmp_path / "gone").exists()
    (tmp_path / "real").mkdir()  # a link to a folder that is there is a folder
    (tmp_path / "to-real").symlink_to(tmp_path / "real")
    assert tuning.table_problem(tmp_path / "to-real" / "new" / tuning.TABLE_NAME) is None


def test_a_usable_table_passes_and_the_check_creates_nothing(tmp_path):
    assert tuning.table_problem(tmp_path / "new" / "sub" / tuning.TABLE_NAME) is None
    assert not (tmp_path / "new").exists()
    (tmp_path / tuning.TABLE_NAME).write_text(json.dumps({"k": "v"}))
    assert tuning.table_problem(tmp_path / tuning.TABLE_NAME) is None


def test_a_failed_save_leaves_no_temporary_file(tmp_path):
    """A folder where the table should be: each save (one per tuned op) left a .tmp file beside it."""
    (tmp_path / tuning.TABLE_NAME).mkdir()
    t = tuning.Tuner(tmp_path / tuning.TABLE_NAME)
    t.table["cpu|torch|linear|1x2x3|abc"] = "cublas"
    t._save()
    t._save()
    assert sorted(os.listdir(tmp_path)) == [tuning.TABLE_NAME]
