"""A grid some of whose cells are longer than their model's positions: those cells are `unsupported` with the reason
(as a family's missing head is) and the rest run, exit 0; a seq that fits none of the grid's models is refused, exit 2,
one line, nothing stored (`run`, `run --task generate`, `train`)."""

from __future__ import annotations

import dataclasses

import pytest
from test_cli_input import invoke, refused

from transbench import api
from transbench.cells import Cell
from transbench.errors import SpecError, Unsupported
from transbench.models import build
from transbench.runner import worker
from transbench.scenarios.inference import cells as grid
from transbench.scenarios.inference.measure import ModelCache
from transbench.scenarios.inference.spec import RunSpec
from transbench.scenarios.training import loop as training_loop
from transbench.scenarios.training import spec as training
from transbench.scenarios.training.cell import TrainCell
from transbench.store import Store

FAST = dict(min_time=0.0, warmup=1, min_count=2)


def execute(cell: Cell):
    """One `run` cell through the worker's own path (runner/worker.py), in this process."""
    return worker.execute("transbench.scenarios.inference.target:measure", cell.to_dict(), {"models": ModelCache()})


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """A gpt2 checkpoint of 16 positions, beside gpt2-tiny's 128."""
    import transformers

    folder = tmp_path_factory.mktemp("short") / "gpt2-16"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100, n_positions=16,
                                                         bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    return str(folder)


def test_the_reason_names_the_positions_a_cell_needs():
    ref = build.resolve("gpt2-tiny")
    assert build.too_long(ref, 128) is None and build.too_long(ref, 120, 9) is None
    assert build.too_long(ref, 129) == "seq 129 is longer than gpt2-tiny allows (128 positions)"
    assert build.too_long(ref, 100, 64) == ("seq 100 + 64 new tokens needs 163 positions, more than gpt2-tiny allows "
                                            "(128 positions)")
    assert build.too_long(ref, 129, 1) == "seq 129 is longer than gpt2-tiny allows (128 positions)"
    one = dataclasses.replace(ref, shape=dataclasses.replace(ref.shape, max_positions=1))  # a config of 1 position
    assert build.too_long(one, 2) == "seq 2 is longer than gpt2-tiny allows (1 position)"


@pytest.mark.parametrize("tasks, seqs", [(["base"], [8, 100]), (["generate"], [8, 60]), (["base", "generate"], [60])])
def test_a_grid_some_of_whose_cells_fit_is_valid(tasks, seqs, short_model):
    # 100 and 60 fit gpt2-tiny's 128 positions, not the short model's 16
    grid.validate(RunSpec(models=[short_model, "gpt2-tiny"], tasks=tasks, seqs=seqs, new_tokens=64, device="cpu"))


@pytest.mark.parametrize("tasks, seqs, needle", [
    (["base"], [8, 200], "seq 200 is longer than gpt2-tiny allows (128 positions): use --seq 128 or less"),
    (["generate"], [8, 100], "seq 100 + 64 new tokens needs 163 positions, more than gpt2-tiny allows (128 positions): "
                             "use --seq 65 or less, or --new-tokens 29 or less"),
    (["base", "generate"], [8, 300], "seq 300 is longer than gpt2-tiny allows (128 positions): use --seq 128 or less"),
])
def test_a_seq_no_model_of_the_grid_fits_is_refused(tasks, seqs, needle, short_model):
    """The seq typed past every model's positions would measure nothing: `--model gpt2-tiny --seq 8,200` stays bad
    input, as it was before the cells that fit some models ran."""
    with pytest.raises(SpecError) as err:
        grid.validate(RunSpec(models=[short_model, "gpt2-tiny"], tasks=tasks, seqs=seqs, new_tokens=64, device="cpu"))
    assert str(err.value) == needle


def test_a_grid_of_cells_that_fit_one_model_only_is_valid(short_model):
    grid.validate(RunSpec(models=[short_model, "gpt2-tiny"], seqs=[32], device="cpu"))


def test_a_task_no_model_has_a_head_for_does_not_count_as_fitting():
    # bert-tiny's generate cells are `unsupported` for their head: with gpt2-tiny's too long, nothing would run
    with pytest.raises(SpecError, match="seq 100 \\+ 64 new tokens needs 163 positions, more than gpt2-tiny"):
        grid.validate(RunSpec(models=["bert-tiny", "gpt2-tiny"], tasks=["generate"], seqs=[100], new_tokens=64,
                              device="cpu"))


