"""Any transformers family and checkpoint-folder validation on CPU with tiny presets:
every task head each family has through eager and sdpa (compile marked slow), decoders' generation,
the fused engine on RoBERTa, presets that are transformers configs, and each refusal of a bad folder."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import warnings
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli_input import invoke, refused
from torch.utils.flop_counter import FlopCounterMode

from transbench.backends import family_reason, registry
from transbench.cells import Cell
from transbench.errors import SpecError
from transbench.models import build, flops
from transbench.models.presets import PRESETS
from transbench.runner import worker  # noqa: E402
from transbench.scenarios.inference.measure import ModelCache
from transbench.scenarios.training import loop as training_loop
from transbench.scenarios.training.cell import TrainCell


def execute(cell, cache):
    """One `run` cell through the worker's own path (runner/worker.py), in this process."""
    return worker.execute("transbench.scenarios.inference.target:measure", cell.to_dict(), {"models": cache})

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ["roberta-tiny", "distilbert-tiny", "deberta-tiny", "modernbert-tiny", "llama-tiny", "qwen2-tiny"]
FAST = dict(min_time=0.0, warmup=1, min_count=2)


@pytest.fixture(scope="module")
def cache():
    return ModelCache()


def run(cache, model, task, backend, **kw):
    cell = Cell(model=model, task=task, backend=backend, dtype="fp32", batch=2, seq=16, device="cpu",
                **{**FAST, "new_tokens": 4, **kw})
    return execute(cell, cache)


# --- presets ---------------------------------------------------------------------------------------

def test_presets_are_transformers_configs_with_the_declared_shape():
    for name, p in PRESETS.items():
        cfg = build.preset_config(p)
        assert cfg.model_type == p.family
        assert build.shape_from_config(name, cfg) == p, name


def test_published_parameter_counts():
    # The models' cards: SmolLM2-135M, Qwen2.5-0.5B 0.49B, Llama-3.2-1B 1.24B (tied embeddings), counted on meta.
    assert build.param_count(PRESETS["smollm2-135m"]) == 134_515_008
    assert build.param_count(PRESETS["qwen2.5-0.5b"]) == 494_032_768
    assert build.param_count(PRESETS["llama-3.2-1b"]) == 1_235_814_400
    assert build.param_count(PRESETS["distilbert-base-uncased"]) == 66_362_880


def test_llama_tiny_is_llama_style():
    model = build.build_model(build.resolve("llama-tiny"), "causal-lm")
    layer = model.model.layers[0]
    assert model.config.num_key_value_heads == 2 < model.config.num_attention_heads == 4  # GQA
    assert type(layer.input_layernorm).__name__ == "LlamaRMSNorm"
    assert hasattr(layer.mlp, "gate_proj")  # gated MLP
    assert model.model.rotary_emb is not None


def test_tasks_follow_transformers_heads():
    assert "mlm" not in build.family_tasks("llama") and "generate" in build.family_tasks("llama")
    assert "causal-lm" not in build.family_tasks("roberta")  # an encoder's is_decoder head is not a decoder
    assert build.task_class("distilbert", "qa") == "DistilBertForQuestionAnswering"


# --- every family, every head ----------------------------------------------------------------------

CASES = [(m, t) for m in FAMILIES for t in build.family_tasks(PRESETS[m].family) if t != "generate"]


@pytest.mark.slow
@pytest.mark.parametrize("model,task", CASES)
def test_every_head_of_every_family_runs_eager(cache, model, task):
    r = run(cache, model, task, "eager")
    assert r.status == "ok", r.error
    assert r.record["rel_err"] <= 1e-6  # the reference's own implementation
    assert r.record["flops_method"] == ("counted" if PRESETS[model].family == "deberta-v2" else "analytic")
    assert r.record["tflops"] > 0


@pytest.mark.parametrize("model", FAMILIES)
def test_sdpa_with_padding_and_encoders_only(cache, model):
    task = "mlm" if not PRESETS[model].decoder else "causal-lm"
    r = run(cache, model, task, "sdpa", seq_stdev=5.0, embeddings=False)
    if PRESETS[model].family == "deberta-v2":  # transformers has no sdpa attention for DeBERTa-v2
        assert r.status == "unsupported" and "no 'sdpa' attention" in r.error
        return
    assert r.status == "ok", r.error
    assert 0 < r.record["rel_err"] < 1e-4


@pytest.mark.parametrize("model", ["gpt2-tiny", "llama-tiny"])
def test_a_decoder_classifier_given_embeddings_over_padding_is_unsupported(cache, model):
    """From inputs_embeds a decoder's classifier reads the last position, padding here, where the reference (from the
    ids) reads the last real token: every backend, eager included, was `wrong`."""
    r = run(cache, model, "classification", "eager", seq_stdev=5.0, embeddings=False)
    assert r.status == "unsupported" and "reads each sequence's last position" in r.error, r.error
    r = run(cache, model, "classification", "eager", embeddings=False)  # no padding: nothing read is padding
    assert r.status == "ok", r.error


def test_a_missing_head_is_unsupported_in_a_mixed_grid(cache):
    r = run(cache, "llama-tiny", "mlm", "eager")
    assert r.status == "unsupported" and "needs a family with that head" in r.error


def test_grid_refuses_a_task_no_model_has_and_keeps_one_some_have():
    from transbench.scenarios.inference import cells as grid
    from transbench.scenarios.inference.spec import RunSpec

    base = dict(device="cpu", batches=[1], seqs=[8], backends=["eager"])
    with pytest.raises(SpecError, match="needs a family with that head"):
        grid.validate(RunSpec(models=["llama-tiny"], tasks=["mlm"], **base))
    grid.validate(RunSpec(models=["roberta-tiny", "llama-tiny"], tasks=["mlm"], **base))


def test_roberta_inputs_never_use_the_pad_id_and_take_token_types():
    from transbench.scenarios.inference.measure import cell_inputs

    cell = Cell(model="roberta-tiny", task="base", backend="eager", dtype="fp32", batch=4, seq=64, seq_stdev=20.0)
    inputs = cell_inputs(cell, PRESETS["roberta-tiny"])
    real = torch.arange(inputs.input_ids.shape[1])[None] < torch.tensor(inputs.lengths)[:, None]
    assert not (inputs.input_ids[real] == 1).any() and (inputs.input_ids[~real] == 1).all()
    assert inputs.token_type_ids is not None
    llama = cell_inputs(Cell(model="llama-tiny", task="base", backend="eager", dtype="fp32", batch=2, seq=8),
                        PRESETS["llama-tiny"])
    assert llama.token_type_ids is None


def test_backends_say_which_families_they_cannot_run():
    reg = registry()
    assert "sdpa" in family_reason(reg["sdpa"], "deberta-v2")
    assert family_reason(reg["compile"], "deberta-v2") is None  # compiles DeBERTa's eager attention
    assert "fused engine runs" in family_reason(reg["fused"], "llama")
    assert family_reason(reg["fused"], "roberta") is None


def test_onnx_export_failure_is_unsupported(cache, monkeypatch):
    pytest.importorskip("onnxruntime")

    def refuse(*args, **kwargs):
        raise RuntimeError("Failed to export the model with torch.export: unsupported operator")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    r = run(cache, "llama-tiny", "base", "onnxruntime")
    assert r.status == "unsupported"
    assert "torch.onnx cannot export llama" in r.error and "unsupported operator" in r.error


@pytest.mark.slow
@pytest.mark.parametrize("model", FAMILIES)
def test_compile_runs_every_family(cache, model):
    task = "causal-lm" if PRESETS[model].decoder else "mlm"
    r = run(cache, model, task, "compile")
    assert r.status == "ok", r.error
    assert r.record["rel_err"] < 1e-4
    # DeBERTa-v2 has no sdpa: compile times its eager attention, and says so
    want = "eager" if PRESETS[model].family == "deberta-v2" else "sdpa"
    assert r.info["attn_implementation"] == want


# --- generation ------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama-tiny", "qwen2-tiny"])
def test_decoder_families_generate(cache, model):
    r = run(cache, model, "generate", "sdpa")
    assert r.status == "ok", r.error
    assert r.info["greedy_token_match"] == 1.0
    # GQA: the DynamicCache holds 2 kv heads of 12, as the analytic size says (not 4 heads)
    assert r.record["kv_cache_mb"] == pytest.approx(r.record["kv_cache_analytic_mb"])
    p = PRESETS[model]
    assert r.record["kv_cache_analytic_mb"] * 2**20 == 2 * 2 * 2 * (16 + 4 - 1) * 2 * 12 * 4 == flops.kv_cache_bytes(
        p, 16 + 4 - 1, 4) * 2


@pytest.mark.parametrize("layout,kv", [(dict(multi_query=True), 1), (dict(multi_query=False), 4),
                                       (dict(new_decoder_architecture=True, num_kv_heads=2), 4)])  # broadcast first
def test_falcons_analytic_kv_cache_counts_the_heads_it_caches(tmp_path, layout, kv):
    """Falcon's first layout with multi_query caches one key and value head for all its query heads (falcon-7b: 71):
    its config names no num_key_value_heads, and the analytic cache and a decode step's bandwidth counted them all."""
    from transformers import FalconConfig, FalconForCausalLM

    from transbench.backends.decoders import HFGenerator

    cfg = FalconConfig(vocab_size=97, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                       max_position_embeddings=64, alibi=False, parallel_attn=True, **layout)
    FalconForCausalLM(cfg).save_pretrained(tmp_path / "falcon")
    ref = build.resolve(str(tmp_path / "falcon"))
    assert ref.shape.kv == kv
    gen = HFGenerator(build.build_model(ref, "generate"))
    gen.prefill(torch.randint(3, 90, (1, 10)))
    assert gen.cache_bytes() == flops.kv_cache_bytes(ref.shape, 10, 4)


def test_static_cache_decoder_matches_dynamic_cache_for_llama():
    from transbench.backends.decoders import HFGenerator, StaticGenerator
    from transbench.scenarios.generation.measure import greedy

    model = build.build_model(build.resolve("llama-tiny"), "generate", attn="sdpa")
    ids = torch.randint(3, 1000, (3, 7), generator=torch.Generator().manual_seed(1))
    want, first = greedy(HFGenerator(model), ids, 10, keep_first=True)
    gen = StaticGenerator(model, 3, 17)
    for _ in range(2):  # the second generation resets the static cache
        got, first_static = greedy(gen, ids, 10, keep_first=True)
        assert torch.equal(got, want)
        assert torch.allclose(first, first_static, atol=1e-5)
    assert gen.cache_bytes() == 2 * 2 * 3 * 17 * 2 * 12 * 4  # k and v, 2 layers, batch 3, 17 slots, 2 kv heads of 12


@pytest.mark.slow
def test_compiled_static_decode_for_qwen2(cache):
    r = run(cache, "qwen2-tiny", "generate", "compile")
    assert r.status == "ok", r.error
    assert r.info["kv_cache"] == "StaticCache" and r.info["greedy_token_match"] == 1.0


# --- the fused engine on RoBERTa ---------------------------------------------------------------------

def _roberta(cls_name="RobertaModel", family="roberta"):
    import transformers

    cfg = transformers.AutoConfig.for_model(family, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                            intermediate_size=256, vocab_size=1000, max_position_embeddings=66,
                                            pad_token_id=1, type_vocab_size=1, num_labels=3)
    kw = {"add_pooling_layer": False} if cls_name.endswith("Model") else {}
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(cfg, **kw).eval()


@pytest.mark.parametrize("cls_name,family", [("RobertaModel", "roberta"), ("RobertaForMaskedLM", "roberta"),
                                             ("RobertaForSequenceClassification", "roberta"),
                                             ("XLMRobertaModel", "xlm-roberta")])
