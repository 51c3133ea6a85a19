"""Training scenario on CPU with tiny presets: the loop learns, every option runs and takes effect,
failures get the right status, the grid and the scaling arithmetic are right."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import statistics
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from test_cli_input import invoke, refused
from typer.testing import CliRunner

from transbench import api
from transbench.cli import app, tables
from transbench.errors import SpecError
from transbench.models import flops
from transbench.models.presets import PRESETS
from transbench.cells import CellResult
from transbench.runner.rank import RankInfo, guarded
from transbench.scenarios.training import loop as training_loop
from transbench.scenarios.training.spec import TrainSpec, add_scaling, expand, validate
from transbench.scenarios.training.cell import TrainCell
from transbench.store import Store
from transbench.store.export import RECORD_KEYS, TRAINING_KEYS

BASE = TrainCell(model="bert-tiny", task="mlm", backend="sdpa", dtype="fp32", optim="adamw", batch=4, seq=16,
                 steps=2, warmup_steps=1, lr=1e-3, device="cpu")


def run_guarded(cell: TrainCell) -> CellResult:
    """In this process, with the same failure mapping a rank process applies."""
    result, _ = guarded(lambda device: training_loop.run(cell, RankInfo(), device), RankInfo(), cell.device)
    return result


@pytest.mark.parametrize("model,task", [("bert-tiny", "mlm"), ("gpt2-tiny", "causal-lm")])
def test_loss_decreases_on_a_fixed_batch(model, task):
    r = training_loop.run(replace(BASE, model=model, task=task, optim="adamw-fused", steps=29, warmup_steps=1))
    losses = r.info["losses"]
    assert len(losses) == 30
    assert r.record["loss_start"] == losses[0] and r.record["loss_end"] == losses[-1]
    assert r.record["loss_end"] < r.record["loss_start"] - 1.0, losses


def _check_arithmetic(cell: TrainCell, r: CellResult) -> None:
    rec = r.record
    seconds = rec["latency_ms"] / 1e3
    assert rec["samples_per_s"] == pytest.approx(cell.global_batch / seconds)
    assert rec["throughput_per_s"] == rec["samples_per_s"]
    assert rec["tokens_per_s"] == pytest.approx(cell.global_batch * cell.seq / seconds)
    # TFLOPS count what the model needs: no checkpointing recompute, an MLM head on its masked positions.
    k = training_loop.mlm_predictions(cell.seq) if cell.task == "mlm" else None
    fl = flops.training_flops(PRESETS[cell.model], cell.seq, cell.task, head_tokens=k) * cell.global_batch
    assert rec["tflops"] == pytest.approx(fl / seconds / 1e12)
    ran = flops.training_flops(PRESETS[cell.model], cell.seq, cell.task, recompute=cell.grad_ckpt,
                               head_tokens=k if cell.head == "masked" else None) * cell.global_batch
    assert r.info["hw_flops_per_step"] == ran and r.info["flops_per_step"] == fl
    assert (ran > fl) == (cell.grad_ckpt or (cell.task == "mlm" and cell.head == "all"))
    assert rec["hfu"] is None
    assert rec["flops_method"] == ("analytic" if PRESETS[cell.model].family in flops.ANALYTIC else "counted")
    assert rec["tflops_per_gpu"] == pytest.approx(rec["tflops"] / cell.world_size)
    assert rec["mfu"] is None  # no datasheet peak for a CPU: never a guessed one
    assert len(r.samples_ms) == cell.steps and rec["n_samples"] == cell.steps


@pytest.mark.parametrize("change", [
    {}, {"dtype": "bf16"}, {"optim": "adamw-foreach"}, {"optim": "adamw-fused"}, {"optim": "sgd"},
    {"grad_accum": 2}, {"grad_ckpt": True}, {"backend": "eager"}, {"backend": "sdpa-math"},
    {"task": "classification"}, {"model": "gpt2-tiny", "task": "classification", "grad_ckpt": True},
    {"head": "masked"}, {"model": "roberta-tiny", "head": "masked", "grad_ckpt": True},
    {"model": "gpt2-tiny", "task": "causal-lm", "activation": "gelu-tanh"},
    {"model": "gpt2-tiny", "task": "causal-lm", "pad_vocab": 64}, {"head": "masked", "pad_vocab": 48},
    {"dropout": 0.0}, {"model": "gpt2-tiny", "task": "causal-lm", "dropout": 0.0}, {"dropout": 0.25},
])
def test_every_option_runs_and_takes_effect(change):
    cell = replace(BASE, **change)
    r = training_loop.run(cell)
    assert r.status == "ok"
    _check_arithmetic(cell, r)
    info, rec = r.info, r.record
    assert info["gradient_checkpointing"] == cell.grad_ckpt
    if cell.activation:
        assert info["activation"] == "gelu_pytorch_tanh"
    if cell.dropout is not None:  # every dropout of the built model, the attention's among them
        assert set(info["dropout"].values()) == {cell.dropout} and len(info["dropout"]) >= 2, info["dropout"]
    # The tiny presets' 1,000-row vocabulary, padded up to the multiple (the tokens stay below 1,000).
    vocab = training_loop.build.resolve(cell.model).shape.vocab
    assert info["vocab_rows"] == -(-vocab // cell.pad_vocab) * cell.pad_vocab
    assert info["head_positions"] == (training_loop.mlm_predictions(cell.seq) if cell.head == "masked" else cell.seq)
    assert info["attn_implementation"] == ("eager" if cell.backend == "eager" else "sdpa")
    assert info["sdpa_kernel"] == ("math" if cell.backend == "sdpa-math" else None)
    assert info["param_dtype"] == "torch.float32"  # bf16 is autocast over fp32 master weights
    assert info["autocast_dtype"] == ("torch.bfloat16" if cell.dtype == "bf16" else None)
    fused = {"adamw": (False, False), "adamw-foreach": (None, True), "adamw-fused": (True, None)}
    if cell.optim in fused:
        assert (info["optimizer_fused"], info["optimizer_foreach"]) == fused[cell.optim]
    # Parameters, gradients and optimizer state are measured apart: fp32 gradients are as large as the
    # parameters; Adam keeps two moments per parameter, SGD with momentum one.
    assert rec["grads_mb"] == pytest.approx(rec["params_mb"])
    assert rec["optim_state_mb"] == pytest.approx(rec["params_mb"] * (1 if cell.optim == "sgd" else 2), rel=1e-3)
    assert rec["params_mb"] == pytest.approx(info["parameters"] * 4 / 2**20)


@pytest.mark.parametrize("accum", [1, 2])
def test_phases_are_recorded_and_sum_to_the_step(accum):
    cell = replace(BASE, steps=6, grad_accum=accum)
    r = training_loop.run(cell)
    phases = r.info["phases_ms"]
    assert set(phases) == {"forward_ms", "backward_ms", "optimizer_ms"}
    assert all(len(v) == cell.steps for v in phases.values())  # timed steps only, not the warm-up
    for i, step_ms in enumerate(r.samples_ms):
        parts = sum(v[i] for v in phases.values())
        assert parts == pytest.approx(step_ms, rel=0.10), (i, parts, step_ms)
    # The record holds each phase's median (on a shared CPU the medians of single phases need not add up
    # to the median step, so the sum is checked step by step above).
    for k, v in phases.items():
        assert r.record[k] == pytest.approx(statistics.median(v)) and r.record[k] > 0


def test_cell_key_holds_every_setting_that_changes_the_measurement():
    key = json.loads(BASE.key())
    assert key == json.loads(json.dumps(key, sort_keys=True))
    for change in [{"kernels": "liger"}, {"head": "masked"}, {"activation": "gelu-tanh"}, {"pad_vocab": 64}, {"dropout": 0.0}, {"grad_ckpt": True}, {"compile": True}, {"zero_stage": 2},
                   {"nccl": "NCCL_P2P_DISABLE=1"}, {"lr": 1e-2}, {"seed": 1}, {"optim": "sgd"}, {"grad_accum": 2}]:
        assert replace(BASE, **change).key() != BASE.key(), change
    assert replace(BASE, steps=9, warmup_steps=3).key() == BASE.key()  # how long it is sampled, not what
    assert replace(BASE, batch=64).oom_group() == BASE.oom_group()
    fields = replace(BASE, kernels="liger").record_fields()
    assert (fields["kernels"], fields["backend"], fields["dtype"], fields["batch_size"]) == ("liger", "sdpa", "fp32", 4)
    old = BASE.to_dict()
    old.pop("kernels")  # a cell stored before the kernels axis
    old.pop("head")  # and before the head and activation options: same cell, same key
    old.pop("activation")
    old.pop("pad_vocab")
    old.pop("dropout")
    assert TrainCell.from_dict(old) == BASE and "head" not in json.loads(BASE.key())


def test_resume_skips_batches_above_a_stored_oom_without_running_them(tmp_path, monkeypatch):
    """A run killed after its batch-2 cell ran out of memory: resuming stores batch 4 as skipped, and
    launches nothing (the launcher here fails the test if called)."""
    from transbench.runner import launch
    from transbench.runner.sweep import store_result
    from transbench.scenarios.training import spec as training

    spec = TrainSpec(models=["bert-tiny"], device="cpu", batches=[2, 4], seqs=[16], steps=2, warmup_steps=1,
                     name="killed")
    db = str(tmp_path / "r.db")
    store = Store(db)
    run_id, _, _ = training.open_training_run(store, validate(spec))
    small = expand(validate(spec))[0]
    assert small.batch == 2
    store_result(store, run_id, small, CellResult("oom", error="CUDA out of memory"))
    store.close()

    def no_launch(*a, **k):
        raise AssertionError("a cell was launched")

    monkeypatch.setattr(launch, "launch", no_launch)
    seen = []
    recs = training.train(spec, db, on_start=lambda cells, done: seen.append(done))
    assert seen == [1]
    by_batch = {r["batch_size"]: r for r in recs}
    assert by_batch[2]["status"] == "oom"
    assert by_batch[4]["status"] == "skipped" and "batch 2 was out of memory" in by_batch[4]["error"]


def test_nan_loss_is_an_error_without_speed():
    r = run_guarded(replace(BASE, lr=1e30, steps=3))
    assert r.status == "error"
    assert "NonFiniteLoss" in r.error and "loss is" in r.error
    assert "samples_per_s" not in r.record and "latency_ms" not in r.record


@pytest.mark.parametrize("change,needs", [
    ({"optim": "ds-fused-adam"}, ("deepspeed", "transbench[deepspeed]")),
    ({"strategy": "deepspeed", "zero_stage": 2}, ("deepspeed", "transbench[deepspeed]")),
    ({"optim": "apex-fused-adam"}, ("apex", "NVIDIA/apex")),
    ({"backend": "flash-attn2"}, ("flash_attn", "transbench[flash]")),
    ({"kernels": "liger"}, ("liger_kernel", "transbench[liger]")),
    ({"backend": "sdpa-cudnn"}, (None, "CUDA only")),
    ({"dtype": "fp16"}, (None, "CUDA only")),
    # transformers refused to build it: a ValueError, `error`, where inference's sdpa cells read `unsupported`
    ({"model": "deberta-tiny", "backend": "sdpa"}, (None, "deberta-v2 has no 'sdpa' attention in transformers: train "
                                                          "it with --backend eager")),
    # one token leaves a causal LM's shifted labels no target: its loss was NaN, an `error` saying the run diverged
    ({"model": "gpt2-tiny", "task": "causal-lm", "seq": 1}, (None, "task causal-lm at seq 1 has no next token")),
])
def test_unavailable_choices_are_unsupported_with_the_fix(change, needs):
    module, text = needs
    if module and importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    r = run_guarded(replace(BASE, **change))
    assert r.status == "unsupported"
    assert text in r.error


def test_validation_errors_are_one_line():
    ok = dict(models=["bert-tiny"], device="cpu")
    bad = [
        ({"dtypes": ["fp16"]}, "CUDA only"),
        ({"dtypes": ["tf32"]}, "CUDA only"),
        ({"optims": ["adam"]}, "unknown optimizer"),
        ({"backends": ["fused"]}, "unknown attention"),
        ({"tasks": ["qa"]}, "not a training task"),
        ({"tasks": ["causal-lm"]}, "needs a decoder"),
        ({"strategies": ["none"], "nprocs": [2]}, "strategy none runs one process"),
        ({"nnodes": 2}, "--rdzv-endpoint"),
        ({"rdzv_endpoint": "node0:29500"}, "--rdzv-endpoint joins several hosts, and --nnodes is 1"),  # was unused
        ({"zero_stages": [4]}, "--zero-stage"),
        ({"nccl_envs": ["P2P=1"]}, "--nccl-env"),
        ({"seqs": [4096]}, "longer than"),
        ({"warmup_steps": 0}, "at least 1"),
        ({"kernels": ["triton"]}, "unknown kernels 'triton': choose from torch, liger"),
        ({"max_batch_limit": 0}, "--max-batch-limit"),
        ({"heads": ["first"]}, "unknown head 'first': choose from all, masked"),
        ({"activation": "relu"}, "unknown activation 'relu'"),
        ({"pad_vocab": 0}, "--pad-vocab must be at least 1"),
        ({"dropout": 1.0}, "--dropout must be a probability"), ({"dropout": -0.1}, "--dropout must be a probability"),
        ({"models": ["gpt2-tiny"], "heads": ["masked"]}, "--head masked runs the MLM head"),
        ({"models": ["gpt2-tiny"], "seqs": [1, 8]}, "--seq 1: a causal LM trains on predicting each next token"),
    ]
    for change, text in bad:
        with pytest.raises(SpecError, match=text):
            validate(TrainSpec(**{**ok, **change}))


def test_seq_1_is_refused_only_where_every_cell_is_a_causal_lms():
    # beside an encoder's MLM cell, a decoder's seq 1 cell is `unsupported` (check_supported) and the MLM one trains
    validate(TrainSpec(models=["gpt2-tiny", "bert-tiny"], seqs=[1], device="cpu"))
    validate(TrainSpec(models=["gpt2-tiny"], tasks=["classification"], seqs=[1], device="cpu"))
    assert run_guarded(replace(BASE, seq=1)).status == "ok"  # bert-tiny's MLM at seq 1 masks its one token


def test_expand_scaling_defaults_and_dedup():
    spec = validate(TrainSpec(models=["bert-tiny", "gpt2-tiny"], device="cpu", nprocs=[2], scaling=True,
                              strategies=["ddp", "deepspeed"], zero_stages=[1, 2], nccl_p2p=["on", "off"],
                              batches=[4, 2]))
    cells = expand(spec)
    assert {c.task for c in cells} == {"mlm", "causal-lm"}  # each family's own LM task by default
    ones = [c for c in cells if c.world_size == 1]
    assert cells[:len(ones)] == ones  # one-GPU baselines run first
    assert {(c.strategy, c.zero_stage, c.nccl) for c in ones} == {("none", None, "")}
    many = [c for c in cells if c.world_size == 2]
    assert {c.zero_stage for c in many if c.strategy == "ddp"} == {None}
    assert {c.zero_stage for c in many if c.strategy == "deepspeed"} == {1, 2}
    assert {c.nccl for c in many} == {"NCCL_P2P_DISABLE=0", "NCCL_P2P_DISABLE=1"}
    # per model: 2 batches x (1 baseline + 2 nccl x (ddp + 2 zero stages))
    assert len(cells) == 2 * 2 * (1 + 2 * 3)
    assert len({c.key() for c in cells}) == len(cells)
    batches = [c.batch for c in cells if c.oom_group() == cells[0].oom_group()]
    assert batches == [2, 4]  # growing, so an OOM skips the larger ones


def test_scaling_efficiency_against_the_one_gpu_run(tmp_path):
    store = Store(tmp_path / "s.db")
    old, _ = store.create_run(None, "training", {}, {})
    one = replace(BASE, strategy="none")
    store.put_cell(old, one.key(), "training", "ok", {"samples_per_s": 100.0, "gpu": "X"}, cell=one.to_dict())
    new, _ = store.create_run(None, "training", {}, {})
    two = replace(BASE, strategy="ddp", nproc=2, nccl="NCCL_P2P_DISABLE=1")
    result = CellResult("ok", record={"samples_per_s": 150.0, "gpu": "X"})
    add_scaling(store, new, two, result)
    assert result.record["scaling_efficiency"] == pytest.approx(0.75)
    assert result.info["scaling_baseline"]["run_id"] == old
    other_gpu = CellResult("ok", record={"samples_per_s": 150.0, "gpu": "Y"})
    add_scaling(store, new, two, other_gpu)
    assert "scaling_efficiency" not in other_gpu.record and "--scaling" in other_gpu.warnings[0]
    store.close()


@pytest.mark.slow
def test_cli_train_stores_records_and_resumes(tmp_path):
    db, out = str(tmp_path / "t.db"), tmp_path / "t.json"
    args = ["train", "--model", "gpt2-tiny", "--batch", "2", "--seq", "16", "--steps", "2", "--warmup-steps", "1",
            "--device", "cpu", "--optim", "sgd", "--db", db, "--json", str(out), "--name", "t1", "--timeout", "120"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    (rec,) = json.loads(out.read_text())["cells"]
    assert set(RECORD_KEYS) | set(TRAINING_KEYS) <= set(rec)
    assert (rec["scenario"], rec["status"], rec["backend"], rec["dtype"], rec["task"]) == \
        ("training", "ok", "sdpa", "fp32", "causal-lm")
    assert (rec["world_size"], rec["strategy"], rec["optim"]) == (1, "none", "sgd")
    assert rec["samples_per_s"] > 0 and rec["loss_end"] == rec["loss_end"]
    store = Store(db)
    (run,) = store.runs()
    assert run["kind"] == "training" and run["cells"] == 1
    store.close()
    again = CliRunner().invoke(app, args)  # same name: nothing is run again
    assert again.exit_code == 0 and "already stored" in again.output


def test_cli_bad_input_exits_2_with_one_line(tmp_path):
    res = CliRunner().invoke(app, ["train", "--model", "bert-tiny", "--device", "cpu", "--optim", "adam",
                                   "--db", str(tmp_path / "x.db")])
    assert res.exit_code == 2
    assert res.output.strip().startswith("error: unknown optimizer 'adam'") and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "x.db").exists()


def _fake_liger(monkeypatch):
    """Liger's module classes as plain torch (its kernels are Triton GPU code): checks how the model is
    rewired around them (which modules, the head's hidden states, the causal shift), not Liger itself."""
    import sys
    import types

    import torch
    import torch.nn.functional as F

    class LigerLayerNorm(torch.nn.Module):
        def __init__(self, hidden_size, eps=1e-6, bias=False):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(hidden_size))
            self.bias = torch.nn.Parameter(torch.zeros(hidden_size))
            self.eps = eps

        def forward(self, x):
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)

    class LigerFusedLinearCrossEntropyLoss(torch.nn.Module):
        def forward(self, weight, x, target, bias=None):
            return F.cross_entropy(F.linear(x, weight, bias), target, ignore_index=-100)

    pkg, tf, mp = (types.ModuleType(n) for n in ("liger_kernel", "liger_kernel.transformers",
                                                  "liger_kernel.transformers.monkey_patch"))
    tf.LigerLayerNorm, tf.LigerFusedLinearCrossEntropyLoss, tf.monkey_patch = (
        LigerLayerNorm, LigerFusedLinearCrossEntropyLoss, mp)
    mp.MODEL_TYPE_TO_APPLY_LIGER_FN = {}
    for name, mod in [("liger_kernel", pkg), ("liger_kernel.transformers", tf),
                      ("liger_kernel.transformers.monkey_patch", mp)]:
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)  # found by the loop's installed-check
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.mark.parametrize("model,task", [("bert-tiny", "mlm"), ("gpt2-tiny", "causal-lm"),
                                        ("bert-tiny", "classification"), ("roberta-tiny", "mlm")])
