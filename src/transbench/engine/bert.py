"""BERT-family encoder: post-LN layers over packed tokens. RoBERTa (and XLM-R and CamemBERT, which reuse its
code) is BERT with positions numbered from padding_idx + 1 (transformers' create_position_ids_from_input_ids).
DistilBERT is BERT without token types (its layers under other names: weights.distilbert_layer)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import EngineBase, check_states
from .config import GELU_KINDS, Dims, EngineConfig, EngineUnsupported
from .ops import hp
from .packing import Packing
from .weights import bert_layer, distilbert_layer


class BertEngine(EngineBase):
    def __init__(self, bert, opts: EngineConfig):
        super().__init__(opts)
        cfg = bert.config
        if getattr(cfg, "is_decoder", False) or getattr(cfg, "add_cross_attention", False):
            raise EngineUnsupported("BERT as a decoder (causal / cross-attention) is not supported")
        if getattr(cfg, "position_embedding_type", "absolute") != "absolute":
            raise EngineUnsupported(f"position_embedding_type={cfg.position_embedding_type!r} is not supported")
        distil = cfg.model_type == "distilbert"
        # DistilBERT names its activation `activation` and its MLP width `hidden_dim`; its LayerNorms' eps is fixed
        # in its code (1e-12), not in its config.
        act = cfg.activation if distil else cfg.hidden_act
        if not isinstance(act, str) or act not in GELU_KINDS:
            raise EngineUnsupported(f"activation {act!r} is not supported (gelu / gelu-tanh only)")
        H, nh = cfg.hidden_size, cfg.num_attention_heads
        ffn, eps = (cfg.hidden_dim, bert.embeddings.LayerNorm.eps) if distil else (cfg.intermediate_size,
                                                                                   cfg.layer_norm_eps)
        # RoBERTa's embeddings carry the padding_idx its positions start after; BERT's have none and start at 0.
        # From token ids RoBERTa numbers positions by the ids (_embed); from inputs_embeds by column + this offset.
        pad = getattr(bert.embeddings, "padding_idx", None)
        self.padding_idx = pad
        self.position_offset = 0 if pad is None else pad + 1
        self.dims = Dims(H, nh, H // nh, cfg.num_hidden_layers, ffn, eps, GELU_KINDS[act], False,
                         cfg.max_position_embeddings - self.position_offset)
        self.check_fp8_dims()
        c, e = self.conv, bert.embeddings
        self.word = c.t(e.word_embeddings.weight)
        self.vocab = self.word.shape[0]
        self.pos = c.t(e.position_embeddings.weight)
        # No token types (DistilBERT): one row of zeros, which the embedding kernel adds to every token.
        self.type = c.t(torch.zeros(1, H) if distil else e.token_type_embeddings.weight)
        self.type_vocab, self.position_rows = self.type.shape[0], self.pos.shape[0]  # what forward's ids index
        self.emb_norm = c.norm(e.LayerNorm)
        blocks, layer = (bert.transformer.layer, distilbert_layer) if distil else (bert.encoder.layer, bert_layer)
        self.layers = [layer(c, block, self.dims.scale) for block in blocks]
        pool = getattr(bert, "pooler", None)
        self.pool = None if pool is None else c.linear(pool.dense.weight, pool.dense.bias)
        # What reads each sequence's first token besides the pooler: a head on top (compiled._engine_for).
        self.first_reader = None if pool is None else "the pooler"

    def _layers(self, x: torch.Tensor, p: Packing) -> torch.Tensor:
        ops, gelu, rows = self.ops, self.dims.gelu, x.shape[0]
        for i, L in enumerate(self.layers):
            # A LayerNorm writes its output in fp8 too only where the GEMM that reads it runs in fp8: fc1 after
            # norm1, the next layer's qkv after norm2 (the last norm2 feeds no GEMM of the stack); attention, given
            # the scales of that e4m3 copy, is offered a route that writes the output projection's e4m3 input
            # (attention.dense). Below ops.fp8_min_rows none does, and an fp8 model's forward is the fp16 one
            # (FP8_MIN_ROWS).
            nxt = self.layers[i + 1].qkv if i + 1 < len(self.layers) else None
            a = self.attend(ops.linear(x, L.qkv), p, L.scale, causal=False, bound=ops.attention_bound(x, L.qkv, L.out))
            x = ops.linear_add_layernorm(a, L.out, hp(x), L.norm1, quant=ops.fp8(L.fc1, rows))
            x = ops.linear_add_layernorm(ops.linear_gelu(x, L.fc1, gelu), L.fc2, hp(x), L.norm2,
                                         quant=nxt is not None and ops.fp8(nxt, rows))
        return hp(x)

    def _embed(self, p: Packing, ids, embeds, token_type_ids, position_ids) -> torch.Tensor:
        n = self.emb_norm
        if embeds is None:  # one fused gather + sum + LayerNorm (ops.embed_layernorm)
            pos = None  # None: each token's index in its sequence, computed in the kernel
            if position_ids is None and self.padding_idx is not None:
                # RoBERTa: transformers' create_position_ids_from_input_ids, from the ids, not the columns: a
                # non-pad token's count of non-pad tokens up to it + padding_idx, a pad id's padding_idx. Column +
                # offset was silently wrong for left padding and for a real token equal to the pad id.
                real = ids.ne(self.padding_idx)
                position_ids = real.cumsum(1) * real + self.padding_idx
            if position_ids is not None or not p.dense:
                pos = self.positions(p, position_ids, self.word.device)
            return self.ops.embed_layernorm(self.take(ids, p).contiguous(), self.word, pos, self.pos,
                                            self.take(token_type_ids, p), self.type, n, p.S)
        x = self.take(embeds, p)
        pos = self.positions(p, position_ids, self.word.device)
        r = F.embedding(pos if position_ids is not None else pos + self.position_offset, self.pos)
        r = r + (self.type[0] if token_type_ids is None else F.embedding(self.take(token_type_ids, p), self.type))
        return self.ops.add_layernorm(x.contiguous(), r, None, n.weight, n.bias, n.eps)

    def packing(self, mask, B: int, S: int) -> Packing:
        p = super().packing(mask, B, S)
        if p.first_padded and self.first_reader:
            # The pooler (or a head: RoBERTa's and DistilBERT's classifiers) reads each sequence's first position,
            # which transformers computes (a padding query still attends to the real tokens) but packing never
            # does: the pooler's output there was tanh(bias), and RobertaForSequenceClassification's logits read
            # rel_err 0.85 on left padding, silently.
            fix = (" or build the model without its pooler (add_pooling_layer=False)" if self.first_reader ==
                   "the pooler" else "")
            raise EngineUnsupported(f"{self.first_reader} reads each sequence's first token, and the attention_mask "
                                    f"pads it (left padding or an all-padding row); pad on the right{fix}")
        return p

    def _outputs(self, x: torch.Tensor, p: Packing):
        """(last hidden state, pooler output or None): HF's pooler (tanh of a dense layer on each sequence's first
        token) runs inside the captured graph, not as separate launches after it."""
        h = self.unpack(x, p)
        return h, None if self.pool is None else torch.tanh(self.ops.linear(h[:, 0].contiguous(), self.pool))

    def _forward(self, p: Packing, ids, embeds, token_type_ids, position_ids):
        return self._outputs(self._layers(self._embed(p, ids, embeds, token_type_ids, position_ids), p), p)

    def _encode(self, p: Packing, hidden):
        return self._outputs(self._layers(self.take(hidden, p).contiguous(), p), p)

    def encode(self, hidden_states: torch.Tensor, attention_mask=None):
        """(last hidden state, pooler output or None) of the encoder layers on already-embedded states."""
        check_states(hidden_states, "hidden_states", self.dims.hidden)
        h = hidden_states.to(self.opts.device, self.opts.dtype)
        B, S = h.shape[:2]
        self.check_shape(B, S)
        p = self.packing(attention_mask, B, S)
        return self.graphs(("enc", B, S, p.dense, p.tokens), self._encode, p, h)
