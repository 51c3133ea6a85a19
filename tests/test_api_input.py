"""The Python API's bad input (docs/python-api.md): a spec of the wrong type or with a wrong value, an empty axis,
an option no cell uses. Each is one SpecError naming the problem, raised before a store or any file exists, never a
TypeError deep inside, a NaN run, or an empty run that says ok. The CLI's options that only shape another task,
backend or mode are refused the same way (test_cli_input.py covers the rest of the CLI)."""

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test_cli_input import invoke, refused
from transbench import api
from transbench.errors import SpecError
from transbench.scenarios.inference import cells as grid
from transbench.scenarios.serve import spec as serve_spec
from transbench.scenarios.training import spec as training
from transbench.scenarios.micro import BandwidthOptions, BreakdownOptions, GemmOptions, LayerOptions
from transbench.scenarios.serve.spec import ServeSpec
from transbench.scenarios.training.spec import TrainSpec
from transbench.scenarios.inference.spec import RunSpec

CPU = torch.device("cpu")
RUN = dict(models=["bert-tiny"], backends=["sdpa"], batches=[1], seqs=[8], device="cpu", min_time=0.01, warmup=1)
TRAIN = dict(models=["bert-tiny"], batches=[2], seqs=[8], steps=1, warmup_steps=1, device="cpu")
SERVE = dict(model="bert-tiny", device="cpu", lengths="fixed:8", offline=True, duration=0.2, warmup=0.0)


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a store named `None` would land here


def nothing_written(tmp_path):
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


