"""Checkpoint folders of odd shapes (heads of odd sizes, grouped-query attention, one layer, untied embeddings, tiny
vocabularies and position tables, odd FFN widths): every cell runs and passes its correctness check, or is refused in
one line (exit 2, nothing stored) or stored `unsupported` with a one-line reason; never a traceback, torch's shape
message or a `wrong` figure. End to end throughout (a model saved and built per case): the slow tier."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli_input import invoke, refused

from transbench.cells import Cell
from transbench.errors import SpecError
from transbench.models import build
from transbench.runner import worker
from transbench.scenarios.inference import cells as grid
from transbench.scenarios.inference.measure import ModelCache
from transbench.scenarios.inference.spec import RunSpec

pytestmark = pytest.mark.slow

ONE_CALL = dict(min_time=0.0, warmup=0, min_count=1)
# What no cell's reason may hold: torch's words for operands whose shapes do not fit, or a traceback's.
TORCH_SHAPE_WORDS = ("must match the size of tensor", "Attempting to broadcast", "shapes cannot be multiplied",
                     "Traceback", "is invalid for input of size")

# Each family's names for the sizes: (hidden, heads, layers, FFN, vocabulary, positions).
NAMES = {
    "bert": ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
             "max_position_embeddings"),
    "llama": ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
              "max_position_embeddings"),
    "gpt2": ("n_embd", "n_head", "n_layer", "n_inner", "vocab_size", "n_positions"),
}
NAMES["qwen2"] = NAMES["llama"]


def save(folder, family: str, hidden: int, heads: int, layers: int, ffn: int, vocab: int, positions: int,
         tie: bool = True, kv: int | None = None):
    """A checkpoint of random weights, as transformers saves it. A config transformers refuses to build is written by
    hand from a buildable one (what a typo, or another version of transformers, leaves in config.json)."""
    import transformers

    names = NAMES[family]
    sizes = dict(zip(names, (hidden, heads, layers, ffn, vocab, positions)))
    if kv is not None:
        sizes["num_key_value_heads"] = kv
    cls = transformers.AutoModelForCausalLM if family != "bert" else transformers.AutoModelForMaskedLM
    torch.manual_seed(0)
    try:
        config = transformers.AutoConfig.for_model(family, tie_word_embeddings=tie, **sizes)
        cls.from_config(config).save_pretrained(folder)
    except Exception:  # noqa: BLE001 - transformers refuses these sizes: a buildable model, then config.json edited
        base = dict(zip(names, (8, 2, 1, 8, 10, 16)))
        config = transformers.AutoConfig.for_model(family, tie_word_embeddings=tie, **base)
        cls.from_config(config).save_pretrained(folder)
        cfg = json.loads((folder / "config.json").read_text())
        cfg.pop("head_dim", None)
        (folder / "config.json").write_text(json.dumps({**cfg, **sizes}))
    return folder


def check_cell(model: str, task: str, backend: str, seq: int, cache: ModelCache, batch: int = 2):
    """The cell's result through the worker's own path (runner/worker.py), in this process: ok with its check passed,
    or unsupported with a one-line reason of transbench's own."""
    cell = Cell(model=model, task=task, backend=backend, dtype="fp32", batch=batch, seq=seq, device="cpu",
                new_tokens=2, **ONE_CALL)
    r = worker.execute("transbench.scenarios.inference.target:measure", cell.to_dict(), {"models": cache})
    assert r.status in ("ok", "unsupported"), (task, backend, r.status, r.error, r.info.get("traceback", "")[-600:])
    if r.status == "unsupported":
        assert r.error and "\n" not in r.error and not any(w in r.error for w in TORCH_SHAPE_WORDS), r.error
    return r


# Few examples of tiny sizes keep it to seconds a case; 80 ran clean while it was written.
@settings(max_examples=8, deadline=None)
@given(family=st.sampled_from(["bert", "gpt2", "llama", "qwen2"]), heads=st.integers(1, 4), head=st.integers(1, 9),
       kv=st.one_of(st.none(), st.integers(1, 4)), layers=st.integers(1, 2), ffn=st.integers(1, 24),
       vocab=st.integers(1, 12), positions=st.integers(1, 16), seq=st.integers(1, 18), tie=st.booleans(),
       task=st.sampled_from(["base", "classification", "head", "generate"]), backend=st.sampled_from(["eager", "sdpa"]))