def test_fused_engine_matches_transformers_on_roberta(cls_name, family):
    from transbench.engine import compile_model
    from transbench.scenarios.inference.measure import output_tensor

    m = _roberta(cls_name, family)
    c = compile_model(m, dtype=torch.float32)
    full = torch.randint(3, 1000, (3, 64))  # 64 = every position embedding but the pad offset's
    mask = torch.ones_like(full)
    mask[1, 40:] = 0
    mask[2, 5:] = 0
    padded = full.masked_fill(mask == 0, 1)  # RoBERTa's padding holds its pad id
    with torch.no_grad():
        for ids, kw in ((full, {}), (padded, {"attention_mask": mask})):
            ref = output_tensor(m(ids, **kw), "base")
            out = output_tensor(c(ids, **kw), "base")
            keep = mask.bool() if kw and ref.dim() == 3 else torch.ones(ref.shape[:2], dtype=torch.bool)
            err = ((out[keep] - ref[keep]).double().norm() / ref[keep].double().norm()).item()
            assert err < 1e-5, (cls_name, kw, err)
    with pytest.raises(ValueError, match="exceeds the model's 64 positions"):
        c(torch.randint(3, 1000, (1, 65)))


@pytest.mark.slow
def test_fused_backend_on_roberta_tiny_and_unsupported_elsewhere(cache):
    r = run(cache, "roberta-tiny", "mlm", "fused", seq_stdev=5.0)
    assert r.status == "ok", r.error
    assert r.record["rel_err"] < 1e-5
    r = run(cache, "roberta-tiny", "base", "fused", embeddings=False)
    assert r.status == "ok", r.error
    for task, embeddings in (("qa", True), ("classification", False)):  # DistilBERT: BERT's layers, other names
        r = run(cache, "distilbert-tiny", task, "fused", seq_stdev=5.0, embeddings=embeddings)
        assert r.status == "ok" and r.record["rel_err"] < 1e-5, (r.status, r.error)
    for model in ("modernbert-tiny", "llama-tiny"):
        r = run(cache, model, "base", "fused")
        assert r.status == "unsupported" and "fused engine runs" not in r.error
        assert "the engine runs bert, roberta" in r.error and "\n" not in r.error


# --- checkpoint folders -------------------------------------------------------------------

def _folder(tmp_path, config, weights="safetensors"):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if weights == "safetensors":
        model = build.build_model(build.resolve("bert-tiny"), "base")
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(d / "model.safetensors"))
    return d


TINY_BERT = {"model_type": "bert", "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 3,
             "intermediate_size": 96, "vocab_size": 1000, "max_position_embeddings": 128}


def test_a_valid_folder_resolves(tmp_path):
    ref = build.resolve(str(_folder(tmp_path, TINY_BERT)))
    assert ref.shape.family == "bert" and ref.shape.layers == 2 and ref.path


@pytest.mark.parametrize("config,weights,needle", [
    ("{not json", "safetensors", "config.json: invalid JSON at line 1"),
    ({"hidden_size": 48}, "safetensors", "names no model_type"),
    ({**TINY_BERT, "model_type": 5}, "safetensors", "model_type is 5, not a family name"),
    ({**TINY_BERT, "model_type": None}, "safetensors", "model_type is null, not a family name"),
    (json.dumps(TINY_BERT)[:-1] + ', "layer_norm_eps": NaN}', "safetensors", "NaN is not a number JSON allows"),
    (json.dumps(TINY_BERT)[:-1] + ', "initializer_range": -Infinity}', "safetensors", "-Infinity is not a number"),
    ({**TINY_BERT, "model_type": "bertzilla"}, "safetensors", "model_type 'bertzilla' is unknown to transformers"),
    ({**TINY_BERT, "auto_map": {"AutoModel": "modeling_evil.EvilModel"}}, "safetensors", "custom model code"),
    ({**TINY_BERT, "num_labels": 10**9}, "safetensors", "num_labels to 1,000,000,000, above the 1,000,000"),  # an OOM
    (TINY_BERT, None, "has no weight file"),
])
def test_bad_folders_are_refused(tmp_path, config, weights, needle):
    d = _folder(tmp_path, config, weights)
    with pytest.raises(SpecError, match=needle):
        build.resolve(str(d))


def test_a_config_key_transformers_has_renamed_prints_no_python_warning(tmp_path):
    """Every Llama 3.2 checkpoint names rope_scaling, which transformers 5 has renamed: reading its config.json
    printed a FutureWarning with transformers' source line, twice, at every run of the folder."""
    import warnings

    d = _folder(tmp_path, {**TINY_BERT, "rope_scaling": {"rope_type": "default"}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref = build.resolve(str(d))
        build.hf_config(ref, "base")
    assert not caught, [str(w.message) for w in caught]


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
@pytest.mark.parametrize("kind,needle", [("folder", "is a folder"), ("fifo", "is not a regular file"),
                                         ("dangling", "which is missing"), ("loop", "is a loop of symbolic links")])
def test_a_config_or_weight_file_that_is_not_a_file_is_named_as_such(tmp_path, name, kind, needle):
    """A weight file that was a folder, a pipe or a link to nothing was "has no weight file", and a config.json
    that was a link to nothing "has no config.json": the folder looked complete to the user."""
    import os

    d = _folder(tmp_path, TINY_BERT)
    p = d / name
    p.unlink()
    {"folder": p.mkdir, "fifo": lambda: os.mkfifo(p), "dangling": lambda: p.symlink_to(d / "gone"),
     "loop": lambda: p.symlink_to(p)}[kind]()
    with pytest.raises(SpecError, match=f"{name}.* {needle}") as exc:
        build.resolve(str(d))
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("kind,needle", [("folder", "is a folder"), ("fifo", "is not a regular file"),
                                         ("dangling", "which is missing"), ("loop", "is a loop of symbolic links")])
def test_a_weight_shard_that_is_not_a_file_is_named_as_such(tmp_path, kind, needle):
    """A shard named by the weight index that was a folder, a pipe or a link to nothing was "is missing"."""
    import os

    d = _folder(tmp_path, TINY_BERT)
    shard = d / "model-00001-of-00001.safetensors"
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard.name}}))
    {"folder": shard.mkdir, "fifo": lambda: os.mkfifo(shard), "dangling": lambda: shard.symlink_to(d / "gone"),
     "loop": lambda: shard.symlink_to(shard)}[kind]()
    with pytest.raises(SpecError, match=f"weight shard {shard.name} named by .* {needle}") as exc:
        build.resolve(str(d))
    assert "\n" not in str(exc.value)


def test_corrupt_weight_files_are_refused(tmp_path):
    d = _folder(tmp_path, TINY_BERT)
    w = d / "model.safetensors"
    good = w.read_bytes()
    w.write_bytes(good[: len(good) // 2])  # truncated download
    with pytest.raises(SpecError, match="model.safetensors is not a readable safetensors file.*truncated"):
        build.resolve(str(d))
    w.write_bytes(struct.pack("<Q", 40) + b"this is not json at all, not at all!!!!!")
    with pytest.raises(SpecError, match="not a readable safetensors file"):
        build.resolve(str(d))
    w.unlink()
    (d / "pytorch_model.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(SpecError, match="pytorch_model.bin is not a readable torch zip archive"):
        build.resolve(str(d))
    (d / "pytorch_model.bin").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../../etc/passwd"}}))
    with pytest.raises(SpecError, match="names a weight shard outside the folder"):
        build.resolve(str(d))
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(SpecError, match="weight shard model-00001-of-00002.safetensors .* is missing"):
        build.resolve(str(d))
    # a name too long for the file system: Path.is_file raised ENAMETOOLONG, an OSError traceback (exit 1)
    for name in ("a" * 5000 + ".safetensors", "d/" * 3000 + "x.safetensors"):
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": name}}))
        with pytest.raises(SpecError, match=r"weight shard [ad/]{200}\.\.\. \([56],0\d\d characters\) named by model"
                                            r"\.safetensors\.index\.json is missing"):
            build.resolve(str(d))


@pytest.mark.parametrize("family,cls_name,extra", [
    ("roberta", "RobertaModel", {}),
    ("esm", "EsmModel", {"mask_token_id": 32, "position_embedding_type": "absolute"}),
    ("mpnet", "MPNetModel", {}),
    ("longformer", "LongformerModel", {"attention_window": [8]}),
])
def test_positions_numbered_from_the_pad_id_bound_the_sequence(tmp_path, family, cls_name, extra):
    """Families that number positions from pad_token_id + 1 lose that many of max_position_embeddings; ESM, MPNet
    and Longformer were not in a list of RoBERTa's kin, so one token past their length was an IndexError cell."""
    import transformers

    config = transformers.AutoConfig.for_model(family, vocab_size=40, hidden_size=36, num_hidden_layers=1,
                                               num_attention_heads=6, intermediate_size=50,
                                               max_position_embeddings=18, pad_token_id=1, **extra)
    getattr(transformers, cls_name)(config).save_pretrained(tmp_path / family)
    ref = build.resolve(str(tmp_path / family))
    assert ref.shape.max_positions == 16
    refused(invoke("run", "--model", tmp_path / family, "--seq", "17", "--db", tmp_path / "x.db"),
            "seq 17 is longer than", "allows (16 positions)")
    assert not build.positions_from_pad("bert") and not build.positions_from_pad("no-such-family")


def test_a_pad_id_on_the_last_position_is_refused(tmp_path):
    """A RoBERTa whose pad_token_id is its last position has no position left for a token (each is numbered from
    pad_token_id + 1): refused when the folder is read. It passed as a model of 0 positions, and `run --seq 8` was
    told to "give --seq and --new-tokens that add up to 1 or less", though no length runs it."""
    import transformers

    config = transformers.RobertaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=37, max_position_embeddings=20, pad_token_id=19)
    d = tmp_path / "roberta-pad-last"
    transformers.RobertaModel(config).save_pretrained(d)
    with pytest.raises(SpecError, match=r"leaves no position for a token: roberta numbers positions from "
                                        r"pad_token_id \+ 1 \(19 \+ 1\), and max_position_embeddings is 20"):
        build.resolve(str(d))
    refused(invoke("run", "--model", d, "--seq", "8", "--db", tmp_path / "x.db"), "leaves no position for a token")


def test_a_checkpoint_quantized_by_a_library_that_is_missing_is_refused_before_any_cell(tmp_path):
    # each backend's cell was an `error` of transformers' ImportError, stored, where nothing could have run
    import importlib.util

    if importlib.util.find_spec("accelerate") and importlib.util.find_spec("bitsandbytes"):
        pytest.skip("bitsandbytes and accelerate are installed here")
    d = _folder(tmp_path, {**TINY_BERT, "quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}})
    refused(invoke("run", "--model", d, "--seq", "8", "--db", tmp_path / "x.db"),
            "its weights are quantized (bitsandbytes, config.json's quantization_config), which transformers cannot "
            "load here: ", "install what it names")
    assert not (tmp_path / "x.db").exists()
    # a method transformers does not know is loaded as plain weights (transformers warns), not refused here
    d2 = tmp_path / "plain"
    d.rename(d2)
    config = json.loads((d2 / "config.json").read_text())
    (d2 / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "homemade"}}))
    assert build.resolve(str(d2)).shape.family == "bert"


@pytest.mark.parametrize("quantization,edit,needle", [
    ({"quant_method": "homemade"}, {"num_hidden_layers": 4}, "config.json sets num_hidden_layers to 4, but the "
                                                             "weight files hold 2 layers"),
    ({"quant_method": "homemade"}, {"hidden_size": 64, "num_attention_heads": 4}, "config.json does not fit its "
                                                                                 "weights: tensor"),
    ({"bits": 4}, {}, "transformers cannot read config.json's quantization_config (The model's quantization config "
                      "from the arguments has no `quant_method` attribute"),
    ({}, {}, "has no `quant_method` attribute"),
])
def test_a_quantization_config_transformers_skips_or_cannot_read_does_not_pass_weights_unchecked(
        tmp_path, quantization, edit, needle):
    # transformers skips a method it does not know and loads plain weights: they went unchecked, so a config.json of 4
    # layers over 2 ran `ok` with two random layers, and a wider one was an `error` cell; a quantization_config without
    # a quant_method was an `error` cell of transformers' ValueError; each exit 0
    d = _saved(tmp_path / "ckpt", _tiny(num_hidden_layers=2), quantization_config=quantization, **edit)
    assert needle in _refusal(d)


def test_plain_weights_under_a_method_transformers_skips_are_checked_as_any(tmp_path):
    from safetensors.torch import load_file, save_file

    d = _saved(tmp_path / "ckpt", _tiny(), quantization_config={"quant_method": "homemade"})
    weights = load_file(str(d / "model.safetensors"))
    key = "encoder.layer.0.attention.self.query.weight"
    weights[key] = (weights[key] * 100).to(torch.int8)  # ran `ok`, the int8 codes read as weights
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    assert f"tensor {key} is stored as I8 in the weight files" in _refusal(d)


def test_a_null_pad_id_bounds_the_sequence_by_the_pad_id_the_model_is_built_with(tmp_path, cache):
    """A RoBERTa config.json whose pad_token_id is null is built with its eos id (2) as the pad id, so positions
    start at 3; the limit was counted from 0 + 1, and --seq 18 or 19 of a 20-position model were IndexError cells."""
    import transformers

    config = transformers.RobertaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=37, max_position_embeddings=20, pad_token_id=None)
    d = tmp_path / "roberta-null-pad"
    transformers.RobertaModel(config).save_pretrained(d)
    assert json.loads((d / "config.json").read_text())["pad_token_id"] is None
    ref = build.resolve(str(d))
    assert build.hf_config(ref, "base").pad_token_id == 2 and ref.shape.max_positions == 20 - 3
    cell = Cell(model=str(d), task="base", backend="eager", dtype="fp32", batch=1, seq=17, device="cpu", **FAST)
    r = execute(cell, cache)
    assert r.status == "ok", r.error
    refused(invoke("run", "--model", d, "--seq", "18", "--db", tmp_path / "x.db"),
            "seq 18 is longer than", "allows (17 positions)")
    assert not (tmp_path / "x.db").exists()


