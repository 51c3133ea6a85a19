"""torchrun on CPU (gloo): DDP and FSDP training over 2 ranks, data-parallel inference, and a hung rank
that ends at its deadline with no process left behind."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from transbench import api
from transbench.runner.launch import SAFE_ENV
from transbench.scenarios.inference.dp import shard
from transbench.scenarios.training.spec import TrainSpec, train
from transbench.scenarios.inference.spec import RunSpec

pytestmark = pytest.mark.slow


def _processes_with(marker: str) -> list[int]:
    """Live processes whose environment carries `marker` (those this test started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_ddp_and_fsdp_train_over_two_ranks(tmp_path):
    spec = TrainSpec(models=["bert-tiny"], device="cpu", strategies=["ddp", "fsdp"], nprocs=[2], batches=[2],
                     seqs=[16], grad_accums=[2], steps=2, warmup_steps=1, nccl_p2p=["off"], timeout=150)
    recs = {r["strategy"]: r for r in train(spec, db=str(tmp_path / "d.db"))}
    assert set(recs) == {"ddp", "fsdp"}
    for r in recs.values():
        assert r["status"] == "ok", r["error"]
        assert r["world_size"] == 2 and r["global_batch"] == 2 * 2 * 2
        assert r["samples_per_s"] == pytest.approx(8 / (r["latency_ms"] / 1e3))
        assert r["tflops_per_gpu"] == pytest.approx(r["tflops"] / 2)
        assert r["nccl"] == "NCCL_P2P_DISABLE=1"
    # FSDP keeps a shard of the parameters per rank, DDP a full copy.
    assert recs["fsdp"]["params_mb"] == pytest.approx(recs["ddp"]["params_mb"] / 2, rel=0.05)
    # Same weights, same data, same fp32 arithmetic: the two strategies agree on the loss (the timed all-reduce hook
    # reduces as DDP's own does).
    assert recs["fsdp"]["loss_end"] == pytest.approx(recs["ddp"]["loss_end"], rel=1e-4)
    # DDP's gradient all-reduce, timed per bucket: every fp32 gradient once per step, a share of the step.
    ddp = recs["ddp"]
    assert ddp["allreduce_mb"] == pytest.approx(ddp["params_mb"], rel=0.01)
    assert 0 < ddp["allreduce_ms"] and 0 < ddp["comm_share"] <= 1.0
    assert 0 <= ddp["allreduce_exposed_ms"] <= ddp["allreduce_ms"] + 1e-6
    assert ddp["allreduce_busbw_gbs"] > 0
    assert recs["fsdp"].get("allreduce_ms") is None
    from transbench.store import Store

    store = Store(tmp_path / "d.db")
    (run,) = store.runs()
    cells = store.cells(run["run_id"])
    store.close()
    for c in cells:
        assert c["info"]["dist_backend"] == "gloo"
        env = c["info"]["nccl_env"]
        assert env["NCCL_P2P_DISABLE"] == "1"
        assert all(env[k] == v for k, v in SAFE_ENV.items())  # multicast stays off in every rank
        assert len(c["info"]["per_rank"]) == 2


def test_hung_rank_times_out_and_leaves_no_process(monkeypatch):
    # a rank that never ends (tests/slow_start_target.py): the launch ends at its deadline, keeps the ranks' and
    # torchrun's logs, and leaves no process of its tree
    from transbench.runner import launch

    marker = f"TB_TEST_{uuid.uuid4().hex}"
    monkeypatch.setenv("TB_TEST_HANG_RANK", "0")
    monkeypatch.setenv(marker, "1")
    tests = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p))
    cfg = launch.LaunchConfig(nproc=2, torchrun=True, timeout=8)
    result = launch.outcome(launch.launch("slow_start_target", {"device": "cpu"}, cfg), cfg)
    assert result.status == "timeout" and "8 s deadline" in result.error, result.error
    assert "launcher.log" in result.info["logs"]  # the ranks' and torchrun's messages are kept
    assert _processes_with(marker) == []


def test_shard_splits_rows_evenly():
    assert [shard(10, 3, r) for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert sum((shard(7, 2, r) for r in range(2)), []) == list(range(7))


def test_data_parallel_inference_sums_throughput(tmp_path):
    spec = RunSpec(models=["bert-tiny"], backends=["sdpa"], batches=[6], seqs=[16], device="cpu", nproc=2,
                   min_time=0.05, min_count=5, warmup=1, timeout=150)
    out = api.run(spec, db=str(tmp_path / "i.db"), json_path=str(tmp_path / "i.json"))
    (rec,) = out.records
    assert rec["status"] == "ok", rec["error"]
    assert (rec["world_size"], rec["strategy"], rec["batch_size"]) == (2, "data-parallel", 6)
    assert rec["throughput_per_s"] == pytest.approx(6 / (rec["latency_ms"] / 1e3))
    assert rec["rel_err"] < 1e-3
    assert (tmp_path / "i.json").is_file()
    from transbench.store import Store

    store = Store(tmp_path / "i.db")
    (cell,) = store.cells(out.run_id)
    store.close()
    assert cell["info"]["rows_per_rank"] == [3, 3]
    assert len(cell["samples"]) == rec["n_samples"] >= 5