def test_liger_rewiring_gives_the_models_own_loss(model, task, monkeypatch):
    import torch

    from transbench.models import build
    from transbench.scenarios.training import kernels as training_kernels

    _fake_liger(monkeypatch)
    ref = build.resolve(model)
    cell = replace(BASE, model=model, task=task)
    hf = build.build_model(ref, task, attn="sdpa", device="cpu", seed=0).train().requires_grad_(True)
    torch.manual_seed(0)  # dropout draws the same masks in both forwards
    (batch,) = training_loop.make_batches(cell, ref.shape, 0, torch.device("cpu"))
    torch.manual_seed(1)
    want = hf(**batch).loss
    want.backward()
    with_grad = sum(p.grad is not None for p in hf.parameters())
    hf.zero_grad(set_to_none=True)
    n_params = sum(p.numel() for p in hf.parameters())
    wrapped, replaced = training_kernels.apply(hf, task, ref.family)
    torch.manual_seed(1)
    got = wrapped(**batch)["loss"]
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    assert sum(p.numel() for p in wrapped.parameters()) == n_params  # the same parameters, none new
    norms = [r for r in replaced if r.endswith("-> LigerLayerNorm")]
    assert len(norms) == sum(1 for m in hf.modules() if type(m).__name__ == "LigerLayerNorm") > 0
    assert not any(type(m) is torch.nn.LayerNorm for m in hf.modules())
    fused = [r for r in replaced if "LigerFusedLinearCrossEntropyLoss" in r]
    # A fused head for BERT and GPT-2 only: RoBERTa's own head (dense, GELU, LayerNorm, decoder) stays.
    assert len(fused) == (1 if task != "classification" and ref.family in training_kernels.FUSED_HEADS else 0)
    got.backward()
    assert sum(p.grad is not None for p in wrapped.parameters()) == with_grad  # the same ones train


