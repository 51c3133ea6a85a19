"""The generation scenario: greedy decoding with a KV cache; prefill and each decode step timed apart.

One timed sample is one whole generation of `new_tokens` tokens for the batch: the prompt's forward
and the argmax of its last position (prefill, which yields the first token), then one forward per
further token (decode). Steps are timed back to back with CUDA events (perf_counter on the CPU) and
nothing synchronizes between them, so the total is what a user waits for. Correctness: the prefill's
last-position logits against an fp32 eager reference (`wrong` over the dtype's tolerance); how many
greedy tokens agree with the fp32 reference's is recorded in info (half precision may legitimately
pick another token at a near tie, so it is not a gate).

A backend can bring its own decoder through `Backend.generator(model, cell)`: an object with
`prefill(input_ids) -> (B, V) logits` and `decode(next_ids (B,)) -> (B, V) logits` (optionally `info`
and `cache_bytes()`). The default is transformers' own forward with a DynamicCache."""

from __future__ import annotations

import contextlib
import inspect
import time

from .. import backends
from ..errors import Unsupported
from ..measure import device as dev
from ..measure import memory, timer
from ..measure.record import timing_record
from ..models import build, flops
from ..cells import Cell, CellResult
from .inference import TOLERANCE, ModelCache, cell_inputs, model_for, reference_rows, rel_err

# --- decoders ---------------------------------------------------------------------------------------

def _cache_tensors(cache):
    """The key and value tensors a transformers cache holds (layouts differ between versions)."""
    import torch

    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                yield t


def _takes(model, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


class HFGenerator:
    """transformers' forward with a DynamicCache that grows by one position per step."""

    def __init__(self, model, context=contextlib.nullcontext):
        self.model, self.context, self.cache = model, context, None
        self.info = {"kv_cache": "DynamicCache"}
        self._keep = {"logits_to_keep": 1} if _takes(model, "logits_to_keep") else {}

    def prefill(self, input_ids):
        import torch
        from transformers import DynamicCache

        try:
            self.cache = DynamicCache(config=self.model.config)
        except TypeError:  # transformers versions whose DynamicCache takes no config
            self.cache = DynamicCache()
        with torch.inference_mode(), self.context():
            out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True, **self._keep)
        return out.logits[:, -1]

    def decode(self, next_ids):
        import torch

        with torch.inference_mode(), self.context():
            out = self.model(input_ids=next_ids[:, None], past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1]

    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _cache_tensors(self.cache))