def test_a_checkpoint_asking_for_hidden_states_runs_its_task_output_on_every_backend(tmp_path, cache):
    """A config.json with output_hidden_states (or output_attentions) true: a cell measures the task's output, so
    eager returned every layer's states beside it and each fused cell was an error (the engine produces none)."""
    import transformers

    d = tmp_path / "bert-hidden-states"
    transformers.BertModel(transformers.BertConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
        max_position_embeddings=16, output_hidden_states=True)).save_pretrained(d)
    config = json.loads((d / "config.json").read_text())  # transformers refuses to build it with SDPA attention
    (d / "config.json").write_text(json.dumps({**config, "output_attentions": True}))
    cfg = build.hf_config(build.resolve(str(d)), "base")
    assert cfg.output_hidden_states is False and cfg.output_attentions is False
    for backend in ("eager", "fused"):
        r = run(cache, str(d), "base", backend)
        assert r.status == "ok", r.error


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "link-to-nowhere", "link-loop"])
def test_a_file_given_as_the_model_is_named_a_file_not_an_unknown_preset(tmp_path, name):
    """`--model ckpt/config.json` was "unknown model ...: use a preset (every preset listed)", as if the path did not
    exist; it names the folder to give instead, and nothing is stored. A link to nothing, or a loop of links, is said
    to be one (it was "not a folder", with its parent to try)."""
    d = tmp_path / "ckpt"
    d.mkdir()
    path = d / name
    says = {"link-to-nowhere": f"is a symbolic link to {tmp_path / 'gone'}, which is missing",
            "link-loop": "is a loop of symbolic links"}
    if name == "link-to-nowhere":
        path.symlink_to(tmp_path / "gone")
    elif name == "link-loop":
        path.symlink_to(path.name)
    else:
        path.write_text("{}")
    line = refused(invoke("run", "--model", path, "--db", tmp_path / "x.db"), *([says[name]] if name in says else
                                                                                 ["is not a folder", str(d)]))
    assert "unknown model" not in line and "bert-base-uncased" not in line
    assert not (tmp_path / "x.db").exists()


def test_a_weight_shard_in_a_subfolder_is_inside_the_folder(tmp_path):
    """An index naming `sub/x.safetensors` was refused as naming a shard outside the folder."""
    from transformers import BertConfig, BertModel

    d = tmp_path / "sharded"
    BertModel(BertConfig(**{k: v for k, v in TINY_BERT.items() if k != "model_type"}),
              add_pooling_layer=False).save_pretrained(d, max_shard_size="40KB")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    moved = sorted(set(index["weight_map"].values()))[-1]
    (d / "sub").mkdir()
    (d / moved).rename(d / "sub" / moved)
    index["weight_map"] = {k: f"sub/{v}" if v == moved else v for k, v in index["weight_map"].items()}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert build.resolve(str(d)).shape.layers == 2
    index["weight_map"] = {k: f"sub/../../{v}" for k, v in index["weight_map"].items()}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SpecError, match="names a weight shard outside the folder"):
        build.resolve(str(d))


def test_an_encoder_decoder_folder_is_refused(tmp_path):
    from transformers import T5Config, T5Model

    d = tmp_path / "t5"
    T5Model(T5Config(d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=1, vocab_size=100)).save_pretrained(d)
    with pytest.raises(SpecError, match="t5 is an encoder-decoder family; transbench benchmarks encoders and decoders"):
        build.resolve(str(d))


def test_the_encoder_of_an_encoder_decoder_family_is_refused_as_such(tmp_path):
    # a T5EncoderModel's config says is_encoder_decoder false: it was built as a T5Model and refused for the decoder
    # weights it lacks ("re-download the checkpoint"), though it was whole
    from transformers import T5Config, T5EncoderModel

    d = tmp_path / "t5enc"
    T5EncoderModel(T5Config(d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=1, vocab_size=100)).save_pretrained(d)
    with pytest.raises(SpecError, match=r"t5 is an encoder-decoder family \(this folder holds a part of one: "
                                        r"T5EncoderModel\); transbench benchmarks encoders and decoders"):
        build.resolve(str(d))


@pytest.mark.slow
def test_a_half_precision_checkpoint_is_checked_against_an_fp32_reference(tmp_path, cache):
    d = tmp_path / "bf16"
    build.build_model(build.resolve("bert-tiny"), "base").to(torch.bfloat16).save_pretrained(d)
    assert next(build.build_model(build.resolve(str(d)), "base").parameters()).dtype == torch.float32
    # The reference used to run in the checkpoint's bf16: fp32 cells read rel_err ~5e-3 ("wrong").
    r = run(cache, str(d), "base", "eager")
    assert r.status == "ok", (r.error, r.info.get("traceback"))
    assert r.record["rel_err"] < 1e-5


def test_counted_flops_use_the_checkpoints_kv_heads_and_head_dim(tmp_path):
    # A config class's defaults are another model's (Mistral: 8 kv heads; Gemma: 16 kv heads of 256): a shape
    # that equals them implicitly (kv = heads, head_dim = hidden // heads) must still be named to its class.
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import GemmaConfig, GemmaForCausalLM, MistralConfig, MistralForCausalLM

    for name, model in [
        ("mistral", MistralForCausalLM(MistralConfig(hidden_size=64, num_attention_heads=16, num_key_value_heads=16,
                                                     num_hidden_layers=1, intermediate_size=70, vocab_size=23,
                                                     max_position_embeddings=32))),
        ("gemma", GemmaForCausalLM(GemmaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                                               head_dim=16, num_hidden_layers=1, intermediate_size=90,
                                               vocab_size=25, max_position_embeddings=32))),
    ]:
        model.save_pretrained(tmp_path / name)
        shape = build.resolve(str(tmp_path / name)).shape
        model.set_attn_implementation("eager")  # torch's counter sees no FLOPs in the CPU's fused SDPA kernel
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(input_ids=torch.ones(1, 9, dtype=torch.long))
        # a decoder counts the causal half of its attention products (the Falcon and counted-decoder tests below): the
        # counter's s x s square less the masked upper half, 4 x q x s (s - 1) / 2 with q = 64
        masked = 4 * 64 * 9 * 8 // 2
        expected = flops.counter_total(counter, model) - masked
        assert flops.forward_flops(shape, 9, "causal-lm") == (expected, "counted"), name


def test_a_torch_zip_checkpoint_resolves(tmp_path):
    d = _folder(tmp_path, TINY_BERT, weights=None)
    torch.save(build.build_model(build.resolve("bert-tiny"), "base").state_dict(), d / "pytorch_model.bin")
    assert zipfile.is_zipfile(d / "pytorch_model.bin")
    assert build.resolve(str(d)).path


def test_a_torch_file_this_user_may_not_read_is_said_as_such(tmp_path, monkeypatch):
    """It was "weight file pytorch_model.bin is not a readable torch zip archive; re-download it"."""
    import os

    d = _folder(tmp_path, TINY_BERT, weights=None)
    torch.save(build.build_model(build.resolve("bert-tiny"), "base").state_dict(), d / "pytorch_model.bin")
    (d / "pytorch_model.bin").chmod(0)
    if os.geteuid() == 0:  # root reads it anyway: the open fails as it does for any other user

        def denied(file, *args, **kwargs):
            raise PermissionError(13, "Permission denied", str(file))
        monkeypatch.setattr(build.zipfile, "ZipFile", denied)
    assert _refusal(d).endswith("weight file pytorch_model.bin cannot be read (Permission denied); check its "
                                "permissions")


@pytest.mark.slow
def test_cli_refuses_custom_code_before_the_sweep_and_never_runs_it(tmp_path):
    marker = tmp_path / "executed"
    d = _folder(tmp_path, {**TINY_BERT, "auto_map": {"AutoModel": "modeling_evil.EvilModel",
                                                     "AutoConfig": "modeling_evil.EvilConfig"}})
    (d / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    db = tmp_path / "store.db"
    out = subprocess.run([sys.executable, "-m", "transbench", "run", "--model", str(d), "--device", "cpu",
                          "--batch", "1", "--seq", "8", "--db", str(db)],
                         capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith("[transformers]")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "custom model code (auto_map)" in lines[0]
    assert "Traceback" not in out.stderr
    assert not marker.exists() and not db.exists()  # nothing executed, nothing stored


@pytest.mark.slow
def test_models_command_lists_families_and_presets(tmp_path):
    out = subprocess.run([sys.executable, "-m", "transbench", "models"], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                              "COLUMNS": "100"})
    assert out.returncode == 0, out.stderr
    for name in ("roberta-base", "deberta-v3-base", "modernbert-base", "smollm2-135m", "qwen2.5-0.5b",
                 "llama-3.2-1b", "1235.8M", "all but sdpa, sdpa-*, flash-attn2, fused"):
        assert name in out.stdout
    assert max(len(line.rstrip()) for line in out.stdout.splitlines()) <= 100


# --- checkpoint folders: configs transformers rejects, and configs that do not fit their weights ---------

def _tiny(cls_name="BertModel", **kw):
    import transformers

    family = "gpt2" if cls_name.startswith("GPT2") else "llama" if cls_name.startswith("Llama") else "bert"
    shape = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100,
                 max_position_embeddings=64)
    if family == "gpt2":
        shape = dict(n_embd=32, n_layer=1, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(transformers.AutoConfig.for_model(family, **{**shape, **kw}))


def _saved(path, model, **edit):
    """save_pretrained, then config.json edited by hand (what a typo, or the fuzzer, does)."""
    model.save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **edit}))
    return path


def _refusal(path) -> str:
    with pytest.raises(SpecError) as e:
        build.resolve(str(path))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_config_field_transformers_rejects_is_one_line(tmp_path):
    # transformers' strict config dataclass raised through resolve: a 75-line traceback, rc 1
    d = _saved(tmp_path / "ckpt", _tiny(), hidden_size="32")
    assert ("transformers cannot read its config.json (Validation error for field 'hidden_size': TypeError: "
            "Field 'hidden_size' expected int, got str (value: '32')); fix config.json") in _refusal(d)


@pytest.mark.parametrize("cls_name,edit,needle", [
    ("BertModel", {"num_attention_heads": 3},
     "transformers cannot build the model its config.json describes "
     "(The hidden size (32) is not a multiple of the number of attention heads (3))"),
    ("BertModel", {"num_attention_heads": -2}, "config.json sets num_attention_heads to -2, and it must be a positive"),
    ("BertModel", {"num_hidden_layers": 0}, "sets num_hidden_layers to 0"),
    ("BertModel", {"hidden_size": 0}, "sets hidden_size to 0"),
    ("BertModel", {"vocab_size": 0}, "sets vocab_size to 0"),
    ("BertModel", {"max_position_embeddings": 0}, "sets max_position_embeddings to 0"),
    ("BertModel", {"intermediate_size": -64}, "sets intermediate_size to -64"),
    ("GPT2LMHeadModel", {"n_head": -2}, "sets n_head to -2"),  # the name config.json uses, not attribute_map's
], ids=["heads-not-dividing", "heads-negative", "layers-0", "hidden-0", "vocab-0", "positions-0", "ffn-negative",
        "gpt2-n_head"])
