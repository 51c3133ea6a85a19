"""What the BERT and GPT-2 engines share: options, the ops seam, graph cache, packing in and out."""
from __future__ import annotations

import torch

from .attention import attention
from .config import Dims, EngineConfig, EngineUnsupported
from .graphs import GraphCache
from .ops import select_ops
from .packing import Packing, make_packing, reuse_sizes, token_ladder
from .tuning import tuner as default_tuner
from .weights import Converter, Layer


def check_ids(t, what: str, vocab: int | None, dims: tuple[int, ...] = (2,)) -> None:
    """Token ids as the engine takes them: a torch tensor of integers with `dims` dimensions, none of them empty, and
    on the host each id in [0, vocab). A list was an AttributeError, float ids a RuntimeError deep in the embedding,
    an empty batch one in attention, and an id past the vocabulary indexed the table out of bounds (an IndexError on
    the CPU; on a GPU a device-side assert that ends the process's CUDA context). Ids already on a GPU are not
    range-checked: reading them back would wait for the GPU on every call."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{what} must be a torch tensor of token ids, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{what} must hold integer token ids, got {t.dtype}")
    if t.dim() not in dims:
        raise ValueError(f"{what} must have {' or '.join(map(str, dims))} dimension(s), got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{what} is empty (shape {tuple(t.shape)}): give at least one token")
    if vocab is not None and t.device.type == "cpu":
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"{what} holds {lo if lo < 0 else hi}, outside the {vocab} rows it indexes [0, {vocab})")


def check_states(t, what: str, hidden: int) -> None:
    """Embedded inputs (inputs_embeds, encode's hidden states): a floating-point (batch, seq, hidden) tensor."""
    if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
        raise ValueError(f"{what} must be a floating-point torch tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if t.dim() != 3 or t.shape[-1] != hidden or t.numel() == 0:
        raise ValueError(f"{what} must be (batch, seq, {hidden}) and not empty, got shape {tuple(t.shape)}")


class EngineBase:
    dims: Dims
    layers: list[Layer]

    def __init__(self, opts: EngineConfig):
        self.opts = opts
        # fp8 on the CPU is emulated (ops.scaled_mm: fp32 math on the e4m3 values) so that its numerics can be
        # tested without a GPU; the benchmark's fused backend refuses it there (nothing there is fast).
        if opts.fp8 and opts.device.type == "cuda":
            if torch.cuda.get_device_capability(opts.device) < (8, 9):
                raise EngineUnsupported("fp8 needs a CUDA GPU of compute capability 8.9 or newer (Ada/Hopper)")
            if opts.dtype not in (torch.float16, torch.bfloat16):
                raise EngineUnsupported("fp8 linear layers need dtype fp16 or bf16 for activations")
        self.conv = Converter(opts.dtype, opts.device, opts.fp8)
        # One tuner for every choice this engine makes (its ops' routes, attention's, the graphs' races).
        self.tuner = opts.options.tuner or default_tuner()
        self.ops = select_ops(opts.device, opts.options, self.tuner)
        # Packed sizes are rounded to this on the GPU so similar batches reuse one captured graph.
        self.bucket = 128 if opts.device.type == "cuda" else 1
        self.graphs = self.graph_cache(opts.options.max_graphs or self.graph_bound())
        self._ladders: dict[tuple[int, int], list[int]] = {}
        # Set by a server once its load starts (CompiledModel.set_reuse_captured): a padded call runs the smallest
        # captured packed size that holds it instead of capturing its own (packing.reuse_sizes says why).
        self.reuse_captured = False
        self._reused: dict[tuple[int, int], tuple] = {}  # (B, S) -> (the graphs' state, its sizes)

    def token_sizes(self, B: int, S: int) -> list[int] | None:
        """The packed sizes a padded (B, S) call can run: opts.token_growth's ladder, or None (multiples of bucket)."""
        if self.opts.token_growth is None:
            return None
        if (B, S) not in self._ladders:
            self._ladders[(B, S)] = token_ladder(B * S, self.bucket, self.opts.token_growth, S)
        return self._ladders[(B, S)]

    def graph_cache(self, max_entries: int) -> GraphCache:
        """A graph cache of this engine's settings (its tuner, budget and races)."""
        o = self.opts.options
        return GraphCache(self.opts.cuda_graphs, max_entries, self.opts.tune_budget_s, self.tuner, o.refine,
                          o.race_budget_s)

    def attend(self, qkv: torch.Tensor, p: Packing, scale: float, causal: bool, bound=None):
        """Attention over the fused QKV rows by the route the engine's tuner picks (attention.attention)."""
        return attention(qkv, p, self.dims.heads, scale, causal, bound, tuner=self.tuner, pdl=self.ops.pdl)

    def graph_bound(self) -> int:
        """Graphs one (max_batch, max_seq) shape can need: each packed token count (a multiple of `bucket`, capped
        at B x S) and the dense one; never fewer than the fixed 32 of before (a bert-base server of batch
        16 x width 256 reaches 33 counts on an H100, each graph holding a 16 x 256 x 768 fp16 output, 6 MiB)."""
        return max(32, -(-self.opts.max_batch * self.opts.max_seq // self.bucket) + 1)

    def release(self) -> None:
        self.graphs.release()

    def check_fp8_dims(self) -> None:
        d = self.dims
        if self.opts.fp8 and any(n % 16 for n in (d.hidden, d.ffn)):
            raise EngineUnsupported(f"fp8 GEMMs need hidden and ffn sizes divisible by 16 (got {d.hidden}, {d.ffn})")

    def check_shape(self, B: int, S: int) -> None:
        if S > self.dims.max_positions:
            raise ValueError(f"sequence length {S} exceeds the model's {self.dims.max_positions} positions")
        if B > self.opts.max_batch or S > self.opts.max_seq:
            raise ValueError(f"batch {B} x seq {S} exceeds compile_model(max_batch={self.opts.max_batch}, "
                             f"max_seq={self.opts.max_seq})")

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None):
        """One forward over (B, S) inputs, HF-style; each engine supplies `_forward` on packed tokens (GPT-2: the
        last hidden state; BERT: it and the pooler output)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if input_ids is not None:
            check_ids(input_ids, "input_ids", self.vocab)
        else:
            check_states(inputs_embeds, "inputs_embeds", self.dims.hidden)
        shape = tuple((input_ids if input_ids is not None else inputs_embeds).shape[:2])
        if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or
                                           (attention_mask.dim() <= 2 and tuple(attention_mask.shape) != shape)):
            raise ValueError(f"attention_mask must be a {shape} torch tensor of 1 (token) and 0 (padding), got "
                             f"{tuple(getattr(attention_mask, 'shape', ())) or type(attention_mask).__name__}")
        for name, t, rows in (("token_type_ids", token_type_ids, self.type_vocab),
                              ("position_ids", position_ids, self.position_rows)):
            if t is not None:
                check_ids(t, name, rows, (1, 2))
        dev = self.opts.device
        ids = None if input_ids is None else input_ids.to(dev)
        embeds = None if inputs_embeds is None else inputs_embeds.to(dev, self.opts.dtype)
        B, S = (ids if ids is not None else embeds).shape[:2]
        self.check_shape(B, S)
        p = self.packing(attention_mask, B, S)
        tt = None if token_type_ids is None else token_type_ids.to(dev).expand(B, S)
        pos = None if position_ids is None else position_ids.to(dev).expand(B, S)
        key = ("fwd", B, S, p.dense, p.tokens, ids is None, tt is None, pos is None)
        return self.graphs(key, self._forward, p, ids, embeds, tt, pos)

    def packing(self, mask: torch.Tensor | None, B: int, S: int) -> Packing:
        if mask is not None and mask.dim() > 2:
            # transformers takes a 3-D/4-D mask as the attention's own per-query mask (a 4-D one as additive biases),
            # which packing real tokens cannot express: reading it as a padding mask gave silently other outputs.
            raise EngineUnsupported(f"a {mask.dim()}-D attention_mask is not supported: pass a (batch, seq) mask of "
                                    "1 (token) and 0 (padding)")
        o = self.opts.options
        sizes = self.token_sizes(B, S)
        if sizes and self.reuse_captured:
            sizes = self._reuse(B, S, sizes)
        return make_packing(None if mask is None else mask.to(self.opts.device), B, S, self.bucket, o.pack_max_s,
                            o.pack_max_tokens, sizes)

    def _reuse(self, B: int, S: int, sizes: list[int]) -> list[int]:
        """reuse_sizes for (B, S), worked out again only when the graphs changed: this is every serving call's path."""
        state = (self.graphs.captures, len(self.graphs.entries))
        hit = self._reused.get((B, S))
        if hit is None or hit[0] != state:
            hit = self._reused[(B, S)] = (state, reuse_sizes(sizes, self.captured_sizes(B, S)))
        return hit[1]

    def captured_sizes(self, B: int, S: int) -> set[int]:
        """The packed sizes of (B, S) forwards with a captured graph (forward's key: "fwd", B, S, dense, tokens, ...)."""
        return {k[4] for k in self.graphs.entries if k[:3] == ("fwd", B, S) and not k[3]}

    @staticmethod
    def take(t: torch.Tensor | None, p: Packing) -> torch.Tensor | None:
        """(B, S, ...) -> (tokens, ...): the real tokens only when packed."""
        if t is None:
            return None
        flat = t.reshape(p.B * p.S, *t.shape[2:])
        return flat if p.dense else flat.index_select(0, p.gidx)

    @staticmethod
    def positions(p: Packing, position_ids: torch.Tensor | None, device) -> torch.Tensor:
        if position_ids is not None:
            return EngineBase.take(position_ids.expand(p.B, p.S), p)
        if p.dense:
            return torch.arange(p.S, device=device).repeat(p.B)
        return p.gidx % p.S  # HF numbers positions by column, padding included

    @staticmethod
    def unpack(x: torch.Tensor, p: Packing) -> torch.Tensor:
        if p.dense:
            return x.view(p.B, p.S, -1)
        # Padding positions come back as zeros (HF returns unspecified values there).
        out = x.new_zeros(p.B * p.S + 1, x.shape[-1]).index_copy_(0, p.sidx, x)
        return out[: p.B * p.S].view(p.B, p.S, -1)