@pytest.mark.parametrize("call,needle", [
    # wrong types reached the checks as they were: TypeError / AttributeError, some after the store was made
    (lambda db: api.run(RunSpec(**{**RUN, "batches": ["x"]}), db), "batches: expected a list of whole numbers, got 'x'"),
    (lambda db: api.run(RunSpec(**{**RUN, "models": [None]}), db), "models: expected a list of text values"),
    (lambda db: api.run(RunSpec(**{**RUN, "timeout": math.inf}), db), "timeout: expected a number, got inf"),
    (lambda db: api.run(RunSpec(**{**RUN, "name": 5}), db), "name: expected text, got 5"),
    (lambda db: api.run(RunSpec(**{**RUN, "device": None}), db), "device: expected text, got nothing"),
    (lambda db: api.run(RunSpec(**{**RUN, "shard": 5}), db), "shard: expected text, got 5"),
    (lambda db: api.run(RunSpec(**{**RUN, "new_tokens": "4"}), db), "new_tokens: expected a whole number, got '4'"),
    (lambda db: api.run(dict(RUN), db), "expected a RunSpec, got dict"),
    (lambda db: api.run(TrainSpec(), db), "expected a RunSpec, got TrainSpec"),
    # the name rules of the CLI hold for the API too
    (lambda db: api.run(RunSpec(**{**RUN, "name": "a\x1b[2Jb"}), db), "control character"),
    (lambda db: api.run(RunSpec(**{**RUN, "name": ""}), db), "run name is empty"),
    (lambda db: api.run(RunSpec(**{**RUN, "max_batch_limit": 0}), db), "max_batch_limit must be at least 1"),
    (lambda db: api.run(RunSpec(**RUN), None), "db must be a file path (text), got None"),
    (lambda db: api.run(RunSpec(**RUN), db, json_path=os.path.join("no", "r.json")), "does not exist"),
    (lambda db: api.train(dict(TRAIN), db), "expected a TrainSpec, got dict"),
    (lambda db: api.train(TrainSpec(**{**TRAIN, "batches": ["x"]}), db), "batches: expected a list of whole numbers"),
    (lambda db: api.train(TrainSpec(**{**TRAIN, "lr": "1e-3"}), db), "lr: expected a number, got '1e-3'"),
    (lambda db: api.train(TrainSpec(**{**TRAIN, "nnodes": "1"}), db), "nnodes: expected a whole number"),
    (lambda db: api.train(TrainSpec(**{**TRAIN, "name": 5}), db), "name: expected text, got 5"),
    (lambda db: api.micro("gemm", GemmOptions(sizes=[64], device="cpu", warmup="2"), db), "warmup: expected a whole number"),
    (lambda db: api.micro("gemm", GemmOptions(sizes=[64], device="cpu", name=5), db), "name: expected text, got 5"),
    (lambda db: api.micro("bandwidth", BandwidthOptions(sizes=["x"], device="cpu"), db), "sizes: cannot read size 'x'"),
    (lambda db: api.micro("layer", LayerOptions(model="bert-tiny", device="cpu", min_time="0.1"), db),
     "min_time: expected a number, got '0.1'"),
    (lambda db: api.micro(["gemm"], GemmOptions(), db), "unknown micro-benchmark"),
    (lambda db: api.serve(ServeSpec(**{**SERVE, "offline": False, "rates": "x"}), db), "rates: expected a list of numbers"),
    (lambda db: api.serve(ServeSpec(**{**SERVE, "max_batch_size": "2"}), db), "max_batch_size: expected a whole number"),
    (lambda db: api.serve(ServeSpec(**{**SERVE, "lengths": None}), db), "lengths: expected text, got nothing"),
    (lambda db: api.serve(ServeSpec(**{**SERVE, "model": ["bert-tiny"]}), db), "model: expected text"),
    (lambda db: api.serve(ServeSpec(**{**SERVE, "name": 5}), db), "name: expected text, got 5"),
    (lambda db: api.serve(None, db), "expected a ServeSpec, got NoneType"),
    # an empty axis stored an empty run and returned as if it had measured
    (lambda db: api.serve(ServeSpec(**{**SERVE, "backends": []}), db), "--backend is empty"),
    (lambda db: api.train(TrainSpec(**{**TRAIN, "kernels": []}), db), "--kernels is empty"),
    (lambda db: api.micro("bandwidth", BandwidthOptions(sizes=[1024], ops=[], device="cpu"), db), "--ops is empty"),
    (lambda db: api.micro("bandwidth", BandwidthOptions(sizes=[], device="cpu"), db), "--sizes is empty"),
    (lambda db: api.micro("gemm", GemmOptions(sizes=[64], dtypes=[], device="cpu"), db), "--dtype is empty"),
    # --tokens only sets the rows of the models' layer GEMMs; with no model (the CPU default, or --model '') no point
    # used it
    (lambda db: api.micro("gemm", GemmOptions(sizes=[64], tokens=64, device="cpu"), db), "no model is measured"),
    (lambda db: api.micro("gemm", GemmOptions(sizes=[64], models=[], tokens=64, device="cpu"), db),
     "no model is measured"),
    # the readers and merge: names and paths of the wrong type
    (lambda db: api.records(db, [5]), "run_refs: expected a list of names"),
    (lambda db: api.runs(None), "db must be a file path"),
    # an empty path is said as every command's store says it, not "must be a file path (text), got ''"
    (lambda db: api.runs(" "), "store path is empty: give a file path, e.g. --db transbench.db"),
    (lambda db: api.merge(db, [""]), "sources is empty: give a file path"),
    (lambda db: api.report(db, [None], "out"), "runs: expected a list of names"),
    (lambda db: api.compare(db, None, "a"), "runs: expected a list of names"),
    (lambda db: api.compare(db, "a", "b", alpha="0.05"), "alpha must be a number, got '0.05'"),
    (lambda db: api.merge(db, []), "merge needs at least one source store"),
    (lambda db: api.merge(None, ["x.db"]), "target must be a file path"),
    (lambda db: api.tune("bert-tiny", ["x"], [8], device="cpu"), "batches: expected a list of whole numbers, got 'x'"),
    (lambda db: api.tune(None, [1], [8], device="cpu"), "model must be a preset name or a checkpoint folder"),
    # AttributeErrors and TypeErrors from deep inside, some after the backend was prepared or the runs were loaded
    (lambda db: api.run_demo(None), "prompt must be text, got None"),
    (lambda db: api.run_demo("hi", model=5), "model must be a preset name or a checkpoint folder, got 5"),
    (lambda db: api.run_demo("hi", model="bert-tiny", backends="sdpa"), "backends must be a list of backend names"),
    (lambda db: api.report(db, ["a"], "out", config=5), "config must be a transbench.report.CompareConfig, got 5"),
    (lambda db: api.report(db, ["a"], "out", compare_runs="no"), "compare_runs must be True or False, got 'no'"),
    (lambda db: api.report(db, ["a"], "out", bogus=1), "report() takes no keyword 'bogus'"),
    (lambda db: api.train(TrainSpec(**TRAIN), db, on_cel=print), "train() takes no keyword 'on_cel'"),
    (lambda db: api.run(RunSpec(**RUN), db, on_cel=print), "run() takes no keyword 'on_cel': it takes json_path,"),
    (lambda db: api.serve(None, db, jsonpath="x"), "serve() takes no keyword 'jsonpath'"),
    (lambda db: api.run(RunSpec(**RUN), db, resume=True, explicit=5), "explicit must be None or the names of the"),
    (lambda db: api.spec_file({"kind": "serve", "spec": None}), "run must be a row of runs()"),
    (lambda db: api.spec_file(None), "run must be a row of runs()"),
])
def test_api_bad_input_is_a_spec_error_before_any_file(tmp_path, call, needle):
    with pytest.raises(SpecError) as exc:
        call(str(tmp_path / "x.db"))
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)
    nothing_written(tmp_path)


