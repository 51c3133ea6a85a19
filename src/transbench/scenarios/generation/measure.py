"""The generation scenario: greedy decoding with a KV cache; prefill and each decode step timed apart.

One timed sample is one whole generation of `new_tokens` tokens for the batch: the prompt's forward
and the argmax of its last position (prefill, which yields the first token), then one forward per
further token (decode). Steps are timed back to back with CUDA events (perf_counter on the CPU) and
nothing synchronizes between them, so the total is what a user waits for. Correctness, on the first
generation (the one that compiles or captures): the prefill's last-position logits against an fp32 eager
reference (`wrong` over the dtype's tolerance), and the first greedy token that leaves the reference's,
which must be a near tie in fp32's logits at that step (_divergence: half precision may legitimately
pick another token there, never one far below). How many tokens agree is recorded in info.

A backend can bring its own decoder through `Backend.generator(model, cell)`: an object with
`prefill(input_ids) -> (B, V) logits` and `decode(next_ids (B,)) -> (B, V) logits` (optionally `info`,
`cache_bytes()`, `decode_greedy(next_ids) -> (B,) tokens` (backends/decoders.py greedy_step) and
`set_tune_budget(seconds)`, which a server calls with 0 for a generator it builds once it stops
tuning: serve/measure.py Decoders). The default is transformers' own forward with a DynamicCache."""

from __future__ import annotations

import statistics
import time

from ... import backends
from ...errors import Unsupported
from ...measure import device as dev
from ...measure import memory, timer
from ...measure.record import host_bound, timing_record
from ...models import build, flops
from ...cells import Cell, CellResult
from ...backends.decoders import HFGenerator, cache_bytes, greedy_step, make_generator
from ..inference.measure import (BROKEN, EAGER_SLACK, TOLERANCE, ModelCache, cell_inputs, eager_judged, model_for,
                                 reference_rows, rel_err)

# --- timing ---------------------------------------------------------------------------------------

class StepClock:
    """Timestamps between generation steps: CUDA events recorded back to back (no synchronization
    until `elapsed_ms`), or perf_counter on the CPU, where every op has finished when it returns. The host's
    clock is read at every mark too (`times`)."""

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
        self.times.append(time.perf_counter())

    def step_host_ms(self) -> float | None:
        """On a GPU, the host's time inside an early decode step: its own work (launching its kernels, or waiting
        where it synchronizes), the smaller of the first two steps'. The GPU's queue then holds little (the prefill's
        kernels and a step's), so the host does not wait on it; later, a GPU-bound decoder's host runs ahead until
        the queue is full and then waits on it, and its steps' host time is no longer theirs alone. Not the first
        step's alone: a greedy loop's first step may do more than the rest. The fused engine's fills its position in
        outside its graph (engine/gpt2.decode_greedy), and gpt2's cell at 1 x 512 read a first step's host time of
        0.185 ms against a GPU step of 0.166 ms (H200), warned host-bound, where the step timed by CUDA events
        could not be shorter than the host time of the steps that followed. None on a CPU (there every step's host
        time is the step) or with no decode step."""
        if not self.cuda or len(self.times) < 3:
            return None
        return min(b - a for a, b in zip(self.times[1:3], self.times[2:4])) * 1e3

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
        nxt = greedy_step(gen, nxt)
        tokens.append(nxt)
        if clock:
            clock.mark(k + 1)
    return torch.stack(tokens, 1), first


# --- the scenario ---------------------------------------------------------------------------------

# Largest fp32 logits kept a step for the token gate (_divergence): past them, a token's gap is at least the last's.
TOP_K = 64


def _reference_greedy(gen, input_ids, new_tokens: int):
    """fp32 greedy decoding that keeps, at each step, the largest logits, their ids and the logits' norm (what
    _divergence weighs a token against): (first logits, tokens (B, N), [(values, ids, norms)] a step), on the CPU."""
    import torch

    logits = gen.prefill(input_ids)
    first, tokens, steps = logits.float().cpu(), [], []
    for k in range(new_tokens):
        if k:
            logits = gen.decode(tokens[-1])
        top = logits.float().topk(min(TOP_K, logits.shape[-1]), -1)
        steps.append((top.values.cpu(), top.indices.cpu(), logits.float().norm(dim=-1).cpu()))
        tokens.append(logits.argmax(-1))
    return first, torch.stack(tokens, 1).cpu(), steps


def _reference(cache: ModelCache, cell: Cell, prompt, device):
    """fp32 eager reference on a few rows: prefill logits of the last position, its greedy tokens and each step's
    largest logits (_reference_greedy)."""
    rows = reference_rows(cell.batch)
    key = ("generate", cell.model_key(), cell.batch, cell.seq, cell.new_tokens, cell.seed)
    if key not in cache.refs:
        model = cache.base_model(cell)
        dev.set_matmul_precision("fp32")
        try:
            model.to(device)
            cache.refs[key] = _reference_greedy(HFGenerator(model), prompt[rows].to(device), cell.new_tokens)
        finally:
            model.to("cpu")
            dev.free_memory(device)
    return rows, *cache.refs[key]


