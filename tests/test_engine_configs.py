"""The fused engine on odd but legal transformers configs and inputs (CPU, fp32): each either matches transformers
or is refused with one clear reason (EngineUnsupported; the fused backend's `unsupported`), never silently
different numbers or a crash."""

import pytest
import torch
from transformers import (BertConfig, BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                          BertModel, DistilBertConfig, DistilBertForMaskedLM, DistilBertForMultipleChoice,
                          DistilBertForQuestionAnswering, DistilBertForSequenceClassification,
                          DistilBertForTokenClassification, DistilBertModel, GPT2Config, GPT2DoubleHeadsModel,
                          GPT2ForSequenceClassification, GPT2LMHeadModel, GPT2Model,
                          RobertaConfig, RobertaForMaskedLM, RobertaForSequenceClassification, RobertaModel)

from transbench.engine import EngineUnsupported, compile_model

VOCAB = 200
PAD = 1  # RoBERTa's pad id


def rel(out, ref, mask=None):
    out, ref = out.double(), ref.double()
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    return ((out - ref).norm() / ref.norm()).item()


def bert(cls=BertModel, **kw):
    return cls(BertConfig(**{**dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=32), **kw}))


def roberta(cls=RobertaModel, *args, **kw):
    return cls(RobertaConfig(**{**dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=34,
                                       pad_token_id=PAD), **kw}), *args)


def distilbert(cls=DistilBertModel, **kw):
    return cls(DistilBertConfig(**{**dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=VOCAB,
                                          max_position_embeddings=32), **kw}))


def gpt2(cls=GPT2Model, **kw):
    return cls(GPT2Config(**{**dict(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=32,
                                    bos_token_id=0, eos_token_id=0, pad_token_id=0), **kw}))


def ids_mask(B=3, S=11, left=False, pad_id=0):
    """Token ids never equal to PAD or 0, and a mask of lengths S, S - 4, 3; padding positions hold pad_id."""
    ids = torch.randint(2, VOCAB, (B, S))
    mask = torch.ones(B, S, dtype=torch.long)
    for b, n in enumerate([S, S - 4, 3][:B]):
        if left:
            mask[b, : S - n] = 0
        else:
            mask[b, n:] = 0
    return ids.masked_fill(mask == 0, pad_id), mask


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _with_labels(ids_and_mask, ignore_padding=True):
    """The call's arguments with labels = the ids, -100 (ignored by transformers' losses) at padding if asked."""
    ids, mask = ids_and_mask
    return dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100) if ignore_padding else ids)


def _left_padded():
    return ids_mask(left=True, pad_id=PAD)


def _pad_id_inside():
    ids, _ = ids_mask()
    ids[0, 4] = PAD  # a real token that is the pad id: RoBERTa numbers the positions after it one lower
    return ids, None


