"""The model of `transbench server` in a process of its own: the HTTP process keeps its event loop, the child runs
the model thread (server_model.py ModelThread: preparation, the batcher, the backend) and the two talk over one
pipe.

Why a process: a thread that runs Python holds the interpreter lock, and an event loop in the same process waits for
it after every system call (each socket read and write, each poll). With the model thread busy, a Starlette app on
uvicorn answered half of its requests at the 0.5 ms switch interval, a third at the default 5 ms
(benchmarks/studies/server_lock.py); on an H100 the sdpa server stopped near 400 requests/s where the same backend
in-process reached 2,657/s (benchmarks/results/http_serving_h100_2026-11.md). vLLM's V1 engine splits its API
server from its engine core for the same reason.

The same wait applies to whatever passes the messages, so nothing here sends one message per request. The event
loop queues its requests (a queue.Queue put takes no system call) and a sender thread drains the queue into one
message, as many requests as came since its last send. The model thread gathers its results and sends them once
per batch or decode step (ModelThread.flush), so a stream's tokens still leave one step at a time. The parent's
reader hands all the results of a message to the event loop in one wake-up (server_model.Emit's loop and put).

ModelProcess has the interface of ModelThread that server.py uses (start, submit, stop, alive, ready, failure,
info, metrics, cancel). Messages, parent to child: ("jobs", [(id, ids, max_tokens, arrival), ...]), ("cancel", [id,
...]), ("metrics",), ("stop",);
child to parent: ("ready", info), ("failed", why), ("emits", [(id, kind, value), ...]), ("metrics", text).
`arrival` is time.perf_counter(), the system-wide monotonic clock on Linux, so the child's batcher times a request
from its receipt here.
"""

from __future__ import annotations

import itertools
import queue
import signal
import sys
import threading

from .server_model import Emit, Job, Metrics, ModelThread

ENDS = ("embedding", "done", "error")  # the kinds after which a job hears nothing more
METRICS_WAIT_S = 5.0  # how long /metrics waits for the child's side before answering with the HTTP side alone
SWITCH_S = 0.0005  # the child's switch interval: its receiving thread gets the lock back from the model thread soon
STOP = object()  # ends a sender: what was queued before it is sent first


def sender(outbox: queue.Queue, send, kind: str, last=None) -> None:  # the parent's requests to the child
    """Drain `outbox` into one `(kind, [items])` message per wake-up until STOP, then send `last` (if any)."""
    while True:
        items = [outbox.get()]
        while True:
            try:
                items.append(outbox.get_nowait())
            except queue.Empty:
                break
        stop = any(item is STOP for item in items)
        items = [item for item in items if item is not STOP]
        if items:
            send((kind, items))
        if stop:
            if last is not None:
                send(last)
            return


class ProcessMetrics(Metrics):
    """The HTTP side's counts kept here; the model's side (queue, batches) asked of the child on each read."""

    def __init__(self, owner: ModelProcess):
        super().__init__()
        self.owner = owner

    def text(self) -> str:
        return self.owner.model_text() + self.request_text()


