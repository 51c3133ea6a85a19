"""A review of micro, the sweep core and `tune` on CPU: the max-batch search at and past its cap, a search that
stopped on something other than an OOM, duplicate axis values, the CPU allocator's out-of-memory, and `tune`'s
bad input (families the engine cannot run, cache folders and tables it cannot use) as one line, exit code 2,
nothing created or changed."""

from __future__ import annotations

import json
import os
import threading

import pytest
from typer.testing import CliRunner

from transbench import api
from transbench.cells import Cell, CellResult
from transbench.cli import app
from transbench.engine import tuning
from transbench.errors import SpecError
from transbench.measure import device as dev
from transbench.runner.sweep import SweepOptions, find_max_batch, max_batch_key, open_run, search_max_batch
from transbench.scenarios import micro
from transbench.scenarios.inference.spec import RunSpec
from transbench.store import Store

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


# --- the max-batch search ------------------------------------------------------------------------------

def test_a_search_that_starts_above_its_cap_answers_at_the_cap():
    """A ladder's --batch 64 under --max-batch-limit 32 started the search above its cap: UnboundLocalError."""
    tried = []

    def probe(b):
        tried.append(b)
        return CellResult("ok", record={"throughput_per_s": float(b)})

    result, best = find_max_batch(probe, limit=32, start=64, known=CellResult("ok"))
    assert best == 32 and tried == [32] and result.record["throughput_per_s"] == 32.0


def test_run_refuses_a_batch_above_the_max_batch_cap(tmp_path, quick):
    db = tmp_path / "t.db"
    spec = RunSpec(models=["bert-tiny"], backends=["eager"], batches=[4], seqs=[8], max_batch=True,
                   max_batch_limit=2, **quick)
    with pytest.raises(SpecError, match="--batch 4 is above max_batch_limit 2"):
        api.run(spec, str(db))
    assert not db.exists()  # refused before the store was made, not a traceback after the first cell


class _Lane:
    """Batches up to 4 run; 8 times out (a worker killed at its deadline, not out of memory)."""

    def __init__(self):
        self.tried = []

    def run(self, cell, timeout):
        self.tried.append(cell.batch)
        if cell.batch <= 4:
            return CellResult("ok", record={"throughput_per_s": float(cell.batch), "latency_ms": 1.0})
        return CellResult("timeout", error="no result within the 1 s deadline")


def test_a_search_stopped_by_a_timeout_says_its_answer_may_be_low(tmp_path):
    store = Store(str(tmp_path / "t.db"))
    try:
        run_id, _, _ = open_run(store, "inference", {"grid": 1}, "mb", lambda: {})
        first = Cell(model="bert-tiny", task="base", backend="eager", dtype="fp32", batch=1, seq=8)
        lane = _Lane()
        search_max_batch(store, run_id, first, lane, SweepOptions(max_batch=True, max_batch_limit=64), 1, set(),
                         threading.Lock(), lambda c, r: None)
        cell = next(c for c in store.cells(run_id) if c["key"] == max_batch_key(first))
    finally:
        store.close()
    assert lane.tried == [1, 2, 4, 8]
    assert cell["status"] == "ok" and cell["record"]["batch_size"] == 4
    assert cell["info"]["stopped_at"] == 8 and any("stopped at batch 8" in w and "timeout" in w
                                                   for w in cell["warnings"]), cell["warnings"]


def test_a_deadline_past_what_the_os_can_wait_is_no_deadline(tmp_path):
    """`run --timeout 1e10` (or 1e7) stored its run, then ended in an OverflowError traceback waiting for the cell."""
    import torch

    from transbench.runner.worker import Worker
    from transbench.scenarios.micro import run as micro_run

    opts = micro.BandwidthOptions(sizes=[16], ops=["copy"], device="cpu", min_time=0.01).resolved(torch.device("cpu"))
    [cell] = micro_run.cells("bandwidth", opts, "cpu", str(tmp_path / "t.db"))
    worker = Worker()
    try:
        result = worker.run("transbench.scenarios.micro.run:measure", cell.to_dict(), 1e10)
    finally:
        worker.stop()
    assert result.status == "ok" and result.record["gbps"] > 0