def test_every_mlm_row_masks_the_same_number_of_positions():
    import torch

    cell = replace(BASE, batch=8, seq=40, grad_accum=2)
    k = training_loop.mlm_predictions(40)
    assert k == 6 and training_loop.mlm_predictions(4) == 1
    for b in training_loop.make_batches(cell, PRESETS["bert-tiny"], 0, torch.device("cpu")):
        labelled = b["labels"] != -100
        assert labelled.sum(1).tolist() == [k] * 8
        assert (b["input_ids"][labelled] == 103).all()  # [MASK] where a label is


@pytest.mark.parametrize("model", ["bert-tiny", "roberta-tiny"])
def test_masked_head_is_the_same_loss_and_gradients_as_the_full_head(model, monkeypatch):
    """transformers' head on every position and the head on the masked ones give the same loss (the mean
    over the labelled positions) and the same gradients; with Liger's fused loss too."""
    import torch

    from transbench.models import build
    from transbench.scenarios.training import kernels as training_kernels
    from transbench.scenarios.training.head import MaskedHead

    ref = build.resolve(model)
    hf = build.build_model(ref, "mlm", attn="sdpa", device="cpu", seed=0).eval().requires_grad_(True)  # no dropout
    (batch,) = training_loop.make_batches(replace(BASE, model=model, seq=32), ref.shape, 0, torch.device("cpu"))
    want = hf(**batch).loss
    want.backward()
    grads = {n: p.grad.clone() for n, p in hf.named_parameters() if p.grad is not None}
    hf.zero_grad(set_to_none=True)
    k = training_loop.mlm_predictions(32)
    got = MaskedHead(hf, ref.family, k)(**batch)["loss"]
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    got.backward()
    for n, p in hf.named_parameters():
        if n in grads:
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6)
    _fake_liger(monkeypatch)
    fused, replaced = training_kernels.apply(hf, "mlm", ref.family, predict=k)
    if model == "bert-tiny":
        assert fused(**batch)["loss"].item() == pytest.approx(want.item(), rel=1e-5)
    else:  # no fused head: the training loop wraps the masked head around the Liger-normed model
        assert fused is hf
        assert MaskedHead(fused, ref.family, k)(**batch)["loss"].item() == pytest.approx(want.item(), rel=1e-5)


