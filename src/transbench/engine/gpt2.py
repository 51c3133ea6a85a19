"""GPT-2-family decoder: pre-LN causal layers, and greedy-decoding support with a static KV cache."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import EngineBase, check_ids
from . import gemv
from .config import GELU_KINDS, Dims, EngineConfig, EngineUnsupported
from .graphs import GraphCache
from .ops import Linear
from .packing import Packing
from .weights import gpt2_layer


class GPT2Engine(EngineBase):
    def __init__(self, gpt2, opts: EngineConfig, lm_head_weight: torch.Tensor | None = None):
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
        self.vocab = self.wte.shape[0]
        self.type_vocab, self.position_rows = self.vocab, self.wpe.shape[0]  # GPT-2's token types are tokens
        self.ln_f = c.norm(gpt2.ln_f)
        # Same factors as HF's GPT2Attention.scaling.
        scales = [(self.dims.scale if cfg.scale_attn_weights else 1.0)
                  / (i + 1 if cfg.scale_attn_by_inverse_layer_idx else 1) for i in range(cfg.num_hidden_layers)]
        self.layers = [gpt2_layer(c, b, s) for b, s in zip(gpt2.h, scales)]
        # GPT-2 ties its LM head to wte; a separate head weight (if any) is converted like the rest.
        head = self.wte if lm_head_weight is None or lm_head_weight is gpt2.wte.weight else c.t(lm_head_weight)
        self.head = Linear(head, None)  # not fp8: logits keep the activation dtype's precision
        self.decode_states: OrderedDict[tuple[int, int], DecodeState] = OrderedDict()

    def decode_state(self, batch_size: int, max_total_len: int) -> DecodeState:
        """The KV cache and graphs of one (batch, max_total_len), made on first use and kept (LRU, MAX_DECODE_STATES):
        a new generator of that shape replays the graphs captured for an earlier one."""
        key = (batch_size, max_total_len)
        state = self.decode_states.pop(key, None)
        if state is None:
            d, o = self.dims, self.opts
            # One (k, v) buffer per layer, (2, B, heads, L, head_dim): SDPA reads k and v as plain views.
            # Zeroed: masked-out slots still enter P @ V with weight 0, and 0 * NaN garbage would be NaN (a reused
            # cache holds the finite values of an earlier generation there).
            kv = [torch.zeros(2, batch_size, d.heads, max_total_len, d.head_dim, device=o.device, dtype=o.dtype)
                  for _ in self.layers]
            state = DecodeState(kv, torch.zeros(1, dtype=torch.long, device=o.device), self.graph_cache(64))
        self.decode_states[key] = state
        while len(self.decode_states) > MAX_DECODE_STATES:
            self.decode_states.popitem(last=False)
        return state

    def release(self) -> None:
        super().release()
        self.decode_states.clear()

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

        def attend(i, qkv):  # no e4m3 output: its LayerNorms write no e4m3 copy whose scales would bound it (bert.py)
            return self.attend(qkv, p, self.layers[i].scale, True)
        return self.unpack(self._blocks(x, attend), p)


# (batch, max_total_len) shapes whose KV cache and graphs an engine keeps for later generators: each holds a
# cache of 2 x layers x batch x max_total_len x hidden elements (gpt2, 1 x 640 in fp16: 15.7 MiB) and its graphs.
MAX_DECODE_STATES = 4


@dataclass
class DecodeState:
    """What the prefill and decode graphs of one (batch, max_total_len) read and write. The engine keeps it, so a
    fresh generator per request replays graphs instead of capturing them again (on an H100 that cost
    124-142 ms against 50.8 for gpt2, batch 1, prompt 512, 128 new tokens)."""

    kv: list[torch.Tensor]
    pos_t: torch.Tensor  # decode()'s position, read by its graph from device memory (decode_greedy's rides its input)
    graphs: GraphCache  # graphs that write this cache
    owner: object = None  # the generator whose sequence the cache holds now


class Generator:
    """Greedy-decoding state for one batch: a static KV cache, graphed prefill and decode steps. Generators of one
    (batch, max_total_len) share their engine's cache and graphs: the one that ran prefill last owns the cache,
    and an older one can prefill again but no longer decode."""

    def __init__(self, engine: GPT2Engine, batch_size: int, max_total_len: int):
        d = engine.dims
        for name, v in (("batch_size", batch_size), ("max_total_len", max_total_len)):
            # generator(0, 8) was taken (an empty cache), generator("1", 8) a TypeError of torch.zeros naming nothing
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, got {v!r}")
        if max_total_len > d.max_positions:
            raise ValueError(f"max_total_len {max_total_len} exceeds the model's {d.max_positions} positions")
        self.e, self.B, self.L = engine, batch_size, max_total_len
        self.state = engine.decode_state(batch_size, max_total_len)
        self.kv, self.pos_t, self.graphs = self.state.kv, self.state.pos_t, self.state.graphs
        self.pos = 0
        self._fed = None  # the last greedy step's (tokens returned, its whole output, the position it wrote there)

    @property
    def info(self) -> dict:
        """For the benchmark's record: the kernel routes of the prefill and decode graphs captured so far."""
        return {"engine_tuning": self.graphs.tuning()}

    def set_tune_budget(self, seconds: float | None) -> None:
        """Tuning seconds this generator's first prefill and decode of a shape may take (0: borrowed routes, a capture
        only: a server's generator first met under load; CompiledModel.set_tune_budget says the same of forwards).
        It holds for every generator of this (batch, max_total_len): they share the graphs."""
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not 0 <= seconds < float("inf")):
            raise ValueError(f"seconds must be None or a finite number >= 0, got {seconds!r}")
        self.graphs.tune_budget_s = seconds

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.e.ops.linear(h.contiguous(), self.e.head)

    def _prefill(self, ids: torch.Tensor) -> torch.Tensor:
        e, (B, S) = self.e, ids.shape
        d = e.dims
        p = Packing(B, S, None, None, None, None)

        def attend(i, qkv):
            kv = qkv.view(B, S, 3, d.heads, d.head_dim)[:, :, 1:].permute(2, 0, 3, 1, 4)
            self.kv[i][:, :, :, :S].copy_(kv)
            return e.attend(qkv, p, e.layers[i].scale, True)

        h = e._blocks(e._embed(p, ids, None, None, None), attend)
        return self._logits(h.view(B, S, -1)[:, -1])

    def _decode(self, ids: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        # The position is read where it lies (DecodeState.pos_t, or after the tokens in a greedy step's input), not
        # passed in as a number: a graph reads it from device memory, so one graph serves every step.
        # Up to gemv.MAX_ROWS sequences each LayerNorm runs inside the projection after it (ops.norm_linear): a
        # projection is then one GEMV kernel, the LayerNorm its prologue and the bias, GELU or residual its
        # epilogue (gemv.py), five kernels a layer where _blocks' order takes eight. Larger batches keep _blocks'
        # order, whose routes were tuned and measured for them (benchmarks/results/decode_gemv_h200_2026-11.md).
        e, pos = self.e, self.pos_t if pos is None else pos
        ops, gelu = e.ops, e.dims.gelu
        x = ops.embed_layernorm(ids, e.wte, pos, e.wpe, None, None, None, 1)  # one kernel, not two gathers and a sum
        if self.B > gemv.MAX_ROWS:
            def attend(i, qkv):
                return ops.decode_attention(qkv, self.kv[i][0], self.kv[i][1], pos, e.layers[i].scale)
            return self._logits(e._blocks(x, attend))
        for i, L in enumerate(e.layers):
            qkv = ops.norm_linear(x, L.qkv, L.norm1)
            x = ops.norm_linear(ops.decode_attention(qkv, self.kv[i][0], self.kv[i][1], pos, L.scale), L.out,
                                residual=x)
            x = ops.norm_linear(ops.norm_linear(x, L.fc1, L.norm2, gelu), L.fc2, residual=x)
        return ops.norm_linear(x, e.head, e.ln_f)

    def _greedy(self, feed: torch.Tensor) -> torch.Tensor:
        # feed: the tokens, then their position; the argmax writes the next tokens, then the next position
        pos = feed[self.B:]
        return self.e.ops.argmax(self._decode(feed[:self.B], pos), pos)

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, S) prompt -> (B, vocab) logits at its last position; resets the cache."""
        check_ids(input_ids, "input_ids", self.e.vocab)
        ids = input_ids.to(self.e.opts.device)
        B, S = ids.shape
        if B != self.B or S > self.L:
            raise ValueError(f"prompt {tuple(ids.shape)} does not fit generator(batch={self.B}, max_total_len={self.L})")
        self.state.owner = self
        out = self.graphs(("prefill", S), self._prefill, ids)
        self.pos, self._fed = S, None
        return out

    @torch.inference_mode()
    def decode(self, next_ids: torch.Tensor) -> torch.Tensor:
        """(B,) tokens at the next position -> (B, vocab) logits; appends to the cache."""
        self._check()
        self._check_next(next_ids)
        self.pos_t.fill_(self.pos)
        self._fed = None
        return self._step("decode", self._decode, next_ids.to(self.e.opts.device).reshape(self.B))

    @torch.inference_mode()
    def decode_greedy(self, next_ids: torch.Tensor) -> torch.Tensor:
        """(B,) tokens at the next position -> (B,) int64 next tokens, decode(next_ids).argmax(-1) with the argmax
        inside the step's graph (engine/argmax.py) and no logits copied out of it; appends to the cache.

        The step's input is the tokens and their position, and its output the next tokens and the next position.
        Given back the tokens it returned (a view of that output, changed in place or not), a step takes its
        position from there; other tokens get the position filled in first, one more kernel outside the graph. On
        an H200 that kernel cost 2.7 us of gpt2's 0.1799 ms step at batch 1, and without it the generation cell went
        from 0.1670 and 0.1673 to 0.1657 and 0.1660 ms a token (benchmarks/results/engine_limits_h200_2026-11.md)."""
        self._check()
        fed, self._fed = self._fed, None
        if fed is not None and next_ids is fed[0] and fed[2] == self.pos:
            feed = fed[1]
        else:
            self._check_next(next_ids)
            dev = self.e.opts.device
            feed = torch.cat((next_ids.to(dev).reshape(self.B).long(), torch.full((1,), self.pos, device=dev)))
        out = self._step("greedy", self._greedy, feed)
        tokens = out[:self.B]
        self._fed = (tokens, out, self.pos)
        return tokens

    def _check_next(self, next_ids) -> None:
        """A step's tokens: one id per sequence, (B,) or (B, 1). The tokens a greedy step returned skip this."""
        check_ids(next_ids, "next_ids", self.e.vocab, (1, 2))
        if next_ids.numel() != self.B:
            raise ValueError(f"next_ids holds {next_ids.numel()} tokens, and this generator decodes {self.B} "
                             f"sequences (shape {tuple(next_ids.shape)})")

    def _check(self) -> None:
        if self.state.owner is not self and self.pos == 0:  # not "another generator ran prefill since": none may have
            raise ValueError("decode before prefill: call prefill(input_ids) with the prompt first")
        if self.state.owner is not self:
            raise ValueError("this generator's KV cache holds another sequence now: a newer generator of the same "
                             "(batch, max_total_len) ran prefill since; call prefill again")
        if self.pos >= self.L:
            raise ValueError(f"generator is full ({self.L} tokens)")

    def _step(self, key: str, fn, arg: torch.Tensor) -> torch.Tensor:
        out = self.graphs(key, fn, arg)
        self.pos += 1
        return out
