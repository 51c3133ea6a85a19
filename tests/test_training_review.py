"""An independent review of the training path: options no cell uses or that another step overrides, a value
listed twice, a ladder whose search could not start, a task left out of its own grid, scaling efficiency
against the wrong baseline, and the figure a training table is read for dropped first. Bad input is one line
on stderr, exit code 2, nothing stored."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from rich.console import Console

from test_cli_input import invoke, refused
from transbench import api
from transbench.cells import CellResult
from transbench.cli import tables
from transbench.errors import SpecError
from transbench.scenarios.training import spec as training, ladder as training_ladder
from transbench.scenarios.training.spec import TrainSpec, add_scaling, expand, validate
from transbench.scenarios.training.cell import TrainCell
from transbench.store import Store

TRAIN = dict(models=["bert-tiny"], batches=[2], seqs=[8], steps=1, warmup_steps=1, device="cpu")
BASE = TrainCell(model="bert-tiny", task="mlm", backend="sdpa", dtype="fp32", optim="adamw", batch=4, seq=16,
                 steps=2, warmup_steps=1, device="cpu")


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def no_work(monkeypatch):
    """A command that got past its checks would train: the test fails instead."""
    def ran(*a, **kw):
        raise AssertionError("the command trained instead of refusing")

    monkeypatch.setattr(api, "train", ran)


def test_zero_stage_2_given_without_deepspeed_is_refused(tmp_path, no_work):
    """2 is the default stage: `--zero-stage 2` alone trained plain (no DeepSpeed) and said ok, while 1 and 3
    were refused."""
    refused(invoke("train", "-m", "bert-tiny", "--zero-stage", "2", "--device", "cpu", "--db", tmp_path / "z.db"),
            "--zero-stage 2 applies to --strategy deepspeed only")
    assert os.listdir(tmp_path) == []


def test_zero_stage_2_with_deepspeed_and_a_stored_spec_still_pass(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(api, "train", lambda spec, db, **kw: seen.append(spec) or [])
    res = invoke("train", "-m", "bert-tiny", "--zero-stage", "2", "--strategy", "deepspeed", "--device", "cpu",
                 "--db", tmp_path / "z.db")
    assert res.exit_code == 0, res.output
    spec = tmp_path / "stored.yaml"  # what `runs --spec` writes holds zero_stages: [2] for any training run
    spec.write_text("models: [bert-tiny]\nzero_stages: [2]\nstrategies: null\n")
    res = invoke("train", "--spec", spec, "--device", "cpu", "--db", tmp_path / "z.db")
    assert res.exit_code == 0, res.output
    assert [s.zero_stages for s in seen] == [[2], [2]]


@pytest.mark.parametrize("change,option", [
    ({"optims": ["sgd"]}, "--optim"),  # trained AdamW (the ladder's first steps), said ok
    ({"dtypes": ["bf16"]}, "--dtype"),  # the CPU's default is fp32
    ({"grad_accums": [4]}, "--grad-accum"),
    ({"grad_ckpts": [True]}, "--grad-ckpt"),
    ({"compiles": [True]}, "--compile"),
    ({"heads": ["masked"]}, "--head"),
    ({"activation": "gelu-tanh"}, "--activation"),
    ({"pad_vocab": 64}, "--pad-vocab"),
    ({"strategies": ["ddp"]}, "--strategy"),
    ({"strategies": ["deepspeed"], "zero_stages": [3]}, "--strategy, --zero-stage"),
])
def test_a_ladder_refuses_the_options_its_steps_set(tmp_path, monkeypatch, change, option):
    from transbench.runner import sweep

    def trained(*a, **kw):
        raise AssertionError("the ladder trained instead of refusing")

    monkeypatch.setattr(sweep._Lane, "run", trained)
    with pytest.raises(SpecError, match=f"^--ladder takes no {option}: "):
        api.train(TrainSpec(**{**TRAIN, "ladder": True, **change}), str(tmp_path / "l.db"))
    assert os.listdir(tmp_path) == []


def test_a_ladder_search_below_its_start_batch_is_refused_not_a_traceback(tmp_path, monkeypatch):
    """The search doubles from the batch: with the limit below it, find_max_batch raised UnboundLocalError
    after the first step had trained and been stored."""
    from transbench.runner import sweep

    monkeypatch.setattr(sweep._Lane, "run", lambda lane, cell, timeout: CellResult("ok", {"samples_per_s": 1.0}))
    res = invoke("train", "--ladder", "-m", "bert-tiny", "--batch", "4", "--max-batch-limit", "2", "--device", "cpu",
                 "--db", tmp_path / "l.db", "--plot", tmp_path / "l.png")
    refused(res, "--max-batch-limit 2 is below --batch 4")
    assert os.listdir(tmp_path) == []


def test_a_stored_ladder_spec_runs_again(tmp_path, monkeypatch):
    """What `runs --spec` writes for a ladder (its validated spec: every default filled in) is not refused by
    the ladder's own checks: it resumes the run."""
    from transbench.runner import sweep

    ran = []

    def fake_run(lane, cell, timeout):
        ran.append(cell)
        return CellResult("oom" if cell.batch > 4 else "ok", {"samples_per_s": float(cell.batch), "tflops": 1.0})

    monkeypatch.setattr(sweep._Lane, "run", fake_run)
    db = str(tmp_path / "l.db")
    rows = api.train(TrainSpec(**{**TRAIN, "ladder": True, "name": "lad", "max_batch_limit": 8}), db)
    assert rows and ran
    store = Store(db)
    (run,) = store.runs()
    store.close()
    before = len(ran)
    again = api.train(TrainSpec.from_dict({**run["spec"], "name": "lad"}), db)
    assert len(ran) == before and [r["step"] for r in again] == [r["step"] for r in rows]