@pytest.mark.parametrize("args, needle", [
    (["--seq", "200,300"], "seq 200 is longer than gpt2-tiny allows (128 positions): use --seq 128 or less"),
    (["--task", "generate", "--seq", "100,90", "--new-tokens", "64"],
     "seq 90 + 64 new tokens needs 153 positions, more than gpt2-tiny allows (128 positions): use --seq 65 or less, "
     "or --new-tokens 29 or less"),
])
def test_a_grid_none_of_whose_cells_fits_is_refused_in_one_line(tmp_path, args, needle):
    db = tmp_path / "t.db"
    refused(invoke("run", "--model", "gpt2-tiny,llama-tiny", "--device", "cpu", *args, "--db", db), needle)
    assert not db.exists()


def test_a_cell_too_long_is_unsupported_before_anything_is_built():
    cell = Cell(model="gpt2-tiny", task="base", backend="eager", dtype="fp32", batch=1, seq=200, **FAST)
    r = execute(cell)
    assert (r.status, r.error) == ("unsupported", "seq 200 is longer than gpt2-tiny allows (128 positions)")
    gen = Cell(model="gpt2-tiny", task="generate", backend="sdpa", dtype="fp32", batch=1, seq=100, new_tokens=64,
               **FAST)
    r = execute(gen)
    assert r.status == "unsupported" and r.error.startswith("seq 100 + 64 new tokens needs 163 positions"), r.error


@pytest.mark.slow
def test_the_cells_that_fit_run_and_the_others_are_recorded_unsupported(tmp_path, short_model):
    """Before: `--model gpt2-tiny,llama-tiny --seq 8,200` was refused whole for gpt2-tiny's 128 positions."""
    db = tmp_path / "g.db"
    res = invoke("run", "--model", f"{short_model},gpt2-tiny", "--seq", "8,32", "--batch", "1", "--backend", "eager",
                 "--device", "cpu", "--min-time", "0", "--warmup", "1", "--min-count", "2", "--db", db)
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    s = Store(str(db), readonly=True)
    try:
        cells = s.cells(s.runs()[0]["run_id"])
    finally:
        s.close()
    got = {(c["record"]["model"], c["record"]["seq_len"]): (c["status"], c["record"].get("error")) for c in cells}
    assert got == {(short_model, 8): ("ok", None), ("gpt2-tiny", 8): ("ok", None), ("gpt2-tiny", 32): ("ok", None),
                   (short_model, 32): ("unsupported", f"seq 32 is longer than {short_model} allows (16 positions)")}
    assert f"seq 32 is longer than {short_model} allows (16 positions)" in " ".join(res.output.split())


def test_train_refuses_only_a_seq_no_model_of_the_grid_fits(short_model):
    training.validate(training.TrainSpec(models=[short_model, "gpt2-tiny"], seqs=[8, 32], device="cpu"))
    for seqs in ([300, 200], [8, 200]):
        with pytest.raises(SpecError, match=r"seq 200 is longer than gpt2-tiny allows \(128 positions\): use --seq"):
            training.validate(training.TrainSpec(models=[short_model, "gpt2-tiny"], seqs=seqs, device="cpu"))
    cell = TrainCell(model=short_model, task="causal-lm", backend="eager", dtype="fp32", optim="adamw", batch=1, seq=32)
    with pytest.raises(Unsupported, match="seq 32 is longer than .* allows \\(16 positions\\)"):
        training_loop.check_supported(cell, "cpu")


@pytest.mark.slow
def test_train_runs_the_cells_that_fit(tmp_path, short_model):
    db = tmp_path / "t.db"
    recs = api.train(training.TrainSpec(models=[short_model, "gpt2-tiny"], seqs=[8, 32], batches=[1], steps=1,
                                        warmup_steps=1, device="cpu"), db=str(db))
    got = {(r["model"], r["seq_len"]): (r["status"], r["error"]) for r in recs}
    assert got[short_model, 8][0] == got["gpt2-tiny", 8][0] == got["gpt2-tiny", 32][0] == "ok", got
    assert got[short_model, 32] == ("unsupported", f"seq 32 is longer than {short_model} allows (16 positions)")