def test_a_config_transformers_cannot_build_is_refused(tmp_path, cls_name, edit, needle):
    # Each was an `error` cell stored with exit 0 (layers 0: an `ok` cell of an empty model)
    assert needle in _refusal(_saved(tmp_path / "ckpt", _tiny(cls_name), **edit))


def test_a_refused_config_prints_nothing_but_its_refusal(tmp_path):
    # transformers warned first ("pad_token_id must be `None` or an integer within the vocabulary (between 0 and -6)")
    # on stderr, above the line that refuses the folder. A fresh process: transformers warns once per process.
    import subprocess
    import sys
    d = _saved(tmp_path / "ckpt", _tiny(), vocab_size=-5, pad_token_id=0)
    r = subprocess.run([sys.executable, "-m", "transbench", "run", "--model", str(d), "--backend", "eager",
                        "--db", str(tmp_path / "r.db")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "sets vocab_size to -5" in lines[0], r.stderr
    assert not (tmp_path / "r.db").exists()


@pytest.mark.parametrize("rope", [{"rope_type": "linear", "factor": 0, "rope_theta": 10000.0},
                                  {"rope_type": "default", "rope_theta": -1.0}])
def test_a_rotary_base_or_scale_that_is_not_positive_is_refused(tmp_path, rope):
    """Built and run by transformers: every cell read `wrong` (rel_err inf)."""
    d = _saved(tmp_path / "ckpt", _tiny("LlamaForCausalLM"), rope_parameters=rope)
    key = "factor" if "factor" in rope else "rope_theta"
    assert f"config.json sets rope_parameters.{key} to {rope[key]!r}, and it must be a positive number" in _refusal(d)


def test_a_config_that_does_not_fit_its_weights_is_refused(tmp_path):
    # Each was an `error` cell (ignore_mismatched_sizes) stored with exit 0
    fix = "; use the config.json saved with these weights"
    d = _saved(tmp_path / "wide", _tiny(), hidden_size=64)
    assert _refusal(d).endswith("config.json does not fit its weights: tensor embeddings.word_embeddings.weight is "
                                "[100, 32] in the weight files, but config.json makes it [100, 64]" + fix)
    d = _saved(tmp_path / "mlm", _tiny("BertForMaskedLM"), vocab_size=200)  # a task head's checkpoint: `bert.`
    assert "tensor bert.embeddings.word_embeddings.weight is [100, 32] in the weight files, but config.json makes it " \
           "[200, 32]" in _refusal(d)
    d = tmp_path / "sharded"
    _tiny("BertForMaskedLM").save_pretrained(d, max_shard_size="20KB")
    assert len(list(d.glob("model-*-of-*.safetensors"))) > 2
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 128}))
    assert "tensor bert.encoder.layer.0.intermediate.dense.weight is [64, 32] in the weight files, but config.json " \
           "makes it [128, 32]" in _refusal(d)
    d = _saved(tmp_path / "bin", _tiny(), vocab_size=200)
    torch.save(_tiny().state_dict(), d / "pytorch_model.bin")  # shapes from the pickle, its data never read
    (d / "model.safetensors").unlink()
    assert "tensor embeddings.word_embeddings.weight is [100, 32]" in _refusal(d)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool, torch.complex64,
                                   torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn])
def test_a_float_parameter_stored_as_integers_is_refused_and_stored_as_floats_loads_its_values(tmp_path, dtype):
    # An int8 or bool tensor loaded as those integers (quantized codes read as weights), a complex one lost its
    # imaginary part with a warning on stderr: each ran `ok`, exit 0, a model the checkpoint is not
    from safetensors.torch import load_file, save_file

    key = "encoder.layer.0.attention.self.query.weight"
    d = _saved(tmp_path / "ckpt", _tiny())
    weights = load_file(str(d / "model.safetensors"))
    weights[key] = (weights[key] * 100).to(dtype) if dtype != torch.bool else weights[key] > 0
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    if dtype.is_floating_point:
        loaded = build.build_model(build.resolve(str(d)), "base").state_dict()[key]
        assert loaded.dtype == torch.float32 and torch.equal(loaded, weights[key].float())
        return
    stored = {torch.int8: "I8", torch.uint8: "U8", torch.int32: "I32", torch.int64: "I64", torch.bool: "BOOL",
              torch.complex64: "C64"}[dtype]
    assert (f"tensor {key} is stored as {stored} in the weight files, where the model holds floating-point values "
            "(F32, F16, BF16, F64 or F8); re-save the weights in a float dtype") in _refusal(d)


def test_integer_weights_in_a_torch_file_are_refused_and_an_integer_buffer_loads(tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import MraConfig, MraModel

    d = _saved(tmp_path / "bin", _tiny())
    weights = load_file(str(d / "model.safetensors"))
    weights["embeddings.LayerNorm.weight"] = weights["embeddings.LayerNorm.weight"].to(torch.int32)
    torch.save(weights, d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    assert "tensor embeddings.LayerNorm.weight is stored as int32 in the weight files" in _refusal(d)
    # MRA keeps its position ids (from 2) as a buffer of its state dict: stored as int32, they load as those ids
    d = tmp_path / "mra"
    MraModel(MraConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                       vocab_size=100, max_position_embeddings=64)).save_pretrained(d)
    weights = load_file(str(d / "model.safetensors"))
    weights["embeddings.position_ids"] = weights["embeddings.position_ids"].to(torch.int32)
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    ids = build.build_model(build.resolve(str(d)), "base").embeddings.position_ids
    assert ids.dtype == torch.int64 and ids[0, :3].tolist() == [2, 3, 4] and ids[0, -1] == 65


@pytest.mark.parametrize("kind,needle", [
    ("sparse", "holds encoder.layer.0.attention.self.query.weight as a torch.sparse_coo tensor, not a dense one"),
    ("meta", "holds encoder.layer.0.attention.self.query.weight as a meta tensor, a shape without data"),
    ("qint8", "tensor encoder.layer.0.attention.self.query.weight is stored as qint8 in the weight files")])
def test_a_torch_file_of_tensors_without_plain_values_is_refused_in_one_line(tmp_path, kind, needle):
    # sparse and meta tensors passed the shape check, and each cell was an `error` in the loader ("Cannot access
    # storage of SparseTensorImpl"), exit 0; a quantized tensor's load printed torch's TypedStorage warning first
    from safetensors.torch import load_file

    d = _saved(tmp_path / "bin", _tiny())
    weights = load_file(str(d / "model.safetensors"))
    key = "encoder.layer.0.attention.self.query.weight"
    with warnings.catch_warnings():  # torch's own deprecation of quantized tensors
        warnings.simplefilter("ignore")
        weights[key] = {"sparse": lambda t: t.to_sparse(), "meta": lambda t: t.to("meta"),
                        "qint8": lambda t: torch.quantize_per_tensor(t, 0.01, 0, torch.qint8)}[kind](weights[key])
    torch.save(weights, d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert needle in _refusal(d)
    assert not seen, [str(w.message) for w in seen]


def test_a_config_next_to_another_familys_weights_is_refused(tmp_path):
    # Ran `ok`: every GPT-2 weight ignored, a random BERT benchmarked as if it were the checkpoint
    _tiny("GPT2LMHeadModel").save_pretrained(tmp_path / "ckpt")
    _tiny().config.to_json_file(tmp_path / "ckpt" / "config.json")
    assert ("its weights hold none of the tensors of the BertModel that config.json describes (its first is "
            "embeddings.word_embeddings.weight, the files' transformer.h.0.attn.c_attn.bias)"
            ) in _refusal(tmp_path / "ckpt")


@pytest.mark.parametrize("cls_name,cut", [("BertModel", "layer.0.attention.self.query."),
                                            ("BertForMaskedLM", "bert.embeddings.LayerNorm."),
                                            ("GPT2LMHeadModel", "transformer.h.0.mlp.c_fc.weight"),
                                            ("LlamaForCausalLM", "model.norm.weight")])
def test_a_checkpoint_missing_some_of_its_parameters_is_refused(tmp_path, cls_name, cut):
    # Ran `ok` with the missing tensors random, measured as the checkpoint (transformers' note went to no one)
    from safetensors.torch import load_file, save_file

    d = _saved(tmp_path / "ckpt", _tiny(cls_name))
    weights = load_file(str(d / "model.safetensors"))
    kept = {k: v for k, v in weights.items() if cut not in k}
    assert 0 < len(kept) < len(weights)
    save_file(kept, str(d / "model.safetensors"), metadata={"format": "pt"})
    why = _refusal(d)
    assert "parameters that config.json describes (" in why and "which would run random; restore the missing " \
        "weights (re-download the checkpoint)" in why, why
    assert cut.removeprefix("bert.").removeprefix("transformer.").removeprefix("model.") in why


def test_a_tied_checkpoint_that_keeps_its_embeddings_only_as_its_head_resolves(tmp_path):
    from safetensors.torch import load_file, save_file

    d = _saved(tmp_path / "ckpt", _tiny("LlamaForCausalLM", tie_word_embeddings=True))
    weights = load_file(str(d / "model.safetensors"))
    weights["lm_head.weight"] = weights.pop("model.embed_tokens.weight")
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    assert build.resolve(str(d)).path


def test_checkpoints_of_any_head_and_legacy_names_still_resolve(tmp_path):
    from safetensors.torch import load_file, save_file

    bare = _saved(tmp_path / "bare", _tiny())
    ref = build.resolve(str(bare))
    assert type(build.build_model(ref, "mlm")).__name__ == "BertForMaskedLM"  # a missing head is a new head
    for cls_name in ("BertForMaskedLM", "BertForSequenceClassification", "GPT2LMHeadModel", "LlamaForCausalLM",
                     "LlamaForQuestionAnswering"):  # Llama's QA head holds its backbone as `transformer.`, not `model.`
        assert build.resolve(str(_saved(tmp_path / cls_name, _tiny(cls_name)))).path
    weights = load_file(str(bare / "model.safetensors"))  # LayerNorm gamma/beta: transformers renames them on load
    save_file({k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in weights.items()}, str(tmp_path / "bare" / "model.safetensors"))
    assert build.resolve(str(bare)).path
    from transformers import MixtralConfig, MixtralForCausalLM  # experts stored per expert, fused on load

    MixtralForCausalLM(MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=100, num_local_experts=4,
                                     max_position_embeddings=64)).save_pretrained(tmp_path / "moe")
    assert build.resolve(str(tmp_path / "moe")).family == "mixtral"


def test_without_transformers_5s_loader_the_prefix_alone_is_matched(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers.core_model_loading", None)  # transformers 4: no such module
    assert build.resolve(str(_saved(tmp_path / "mlm", _tiny("BertForMaskedLM")))).path
    assert "is [100, 32] in the weight files, but config.json makes it [200, 32]" in _refusal(
        _saved(tmp_path / "bad", _tiny("BertForMaskedLM"), vocab_size=200))


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_bin_checkpoint_holding_code_is_refused_and_never_run(tmp_path):
    # It passed the zip check; transformers refused it only when a cell loaded the weights
    marker = tmp_path / "executed"
    d = _saved(tmp_path / "ckpt", _tiny())
    (d / "model.safetensors").unlink()
    torch.save({"embeddings.word_embeddings.weight": _Evil(str(marker))}, d / "pytorch_model.bin")
    assert "weight file pytorch_model.bin cannot be read as plain tensors with torch.load(weights_only=True)" \
           in _refusal(d)
    assert not marker.exists()


@pytest.mark.parametrize("cls_name,layers", [("BertForMaskedLM", "num_hidden_layers"), ("GPT2LMHeadModel", "n_layer"),
                                             ("BertModel", "num_hidden_layers")])
def test_a_config_of_fewer_layers_than_its_weights_is_refused(tmp_path, cls_name, layers):
    """transformers leaves the layers past config.json's count unused with a note nobody sees: the cell measured a
    model smaller than the one the files hold. A head the bare model leaves unused (MLM's `cls.`) still passes."""
    d = _saved(tmp_path / "ckpt", _tiny(cls_name, **{layers: 2}))
    build.resolve(str(d))  # the weights and their own config.json: no refusal
    d = _saved(tmp_path / "fewer", _tiny(cls_name, **{layers: 2}), **{layers: 1})
    says = _refusal(d)
    assert "its weights hold layers config.json does not build" in says, says
    assert ".1." in says


@pytest.mark.parametrize("cls_name,head", [("BertForSequenceClassification", "classifier"),
                                            ("BertForTokenClassification", "classifier"),
                                            ("LlamaForSequenceClassification", "score")])
def test_a_config_whose_classes_differ_from_its_heads_rows_is_refused(tmp_path, cls_name, head):
    """The bare model has no head, so only the files' own task class sees it: a num_labels edited from 7 to 3 loaded,
    and each classification cell was an `error` in transformers' words ("ignore_mismatched_sizes")."""
    whole = _saved(tmp_path / "whole", _tiny(cls_name, num_labels=7))
    assert build.resolve(str(whole)).shape.hidden == 32
    d = _saved(tmp_path / "edited", _tiny(cls_name, num_labels=7), num_labels=3)
    assert _refusal(d).endswith(f"config.json does not fit its weights: tensor {head}.weight is [7, 32] in the weight "
                                "files, but config.json makes it [3, 32]; use the config.json saved with these weights")


def test_a_folder_is_checked_once_per_process_until_it_changes(tmp_path, monkeypatch):
    d = _saved(tmp_path / "ckpt", _tiny())
    calls = []
    real = build._resolve_folder
    monkeypatch.setattr(build, "_resolve_folder", lambda folder: calls.append(folder) or real(folder))
    assert build.resolve(str(d)) == build.resolve(str(d)) and len(calls) == 1  # a worker resolves it every cell
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 0}))
    assert "sets num_hidden_layers to 0" in _refusal(d)


