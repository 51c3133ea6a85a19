"""Greedy decoders for `--task generate`: transformers' forward with a growing DynamicCache (eager, sdpa and
forced SDPA kernels) or with a StaticCache whose decode step is compiled or captured in a CUDA graph
(compile, cudagraph). Nothing here is family-specific: any transformers causal LM whose cache is a
transformers Cache runs (GPT-2, Llama, Qwen2, Mistral, ...); positions are passed explicitly.

A decoder has `prefill(input_ids) -> (B, V) logits`, `decode(next_ids (B,)) -> (B, V) logits`, `info`
and `cache_bytes()`, and may have `decode_greedy(next_ids) -> (B,) next tokens` (the fused engine's picks them inside
its captured step: greedy_step); a backend can bring its own through `Backend.generator(model, cell)`."""

from __future__ import annotations

import contextlib

from ..cells import Cell
from ..models.build import cache_kw, takes
from ..errors import Unsupported


def _cache_tensors(cache):
    """The key and value tensors a transformers cache holds (layouts differ between versions)."""
    import torch

    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                yield t


class HFGenerator:
    """transformers' forward with a DynamicCache that grows by one position per step."""

    def __init__(self, model, context=contextlib.nullcontext):
        self.model, self.context, self.cache = model, context, None
        self.info = {"kv_cache": "DynamicCache"}
        self._keep = {"logits_to_keep": 1} if takes(model, "logits_to_keep") else {}
        self.cache_kw = cache_kw(model)  # once: inspect.signature per decode step would sit in the timed loop

    def prefill(self, input_ids):
        import torch
        from transformers import DynamicCache

        try:
            self.cache = DynamicCache(config=self.model.config)
        except TypeError:  # transformers versions whose DynamicCache takes no config
            self.cache = DynamicCache()
        with torch.inference_mode(), self.context():
            out = self.model(input_ids=input_ids, **{self.cache_kw: self.cache}, use_cache=True, **self._keep)
        return out.logits[:, -1]

    def decode(self, next_ids):
        import torch

        with torch.inference_mode(), self.context():
            out = self.model(input_ids=next_ids[:, None], **{self.cache_kw: self.cache}, use_cache=True)
        return out.logits[:, -1]

    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _cache_tensors(self.cache))


def _check_static_window(config, max_len: int) -> None:
    """GPT-Neo's local layers cut their window out of a causal table by the key length (transformers'
    modeling_gpt_neo, GPTNeoSelfAttention._attn), and a static cache's key length is its size, not the tokens written:
    once the cache is longer than the window, each query's window sits where another position's would, and the
    compile and cudagraph cells were `wrong` (on the CPU too: the prefill's logits were 0.055 off). Its layers declare
    themselves in `attention_layers`; families whose windows transformers' StaticCache holds (Mistral's
    `sliding_window`) are not affected."""
    window = getattr(config, "window_size", None)
    if "local" in (getattr(config, "attention_layers", None) or ()) and isinstance(window, int) and window < max_len:
        raise Unsupported(f"generation with a static cache: {config.model_type}'s local attention (window {window}) "
                          f"places its window by the cache's length, {max_len} positions, not the tokens in it, so its "
                          "tokens would be wrong; a growing cache (the eager backend) generates it")


