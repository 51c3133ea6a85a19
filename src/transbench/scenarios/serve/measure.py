"""The serve scenario: one backend under load. The same correctness gate as `run` first (a wrong backend
is `wrong`, never loaded), then the load loop (serve_load) over shape buckets, then the accounting.

Shapes: a backend's prepared callable is built for one input shape, and the graph backends (cudagraph,
fused) replay captured graphs that exist for fixed shapes only. A batch is therefore padded to a bucket:
its size up to the next power of two (capped at --max-batch-size), its width up to the next multiple of
LEN_STEP. The buckets the lengths can reach are prepared (captured, compiled) before the load starts, the largest
first (it holds every batch), then the likeliest, within --prepare-budget seconds (prepare.py). Under load a batch
whose bucket was left runs the smallest prepared bucket that holds it (holder: more padding, no compile or capture
stalling the queue); only where none does is its own prepared then, counted (shapes_prepared_under_load,
graphs_captured_under_load): that first batch's latency carries it. Only
the inputs change per batch, copied into the bucket's buffers (the token ids and the padding mask: the mask is
what decides the real work of a packing backend). Padding rows of a partly filled bucket are one token long.
A packing backend (fused) runs the real tokens of each batch only (no padding work), so it gets one width per
batch size; the fused engine keys its graphs on the packed token count, which a server rounds up to a
geometric ladder (engine/packing.py token_ladder: each size at most 1.25x the one below, so padding stays
under a quarter of the tokens or one 128-token step, and at most one width S above the real count): bert-base
at batch 32 x 512 is 40 graphs where every multiple of 128 made 128. Warming runs each batch size's engine once
per ladder size the lengths can reach (token_counts), each capture tuning its kernel routes (engine/tuning.py)
within the engine's first-call budget. Under load a batch whose packed size has no graph runs the smallest
captured size that holds it (padding, engine/packing.py reuse_sizes); only a batch larger than every captured size
captures, without tuning.

Generation (decoders, --task generate) is batch-synchronous greedy decoding: a batch's prompts are
padded to its bucket width and decoded together for --new-tokens steps with the backend's generator;
each token is synchronized to the host as it is produced (what a streaming server returns), giving time
to first token, inter-token gaps and end-to-end latency. The generators take token ids without a mask,
so a padded prompt costs its bucket's full width."""

from __future__ import annotations

import time
from collections import Counter

from ... import backends
from ...cells import Cell, CellResult
from ...measure import device as dev
from ...measure import memory
from ...measure.context import Monitor
from ...models import build
from ..inference.measure import TOLERANCE, ModelCache, cell_inputs, model_for, output_tensor, reference, rel_err
from . import arrivals as arrival_kinds
from .arrivals import window_s
from .batcher import BatchPolicy
from .cell import ServeCell, prompt_room
from .load import DRAIN_LIMIT_S, LoadPlan, run_load
from .prepare import Step, by_need as _interleave, run_steps
from .stats import account
from .trace import read as read_trace

LEN_STEP = 32
GATE_BATCH = 4  # requests in the correctness check's batch (the reference covers its first and last two)
OFFLINE_QUEUE = 2  # offline keeps this many full batches queued, so every batch leaves full


def batch_bucket(n: int, max_batch: int) -> int:
    return min(max_batch, 1 << (n - 1).bit_length())