def test_masked_head_on_a_model_without_one_is_unsupported():
    r = run_guarded(replace(BASE, model="gpt2-tiny", task="causal-lm", head="masked"))
    assert r.status == "unsupported" and "--head all" in r.error



@pytest.mark.slow
def test_compiled_sdpa_training_runs_without_a_mask_on_full_attention_families(monkeypatch):
    """Under torch.compile, transformers (5.17 on the GPU image) builds an all-true (batch, 1, seq, seq) mask that
    eager mode skips, and SDPA with a mask has no flash kernel. Training batches are never padded, so a compiled
    full-attention family trains on the unmasked SDPA: the compiled graph holds the fused kernel, not the math path,
    and the loss is the eager step's. Windowed families (ModernBERT) keep transformers' own masks."""
    import torch
    from collections import Counter

    from transbench.runner.rank import RankInfo

    ops: Counter = Counter()

    def recording(gm, example_inputs):
        from functorch.compile import make_boxed_func
        from torch._functorch.aot_autograd import aot_module_simplified

        def compiler(g, inputs):
            ops.update(str(n.target) for n in g.graph.nodes if n.op == "call_function")
            return make_boxed_func(g.forward)
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler, bw_compiler=compiler)

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend=recording))
    losses = {}
    for compiled in (False, True):
        cell = replace(BASE, compile=compiled)
        trainer = training_loop.Trainer(cell, RankInfo(), torch.device("cpu"))
        for m in trainer.hf_model.modules():  # CPU SDPA takes its fused kernel without dropout only
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        losses[compiled] = float(trainer.step())
        assert trainer.info["attn_implementation"] == (training_loop.UNMASKED_SDPA if compiled else "sdpa")
    assert ops["aten._scaled_dot_product_flash_attention_for_cpu.default"] == 2  # both layers' forward
    assert not ops["aten._safe_softmax.default"]
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)
    windowed = training_loop.Trainer(replace(BASE, model="modernbert-tiny", compile=True), RankInfo(),
                                     torch.device("cpu"))
    assert windowed.info["attn_implementation"] == "sdpa"