@settings(max_examples=30, deadline=None)
@given(path=st.builds(lambda a, b: f"{a}\0{b}", st.text(max_size=8), st.text(max_size=8)),
       where=st.sampled_from(["db", "target", "source", "json_path", "csv_path", "out_dir", "cache_dir"]))
def test_a_path_holding_a_nul_is_one_spec_error(tmp_path_factory, path, where):
    """The command line cannot pass a NUL; the API can, and every path it takes was os.stat's ValueError."""
    folder = tmp_path_factory.mktemp("nul")
    db = str(folder / "x.db")
    calls = {"db": [lambda: api.runs(path), lambda: api.records(path), lambda: api.compare(path, "a", "b"),
                    lambda: api.run(RunSpec(**RUN), path), lambda: api.train(TrainSpec(**TRAIN), path),
                    lambda: api.micro("gemm", GemmOptions(sizes=[64], device="cpu"), path),
                    lambda: api.serve(ServeSpec(**SERVE), path), lambda: api.report(path, ["a"], str(folder / "r"))],
             "target": [lambda: api.merge(path, [db])], "source": [lambda: api.merge(db, [path])],
             "json_path": [lambda: api.run(RunSpec(**RUN), db, json_path=path)],
             "csv_path": [lambda: api.train(TrainSpec(**TRAIN), db, csv_path=path)],
             "out_dir": [lambda: api.report(db, ["a"], path)],
             "cache_dir": [lambda: api.tune("bert-tiny", [1], [8], device="cpu", cache_dir=path)]}[where]
    for call in calls:
        with pytest.raises(SpecError, match="holds a NUL character") as exc:
            call()
        assert "\n" not in str(exc.value)
    assert os.listdir(folder) == []


@pytest.mark.slow
def test_api_reads_one_run_name_as_a_list_of_one(tmp_path):
    """`records(db, "ab")` looked up the runs 'a' and 'b'."""
    db = str(tmp_path / "r.db")
    api.run(RunSpec(**{**RUN, "name": "ab"}), db)
    assert {r["run_name"] for r in api.records(db, "ab")} == {"ab"}


