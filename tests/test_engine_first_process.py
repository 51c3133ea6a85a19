"""benchmarks/engine_first_process.py on the CPU: its arguments, its plan of steps, its table, and one line when
no GPU is visible (the measurement itself needs a GPU)."""
import pytest
from script_helpers import load_script


def _script():
    return load_script("engine_first_process")


@pytest.mark.parametrize("args, says", [
    (["--shape", "256"], "argument --shape: must be BATCHxSEQ"),
    (["--shape", "0x128"], "at least 1x1"),
    (["--nearby", "256"], "--nearby 256 is the measured batch"),
    (["--reps", "0"], "at least 1"),
    (["--dtype", "fp32"], "invalid choice"),
])
def test_bad_arguments_exit_2_before_anything_runs(args, says, capsys):
    with pytest.raises(SystemExit) as e:
        _script().parse(args)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_the_plan_tunes_the_nearby_and_the_exact_shape_each_in_a_folder_of_its_own(capsys):
    script = _script()
    a = script.parse(["--shape", "192x128", "--again", "2"])
    assert a.nearby == 96
    assert script.plan(a) == [
        ("empty table, 192x128", "_measure", "empty"), ("empty table, process 2", "_measure", "empty"),
        ("empty table, process 3", "_measure", "empty"),
        ("", "_tune 96x128", "nearby"), ("tuned at 96x128, run 192x128", "_measure", "nearby"),
        ("", "_tune 192x128", "tuned"), ("tuned at 192x128", "_measure", "tuned")]
    assert script.main(["--plan"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 6


def test_without_a_gpu_it_says_so_in_one_line(capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _script().main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CUDA GPU" in err


def test_an_unknown_model_is_one_line(capsys):
    assert _script().main(["--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-model" in err


def test_the_table_compares_each_scenario_with_the_tuned_shape():
    script = _script()
    origins = dict.fromkeys(script.ORIGINS, 0)
    rows = [("empty table", {"first_call_s": 4.2, "ms": 10.0, "seq_per_s": 25600.0, "origins": {**origins, "rule": 9}}),
            ("nearby", {"error": "exit 1: boom"}),
            ("tuned", {"first_call_s": 0.5, "ms": 8.0, "seq_per_s": 32000.0, "origins": {**origins, "table": 9}})]
    lines = script.table(rows).splitlines()
    assert "80.0%" in lines[2] and lines[3].endswith("error: exit 1: boom") and "100.0%" in lines[4]
    assert script.ORIGINS == __import__("transbench.engine.tuning", fromlist=["ORIGINS"]).ORIGINS