def _eager_prefill_err(cache: ModelCache, cell: Cell, prompt, device) -> float | None:
    """rel_err against the fp32 reference's of the same model's eager prefill in the cell's dtype: how far the dtype
    itself moves this model's first logits, as eager_dtype_err for a forward. None where it cannot run."""
    import copy

    rows, ref_first, *_ = _reference(cache, cell, prompt, device)
    key = ("generate", cell.model_key(), cell.batch, cell.seq, cell.seed, cell.dtype)
    if key not in cache.eager_errs:
        model = copy.deepcopy(cache.base_model(cell))
        try:
            model.to(device=device, dtype=dev.torch_dtype(cell.dtype))
            cache.eager_errs[key] = rel_err(HFGenerator(model).prefill(prompt[rows].to(device)).float().cpu(),
                                            ref_first, None)
        except RuntimeError:  # out of memory beside the cell's model, or an op the dtype lacks here: no relief
            cache.eager_errs[key] = None
        finally:
            del model
            dev.free_memory(device)
    return cache.eager_errs[key]


def _agreement(tokens, ref_tokens) -> dict:
    same = (tokens.cpu() == ref_tokens)
    diverged = (~same).any(1)
    first = [int((~row).nonzero()[0]) if d else None for row, d in zip(same, diverged)]
    return {"greedy_token_match": float(same.float().mean()), "greedy_first_divergence": first}


def _divergence(tokens, ref_tokens, steps, tol: float) -> str | None:
    """Why the tokens may not have left fp32's where they first do, or None. Up to there both decoded the same
    prefix, so fp32's logits at that step judge the token taken: another precision may take a token whose fp32 logit
    is within sqrt(2) tol ||logits|| of the largest, the most two logits can move when the logits' rel_err is tol
    (the whole error in those two). A wider gap means that step's logits were further from fp32's than the prefill's
    gate allows: a decode step gone wrong (a cache the step read wrongly), not a near tie. A token outside the kept
    TOP_K is judged by the smallest kept logit, a gap it is at least."""
    tokens = tokens.cpu()
    for row in range(tokens.shape[0]):
        off = (tokens[row] != ref_tokens[row]).nonzero()
        if not len(off):
            continue
        k = int(off[0])
        values, ids, norms = (t[row] for t in steps[k])
        got = int(tokens[row, k])
        at = (ids == got).nonzero()
        gap = float(values[0] - (values[int(at[0])] if len(at) else values[-1]))
        allowed = 2 ** 0.5 * tol * float(norms)
        if gap > allowed:
            return (f"greedy token {k + 1} of reference row {row} is {got} where fp32's is {int(ref_tokens[row, k])}, "
                    f"{gap:.3g} below it in fp32's logits: past the {allowed:.3g} a near tie allows at the "
                    f"tolerance {tol:g}, so that decode step is wrong")
    return None