@pytest.mark.parametrize("change,needle", [
    ({"grad_ckpts": ["maybe"]}, "grad_ckpts: expected a list of true/false values, got 'maybe'"),  # ran with ckpt on
    ({"lr": math.inf}, "lr: expected a number, got inf"),  # trained with an infinite learning rate, `ok`
    ({"steps": 2.5}, "steps: expected a whole number, got 2.5"),
    ({"tasks": []}, "--task is empty"),  # ran the model's own task instead
    ({"strategies": []}, "--strategy is empty"),
    ({"heads": []}, "--head is empty"),
    ({"zero_stages": [3]}, "--zero-stage 3 applies to --strategy deepspeed only"),  # ran plain training
    ({"nccl_p2p": ["off"]}, "--nccl-p2p applies to cells of several GPUs"),
    ({"scaling": True}, "--scaling applies to cells of several GPUs"),
    ({"nnodes": 0}, "--nnodes must be at least 1, got 0"),
])
def test_train_spec_values_no_cell_could_use_are_refused(change, needle):
    with pytest.raises(SpecError, match="^" + needle.replace("(", r"\(").replace("[", r"\[")):
        training.validate(TrainSpec(**{**TRAIN, **change}))


@pytest.mark.parametrize("options,needle", [
    (LayerOptions(model="bert-tiny", batches=[], device="cpu"), "--batch is empty"),  # ran the default grid
    (LayerOptions(model="bert-tiny", seqs=[], device="cpu"), "--seq is empty"),
    (LayerOptions(model="bert-tiny", dtype="", device="cpu"), "--dtype is empty"),
    (BreakdownOptions(model="bert-tiny", dtype="", device="cpu"), "--dtype is empty"),
])
def test_micro_empty_values_are_not_replaced_by_defaults(options, needle):
    with pytest.raises(SpecError, match="^" + needle):
        options.resolved(CPU)


@pytest.mark.parametrize("change,needle", [
    ({"percentile": 90.0}, "--percentile 90 is the percentile a verdict holds"),  # ignored without a target
    ({"new_tokens": 8}, "--new-tokens 8 applies to --task generate"),  # ignored by a classification load
    ({"activation": "relu"}, "unknown activation"),  # was never checked: every cell an `error`
])
def test_serve_options_no_cell_uses_are_refused(change, needle):
    with pytest.raises(SpecError, match="^" + needle):
        serve_spec.check(ServeSpec(**{**SERVE, **change}))


def test_run_spec_max_batch_limit_is_checked():
    with pytest.raises(SpecError, match="max_batch_limit must be at least 1"):
        grid.validate(RunSpec(**{**RUN, "max_batch": True, "max_batch_limit": -5}))


# --- CLI options that only shape another task, backend or mode ----------------------------------------------

@pytest.fixture
def no_work(monkeypatch):
    """A command that got past its checks would run: the test fails instead of waiting for a sweep."""
    def ran(*a, **kw):
        raise AssertionError("the command ran instead of refusing")

    for name in ("run", "train", "serve"):
        monkeypatch.setattr(api, name, ran)


@pytest.mark.parametrize("args,needle", [
    (["run", "-m", "bert-tiny", "--new-tokens", "4"], "--new-tokens 4 applies to --task generate"),
    (["run", "-m", "bert-tiny", "--compile-mode", "max-autotune"], "--compile-mode max-autotune applies to the compile"),
    (["train", "-m", "bert-tiny", "--plot", "x.png"], "--plot applies to --ladder only"),  # no plot was written
    (["train", "-m", "bert-tiny", "--max-batch-limit", "8"], "--max-batch-limit applies to --ladder only"),
])
def test_cli_options_for_another_mode_are_refused(tmp_path, no_work, args, needle):
    refused(invoke(*args, "--device", "cpu", "--db", tmp_path / "c.db"), needle)
    nothing_written(tmp_path)