# --- out of memory on the CPU ----------------------------------------------------------------------------

def test_the_cpu_allocators_refusal_is_out_of_memory():
    assert dev.is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                                   "allocate memory: you tried to allocate 4398046511104 bytes."))
    assert dev.is_oom(MemoryError())
    assert not dev.is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_a_gemm_too_large_for_the_host_is_an_oom_row(tmp_path):
    """`micro gemm --sizes 2^20` on a CPU: 4 TB operands, refused by the allocator, stored as `error`."""
    import torch

    from transbench.scenarios.micro import run as micro_run

    opts = micro.GemmOptions(sizes=[2**20], models=[], device="cpu", min_time=0.01).resolved(torch.device("cpu"))
    [cell] = micro_run.cells("gemm", opts, "cpu", str(tmp_path / "t.db"))
    result = micro_run.measure(cell.to_dict(), {})
    assert result.status == "oom" and "can't allocate memory" in result.error


# --- micro: bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["layer", "-m", "bert-tiny", "--batch", "1,1", "--seq", "8"], "--batch lists 1 twice"),
    (["layer", "-m", "bert-tiny", "--batch", "1", "--seq", "8,8"], "--seq lists 8 twice"),
    (["gemm", "--sizes", "64,2^6", "--model", ""], "--sizes lists 64 twice"),
    (["gemm", "--sizes", "64", "--dtype", "fp32,fp32", "--model", ""], "--dtype lists fp32 twice"),
    (["gemm", "--sizes", "64", "--model", "bert-tiny,bert-tiny"], "--model lists bert-tiny twice"),
    (["bandwidth", "--sizes", "1024,1024"], "--sizes lists 1024 twice"),
    (["bandwidth", "--sizes", "1024", "--ops", "copy,copy"], "--ops lists copy twice"),
    (["gemm", "--sizes", "", "--model", ""], "give --sizes or --model"),
    (["breakdown", "-m", "bert-tiny", "--batch", "0"], "batch 0 is not allowed: give whole numbers >= 1"),
])
def test_micro_refuses_a_value_listed_twice_and_says_what_to_give(tmp_path, args, words):
    db = tmp_path / "m.db"
    line = refused(runner.invoke(app, ["micro", *args, "--db", str(db), *FAST]), words)
    assert "--models" not in line and "batchs" not in line
    assert not db.exists()


def test_micro_min_time_help_shows_the_default_it_uses():
    import torch

    res = runner.invoke(app, ["micro", "gemm", "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert res.exit_code == 0
    opts = micro.GemmOptions(sizes=[64], models=[], device="cpu")
    cpu = opts.resolved(torch.device("cpu")).min_time
    gpu = opts._common(torch.device("cuda"))["min_time"]  # what a GPU point gets (no GPU needed to ask)
    assert f"{gpu:g} on GPU, {cpu:g} on CPU" in " ".join(res.output.split()), res.output


# --- tune: bad input, before any GPU is asked for -----------------------------------------------------------

def tune(*args):
    return runner.invoke(app, ["tune", "-m", "bert-tiny", "--seq", "8", *[str(a) for a in args]])


@pytest.mark.parametrize("args, words", [
    (["--batch", "1,1"], "--batch lists 1 twice"),
    (["--batch", "1", "--seq", "8,8"], "--seq lists 8 twice"),
    (["-m", "llama-tiny"], "llama-tiny is a llama model; the fused engine runs bert"),
    (["-m", "distilbert-tiny"], "the fused engine runs"),
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
    monkeypatch.setenv("TRANSBENCH_CACHE_DIR", str(a_file))  # the default folder, from the environment
    refused(tune(), f"{a_file} is a file, not a folder")
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


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