def test_strategy_dp_is_refused_on_the_cpu_in_one_line(tmp_path):
    db = tmp_path / "t.db"
    r = CliRunner().invoke(app, ["train", "--strategy", "dp", "--nproc", "2", "--device", "cpu", "--model",
                                 "bert-tiny", "--db", str(db)])
    assert r.exit_code == 2 and "DataParallel" in r.output and "CUDA" in r.output
    assert "Traceback" not in r.output and not db.exists()
    with pytest.raises(SpecError, match="CUDA GPUs only"):
        validate(TrainSpec(models=["bert-tiny"], strategies=["dp"], device="cpu"))


def test_dp_cells_run_in_one_process_over_their_gpus():
    """dp is one process (no torchrun) of nproc GPUs: world size nproc, `batch` rows per GPU fed at once."""
    from transbench.scenarios.training.spec import launch_config

    cell = replace(BASE, strategy="dp", nproc=4)
    assert cell.world_size == 4 and cell.global_batch == 16 and not cell.launched
    assert not launch_config(cell, TrainSpec()).torchrun
    assert replace(BASE, strategy="ddp", nproc=2).launched
    fields = cell.record_fields()
    assert fields["strategy"] == "dp" and fields["world_size"] == 4
    from transbench.models import build

    (b,) = training_loop.make_batches(cell, build.resolve("bert-tiny").shape, 0, "cpu")
    assert b["input_ids"].shape == (16, 16)


def test_autocast_module_keeps_the_cells_dtype_inside_forward():
    import torch

    lin = torch.nn.Linear(4, 4)
    wrapped = training_loop.autocast_module(lin, "cpu", torch.bfloat16)
    assert wrapped(torch.randn(2, 4)).dtype == torch.bfloat16
    assert list(wrapped.parameters()) == list(lin.parameters())


def test_comm_timing_off_only_where_a_ddp_cell_of_several_gpus_is():
    with pytest.raises(SpecError, match="--comm-timing off"):
        validate(TrainSpec(models=["bert-tiny"], device="cpu", comm_timing=False))
    spec = validate(TrainSpec(models=["bert-tiny"], device="cpu", nprocs=[1, 2], comm_timing=False, scaling=True))
    cells = expand(spec)
    assert [c.comm_timing for c in cells] == [True, False]  # the one-GPU baseline has no all-reduce to time
    assert "comm_timing" in cells[1].identity() and "comm_timing" not in cells[0].identity()
# --- options no cell uses, values listed twice, a ladder that could not start, scaling against its baseline -----------

