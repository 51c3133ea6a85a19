"""GPT-2-family decoder: pre-LN causal layers, and greedy-decoding support with a static KV cache."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention import Packing, attention
from .base import EngineBase
from .config import GELU_KINDS, Dims, EngineOptions, EngineUnsupported
from .graphs import GraphCache
from .ops import Linear
from .weights import gpt2_layer


class GPT2Engine(EngineBase):
    def __init__(self, gpt2, opts: EngineOptions, lm_head_weight: torch.Tensor | None = None):
        super().__init__(opts)
        cfg = gpt2.config
        if getattr(cfg, "add_cross_attention", False):
            raise EngineUnsupported("GPT-2 with cross-attention is not supported")
        if cfg.activation_function not in GELU_KINDS:
            raise EngineUnsupported(f"activation {cfg.activation_function!r} is not supported (gelu / gelu-tanh only)")
        H, nh = cfg.hidden_size, cfg.num_attention_heads
        ffn = cfg.n_inner or 4 * H
        self.dims = Dims(H, nh, H // nh, cfg.num_hidden_layers, ffn, cfg.layer_norm_epsilon,
                         GELU_KINDS[cfg.activation_function], True, cfg.max_position_embeddings)
        self.check_fp8_dims()
        c = self.conv
        self.wte, self.wpe = c.t(gpt2.wte.weight), c.t(gpt2.wpe.weight)
        self.ln_f = c.norm(gpt2.ln_f)
        # Same factors as HF's GPT2Attention.scaling.
        scales = [(self.dims.scale if cfg.scale_attn_weights else 1.0)
                  / (i + 1 if cfg.scale_attn_by_inverse_layer_idx else 1) for i in range(cfg.num_hidden_layers)]
        self.layers = [gpt2_layer(c, b, s) for b, s in zip(gpt2.h, scales)]
        # GPT-2 ties its LM head to wte; a separate head weight (if any) is converted like the rest.
        head = self.wte if lm_head_weight is None or lm_head_weight is gpt2.wte.weight else c.t(lm_head_weight)
        self.head = Linear(head, None)  # not fp8: logits keep the activation dtype's precision

    def _norm_next(self, i: int):
        return self.layers[i + 1].norm1 if i + 1 < len(self.layers) else self.ln_f

    def _blocks(self, x: torch.Tensor, attend) -> torch.Tensor:
        """Pre-LN stack; each projection's bias + residual add is fused with the following LayerNorm.

        `attend(i, qkv) -> context` is the only difference between full-sequence and decode steps."""
        ops, gelu = self.ops, self.dims.gelu
        n = self.layers[0].norm1
        h = ops.add_layernorm(x, None, None, n.weight, n.bias, n.eps)
        for i, L in enumerate(self.layers):
            h, x = ops.linear_add_layernorm(attend(i, ops.linear(h, L.qkv)), L.out, x, L.norm2, store_residual=True)
            h, x = ops.linear_add_layernorm(ops.linear_gelu(h, L.fc1, gelu), L.fc2, x, self._norm_next(i),
                                            store_residual=True)
        return h  # == ln_f(last residual)

    def _embed(self, p: Packing, ids, embeds, token_type_ids, position_ids) -> torch.Tensor:
        x = F.embedding(self.take(ids, p), self.wte) if embeds is None else self.take(embeds, p)
        x = x + F.embedding(self.positions(p, position_ids, self.wte.device), self.wpe)
        if token_type_ids is not None:  # HF GPT-2 embeds token types with wte
            x = x + F.embedding(self.take(token_type_ids, p), self.wte)
        return x.contiguous()

    def _forward(self, p: Packing, ids, embeds, token_type_ids, position_ids):
        x = self._embed(p, ids, embeds, token_type_ids, position_ids)
        heads = self.dims.heads
        return self.unpack(self._blocks(x, lambda i, qkv: attention(qkv, p, heads, self.layers[i].scale, True)), p)


class Generator:
    """Greedy-decoding state for one batch: a static KV cache, graphed prefill and decode steps."""

    def __init__(self, engine: GPT2Engine, batch_size: int, max_total_len: int):
        d, o = engine.dims, engine.opts
        if max_total_len > d.max_positions:
            raise ValueError(f"max_total_len {max_total_len} exceeds the model's {d.max_positions} positions")
        self.e, self.B, self.L = engine, batch_size, max_total_len
        # One (k, v) buffer per layer, (2, B, heads, L, head_dim): SDPA reads k and v as plain views.
        # Zeroed: masked-out slots still enter P @ V with weight 0, and 0 * NaN garbage would be NaN.
        self.kv = [torch.zeros(2, batch_size, d.heads, max_total_len, d.head_dim, device=o.device, dtype=o.dtype)
                   for _ in engine.layers]
        self.pos = 0
        self.pos_t = torch.zeros(1, dtype=torch.long, device=o.device)
        self.graphs = GraphCache(o.cuda_graphs, max_entries=64)  # owns graphs that write this cache

    @property
    def info(self) -> dict:
        """For the benchmark's record: the kernel routes of the prefill and decode graphs captured so far."""
        return {"engine_tuning": self.graphs.tuning()}

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.e.ops.linear(h.contiguous(), self.e.head)

    def _prefill(self, ids: torch.Tensor) -> torch.Tensor:
        e, (B, S) = self.e, ids.shape
        d = e.dims
        p = Packing(B, S, None, None, None, None)

        def attend(i, qkv):
            kv = qkv.view(B, S, 3, d.heads, d.head_dim)[:, :, 1:].permute(2, 0, 3, 1, 4)
            self.kv[i][:, :, :, :S].copy_(kv)
            return attention(qkv, p, d.heads, e.layers[i].scale, True)

        h = e._blocks(e._embed(p, ids, None, None, None), attend)
        return self._logits(h.view(B, S, -1)[:, -1])

    def _decode(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        e = self.e
        x = (F.embedding(ids, e.wte) + F.embedding(pos, e.wpe)).contiguous()

        def attend(i, qkv):
            return e.ops.decode_attention(qkv, self.kv[i][0], self.kv[i][1], pos, e.layers[i].scale)

        return self._logits(e._blocks(x, attend))

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, S) prompt -> (B, vocab) logits at its last position; resets the cache."""
        ids = input_ids.to(self.e.opts.device)
        B, S = ids.shape
        if B != self.B or S > self.L:
            raise ValueError(f"prompt {tuple(ids.shape)} does not fit generator(batch={self.B}, max_total_len={self.L})")
        out = self.graphs(("prefill", S), self._prefill, ids)
        self.pos = S
        return out

    @torch.inference_mode()
    def decode(self, next_ids: torch.Tensor) -> torch.Tensor:
        """(B,) tokens at the next position -> (B, vocab) logits; appends to the cache."""
        if self.pos >= self.L:
            raise ValueError(f"generator is full ({self.L} tokens)")
        self.pos_t.fill_(self.pos)
        ids = next_ids.to(self.e.opts.device).reshape(self.B)
        out = self.graphs("decode", self._decode, ids, self.pos_t)
        self.pos += 1
        return out
