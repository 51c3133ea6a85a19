"""GPU checks of the micro-benchmarks (run on the device: python3 -m pytest -m gpu tests/gpu/test_micro_gpu.py).

They check that each choice took effect (tf32, fp8, L2 rotation, sdpa kernel), that a size too large
for the GPU is an `oom` row, and that the big products reach a sane share of the datasheet."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from transbench.scenarios import micro  # noqa: E402

FAST = dict(device="cuda", min_time=0.05)


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "micro.db")


def by_dtype(out):
    return {(r["m"], r["dtype"]): r for r in out.records}


def test_gemm_dtypes_take_effect(db):
    out = micro.run_micro("gemm", micro.GemmOptions(sizes=[1024, 8192], dtypes=["fp32", "tf32", "bf16", "fp8"],
                                                    models=[], **FAST), db)
    r = by_dtype(out)
    for key, rec in r.items():
        print(key, rec["status"], rec.get("tflops"), rec.get("pct_of_peak"), rec.get("rel_err"), rec.get("error"))
    assert all(r[(8192, d)]["status"] == "ok" for d in ("fp32", "tf32", "bf16"))
    # TF32 rounds inputs to 10 mantissa bits: its error is orders above fp32's, and it runs faster.
    assert r[(8192, "tf32")]["rel_err"] > 10 * r[(8192, "fp32")]["rel_err"]
    assert r[(8192, "tf32")]["tflops"] > 2 * r[(8192, "fp32")]["tflops"]
    bf16 = r[(8192, "bf16")]
    if bf16["peak_tflops"]:
        assert bf16["pct_of_peak"] > 50, bf16
    cap = torch.cuda.get_device_capability()
    fp8 = r[(8192, "fp8")]
    if cap >= (8, 9):
        assert fp8["status"] == "ok" and fp8["rel_err"] < 0.05, fp8
    else:
        assert fp8["status"] == "unsupported" and "8.9" in fp8["error"]


def test_small_operands_rotate_past_l2(db):
    out = micro.run_micro("gemm", micro.GemmOptions(sizes=[256], dtypes=["fp16"], models=[], **FAST), db)
    from transbench.store import Store

    s = Store(db)
    try:
        cell = s.cells(out.run_id)[0]
    finally:
        s.close()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert cell["info"]["operand_sets"] * cell["info"]["set_bytes"] >= 2 * l2
    assert cell["info"]["calls_per_sample"] > 1


def test_copy_bandwidth_near_datasheet(db):
    out = micro.run_micro("bandwidth", micro.BandwidthOptions(sizes=[2**28], ops=["copy"], **FAST), db)
    rec = out.records[0]
    print(rec["gbps"], rec["pct_of_peak"])
    assert rec["status"] == "ok"
    if rec["peak_gbs"]:
        assert rec["pct_of_peak"] > 60, rec


def test_too_large_a_product_is_an_oom_row(db):
    out = micro.run_micro("gemm", micro.GemmOptions(sizes=[128, 2**19], dtypes=["fp32"], models=[], **FAST), db)
    assert [r["status"] for r in out.records] == ["ok", "oom"], out.records
    again = micro.run_micro("gemm", micro.GemmOptions(sizes=[128], dtypes=["fp32"], models=[], **FAST), db)
    assert again.records[0]["status"] == "ok"  # the OOM left the GPU usable


def test_layer_and_breakdown(db):
    out = micro.run_micro("layer", micro.LayerOptions(model="bert-base-uncased", dtype="fp16", batches=[8],
                                                      seqs=[128], **FAST), db)
    assert {r["status"] for r in out.records} == {"ok"}, out.records
    fwd, both = out.records
    assert both["tflops"] > 0 and fwd["rel_err"] < 2e-2
    bd = micro.run_micro("breakdown", micro.BreakdownOptions(model="bert-base-uncased", dtype="fp16", batch=16,
                                                             seq=128, **FAST), db)
    recs = {r["part"]: r for r in bd.records}
    assert {r["status"] for r in recs.values()} == {"ok"}
    assert recs["layernorms"]["bound"] == "memory" and recs["dense"]["bound"] == "compute"
    from transbench.store import Store

    s = Store(db)
    try:
        info = s.cells(bd.run_id)[0]["info"]
    finally:
        s.close()
    assert info["attn_implementation"] == "sdpa" and info["sdpa_kernel"] != "math", info