TRAIN = dict(models=["bert-tiny"], batches=[2], seqs=[8], steps=1, warmup_steps=1, device="cpu")
TINY_CELL = TrainCell(model="bert-tiny", task="mlm", backend="sdpa", dtype="fp32", optim="adamw", batch=4, seq=16,
                 steps=2, warmup_steps=1, device="cpu")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """The tests below run in a folder of their own: a store or output they left would land there."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def no_work(monkeypatch):
    """A command that got past its checks would train: the test fails instead."""
    def ran(*a, **kw):
        raise AssertionError("the command trained instead of refusing")

    monkeypatch.setattr(api, "train", ran)


@pytest.mark.usefixtures("in_tmp")
def test_zero_stage_2_given_without_deepspeed_is_refused(tmp_path, no_work):
    """2 is the default stage: `--zero-stage 2` alone trained plain (no DeepSpeed) and said ok, while 1 and 3
    were refused."""
    refused(invoke("train", "-m", "bert-tiny", "--zero-stage", "2", "--device", "cpu", "--db", tmp_path / "z.db"),
            "--zero-stage 2 applies to --strategy deepspeed only")
    assert os.listdir(tmp_path) == []


@pytest.mark.usefixtures("in_tmp")
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


@pytest.mark.usefixtures("in_tmp")
@pytest.mark.parametrize("change,option", [
    ({"optims": ["sgd"]}, "--optim"),  # trained AdamW (the ladder's first steps), said ok
    ({"dtypes": ["bf16"]}, "--dtype"),  # the CPU's default is fp32
    ({"grad_accums": [4]}, "--grad-accum"),
    ({"grad_ckpts": [True]}, "--grad-ckpt"),
    ({"compiles": [True]}, "--compile"),
    ({"heads": ["masked"]}, "--head"),
    ({"activation": "gelu-tanh"}, "--activation"),
    ({"pad_vocab": 64}, "--pad-vocab"),
    ({"dropout": 0.0}, "--dropout"),
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


@pytest.mark.usefixtures("in_tmp")
def test_a_ladder_search_below_its_start_batch_is_refused_not_a_traceback(tmp_path, monkeypatch):
    """The search doubles from the batch: with the limit below it, find_max_batch raised UnboundLocalError
    after the first step had trained and been stored."""
    from transbench.runner import sweep

    monkeypatch.setattr(sweep._Lane, "run", lambda lane, cell, timeout: CellResult("ok", {"samples_per_s": 1.0}))
    res = invoke("train", "--ladder", "-m", "bert-tiny", "--batch", "4", "--max-batch-limit", "2", "--device", "cpu",
                 "--db", tmp_path / "l.db", "--plot", tmp_path / "l.png")
    refused(res, "--max-batch-limit 2 is below --batch 4")
    assert os.listdir(tmp_path) == []


@pytest.mark.usefixtures("in_tmp")
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


@pytest.mark.usefixtures("in_tmp")
def test_another_task_keeps_its_cells_under_head_masked():
    """`--task mlm,classification --head masked`: the head axis is mlm's; classification cells were skipped,
    and the task asked for was never measured."""
    cells = expand(validate(TrainSpec(**{**TRAIN, "tasks": ["mlm", "classification"], "heads": ["masked"]})))
    assert sorted((c.task, c.head) for c in cells) == [("classification", "all"), ("mlm", "masked")]
    both = expand(validate(TrainSpec(**{**TRAIN, "tasks": ["mlm", "classification"], "heads": ["all", "masked"]})))
    assert sorted((c.task, c.head) for c in both) == [("classification", "all"), ("mlm", "all"), ("mlm", "masked")]


@pytest.mark.usefixtures("in_tmp")
def test_scaling_baseline_has_the_same_padded_vocabulary(tmp_path):
    """A 2-GPU cell of `--pad-vocab 64` took its one-GPU baseline from a run of the unpadded model."""
    store = Store(tmp_path / "s.db")
    old, _ = store.create_run(None, "training", {}, {})
    one = replace(TINY_CELL, strategy="none")
    store.put_cell(old, one.key(), "training", "ok", {"samples_per_s": 100.0, "gpu": "X"}, cell=one.to_dict())
    new, _ = store.create_run(None, "training", {}, {})
    padded = CellResult("ok", record={"samples_per_s": 150.0, "gpu": "X"})
    add_scaling(store, new, replace(TINY_CELL, strategy="ddp", nproc=2, pad_vocab=64), padded)
    assert "scaling_efficiency" not in padded.record and "--scaling" in padded.warnings[0]
    same = CellResult("ok", record={"samples_per_s": 150.0, "gpu": "X"})
    add_scaling(store, new, replace(TINY_CELL, strategy="ddp", nproc=2), same)
    assert same.record["scaling_efficiency"] == pytest.approx(0.75)
    store.close()


@pytest.mark.usefixtures("in_tmp")
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


@pytest.mark.usefixtures("in_tmp")
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


@pytest.mark.usefixtures("in_tmp")
@pytest.mark.parametrize("change,needle", [
    ({"nccl_envs": [""]}, "--nccl-env '' is empty"),  # ran a point with the environment as it was
    ({"nccl_envs": ["NCCL_ALGO=Ring NCCL_ALGO=Tree"]}, "sets NCCL_ALGO twice"),  # ran Tree only
    ({"nccl_envs": ["NCCL_P2P_DISABLE=1"], "nccl_p2p": ["on"]}, "sets NCCL_P2P_DISABLE, which --nccl-p2p sets"),
])
def test_nccl_points_that_would_run_another_setting_are_refused(change, needle):
    with pytest.raises(SpecError, match=needle):
        validate(TrainSpec(**{**TRAIN, "nprocs": [2], **change}))


@pytest.mark.usefixtures("in_tmp")
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


@pytest.mark.usefixtures("in_tmp")
def test_a_padded_vocabulary_is_in_the_record_and_the_report_table():
    """`pad_vocab` was in the cell key but not in the record: a ladder's `--pad-vocab 64` step and the step
    before it were two report rows of the same settings with different speeds."""
    from transbench.report.data import ReportData
    from transbench.report.tables import training_table

    assert replace(TINY_CELL, pad_vocab=64).record_fields()["pad_vocab"] == 64
    assert TINY_CELL.record_fields()["pad_vocab"] is None  # as it is, as the key leaves it out
    recs = [{**cell.record_fields(), "run_id": "r1", "run_name": "r", "status": "ok", "latency_ms": ms}
            for cell, ms in ((TINY_CELL, 20.0), (replace(TINY_CELL, pad_vocab=64), 800.0))]
    table = training_table(ReportData([{"run_id": "r1", "name": "r"}], recs, {}))
    assert "pad vocab" in table.headers
    ms = table.headers.index("step ms")
    assert len({tuple(row[:ms]) for row in table.rows}) == 2


@pytest.mark.usefixtures("in_tmp")
def test_the_report_training_table_prints_switches_as_the_terminal_does():
    """`train --grad-ckpt off,on --compile off,on` gave report rows of grad ckpt True / False (Python's words); the
    terminal's tables print on/off. A micro key that is a verdict reads yes/no there too (keys.flag)."""
    from transbench.report.data import ReportData
    from transbench.report.tables import micro_tables, training_table

    recs = [{**replace(TINY_CELL, grad_ckpt=g, compile=c).record_fields(), "run_id": "r1", "run_name": "r",
             "status": "ok", "latency_ms": 20.0} for g, c in ((False, True), (True, False))]
    table = training_table(ReportData([{"run_id": "r1", "name": "r"}], recs, {}))
    cells = {h: [row[i] for row in table.rows] for i, h in enumerate(table.headers)}
    assert cells["grad ckpt"] == ["off", "on"] and cells["compile"] == ["on", "off"]
    assert not any(v in ("True", "False") for row in table.rows for v in row)
    micro = [{"run_id": "r1", "run_name": "r", "scenario": "micro-x", "status": "ok", "n": 1, "tail_valid": True}]
    (shown,) = micro_tables(ReportData([{"run_id": "r1", "name": "r"}], micro, {}))
    assert shown.rows[0][shown.headers.index("tail_valid")] == "yes"


@pytest.mark.parametrize("given, built", [
    ("9.0a", "9.0"), ("8.0;9.0a;10.0a+PTX", "8.0;9.0;10.0+PTX"), ("7.5 8.6 12.0f", "7.5 8.6 12.0"), ("9.0", "9.0")])
def test_deepspeed_builds_its_ops_for_an_arch_list_it_can_read(given, built):
    """DeepSpeed 0.19.8 reads each TORCH_CUDA_ARCH_LIST entry as int(part.split('+')[0]) for part in cc.split('.'):
    the GPU image's 9.0a failed every ds-fused-adam cell ("invalid literal for int() with base 10: '0a'")."""
    from transbench.scenarios.training.loop import plain_arch_list

    env = {"TORCH_CUDA_ARCH_LIST": given}
    plain_arch_list(env)
    assert env["TORCH_CUDA_ARCH_LIST"] == built
    for cc in built.replace(";", " ").split():
        assert tuple(int(part.split("+")[0]) for part in cc.split("."))
    empty: dict = {}
    plain_arch_list(empty)
    assert empty == {}


# --- several hosts: a rendezvous that cannot be reached is refused, not waited on --------------------------------

def _closed_port() -> int:
    """A local port nobody listens on: one the OS just handed out, closed again."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.usefixtures("in_tmp")
def test_an_endpoint_host_that_does_not_resolve_is_refused_before_anything_starts(tmp_path):
    """torchrun failed every cell on it one by one; .invalid never resolves (RFC 6761)."""
    for rank in ("0", "1"):
        refused(invoke("train", "-m", "bert-tiny", "--device", "cpu", "--nnodes", "2", "--node-rank", rank,
                       "--rdzv-endpoint", "no-such-host.invalid:29500", "--db", tmp_path / "t.db"),
                "--rdzv-endpoint no-such-host.invalid:29500: the host name no-such-host.invalid does not resolve")
    assert os.listdir(tmp_path) == []  # no store, no run


@pytest.mark.usefixtures("in_tmp")
def test_a_node_that_cannot_reach_node_0_gives_up_within_the_bound(tmp_path, monkeypatch):
    """Node 1 against an endpoint nobody listens on waited torch's rendezvous timeouts with nothing said; now it says
    at once what it waits for, and after RDZV_WAIT_S one line names the endpoint, exit 2."""
    import time

    from transbench.scenarios.training import spec as training_spec

    monkeypatch.setattr(training_spec, "RDZV_WAIT_S", 1.5)
    port = _closed_port()
    began = time.monotonic()
    res = invoke("train", "-m", "bert-tiny", "--device", "cpu", "--nnodes", "2", "--node-rank", "1",
                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--db", tmp_path / "t.db")
    took = time.monotonic() - began
    refused(res, f"--rdzv-endpoint 127.0.0.1:{port}: node 0's rendezvous did not answer within 1.5 s", "--node-rank 0")
    assert f"note: node 1 of 2: waiting up to 1.5 s for node 0's rendezvous at 127.0.0.1:{port}" in res.stderr
    assert 1.5 <= took < 15, took
    assert os.listdir(tmp_path) == []


def test_a_node_that_reaches_node_0_goes_on(capsys):
    """A c10d store as node 0's torchrun hosts it (torch's c10d_rendezvous_backend): node 1's check passes."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from transbench.scenarios.training.spec import check_rendezvous

    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    endpoint = f"127.0.0.1:{store.port}"
    check_rendezvous(TrainSpec(**{**TRAIN, "nnodes": 2, "node_rank": 1, "rdzv_endpoint": endpoint}))
    check_rendezvous(TrainSpec(**{**TRAIN, "nnodes": 2, "node_rank": 0, "rdzv_endpoint": endpoint}))
    err = capsys.readouterr().err
    assert "note: node 1 of 2: waiting" in err and "note: node 0 of 2: hosting the rendezvous" in err