def len_bucket(n: int, top: int) -> int:
    return min(top, -(-n // LEN_STEP) * LEN_STEP)


def buckets(max_batch: int, max_len: int, top: int, min_len: int = 1) -> list[tuple[int, int]]:
    """Every (batch, width) bucket a load of lengths in [min_len, max_len] can reach. A batch's width is its
    longest request's bucket, so none is narrower than min_len's: `--lengths fixed:1000` warms one width, not
    32 (gpt2 fp16 generation on the fused backend spent its 180 s timeout preparing the 64 buckets of all)."""
    sizes = sorted({batch_bucket(n, max_batch) for n in range(1, max_batch + 1)})
    widths = sorted({len_bucket(n, top) for n in range(min(min_len, max_len), max_len + 1)})
    return [(b, s) for b in sizes for s in widths]


def token_counts(batch: int, max_len: int, top: int, step: int | list[int]) -> list[int]:
    """A real-token count of a (batch, top) bucket for each packed size a packing backend can run: `step` (every
    multiple of it) or the packed sizes themselves (a ladder), from the smallest reachable (each row holds at least
    one token: padding rows are one token) to batch x max_len, each as the largest reachable count it covers; plus
    one token short of a full batch where a full one (no padding: the engine runs it dense) is reachable, as that
    one is packed."""
    hi, full = batch * max_len, batch * top
    if isinstance(step, int):
        counts = {min(m, hi) for m in range(-(-batch // step) * step, hi + step, step)}
    else:
        sizes = sorted(step)
        counts = {min(r, hi) for lo, r in zip([0, *sizes], sizes) if r >= batch and lo < hi}
    if hi == full and hi - 1 >= batch:
        counts.add(hi - 1)
    return sorted(counts)


def packed_size(tokens: int, batch: int, top: int, sizes: list[int] | int) -> int:
    """The packed size (a graph) a batch of `tokens` real tokens runs: the first ladder size >= tokens, or the next
    multiple of a step; batch x top where nothing is padding (dense)."""
    if tokens >= batch * top:
        return batch * top + 1  # dense: a graph apart from the packed batch x top one
    if isinstance(sizes, int):
        return min(batch * top, -(-tokens // sizes) * sizes)
    return next((r for r in sorted(sizes) if r >= tokens), batch * top)


def holder(prepared, batch: int, width: int) -> tuple[int, int]:
    """The bucket a batch of (batch, width) runs under load: its own where prepared, else the smallest prepared one
    that holds it (more rows and columns of padding: its mask, or a generator's unmasked prompt, covers them), else
    its own, prepared then. `prepared` holds (batch, width, ...) keys. A shape prepared under load stalls every batch
    queued behind it for its compile or capture: the fused engine's packed sizes pad up the same way
    (engine/packing.py reuse_sizes)."""
    if (batch, width) in prepared or (batch, width, 0.0) in prepared:  # every batch's path under load: a lookup
        return batch, width
    shapes = {k[:2] for k in prepared if len(k) < 3 or not k[2]}  # not the gate's bucket of other lengths
    fits = [k for k in shapes if k[0] >= batch and k[1] >= width]
    return min(fits, key=lambda k: (k[0] * k[1], k)) if fits else (batch, width)


def bucket_steps(groups: dict[int, list[int]], counts: dict[int, Counter], entry) -> list[Step]:
    """Preparation steps over (batch, width) buckets, `entry(batch, width)` each: the largest bucket first (it holds
    every batch, so none prepares a shape under load: holder), then the likeliest (prepare.by_need)."""
    top = (max(groups), max(groups[max(groups)]))
    return [Step(f"batch {b} x {s}", lambda b=b, s=s: entry(b, s), key=(b, s))
            for b, s in [top, *_interleave(groups, counts)]]


def _for_load(prepared) -> None:
    """A prepared forward as the load runs it: a first call captures without racing kernels for seconds, and a
    padded call pads up to a captured graph before it captures one (engine/packing.py reuse_sizes)."""
    if prepared.tune_budget:
        prepared.tune_budget(0)
    if prepared.reuse_captured:
        prepared.reuse_captured(True)


TUNED_SHARE = 0.5  # of a server's preparation budget spent tuning shapes as they are captured (Encoders.warm)
SAMPLED_BATCHES = 256  # batches drawn per batch size to rank its shapes (prepare.by_need)


def sampled_batches(lengths, max_batch: int, seed: int) -> dict[int, list[list[int]]]:
    """For each batch-size bucket, SAMPLED_BATCHES batches' request lengths drawn from the load's lengths, each
    batch filling between half its bucket and all of it (the requests a batch of that bucket holds)."""
    import random

    rng = random.Random(seed + 7)
    draws = lengths.draw(SAMPLED_BATCHES * max_batch, seed + 7)
    out = {}
    for b in sorted({batch_bucket(n, max_batch) for n in range(1, max_batch + 1)}):
        lo = min(b, max(1, b // 2 + 1))
        out[b] = [rng.sample(draws, rng.randint(lo, b)) for _ in range(SAMPLED_BATCHES)]
    return out


def even_mask(batch: int, width: int, tokens: int):
    """A (batch, width) padding mask of `tokens` real tokens, spread evenly over the rows, each at least one."""
    import torch

    base, extra = divmod(tokens, batch)
    lengths = torch.tensor([base + 1] * extra + [base] * (batch - extra))
    return torch.arange(width)[None, :] < lengths[:, None]


def probe_cell(cell: ServeCell, batch: int, seq: int, stdev: float = 0.0) -> Cell:
    """The `run` cell of one bucket: the inference scenario's inputs, reference and generators take it."""
    return Cell(cell.model, cell.task, cell.backend, cell.dtype, batch, seq, device=cell.device, seq_stdev=stdev,
                activation=cell.activation, new_tokens=cell.new_tokens, seed=cell.seed, first_call_budget=True)


class Encoders:
    """Prepared forwards per bucket; `serve(requests)` runs one batch and copies its outputs to the host."""

    def __init__(self, model, backend, cell: ServeCell, shape, device):
        self.model, self.backend, self.cell, self.shape, self.device = model, backend, cell, shape, device
        self.prepared: dict[tuple, tuple] = {}
        # A packing backend drops the padding itself: one width per batch size suffices (fewer engines).
        self.packs = backend.packs

    loading = False  # set once the load starts: a shape prepared from then on is counted as prepared under load
    under_load = 0

    def entry(self, batch: int, seq: int, stdev: float = 0.0, call: bool = True):
        """The prepared forward of a bucket; `call`: run it once (compiles or captures), else only build it."""
        key = (batch, seq, stdev)
        if key not in self.prepared:
            import torch

            pc = probe_cell(self.cell, batch, seq, stdev)
            inputs = cell_inputs(pc, self.shape)
            if inputs.attention_mask is None:  # every bucket carries a mask buffer: lengths change per batch
                inputs.attention_mask = torch.ones_like(inputs.input_ids)
            inputs = inputs.to(self.device)
            prepared = self.backend.prepare(self.model, inputs, pc)
            if self.loading:
                self.under_load += 1
                _for_load(prepared)
            if call:
                prepared.fn()
            self.prepared[key] = (inputs, prepared, pc)
        return self.prepared[key]

    def gate_cell(self) -> Cell:
        """The correctness check's batch: variable lengths around the mean's bucket."""
        seq = len_bucket(max(1, round(self.cell.length_dist.mean)), self.shape.max_positions)
        return probe_cell(self.cell, min(GATE_BATCH, self.cell.max_batch_size), seq, seq / 4)

    def reference(self, cache: ModelCache):
        """The gate's fp32 reference (inference.reference: computed once per worker, then cached)."""
        pc = self.gate_cell()
        return reference(cache, pc, cell_inputs(pc, self.shape), self.device)

    def check(self, cache: ModelCache) -> tuple[float, dict]:
        """rel_err of a batch of variable lengths against the fp32 reference (inference.reference)."""
        gate = self.gate_cell()
        inputs, prepared, pc = self.entry(gate.batch, gate.seq, gate.seq_stdev)
        rows, ref = self.reference(cache)
        dev.set_matmul_precision(self.cell.dtype)
        out = output_tensor(prepared.fn(), self.cell.task)
        return rel_err(out[rows], ref, [inputs.lengths[i] for i in rows], inputs.input_ids.shape[1]), \
            prepared.what_ran()

    def entry_for(self, n: int, longest: int):
        """The prepared bucket a batch of n inputs, the longest `longest` tokens, runs (holder's under load): in-process
        serving's and the server's (server_model.py)."""
        width = self.top if self.packs else len_bucket(longest, self.top)
        bucket = (batch_bucket(n, self.cell.max_batch_size), width)
        return self.entry(*(holder(self.prepared, *bucket) if self.loading and self.backend.per_shape else bucket))

    def serve(self, requests) -> None:
        import torch

        n = len(requests)
        inputs, prepared, _ = self.entry_for(n, max(r.length for r in requests))
        lengths = [r.length for r in requests] + [1] * (inputs.batch - n)
        mask = (torch.arange(inputs.input_ids.shape[1])[None, :] < torch.tensor(lengths)[:, None])
        inputs.attention_mask.copy_(mask, non_blocking=True)
        output_tensor(prepared.fn(), self.cell.task)[:n].cpu()  # the results on the host

    def warm(self, lengths, budget_s: float | None = None, progress=None, clock=time.perf_counter) -> dict:
        """Prepare the buckets the load can reach, likeliest first, until `budget_s` seconds are spent (prepare.py);
        for a backend with a graph per packed token count (fused), run each batch size's engine once per packed size
        the lengths can reach (token_counts), so its graphs are captured and tuned now. Returns prepare.run_steps'
        account. Whatever is left is prepared on first use, under load, without tuning."""
        start = clock()
        max_len = lengths.max
        self.top = len_bucket(max_len, self.shape.max_positions)
        batches = sampled_batches(lengths, self.cell.max_batch_size, self.cell.seed)
        groups, counts = {}, {}
        if self.packs:
            for b in batches:  # built, not yet called: their packed sizes rank the graphs
                self.entry(b, self.top, call=False)
            for b, rows in batches.items():
                _, prepared, _ = self.prepared[(b, self.top, 0.0)]
                sizes = list(prepared.token_sizes) or prepared.token_bucket
                if not sizes:  # no graphs: one call prepares the bucket
                    groups[b], counts[b] = [None], Counter()
                    continue
                counts[b] = Counter(packed_size(sum(r) + b - len(r), b, self.top, sizes) for r in rows)
                groups[b] = [n if n < b * self.top else b * self.top + 1
                             for n in token_counts(b, max_len, self.top, sizes)]
                groups[b] = sorted(set(groups[b]), key=lambda n: packed_size(n, b, self.top, sizes))
                counts[b] = Counter({n: counts[b][packed_size(n, b, self.top, sizes)] for n in groups[b]})
            steps = [self._step(b, n) for b, n in _interleave(groups, counts)]
            # Each batch size's largest packed size (and its dense batch where the load drew one) captured first once
            # tuning stops: from then on every batch of that size pads into a captured graph (engine/packing.py
            # reuse_sizes) where it would otherwise capture under load. Ranked by need, these came last: the fused
            # server's first max-rate probe captured 5 graphs under load and its p99 went to 2,386 ms
            # (benchmarks/results/serve_fused_h100_2026-11.md).
            cover = [self._step(b, n) for b in sorted(groups, reverse=True) for n in groups[b]
                     if n is not None and (n == max(m for m in groups[b] if m <= b * self.top)
                                           or (n > b * self.top and counts[b][n]))]
        else:
            for b, rows in batches.items():
                widths = sorted({s for _, s in buckets(self.cell.max_batch_size, max_len, self.top, lengths.shortest)})
                groups[b] = widths
                counts[b] = Counter(len_bucket(max(r), self.top) for r in rows)
            steps, cover = bucket_steps(groups, counts, self.entry), []

        def untuned() -> None:
            for _, prepared, _ in self.prepared.values():
                if prepared.tune_budget:  # a graph met from here on is captured, not tuned for seconds
                    prepared.tune_budget(0)

        # Tuning takes the first TUNED_SHARE of the budget, the commonest shapes first; the rest of it captures the
        # remaining shapes on borrowed routes. Tuning every shape cold, the fused server had prepared 7 of 51 when
        # its 20 s were spent, and each shape left to the load stalled it while captured
        # (benchmarks/results/serve_fused_h100_2026-11.md); a borrowed route ran within 3% of the tuned one at
        # bert-base fp8 256 x 128 (first_process_quant_h100_2026-11.md).
        switch = budget_s * TUNED_SHARE if budget_s is not None and self.packs else None
        account = run_steps(steps, budget_s, f"{self.cell.backend} shapes", progress, clock, start,
                            switch_s=switch, on_switch=untuned, first_after_switch=cover)
        for _, prepared, _ in self.prepared.values():
            _for_load(prepared)
        return account

    def _step(self, b: int, n: int | None) -> Step:
        return Step(f"batch {b}" + (f", {min(n, b * self.top):,} tokens" if n else ""), lambda: self._call(b, n),
                    key=(b, n))

    def _call(self, b: int, n: int | None) -> None:
        """One call of batch size b's engine at n real tokens (n = b x top + 1: the dense, unpadded batch)."""
        inputs, prepared, _ = self.prepared[(b, self.top, 0.0)]
        if n is not None:
            inputs.attention_mask.copy_(even_mask(b, self.top, min(n, b * self.top)))
        prepared.fn()

    def engine_graphs(self) -> int:
        """Graphs the backend has captured so far (fused; 0 elsewhere): captures under load are its growth."""
        return sum(p.graphs() for _, p, _ in self.prepared.values() if p.graphs)


class StepTimes:
    """greedy()'s clock: each token synchronized to the host as it is produced, its host time kept."""

    def __init__(self, device):
        self.device, self.times = device, []

    def start(self) -> None:
        self.times = []

    def mark(self, k: int) -> None:
        dev.synchronize(self.device)
        self.times.append(time.perf_counter())


class Decoders:
    """A generator per bucket (the backend's own, or transformers' DynamicCache: generation.make_generator)."""

    def __init__(self, model, backend, cell: ServeCell, shape, device):
        self.model, self.backend, self.cell, self.shape, self.device = model, backend, cell, shape, device
        self.gens: dict[tuple[int, int], tuple] = {}
        self.steps = StepTimes(device)

    def entry(self, batch: int, seq: int):
        from ..generation.measure import greedy, make_generator

        if (batch, seq) not in self.gens:
            self.under_load += self.loading
            pc = probe_cell(self.cell, batch, seq)
            gen = make_generator(self.backend, self.model, pc)
            if (self.loading or not self.tuning) and hasattr(gen, "set_tune_budget"):
                # A capture, not seconds of races: gpt2 fp16 on the fused backend, one generator left to the load,
                # held its first 32 requests at 20/s for 4.9 s (benchmarks/results/http_serving_h200_2026-11.md).
                gen.set_tune_budget(0)
            prompt = cell_inputs(pc, self.shape).input_ids.to(self.device)
            greedy(gen, prompt, self.cell.new_tokens)  # compiles or captures here, never under load
            self.gens[(batch, seq)] = (gen, prompt, pc)
        return self.gens[(batch, seq)]

    def gate_cell(self) -> Cell:
        seq = len_bucket(max(1, round(self.cell.length_dist.mean)), self.longest_prompt)
        return probe_cell(self.cell, min(GATE_BATCH, self.cell.max_batch_size), seq)

    def reference(self, cache: ModelCache):
        """The gate's fp32 reference: rows, prefill logits, greedy tokens and steps (generation._reference: cached per
        worker)."""
        from ..generation.measure import _reference

        pc = self.gate_cell()
        return _reference(cache, pc, cell_inputs(pc, self.shape).input_ids, self.device)

    def check(self, cache: ModelCache) -> tuple[float, dict]:
        from ..generation.measure import greedy

        gate = self.gate_cell()
        gen, prompt, pc = self.entry(gate.batch, gate.seq)
        rows, ref_first, *_ = self.reference(cache)
        dev.set_matmul_precision(self.cell.dtype)
        _, first = greedy(gen, prompt, self.cell.new_tokens, keep_first=True)
        return rel_err(first[rows], ref_first, None), dict(getattr(gen, "info", {}))

    def serve(self, requests) -> list[float]:
        from ..generation.measure import greedy

        bucket = (batch_bucket(len(requests), self.cell.max_batch_size),
                  len_bucket(max(r.length for r in requests), self.top))
        gen, prompt, _ = self.entry(*(holder(self.gens, *bucket) if self.loading else bucket))
        # A trace's requests ask for their own output lengths: the batch decodes for its longest (at most
        # --new-tokens, what the generators' caches hold), each request done at its own last token (load.py).
        steps = min(self.cell.new_tokens, max(r.output or self.cell.new_tokens for r in requests))
        greedy(gen, prompt, steps, self.steps)
        return self.steps.times

    @property
    def longest_prompt(self) -> int:
        """A prompt's bucket leaves room for the new tokens in the model's positions."""
        return prompt_room(self.shape.max_positions, "generate", self.cell.new_tokens, endpoint=False)

    loading = False
    under_load = 0
    tuning = True  # False once warm's tuning share is spent: generators built from then on capture untuned

    def warm(self, lengths, budget_s: float | None = None, progress=None, clock=time.perf_counter) -> dict:
        """Prepare the buckets the load can reach, the largest first, then the likeliest, within `budget_s` seconds (as
        Encoders.warm: the first TUNED_SHARE of it tunes, the rest captures on borrowed routes)."""
        start = clock()
        self.top = len_bucket(lengths.max, self.longest_prompt)
        batches = sampled_batches(lengths, self.cell.max_batch_size, self.cell.seed)
        widths = sorted({s for _, s in buckets(self.cell.max_batch_size, lengths.max, self.top, lengths.shortest)})
        groups = {b: widths for b in batches}
        counts = {b: Counter(len_bucket(max(r), self.top) for r in rows) for b, rows in batches.items()}
        steps = bucket_steps(groups, counts, self.entry)
        tunes = any(hasattr(g, "set_tune_budget") for g, _, _ in self.gens.values())  # the gate's built one
        switch = budget_s * TUNED_SHARE if budget_s is not None and tunes else None
        return run_steps(steps, budget_s, f"{self.cell.backend} generators", progress, clock, start, switch_s=switch,
                         on_switch=lambda: setattr(self, "tuning", False))


def plan_for(cell: ServeCell) -> tuple[LoadPlan, float | None]:
    """The load's plan, made before it starts (arrival times, lengths, outputs): no server can move it."""
    span = cell.warmup + cell.duration
    dist = cell.length_dist
    if cell.mode == "rate":  # a low rate's window stretches to the expected arrivals its verdict needs
        window = window_s(cell.rate, cell.warmup, cell.duration, cell.need, cell.window_limit)
        times = arrival_kinds.parse(cell.arrivals).times(cell.rate, window, cell.seed)
        return LoadPlan(dist.draw(max(1, len(times)), cell.seed + 1), arrivals=times, span_s=window,
                        warmup_s=cell.warmup), cell.rate
    if cell.mode == "trace":
        trace = read_trace(cell.trace["path"])
        if trace.source != cell.trace["source"]:
            raise ValueError(f"the trace {cell.trace['path']} changed since the run began (its digest is now "
                             f"{trace.digest}, the cell's key names {cell.trace['source']})")
        times = trace.plan(cell.trace["speed"])
        measured_n = sum(1 for t in times if t >= cell.warmup)
        offered = measured_n / (times[-1] - cell.warmup) if times[-1] > cell.warmup else None
        return LoadPlan(list(trace.inputs), arrivals=times, outputs=list(trace.outputs), span_s=times[-1],
                        warmup_s=cell.warmup), offered
    clients = cell.concurrency if cell.mode == "concurrency" else OFFLINE_QUEUE * cell.max_batch_size
    # The offline cell measures at least the requests a verdict needs (as a rate's window stretches above), within
    # what --timeout leaves: its rate is the capacity a max-rate search bisects under. A concurrency cell keeps its
    # --duration (at least one request measured).
    return LoadPlan(dist.draw(4096, cell.seed + 1), concurrency=clients, span_s=span, warmup_s=cell.warmup,
                    min_measured=max(1, cell.need) if cell.mode == "offline" else 1,
                    limit_s=float("inf") if cell.window_limit is None else max(span, cell.window_limit)), None


def run(cell: ServeCell, cache: ModelCache, progress=None) -> CellResult:
    device = dev.resolve(cell.device)
    backend = backends.get(cell.backend)
    reason = backend.unsupported_reason(device.type, cell.dtype, cell.task)
    if reason:
        return CellResult("unsupported", error=reason)
    shape = build.resolve(cell.model).shape
    kind = Decoders if cell.task == "generate" else Encoders
    # The gate's fp32 reference runs on the device: computed here, before model_for starts the cell's memory peak,
    # as an inference cell computes its own. Inside the check it was counted unless an earlier cell of this worker
    # had left it cached, so the same cell's peak_mem_mb depended on the cells before it (H100, bert-tiny: 33.80
    # MiB first in a worker, 33.61 after another rate).
    kind(None, backend, cell, shape, device).reference(cache)
    model = model_for(cache, cell, backend, device)
    server = kind(model, backend, cell, shape, device)
    t0 = time.perf_counter()
    err, ran = server.check(cache)
    info = {"attn_implementation": model.config._attn_implementation, "device": str(device), **ran}
    record = {"rel_err": err}
    if not err <= TOLERANCE[cell.dtype]:
        return CellResult("wrong", record=record, info=info,
                          error=f"rel_err {err:.3g} over the {cell.dtype} tolerance {TOLERANCE[cell.dtype]:g}")
    plan, offered = plan_for(cell)  # before preparing: a changed trace file ends the cell here
    prep = server.warm(cell.length_dist, cell.prepare_budget, progress)
    prepare_s = time.perf_counter() - t0
    info.update(prepare_s=prepare_s, shape_buckets=sorted({k[:2] for k in
                getattr(server, "prepared", getattr(server, "gens", {}))}), len_step=LEN_STEP, preparation=prep)
    counts_graphs = isinstance(server, Encoders) and any(p.graphs for _, p, _ in server.prepared.values())
    graphs_before = server.engine_graphs() if counts_graphs else 0
    record.update(prepare_s=prepare_s, shapes_prepared=prep["prepared"], shapes_left=prep["left"])

    # Sampling starts before the load, and the warm-up's end moves the region's start (Monitor.mark): no NVML
    # call runs on the serving thread while requests arrive.
    server.loading = True
    with Monitor(device) as monitor:
        trace = run_load(server.serve, plan, BatchPolicy(cell.max_batch_size, cell.max_wait_ms / 1e3),
                         on_measure=monitor.mark)
    rec, samples, load_info = account(trace, None, offered, objectives=cell.objectives(), percentiles=cell.percentiles,
                                      tail_share=cell.tail_share)
    if not samples:
        return CellResult("error", record=record, info=info,
                          error="no request arrived after the warm-up: lengthen --duration or raise the rate")
    record.update(rec)
    ctx = monitor.context
    info.update(load_info, device_context=ctx.summary())
    if ctx.energy_j is not None and rec.get("requests"):
        record["j_per_request"] = ctx.energy_j / rec["requests"]
        record["avg_power_w"] = ctx.energy_j / ctx.seconds if ctx.seconds > 0 else None
    record["shapes_prepared_under_load"] = server.under_load
    if counts_graphs:  # prepare_s above includes capturing (and tuning) these before the load
        after = server.engine_graphs()
        info.update(engine_graphs_before_load=graphs_before, engine_graphs_after_load=after,
                    engine_graphs_captured_under_load=after - graphs_before)
        record["graphs_captured_under_load"] = after - graphs_before
    gpu = dev.gpu_info(device)
    record.update(peak_mem_mb=memory.snapshot(device)["peak_mem_mb"], gpu=gpu.name if gpu else None)
    warnings = list(ctx.warnings())
    if cell.mode == "trace" and cell.task == "generate" and max(plan.outputs or [0]) > cell.new_tokens:
        warnings.append(f"trace requests asking more than --new-tokens {cell.new_tokens} output tokens were cut to it "
                        "(the generators' caches hold that many)")
    if rec.get("unserved"):
        warnings.append(f"{rec['unserved']} requests were still queued {DRAIN_LIMIT_S:g} s after the last arrival "
                        "(past saturation): their latencies are lower bounds")
    del model, server
    return CellResult("ok", record=record, samples_ms=samples, info=info, warnings=warnings)


def measure(cell: dict, state: dict) -> CellResult:
    """The sweep's target for serve cells; the worker's ModelCache outlives the cell."""
    return run(ServeCell.from_dict(cell), state.setdefault("models", ModelCache()), state.get("progress"))