class ModelProcess:
    def __init__(self, spec, ref, decoder: bool):
        import multiprocessing as mp

        self.spec, self.ref, self.decoder = spec, ref, decoder
        self.ready = threading.Event()
        self.failure: str | None = None
        self.info: dict = {}
        self.metrics = ProcessMetrics(self)
        self._emits: dict[int, object] = {}
        self._ids = itertools.count()
        self._outbox: queue.Queue = queue.Queue()
        self._send_lock = threading.Lock()
        self._metrics_lock = threading.Lock()  # one /metrics question in flight at a time
        self._replies: queue.Queue = queue.Queue()
        ctx = mp.get_context("spawn")
        self._conn, self._child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=child_main, args=(self._child_conn, spec, ref, decoder),
                                name="transbench-model", daemon=True)
        self._reader = threading.Thread(target=self._read, name="transbench-model-reader", daemon=True)
        self._sender = threading.Thread(target=sender, args=(self._outbox, self._send, "jobs", ("stop",)),
                                        name="transbench-model-sender", daemon=True)

    def start(self) -> None:
        from ...runner.worker import start_without_main

        start_without_main(self.proc)
        self._child_conn.close()
        self._reader.start()
        self._sender.start()

    def _send(self, msg) -> None:
        with self._send_lock:
            try:
                self._conn.send(msg)
            except (OSError, ValueError):  # the child has ended: the reader tells whoever waits
                pass

    def submit(self, job: Job) -> None:
        if self.failure is not None:
            job.emit("error", self.failure)
            return
        jid = job.jid = next(self._ids)
        self._emits[jid] = job.emit
        self._outbox.put((jid, job.ids, job.max_tokens, job.arrival))

    def cancel(self, job: Job) -> None:
        """The job's client has gone: the child runs nothing more for it (Job.cancelled), and what it already sent
        is dropped here. Sent at once, not through the sender: a client hanging up is rare, and its steps are the
        ones to save."""
        job.cancelled = True
        if self._emits.pop(job.jid, None) is not None:
            self._send(("cancel", [job.jid]))

    def model_text(self) -> str:
        """The child's queue and batch metrics; empty once it has ended or when it does not answer in time."""
        with self._metrics_lock:
            while not self._replies.empty():  # a late answer to an earlier question
                self._replies.get_nowait()
            if not self.proc.is_alive():
                return ""
            self._send(("metrics",))
            try:
                return self._replies.get(timeout=METRICS_WAIT_S)
            except queue.Empty:
                return ""

    def stop(self, timeout: float = 30.0) -> None:
        """What is queued is still served, then the child ends; killed if it outlasts `timeout`."""
        self._outbox.put(STOP)
        self._sender.join(5)
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self._reader.join(5)
        self._conn.close()

    @property
    def alive(self) -> bool:
        # No look at the process itself (a waitpid a request would give the lock up for): its end reaches the reader
        # as the pipe's end, which sets `failure`.
        return self.ready.is_set() and self.failure is None

    def _deliver(self, items) -> None:
        """Hand a message's results to their requests: one call_soon_threadsafe per event loop, not per result."""
        loops: dict = {}
        for jid, kind, value in items:
            emit = self._emits.pop(jid, None) if kind in ENDS else self._emits.get(jid)
            if isinstance(emit, Emit):
                loops.setdefault(emit.loop, []).append((emit.put, (kind, value)))
            elif emit is not None:
                emit(kind, value)
        for loop, puts in loops.items():
            try:
                loop.call_soon_threadsafe(_put_all, puts)
            except RuntimeError:  # that loop has closed (shutdown)
                pass

    def _read(self) -> None:
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            kind = msg[0]
            if kind == "emits":
                self._deliver(msg[1])
            elif kind == "metrics":
                self._replies.put(msg[1])
            elif kind == "ready":
                self.info = msg[1]
                self.ready.set()
            elif kind == "failed":
                self.failure = msg[1]
                self.ready.set()
        # The child has ended (stopped, or died): whoever still waits hears why.
        if self.proc.pid is not None:
            self.proc.join(5)
        if self.failure is None:
            code = self.proc.exitcode
            self.failure = "the model process ended" + (f" (exit code {code})" if code not in (0, None) else "")
        self.ready.set()
        self._deliver([(jid, "error", self.failure) for jid in list(self._emits)])


def _put_all(puts) -> None:
    for put, item in puts:
        put(item)


def child_main(conn, spec, ref, decoder: bool) -> None:
    """The child: the model thread, whose results go out one message per batch or decode step (its flush), and this
    thread taking requests until told to stop or the parent's end of the pipe closes (the parent died: the child
    goes with it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides the end
    sys.setswitchinterval(SWITCH_S)
    lock = threading.Lock()
    results: list = []

    def send(msg) -> None:
        with lock:
            try:
                conn.send(msg)
            except (OSError, ValueError):
                pass

    def flush() -> None:
        with lock:
            if not results:
                return
            items = results[:]
            results.clear()
            try:
                conn.send(("emits", items))
            except (OSError, ValueError):
                pass

    live: dict[int, Job] = {}  # the jobs not yet ended, by id: a cancel finds its job here

    def emitter(jid: int):
        def emit(kind, value) -> None:
            if kind in ENDS:
                live.pop(jid, None)
            with lock:
                results.append((jid, kind, value))
        return emit

    model = ModelThread(spec, ref, decoder)
    model.flush = flush
    model.start()
    model.ready.wait()
    if model.failure:
        send(("failed", model.failure))
        return
    send(("ready", model.info))

    def watch() -> None:  # a model thread that fails while serving: the parent's /health turns 503
        model.thread.join()
        if model.failure:
            flush()
            send(("failed", model.failure))

    threading.Thread(target=watch, daemon=True).start()
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "jobs" and model.failure:  # sent before the parent heard of the failure
                send(("emits", [(jid, "error", model.failure) for jid, *_ in msg[1]]))
            elif msg[0] == "jobs":
                for jid, ids, max_tokens, arrival in msg[1]:
                    live[jid] = Job(ids, emitter(jid), max_tokens, arrival)
                    model.submit(live[jid])
            elif msg[0] == "cancel":
                for jid in msg[1]:
                    job = live.pop(jid, None)
                    if job is not None:
                        model.cancel(job)
            elif msg[0] == "metrics":
                send(("metrics", model.metrics.model_text()))
            elif msg[0] == "stop":
                break
    finally:
        model.stop()  # what is queued is served first
        flush()