MATCH = {
    # odd shapes and options that the engine runs
    "bert-head-size-25": (lambda: bert(hidden_size=200, num_attention_heads=8, intermediate_size=300), ids_mask),
    "bert-1-head-1-layer": (lambda: bert(num_attention_heads=1, num_hidden_layers=1, intermediate_size=40), ids_mask),
    "bert-tanh-gelu-eps": (lambda: bert(hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-3), ids_mask),
    "bert-one-token-type": (lambda: bert(type_vocab_size=1), ids_mask),
    "gpt2-head-size-25-n_inner": (lambda: gpt2(n_embd=200, n_head=8, n_inner=100), ids_mask),
    "gpt2-unscaled-reordered": (lambda: gpt2(scale_attn_weights=False, scale_attn_by_inverse_layer_idx=True,
                                             reorder_and_upcast_attn=True), ids_mask),
    "gpt2-left-padding": (lambda: gpt2(GPT2LMHeadModel, activation_function="gelu_pytorch_tanh"),
                          lambda: ids_mask(left=True)),
    # RoBERTa numbered positions by column + padding_idx + 1, not from the ids as transformers does: left padding
    # read rel_err 0.5, a real token equal to the pad id 0.4
    "roberta-left-padding": (lambda: roberta(RobertaModel, False), _left_padded),
    "roberta-mlm-left-padding": (lambda: roberta(RobertaForMaskedLM), _left_padded),
    "roberta-pad-id-token": (lambda: roberta(), _pad_id_inside),
    "roberta-pad-id-7": (lambda: roberta(RobertaModel, False, pad_token_id=7, max_position_embeddings=40),
                         lambda: ids_mask(left=True, pad_id=7)),
    # DistilBERT: BERT's layers under other names, no token types, its own MLP width and activation fields
    "distilbert-left-padding": (distilbert, lambda: ids_mask(left=True)),
    "distilbert-head-size-25": (lambda: distilbert(dim=200, n_heads=8, hidden_dim=300), ids_mask),
    "distilbert-sinusoidal-positions": (lambda: distilbert(sinusoidal_pos_embds=True, n_layers=1), ids_mask),
    "distilbert-mlm-left-padding": (lambda: distilbert(DistilBertForMaskedLM), lambda: ids_mask(left=True)),
    "distilbert-classifier": (lambda: distilbert(DistilBertForSequenceClassification, num_labels=3), ids_mask),
    "distilbert-qa-left-padding": (lambda: distilbert(DistilBertForQuestionAnswering), lambda: ids_mask(left=True)),
    "distilbert-token-classifier": (lambda: distilbert(DistilBertForTokenClassification), ids_mask),
    # losses over a padded batch that read real positions only: labels -100 at (MLM) or after (causal LM) padding
    "bert-mlm-loss-padding-ignored": (lambda: bert(BertForMaskedLM), lambda: _with_labels(ids_mask())),
    "gpt2-lm-loss-padding-ignored": (lambda: gpt2(GPT2LMHeadModel), lambda: _with_labels(ids_mask())),
    "bert-qa-loss-no-padding": (lambda: bert(BertForQuestionAnswering), lambda: dict(
        input_ids=ids_mask()[0], start_positions=torch.tensor([1, 2, 3]), end_positions=torch.tensor([4, 5, 6]))),
}


@pytest.mark.parametrize("name", MATCH)
def test_engine_matches_transformers(name):
    build, inputs = MATCH[name]
    model = build().eval()
    kw = inputs()  # (ids, mask), or the call's arguments
    kw = kw if isinstance(kw, dict) else dict(zip(("input_ids", "attention_mask"), kw))
    mask = kw.get("attention_mask")
    compiled = compile_model(model, dtype=torch.float32)
    with torch.no_grad():
        ref = model(**kw)
    out = compiled(**kw)
    for key, r in ref.items():  # every output: hidden states, pooler, logits, QA's start/end logits, the loss
        if not isinstance(r, torch.Tensor):
            continue  # GPT-2's past_key_values: the engine's generator() keeps its own cache
        per_token = mask is not None and r.shape[:mask.dim()] == mask.shape
        assert rel(out[key], r, mask if per_token else None) < 1e-5, key


REFUSED_CONFIGS = {
    "bert-relu": (lambda: bert(hidden_act="relu"), "activation 'relu'"),
    "distilbert-relu": (lambda: distilbert(activation="relu"), "activation 'relu'"),
    "gpt2-silu": (lambda: gpt2(activation_function="silu"), "activation 'silu'"),
    "gpt2-quick-gelu": (lambda: gpt2(activation_function="quick_gelu"), "activation 'quick_gelu'"),
    "bert-relative-key": (lambda: bert(position_embedding_type="relative_key_query"), "position_embedding_type"),
    "bert-decoder": (lambda: bert(is_decoder=True), "BERT as a decoder"),
    "gpt2-cross-attention": (lambda: gpt2(add_cross_attention=True), "cross-attention"),
    # crashed on its (batch, choices, seq) ids; its head reads the last position, padding in a padded batch
    "gpt2-double-heads": (lambda: gpt2(GPT2DoubleHeadsModel), "GPT2DoubleHeadsModel is not supported"),
}


