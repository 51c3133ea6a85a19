"""`train --ladder`: the seed notebook's steps, the batches the searches find carried to the next steps,
the gain arithmetic (with a fake runner), and one real ladder on CPU through the sweep loop."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from transbench.cells import CellResult
from transbench.cli import app
from transbench.scenarios import training_ladder
from transbench.scenarios.training_cell import TrainCell
from transbench.store import Store

BASE = TrainCell(model="bert-tiny", task="mlm", attn="sdpa", precision="fp32", optim="adamw", batch=4, seq=16,
                 steps=2, warmup_steps=1, device="cpu")


def test_the_steps_are_the_notebooks():
    names = [s.name for s in training_ladder.STEPS]
    assert names == ["fp32, largest batch", "bf16", "bf16, largest batch", "fused AdamW", "grad accumulation 4",
                     "grad checkpointing, largest batch", "torch.compile", "Liger kernels"]
    cells = [replace(BASE, **s.change) for s in training_ladder.STEPS]
    assert [c.precision for c in cells] == ["fp32"] + ["bf16"] * 7
    assert [c.optim for c in cells] == ["adamw"] * 3 + ["adamw-fused"] * 5
    assert [c.grad_accum for c in cells] == [1, 1, 1, 1, 4, 1, 1, 1]
    assert [c.grad_ckpt for c in cells] == [False] * 5 + [True] * 3
    assert [c.compile for c in cells] == [False] * 6 + [True] * 2
    assert [c.kernels for c in cells] == ["torch"] * 7 + ["liger"]
    assert [s.search for s in training_ladder.STEPS] == [True, False, True, False, False, True, False, False]


class FakeRunner:
    """Largest batches 64 (fp32), 128 (bf16), 512 (checkpointing); samples/s from a table per step."""

    SPEED = {("fp32", "adamw", 1, False, False, "torch"): 100.0, ("bf16", "adamw", 1, False, False, "torch"): 250.0,
             ("bf16", "adamw-fused", 1, False, False, "torch"): 300.0,
             ("bf16", "adamw-fused", 4, False, False, "torch"): 330.0,
             ("bf16", "adamw-fused", 1, True, False, "torch"): 240.0,
             ("bf16", "adamw-fused", 1, True, True, "torch"): 360.0}

    def __init__(self):
        self.calls: list[tuple[TrainCell, bool]] = []

    def __call__(self, cell: TrainCell, search: bool):
        self.calls.append((cell, search))
        if cell.kernels == "liger":
            return cell, CellResult("unsupported", error="kernels liger needs Liger-Kernel")
        if search:
            cell = replace(cell, batch=512 if cell.grad_ckpt else 128 if cell.precision == "bf16" else 64)
        base = self.SPEED[(cell.precision, cell.optim, cell.grad_accum, cell.grad_ckpt, cell.compile, cell.kernels)]
        speed = base * (1.2 if cell.batch >= 128 else 1.0)
        rec = {"samples_per_s": speed, "tflops": speed / 100, "mfu": speed / 1000, "peak_mem_mb": cell.batch * 10.0}
        return cell, CellResult("ok", rec)


def test_batches_carry_over_and_gains_are_each_step_over_the_one_before():
    runner = FakeRunner()
    rows = training_ladder.walk(BASE, runner)
    assert [r["step"] for r in rows] == [s.name for s in training_ladder.STEPS]
    # Each step runs at the batch the last search found (the base batch before any search).
    assert [c.batch for c, _ in runner.calls] == [4, 64, 64, 128, 128, 128, 512, 512]
    assert [r["batch_size"] for r in rows] == [64, 64, 128, 128, 128, 512, 512, 512]
    speeds = [100.0, 250.0, 300.0, 360.0, 396.0, 288.0, 432.0]
    assert [r.get("samples_per_s") for r in rows[:7]] == pytest.approx(speeds)
    gains = [r["gain_samples_per_s"] for r in rows]
    assert gains[0] is None  # nothing before the first step
    assert gains[1:7] == pytest.approx([2.5, 1.2, 1.2, 1.1, 288 / 396, 1.5])
    assert gains[7] is None and rows[7]["status"] == "unsupported"  # no speed for a step that did not run
    assert rows[6]["gain_peak_mem_mb"] == pytest.approx(1.0)
    assert rows[2]["gain_peak_mem_mb"] == pytest.approx(2.0)
    assert rows[2]["gain_mfu"] == pytest.approx(rows[2]["gain_samples_per_s"])
    assert "samples/s" in training_ladder.summary(rows) and "x2.50" in training_ladder.summary(rows)


def test_gain_after_a_failed_step_is_none():
    rows = training_ladder.add_gains([{"status": "ok", "samples_per_s": 10.0}, {"status": "oom"},
                                      {"status": "ok", "samples_per_s": 30.0}])
    assert [r["gain_samples_per_s"] for r in rows] == [None, None, None]


def test_plot_is_written(tmp_path):
    rows = training_ladder.walk(BASE, FakeRunner())
    path = training_ladder.plot(rows, str(tmp_path / "ladder.png"))
    assert (tmp_path / "ladder.png").stat().st_size > 10_000 and path.endswith("ladder.png")


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
        limit = 200 if cell.grad_ckpt else 48 if cell.precision == "bf16" else 24
        if cell.batch > limit:
            return CellResult("oom", error="out of memory")
        speed = cell.batch * (2.0 if cell.precision == "bf16" else 1.0)
        return CellResult("ok", {"samples_per_s": speed, "tflops": speed / 10, "mfu": None,
                                 "peak_mem_mb": float(cell.batch)})

    monkeypatch.setattr(sweep._Lane, "run", fake_run)
    db, out, png = str(tmp_path / "l.db"), tmp_path / "l.json", tmp_path / "l.png"
    args = ["train", "--ladder", "--model", "bert-tiny", "--seq", "8", "--batch", "2", "--device", "cpu",
            "--db", db, "--json", str(out), "--plot", str(png), "--name", "lad"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())
    assert [r["step"] for r in rows] == [s.name for s in training_ladder.STEPS]
    # The search doubles from the batch so far, then bisects to within 1/32 of the batch.
    assert [r["batch_size"] for r in rows] == [24, 24, 48, 48, 48, 198, 198, 198]  # 200 within 1/32
    assert rows[1]["gain_samples_per_s"] == pytest.approx(2.0)  # bf16 at the same batch
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
    assert json.loads(out.read_text()) == rows


def test_cli_ladder_takes_one_model(tmp_path):
    res = CliRunner().invoke(app, ["train", "--ladder", "--model", "bert-tiny,gpt2-tiny", "--device", "cpu",
                                   "--db", str(tmp_path / "x.db")])
    assert res.exit_code == 2
    out = res.output.strip()
    assert out.startswith("error: --ladder walks one model") and len(out.splitlines()) == 1
    assert not (tmp_path / "x.db").exists()
