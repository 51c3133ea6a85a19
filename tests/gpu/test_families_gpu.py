"""GPU checks of the new families: every generic backend in fp16, generation with CUDA graphs and
compile for decoders, the fused engine on RoBERTa and DistilBERT at their base shapes
(python3 -m pytest tests/gpu -m gpu)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from transbench.cells import Cell  # noqa: E402
from transbench.runner import worker  # noqa: E402
from transbench.scenarios.inference.measure import ModelCache  # noqa: E402


def execute(cell, cache):
    """One `run` cell through the worker's own path (runner/worker.py), in this process."""
    return worker.execute("transbench.scenarios.inference.target:measure", cell.to_dict(), {"models": cache})

CACHE = ModelCache()


def cell(**kw) -> Cell:
    base = dict(model="roberta-tiny", task="base", backend="sdpa", dtype="fp16", batch=4, seq=32, device="cuda",
                warmup=2, min_time=0.05, min_count=5, new_tokens=8)
    return Cell(**{**base, **kw})


@pytest.mark.parametrize("backend", ["eager", "sdpa", "cudagraph", "compile", "onnxruntime"])
@pytest.mark.parametrize("model,task", [("roberta-tiny", "mlm"), ("distilbert-tiny", "classification"),
                                        ("deberta-tiny", "qa"), ("modernbert-tiny", "token-classification"),
                                        ("llama-tiny", "causal-lm"), ("qwen2-tiny", "base")])
def test_families_run_on_every_generic_backend(backend, model, task):
    r = execute(cell(model=model, task=task, backend=backend, seq_stdev=6.0 if backend != "onnxruntime" else 0.0),
                CACHE)
    if backend == "onnxruntime" and r.status == "unsupported":  # an export failure says why, in one line
        assert r.error and "\n" not in r.error
        return
    if model == "deberta-tiny" and backend == "sdpa":  # transformers has no SDPA attention for DeBERTa-v2
        assert r.status == "unsupported" and "sdpa" in r.error, (r.status, r.error)
        return
    if model == "deberta-tiny" and backend == "cudagraph":  # its forward copies a CPU tensor: no capture
        assert r.status == "unsupported" and "CUDA graph" in r.error and "\n" not in r.error, (r.status, r.error)
        assert "capture failed" in r.info["fresh_worker_after"]  # the sweep's next cell gets a fresh worker
        return
    assert r.status == "ok", (r.status, r.error, r.info.get("traceback"))
    assert "fresh_worker_after" not in r.info
    assert r.record["rel_err"] < 2e-2
    assert r.record["flops_method"] == ("counted" if model == "deberta-tiny" else "analytic")


@pytest.mark.parametrize("backend", ["sdpa", "compile", "cudagraph"])
@pytest.mark.parametrize("model", ["llama-tiny", "qwen2-tiny"])
def test_decoder_families_generate_with_static_cache(backend, model):
    r = execute(cell(model=model, task="generate", backend=backend, seq=16), CACHE)
    assert r.status == "ok", (r.status, r.error, r.info.get("traceback"))
    assert r.info["greedy_token_match"] > 0.5
    assert r.record["decode_ms_per_token"] > 0
    if backend != "sdpa":
        assert r.info["kv_cache"] == "StaticCache"


def test_fused_roberta_base_matches_and_beats_eager():
    fused = execute(cell(model="roberta-base", backend="fused", batch=8, seq=128, seq_stdev=20.0), CACHE)
    assert fused.status == "ok", (fused.error, fused.info.get("traceback"))
    assert fused.record["rel_err"] < 2e-2
    eager = execute(cell(model="roberta-base", backend="eager", batch=8, seq=128, seq_stdev=20.0), CACHE)
    assert eager.status == "ok"
    assert fused.record["latency_ms"] < eager.record["latency_ms"]


@pytest.mark.parametrize("task,dtype,embeddings", [("base", "fp16", True), ("mlm", "bf16", True),
                                                    ("classification", "fp16", False), ("qa", "bf16", False)])
def test_fused_distilbert_matches_transformers(task, dtype, embeddings):
    # Right-padded batches of varied lengths (seq_stdev): the packed path; a passing cell passed the fp32 gate
    r = execute(cell(model="distilbert-base-uncased", task=task, backend="fused", dtype=dtype, batch=8, seq=128,
                     seq_stdev=20.0, embeddings=embeddings), CACHE)
    assert r.status == "ok", (r.status, r.error, r.info.get("traceback"))
    assert r.record["rel_err"] < 2e-2


@pytest.mark.parametrize("family,task,backend", [("falcon", "base", "sdpa"), ("falcon", "generate", "sdpa"),
                                                 ("llama", "qa", "sdpa"), ("mistral", "causal-lm", "eager")])
def test_checkpoint_folders_rebuilt_for_sdpa_or_remapped_run_on_cuda(tmp_path, family, task, backend):
    # Model building on the GPU: Falcon rebuilt with SDPA chosen at construction
    # (build._rebuilt), a QA head whose backbone prefix differs from the checkpoint's (build._backbone_mapping),
    # and a counted decoder's FLOPs (flops._causal_products).
    import transformers

    extra = {"new_decoder_architecture": True, "num_kv_heads": 2} if family == "falcon" else {"num_key_value_heads": 2}
    cfg = transformers.AutoConfig.for_model(family, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                            num_hidden_layers=2, vocab_size=1003, max_position_embeddings=128,
                                            **extra)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / family)
    r = execute(cell(model=str(tmp_path / family), task=task, backend=backend, seq=32), ModelCache())
    assert r.status == "ok", (r.status, r.error, r.info.get("traceback"))
    assert r.record["tflops"] > 0 and (task == "generate" or r.record["rel_err"] < 2e-2)