@pytest.mark.slow
@pytest.mark.parametrize("edit,says", [
    ({"hidden_size": "32"}, "transformers cannot read its config.json (Validation error for field 'hidden_size'"),
    ({"num_attention_heads": 3}, "is not a multiple of the number of attention heads (3)"),
    ({"hidden_size": 64}, "config.json does not fit its weights: tensor embeddings.word_embeddings.weight"),
], ids=["string-field", "heads-not-dividing", "shape-mismatch"])
def test_cli_refuses_a_config_that_cannot_run_before_the_sweep(tmp_path, edit, says):
    d = _saved(tmp_path / "ckpt", _tiny(), **edit)
    db = tmp_path / "store.db"
    out = subprocess.run([sys.executable, "-m", "transbench", "run", "--model", str(d), "--device", "cpu", "--batch",
                          "1", "--seq", "8", "--backend", "eager", "--min-time", "0.05", "--db", str(db)],
                         capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith("[transformers]")]
    assert len(lines) == 1 and lines[0].startswith(f"error: checkpoint {d}: ") and says in lines[0], out.stderr
    assert not db.exists()  # nothing stored


@pytest.mark.slow
def test_a_classifier_checkpoint_keeps_its_own_classes(tmp_path, cache):
    # hf_config used to force 2 labels: a 3-label head then failed to load in the cell ("ignore_mismatched_sizes").
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=96,
                     vocab_size=1000, max_position_embeddings=128, num_labels=3)
    BertForSequenceClassification(cfg).save_pretrained(tmp_path / "cls3")
    r = run(cache, str(tmp_path / "cls3"), "classification", "eager")
    assert r.status == "ok", (r.error, r.info.get("traceback"))
    assert r.record["rel_err"] < 1e-5


# --- more families on the inference path: Falcon, decoders' counted FLOPs, a backbone under another task class --------

ONE_CALL = dict(min_time=0.0, warmup=0, min_count=1)
SIZES = dict(hidden_size=48, num_attention_heads=4, intermediate_size=72, num_hidden_layers=2, vocab_size=1003,
             max_position_embeddings=64)


def _save(tmp_path, name, family, cls_name="AutoModelForCausalLM", **config):
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, cls_name).from_config(transformers.AutoConfig.for_model(family, **config))
    model.save_pretrained(tmp_path / name)
    return str(tmp_path / name)


def _cell(model, task, backend, cache, **kw):
    cell = Cell(model=model, task=task, backend=backend, dtype="fp32", batch=2, seq=16, device="cpu",
                **{**ONE_CALL, "new_tokens": 3, **kw})
    return worker.execute("transbench.scenarios.inference.target:measure", cell.to_dict(), {"models": cache})


def _eager_count(folder, task, seq, custom=None):
    """torch's counter over the real model's eager forward of one sequence."""
    ref = build.resolve(folder)
    model = build.build_model(ref, task, attn="eager")
    with FlopCounterMode(display=False, custom_mapping=custom or {}) as counter, torch.no_grad():
        model(input_ids=torch.randint(3, ref.shape.vocab - 1, (1, seq)))
    return flops.counter_total(counter, model)


@pytest.fixture(scope="module")
def falcon(tmp_path_factory):
    # new_decoder_architecture: grouped-query attention with num_kv_heads (not num_key_value_heads)
    return _save(tmp_path_factory.mktemp("falcon"), "falcon", "falcon", hidden_size=48, num_attention_heads=4,
                 num_hidden_layers=2, vocab_size=1003, new_decoder_architecture=True, num_kv_heads=2)


# --- Falcon: every cell was `error` (FalconConfig.head_dim is a read-only property) ------------------------------

def test_a_falcon_checkpoint_runs_and_counts_its_flops(falcon):
    # Before: counting FLOPs rebuilt the config from the shape (preset_config), which sets head_dim, and
    # FalconConfig has no setter for it: "AttributeError: property 'head_dim' of 'FalconConfig' object has no
    # setter", so every Falcon cell that ran was `error`. Now the folder's own config.json is counted.
    shape = build.resolve(falcon).shape
    fl, method = flops.forward_flops(shape, [16], "base")
    # hand count: fused QKV (4 query + 2x2 kv heads of 12), dense, 4h MLP, causal attention, 2 layers
    s, h, q = 16, 48, 48
    per_layer = 2 * s * h * (q + 2 * 2 * 12) + 2 * s * h * h + 4 * s * h * 4 * h + 2 * s * (s + 1) * q
    assert (fl, method) == (2 * per_layer, "counted")


@pytest.mark.slow
def test_falcon_runs_sdpa(falcon):
    # Before: `unsupported` ("falcon has no 'sdpa' attention in transformers"): FalconModel declares sdpa but
    # cannot switch to it once built (transformers 5 warns and keeps eager), so it is built again with sdpa.
    cache = ModelCache()
    for task in ("base", "causal-lm"):
        r = _cell(falcon, task, "sdpa", cache)
        assert r.status == "ok", (r.error, r.info.get("traceback"))
        assert r.info["attn_implementation"] == "sdpa"
        assert 0 < r.record["rel_err"] < 1e-5  # sdpa really ran: not bit-equal to the eager reference


@pytest.mark.slow
def test_a_family_without_sdpa_stays_unsupported(tmp_path):
    # The rebuild is for classes that declare sdpa only: Bloom has none, and says so.
    folder = _save(tmp_path, "bloom", "bloom", hidden_size=48, n_head=4, n_layer=1, vocab_size=1003)
    r = _cell(folder, "base", "sdpa", ModelCache())
    assert r.status == "unsupported" and "bloom has no 'sdpa' attention" in r.error
    # transformers' reason in its first sentence: Gemma 2's went on with a link, a request and an example loading
    # openai/whisper-tiny, a paragraph of 400 characters in the cell's line. Gemma 2 declares sdpa in transformers
    # 5.17 (the GPU image's) and not in 5.24.
    from transformers.models.gemma2.modeling_gemma2 import Gemma2PreTrainedModel

    if Gemma2PreTrainedModel._supports_sdpa:
        return
    folder = _save(tmp_path, "gemma2", "gemma2", hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=100)
    r = _cell(folder, "base", "sdpa", ModelCache())
    assert r.status == "unsupported" and "gemma2 has no 'sdpa' attention" in r.error, r.error
    assert "whisper" not in r.error and len(r.error) < 250, r.error


# --- counted decoders: the causal half of attention, as the analytic families ------------------------------------

def test_a_counted_decoder_counts_the_causal_half_of_attention(tmp_path):
    # Before: a counted decoder family (Mistral, Phi, Gemma, GPT-NeoX, OPT, Bloom, ...) counted the s x s square its
    # eager attention computes and masks, while analytic decoders count s (s + 1) / 2 pairs: a Mistral read 4.0%
    # more FLOPs than the Llama of the very same shape at 16 tokens (1,204,224 against 1,158,144).
    gqa = dict(SIZES, num_key_value_heads=2, tie_word_embeddings=False)
    llama = build.resolve(_save(tmp_path, "llama", "llama", **gqa)).shape
    mistral = build.resolve(_save(tmp_path, "mistral", "mistral", **gqa, sliding_window=None)).shape
    for task in ("base", "causal-lm"):
        for lens in ([16], [16, 9], [1]):
            a, b = flops.forward_flops(llama, lens, task), flops.forward_flops(mistral, lens, task)
            assert (a[0], a[1], b[1]) == (b[0], "analytic", "counted"), (task, lens)


def test_the_counter_agrees_with_the_formulas_on_analytic_decoders():
    # The counted path, run on decoders the formulas cover, gives their very count (it read the full square).
    from transbench.models.presets import PRESETS

    for model in ("gpt2-tiny", "llama-tiny", "qwen2-tiny"):
        for task in ("base", "causal-lm", "classification"):
            shape = PRESETS[model]
            assert flops.counted_flops(shape, 16, task) == flops.analytic_forward_flops(shape, 16, task), model


def test_counted_decoder_flops_are_torchs_count_less_the_masked_half(tmp_path):
    # Against torch's counter on the real model (eager attention): the difference is exactly the masked upper
    # half of scores and values, layers x 4 x q x s (s - 1) / 2 (q = heads x head_dim = 48 here).
    phi = _save(tmp_path, "phi", "phi", **SIZES)
    bloom = _save(tmp_path, "bloom", "bloom", hidden_size=48, n_head=4, n_layer=2, vocab_size=1003)  # ALiBi baddbmm
    for folder in (phi, bloom):
        shape = build.resolve(folder).shape
        for s in (8, 16):
            masked = shape.layers * 4 * 48 * s * (s - 1) // 2
            assert flops.forward_flops(shape, [s], "causal-lm")[0] == _eager_count(folder, "causal-lm", s) - masked


def test_an_encoder_still_counts_the_full_square(tmp_path):
    folder = _save(tmp_path, "albert", "albert", "AutoModelForMaskedLM", embedding_size=16, **SIZES)
    shape = build.resolve(folder).shape
    assert flops.forward_flops(shape, [16], "mlm") == (_eager_count(folder, "mlm", 16), "counted")


# --- a checkpoint's backbone under a task class that names it otherwise -----------------------------------------

def test_qa_on_a_llama_checkpoint_loads_its_backbone(tmp_path):
    # Before: LlamaForQuestionAnswering holds its LlamaModel as `transformer.`, a Llama checkpoint as `model.`:
    # transformers loaded none of the checkpoint's tensors (a warning nobody sees) and `--task qa` timed a random
    # backbone, checked against a reference with the same random weights, so nothing said so.
    folder = _save(tmp_path, "llama", "llama", **SIZES, num_key_value_heads=2)
    ref = build.resolve(folder)
    saved = build.build_model(ref, "causal-lm").model.state_dict()
    for task in ("qa", "classification", "base"):
        backbone = build.build_model(ref, task).base_model.state_dict()
        assert backbone.keys() == saved.keys() and all(torch.equal(backbone[k], saved[k]) for k in saved), task