def test_another_task_keeps_its_cells_under_head_masked():
    """`--task mlm,classification --head masked`: the head axis is mlm's; classification cells were skipped,
    and the task asked for was never measured."""
    cells = expand(validate(TrainSpec(**{**TRAIN, "tasks": ["mlm", "classification"], "heads": ["masked"]})))
    assert sorted((c.task, c.head) for c in cells) == [("classification", "all"), ("mlm", "masked")]
    both = expand(validate(TrainSpec(**{**TRAIN, "tasks": ["mlm", "classification"], "heads": ["all", "masked"]})))
    assert sorted((c.task, c.head) for c in both) == [("classification", "all"), ("mlm", "all"), ("mlm", "masked")]


def test_scaling_baseline_has_the_same_padded_vocabulary(tmp_path):
    """A 2-GPU cell of `--pad-vocab 64` took its one-GPU baseline from a run of the unpadded model."""
    store = Store(tmp_path / "s.db")
    old, _ = store.create_run(None, "training", {}, {})
    one = replace(BASE, strategy="none")
    store.put_cell(old, one.key(), "training", "ok", {"samples_per_s": 100.0, "gpu": "X"}, cell=one.to_dict())
    new, _ = store.create_run(None, "training", {}, {})
    padded = CellResult("ok", record={"samples_per_s": 150.0, "gpu": "X"})
    add_scaling(store, new, replace(BASE, strategy="ddp", nproc=2, pad_vocab=64), padded)
    assert "scaling_efficiency" not in padded.record and "--scaling" in padded.warnings[0]
    same = CellResult("ok", record={"samples_per_s": 150.0, "gpu": "X"})
    add_scaling(store, new, replace(BASE, strategy="ddp", nproc=2), same)
    assert same.record["scaling_efficiency"] == pytest.approx(0.75)
    store.close()


def test_scaling_over_several_hosts_runs_a_one_gpu_baseline():
    """With --nnodes 2, the baseline of nproc 1 was a cell of 1 GPU on each of 2 hosts (world 2, ddp): no cell
    ran on one GPU, so no 2-host cell ever got its efficiency."""
    spec = validate(TrainSpec(**{**TRAIN, "nprocs": [2], "nnodes": 2, "rdzv_endpoint": "h:29500", "scaling": True}))
    cells = expand(spec)
    assert [(c.world_size, c.strategy, c.nnodes) for c in cells] == [(1, "none", 1), (4, "ddp", 2)]
    # one host: the same cells as before (a baseline of the same key)
    one_host = expand(validate(TrainSpec(**{**TRAIN, "nprocs": [2], "scaling": True})))
    assert [(c.world_size, c.strategy, c.zero_stage, c.nccl) for c in one_host] == [(1, "none", None, ""),
                                                                                   (2, "ddp", None, "")]