@pytest.mark.parametrize("name", REFUSED_CONFIGS)
def test_fused_backend_refuses_configs_with_the_reason(name):
    from transbench.backends import fused
    from transbench.cells import Cell
    from transbench.errors import Unsupported

    build, reason = REFUSED_CONFIGS[name]
    with pytest.raises(Unsupported, match=reason):
        fused._compile(build().eval(), Cell("tiny", "base", "fused", "fp32", 1, 8))


def _all_padding_row():
    ids, mask = ids_mask()
    mask[2] = 0
    return ids, mask


REFUSED_INPUTS = {
    # The pooler reads each sequence's first position; packing never computes a padding one, so the engine's
    # pooler output there was tanh(bias): BERT classification logits of a left-padded batch read rel_err 0.8.
    "bert-classifier-left-padding": (lambda: bert(BertForSequenceClassification), lambda: ids_mask(left=True),
                                     "pooler reads each sequence's first token"),
    "roberta-pooler-left-padding": (roberta, _left_padded, "pooler reads each sequence's first token"),
    "bert-pooler-all-padding-row": (bert, _all_padding_row, "pooler reads each sequence's first token"),
    # Heads without a pooler that read the first token too: RoBERTa's classifier read rel_err 0.85 on left padding
    "roberta-classifier-left-padding": (lambda: roberta(RobertaForSequenceClassification), _left_padded,
                                        "RobertaForSequenceClassification's head reads each sequence's first token"),
    "distilbert-classifier-left-padding": (lambda: distilbert(DistilBertForSequenceClassification),
                                           lambda: ids_mask(left=True), "DistilBertForSequenceClassification's head"),
    "distilbert-classifier-all-padding-row": (lambda: distilbert(DistilBertForSequenceClassification),
                                              _all_padding_row, "reads each sequence's first token"),
    # transformers takes a 4-D mask as additive biases; read as a padding mask it gave rel_err 0.6
    "bert-4d-mask": (bert, lambda: (ids_mask()[0], ids_mask()[1][:, None, None, :].float()), "4-D attention_mask"),
    "gpt2-4d-mask": (gpt2, lambda: (ids_mask()[0], ids_mask()[1][:, None, None, :].float()), "4-D attention_mask"),
    # GPT2ForSequenceClassification reads each sequence's last token whose id is not pad_token_id (the last position
    # from inputs_embeds): padding here, where the engine returns zeros; its logits read rel_err 0.76 and 0.93
    "gpt2-classifier-pad-id-not-padding": (lambda: gpt2(GPT2ForSequenceClassification, num_labels=3, pad_token_id=5),
                                           ids_mask, "last token whose id is not pad_token_id 5"),
    "gpt2-classifier-inputs-embeds": (lambda: gpt2(GPT2ForSequenceClassification, num_labels=3),
                                      lambda: dict(inputs_embeds=torch.randn(3, 11, 32), attention_mask=ids_mask()[1]),
                                      "last position \\(from inputs_embeds"),
    # A loss reads the logits at padding positions that its labels name (question answering's softmax: every
    # position), which the engine does not compute: gpt2's LM loss read rel_err 3e-2, BERT QA's 1.4e-2.
    "gpt2-lm-loss-on-padding": (lambda: gpt2(GPT2LMHeadModel), lambda: _with_labels(ids_mask(), False),
                                "GPT2LMHeadModel's loss reads the logits at padding positions"),
    # causal: the last padding position's logits are scored against the first real token
    "gpt2-lm-loss-left-padding": (lambda: gpt2(GPT2LMHeadModel), lambda: _with_labels(ids_mask(left=True)),
                                  "set the labels after padding to -100"),
    "bert-mlm-loss-on-padding": (lambda: bert(BertForMaskedLM), lambda: _with_labels(ids_mask(), False),
                                 "set the labels at padding to -100"),
    "distilbert-token-classifier-loss": (lambda: distilbert(DistilBertForTokenClassification),
                                         lambda: dict(zip(("input_ids", "attention_mask"), ids_mask()),
                                                      labels=torch.zeros(3, 11, dtype=torch.long)),
                                         "DistilBertForTokenClassification's loss reads the logits at padding"),
    "bert-qa-loss-padded": (lambda: bert(BertForQuestionAnswering), lambda: dict(
        zip(("input_ids", "attention_mask"), ids_mask()), start_positions=torch.tensor([1, 2, 0]),
        end_positions=torch.tensor([3, 4, 1])), "BertForQuestionAnswering's loss softmaxes every position"),
}