class StaticGenerator:
    """transformers' forward with a StaticCache (fixed-size buffers), the decode step on static input
    buffers so it can be compiled (step="compile") or captured in a CUDA graph (step="cudagraph").

    The attention mask is a (B, max_len) buffer with ones up to the current position: decode attends
    over the whole static cache, and the mask hides the positions not written yet."""

    def __init__(self, model, batch: int, max_len: int, step: str = "eager", mode: str = "default"):
        import torch
        from transformers import StaticCache

        device = next(model.parameters()).device
        self.model, self.step_kind, self.mode, self.max_len = model, step, mode, max_len
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.mask = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.n = 0
        self.step = None
        self.cache_position = _takes(model, "cache_position")  # older transformers place keys by it
        self.info = {"kv_cache": "StaticCache", "decode_step": step}

    def _kwargs(self, ids, pos) -> dict:
        kw = {"input_ids": ids, "attention_mask": self.mask, "position_ids": pos, "past_key_values": self.cache,
              "use_cache": True}
        if self.cache_position:
            kw["cache_position"] = pos[0]
        return kw

    def _decode_step(self):
        return self.model(**self._kwargs(self.ids, self.pos)).logits[:, -1]

    def prefill(self, input_ids):
        import torch

        batch, seq = input_ids.shape
        with torch.inference_mode():  # the cache's buffers are inference tensors: reset them in that mode
            self.cache.reset()
            self.mask.zero_()
            self.mask[:, :seq] = 1
            pos = torch.arange(seq, device=input_ids.device).expand(batch, seq)
            out = self.model(**self._kwargs(input_ids, pos), logits_to_keep=1)
        self.n = seq
        return out.logits[:, -1]

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
        """Compile or capture the decode step, once, on the cache as the first decode finds it."""
        import torch

        device = self.ids.device
        if self.step_kind == "eager":
            self.step = self._decode_step
        elif self.step_kind == "compile":
            from ..backends.compile import check_mode

            torch._dynamo.reset()
            compiled = torch.compile(self._decode_step, mode=check_mode(self.mode), dynamic=False)
            counters = self._counters()
            t0 = time.perf_counter()
            with torch.inference_mode():
                compiled()  # compiles; the replayed step below runs the same positions again
            dev.synchronize(device)
            self.info.update(compile_s=time.perf_counter() - t0, compile_mode=self.mode)
            self._restore(counters)
            self.step = compiled
        elif self.step_kind == "cudagraph":
            from ..backends.cudagraph import capture

            counters = self._counters()
            graph, out, capture_s = capture(self._decode_step, device)
            self._restore(counters)
            self.info["capture_s"] = capture_s

            def replay():
                graph.replay()
                return out

            self.step = replay
        else:
            raise ValueError(f"unknown decode step '{self.step_kind}'")

    def _counters(self) -> list:
        """Newer StaticCache layers count written positions in a device tensor that every forward
        advances; warm-up and compile calls must not move it."""
        return [(layer, layer.cumulative_length.clone()) for layer in getattr(self.cache, "layers", [])
                if hasattr(getattr(layer, "cumulative_length", None), "copy_")]

    @staticmethod
    def _restore(saved: list) -> None:
        for layer, value in saved:
            layer.cumulative_length.copy_(value)

    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _cache_tensors(self.cache))


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
    from ..backends.sdpa import KERNELS

    if backend.name in KERNELS:  # a forced SDPA kernel holds for every step
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kernel = getattr(SDPBackend, KERNELS[backend.name])
        gen = HFGenerator(model, context=lambda: sdpa_kernel([kernel]))
        gen.info["sdpa_kernel"] = KERNELS[backend.name].lower()
        return gen
    return HFGenerator(model)


# --- timing ---------------------------------------------------------------------------------------

class StepClock:
    """Timestamps between generation steps: CUDA events recorded back to back (no synchronization
    until `elapsed_ms`), or perf_counter on the CPU, where every op has finished when it returns."""

    def __init__(self, device, steps: int):
        import torch

        self.cuda = device.type == "cuda"
        self.marks: list = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if self.cuda else []
        self.device = device

    def start(self):
        self.times = []
        self.mark(0)

    def mark(self, i: int) -> None:
        if self.cuda:
            self.marks[i].record()
        else:
            self.times.append(time.perf_counter())

    def elapsed_ms(self) -> list[float]:
        """Milliseconds of each step, in order."""
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.times, self.times[1:])]


def greedy(gen, input_ids, new_tokens: int, clock: StepClock | None = None, keep_first: bool = False):
    """Greedy decoding of `new_tokens` tokens: (tokens (B, N), first logits on the CPU if kept)."""
    import torch

    if clock:
        clock.start()
    logits = gen.prefill(input_ids)
    first = logits.float().cpu() if keep_first else None  # engines may reuse the logits buffer
    nxt = logits.argmax(-1)
    if clock:
        clock.mark(1)
    tokens = [nxt]
    for k in range(1, new_tokens):
        nxt = gen.decode(nxt).argmax(-1)
        tokens.append(nxt)
        if clock:
            clock.mark(k + 1)
    return torch.stack(tokens, 1), first


# --- the scenario ---------------------------------------------------------------------------------

def _reference(cache: ModelCache, cell: Cell, prompt, device):
    """fp32 eager reference on a few rows: prefill logits of the last position, and its greedy tokens."""
    rows = reference_rows(cell.batch)
    key = ("generate", cell.model_key(), cell.batch, cell.seq, cell.new_tokens, cell.seed)
    if key not in cache.refs:
        model = cache.base_model(cell)
        dev.set_matmul_precision("fp32")
        try:
            model.to(device)
            tokens, first = greedy(HFGenerator(model), prompt[rows].to(device), cell.new_tokens, keep_first=True)
            cache.refs[key] = (first, tokens.cpu())
        finally:
            model.to("cpu")
            dev.free_memory(device)
    return rows, *cache.refs[key]