@pytest.mark.usefixtures("in_tmp")
def test_a_node_waits_for_node_0_as_long_as_rdzv_wait_says(tmp_path):
    """--rdzv-wait, the declared bound of that wait (a scheduler may start one job's hosts minutes apart): the note
    and the refusal say it, and nothing is created."""
    import time

    port = _closed_port()
    began = time.monotonic()
    res = invoke("train", "-m", "bert-tiny", "--device", "cpu", "--nnodes", "2", "--node-rank", "1",
                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-wait", "0.5", "--db", tmp_path / "t.db")
    refused(res, f"node 0's rendezvous did not answer within 0.5 s", "--rdzv-wait")
    assert f"note: node 1 of 2: waiting up to 0.5 s for node 0's rendezvous at 127.0.0.1:{port}" in res.stderr
    assert time.monotonic() - began < 15
    assert os.listdir(tmp_path) == []


# Rendezvous settings of every kind: each is taken, or refused in one line (SpecError) before anything starts.
# check_rendezvous's name lookup and its wait for node 0 are replaced by fakes (no network, no waiting): what is
# tested is that every failure of theirs is one line naming the endpoint.
RDZV_FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
HOSTS = st.one_of(st.text(max_size=20), st.text(st.characters(max_codepoint=127), min_size=1, max_size=300),
                  st.sampled_from(["no-such-host.invalid", "a..b", "-", "[::1]", "x" * 64 + ".com", "h\x00st",
                                   "\u00fcber.example", "\ud800", "127.0.0.1", "[127.0.0.1]"]))
PORTS = st.one_of(st.integers(-10, 70_000).map(str), st.sampled_from(["", "abc", "0x10", "1e3", "\u0663", " 1",
                                                                        "99999999999999999999999"]))


def _fake_lookup(resolves: bool):
    """socket.getaddrinfo as it behaves offline: a host that is not ASCII is IDNA-encoded first (which refuses an
    empty or over-long label), then the name resolves or not."""
    import socket

    def lookup(host, port, *args, **kwargs):
        host.encode("idna")
        if not resolves:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
    return lookup


@RDZV_FAST
@given(host=HOSTS, port=PORTS, resolves=st.booleans(), reached=st.booleans(), node_rank=st.integers(0, 1))
def test_any_rendezvous_endpoint_is_taken_or_refused_in_one_line(monkeypatch, capsys, host, port, resolves,
                                                                 reached, node_rank):
    """--rdzv-endpoint HOST:PORT of any host and port, on node 0 and on another node, its host resolving or not and
    node 0 answering or not: validate and check_rendezvous take it or refuse it in one line naming the endpoint."""
    import socket

    from transbench.scenarios.training import spec as training_spec

    def reach(h, p, wait):
        if not reached:
            raise TimeoutError(f"The client socket has timed out after {wait * 1000:.0f}ms")

    monkeypatch.setattr(socket, "getaddrinfo", _fake_lookup(resolves))
    monkeypatch.setattr(training_spec, "_reach_store", reach)
    endpoint = f"{host}:{port}"
    try:
        spec = validate(TrainSpec(models=["bert-tiny"], device="cpu", nnodes=2, node_rank=node_rank,
                                  rdzv_endpoint=endpoint))
        training_spec.check_rendezvous(spec)
    except SpecError as exc:
        line = tables.visible(str(exc))  # as the command line prints it: control characters escaped
        assert "\n" not in line and ("--rdzv-endpoint" in line or "rdzv_endpoint:" in line), line
        return
    assert resolves and (node_rank == 0 or reached)  # taken: the host resolved, and node 0 answered another node
    capsys.readouterr()


@RDZV_FAST
@given(nnodes=st.integers(-3, 2**63 - 1) | st.integers(-3, 5), node_rank=st.integers(-(2**63), 2**63 - 1)
       | st.integers(-3, 5), nproc=st.integers(1, 4))
def test_any_node_count_and_rank_is_taken_or_refused_in_one_line(nnodes, node_rank, nproc):
    """--nnodes and --node-rank of any integers: taken where 0 <= rank < nnodes and nnodes x nproc is within the world
    size a rank takes (declare.LIMITS), else one line naming the option."""
    from transbench.declare import LIMITS
    from transbench.measure.load import available_cores

    fine = (1 <= nnodes and 0 <= node_rank < nnodes and nnodes * nproc <= LIMITS["--nnodes"]
            and nproc <= available_cores())  # a CPU cell's ranks: one per core at most (load.check_cpu_ranks)
    spec = TrainSpec(models=["bert-tiny"], device="cpu", nnodes=nnodes, node_rank=node_rank, nprocs=[nproc],
                     strategies=["ddp"], rdzv_endpoint="127.0.0.1:29500" if nnodes != 1 else None)
    try:
        validate(spec)
    except SpecError as exc:
        assert not fine, exc
        line = str(exc)
        assert "\n" not in line and ("--nnodes" in line or "--node-rank" in line or "--nproc" in line), line
        return
    assert fine


@RDZV_FAST
@given(wait=st.floats(allow_nan=True, allow_infinity=True) | st.floats(0, 100_000) | st.integers(-5, 10**6),
       nnodes=st.sampled_from([1, 2]))
def test_any_rdzv_wait_is_the_bound_of_the_wait_or_refused_in_one_line(monkeypatch, capsys, wait, nnodes):
    """--rdzv-wait of any number: taken, with several hosts, where above 0 and at most a day, and then the bound the
    node waits for node 0 (the wait itself replaced: nothing waits here) and the one its refusal names."""
    import socket

    from transbench.scenarios.training import spec as training_spec
    from transbench.spec import MAX_SECONDS

    waited = []

    def reach(h, p, seconds):
        waited.append(seconds)
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "getaddrinfo", _fake_lookup(True))
    monkeypatch.setattr(training_spec, "_reach_store", reach)
    fine = nnodes > 1 and 0 < wait <= MAX_SECONDS
    try:
        spec = validate(TrainSpec(models=["bert-tiny"], device="cpu", nnodes=nnodes, node_rank=nnodes - 1,
                                  rdzv_endpoint="127.0.0.1:29500" if nnodes > 1 else None, rdzv_wait=wait))
    except SpecError as exc:
        # named as the option, or as the spec key where coerce refuses the value's type (inf, NaN) from Python
        assert not fine and "\n" not in str(exc) and ("--rdzv-wait" in str(exc) or "rdzv_wait:" in str(exc)), exc
        return
    assert fine
    with pytest.raises(SpecError) as exc:
        training_spec.check_rendezvous(spec)
    assert waited == [wait] and f"did not answer within {wait:g} s" in str(exc.value)
    assert f"waiting up to {wait:g} s" in capsys.readouterr().err


@pytest.mark.usefixtures("in_tmp")
def test_node_0_stops_when_the_other_nodes_never_join(tmp_path, monkeypatch):
    """Node 0 waited each cell's start-up limit for nodes that never came, each cell then stored as a `timeout`:
    now the first such cell ends the run in one line, exit 2, and is not stored (a resume runs it)."""
    import time

    from transbench.runner import worker

    monkeypatch.setattr(worker, "WORKER_START_S", 2.0)  # the start-up limit: the longer of this and --timeout
    began = time.monotonic()
    res = invoke("train", "-m", "bert-tiny", "--device", "cpu", "--batch", "2", "--seq", "8", "--steps", "1",
                 "--warmup", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{_closed_port()}", "--timeout", "1",
                 "--db", tmp_path / "t.db")
    line = refused(res, "--nnodes 2: the other nodes did not join the rendezvous at 127.0.0.1:", "within 2 s",
                   "--node-rank 1 to 1")
    assert time.monotonic() - began < 30, line
    assert "note: node 0 of 2: hosting the rendezvous" in res.stderr
    store = Store(str(tmp_path / "t.db"))
    try:
        assert [store.cells(r["run_id"], TrainCell) for r in store.runs()] == [[]]
    finally:
        store.close()