@pytest.mark.parametrize("name", REFUSED_INPUTS)
def test_inputs_the_engine_cannot_match_are_refused(name):
    build, inputs, reason = REFUSED_INPUTS[name]
    compiled = compile_model(build().eval(), dtype=torch.float32)
    kw = inputs()  # (ids, mask), or the call's arguments
    kw = kw if isinstance(kw, dict) else dict(zip(("input_ids", "attention_mask"), kw))
    with pytest.raises(EngineUnsupported, match=reason):
        compiled(**kw)
    with pytest.raises(EngineUnsupported, match=reason):  # a fixed call (a benchmark's) too
        compiled.fixed_call(**kw)()


def test_a_fixed_call_gives_what_a_call_gives():
    model = gpt2(GPT2ForSequenceClassification, num_labels=3).eval()
    ids, mask = ids_mask()
    compiled = compile_model(model, dtype=torch.float32)
    assert torch.equal(compiled.fixed_call(input_ids=ids, attention_mask=mask)().logits,
                       compiled(input_ids=ids, attention_mask=mask).logits)


def test_left_padding_without_a_pooler_still_runs():
    model = BertModel(bert().config, add_pooling_layer=False).eval()
    ids, mask = ids_mask(left=True)
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).last_hidden_state
    out = compile_model(model, dtype=torch.float32)(ids, attention_mask=mask)
    assert out.pooler_output is None and rel(out.last_hidden_state, ref, mask) < 1e-5


@pytest.mark.parametrize("case", ["ids-pad-matches", "ids-pad-not-in-vocab", "inputs-embeds"])
def test_fused_backend_refuses_a_gpt2_classifier_reading_padding(case):
    # GPT2ForSequenceClassification reads each sequence's last token whose id is not pad_token_id (the last position
    # from inputs_embeds): padding, where the engine returns zeros. `run --task classification --seq-stdev 4` on a
    # gpt2 checkpoint whose pad_token_id is outside its vocabulary, or with --encoders-only, read `wrong` (0.92).
    from transbench.backends import fused
    from transbench.cells import Cell
    from transbench.errors import Unsupported
    from transbench.scenarios.inputs import make_inputs

    model = gpt2(GPT2ForSequenceClassification, num_labels=3,
                 pad_token_id=VOCAB + 5 if case == "ids-pad-not-in-vocab" else 0).eval()
    inputs = make_inputs(VOCAB, 3, 12, pad_id=0, stdev=4.0, max_len=24, seed=0)
    assert inputs.attention_mask is not None and inputs.attention_mask[:, -1].min() == 0
    if case == "inputs-embeds":
        inputs.inputs_embeds = model.get_input_embeddings()(inputs.input_ids).detach()
    with torch.no_grad():
        ref = model(**inputs.model_kwargs()).logits
    cell = Cell("tiny", "classification", "fused", "fp32", 3, 18, embeddings=case != "inputs-embeds")
    if case == "ids-pad-matches":
        assert rel(fused.BACKEND.prepare(model, inputs, cell).fn().logits, ref) < 1e-5
    else:
        with pytest.raises(Unsupported, match="classification head reads each sequence's last"):
            fused.BACKEND.prepare(model, inputs, cell)