@pytest.mark.slow
def test_every_documented_record_key_is_in_a_cpu_runs_export(tmp_path):
    # docs/records.md lists host_ms, mem_before_mb, sm_clock_mhz, avg_power_w, j_per_seq, seq_stdev and embeddings
    # among the keys every exported record has; a CPU run's JSON had none of the first five (null now: nothing measured).
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    table = (Path(__file__).parents[1] / "docs" / "records.md").read_text()
    keys = re.findall(r"^\| `([a-z_0-9]+)` \|.*\| every record \|$", table, flags=re.M)
    assert {"host_ms", "mem_before_mb", "sm_clock_mhz", "avg_power_w", "j_per_seq", "seq_stdev"} <= set(keys)
    from transbench.store.export import RECORD_KEYS
    assert keys == list(RECORD_KEYS)  # the table lists the export's own keys, in its order
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, "-m", "transbench", "run", "--model", "bert-tiny", "--backend", "sdpa", "--batch",
                    "1", "--seq", "8", "--min-time", "0", "--db", str(tmp_path / "x.db"), "--json", str(out)],
                   check=True, capture_output=True, timeout=300)
    rec = json.loads(out.read_text())["cells"][0]
    assert [k for k in keys if k not in rec] == []


# --- families further afield: mixture of experts, BigBird-like, XLNet, GPT-1, Longformer, not text --------------------

def _save_family(path, family, cls_name="AutoModelForCausalLM", **config):
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, cls_name).from_config(transformers.AutoConfig.for_model(family, **config))
    model.save_pretrained(path / family)
    return str(path / family)


def _family_cell(model, task, backend="eager", cache=None, **kw):
    cell = Cell(model=model, task=task, backend=backend, dtype="fp32", batch=2, seq=16, device="cpu",
                **{**ONE_CALL, "new_tokens": 3, **kw})
    return worker.execute("transbench.scenarios.inference.target:measure", cell.to_dict(), {"models": cache or ModelCache()})


def _torch_count(folder, task, seq, causal):
    """torch's counter over the real model's eager forward of one sequence (experts run one by one: `eager`)."""
    ref = build.resolve(folder)
    model = build.build_model(ref, task, attn="eager")
    if model._can_set_experts_implementation():
        model.set_experts_implementation("eager")
    custom = flops._causal_products(seq) if causal else {}
    with FlopCounterMode(display=False, custom_mapping=custom) as counter, torch.no_grad():
        model(input_ids=torch.randint(3, ref.shape.vocab - 1, (1, seq)))
    return flops.counter_total(counter, model)


# --- mixture of experts: every cell was `error` -------------------------------------------------------------------

