"""Third review of checkpoint folders (CPU, tiny random-weight folders built here): odd but valid shapes (hidden
sizes that are no multiple of 8, head sizes 1/25/96, one head, one layer, narrow or odd FFNs, vocabularies of 2-10
ids, grouped-query attention with one key/value head and a head_dim of its own, classifier heads of 1 and 1000
classes, problem types) and configs transformers builds but cannot run. Each test after the first failed before
the fix it names."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from test_cli_input import invoke, refused
from test_families_review import _save
from test_families_review2 import _refusal
from transbench.cells import Cell
from transbench.errors import SpecError
from transbench.models import build, flops
from transbench.runner import worker
from transbench.scenarios.training import loop as training_loop
from transbench.scenarios.inference.measure import ModelCache
from transbench.scenarios.training.cell import TrainCell

FAST = dict(min_time=0.0, warmup=0, min_count=1)
TRAIN = TrainCell(model="", task="classification", attn="eager", precision="fp32", optim="sgd", batch=2, seq=8,
                  steps=1, warmup_steps=1, device="cpu")
BERT = dict(num_hidden_layers=2, hidden_size=48, num_attention_heads=4, intermediate_size=37, vocab_size=10,
            max_position_embeddings=32)


def _cell(model, task, backend="eager", **kw):
    cell = Cell(model=model, task=task, backend=backend, dtype="fp32", batch=2, seq=8, device="cpu",
                **{**FAST, "new_tokens": 3, **kw})
    return worker.execute("transbench.scenarios.inference.target:measure", cell.to_dict(), {"models": ModelCache()})


def _torch_count(folder, task, seq=8, batch=2):
    """torch's counter over the real model's eager forward (a decoder's attention at its causal half)."""
    ref = build.resolve(folder)
    model = build.build_model(ref, task, attn="eager")
    ids = torch.randint(1, ref.shape.vocab, (batch, seq))
    custom = flops._causal_products(seq) if ref.shape.decoder else {}
    with FlopCounterMode(display=False, custom_mapping=custom) as counter, torch.no_grad():
        model(input_ids=ids)
    return counter.get_total_flops()


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


@pytest.mark.parametrize("name", list(ODD))
def test_odd_shapes_run_with_their_flops_counted_right(odd, name):
    task = "causal-lm" if build.resolve(odd[name]).shape.decoder else "base"
    for backend in ("eager", "sdpa"):
        r = _cell(odd[name], task, backend)
        assert r.status == "ok", (backend, r.error)
        assert r.record["rel_err"] < 1e-5
    assert r.info["flops_per_batch"] == _torch_count(odd[name], task)


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


def test_a_regression_head_runs_and_trains(heads):
    # Before: hf_config made every checkpoint of fewer than 2 labels a 2-label model, whose classifier the loader
    # refused ("You set `ignore_mismatched_sizes` to `False`"): every classification cell and train cell an `error`.
    r = _cell(heads["regression"], "classification", seq_stdev=3.0)
    assert r.status == "ok", r.error
    t = training_loop.run(replace(TRAIN, model=heads["regression"]))
    assert t.status == "ok" and t.record["loss_start"] == t.record["loss_start"], t.error


def test_a_multi_label_head_trains(heads):
    # Before: class ids (batch,) into BCEWithLogitsLoss, which wants one float target per class: an `error`.
    t = training_loop.run(replace(TRAIN, model=heads["multi"]))
    assert t.status == "ok", t.error


@pytest.mark.parametrize("name", ["c1000", "gpt2_c3"])
def test_a_checkpoints_classes_are_counted(heads, name):
    # Before: the heads were counted with 2 classes: a 1000-class token classifier read 36% of torch's count.
    shape = build.resolve(heads[name]).shape
    for task in ("classification", "token-classification"):
        assert flops.forward_flops(shape, [8, 8], task) == (_torch_count(heads[name], task), "analytic"), task
    r = _cell(heads[name], "token-classification")
    assert r.status == "ok" and r.info["flops_per_batch"] == _torch_count(heads[name], "token-classification")


def test_qa_of_a_classifier_checkpoint_has_a_start_and_an_end(heads):
    # Before: BertForQuestionAnswering got the checkpoint's 1000 labels and split them into start and end:
    # "too many values to unpack (expected 2)".
    r = _cell(heads["c1000"], "qa")
    assert r.status == "ok", r.error
    assert r.info["flops_per_batch"] == _torch_count(heads["c1000"], "qa")


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
    assert "cannot run it" in _refusal(folder)
    # DeBERTa needs a mask on the meta device and still resolves (its type_vocab_size 0 builds no embedding)
    build.resolve(_save(tmp_path, "deberta", "deberta-v2", "AutoModel", type_vocab_size=0, relative_attention=True,
                        position_buckets=8, pos_att_type=["p2c", "c2p"], **BERT))
