"""The serve scenario: one backend under load. The same correctness gate as `run` first (a wrong backend
is `wrong`, never loaded), then the load loop (serve_load) over shape buckets, then the accounting.

Shapes: a backend's prepared callable is built for one input shape, and the graph backends (cudagraph,
fused) replay captured graphs that exist for fixed shapes only. A batch is therefore padded to a bucket:
its size up to the next power of two (capped at --max-batch-size), its width up to the next multiple of
LEN_STEP. Every bucket the lengths can reach is prepared (captured, compiled) before the load starts, so
no capture happens under load; only the inputs change per batch, copied into the bucket's buffers (the
token ids and the padding mask: the mask is what decides the real work of a packing backend). Padding
rows of a partly filled bucket are one token long. A packing backend (fused) runs the real tokens of each
batch only (no padding work), so it gets one width per batch size; the fused engine keys its own graphs on
the packed token count rounded up to a multiple of its token bucket (128 on CUDA, CompiledModel.token_bucket),
so warming calls each batch size's engine once per token count the lengths can reach (token_counts): on an
H100 bert-base batch 16 x 256 is 33 graphs, each captured and its kernel routes tuned (engine/tuning.py) before
the load; the count of graphs captured under load is in the cell's info (0 when the warm-up covered them).

Generation (decoders, --task generate) is batch-synchronous greedy decoding: a batch's prompts are
padded to its bucket width and decoded together for --new-tokens steps with the backend's generator;
each token is synchronized to the host as it is produced (what a streaming server returns), giving time
to first token, inter-token gaps and end-to-end latency. The generators take token ids without a mask,
so a padded prompt costs its bucket's full width."""

from __future__ import annotations

import time

from ... import backends
from ...cells import Cell, CellResult
from ...measure import device as dev
from ...measure import memory
from ...measure.context import Monitor
from ...models import build
from ..inference.measure import TOLERANCE, ModelCache, cell_inputs, model_for, output_tensor, reference, rel_err
from .arrivals import poisson_arrivals, window_s
from .batcher import BatchPolicy
from .cell import ServeCell
from .load import DRAIN_LIMIT_S, LoadPlan, run_load
from .stats import account

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


