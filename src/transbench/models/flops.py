"""FLOPs of transformer inference and training: analytic from the model's shape where the family is known,
otherwise counted by torch's FLOP counter on a meta-device copy (no memory, no weights). `forward_flops`
returns the count and how it was obtained ("analytic" | "counted"), which is stored with the cell.

Counted: matrix products only, 2 FLOPs per multiply-add (element-wise work, softmax and LayerNorm are
a fraction of a percent and are left out, as in the usual MFU convention; torch's counter counts the same
products). Per layer and per sequence of ``s`` real tokens, hidden ``h``, ``a`` heads of ``d`` (query
width ``q = a d``), ``g`` key/value heads (grouped-query attention: ``kv = g d``), FFN width ``i``:

    Q and output projections   2 * s * h * q * 2        (= 4 s h^2 when q = h)
    K and V projections        2 * s * h * kv * 2       (= 4 s h^2 without GQA)
    attention scores           2 * s * s * q            (Q K^T over all heads)
    attention x values         2 * s * s * q
    FFN, two matrices          2 * s * h * i * 2 = 4 s h i
    FFN, gated (SwiGLU/GeGLU)  2 * s * h * i * 3 = 6 s h i   (Llama, Qwen2, ModernBERT)
    BERT layer total           8 s h^2 + 4 s h i + 4 s^2 h      (= 24 s h^2 + 4 s^2 h when i = 4h)

Decoders need only the causal half of the attention products: s (s + 1) / 2 query-key pairs, so their
attention terms are 4 q * s (s + 1) / 2 = 2 s (s + 1) q. Counting the full square (what eager attention
computes and then masks) would credit a causal kernel with work it never does and overstate MFU; a counted
decoder family (Phi, Falcon, Gemma, ...) counts the causal half of its attention products likewise. A
sliding-window layer of window ``w`` needs fewer: query i attends keys i - w < j <= i (the w most recent
tokens, itself included; `sliding_window_overlay` in transformers.masking_utils), sum_i min(i + 1, w) =
w (w + 1) / 2 + (s - w) w pairs, the causal half when s <= w (`_causal_pairs`). Which layers slide is the
family's transformers config (`attention_windows`): its `layer_types` ("sliding_attention" entries, window
`sliding_window`: Gemma 2/3, Cohere2, gpt-oss, OLMo 3, and Qwen2, Qwen2-MoE, Qwen3 where `use_sliding_window`
is set, each by its own rule from `max_window_layers`), else `sliding_window` on every layer of the families
whose masks apply it (`SLIDING_WINDOW_FAMILIES`: Mistral, Mixtral, Phi-3, Starcoder2, Qwen3-MoE, ...; a Llama
config that names one still attends every key), GPT-Neo's "local" `attention_layers` (window `window_size`).
Analytic families count each layer's pairs; a counted family scales each attention product by the pairs of the
layer that made it (`_window_of_product`). ModernBERT's local layers (its config's `layer_types` "sliding_attention"
entries, which transformers makes from `global_attn_every_n_layers` where a config has none) attend a window of
`local_attention` tokens (|i - j| <= local_attention / 2): only those pairs count. Heads on top of the last layer:

    mlm                   2 s h^2 (transform) + 2 s h V (decoder)
    causal-lm             2 s h V
    token-classification  2 s h C          qa  2 s h * 2      (ModernBERT: + 2 s h^2, its head's dense)
    classification        encoders: 2 h^2 (pooler / pre-classifier dense) + 2 h C, on one token per
                          sequence; decoders: 2 s h C (transformers scores every position, then picks the last)

Embedding lookups are gathers: no FLOPs. Training is 3 x forward (backward = 2 x forward); activation
checkpointing's second forward and an MLM head run on unmasked positions are executed but not needed, so
MFU leaves them out and HFU counts them (`training_flops`). Generation: the prompt's forward, then per new token
at context length t: the layer's projections and FFN for one token, 4 t q per layer for attention (4 min(t, w) q
in a sliding-window layer) and 2 h V for the LM head. The KV cache (`kv_cache_bytes`) holds every token in a full
layer and the last w - 1 in a sliding one, as transformers' DynamicCache does (the generation cells' cache).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Sequence

from .presets import Preset


# Families whose every matrix product the formulas above describe (checked against torch's counter in
# tests/test_flops.py); any other family is counted.
ANALYTIC = ("bert", "roberta", "xlm-roberta", "distilbert", "modernbert", "gpt2", "llama", "qwen2")
GATED_MLP = ("llama", "qwen2", "modernbert")
PER_TOKEN_TRANSFORM = ("modernbert",)


def _local_pairs(seq: int, window: int) -> int:
    """Query-key pairs with |i - j| <= window / 2 in a sequence of `seq` tokens (ModernBERT's local layers)."""
    half = window // 2
    return sum(min(i + half, seq - 1) - max(i - half, 0) + 1 for i in range(seq))


def _causal_pairs(seq: int, window: int | None = None) -> int:
    """Query-key pairs of a causal layer over `seq` tokens: query i attends keys i - window < j <= i (the
    `window` most recent tokens, itself included: `sliding_window_overlay` and `causal_mask_function` in
    transformers.masking_utils), sum_i min(i + 1, window); every earlier key without a window."""
    if window is None or window >= seq:
        return seq * (seq + 1) // 2
    return window * (window + 1) // 2 + (seq - window) * window


# Layer types that transformers gives a sliding-window cache layer of `sliding_window` tokens
# (get_layer_types_and_kwargs in transformers.cache_utils) and whose mask is the sliding-window causal one
# (create_sliding_window_causal_mask in transformers.masking_utils). Any other type ("full_attention",
# "chunked_attention", "linear_attention", ...) is counted as before.
SLIDING_LAYER_TYPES = ("sliding_attention", "hybrid_sliding", "reference_sliding_attention")
# Families without `layer_types` whose every layer slides when their config sets `sliding_window`: each one's
# modeling file picks "create_causal_mask if self.config.sliding_window is None else
# create_sliding_window_causal_mask" (modeling_mistral, modeling_mixtral, ...). Any other family's `sliding_window`
# is not its attention's: a Llama, Gemma, Phi or Moshi config that sets one still attends every earlier key (their
# masks are create_causal_mask's), though transformers' DynamicCache then keeps only the window (`cache_windows`).
SLIDING_WINDOW_FAMILIES = ("mistral", "mixtral", "ministral3", "phi3", "phimoe", "starcoder2", "qwen3_moe", "doge")


def _config_windows(cfg, layers: int, every_layer: bool) -> tuple[int | None, ...]:
    """Per layer, the window of a sliding-window layer (None: a full one) as transformers' config says:
    `layer_types` where the config has it (Gemma 2/3, Cohere2, gpt-oss, OLMo 3; Qwen2, Qwen2-MoE and Qwen3
    derive it from use_sliding_window and max_window_layers, each its own way; recurrent_gemma maps it to
    layers_block_type and sliding_window to attention_window_size), else `sliding_window` on every layer where
    `every_layer` (Mistral, Mixtral, Phi-3, Starcoder2, Qwen3-MoE, whose configs set it to None without
    use_sliding_window). A window below 1 is none: Qwen2-MoE's config says 0 and ModernBERT-decoder's -1 when
    they have none."""
    with contextlib.suppress(AttributeError, ValueError):  # a text model's config is its own; a composite may refuse
        cfg = cfg.get_text_config(decoder=True)
    window = getattr(cfg, "sliding_window", None)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        window = None
    types = getattr(cfg, "layer_types", None)
    if types is None and cfg.model_type == "recurrent_gemma":
        # transformers 5.17's config (the GPU image's) has no layer_types: its "attention" blocks slide
        types = ["sliding_attention" if t == "attention" else t for t in cfg.layers_block_type]
    if types is None:
        return (window if every_layer else None,) * layers
    types = list(types)[:layers]
    return tuple(window if t in SLIDING_LAYER_TYPES else None for t in types) + (None,) * (layers - len(types))


def _config_key(shape: Preset) -> str:
    # Preset equality and hash leave `config` out (the shape is what compares): two shapes that differ only in
    # their sliding window must not share a cached answer.
    return json.dumps(shape.config, sort_keys=True, default=str)


@functools.lru_cache(maxsize=256)
def _windows(shape: Preset, config_key: str, attention: bool) -> tuple[int | None, ...]:
    if not shape.decoder:
        return (None,) * shape.layers
    from .build import hf_config

    cfg = hf_config(_counted_ref(shape), "base")  # the config the model is built from (a folder's own)
    if not attention:
        # The cache: DynamicCache(config) reads every config so (get_layer_types_and_kwargs, transformers.cache_utils)
        return _config_windows(cfg, shape.layers, every_layer=True)
    if cfg.model_type == "gpt_neo":
        # GPT-Neo's own fields: its "local" layers mask all but the window_size most recent keys (the causal mask
        # XOR tril(-window_size) in modeling_gpt_neo), the same rule as sliding_window; its cache keeps them all.
        return tuple(cfg.window_size if t == "local" else None for t in list(cfg.attention_layers)[:shape.layers])
    return _config_windows(cfg, shape.layers, every_layer=cfg.model_type in SLIDING_WINDOW_FAMILIES)


def cache_windows(shape: Preset) -> tuple[int | None, ...]:
    """Per layer, the window of tokens transformers' DynamicCache keeps (None: every token)."""
    return _windows(shape, _config_key(shape), False)


def attention_windows(shape: Preset) -> tuple[int | None, ...]:
    """Per layer, the most keys a query attends (its window, itself included), None for every earlier one: all
    layers of an encoder (ModernBERT's local layers are `_is_global`'s), the sliding-window layers of a decoder."""
    return _windows(shape, _config_key(shape), True)


@functools.lru_cache(maxsize=256)
def _local_windows(shape: Preset, config_key: str) -> tuple[int | None, ...]:
    """Per layer of a ModernBERT, the `local_attention` window of a local layer, None for a global one: its config's
    `layer_types`, which transformers 5 builds the layers from (a `global_attn_every_n_layers` it reads only to
    make them where a config has none, and does not keep). A checkpoint saved by transformers 5 has layer_types
    and no global_attn_every_n_layers, and each of its local layers was counted as a global one (+14% FLOPs for
    modernbert-tiny's shape at 64 tokens against the same model as the preset)."""
    if shape.family != "modernbert":
        return (None,) * shape.layers
    from .build import hf_config

    cfg = hf_config(_counted_ref(shape), "base")  # the config the model is built from (a folder's own)
    types = list(getattr(cfg, "layer_types", None) or ())
    return tuple(cfg.local_attention if k < len(types) and types[k] == "sliding_attention" else None
                 for k in range(shape.layers))


def _is_global(shape: Preset, layer: int) -> bool:
    return _local_windows(shape, _config_key(shape))[layer] is None


def attention_flops(shape: Preset, seq: int, layer: int = 0, windows: Sequence[int | None] | None = None) -> int:
    """Scores and values products of one layer: the full square for encoders, the causal half for decoders
    (within its window for a sliding-window layer), the window of a ModernBERT local layer. `windows`:
    `attention_windows(shape)`, passed by a caller that counts many layers (else looked up per call)."""
    q = shape.heads * shape.dim
    if shape.decoder:
        return 4 * _causal_pairs(seq, (attention_windows(shape) if windows is None else windows)[layer]) * q
    if not _is_global(shape, layer):
        return 4 * _local_pairs(seq, _local_windows(shape, _config_key(shape))[layer]) * q
    return 4 * seq * seq * q


def layer_flops(shape: Preset, seq: int, layer: int = 0, windows: Sequence[int | None] | None = None) -> int:
    h, i = shape.hidden, shape.intermediate
    q, kv = shape.heads * shape.dim, shape.kv * shape.dim
    ffn = (6 if shape.family in GATED_MLP else 4) * seq * h * i
    return 4 * seq * h * q + 4 * seq * h * kv + ffn + attention_flops(shape, seq, layer, windows)


def head_flops(shape: Preset, task: str, seq: int) -> int:
    from .build import num_labels

    # The classes of the head the model is built with: a checkpoint's own (num_labels 1000 read as 2: its token
    # classifier counted at a third of what torch's counter counts).
    h, v, c = shape.hidden, shape.vocab, num_labels(shape)
    if task == "mlm":
        return 2 * seq * h * h + 2 * seq * h * v
    if task in ("causal-lm", "generate"):
        return 2 * seq * h * v
    # ModernBERT puts its prediction head (dense h x h) under every token's classifier too.
    transform = 2 * seq * h * h if shape.family in PER_TOKEN_TRANSFORM else 0
    if task == "token-classification":
        return transform + 2 * seq * h * c
    if task == "qa":
        return transform + 2 * seq * h * 2
    if task == "classification":
        return 2 * seq * h * c if shape.decoder else 2 * h * h + 2 * h * c
    return 0


def analytic_forward_flops(shape: Preset, seq_lens: int | Sequence[int], task: str = "base") -> int:
    """The formulas above, for a family in ANALYTIC."""
    lens = [seq_lens] if isinstance(seq_lens, int) else list(seq_lens)
    windows = attention_windows(shape)
    return sum(sum(layer_flops(shape, s, k, windows) for k in range(shape.layers)) + head_flops(shape, task, s)
               for s in lens)


def _counted_ref(shape: Preset):
    """The model to count: a checkpoint folder's own config.json where `shape` is that folder's (a config
    rebuilt from the shape alone is lossy: FalconConfig's head_dim is a read-only property, so every Falcon cell
    was an `error`), else the preset's."""
    from pathlib import Path

    from .build import ModelRef, resolve
    from .presets import PRESETS

    if shape.name not in PRESETS and Path(shape.name).expanduser().is_dir():
        ref = resolve(shape.name)
        if ref.shape == shape:
            return ref
    return ModelRef(shape.name, shape)


def _causal_products(seq: int, window=lambda: None) -> dict:
    """torch's FLOP formulas for the batched products of attention (eager attention: `bmm` for scores and
    values, `baddbmm` where scores start from a bias such as Bloom's ALiBi), counting the query-key pairs a causal
    kernel computes instead of the s x s square: s (s + 1) / 2, or `_causal_pairs` within the window that
    `window()` gives for the product being counted (None: no window). A product is attention's when it makes an
    s x s score matrix (Q K^T) or reads one (P V); projections are never batched products."""
    from torch.ops import aten
    from torch.utils.flop_counter import baddbmm_flop, bmm_flop

    def square(a_shape, b_shape) -> bool:
        return (a_shape[-2] == seq and b_shape[-1] == seq) or tuple(a_shape[-2:]) == (seq, seq)

    def causal(full: int, a_shape, b_shape) -> int:
        # `full` is 2 x (batch x heads) x s x s x head_dim: a multiple of s^2, so the scaling is exact.
        return full * _causal_pairs(seq, window()) // (seq * seq) if square(a_shape, b_shape) else full

    def bmm(a_shape, b_shape, out_shape=None, **kwargs) -> int:
        return causal(bmm_flop(a_shape, b_shape), a_shape, b_shape)

    def baddbmm(self_shape, a_shape, b_shape, out_shape=None, **kwargs) -> int:
        return causal(baddbmm_flop(self_shape, a_shape, b_shape), a_shape, b_shape)

    return {aten.bmm: bmm, aten.baddbmm: baddbmm}


def _layer_index(module) -> int | None:
    """The decoder layer a module belongs to, by the index transformers gives it: `layer_idx` on every attention
    module (its cache slot, and what picks its entry of config.layer_types), GPT-Neo's `layer_id`."""
    for name in ("layer_idx", "layer_id"):
        index = getattr(module, name, None)
        if isinstance(index, int) and not isinstance(index, bool):
            return index
    return None


@contextlib.contextmanager
def _window_of_product(model, windows: Sequence[int | None]):
    """Yields a function that gives the window of the layer whose forward is running (None: no window).

    One window for every layer (Mistral's, or none) needs no layer. Where layers differ (Gemma 2 alternates,
    Qwen2 slides from max_window_layers on, hybrids interleave linear-attention layers that make no products),
    the product's own module says which layer it is: forward hooks on every module with a layer index keep a
    stack of the layers entered, so a product is counted with the window of the innermost one. Counting products
    in order (two per layer) would break on a layer that makes none or more, and correcting the total afterwards
    from the config would need each layer's own head count and width (Gemma 4's full layers have wider heads):
    both guess how the family computes, the hooks only read where the product was made. A product made outside
    any indexed module keeps the causal half (no window), as before windows were counted."""
    if len(set(windows)) <= 1:
        only = windows[0] if windows else None
        yield lambda: only
        return
    with _layer_stack(model) as stack:
        yield lambda: windows[stack[-1]] if stack and 0 <= stack[-1] < len(windows) else None


@contextlib.contextmanager
def _layer_stack(model):
    """Yields the indices (`_layer_index`) of the layers whose forwards are running, innermost last: forward hooks on
    every module with a layer index push and pop it."""
    stack: list[int] = []

    def enter(module, args) -> None:
        stack.append(_layer_index(module))

    def leave(module, args, output) -> None:  # None: a forward hook that returns a value replaces the output
        stack.pop()

    handles = []
    for module in model.modules():
        if _layer_index(module) is not None:
            handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield stack
    finally:
        for handle in handles:
            handle.remove()


def counter_total(counter, model) -> int:
    """torch's FLOP counter's total over a forward of `model`, less what its rotary embedding modules computed.
    Their product of inverse frequencies with the positions is a position encoding, which the analytic formulas leave
    out, and transformers computes it as a `bmm` (counted) in 5.17 and as an element-wise product (not counted) in
    5.24: llama-tiny at 16 tokens read 192 FLOPs more on 5.17. Without it a count is the same on both."""
    root = type(model).__name__
    rotary = [f"{root}.{name}" for name, module in model.named_modules()
              if name and type(module).__name__.endswith("RotaryEmbedding")]
    outer = [name for name in rotary if not any(name.startswith(other + ".") for other in rotary)]
    # per module, keyed by its path under the root's class name; a module's count includes its children's
    counts = counter.get_flop_counts()
    return int(counter.get_total_flops() - sum(sum(counts.get(name, {}).values()) for name in outer))


@contextlib.contextmanager
def _flop_counter(model, seq: int, causal: bool, windows: Sequence[int | None]):
    """torch's FLOP counter over a forward of `model` on `seq`-token sequences, a causal decoder's attention
    products counted by `_causal_products` with the window of the layer that makes each."""
    from torch.utils.flop_counter import FlopCounterMode

    with _window_of_product(model, windows) as window, \
            FlopCounterMode(display=False, custom_mapping=_causal_products(seq, window) if causal else {}) as counter:
        yield counter


@contextlib.contextmanager
def _per_layer_counter(model):
    """torch's FLOP counter over a forward of `model`, each product tallied under the index of the innermost layer
    that made it (`_layer_index`; None outside every indexed module): yields the tally, a Counter."""
    import collections

    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    tally: collections.Counter = collections.Counter()
    with _layer_stack(model) as stack:
        def tallied(formula):
            def count(*args, **kwargs) -> int:
                flops = formula(*args, **kwargs)
                tally[stack[-1] if stack else None] += flops
                return flops
            count._get_raw = True  # the registry's formulas take the raw tensors: passed on as they come
            return count

        with FlopCounterMode(display=False, custom_mapping={op: tallied(f) for op, f in flop_registry.items()}):
            yield tally


def _measured_step(shape: Preset) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Per layer, (FLOPs a decode step spends per earlier key in the layer's cache, cache elements per token the
    layer keeps), read off a meta-device copy: torch's count of a step at context 2 less that of a one-token
    forward, and transformers' DynamicCache after a one-token prefill. None where a key's work is made outside every
    indexed layer (it could not be given to a layer's window) or the cache has another number of layers."""
    import torch
    from transformers import DynamicCache

    from .build import build_model, cache_kw

    model = build_model(_counted_ref(shape), "causal-lm", attn="eager", device="meta")
    _countable_experts(model)
    ids = torch.ones(1, 1, dtype=torch.long, device="meta")
    kw = cache_kw(model)
    failure = None
    for masked in (False, True):  # as counted_flops: some families read an explicit mask's values when there is none
        first = {"attention_mask": torch.ones(1, 1, dtype=torch.long, device="meta")} if masked else {}
        second = {"attention_mask": torch.ones(1, 2, dtype=torch.long, device="meta")} if masked else {}
        try:
            with torch.no_grad():
                with _per_layer_counter(model) as alone:
                    model(input_ids=ids, **first)
                cache = DynamicCache(config=model.config)
                model(input_ids=ids, **{kw: cache}, use_cache=True, **first)
                widths = tuple(sum(t.numel() for name in ("keys", "values") for t in [getattr(layer, name, None)]
                                   if isinstance(t, torch.Tensor)) for layer in cache.layers)
                with _per_layer_counter(model) as step:
                    model(input_ids=ids, **{kw: cache}, use_cache=True, **second)
            break
        except RuntimeError as exc:
            if "meta" not in str(exc):
                raise
            failure = exc
    else:
        raise failure
    if step[None] != alone[None] or len(widths) != shape.layers:
        return None
    return tuple(step[k] - alone[k] for k in range(shape.layers)), widths


@functools.lru_cache(maxsize=256)
def _step_layers(shape: Preset, config_key: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per layer, (FLOPs of a decode step per earlier key it attends, KV cache elements per token it keeps).
    Standard attention: 4 q (scores and values over one more key) and 2 x kv_heads x head_dim, as the analytic
    families compute. A counted family's are read off its own step (`_measured_step`): multi-head latent attention
    (DeepSeek-V2/V3, Kimi, GLM-4-MoE-Lite, MiniCPM3, ...) caches one compressed latent per token (kv_lora_rank +
    qk_rope_head_dim elements, not two per head of `head_dim`, its config's rotary part) and expands every cached
    latent through kv_b_proj at each step, then scores keys of qk_nope + qk_rope and values of v_head_dim: a
    DeepSeek-V3-shaped tiny model's step at 12 tokens was counted at 67% of torch's count, its cache at 2.7 times
    what DynamicCache held."""
    standard = ((4 * shape.heads * shape.dim,) * shape.layers, (2 * shape.kv * shape.dim,) * shape.layers)
    if shape.family in ANALYTIC:
        return standard
    try:
        return _measured_step(shape) or standard
    except Exception:  # noqa: BLE001 - a step the meta device cannot run keeps the standard attention's count
        return standard


def _countable_experts(model) -> None:
    """Mixture-of-experts layers (Mixtral, Qwen2-MoE, OLMoE, GraniteMoE, gpt-oss, Jamba, ...) run their experts
    through `grouped_mm` by default, whose meta kernel accepts bf16 only (every cell of those families was an
    `error`: "Expected inputs of BF16 type") and which torch's counter does not count (it would read 0 FLOPs for
    the experts). `batched_mm` computes the same products, one per (token, chosen expert) pair, as `bmm`: counted,
    on the meta device, and independent of which experts the router picks (each token runs top-k experts)."""
    can_set = getattr(model, "_can_set_experts_implementation", None)
    if getattr(model.config, "_experts_implementation", None) not in (None, "batched_mm") and can_set and can_set():
        model.set_experts_implementation("batched_mm")


@functools.lru_cache(maxsize=256)
def counted_flops(shape: Preset, seq: int, task: str, batch: int = 1) -> int:
    """torch's FLOP counter over one forward of `batch` sequences of `seq` tokens on a meta-device copy: the
    modules are built on the meta device, so nothing is allocated and no weights are read."""
    import torch

    from ..errors import Unsupported
    from .build import build_model

    model = build_model(_counted_ref(shape), task, attn="eager", device="meta")
    _countable_experts(model)
    ids = torch.ones(batch, seq, dtype=torch.long, device="meta")
    # A decoder's eager attention computes the full s x s square of scores and masks its upper half: count the
    # causal half, as the analytic formulas do (the module's docstring says why), else a Mistral read 4% more
    # FLOPs than the Llama of the same shape at 16 tokens, and more the longer the sequence.
    # XLNet is a causal LM to transformers' mappings but attends both ways (attn_type "bi", its default) in the
    # forward that runs here: its square is all needed. A sliding-window layer needs its window's pairs only.
    causal = shape.decoder and shape.config.get("attn_type") != "bi"
    windows = attention_windows(shape) if causal else ()
    # Meta tensors have no values: code that reads them fails. BERT's mask code reads an explicit mask,
    # DeBERTa's padding check reads the ids when there is none: try without a mask, then with one.
    for kwargs in ({}, {"attention_mask": torch.ones_like(ids)}):
        try:
            with _flop_counter(model, seq, causal, windows) as counter, torch.no_grad():
                model(input_ids=ids, **kwargs)
            return counter_total(counter, model)
        except RuntimeError as exc:
            if "meta" not in str(exc):
                raise
            failure = exc
    # Code that reads a value cannot run on the meta device: transformers' mask helper asks whether a mask is all
    # ones (BigBird, Canine, LUKE, Megatron-BERT, Nystromformer), Longformer whether any token attends globally,
    # XLNet makes its relative positions on the CPU. Every cell of those families ran, was checked, was timed, and
    # was then `unsupported`. Counted instead on one real forward of a host copy (its memory, once per process).
    try:
        model = _host_model(shape, task)
        # Never the padding id (a vocabulary has two ids at least: build refuses one).
        ids = torch.full((batch, seq), 0 if model.config.pad_token_id == 1 else 1, dtype=torch.long)
        with _flop_counter(model, seq, causal, windows) as counter, torch.no_grad():
            model(input_ids=ids)
        return counter_total(counter, model)
    except Exception as exc:  # noqa: BLE001 - whatever the host forward raises, the cell says why it has no count
        why = (str(exc).strip().splitlines() or [""])[0]
        raise Unsupported(f"FLOPs of {shape.family}: torch's counter cannot run it on the meta device ({failure}) "
                          f"nor on the host ({type(exc).__name__}: {why})") from exc


@functools.lru_cache(maxsize=1)
def _host_model(shape: Preset, task: str):
    """The fp32 eager model of `shape` on the host, to count a family the meta device cannot run; one kept, as a
    batch of several lengths counts each (its weights: the folder's, whose values no count depends on)."""
    from .build import build_model

    model = build_model(_counted_ref(shape), task, attn="eager", device="cpu")
    _countable_experts(model)
    return model


def counted_split(shape: Preset, seq: int, task: str) -> tuple[int, int]:
    """(FLOPs per sequence, FLOPs once per forward) of a counted family at `seq` tokens, from counts of one
    and of two sequences. Some work does not grow with the batch: DeBERTa projects its relative-position
    embeddings once per forward, which a count of one sequence times the batch would repeat (+12.8% at
    batch 2 on a 2-layer DeBERTa)."""
    one, two = counted_flops(shape, seq, task), counted_flops(shape, seq, task, 2)
    return two - one, 2 * one - two


def forward_flops(shape: Preset, seq_lens: int | Sequence[int], task: str = "base") -> tuple[int, str]:
    """(FLOPs of one forward over a batch whose real sequence lengths are `seq_lens`, "analytic" | "counted")."""
    lens = [seq_lens] if isinstance(seq_lens, int) else list(seq_lens)
    if shape.family in ANALYTIC:
        return analytic_forward_flops(shape, lens, task), "analytic"
    return sum(counted_split(shape, s, task)[0] for s in lens) + counted_split(shape, max(lens), task)[1], "counted"


def training_flops(shape: Preset, seq: int, task: str, *, head_tokens: int | None = None,
                   recompute: bool = False) -> int:
    """FLOPs of one training step of one `seq`-token sequence: 3 x the forward (backward = 2 x forward).

    MFU's numerator is what the model needs (PaLM, Chowdhery et al. 2022, appendix B: "model FLOPs"):
    `recompute` False, and for mlm `head_tokens` = the positions that carry a label (BERT's ~15%), the
    head counted on those only, whether or not the step runs it on every position. What the hardware
    executes (HFU's numerator) is `recompute` True under activation checkpointing (each layer's forward
    once more; the head is not checkpointed) and the head on every position where the step runs it there.
    Families counted by torch's counter: the count of the task's forward less the bare model's is the head, so
    an MLM head is counted on `head_tokens` of the `seq` positions as for the analytic families (ALBERT's and
    DeBERTa's heads were counted on every position: for a small ALBERT, 1.34 times the MFU of a hand count); 3 x
    that per-sequence part (work done once per forward, `counted_split`, is left out: a step's count is this times
    its sequences), and the bare model once more with `recompute`."""
    if shape.family not in ANALYTIC:
        total = counted_split(shape, seq, task)[0]
        body = counted_split(shape, seq, "base")[0] if recompute or (task == "mlm" and head_tokens is not None) \
            else total
        if task == "mlm" and head_tokens is not None:
            total = body + (total - body) * head_tokens // seq
        return 3 * total + (body if recompute else 0)
    windows = attention_windows(shape)
    layers = sum(layer_flops(shape, seq, k, windows) for k in range(shape.layers))
    head = head_flops(shape, task, head_tokens if task == "mlm" and head_tokens is not None else seq)
    return 3 * (layers + head) + (layers if recompute else 0)


def decode_token_flops(shape: Preset, context: int) -> int:
    """FLOPs to produce one new token when `context` tokens (the new one included) are in the cache: scores
    and values over every key of a full layer, over the last `window` of a sliding-window one. A counted
    family: the count of a one-token forward (every projection, the MLP whatever its form, the head, the new
    token's own key) plus, per earlier key its layers attend, what its own step spends on one (`_step_layers`)."""
    h, i = shape.hidden, shape.intermediate
    q, kv = shape.heads * shape.dim, shape.kv * shape.dim
    # Nor a key its cache dropped: a Llama or Moshi config that names a sliding_window attends every earlier key in
    # its prefill, but transformers' DynamicCache keeps w - 1 of them (`cache_windows`), so each step scores w
    # (checked against torch's count of a real step in tests/test_flops_window.py).
    keys = [min([context, *(w for w in pair if w is not None)])
            for pair in zip(attention_windows(shape), cache_windows(shape))]
    if shape.family not in ANALYTIC:
        per_key = _step_layers(shape, _config_key(shape))[0]
        return counted_flops(shape, 1, "causal-lm") + sum(c * (k - 1) for c, k in zip(per_key, keys))
    ffn = (6 if shape.family in GATED_MLP else 4) * h * i
    return shape.layers * (4 * h * q + 4 * h * kv + ffn) + sum(4 * k * q for k in keys) + 2 * h * shape.vocab


def generation_flops(shape: Preset, prompt: int, new_tokens: int) -> tuple[int, str]:
    """(Prompt forward (with its LM head) plus each further decoded token, per sequence; "analytic" | "counted")."""
    prefill, method = forward_flops(shape, prompt, "causal-lm")
    return prefill + sum(decode_token_flops(shape, prompt + k + 1) for k in range(new_tokens - 1)), method


def kv_cache_bytes(shape: Preset, seq: int, bytes_per_element: int) -> int:
    """Keys and values of every layer for one sequence of `seq` stored tokens: 2 x kv_heads x head_dim x bytes
    per token a layer keeps (grouped-query attention stores `kv_heads`, not `heads`; a counted family what its
    DynamicCache stores per token, `_step_layers`: a latent-attention layer's one latent). A full layer keeps all
    `seq`; a sliding-window layer of window w the last w - 1, what transformers' DynamicCache keeps between
    steps (DynamicSlidingWindowLayer in transformers.cache_utils: the next token's own key makes the w)."""
    widths = _step_layers(shape, _config_key(shape))[1]
    return sum((seq if w is None else min(seq, w - 1)) * width
               for w, width in zip(cache_windows(shape), widths)) * bytes_per_element