def test_zero_stage_is_for_deepspeed_and_a_stored_spec_is_not_refused(tmp_path, monkeypatch):
    refused(invoke("train", "-m", "bert-tiny", "--zero-stage", "3", "--device", "cpu", "--db", tmp_path / "c.db"),
            "--zero-stage 3 applies to --strategy deepspeed only")  # trained without DeepSpeed, said ok
    assert training.validate(TrainSpec(**TRAIN, zero_stages=[3], strategies=["deepspeed"])).zero_stages == [3]
    # a stored spec holds every key (new_tokens, compile_mode): `run --spec` of it is not refused
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [bert-tiny]\ntasks: [base]\nnew_tokens: 128\ncompile_mode: default\n")
    monkeypatch.setattr(api, "run", lambda *a, **kw: (_ for _ in ()).throw(SpecError("reached api.run")))
    refused(invoke("run", "--spec", spec, "--device", "cpu", "--db", tmp_path / "c.db"), "reached api.run")


@pytest.mark.parametrize("args,needle", [
    (["run", "-m", "bert-tiny", "--batch", "1,1", "--seq", "8", "--min-time", "0.01"], "--batch lists 1 twice"),
    (["run", "-m", "bert-tiny", "-b", "sdpa,eager,sdpa", "--batch", "1", "--seq", "8", "--min-time", "0.01"],
     "--backend lists sdpa twice"),
    (["serve", "-m", "bert-tiny", "--rate", "5,5", "--lengths", "fixed:8", "--duration", "0.2", "--warmup", "0"],
     "--rate lists 5 twice"),
])
def test_a_value_given_twice_is_refused(tmp_path, args, needle):
    """The same cell was measured once per copy (4 times for `-b sdpa,sdpa --batch 1,1`) and stored once."""
    refused(invoke(*args, "--device", "cpu", "--db", tmp_path / "d.db"), needle)
    nothing_written(tmp_path)


@pytest.mark.parametrize("args,needle", [
    (["report", "a", "--alpha", "0.1"], "--alpha applies to the comparison of two runs"),
    (["report", "a", "b", "--no-compare", "--min-effect", "0.1"], "--min-effect applies to the comparison"),
])
def test_report_comparison_options_without_a_comparison_are_refused(tmp_path, args, needle):
    refused(invoke(*args, "--db", tmp_path / "none.db", "--out", tmp_path / "out"), needle)
    nothing_written(tmp_path)


# Whatever a caller hands from_dict that is not a mapping: nothing, numbers, text, bytes, lists and pairs of keys.
NOT_A_MAPPING = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                          st.binary(max_size=20), st.lists(st.text(max_size=5), max_size=4),
                          st.tuples(st.text(max_size=5), st.integers()), st.sets(st.integers(), max_size=3))


@settings(max_examples=60, deadline=None)
@given(data=NOT_A_MAPPING)
def test_from_dict_of_anything_but_a_mapping_is_one_spec_error(data):
    for cls in (RunSpec, TrainSpec):
        with pytest.raises(SpecError) as info:
            cls.from_dict(data)
        line = str(info.value)
        assert "\n" not in line and f"{cls.__name__} is built from a mapping of settings" in line, line


@settings(max_examples=25, deadline=None)
@given(refs=st.lists(st.sampled_from(["a", "b", "last", "id of a"]), min_size=1, max_size=6))
def test_records_of_a_run_named_twice_are_its_records_once(tmp_path_factory, refs):
    from report_helpers import cell, make_run, ok_result

    db = str(tmp_path_factory.mktemp("twice") / "s.db")
    ids = {name: make_run(db, name, [(cell(backend), ok_result([1.0, 1.1, 1.2], 1)) for backend in ("eager", "sdpa")])
           for name in ("a", "b")}
    refs = [ids["a"] if r == "id of a" else r for r in refs]
    once = list(dict.fromkeys(ids["b"] if r == "last" else ids.get(r, r) for r in refs))  # each run, in given order
    recs = api.records(db, refs)
    assert [r["run_id"] for r in recs] == [i for i in once for _ in range(2)]