def test_a_generated_checkpoint_runs_its_cell_or_is_refused_in_one_line(tmp_path_factory, family, heads, head, kv,
                                                                       layers, ffn, vocab, positions, seq, tie, task,
                                                                       backend):
    folder = save(tmp_path_factory.mktemp("gen") / family, family, heads * head, heads, layers, ffn, vocab, positions,
                  tie, kv=kv if family in ("llama", "qwen2") else None)
    task = {"head": "mlm" if family == "bert" else "causal-lm"}.get(task, task)
    if task == "generate" and family == "bert":
        task = "base"
    spec = RunSpec(models=[str(folder)], tasks=[task], backends=[backend], batches=[2], seqs=[seq], new_tokens=2,
                   device="cpu", dtypes=["fp32"], **ONE_CALL)
    try:
        grid.validate(spec)
    except SpecError as exc:  # refused before any cell: the command line says it in one line, exit 2, stores nothing
        db = tmp_path_factory.mktemp("db") / "t.db"
        tokens = ["--new-tokens", "2"] if task == "generate" else []
        refused(invoke("run", "--model", folder, "--task", task, "--backend", backend, "--batch", "2", "--seq", seq,
                       *tokens, "--device", "cpu", "--db", db), str(exc)[:80])
        assert not db.exists()
        assert not any(w in str(exc) for w in TORCH_SHAPE_WORDS), str(exc)
        return
    check_cell(str(folder), task, backend, seq, ModelCache())


# One checkpoint per family with every odd size at once: heads of 25 dimensions where nothing rotates them (8 heads
# of a hidden 200), of 32 in 6 query heads over 2 key/value heads (3 each) where a rotary embedding turns them whole,
# one layer, an FFN of 37, untied embeddings, a vocabulary of 7 and 16 positions.
ODD = dict(layers=1, ffn=37, vocab=7, positions=16, tie=False)
ODD_FAMILIES = {
    "bert": dict(hidden=200, heads=8), "roberta": dict(hidden=200, heads=8), "distilbert": dict(hidden=200, heads=8),
    "gpt2": dict(hidden=200, heads=8), "llama": dict(hidden=192, heads=6, kv=2),
    "qwen2": dict(hidden=192, heads=6, kv=2),
    "modernbert": dict(hidden=192, heads=6),
}
ENCODER_SIZES = {
    "roberta": NAMES["bert"], "modernbert": NAMES["bert"],
    "distilbert": ("dim", "n_heads", "n_layers", "hidden_dim", "vocab_size", "max_position_embeddings"),
}
# Special ids within a vocabulary of 7: ModernBERT's defaults (50281 and up) build no model of it.
SPECIAL_IDS = {"roberta": dict(pad_token_id=1, bos_token_id=0, eos_token_id=2),
               "modernbert": dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)}
# Every backend a CPU runs, on the family's every task; the slower ones (an ONNX export, the fused engine through
# Triton's interpreter, a compile) on its base task, and the GPU-only ones to see that they say so in one line.
EVERY_TASK = ("eager", "sdpa")
BASE_ONLY = ("sdpa-math", "sdpa-flash", "onnxruntime", "fused", "cudagraph", "sdpa-efficient", "sdpa-cudnn",
             "flash-attn2")


def save_odd(folder, family: str):
    import transformers

    shape = {**ODD, **ODD_FAMILIES[family]}
    names = {**NAMES, **ENCODER_SIZES}[family]
    sizes = dict(zip(names, (shape["hidden"], shape["heads"], shape["layers"], shape["ffn"], shape["vocab"],
                             shape["positions"])))
    if "kv" in shape:
        sizes["num_key_value_heads"] = shape["kv"]
    decoder = family in ("gpt2", "llama", "qwen2")
    cls = transformers.AutoModelForCausalLM if decoder else transformers.AutoModelForMaskedLM
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(family, tie_word_embeddings=False, **sizes,
                                               **SPECIAL_IDS.get(family, {}))
    cls.from_config(config).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("family", sorted(ODD_FAMILIES))
def test_an_odd_checkpoint_runs_or_is_unsupported_in_one_line_on_every_backend_and_task(tmp_path, family):
    folder = save_odd(tmp_path / family, family)
    ref = build.resolve(folder)
    assert ref.shape.max_positions == (14 if family == "roberta" else 16)
    cache = ModelCache()
    ran = {}
    for task in build.family_tasks(ref.family):
        for backend in EVERY_TASK + (BASE_ONLY if task == "base" else ()):
            ran[task, backend] = check_cell(folder, task, backend, 8, cache).status
    assert all(ran[task, b] == "ok" for task in build.family_tasks(ref.family) for b in EVERY_TASK), ran
    # a length past the 16 positions, in a grid with one that fits: that cell alone is `unsupported`
    assert check_cell(folder, "base", "eager", 17, cache).status == "unsupported"