def _agreement(tokens, ref_tokens) -> dict:
    same = (tokens.cpu() == ref_tokens)
    diverged = (~same).any(1)
    first = [int((~row).nonzero()[0]) if d else None for row, d in zip(same, diverged)]
    return {"greedy_token_match": float(same.float().mean()), "greedy_first_divergence": first}


def run(cell: Cell, cache: ModelCache) -> CellResult:
    import torch

    device = dev.resolve(cell.device)
    backend = backends.get(cell.backend)
    reason = backend.unsupported_reason(device.type, cell.dtype, cell.task)
    if reason:
        return CellResult("unsupported", error=reason)
    if cell.seq_stdev > 0:
        raise Unsupported("generation runs equal-length prompts: leave out --seq-stdev with --task generate")
    shape = build.resolve(cell.model).shape
    prompt = cell_inputs(cell, shape).input_ids
    rows, ref_first, ref_tokens = _reference(cache, cell, prompt, device)

    model = model_for(cache, cell, backend, device)
    prompt = prompt.to(device)
    n = cell.new_tokens

    t0 = time.perf_counter()
    gen = make_generator(backend, model, cell)
    before = memory.current(device).get("allocated_mb")
    tokens, first = greedy(gen, prompt, n, keep_first=True)  # also compiles or captures
    dev.synchronize(device)
    after = memory.current(device).get("allocated_mb")
    first_s = time.perf_counter() - t0
    err = rel_err(first[rows], ref_first, None)
    info = {"attn_implementation": model.config._attn_implementation, "first_generation_s": first_s,
            "param_dtype": str(next(model.parameters()).dtype), "device": str(device),
            **_agreement(tokens[rows], ref_tokens), **getattr(gen, "info", {})}
    if not cell.embeddings:
        info["embeddings"] = "timed: generation always embeds the new token"
    record = {"rel_err": err, "new_tokens": n}
    if not err <= TOLERANCE[cell.dtype]:
        return CellResult("wrong", record=record, info=info,
                          error=f"prefill rel_err {err:.3g} over the {cell.dtype} tolerance {TOLERANCE[cell.dtype]:g}")

    clock = StepClock(device, n)

    def one_generation():
        greedy(gen, prompt, n, clock)
        steps = clock.elapsed_ms()
        return sum(steps), {"prefill": steps[0], "decode": steps[1:]}

    sampled = timer.sample_steps(one_generation, device, timer.TimerConfig(cell.warmup, cell.min_time, cell.min_count))
    pre = timer.summarize(sampled.parts["prefill"])
    decodes = sampled.parts.get("decode", [])
    dec = timer.summarize(decodes) if decodes else None
    mem = memory.snapshot(device)
    gpu = dev.gpu_info(device)
    fl = flops.generation_flops(shape, cell.seq, n) * cell.batch
    elem = torch.empty((), dtype=dev.torch_dtype(cell.dtype)).element_size()
    measured = cache_bytes(gen)
    timing, warnings = timing_record(sampled, items=cell.batch, tokens=cell.batch * n, flops=fl, gpu=gpu,
                                     dtype=cell.dtype)
    record.update(timing)
    record.update({
        "prefill_ms": pre.median_ms, "ttft_ms": pre.median_ms,
        "decode_ms_per_token": dec.median_ms if dec else None,
        "decode_p90_ms_per_token": dec.p90_ms if dec else None, "itl_p99_ms": dec.p99_ms if dec else None,
        "peak_mem_mb": mem["peak_mem_mb"], "gpu": gpu.name if gpu else None, "flops_method": "analytic",
        # What a cache needs for the tokens it stores (prompt + new tokens - 1: the last one is never fed
        # back), next to what the decoder's cache tensors really hold.
        "kv_cache_analytic_mb": flops.kv_cache_bytes(shape, cell.seq + n - 1, elem) * cell.batch / 2**20,
        "kv_cache_mb": measured / 2**20 if measured is not None else None,
    })
    info.update({"stats": sampled.stats.as_dict(), "prefill_stats": pre.as_dict(),
                 "decode_stats": dec.as_dict() if dec else None, "memory": mem, "flops_per_generation": fl,
                 "allocated_growth_mb": (after - before) if before is not None else None,
                 "prefill_samples_ms": sampled.parts["prefill"], "device_context": sampled.context.summary()})
    del model, gen
    return CellResult("ok", record=record, samples_ms=sampled.samples_ms, info=info, warnings=warnings)