@pytest.mark.parametrize("change,needle", [
    ({"batches": [2, 2]}, "--batch lists 2 twice"),  # docs/options.md: a value listed twice is refused on every axis
    ({"optims": ["sgd", "sgd"]}, "--optim lists sgd twice"),
    ({"grad_ckpts": ["on", "true"]}, "--grad-ckpt lists on twice"),
    ({"nprocs": [2, 2]}, "--nproc lists 2 twice"),
    ({"nprocs": [2], "nccl_p2p": ["on", "yes"]}, "--nccl-p2p lists yes twice"),
    ({"nprocs": [2], "nccl_envs": ["NCCL_A=1 NCCL_B=2", "NCCL_B=2 NCCL_A=1"]}, "--nccl-env lists NCCL_B=2 NCCL_A=1 twice"),
])
def test_a_value_listed_twice_is_refused(change, needle):
    with pytest.raises(SpecError, match="^" + needle):
        validate(TrainSpec(**{**TRAIN, **change}))


@pytest.mark.parametrize("change,needle", [
    ({"nccl_envs": [""]}, "--nccl-env '' is empty"),  # ran a point with the environment as it was
    ({"nccl_envs": ["NCCL_ALGO=Ring NCCL_ALGO=Tree"]}, "sets NCCL_ALGO twice"),  # ran Tree only
    ({"nccl_envs": ["NCCL_P2P_DISABLE=1"], "nccl_p2p": ["on"]}, "sets NCCL_P2P_DISABLE, which --nccl-p2p sets"),
])
def test_nccl_points_that_would_run_another_setting_are_refused(change, needle):
    with pytest.raises(SpecError, match=needle):
        validate(TrainSpec(**{**TRAIN, "nprocs": [2], **change}))


def test_one_cell_table_keeps_samples_per_s_and_mfu_before_the_phase_split():
    """One cell on a 180-column terminal dropped samples/s (and MFU, the first to go) while it showed the
    forward / backward / optimizer milliseconds."""
    from transbench.cli.train import SPEED_COLUMNS

    rec = dict(scenario="training", model="bert-large-uncased", task="mlm", backend="sdpa", dtype="bf16",
               optim="adamw-fused", batch_size=256, seq_len=128, grad_accum=1, grad_ckpt=False, compile=True,
               kernels="torch", head="masked", strategy="none", world_size=1, status="ok", latency_ms=123.456,
               forward_ms=40.123, backward_ms=80.456, optimizer_ms=2.789, samples_per_s=2073.6, tokens_per_s=265420.8,
               tflops_per_gpu=412.34, mfu=0.4169, hfu=0.4311)

    def shown(width):
        console = Console(width=width, record=True, force_terminal=False)
        console.print(tables.fitted([rec], SPEED_COLUMNS, "training run x", width))
        return console.export_text().split("not shown:")[0]

    assert "samples/s" in shown(180) and "2074" in shown(180)
    assert "41.7%" in shown(200) and "fwd ms" not in shown(200)


def test_a_padded_vocabulary_is_in_the_record_and_the_report_table():
    """`pad_vocab` was in the cell key but not in the record: a ladder's `--pad-vocab 64` step and the step
    before it were two report rows of the same settings with different speeds."""
    from transbench.report.data import ReportData
    from transbench.report.tables import training_table

    assert replace(BASE, pad_vocab=64).record_fields()["pad_vocab"] == 64
    assert BASE.record_fields()["pad_vocab"] is None  # as it is, as the key leaves it out
    recs = [{**cell.record_fields(), "run_id": "r1", "run_name": "r", "status": "ok", "latency_ms": ms}
            for cell, ms in ((BASE, 20.0), (replace(BASE, pad_vocab=64), 800.0))]
    table = training_table(ReportData([{"run_id": "r1", "name": "r"}], recs, {}))
    assert "pad vocab" in table.headers
    ms = table.headers.index("step ms")
    assert len({tuple(row[:ms]) for row in table.rows}) == 2
