"""`train --ladder`: the seed notebook's steps, the batches the searches find carried to the next steps,
the gain arithmetic (with a fake runner), and one real ladder on CPU through the sweep loop."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from transbench.cells import CellResult
from transbench.cli import app
from transbench.scenarios.training import ladder as training_ladder
from transbench.scenarios.training.cell import TrainCell
from transbench.store import Store

BASE = TrainCell(model="bert-tiny", task="mlm", backend="sdpa", dtype="fp32", optim="adamw", batch=4, seq=16,
                 steps=2, warmup_steps=1, device="cpu")


MLM_STEPS = ["fp32, largest batch", "bf16", "bf16, largest batch", "fused AdamW", "grad accumulation 4",
             "grad checkpointing, largest batch", "MLM head on masked positions", "vocabulary padded to a multiple of 64", "no dropout",
             "torch.compile",
             "Liger kernels"]


def test_the_steps_are_the_notebooks_then_the_fields():
    assert [s.name for s in training_ladder.steps_for("mlm", "bert")] == MLM_STEPS
    # The masked-position head is an MLM head's option; the one-kernel GELU is GPT-2's own gelu_new.
    gpt2 = [s.name for s in training_ladder.steps_for("causal-lm", "gpt2")]
    assert gpt2 == [n for n in MLM_STEPS if "MLM" not in n][:6] + ["GELU in one kernel (gelu-tanh)",
                                                                   "vocabulary padded to a multiple of 64",
                                                                   "no dropout", "torch.compile", "Liger kernels"]
    assert [s.name for s in training_ladder.steps_for("causal-lm", "llama")] == [n for n in gpt2 if "GELU" not in n]
    assert [s.search for s in training_ladder.STEPS] == [True, False, True, False, False, True] + [False] * 6
    assert [s.keep for s in training_ladder.STEPS] == ["always"] * 3 + ["faster", "never"] + ["faster"] * 7


class FakeRunner:
    """Largest batches 64 (fp32), 128 (bf16), 512 (checkpointing); samples/s from the options: bf16 x2.5,
    fused x1.2, accumulation x1.1, checkpointing x0.8, masked head x1.1, padded vocabulary x1.05, no dropout x1.08,
    compile x1.25,
    batch >= 128 x1.2;
    liger is unsupported (not installed)."""

    def __init__(self, liger_ok: bool = False, ckpt_factor: float = 0.8):
        self.calls: list[tuple[TrainCell, bool]] = []
        self.liger_ok, self.ckpt_factor = liger_ok, ckpt_factor

    def __call__(self, cell: TrainCell, search: bool):
        self.calls.append((cell, search))
        if cell.kernels == "liger" and not self.liger_ok:
            return cell, CellResult("unsupported", error="kernels liger needs Liger-Kernel")
        if search:
            cell = replace(cell, batch=512 if cell.grad_ckpt else 128 if cell.dtype == "bf16" else 64)
        speed = 100.0 * (2.5 if cell.dtype == "bf16" else 1.0) * (1.2 if cell.optim == "adamw-fused" else 1.0)
        speed *= (1.1 if cell.grad_accum == 4 else 1.0) * (self.ckpt_factor if cell.grad_ckpt else 1.0)
        speed *= (1.1 if cell.head == "masked" else 1.0) * (1.25 if cell.compile else 1.0)
        speed *= (1.3 if cell.activation == "gelu-tanh" else 1.0) * (1.05 if cell.pad_vocab > 1 else 1.0)
        speed *= 1.08 if cell.dropout == 0 else 1.0
        speed *= (0.9 if cell.kernels == "liger" else 1.0) * (1.2 if cell.batch >= 128 else 1.0)
        rec = {"samples_per_s": speed, "tflops": speed / 100, "mfu": speed / 1000, "peak_mem_mb": cell.batch * 10.0}
        return cell, CellResult("ok", rec)


def test_each_step_builds_on_what_was_kept_and_searches_start_from_the_batch_so_far():
    runner = FakeRunner()
    rows = training_ladder.walk(BASE, runner)
    assert [r["step"] for r in rows] == MLM_STEPS + [training_ladder.BEST]
    cells = [c for c, _ in runner.calls]
    # Each search starts from the batch so far, never from 1: fp32 from the base batch, bf16 from fp32's.
    assert [(c.batch, s) for c, s in runner.calls if s] == [(4, True), (64, True), (128, True)]
    assert [c.batch for c in cells] == [4, 64, 64] + [128] * 8
    # Checkpointing (x0.8 at batch 512) lost to the configuration so far: the later steps leave it off.
    assert [c.grad_ckpt for c in cells] == [False] * 5 + [True] + [False] * 5
    assert [c.grad_accum for c in cells] == [1, 1, 1, 1, 4, 1, 1, 1, 1, 1, 1]  # measured, never kept
    assert [c.head for c in cells] == ["all"] * 6 + ["masked"] * 5
    assert [c.pad_vocab for c in cells] == [1] * 7 + [64] * 4
    assert [c.dropout for c in cells] == [None] * 8 + [0.0] * 3
    assert [c.compile for c in cells] == [False] * 9 + [True] * 2
    assert [c.optim for c in cells] == ["adamw"] * 3 + ["adamw-fused"] * 8
    assert [r["kept"] for r in rows[:-1]] == [True, True, True, True, False, False, True, True, True, True, False]
    speeds = [100.0, 250.0, 300.0, 360.0, 396.0, 288.0, 396.0, 415.8, 449.064, 561.33]
    assert [r.get("samples_per_s") for r in rows[:10]] == pytest.approx(speeds)
    gains = [r["gain_samples_per_s"] for r in rows]
    assert gains[0] is None  # nothing before the first step
    # Each gain is over the configuration the step changed: the runner's factor of that step, also after a step
    # left out (the masked head read 396 / 288 over the checkpointing it was not built on)
    assert gains[1:10] == pytest.approx([2.5, 1.2, 1.2, 1.1, 0.8, 1.1, 1.05, 1.08, 1.25])
    assert gains[10] is None and rows[10]["status"] == "unsupported"  # no speed for a step that did not run
    assert rows[2]["gain_peak_mem_mb"] == pytest.approx(2.0)
    assert rows[2]["gain_mfu"] == pytest.approx(rows[2]["gain_samples_per_s"])
    # The best combination is the compiled, masked-head, fused configuration; its gain is over fp32.
    best = rows[-1]
    assert best["best_of"] == "torch.compile" and best["samples_per_s"] == pytest.approx(561.33)
    assert best["gain_samples_per_s"] == pytest.approx(5.6133) and best["gain_mfu"] == pytest.approx(5.6133)
    assert best["options"] == ("bf16, batch 128, adamw-fused, masked head, dropout 0.0, vocabulary padded to 64, "
                               "compile")
    text = training_ladder.summary(rows)
    assert "x2.50" in text and "best combination" in text and "padded to 64, compile" in text


def test_a_step_that_pays_is_kept_into_the_best():
    rows = training_ladder.walk(BASE, FakeRunner(liger_ok=True, ckpt_factor=1.0))
    by = {r["step"]: r for r in rows}
    # Checkpointing at no cost ties the configuration so far (both at the batch-128 speed): not kept.
    assert not by["grad checkpointing, largest batch"]["kept"]
    assert not by["Liger kernels"]["kept"] and by["Liger kernels"]["status"] == "ok"  # slower: left out
    rows = training_ladder.walk(BASE, FakeRunner(liger_ok=True, ckpt_factor=1.5))
    by = {r["step"]: r for r in rows}
    assert by["grad checkpointing, largest batch"]["kept"] and by["grad checkpointing, largest batch"]["batch_size"] == 512
    assert by["torch.compile"]["batch_size"] == 512 and by["torch.compile"]["grad_ckpt"]
    assert rows[-1]["batch_size"] == 512 and "grad ckpt" in rows[-1]["options"]


def test_a_gpt2_ladder_has_no_masked_head_step_and_keeps_the_one_kernel_gelu():
    runner = FakeRunner()
    rows = training_ladder.walk(replace(BASE, model="gpt2-tiny", task="causal-lm"), runner)
    assert "MLM head on masked positions" not in [r["step"] for r in rows]
    assert all(c.head == "all" for c, _ in runner.calls)
    assert [c.activation for c, _ in runner.calls][-4:] == ["gelu-tanh"] * 4
    assert rows[-1]["options"] == ("bf16, batch 128, adamw-fused, gelu-tanh, dropout 0.0, vocabulary padded to 64, "
                                   "compile")


def test_gain_after_a_failed_step_is_none():
    rows = training_ladder.add_gains([{"status": "ok", "samples_per_s": 10.0}, {"status": "oom"},
                                      {"status": "ok", "samples_per_s": 30.0}])
    assert [r["gain_samples_per_s"] for r in rows] == [None, None, None]


@pytest.mark.slow
def test_plot_is_written(tmp_path):
    rows = training_ladder.walk(BASE, FakeRunner())
    path = training_ladder.plot(rows, str(tmp_path / "ladder.png"))
    assert (tmp_path / "ladder.png").stat().st_size > 10_000 and path.endswith("ladder.png")


@pytest.mark.slow
def test_cli_ladder_runs_on_the_sweep_loop_and_resumes(tmp_path, monkeypatch):
    """The ladder through the CLI, the sweep loop and its max-batch search, with each cell measured by a
    fake lane (no process per cell): batches above 24 (fp32) / 48 (bf16) / 200 (checkpointing) are out of
    memory. A second run of the same name measures nothing again."""
    from transbench.runner import sweep

    ran: list[TrainCell] = []

    def fake_run(lane, cell, timeout):
        ran.append(cell)
        if cell.kernels == "liger":
            return CellResult("unsupported", error="kernels liger needs Liger-Kernel: pip install 'transbench[liger]'")
        limit = 200 if cell.grad_ckpt else 48 if cell.dtype == "bf16" else 24
        if cell.batch > limit:
            return CellResult("oom", error="out of memory")
        speed = cell.batch * (2.0 if cell.dtype == "bf16" else 1.0)
        return CellResult("ok", {"samples_per_s": speed, "tflops": speed / 10, "mfu": None,
                                 "peak_mem_mb": float(cell.batch)})

    monkeypatch.setattr(sweep._Lane, "run", fake_run)
    db, out, png = str(tmp_path / "l.db"), tmp_path / "l.json", tmp_path / "l.png"
    args = ["train", "--ladder", "--model", "bert-tiny", "--seq", "8", "--batch", "2", "--device", "cpu",
            "--db", db, "--json", str(out), "--plot", str(png), "--name", "lad"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["cells"]
    assert [r["step"] for r in rows] == MLM_STEPS + [training_ladder.BEST]
    # The search doubles from the batch so far, then bisects to within 1/4 of the batch.
    assert [r["batch_size"] for r in rows] == [24, 24, 48, 48, 48, 192, 192, 192, 192, 192, 192, 192]
    assert rows[1]["gain_samples_per_s"] == pytest.approx(2.0)  # bf16 at the same batch
    # No cell is measured twice (a search takes its start batch's stored result), and the bf16 search
    # starts from the bf16 step's batch 24: it never goes back to batch 1, where a ladder on an H100 ran out
    # of time (benchmarks/results/measurement_path_h100_2026-11.md).
    assert len({c.key() for c in ran}) == len(ran)
    assert [c.batch for c in ran if c.dtype == "bf16"][:6] == [24, 48, 96, 72, 60, 48]
    assert rows[-1]["best_of"] == "grad checkpointing, largest batch" and rows[-1]["batch_size"] == 192
    by = {r["step"]: r for r in rows}
    assert by["Liger kernels"]["status"] == "unsupported" and "transbench[liger]" in by["Liger kernels"]["error"]
    assert "ladder" in res.output and png.stat().st_size > 0
    store = Store(db)
    (run,) = store.runs()
    stored = run["cells"]
    store.close()
    assert stored >= len(training_ladder.STEPS)
    before = len(ran)
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert len(ran) == before  # everything was stored: nothing measured again
    assert json.loads(out.read_text())["cells"] == rows


def test_cli_ladder_takes_one_model(tmp_path):
    res = CliRunner().invoke(app, ["train", "--ladder", "--model", "bert-tiny,gpt2-tiny", "--device", "cpu",
                                   "--db", str(tmp_path / "x.db")])
    assert res.exit_code == 2
    out = res.output.strip()
    assert out.startswith("error: --ladder walks one model") and len(out.splitlines()) == 1
    assert not (tmp_path / "x.db").exists()
