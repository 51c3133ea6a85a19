"""The model behind `transbench server`: one thread that prepares a backend (the same correctness gate, shape buckets
and warm-up as in-process serving, measure.py), then batches the requests it is handed with the dynamic batcher and
runs them, handing each request's result (an embedding, or its tokens one by one) back to the event loop.

The model runs in this one thread, never on the event loop: a batch blocks for its service time, while the loop goes
on accepting requests and streaming tokens. Decoders batch prompts of one length together: the generators take token
ids without a padding mask (scenarios/generation), so a batch of mixed lengths would give the shorter prompts a wrong
continuation; a request waits with those of its own length, each length with its own batcher."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from .batcher import Batcher, BatchPolicy
from .cell import ServeCell
from .lengths import Lengths

# Batch sizes and request latencies histogram buckets (/metrics).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Job:
    """One input to run: its token ids, when it arrived, and how to hand results back (`emit(kind, value)` is
    called on the model thread: "embedding" once (little-endian float32 bytes), or "token" per token then "done";
    "error" on a failure)."""

    ids: list[int]
    emit: Callable[[str, Any], None]
    max_tokens: int = 0
    arrival: float = field(default_factory=time.perf_counter)
    # Its client has gone (hung up mid-stream): a job still queued is dropped, and a batch whose every job has gone
    # stops decoding. Set from another thread; the model thread only reads it.
    cancelled: bool = False
    jid: int | None = None  # its id where the model runs in another process (model_process.py)


class Emit:
    """A Job's emit for a request waiting on an event loop: hands (kind, value) to its asyncio queue from any
    thread. `loop` and `put` let a sender hand many results to one loop in one wake-up (model_process.py)."""

    def __init__(self, loop, q):
        self.loop, self.put = loop, q.put_nowait

    def __call__(self, kind: str, value) -> None:
        try:
            self.loop.call_soon_threadsafe(self.put, (kind, value))
        except RuntimeError:  # the loop has closed (shutdown): nobody waits for it any more
            pass


class Histogram:
    """A Prometheus histogram's counts: cumulative per upper bound, a sum and a count."""

    def __init__(self, bounds):
        self.bounds, self.counts, self.sum, self.count = tuple(bounds), [0] * len(bounds), 0.0, 0

    def observe(self, value: float) -> None:
        for i, b in enumerate(self.bounds):
            if value <= b:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{b:g}"}} {c}' for b, c in zip(self.bounds, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        tag = f"{{{labels}}}" if labels else ""
        return out + [f"{name}_sum{tag} {self.sum:.6g}", f"{name}_count{tag} {self.count}"]


class Metrics:
    """What /metrics reports, written from the model thread and the event loop under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.queue_depth = 0
        self.prepared_under_load = 0
        self.batch_sizes = Histogram(BATCH_BUCKETS)
        self.service = Histogram(LATENCY_BUCKETS_S)  # a batch's run
        self.latency: dict[str, Histogram] = {}  # per endpoint: receipt to last byte handed to the server
        self.requests: dict[tuple[str, int], int] = {}

    def request(self, endpoint: str, code: int, seconds: float | None) -> None:
        with self.lock:
            self.requests[(endpoint, code)] = self.requests.get((endpoint, code), 0) + 1
            if seconds is not None:
                self.latency.setdefault(endpoint, Histogram(LATENCY_BUCKETS_S)).observe(seconds)

    def text(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        return self.model_text() + self.request_text()

    def model_text(self) -> str:
        """The model's side: its queue and batches (kept where the model runs: model_process.py)."""
        with self.lock:
            return "\n".join(["# HELP transbench_queue_depth Requests waiting for a batch.",
                              "# TYPE transbench_queue_depth gauge", f"transbench_queue_depth {self.queue_depth}",
                              "# HELP transbench_shapes_prepared_under_load Shapes compiled or captured for a request "
                              "after the server reported healthy (each stalled the batches behind it).",
                              "# TYPE transbench_shapes_prepared_under_load counter",
                              f"transbench_shapes_prepared_under_load {self.prepared_under_load}",
                              "# HELP transbench_batch_size Requests per batch run.",
                              "# TYPE transbench_batch_size histogram",
                              *self.batch_sizes.lines("transbench_batch_size"),
                              "# HELP transbench_batch_seconds Seconds a batch ran on the model.",
                              "# TYPE transbench_batch_seconds histogram",
                              *self.service.lines("transbench_batch_seconds")]) + "\n"

    def request_text(self) -> str:
        """The HTTP side: requests answered and their latencies (kept where the event loop runs)."""
        with self.lock:
            out = ["# HELP transbench_request_seconds Seconds from a request's receipt to its answer's end.",
                   "# TYPE transbench_request_seconds histogram"]
            for endpoint, h in sorted(self.latency.items()):
                out += h.lines("transbench_request_seconds", f'endpoint="{endpoint}"')
            out += ["# HELP transbench_requests_total Requests answered, by endpoint and HTTP status.",
                    "# TYPE transbench_requests_total counter"]
            out += [f'transbench_requests_total{{endpoint="{e}",code="{c}"}} {n}'
                    for (e, c), n in sorted(self.requests.items())]
        return "\n".join(out) + "\n"