@pytest.mark.parametrize("kw, needle", [
    ({"max_batch": "8"}, "max_batch must be a whole number"),  # failed at the first call with a TypeError
    ({"max_batch": 2.5}, "max_batch must be a whole number"),  # was taken
    ({"max_batch": 0}, "max_batch must be a whole number"),  # failed at the first call
    ({"max_seq": -1}, "max_seq must be a whole number"),
    ({"max_seq": 0}, "max_seq must be a whole number"),
    ({"fp8": "yes"}, "fp8 must be True or False"),  # was taken as fp16
    ({"cuda_graphs": "no"}, "cuda_graphs must be True or False"),  # was taken as True
    ({"tune_budget_s": -1}, "tune_budget_s must be None or a finite number"),
    ({"tune_budget_s": float("nan")}, "tune_budget_s must be None or a finite number"),
    ({"device": "tpu"}, "device 'tpu' is not a torch device"),
])
def test_compile_model_checks_its_arguments(kw, needle):
    m = BertModel(BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=1,
                             vocab_size=100)).eval()
    with pytest.raises(ValueError, match=needle):
        compile_model(m, torch.float32, **kw)


def test_compile_model_takes_its_documented_arguments():
    # the checks refuse nothing good: max_seq past the model's positions is cut to them, None budget means none
    m = BertModel(BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=1,
                             vocab_size=100, max_position_embeddings=32)).eval()
    c = compile_model(m, torch.float32, max_batch=2, max_seq=1000, cuda_graphs=False, tune_budget_s=None,
                      device="cpu")
    out = c(input_ids=torch.randint(0, 100, (2, 32)))
    assert out.last_hidden_state.shape == (2, 32, 64)
    with pytest.raises(ValueError, match="exceeds"):
        c(input_ids=torch.randint(0, 100, (1, 33)))


@pytest.mark.parametrize("name", ["gpt2", "distilbert"])
def test_positional_arguments_are_read_in_the_backbones_order(name):
    # GPT2Model takes `cache` second and DistilBertModel `inputs_embeds` third: read in BertModel's order,
    # GPT2Model(ids, None, mask) took the mask as token types (rel_err 0.58, silently)
    model = (gpt2() if name == "gpt2" else distilbert()).eval()
    ids, mask = ids_mask()
    args = (ids, None, mask) if name == "gpt2" else (None, mask, model.get_input_embeddings()(ids).detach())
    with torch.no_grad():
        ref = model(*args).last_hidden_state
    assert rel(compile_model(model, dtype=torch.float32)(*args).last_hidden_state, ref, mask) < 1e-5


def test_a_bare_model_of_return_dict_false_returns_a_tuple():
    # as transformers' does: the ModelOutput returned instead unpacked into its keys' names (h, pooled = model(ids))
    model = bert(return_dict=False).eval()
    ids, mask = ids_mask()
    with torch.no_grad():
        ref = model(ids, attention_mask=mask)
    out = compile_model(model, dtype=torch.float32)(ids, attention_mask=mask)
    assert type(out) is tuple and len(out) == len(ref) and rel(out[1], ref[1]) < 1e-5


@pytest.mark.parametrize("field", ["output_hidden_states", "output_attentions"])
@pytest.mark.parametrize("make", [lambda **kw: bert(**kw), lambda **kw: gpt2(GPT2LMHeadModel, **kw)],
                         ids=["bert", "gpt2-lm"])
def test_outputs_a_config_asks_for_are_refused_as_the_same_arguments_are(field, make):
    """A config that sets output_hidden_states answers a call without it with every layer's states, as transformers
    reads it; the engine returned its ModelOutput without them (a tuple one element short), where the argument itself
    is refused. The call that turns it off is run."""
    model = make(**{field: True}).eval()
    ids, mask = ids_mask()
    compiled = compile_model(model, dtype=torch.float32)
    with pytest.raises(EngineUnsupported, match=f"{field} \\(the model's config sets it: pass False\\)"):
        compiled(ids, attention_mask=mask)
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, **{field: False})[0]
    assert rel(compiled(ids, attention_mask=mask, **{field: False})[0], ref, mask) < 1e-5
