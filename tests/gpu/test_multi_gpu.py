"""Several GPUs of one host: DataParallel against DDP (same step, same losses' scale, per-GPU memory), DDP's timed
gradient all-reduce, and the collective benchmark over NCCL (exact sums, bus bandwidth well above PCIe's floor on
NVLink hosts). Run on the device: python3 -m pytest -m gpu tests/gpu/test_multi_gpu.py."""

from __future__ import annotations

import pytest
import torch

from transbench.scenarios import micro
from transbench.scenarios.training.spec import TrainSpec, train

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS < 2, reason="needs 2 or more CUDA GPUs")]


def test_dp_and_ddp_over_two_gpus(tmp_path):
    spec = TrainSpec(models=["bert-tiny"], strategies=["dp", "ddp"], nprocs=[2], batches=[16], seqs=[64],
                     dtypes=["bf16"], steps=5, warmup_steps=2, scaling=True, timeout=300)
    recs = {r["strategy"]: r for r in train(spec, db=str(tmp_path / "t.db"))}
    assert set(recs) == {"none", "dp", "ddp"}
    for r in recs.values():
        assert r["status"] == "ok", r["error"]
    for s in ("dp", "ddp"):
        r = recs[s]
        assert r["world_size"] == 2 and r["global_batch"] == 32
        assert r["samples_per_s"] == pytest.approx(32 / (r["latency_ms"] / 1e3))
        assert r["scaling_efficiency"] > 0
        assert r["peak_mem_mb"] > 0 and r["activations_mb"] is not None
        assert r["loss_end"] == pytest.approx(recs["none"]["loss_end"], rel=0.3)  # the same model learning
    ddp = recs["ddp"]
    assert ddp["allreduce_mb"] == pytest.approx(ddp["params_mb"], rel=0.01)  # fp32 gradients, once per step
    assert 0 < ddp["comm_share"] <= 1 and ddp["allreduce_busbw_gbs"] > 0
    assert recs["dp"].get("allreduce_ms") is None
    # DataParallel's first GPU holds the model and the gathered outputs: its peak is a GPU's, never a sum
    assert recs["dp"]["params_mb"] == pytest.approx(recs["ddp"]["params_mb"], rel=0.05)


def test_dp_trains_in_bf16_on_every_replica(tmp_path):
    """autocast is thread-local: without the per-forward autocast, DataParallel's threads ran fp16."""
    spec = TrainSpec(models=["bert-tiny"], strategies=["dp"], nprocs=[2], batches=[8], seqs=[32],
                     dtypes=["bf16"], steps=3, warmup_steps=1, timeout=300)
    (r,) = train(spec, db=str(tmp_path / "t.db"))
    assert r["status"] == "ok", r["error"]
    import math

    assert math.isfinite(r["loss_end"])


def test_collectives_over_nccl(tmp_path):
    n = min(GPUS, 4)
    out = micro.run_micro("collectives", micro.CollectivesOptions(
        device="cuda", sizes=[2**10, 2**20, 2**28], nproc=n, min_time=0.1), str(tmp_path / "c.db"))
    recs = {(r["op"], r["bytes"]): r for r in out.records}
    assert len(recs) == 9
    for (op, nbytes), r in recs.items():
        assert r["status"] == "ok", r["error"]
        assert r["world_size"] == n and r["gpu"]
        factor = 2 * (n - 1) / n if op == "all-reduce" else (n - 1) / n
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * factor)
    # 256 MiB moves at link speed: above 10 GB/s on any multi-GPU host worth the name (PCIe 4 x16 ~ 25 GB/s)
    assert recs[("all-reduce", 2**28)]["busbw_gbs"] > 10
    assert recs[("all-reduce", 2**28)]["latency_ms"] > recs[("all-reduce", 2**10)]["latency_ms"]