def weight_bytes(model) -> int:
    """Bytes of the weights one decode step reads: every parameter once (parameters() yields tied ones once), less
    an input embedding table that is not also the output projection (a step reads one row of it a sequence). GPT-2's
    tied table stays: the output projection reads all of it. Position tables count whole (under 1% of gpt2's)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    if inp is not None and (out is None or out.weight is not inp.weight):
        total -= inp.weight.numel() * inp.weight.element_size()
    return total


def decode_bandwidth(read_bytes: float, decode_ms: float | None, gpu) -> dict:
    """What a decode step's median time means in memory bandwidth: GB/s, and its share of the device's datasheet
    bandwidth (None where the device has no row: a CPU, an unknown GPU)."""
    if not decode_ms:
        return {"decode_gbs": None, "decode_hbm_share": None}
    from ...measure import peaks

    gbs = read_bytes / (decode_ms / 1e3) / 1e9
    row = peaks.lookup(gpu.name, gpu.memory_gb) if gpu is not None else None
    return {"decode_gbs": gbs, "decode_hbm_share": gbs / row.bandwidth_gbs if row else None}


def run(cell: Cell, cache: ModelCache) -> CellResult:
    import torch

    device = dev.resolve(cell.device)
    backend = backends.get(cell.backend)
    # a prompt and new tokens past the model's positions: the grid's other cells run (inference/cells.py check_lengths)
    reason = build.too_long(build.resolve(cell.model), cell.seq, cell.new_tokens) or \
        backend.unsupported_reason(device.type, cell.dtype, cell.task)
    if reason:
        return CellResult("unsupported", error=reason)
    if cell.quant != "none":
        return CellResult("unsupported", error="--quant measures the inference tasks; generation runs unquantized")
    if cell.seq_stdev > 0:
        raise Unsupported("generation runs equal-length prompts: leave out --seq-stdev with --task generate")
    shape = build.resolve(cell.model).shape
    prompt = cell_inputs(cell, shape).input_ids
    rows, ref_first, ref_tokens, ref_steps = _reference(cache, cell, prompt, device)

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
    tol, judged = TOLERANCE[cell.dtype], []
    if not err <= tol and eager_judged(cell):
        # Past the tolerance, held to how far the dtype itself moves this model, as a forward is (inference's
        # `wrong`): llama-3.2-1b's random weights in bf16 read prefill rel_err 0.0746 at 4 x 200 through CUDA graphs
        # (H200), and every backend's generation of it was `wrong`.
        info["eager_dtype_rel_err"] = eager = _eager_prefill_err(cache, cell, prompt, device)
        if eager is not None and eager < BROKEN and err <= EAGER_SLACK * eager:
            tol = EAGER_SLACK * eager  # the decode steps' gate too: their logits move as the prefill's may
            judged = [f"prefill rel_err {err:.3g} is over the {cell.dtype} tolerance {TOLERANCE[cell.dtype]:g}, and "
                      f"within {EAGER_SLACK:g} x the same model's eager {cell.dtype} prefill ({eager:.3g}): judged by "
                      "that"]
            memory.restart_peak(device)  # the eager copy sat beside the cell's model
    if not err <= tol:
        eager = info.get("eager_dtype_rel_err")
        beyond = "" if eager is None else f" and over {EAGER_SLACK:g} x the eager {cell.dtype} prefill's {eager:.3g}"
        return CellResult("wrong", record=record, info=info, error=f"prefill rel_err {err:.3g} over the {cell.dtype} "
                          f"tolerance {TOLERANCE[cell.dtype]:g}{beyond}")
    off = _divergence(tokens[rows], ref_tokens, ref_steps, tol)
    if off:
        return CellResult("wrong", record=record, info=info, error=off)

    clock = StepClock(device, n)

    def one_generation():
        greedy(gen, prompt, n, clock)
        host = clock.step_host_ms()
        steps = clock.elapsed_ms()
        return sum(steps), {"prefill": steps[0], "decode": steps[1:], **({} if host is None else {"decode_host": host})}

    sampled = timer.sample_steps(one_generation, device, timer.TimerConfig(cell.warmup, cell.min_time, cell.min_count))
    pre = timer.summarize(sampled.parts["prefill"])
    decodes = sampled.parts.get("decode", [])
    dec = timer.summarize(decodes) if decodes else None
    mem = memory.snapshot(device)
    gpu = dev.gpu_info(device)
    weights = weight_bytes(model)
    fl, flops_method = flops.generation_flops(shape, cell.seq, n)
    fl *= cell.batch
    elem = torch.empty((), dtype=dev.torch_dtype(cell.dtype)).element_size()
    measured = cache_bytes(gen)
    timing, warnings = timing_record(sampled, items=cell.batch, tokens=cell.batch * n, flops=fl, gpu=gpu,
                                     dtype=cell.dtype)
    record.update(timing)
    if sampled.parts.get("decode_host") and dec:  # a decode step that holds the host is timed by the CPU's speed
        record["host_ms"] = statistics.median(sampled.parts["decode_host"])
        warnings += host_bound(record["host_ms"], dec.median_ms, "decode step")
    record.update({
        "prefill_ms": pre.median_ms, "ttft_ms": pre.median_ms,
        "decode_ms_per_token": dec.median_ms if dec else None,
        "decode_p90_ms_per_token": dec.p90_ms if dec else None, "itl_p99_ms": dec.p99_ms if dec else None,
        "peak_mem_mb": mem["peak_mem_mb"], "gpu": gpu.name if gpu else None, "flops_method": flops_method,
        # What a cache needs for the tokens it stores (prompt + new tokens - 1: the last one is never fed
        # back), next to what the decoder's cache tensors really hold.
        "kv_cache_analytic_mb": flops.kv_cache_bytes(shape, cell.seq + n - 1, elem) * cell.batch / 2**20,
        "kv_cache_mb": measured / 2**20 if measured is not None else None,
        # A decode step reads every weight and the cache of every token before it: at step k (1..n-1) the prompt
        # and k tokens, seq + n/2 on average over the steps.
        **decode_bandwidth(weights + flops.kv_cache_bytes(shape, cell.seq + n // 2, elem) * cell.batch,
                           dec.median_ms if dec else None, gpu),
    })
    info.update({"stats": sampled.stats.as_dict(), "prefill_stats": pre.as_dict(),
                 "decode_stats": dec.as_dict() if dec else None, "memory": mem, "flops_per_generation": fl,
                 "allocated_growth_mb": (after - before) if before is not None else None,
                 "prefill_samples_ms": sampled.parts["prefill"], "device_context": sampled.context.summary()})
    del model, gen
    return CellResult("ok", record=record, samples_ms=sampled.samples_ms, info=info, warnings=judged + warnings)