def token_counts(batch: int, max_len: int, top: int, step: int) -> list[int]:
    """A real-token count of a (batch, top) bucket for each packed size a packing backend rounding to `step` can
    run: every multiple of `step` from the smallest reachable (each row holds at least one token: padding rows are
    one token) to batch x max_len, each as the largest reachable count it covers; plus one token short of a full
    batch where a full one (no padding: the engine runs it dense) is reachable, as that one is packed."""
    hi, full = batch * max_len, batch * top
    counts = {min(m, hi) for m in range(-(-batch // step) * step, hi + step, step)}
    if hi == full and hi - 1 >= batch:
        counts.add(hi - 1)
    return sorted(counts)


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

    def entry(self, batch: int, seq: int, stdev: float = 0.0):
        key = (batch, seq, stdev)
        if key not in self.prepared:
            import torch

            pc = probe_cell(self.cell, batch, seq, stdev)
            inputs = cell_inputs(pc, self.shape)
            if inputs.attention_mask is None:  # every bucket carries a mask buffer: lengths change per batch
                inputs.attention_mask = torch.ones_like(inputs.input_ids)
            inputs = inputs.to(self.device)
            prepared = self.backend.prepare(self.model, inputs, pc)
            prepared.fn()  # compiles or captures here, never under load
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

    def serve(self, requests) -> None:
        import torch

        n = len(requests)
        width = self.top if self.packs else len_bucket(max(r.length for r in requests), self.top)
        inputs, prepared, _ = self.entry(batch_bucket(n, self.cell.max_batch_size), width)
        lengths = [r.length for r in requests] + [1] * (inputs.batch - n)
        mask = (torch.arange(inputs.input_ids.shape[1])[None, :] < torch.tensor(lengths)[:, None])
        inputs.attention_mask.copy_(mask, non_blocking=True)
        output_tensor(prepared.fn(), self.cell.task)[:n].cpu()  # the results on the host

    def warm(self, lengths) -> None:
        """Prepare every bucket the load can reach; for a backend with a graph per packed token count (fused),
        run each count once (token_counts), so its graphs are captured and tuned now, not under load."""
        max_len = lengths.max
        self.top = len_bucket(max_len, self.shape.max_positions)
        for b, s in buckets(self.cell.max_batch_size, max_len, self.top, lengths.shortest):
            if self.packs and s != self.top:
                continue
            inputs, prepared, _ = self.entry(b, s)
            if prepared.token_bucket:
                for n in token_counts(b, max_len, s, prepared.token_bucket):
                    inputs.attention_mask.copy_(even_mask(b, s, n))
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
            pc = probe_cell(self.cell, batch, seq)
            gen = make_generator(self.backend, self.model, pc)
            prompt = cell_inputs(pc, self.shape).input_ids.to(self.device)
            greedy(gen, prompt, self.cell.new_tokens)  # compiles or captures here, never under load
            self.gens[(batch, seq)] = (gen, prompt, pc)
        return self.gens[(batch, seq)]

    def gate_cell(self) -> Cell:
        seq = len_bucket(max(1, round(self.cell.length_dist.mean)), self.longest_prompt)
        return probe_cell(self.cell, min(GATE_BATCH, self.cell.max_batch_size), seq)

    def reference(self, cache: ModelCache):
        """The gate's fp32 prefill logits and greedy tokens (generation._reference: cached per worker)."""
        from ..generation.measure import _reference

        pc = self.gate_cell()
        return _reference(cache, pc, cell_inputs(pc, self.shape).input_ids, self.device)

    def check(self, cache: ModelCache) -> tuple[float, dict]:
        from ..generation.measure import greedy

        gate = self.gate_cell()
        gen, prompt, pc = self.entry(gate.batch, gate.seq)
        rows, ref_first, _ = self.reference(cache)
        dev.set_matmul_precision(self.cell.dtype)
        _, first = greedy(gen, prompt, self.cell.new_tokens, keep_first=True)
        return rel_err(first[rows], ref_first, None), dict(getattr(gen, "info", {}))

    def serve(self, requests) -> list[float]:
        from ..generation.measure import greedy

        gen, prompt, _ = self.entry(batch_bucket(len(requests), self.cell.max_batch_size),
                                    len_bucket(max(r.length for r in requests), self.top))
        greedy(gen, prompt, self.cell.new_tokens, self.steps)
        return self.steps.times

    @property
    def longest_prompt(self) -> int:
        """A prompt's bucket leaves room for the new tokens in the model's positions."""
        return self.shape.max_positions - self.cell.new_tokens

    def warm(self, lengths) -> None:
        self.top = len_bucket(lengths.max, self.longest_prompt)
        for b, s in buckets(self.cell.max_batch_size, lengths.max, self.top, lengths.shortest):
            self.entry(b, s)


def plan_for(cell: ServeCell) -> tuple[LoadPlan, float | None]:
    span = cell.warmup + cell.duration
    dist = cell.length_dist
    if cell.mode == "rate":  # a low rate's window stretches to MIN_REQUESTS expected arrivals
        window = window_s(cell.rate, cell.warmup, cell.duration)
        arrivals = poisson_arrivals(cell.rate, window, cell.seed)
        return LoadPlan(dist.draw(max(1, len(arrivals)), cell.seed + 1), arrivals=arrivals, span_s=window,
                        warmup_s=cell.warmup), cell.rate
    clients = cell.concurrency if cell.mode == "concurrency" else OFFLINE_QUEUE * cell.max_batch_size
    return LoadPlan(dist.draw(4096, cell.seed + 1), concurrency=clients, span_s=span, warmup_s=cell.warmup), None


def run(cell: ServeCell, cache: ModelCache) -> CellResult:
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
    server.warm(cell.length_dist)
    info.update(prepare_s=time.perf_counter() - t0, shape_buckets=sorted({k[:2] for k in
                getattr(server, "prepared", getattr(server, "gens", {}))}), len_step=LEN_STEP)
    counts_graphs = isinstance(server, Encoders) and any(p.graphs for _, p, _ in server.prepared.values())
    graphs_before = server.engine_graphs() if counts_graphs else 0

    plan, offered = plan_for(cell)
    # Sampling starts before the load, and the warm-up's end moves the region's start (Monitor.mark): no NVML
    # call runs on the serving thread while requests arrive.
    with Monitor(device) as monitor:
        trace = run_load(server.serve, plan, BatchPolicy(cell.max_batch_size, cell.max_wait_ms / 1e3),
                         on_measure=monitor.mark)
    rec, samples, load_info = account(trace, cell.slo_ms, offered)
    if not samples:
        return CellResult("error", record=record, info=info,
                          error="no request arrived after the warm-up: lengthen --duration or raise the rate")
    record.update(rec)
    ctx = monitor.context
    info.update(load_info, device_context=ctx.summary())
    if ctx.energy_j is not None and rec.get("requests"):
        record["j_per_request"] = ctx.energy_j / rec["requests"]
        record["avg_power_w"] = ctx.energy_j / ctx.seconds if ctx.seconds > 0 else None
    if counts_graphs:  # prepare_s above includes capturing (and tuning) these before the load
        after = server.engine_graphs()
        info.update(engine_graphs_before_load=graphs_before, engine_graphs_after_load=after,
                    engine_graphs_captured_under_load=after - graphs_before)
    gpu = dev.gpu_info(device)
    record.update(peak_mem_mb=memory.snapshot(device)["peak_mem_mb"], gpu=gpu.name if gpu else None)
    warnings = list(ctx.warnings())
    if rec.get("unserved"):
        warnings.append(f"{rec['unserved']} requests were still queued {DRAIN_LIMIT_S:g} s after the last arrival "
                        "(past saturation): their latencies are lower bounds")
    del model, server
    return CellResult("ok", record=record, samples_ms=samples, info=info, warnings=warnings)


def measure(cell: dict, state: dict) -> CellResult:
    """The sweep's target for serve cells; the worker's ModelCache outlives the cell."""
    return run(ServeCell.from_dict(cell), state.setdefault("models", ModelCache()))