class ModelThread:
    """Prepares the backend, then serves Jobs in batches until stopped."""

    def __init__(self, spec, ref, decoder: bool):
        self.spec, self.ref, self.decoder = spec, ref, decoder
        self.inbox: queue.Queue = queue.Queue()
        self.metrics = Metrics()
        self.ready = threading.Event()
        self.failure: str | None = None  # why preparing (or serving) failed
        self.info: dict = {}
        self.thread = threading.Thread(target=self._main, name="transbench-model", daemon=True)
        # Called after each batch's (or decode step's) emits: a process that passes them on sends them as one
        # message then (model_process.py); in-process there is nothing to gather.
        self.flush: Callable[[], None] = lambda: None

    # --- the event loop's side ----------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> None:
        self.inbox.put(job)

    def cancel(self, job: Job) -> None:
        """The job's client has gone: nothing more is run for it (Job.cancelled)."""
        job.cancelled = True

    def stop(self, timeout: float = 30.0) -> None:
        self.inbox.put(None)
        self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.ready.is_set() and self.thread.is_alive() and self.failure is None

    # --- the model thread ---------------------------------------------------------------------------

    def cell(self) -> ServeCell:
        s = self.spec
        # Every length up to the longest is reachable: the warm-up prepares each shape bucket (measure.buckets).
        lengths = Lengths("lognormal", max(1.0, s.max_length / 2), s.max_length, 0.5)
        return ServeCell(s.model, "generate" if self.decoder else "base", s.backend, s.dtype, "server",
                         lengths=lengths.to_dict(), max_batch_size=s.max_batch_size, max_wait_ms=s.max_wait_ms,
                         new_tokens=s.max_tokens, device=s.device, seed=s.seed, prepare_budget=s.prepare_budget)

    def _main(self) -> None:
        try:
            self._prepare()
        except BaseException as exc:  # noqa: BLE001  (reported by the server's start, which exits with it)
            self.failure = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            self.ready.set()
            return
        self.ready.set()
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001  (/health turns 503; requests waiting are answered 500)
            self.failure = f"{type(exc).__name__}: {exc}"
            self._fail_pending(self.failure)

    def _prepare(self) -> None:
        from ... import backends
        from ...errors import Unsupported
        from ...measure import device as dev
        from ..inference.measure import TOLERANCE, ModelCache, model_for
        from .measure import TUNED_SHARE, Decoders, Encoders, batch_bucket

        cell = self.cell()
        self.device = dev.resolve(cell.device)
        self.backend = backends.get(cell.backend)
        reason = self.backend.unsupported_reason(self.device.type, cell.dtype, cell.task)
        if reason:
            raise Unsupported(reason)
        kind = Decoders if self.decoder else Encoders
        cache = ModelCache()
        t0 = time.perf_counter()
        kind(None, self.backend, cell, self.ref.shape, self.device).reference(cache)
        self.model = model_for(cache, cell, self.backend, self.device)
        self.runner = kind(self.model, self.backend, cell, self.ref.shape, self.device)
        err, ran = self.runner.check(cache)  # the correctness gate of in-process serving: never serve a wrong backend
        if not err <= TOLERANCE[cell.dtype]:
            raise Unsupported(f"rel_err {err:.3g} against the fp32 reference is over the {cell.dtype} tolerance "
                              f"{TOLERANCE[cell.dtype]:g}: this backend's output is wrong here")
        ran["rel_err"] = err
        if self.decoder:  # every generator --warm-lengths lists, tuned within the budget's tuning share
            sizes = sorted({batch_bucket(k, cell.max_batch_size) for k in range(1, cell.max_batch_size + 1)})
            start = time.perf_counter()  # the budget counts from here, as Encoders.warm's does
            for n in self.spec.warm_lengths:
                for b in sizes:
                    if time.perf_counter() - start > cell.prepare_budget * TUNED_SHARE:
                        self.runner.tuning = False
                    self.runner.entry(b, n)
        else:  # as in-process serving: the largest bucket first, the likeliest next, within the budget
            prep = self.runner.warm(cell.length_dist, cell.prepare_budget)
            ran.update(shapes_prepared=prep["prepared"], shapes_left=prep["left"])
        # From here a shape prepared on a request's demand is counted, and captures untuned (measure.Encoders.entry,
        # Decoders.entry); an encoder batch whose own bucket was left pads into a larger prepared one (holder).
        self.runner.loading = True
        self.info = {**ran, "prepare_s": time.perf_counter() - t0}

    def _loop(self) -> None:
        policy = BatchPolicy(self.spec.max_batch_size, self.spec.max_wait_ms / 1e3)
        batcher = Batcher(policy)
        groups: dict[int, deque] = {}  # decoders: one queue per prompt length; encoders: one queue (key 0)
        running = True

        def add(job) -> None:
            nonlocal running
            if job is None:
                running = False  # stop: what is queued is still served
            else:
                groups.setdefault(len(job.ids) if self.decoder else 0, deque()).append(job)

        while True:
            while True:  # everything that has arrived joins its queue
                try:
                    add(self.inbox.get_nowait())
                except queue.Empty:
                    break
            pending = [q for q in groups.values() if q]
            with self.metrics.lock:
                self.metrics.queue_depth = sum(len(q) for q in pending)
            if not running and not pending:
                return
            now = time.perf_counter()
            # a queue whose batch leaves now (full, or its oldest has waited long enough, or the server stops)
            ready = [q for q in pending if len(q) >= policy.max_batch_size or now >= batcher.deadline(q) or not running]
            if not ready:
                wait = min(batcher.deadline(q) for q in pending) - now if pending else None
                try:
                    add(self.inbox.get(timeout=max(0.0, wait) if wait is not None else None))
                except queue.Empty:
                    pass
                continue
            q = min(ready, key=lambda q: q[0].arrival)  # the oldest request first
            batch = []
            while q and len(batch) < policy.max_batch_size:
                job = q.popleft()
                if not job.cancelled:  # its client left while it waited: a slot no one would read
                    batch.append(job)
            if not batch:
                continue
            start = time.perf_counter()
            try:
                self._run(batch)
            except Exception as exc:  # noqa: BLE001  (one batch's failure is its requests' 500, not the server's end)
                for job in batch:
                    job.emit("error", f"{type(exc).__name__}: {exc}")
                self.flush()
            with self.metrics.lock:
                self.metrics.prepared_under_load = self.runner.under_load
                self.metrics.batch_sizes.observe(len(batch))
                self.metrics.service.observe(time.perf_counter() - start)

    def _fail_pending(self, why: str) -> None:
        while True:
            try:
                job = self.inbox.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.emit("error", why)
                self.flush()

    def _run(self, batch: list[Job]) -> None:
        if self.decoder:
            self._generate(batch)
        else:
            self._embed(batch)

    def _embed(self, batch: list[Job]) -> None:
        import torch

        from ..inference.measure import output_tensor

        n = len(batch)
        inputs, prepared, _ = self.runner.entry_for(n, max(len(j.ids) for j in batch))
        B, W = inputs.input_ids.shape
        ids = torch.zeros(B, W, dtype=inputs.input_ids.dtype)
        lengths = [len(j.ids) for j in batch] + [1] * (B - n)  # padding rows are one token long
        for i, j in enumerate(batch):
            ids[i, : len(j.ids)] = torch.tensor(j.ids)
        mask = torch.arange(W)[None, :] < torch.tensor(lengths)[:, None]
        inputs.input_ids.copy_(ids)
        inputs.attention_mask.copy_(mask)
        hidden = output_tensor(prepared.fn(), "base")[:n].float()
        m = mask[:n, :, None].to(hidden.device, hidden.dtype)
        pooled = ((hidden * m).sum(1) / m.sum(1)).cpu().numpy().astype("<f4", copy=False)  # mean over its tokens
        # Little-endian float32 bytes, what OpenAI's base64 encoding holds: one bytes object crosses the pipe and the
        # HTTP process encodes it as is, where a list of 768 Python floats was pickled, unpickled and packed again.
        for j, row in zip(batch, pooled):
            j.emit("embedding", row.tobytes())
        self.flush()

    def _generate(self, batch: list[Job]) -> None:
        import torch

        from ...backends.decoders import greedy_step
        from .measure import batch_bucket

        n, length = len(batch), len(batch[0].ids)
        B = batch_bucket(n, self.spec.max_batch_size)
        gen = self.runner.entry(B, length)[0]
        rows = [j.ids for j in batch] + [batch[0].ids] * (B - n)  # padding rows repeat the first prompt
        ids = torch.tensor(rows, dtype=torch.long, device=self.device)
        steps = max(j.max_tokens for j in batch)
        nxt = gen.prefill(ids).argmax(-1)
        for k in range(steps):
            # every job still decoding has lost its client: its steps would hold the requests queued behind it
            # (a client that hung up on a stream of 4,096 tokens kept the model busy to the last)
            if all(j.cancelled or k >= j.max_tokens for j in batch):
                break
            if k:
                nxt = greedy_step(gen, nxt)
            tokens = nxt[:n].tolist()  # on the host as it is produced: what a stream returns
            for j, t in zip(batch, tokens):
                if k < j.max_tokens and not j.cancelled:
                    j.emit("token", t)
                    if k + 1 == j.max_tokens:
                        j.emit("done", None)
            self.flush()