MOE = {
    "mixtral": dict(SIZES, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(SIZES, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=32),
}


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe")
    return {family: _save_family(path, family, **config) for family, config in MOE.items()}


@pytest.mark.slow
def test_moe_families_count_every_chosen_expert(moe):
    # Before: the meta copy ran its experts through grouped_mm, whose meta kernel takes bf16 only: "RuntimeError:
    # Expected inputs of BF16 type but got mat_a.dtype=torch.float32", so every cell of Mixtral, Qwen2-MoE, Qwen3-MoE,
    # OLMoE, GraniteMoE, gpt-oss and Jamba was an `error` (torch's counter does not count grouped_mm either).
    for family, folder in moe.items():
        shape = build.resolve(folder).shape
        for task in ("base", "causal-lm"):
            assert flops.forward_flops(shape, [16], task) == (_torch_count(folder, task, 16, True), "counted"), family


@pytest.mark.slow
def test_a_moe_checkpoint_runs_inference_and_generation(moe):
    cache = ModelCache()
    for task, kw in (("causal-lm", {}), ("classification", {"seq_stdev": 4.0}), ("generate", {})):
        for backend in ("eager", "sdpa"):
            r = _family_cell(moe["mixtral"], task, backend, cache, **kw)
            assert r.status == "ok", (task, backend, r.error)
            assert r.record["flops_method"] == "counted" and r.record["tflops"] > 0


# --- families the meta device cannot run: every cell `unsupported` after it was timed ----------------------------

@pytest.mark.slow
@pytest.mark.parametrize("family,config", [
    ("big_bird", dict(SIZES, attention_type="original_full")),
    ("megatron-bert", SIZES),
    ("longformer", dict(SIZES, attention_window=8, pad_token_id=1)),
])
def test_families_the_meta_device_cannot_run_are_counted_on_the_host(tmp_path, family, config):
    # Before: "FLOPs of big_bird: torch's counter cannot run it on the meta device (Tensor.item() cannot be called on
    # meta tensors)" for every cell of BigBird, Canine, Longformer, LUKE, Megatron-BERT, RemBERT, Reformer and XLNet,
    # each after it had been checked and timed.
    folder = _save_family(tmp_path, family, "AutoModelForMaskedLM", **config)
    shape = build.resolve(folder).shape
    for task in ("base", "mlm"):
        assert flops.forward_flops(shape, [16], task) == (_torch_count(folder, task, 16, False), "counted")
    r = _family_cell(folder, "mlm", seq_stdev=4.0)
    assert r.status == "ok", r.error
    assert r.record["flops_method"] == "counted" and r.record["tflops"] > 0


# --- XLNet: refused, and told to fix a config.json that was right ------------------------------------------------

@pytest.fixture(scope="module")
def xlnet(tmp_path_factory):
    return _save_family(tmp_path_factory.mktemp("xlnet"), "xlnet", d_model=48, n_head=4, d_inner=72, n_layer=2,
                 vocab_size=1003)


@pytest.mark.slow
def test_xlnet_has_no_position_limit_and_counts_its_attention_both_ways(xlnet):
    # Before: "config.json sets max_position_embeddings to -1, and it must be a positive integer; fix config.json":
    # the -1 is XLNetConfig's read-only property, transformers' "no sequence length limit", in no config.json.
    shape = build.resolve(xlnet).shape
    assert shape.max_positions == 1 << 20
    # transformers lists XLNet as a causal LM, but its forward attends both ways: no causal half here.
    assert flops.forward_flops(shape, [16], "causal-lm") == (_torch_count(xlnet, "causal-lm", 16, False), "counted")
    cache = ModelCache()
    for task, kw in (("base", {}), ("causal-lm", {"seq_stdev": 4.0})):
        r = _family_cell(xlnet, task, cache=cache, **kw)
        assert r.status == "ok", r.error


@pytest.mark.slow
@pytest.mark.parametrize("family,config", [
    ("openai-gpt", dict(n_embd=48, n_head=4, n_layer=2, vocab_size=1003, n_positions=64)),
    ("xlnet", dict(d_model=48, n_head=4, d_inner=72, n_layer=2, vocab_size=1003)),
])
def test_generation_without_a_kv_cache_is_unsupported(tmp_path, family, config):
    # Before: GPT-1's forward takes no past_key_values and swallowed the cache in its **kwargs: every decode step ran
    # the new token alone, and the cell was `ok` with kv_cache_mb 0.0 and the time of that context-free step.
    folder = _save_family(tmp_path, family, **config)
    for backend in ("eager", "sdpa"):
        r = _family_cell(folder, "generate", backend)
        if backend == "sdpa" and r.status == "unsupported" and "no 'sdpa' attention" in r.error:
            continue
        assert r.status == "unsupported" and "forward takes no KV cache" in r.error, (backend, r.status, r.error)


# --- Longformer's QA head: `error` ---------------------------------------------------------------------------------

def test_longformer_qa_is_unsupported_and_refused_alone(tmp_path):
    # Before: "AssertionError: There should be exactly three separator tokens: 2 in every sample for questions
    # answering", an `error` cell for every backend (random tokens hold no question and context).
    folder = _save_family(tmp_path, "longformer", "AutoModelForMaskedLM", **SIZES, attention_window=8, pad_token_id=1)
    r = _family_cell(folder, "qa")
    assert r.status == "unsupported" and "separator tokens" in r.error, (r.status, r.error)
    with pytest.raises(SpecError, match="LongformerForQuestionAnswering needs a question and a context"):
        build.check_task(build.resolve(folder), "qa")


# --- models that are not text transformers: refused, but told to fix config.json (or run as `error`) -------------

VISION = dict(hidden_size=48, num_attention_heads=4, intermediate_size=72, num_hidden_layers=2, image_size=32,
              patch_size=8)


@pytest.fixture(scope="module")
def not_text(tmp_path_factory):
    path = tmp_path_factory.mktemp("not_text")
    return {
        "vit": _save_family(path, "vit", "AutoModel", **VISION),
        "wav2vec2": _save_family(path, "wav2vec2", "AutoModel", hidden_size=48, num_attention_heads=4, intermediate_size=72,
                          num_hidden_layers=2, vocab_size=32, conv_dim=[16, 16], conv_stride=[5, 2],
                          conv_kernel=[10, 3], num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
        "clip": _save_family(path, "clip", "AutoModel", projection_dim=16, vision_config=VISION,
                      text_config=dict(SIZES, bos_token_id=1, eos_token_id=2, pad_token_id=0)),
        "mamba": _save_family(path, "mamba", hidden_size=48, num_hidden_layers=2, vocab_size=1003, state_size=4),
    }


def test_a_model_that_is_not_a_text_transformer_is_refused_with_why(not_text):
    # Before: vit "transformers cannot read its config.json ('ViTConfig' object has no attribute 'vocab_size'); fix
    # config.json", clip "... no attribute 'hidden_size' ...", mamba "... no attribute 'num_attention_heads' ...", and
    # wav2vec2 passed every check: each of its cells an `error` ("missing ... argument: 'input_values'"), exit 0.
    said = {name: _refusal(folder) for name, folder in not_text.items()}
    assert "vit is not a text model: ViTModel takes pixel_values, not token ids" in said["vit"]
    assert "wav2vec2 is not a text model: Wav2Vec2Model takes input_values, not token ids" in said["wav2vec2"]
    assert "clip is a multimodal model: its config.json nests" in said["clip"]
    assert "mamba has no attention heads" in said["mamba"]
    assert not any("fix config.json" in line for line in said.values()), said


@pytest.mark.slow
def test_cli_refuses_a_non_text_folder_in_one_line_and_stores_nothing(not_text, tmp_path):
    db = tmp_path / "t.db"
    p = subprocess.run([sys.executable, "-m", "transbench", "run", "--model", not_text["wav2vec2"], "--backend",
                        "eager", "--batch", "1", "--seq", "8", "--min-time", "0", "--db", str(db)],
                       capture_output=True, text=True, timeout=300)
    lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert p.returncode == 2 and len(lines) == 1 and "not a text model" in lines[0], (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr and not db.exists()


# --- an end-of-sequence id outside the vocabulary ----------------------------------------------------------------

@pytest.mark.slow
def test_an_eos_id_outside_the_vocabulary_is_not_made_the_padding_id(tmp_path):
    # Before: with no pad_token_id, hf_config made the eos id (Starcoder2's default 50256, in a 1003-token vocabulary)
    # the padding id, and the embedding asserted: "transformers cannot build the model its config.json describes
    # (Padding_idx must be within num_embeddings); fix config.json", for a model transformers itself builds.
    folder = _save_family(tmp_path, "starcoder2", **SIZES, num_key_value_heads=2)
    assert json.loads((tmp_path / "starcoder2" / "config.json").read_text())["eos_token_id"] >= 1003
    r = _family_cell(build.resolve(folder).name, "classification", seq_stdev=4.0)
    assert r.status == "ok", r.error


@pytest.mark.slow
def test_a_one_token_vocabulary_is_refused_in_one_line(tmp_path):
    # Before: every cell was an `error` ("random_ expects 'from' to be less than 'to', but got from=0 >= to=0"): the
    # random tokens skip the padding id, and a vocabulary of one id has no other. A vocabulary of two runs.
    one = _save_family(tmp_path / "one", "bert", "AutoModelForMaskedLM", **{**SIZES, "vocab_size": 1, "hidden_size": 48})
    assert "config.json sets vocab_size to 1, which leaves the random tokens no id but the padding id" in _refusal(one)
    two = _save_family(tmp_path / "two", "gpt2", n_embd=48, n_head=3, n_layer=1, vocab_size=2, n_positions=32)
    r = _family_cell(two, "causal-lm", seq_stdev=4.0)
    assert r.status == "ok", r.error


@pytest.mark.slow
def test_the_fused_backend_refuses_xlnet_as_any_family_it_has_no_loader_for(xlnet):
    # Before: "ValueError: max_seq must be a whole number of at least 1, got -1" (the engine's options read XLNet's
    # max_position_embeddings before the engine looked at the family): an `error` cell for every task.
    for task in ("base", "causal-lm"):
        r = _family_cell(xlnet, task, "fused")
        assert r.status == "unsupported" and "the engine runs bert, roberta" in r.error, (r.status, r.error)


# --- odd but valid shapes, classifier heads, folders transformers builds but cannot run -------------------------------

TRAIN = TrainCell(model="", task="classification", backend="eager", dtype="fp32", optim="sgd", batch=2, seq=8,
                  steps=1, warmup_steps=1, device="cpu")
BERT = dict(num_hidden_layers=2, hidden_size=48, num_attention_heads=4, intermediate_size=37, vocab_size=10,
            max_position_embeddings=32)


def _odd_cell(model, task, backend="eager", **kw):
    cell = Cell(model=model, task=task, backend=backend, dtype="fp32", batch=2, seq=8, device="cpu",
                **{**ONE_CALL, "new_tokens": 3, **kw})
    return worker.execute("transbench.scenarios.inference.target:measure", cell.to_dict(), {"models": ModelCache()})


def _odd_torch_count(folder, task, seq=8, batch=2):
    """torch's counter over the real model's eager forward (a decoder's attention at its causal half)."""
    ref = build.resolve(folder)
    model = build.build_model(ref, task, attn="eager")
    ids = torch.randint(1, ref.shape.vocab, (batch, seq))
    custom = flops._causal_products(seq) if ref.shape.decoder else {}
    with FlopCounterMode(display=False, custom_mapping=custom) as counter, torch.no_grad():
        model(input_ids=ids)
    return flops.counter_total(counter, model)


# --- odd shapes that ran right already: a guard for the checks added below ----------------------------------------

ODD = {
    # hidden 200, 8 heads of 25, FFN 37, 5 ids, one token type
    "bert_h200": ("bert", "AutoModelForMaskedLM", dict(BERT, hidden_size=200, num_attention_heads=8, vocab_size=5,
                                                       type_vocab_size=1)),
    # one layer, one head of 100, 2 ids, no pad id
    "bert_one_head": ("bert", "AutoModel", dict(BERT, num_hidden_layers=1, hidden_size=100, num_attention_heads=1,
                                                vocab_size=2, pad_token_id=None)),
    # head size 1
    "bert_head1": ("bert", "AutoModel", dict(BERT, hidden_size=32, num_attention_heads=32)),
    # GPT-2: heads of 25, untied, FFN 37, both attention options
    "gpt2": ("gpt2", "AutoModelForCausalLM", dict(n_layer=2, n_positions=32, n_embd=100, n_head=4, n_inner=37,
                                                  vocab_size=10, bos_token_id=9, eos_token_id=9,
                                                  tie_word_embeddings=False, scale_attn_by_inverse_layer_idx=True,
                                                  reorder_and_upcast_attn=True)),
    # one kv head, head_dim 40 from hidden 100 / 4 heads
    "llama": ("llama", "AutoModelForCausalLM", dict(BERT, hidden_size=100, num_key_value_heads=1, head_dim=40,
                                                    bos_token_id=1, eos_token_id=2)),
    "gemma": ("gemma", "AutoModelForCausalLM", dict(BERT, hidden_size=100, num_key_value_heads=1, head_dim=40,
                                                    pad_token_id=0, bos_token_id=1, eos_token_id=2)),
}


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    path = tmp_path_factory.mktemp("odd")
    return {name: _save(path, name, family, cls, **config) for name, (family, cls, config) in ODD.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ODD))
def test_odd_shapes_run_with_their_flops_counted_right(odd, name):
    task = "causal-lm" if build.resolve(odd[name]).shape.decoder else "base"
    for backend in ("eager", "sdpa"):
        r = _odd_cell(odd[name], task, backend)
        assert r.status == "ok", (backend, r.error)
        assert r.record["rel_err"] < 1e-5
    assert r.info["flops_per_batch"] == _odd_torch_count(odd[name], task)


# --- classifier checkpoints keep their classes ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    path = tmp_path_factory.mktemp("heads")
    return {
        "regression": _save(path, "regression", "bert", "AutoModelForSequenceClassification", num_labels=1, **BERT),
        "c1000": _save(path, "c1000", "bert", "AutoModelForTokenClassification", num_labels=1000, **BERT),
        "gpt2_c3": _save(path, "gpt2_c3", "gpt2", "AutoModelForSequenceClassification", num_labels=3, n_layer=2,
                         n_positions=32, n_embd=48, n_head=4, vocab_size=10, pad_token_id=None),
        "multi": _save(path, "multi", "bert", "AutoModelForSequenceClassification", num_labels=4,
                       problem_type="multi_label_classification", **BERT),
    }


@pytest.mark.slow
def test_a_regression_head_runs_and_trains(heads):
    # Before: hf_config made every checkpoint of fewer than 2 labels a 2-label model, whose classifier the loader
    # refused ("You set `ignore_mismatched_sizes` to `False`"): every classification cell and train cell an `error`.
    r = _odd_cell(heads["regression"], "classification", seq_stdev=3.0)
    assert r.status == "ok", r.error
    t = training_loop.run(replace(TRAIN, model=heads["regression"]))
    assert t.status == "ok" and t.record["loss_start"] == t.record["loss_start"], t.error


def test_a_multi_label_head_trains(heads):
    # Before: class ids (batch,) into BCEWithLogitsLoss, which wants one float target per class: an `error`.
    t = training_loop.run(replace(TRAIN, model=heads["multi"]))
    assert t.status == "ok", t.error


@pytest.mark.slow
@pytest.mark.parametrize("name", ["c1000", "gpt2_c3"])
def test_a_checkpoints_classes_are_counted(heads, name):
    # Before: the heads were counted with 2 classes: a 1000-class token classifier read 36% of torch's count.
    shape = build.resolve(heads[name]).shape
    for task in ("classification", "token-classification"):
        assert flops.forward_flops(shape, [8, 8], task) == (_odd_torch_count(heads[name], task), "analytic"), task
    r = _odd_cell(heads[name], "token-classification")
    assert r.status == "ok" and r.info["flops_per_batch"] == _odd_torch_count(heads[name], "token-classification")


@pytest.mark.slow
def test_qa_of_a_classifier_checkpoint_has_a_start_and_an_end(heads):
    # Before: BertForQuestionAnswering got the checkpoint's 1000 labels and split them into start and end:
    # "too many values to unpack (expected 2)".
    r = _odd_cell(heads["c1000"], "qa")
    assert r.status == "ok", r.error
    assert r.info["flops_per_batch"] == _odd_torch_count(heads["c1000"], "qa")


# --- a 2-id vocabulary trains --------------------------------------------------------------------------------------

def test_a_two_id_vocabulary_trains(odd):
    # Before: tokens drawn from [1, vocab - 1) = [1, 1): "random_ expects 'from' to be less than 'to'", every
    # train cell of a model that inference ran.
    t = training_loop.run(replace(TRAIN, model=odd["bert_one_head"], task="mlm"))
    assert t.status == "ok", t.error


# --- folders transformers builds but cannot run: refused before anything runs --------------------------------------

def test_a_bert_without_token_types_is_refused_in_one_line(tmp_path):
    # Before: every cell an `error` ("index_select(): self indexing axis dim should be positive"), exit 0.
    folder = _save(tmp_path, "tv0", "bert", "AutoModel", type_vocab_size=0, **BERT)
    assert "sets type_vocab_size to 0" in _refusal(folder)
    refused(invoke("run", "-m", folder, "--seq", "8", "--batch", "1", "--device", "cpu", "--db", tmp_path / "x.db"),
            "type_vocab_size to 0", "set it to 1")
    assert not (tmp_path / "x.db").exists()


def test_a_phi3_with_an_odd_head_size_is_refused_in_one_line(tmp_path):
    # Phi-3 of 4 heads of 25: its config passes transformers' checks, its rotary code pairs the head's dimensions.
    # Before: every cell an `error` ("The size of tensor a (25) must match the size of tensor b (26)").
    folder = _save(tmp_path, "phi3", "phi3", "AutoModelForCausalLM", **dict(BERT, hidden_size=100,
                                                                             num_key_value_heads=1, pad_token_id=9))
    assert "phi3 attention heads of 25 dimensions" in _refusal(folder)
    # DeBERTa needs a mask on the meta device and still resolves (its type_vocab_size 0 builds no embedding)
    build.resolve(_save(tmp_path, "deberta", "deberta-v2", "AutoModel", type_vocab_size=0, relative_attention=True,
                        position_buckets=8, pos_att_type=["p2c", "c2p"], **BERT))


def _odd_rotary(tmp_path, family, head, keep_partial, cls_name, **extra):
    """A checkpoint of 4 heads of `head` dimensions, saved with partial_rotary_factor 0.5 (which transformers 5.24's
    config check lets through) and, without keep_partial, that factor taken out of config.json after: a checkpoint
    transformers 5.17 makes, whose config check passes an odd head."""
    import transformers

    shape = dict(BERT, hidden_size=4 * head, pad_token_id=0, **extra)
    if family != "modernbert":
        shape.update(num_key_value_heads=2)
    config = transformers.AutoConfig.for_model(family, partial_rotary_factor=0.5, **shape)
    torch.manual_seed(0)
    getattr(transformers, cls_name).from_config(config).save_pretrained(tmp_path / family)
    path = tmp_path / family / "config.json"
    cfg = json.loads(path.read_text())
    if not keep_partial:
        for table in (cfg, cfg.get("rope_parameters") or {}):
            table.pop("partial_rotary_factor", None)
    path.write_text(json.dumps(cfg))
    return tmp_path / family


@pytest.mark.parametrize("family, head, keep_partial, given", [
    ("llama", 25, False, "head_dim 25"),  # transformers 5.24 refused its config in its own words ("RoPE requires ...")
    ("llama", 25, True, "head_dim 25"),  # Llama rotates the whole head whatever the factor: a torch broadcast message
    ("llama", 3, False, "head_dim 3"),  # a head of 4 or fewer passes transformers' check, and failed in torch
    ("qwen2", 25, False, "hidden_size 100 / num_attention_heads 4"),  # no head_dim in its config: failed in torch
    ("modernbert", 25, False, "hidden_size 100 / num_attention_heads 4"),
])
def test_an_odd_head_a_rotary_embedding_turns_whole_is_refused_in_our_own_words(tmp_path, family, head, keep_partial,
                                                                              given):
    cls_name = "AutoModelForMaskedLM" if family == "modernbert" else "AutoModelForCausalLM"
    extra = dict(bos_token_id=0, eos_token_id=0, cls_token_id=0, sep_token_id=0) if family == "modernbert" else {}
    folder = _odd_rotary(tmp_path, family, head, keep_partial, cls_name, **extra)
    said = _refusal(folder)
    assert said == (f"checkpoint {folder}: config.json gives {family} attention heads of {head} dimensions ({given}), "
                    "and its rotary position embedding turns a head's dimensions in pairs, so it cannot run an odd "
                    "head size; use an even head size"), said
    db = tmp_path / "x.db"
    refused(invoke("run", "-m", folder, "--seq", "8", "--batch", "1", "--device", "cpu", "--db", db), said)
    assert not db.exists()


@pytest.mark.parametrize("family, kv, given", [("qwen2", None, 32), ("llama", 3, 3), ("mistral", 8, 8)])
def test_query_heads_that_their_key_value_heads_do_not_divide_are_refused_in_one_line(tmp_path, family, kv, given):
    # Before: "transformers builds the model its config.json describes but cannot run it (The size of tensor a (4) must
    # match the size of tensor b (0) ...)": a Qwen2 of 4 heads keeps its class's 32 key/value heads unless told
    shape = dict(BERT, pad_token_id=0, **({} if kv is None else {"num_key_value_heads": kv}))
    folder = _save(tmp_path, family, family, **shape)
    said = _refusal(folder)
    assert said.endswith(f"config.json gives {family} 4 attention heads over {given} key/value heads, and each "
                         "key/value head serves a whole group of query heads; give num_key_value_heads a divisor of "
                         "4"), said
    build.resolve(_save(tmp_path, f"{family}-2", family, **dict(shape, num_key_value_heads=2)))


@pytest.mark.parametrize("family, head", [("llama", 24), ("qwen2", 6), ("phi", 25)])
def test_an_even_head_and_a_partial_rotation_of_an_even_width_resolve(tmp_path, family, head):
    # phi rotates int(25 x 0.5) = 12 of its 25 dimensions and runs; Llama's and Qwen2's even heads run whole
    _odd_rotary(tmp_path, family, head, True, "AutoModelForCausalLM")
    assert build.resolve(str(tmp_path / family)).family == family


@pytest.mark.parametrize("window", [0, -4])
def test_a_mistral_of_no_sliding_window_width_is_refused_in_one_line(tmp_path, window):
    # Mistral masks with sliding_window whenever it is not null: a window of 0 or below builds a mask 1 - w keys
    # short of the sequence, which the two-token check forward fitted; every cell of --seq 3 and up was an `error`
    # ("The size of tensor a (12) must match the size of tensor b (11)"). A window of 1 runs.
    mistral = dict(BERT, num_key_value_heads=2, pad_token_id=0)
    folder = _save(tmp_path, f"w{window}", "mistral", "AutoModelForCausalLM", sliding_window=window, **mistral)
    assert "cannot run it" in _refusal(folder)
    refused(invoke("run", "-m", folder, "--seq", "8", "--batch", "1", "--device", "cpu", "--db", tmp_path / "x.db"),
            "cannot run it")
    build.resolve(_save(tmp_path, "w1", "mistral", "AutoModelForCausalLM", sliding_window=1, **mistral))



@settings(max_examples=6, deadline=None)
@given(family=st.sampled_from(["bert", "roberta", "xlm-roberta", "camembert"]),
       kind=st.sampled_from(["relative_key", "relative_key_query"]))
def test_relative_positions_transformers_no_longer_implements_are_refused(tmp_path_factory, family, kind):
    # Before: transformers 5 builds BERT and its kin with absolute positions whatever position_embedding_type says,
    # and every eager and sdpa cell ran `ok` on a model other than the checkpoint's (fused alone said `unsupported`).
    folder = _save(tmp_path_factory.mktemp("positions"), "relative", family, "AutoModel",
                   position_embedding_type=kind, **dict(BERT, pad_token_id=1))
    said = _refusal(folder)
    assert f"sets position_embedding_type to '{kind}'" in said and "it would run absolute positions" in said, said


def test_absolute_positions_resolve(tmp_path):
    assert build.resolve(str(_saved(tmp_path / "ckpt", _tiny(), position_embedding_type="absolute"))).family == "bert"


@settings(max_examples=6, deadline=None)
@given(family=st.sampled_from(["llama", "qwen2", "mistral"]),
       name=st.text("abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=12).filter(
           lambda n: n not in ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")))
def test_a_rotary_type_transformers_does_not_know_is_named(tmp_path_factory, family, name):
    # Before: "transformers cannot build the model its config.json describes ('foo')": its rotary code's KeyError.
    folder = Path(_save(tmp_path_factory.mktemp("rope"), "rope", family, **dict(BERT, num_key_value_heads=2)))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": name, "rope_theta": 10000.0}
    (folder / "config.json").write_text(json.dumps(cfg))
    said = _refusal(folder)
    assert f"config.json names the rotary embedding type {name!r}, which transformers" in said and "yarn" in said, said


@settings(max_examples=8, deadline=None)
@given(family=st.sampled_from(["llama", "qwen2", "gpt2", "bert"]), setting=st.sampled_from(
    [{"return_dict": False}, {"torchscript": True}]), task=st.sampled_from(["causal-lm", "qa", "classification"]))
def test_a_config_asking_for_tuples_still_runs_every_task(tmp_path_factory, family, setting, task):
    # Before: Llama's causal LM head read its backbone's tuple ("'tuple' object has no attribute
    # 'last_hidden_state'"), every eager and sdpa cell of a config.json of return_dict false an `error`.
    config = dict(n_embd=32, n_layer=1, n_head=2, n_positions=64, vocab_size=10) if family == "gpt2" else \
        dict(BERT, num_key_value_heads=2, pad_token_id=0)
    folder = _save(tmp_path_factory.mktemp("tuples"), "tuples", family, "AutoModel", **config)
    _saved(Path(folder), build.build_model(build.resolve(folder), "base"), **setting)
    if family == "bert" and task == "causal-lm":
        task = "mlm"
    model = build.build_model(build.resolve(folder), task)
    with torch.no_grad():
        out = model(input_ids=torch.randint(1, 10, (2, 5)))
    assert not isinstance(out, tuple) and torch.isfinite(out[0]).all()

# --- mixture-of-experts widths torch's grouped_mm cannot take -----------------------------------------------------

@settings(max_examples=8, deadline=None)
@given(width=st.integers(1, 40), family=st.sampled_from(["mixtral", "qwen2_moe"]))
def test_any_expert_width_runs_as_transformers_computes_it(width, family):
    # Before: an expert width that is not a multiple of 8 kept transformers' grouped_mm route, whose rows must start on
    # 16 bytes: "strides should be multiple of 16 bytes" in every cell, eager included.
    import transformers

    size = "moe_intermediate_size" if family == "qwen2_moe" else "intermediate_size"
    cfg = transformers.AutoConfig.for_model(family, **{**MOE[family], size: width})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, 1003, (2, 5))
    model.set_experts_implementation("eager")
    with torch.no_grad():
        want = model(ids).logits
        model.set_experts_implementation("grouped_mm")
        build._experts_route(model)
        assert torch.allclose(model(ids).logits, want, atol=1e-5)


@settings(max_examples=12, deadline=None)
@given(width=st.integers(1, 40), dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_the_experts_route_chosen_on_the_fp32_model_runs_in_every_dtype_cells_cast_it_to(width, dtype):
    # torch's grouped_mm needs rows on 16 bytes: a multiple of 4 elements in fp32, of 8 in fp16 and bf16. build_model
    # chooses the route on the fp32 model and each cell casts it after: chosen by fp32's multiple, a width of 12, 20
    # or 28 kept grouped_mm and its fp16 and bf16 cells raised "strides should be multiple of 16 bytes".
    import transformers

    cfg = transformers.AutoConfig.for_model("mixtral", **{**MOE["mixtral"], "intermediate_size": width})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.set_experts_implementation("grouped_mm")
    build._experts_route(model)
    ids = torch.randint(0, 1003, (2, 5))
    with torch.no_grad():
        got = model.to(dtype)(ids).logits.float()
        model.set_experts_implementation("eager")
        want = model(ids).logits.float()
    assert torch.allclose(got, want, rtol=0.05, atol=0.05 * want.abs().max().item())


def test_a_moe_checkpoint_of_an_odd_expert_width_runs(tmp_path):
    folder = _save_family(tmp_path, "mixtral", **{**MOE["mixtral"], "intermediate_size": 37, "num_hidden_layers": 1})
    r = _family_cell(folder, "causal-lm")
    assert r.status == "ok" and r.record["rel_err"] < 1e-5, r.error
    assert _family_cell(folder, "causal-lm", "fused").status == "unsupported"


@settings(max_examples=10, deadline=None)
@given(eps=st.one_of(st.floats(max_value=-1e-300, allow_infinity=True, allow_nan=False), st.integers(max_value=-1)),
       cls_name=st.sampled_from(["BertModel", "GPT2Model", "LlamaForCausalLM"]))
def test_a_normalisation_epsilon_below_0_is_refused(tmp_path_factory, eps, cls_name):
    # Before: built and run by transformers, NaN in every output, each cell `wrong` (rel_err inf) with eager too.
    key = {"BertModel": "layer_norm_eps", "GPT2Model": "layer_norm_epsilon"}.get(cls_name, "rms_norm_eps")
    path = tmp_path_factory.mktemp("eps") / "ckpt"
    if eps == float("-inf"):  # not JSON: refused as such before any size is read
        return
    d = _saved(path, _tiny(cls_name), **{key: eps})
    said = _refusal(d)  # an integer is refused by transformers' own type check, naming the field too
    assert f"config.json sets {key} to {eps!r}, and it must be a number of 0 or more" in said or (
        isinstance(eps, int) and f"field '{key}'" in said), said


@settings(max_examples=15, deadline=None)
@given(key=st.sampled_from(["hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                            "vocab_size", "max_position_embeddings", "type_vocab_size", "pad_token_id",
                            "eos_token_id", "rope_scaling"]),
       value=st.integers(min_value=2**63, max_value=10**200) | st.integers(max_value=-(2**63) - 1, min_value=-10**200))
def test_an_integer_past_64_bits_in_config_json_is_refused_in_a_short_line(tmp_path_factory, key, value):
    """torch's refusal of such a size was its C++ stack in the line ("Overflow when unpacking long long Exception
    raised from THPUtils_unpackLong ... frame #"), and a pad_token_id of 2^70 failed every cell, exit 0; the value
    is cut to its start where long, and one nested in an object is named by its path."""
    nested = key == "rope_scaling"
    d = _folder(tmp_path_factory.mktemp("huge"), {**TINY_BERT, key: {"factor": [1, value]} if nested else value})
    with pytest.raises(SpecError) as exc:
        build.resolve(str(d))
    line = str(exc.value)
    where = "rope_scaling.factor[1]" if nested else key
    assert f"config.json sets {where} to " in line and "beyond the 64-bit integers torch holds" in line, line
    assert "frame #" not in line and len(line) < 400, line


@pytest.mark.parametrize("eps", [0.0, 1e-12, 1.0])
def test_a_normalisation_epsilon_of_0_or_more_resolves(tmp_path, eps):
    assert build.resolve(str(_saved(tmp_path / "ckpt", _tiny(), layer_norm_eps=eps))).family == "bert"


@settings(max_examples=30, deadline=None)
@given(text=st.text(max_size=2000))
def test_an_exceptions_message_is_one_line_with_both_ends(text):
    from transbench import boundary

    said = boundary.exception_line(ValueError(text))
    words = boundary.one_line(re.sub(r"\x1b\[[0-9;]*m", "", text))  # ANSI bold dropped, what does not print escaped
    assert said.isprintable() and len(said) <= 300
    assert said == (words or "ValueError") if len(words) <= 300 else said.endswith(words[-145:])


def test_a_config_transformers_refuses_says_why_even_after_a_long_repr(tmp_path):
    # Before: the message, a BertLayer's repr and then the reason, was cut at 300 characters inside the repr.
    d = _saved(tmp_path / "ckpt", _tiny(), add_cross_attention=True)
    assert "should be used as a decoder model if cross attention is added" in _refusal(d)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_checkpoint_whose_own_output_is_not_finite_is_an_error_saying_so(tmp_path, bad):
    # Before: every cell, eager's included, read `wrong` (rel_err inf), blaming the backend for the checkpoint.
    from safetensors.torch import load_file, save_file

    d = tmp_path / "ckpt"
    _tiny().save_pretrained(d)
    weights = load_file(d / "model.safetensors")
    next(v for k, v in weights.items() if k.endswith("query.weight"))[0, 0] = bad
    save_file(weights, d / "model.safetensors", metadata={"format": "pt"})
    for backend in ("eager", "fused"):
        r = _odd_cell(str(d), "base", backend)
        assert r.status == "error" and "fp32 output" in r.error and "not finite" in r.error, (backend, r.error)


@pytest.mark.parametrize("chunk", [3, 5])
def test_a_chunked_ffn_runs_at_any_length(tmp_path, chunk):
    # Before: transformers chunks the FFN only where the length is a multiple of the chunk: at seq 8 every cell was an
    # `error` ("The dimension to be chunked 8 has to be a multiple of the chunk size 3").
    d = _saved(tmp_path / "ckpt", _tiny("BertForMaskedLM"), chunk_size_feed_forward=chunk)
    r = _odd_cell(str(d), "mlm")
    assert r.status == "ok" and r.record["rel_err"] < 1e-5, r.error
    import transformers  # the whole FFN is the chunked one's function, where transformers can chunk

    ids = torch.randint(0, 100, (2, 3 * chunk))
    with torch.no_grad():
        chunked = transformers.BertForMaskedLM.from_pretrained(d).eval()(ids).logits
        whole = build.build_model(build.resolve(str(d)), "mlm")(ids).logits
    assert torch.allclose(chunked, whole, atol=1e-5)
