"""Any transformers family (issue 24) and checkpoint-folder validation (issue 22) on CPU with tiny presets:
every task head each family has through eager and sdpa (compile marked slow), decoders' generation,
the fused engine on RoBERTa, presets that are transformers configs, and each refusal of a bad folder."""

import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from transbench.backends import family_reason, registry
from transbench.cells import Cell
from transbench.errors import SpecError
from transbench.models import build, flops
from transbench.models.presets import PRESETS
from transbench.runner import worker  # noqa: E402
from transbench.scenarios.inference.measure import ModelCache


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


def test_fused_backend_on_roberta_tiny_and_unsupported_elsewhere(cache):
    r = run(cache, "roberta-tiny", "mlm", "fused", seq_stdev=5.0)
    assert r.status == "ok", r.error
    assert r.record["rel_err"] < 1e-5
    r = run(cache, "roberta-tiny", "base", "fused", embeddings=False)
    assert r.status == "ok", r.error
    for model in ("distilbert-tiny", "llama-tiny"):
        r = run(cache, model, "base", "fused")
        assert r.status == "unsupported" and "fused engine runs" not in r.error
        assert "the engine runs bert, roberta" in r.error and "\n" not in r.error


# --- checkpoint folders (issue 22) -------------------------------------------------------------------

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
    ({**TINY_BERT, "model_type": "bertzilla"}, "safetensors", "model_type 'bertzilla' is unknown to transformers"),
    ({**TINY_BERT, "auto_map": {"AutoModel": "modeling_evil.EvilModel"}}, "safetensors", "custom model code"),
    (TINY_BERT, None, "has no weight file"),
])
def test_bad_folders_are_refused(tmp_path, config, weights, needle):
    d = _folder(tmp_path, config, weights)
    with pytest.raises(SpecError, match=needle):
        build.resolve(str(d))


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
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(SpecError, match="weight shard model-00001-of-00002.safetensors .* is missing"):
        build.resolve(str(d))


def test_an_encoder_decoder_folder_is_refused(tmp_path):
    from transformers import T5Config, T5Model

    d = tmp_path / "t5"
    T5Model(T5Config(d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=1, vocab_size=100)).save_pretrained(d)
    with pytest.raises(SpecError, match="t5 is an encoder-decoder family; transbench benchmarks encoders and decoders"):
        build.resolve(str(d))


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
        # a decoder counts the causal half of its attention products (tests/test_families_review.py): the
        # counter's s x s square less the masked upper half, 4 x q x s (s - 1) / 2 with q = 64
        masked = 4 * 64 * 9 * 8 // 2
        assert flops.forward_flops(shape, 9, "causal-lm") == (counter.get_total_flops() - masked, "counted"), name


def test_a_torch_zip_checkpoint_resolves(tmp_path):
    d = _folder(tmp_path, TINY_BERT, weights=None)
    torch.save(build.build_model(build.resolve("bert-tiny"), "base").state_dict(), d / "pytorch_model.bin")
    assert zipfile.is_zipfile(d / "pytorch_model.bin")
    assert build.resolve(str(d)).path


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


def test_a_config_next_to_another_familys_weights_is_refused(tmp_path):
    # Ran `ok`: every GPT-2 weight ignored, a random BERT benchmarked as if it were the checkpoint
    _tiny("GPT2LMHeadModel").save_pretrained(tmp_path / "ckpt")
    _tiny().config.to_json_file(tmp_path / "ckpt" / "config.json")
    assert ("its weights hold none of the tensors of the BertModel that config.json describes (its first is "
            "embeddings.word_embeddings.weight, the files' transformer.h.0.attn.c_attn.bias)"
            ) in _refusal(tmp_path / "ckpt")


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


def test_a_folder_is_checked_once_per_process_until_it_changes(tmp_path, monkeypatch):
    d = _saved(tmp_path / "ckpt", _tiny())
    calls = []
    real = build._resolve_folder
    monkeypatch.setattr(build, "_resolve_folder", lambda folder: calls.append(folder) or real(folder))
    assert build.resolve(str(d)) == build.resolve(str(d)) and len(calls) == 1  # a worker resolves it every cell
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 0}))
    assert "sets num_hidden_layers to 0" in _refusal(d)


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


def test_a_classifier_checkpoint_keeps_its_own_classes(tmp_path, cache):
    # hf_config used to force 2 labels: a 3-label head then failed to load in the cell ("ignore_mismatched_sizes").
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=96,
                     vocab_size=1000, max_position_embeddings=128, num_labels=3)
    BertForSequenceClassification(cfg).save_pretrained(tmp_path / "cls3")
    r = run(cache, str(tmp_path / "cls3"), "classification", "eager")
    assert r.status == "ok", (r.error, r.info.get("traceback"))
    assert r.record["rel_err"] < 1e-5
