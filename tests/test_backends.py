"""Backends on CPU: every CPU backend is correct on every task head, a broken one is caught as `wrong`
with no speed exported, unavailable ones say what to install."""

from __future__ import annotations

import dataclasses
import json

import pytest

from transbench import api, backends
from transbench.cells import Cell
from transbench.runner import worker  # noqa: E402
from transbench.scenarios.inference.measure import ModelCache
from transbench.scenarios.inference.spec import RunSpec


def execute(cell, cache):
    """One `run` cell through the worker's own path (runner/worker.py), in this process."""
    return worker.execute("transbench.scenarios.inference.target:measure", cell.to_dict(), {"models": cache})

FAST = dict(min_time=0.0, warmup=1, min_count=2)


@pytest.fixture()
def with_broken(extra_backends):
    extra_backends("broken_backends")


@pytest.mark.slow
def test_sweep_statuses_and_no_speed_for_wrong_output(tmp_path, with_broken):
    out = tmp_path / "r.json"
    spec = RunSpec(models=["bert-tiny", "gpt2-tiny"], tasks=["base"], batches=[3], seqs=[12], seq_stdev=3.0,
                   backends=["eager", "sdpa", "sdpa-math", "sdpa-flash", "broken-noise", "flash-attn2",
                             "cudagraph", "sdpa-cudnn"],
                   device="cpu", dtypes=["fp32"], baseline="eager", **FAST)
    api.run(spec, db=str(tmp_path / "t.db"), json_path=str(out))
    recs = {(r["model"], r["backend"]): r for r in json.loads(out.read_text())["cells"]}
    for model in ("bert-tiny", "gpt2-tiny"):
        for b in ("eager", "sdpa", "sdpa-math", "sdpa-flash"):
            r = recs[model, b]
            assert r["status"] == "ok", r
            assert r["rel_err"] < 1e-4 and r["latency_ms"] > 0
        broken = recs[model, "broken-noise"]
        assert broken["status"] == "wrong" and broken["rel_err"] > 0.1
        assert "tolerance" in broken["error"]
        assert broken["latency_ms"] is None and broken["throughput_per_s"] is None and broken["speedup"] is None
        assert recs[model, "flash-attn2"]["status"] == "unsupported"
        assert recs[model, "cudagraph"]["status"] == "unsupported"
        assert "cuda" in recs[model, "cudagraph"]["error"]
        assert recs[model, "sdpa"]["speedup"] is not None


def test_unavailable_backends_name_the_extra():
    import importlib.util

    flash = backends.get("flash-attn2")
    reason = flash.unsupported_reason("cpu", "fp32", "base")
    if importlib.util.find_spec("flash_attn") is None:
        assert "pip install 'transbench[flash]'" in reason
    assert flash.unsupported_reason("cuda", "fp32", "base") is not None  # fp16/bf16 only, CUDA only
    missing = dataclasses.replace(backends.get("onnxruntime"), requires=("no_such_module_xyz",))
    assert "pip install 'transbench[onnx]'" in missing.unsupported_reason("cpu", "fp32", "base")
    assert "generate" in backends.get("onnxruntime").unsupported_reason("cpu", "fp32", "generate")


HEADS = [("bert-tiny", t) for t in ("mlm", "classification", "token-classification", "qa")] + \
        [("gpt2-tiny", t) for t in ("causal-lm", "classification", "token-classification", "qa")]


@pytest.mark.slow
@pytest.mark.parametrize("model,task", HEADS)
def test_every_head_through_every_cpu_backend(model, task):
    cache = ModelCache()
    for backend in ("eager", "sdpa", "onnxruntime"):
        cell = Cell(model=model, task=task, backend=backend, dtype="fp32", batch=3, seq=10, seq_stdev=2.0, **FAST)
        r = execute(cell, cache)
        assert r.status == "ok", (backend, r.error, r.info.get("traceback"))
        assert r.record["rel_err"] < 1e-4, backend
        if task == "causal-lm":  # per time step of the (padded) context, as the seeds quote it
            from transbench.models import build
            from transbench.scenarios.inference.measure import cell_inputs

            width = cell_inputs(cell, build.resolve(model).shape).input_ids.shape[1]
            assert r.record["ms_per_token"] == pytest.approx(r.record["latency_ms"] / width)
        else:
            assert "ms_per_token" not in r.record


@pytest.mark.slow
def test_onnxruntime_records_its_export_and_reuses_it():
    cache = ModelCache()
    cell = Cell(model="gpt2-tiny", task="base", backend="onnxruntime", dtype="fp32", batch=2, seq=8,
                embeddings=False, **FAST)  # GPT-2 --encoders-only: inputs_embeds go into the graph
    first = execute(cell, cache)
    again = execute(cell, cache)
    assert first.status == again.status == "ok", first.error
    assert first.info["ort_provider"] == "CPUExecutionProvider"
    assert first.info["export_s"] > 0 and not first.info["export_cached"]
    assert again.info["export_cached"] and again.info["export_s"] == 0
    assert "inputs_embeds" in first.info["onnx_inputs"]


@pytest.mark.slow
def test_onnxruntime_bert_encoders_only_takes_the_embedding_output_as_an_input():
    # Exported as a constant, the frozen embedding output let ONNX Runtime fold the whole encoder away.
    cell = Cell(model="bert-tiny", task="base", backend="onnxruntime", dtype="fp32", batch=2, seq=8,
                embeddings=False, **FAST)
    r = execute(cell, ModelCache())
    assert r.status == "ok", (r.error, r.info.get("traceback"))
    assert "embedding_output" in r.info["onnx_inputs"] and r.record["rel_err"] < 1e-4


@pytest.mark.slow
def test_compile_one_cell_encoders_only_with_padding():
    cell = Cell(model="bert-tiny", task="base", backend="compile", dtype="fp32", batch=2, seq=8, seq_stdev=2.0,
                embeddings=False, **FAST)
    r = execute(cell, ModelCache())
    assert r.status == "ok", (r.error, r.info.get("traceback"))
    assert r.record["rel_err"] < 1e-4
    assert r.info["compile_s"] > 0 and r.info["graphs"] >= 1 and r.info["compile_mode"] == "default"
    assert r.info["prepare_s"] >= r.info["compile_s"]


def test_unknown_compile_mode_is_one_clear_line():
    from transbench.backends.compile import check_mode
    from transbench.errors import SpecError

    with pytest.raises(SpecError, match="max-autotune"):
        check_mode("fastest")


def test_a_forward_a_cuda_graph_cannot_capture_is_named_not_an_error():
    """deberta-v3-base on an H100: torch refused the capture (a CPU tensor copied during it); the backend
    turns exactly that kind of refusal into `unsupported` with its one line, and lets other failures through."""
    from transbench.backends.cudagraph import capture_refusal

    exc = RuntimeError("The following operation failed in the TorchScript interpreter.\nTraceback ...\n"
                       "RuntimeError: Cannot copy between CPU and CUDA tensors during CUDA graph capture unless "
                       "the CPU tensor is pinned.")
    assert capture_refusal(exc).startswith("RuntimeError: Cannot copy between CPU and CUDA tensors during CUDA graph")
    assert capture_refusal(RuntimeError("CUDA error: operation not permitted when stream is capturing"))
    assert capture_refusal(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) is None