class StaticGenerator:
    """transformers' forward with a StaticCache (fixed-size buffers), the decode step on static input
    buffers so a backend can compile it or capture it in a CUDA graph (`build_step`; None: eager).

    The attention mask is a (B, max_len) buffer with ones up to the current position: decode attends
    over the whole static cache, and the mask hides the positions not written yet."""

    def __init__(self, model, batch: int, max_len: int, build_step=None, step: str = "eager"):
        import torch
        from transformers import StaticCache

        _check_static_window(model.config, max_len)
        device = next(model.parameters()).device
        self.model, self.build_step, self.max_len = model, build_step, max_len
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.mask = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.n = 0
        self.prompt = None  # the last prefill's input ids: _build runs them again
        self.step = None
        self.cache_position = takes(model, "cache_position")  # older transformers place keys by it
        self.cache_kw = cache_kw(model)  # once, not per step (_kwargs builds every decode step's arguments)
        self.info = {"kv_cache": "StaticCache", "decode_step": step}

    def _kwargs(self, ids, pos) -> dict:
        kw = {"input_ids": ids, "attention_mask": self.mask, "position_ids": pos, self.cache_kw: self.cache,
              "use_cache": True}
        if self.cache_position:
            kw["cache_position"] = pos[0]
        return kw

    def _decode_step(self):
        return self.model(**self._kwargs(self.ids, self.pos)).logits[:, -1]

    def prefill(self, input_ids):
        logits = self._fill(input_ids)
        self.prompt, self.n = input_ids, input_ids.shape[1]
        return logits

    def _fill(self, input_ids):
        """The prompt's forward into an emptied cache and mask: its last position's logits."""
        import torch

        batch, seq = input_ids.shape
        with torch.inference_mode():  # the cache's buffers are inference tensors: reset them in that mode
            self.cache.reset()
            self.mask.zero_()
            self.mask[:, :seq] = 1
            pos = torch.arange(seq, device=input_ids.device).expand(batch, seq)
            return self.model(**self._kwargs(input_ids, pos), logits_to_keep=1).logits[:, -1]

    def decode(self, next_ids):
        import torch

        if self.n >= self.max_len:
            raise ValueError(f"static cache is full ({self.max_len} positions)")
        with torch.inference_mode():
            self.ids.copy_(next_ids.view(-1, 1))
            self.pos.fill_(self.n)
            self.mask[:, self.n] = 1
            if self.step is None:
                self._build()
            out = self.step()
        self.n += 1
        return out

    def _build(self) -> None:
        """Build the decode step once, at the first decode: `build_step(step, device) -> (callable, info)` is the
        backend's (compile.py compiles it, cudagraph.py captures it). Compiling and capturing run the step, at this
        position, before the step proper does: a full-attention layer writes the same row again, but a sliding
        window that is full shifts its buffer at every write, and the first generation's tokens came out a step
        ahead (a Mistral of window 8 after 16 tokens matched fp32's in 5 of 16). So the prompt is run again into the
        emptied cache: whatever the build wrote, the step finds the cache as the prefill left it."""
        if self.build_step is None:
            self.step = self._decode_step
            return
        self.step, built = self.build_step(self._decode_step, self.ids.device)
        self._fill(self.prompt)
        self.mask[:, self.n] = 1
        self.info.update(built)

    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _cache_tensors(self.cache))


def greedy_step(gen, next_ids):
    """The tokens after next_ids by argmax: the decoder's own decode_greedy where it has one, else the argmax of
    decode's logits. The same tokens either way; the fused engine's runs the argmax inside its step's graph and copies
    no logits out (engine/argmax.py says what that saves)."""
    own = getattr(gen, "decode_greedy", None)
    return own(next_ids) if own is not None else gen.decode(next_ids).argmax(-1)


def cache_bytes(gen) -> int | None:
    """Bytes of the KV cache tensors a decoder holds, when it lets us see them."""
    if hasattr(gen, "cache_bytes"):
        return gen.cache_bytes()
    kv = getattr(gen, "kv", None)  # the fused engine's Generator keeps a list of per-layer buffers
    if isinstance(kv, (list, tuple)) and kv and all(hasattr(t, "element_size") for t in kv):
        return sum(t.numel() * t.element_size() for t in kv)
    return None


def make_generator(backend, model, cell: Cell):
    if backend.generator is not None:
        return backend.generator(model, cell)
    from .sdpa import KERNELS

    if backend.name in KERNELS:  # a forced SDPA kernel holds for every step
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kernel = getattr(SDPBackend, KERNELS[backend.name])
        gen = HFGenerator(model, context=lambda: sdpa_kernel([kernel]))
        gen.info["sdpa_kernel"] = KERNELS[backend.name].lower()
        return gen
    return HFGenerator(model)
