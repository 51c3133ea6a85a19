"""The load generator's HTTP target: a plan's requests sent to an OpenAI-compatible endpoint with httpx's async
client, each at its planned time (open loop) or on the return of the last (closed loop), and what came back.

Every request is kept, whatever became of it: answered, refused (HTTP 4xx/5xx or the connection refused), dropped
(the connection or the stream ended early), timed out, or malformed (a body or event that is not the API's JSON).
Latency runs from the *planned* send time, so a stalled server or a client that fell behind delays finishes, never
arrivals (no coordinated omission); the client's own lag, the actual send time less the planned one, is kept per
request so a load that was not offered as planned says so (endpoint.py).

Streaming (server-sent events) for completions and chat: each event carrying text is a token's arrival (servers
such as vLLM send one event a token; one that bundles tokens shows fewer, wider gaps), giving time to first token
and the gaps between tokens. Token counts come from the response's `usage` where the server gives it (streams ask
for it with `stream_options.include_usage`)."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from dataclasses import dataclass, field

from .load import LoadPlan

API_PATHS = {"openai-completions": "/v1/completions", "openai-chat": "/v1/chat/completions",
             "openai-embeddings": "/v1/embeddings"}
APIS = tuple(API_PATHS)
KEEP_OUTPUTS = 64  # requests (the first ones) whose outputs are kept for the reference check
SPIN_S = 0.0015  # the event loop sleeps in whole milliseconds (epoll): the last of a wait is spent yielding instead


@dataclass
class Sent:
    """One request and what became of it; times in seconds from the start of the load."""

    rid: int
    arrival: float  # planned send time
    length: int  # requested prompt tokens
    sent: float | None = None  # when it really went out
    done: float | None = None  # last byte (or the failure)
    steps: list[float] = field(default_factory=list)  # each streamed event that carried text
    status: str = "ok"  # ok | http_NNN | refused | dropped | timeout | malformed | error
    error: str = ""
    prompt_tokens: int | None = None  # from usage
    completion_tokens: int | None = None
    text: str = ""  # generated text (kept for the first KEEP_OUTPUTS requests)
    embedding: list[float] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class HttpTrace:
    requests: list[Sent]
    plan: LoadPlan
    end: float
    pool: int  # connections the client could open
    peak_in_flight: int
    t0: float = 0.0  # time.perf_counter() at the start of the load (times above are relative to it)


def payload(api: str, model: str, prompt: str, new_tokens: int) -> dict:
    """The request body: greedy (temperature 0), exactly `new_tokens` tokens where the server honours ignore_eos
    (vLLM, SGLang, transbench server: a benchmark wants a known output length; others ignore the field)."""
    if api == "openai-embeddings":
        return {"model": model, "input": prompt}
    gen = {"model": model, "max_tokens": new_tokens, "temperature": 0, "stream": True,
           "stream_options": {"include_usage": True}, "ignore_eos": True}
    if api == "openai-chat":
        return {**gen, "messages": [{"role": "user", "content": prompt}]}
    return {**gen, "prompt": prompt}


def _message(body: bytes) -> str:
    try:
        err = json.loads(body).get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        return str(msg)[:200] if msg else body[:200].decode(errors="replace")
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


class Malformed(Exception):
    pass


def _usage(r: Sent, usage) -> None:
    if isinstance(usage, dict):
        r.prompt_tokens = usage.get("prompt_tokens", r.prompt_tokens)
        r.completion_tokens = usage.get("completion_tokens", r.completion_tokens)


async def _stream(resp, r: Sent, api: str, now, keep: bool) -> None:
    finished = False
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):  # blank separators, comments (":"), event:/id: fields
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            finished = True
            break
        try:
            event = json.loads(data)
        except ValueError:
            raise Malformed(f"an event is not JSON: {data[:80]!r}") from None
        if not isinstance(event, dict):
            raise Malformed(f"an event is not a JSON object: {data[:80]!r}")
        if event.get("error"):
            r.status, r.error = "error", _message(data.encode())
            return
        choices = event.get("choices") or []
        if choices:
            c = choices[0]
            piece = c.get("text") if api == "openai-completions" else (c.get("delta") or {}).get("content")
            if piece:
                r.steps.append(now())
                if keep:
                    r.text += piece
        _usage(r, event.get("usage"))
    if not finished:
        r.status, r.error = "dropped", "the stream ended before its [DONE] event"


async def _send(client, path: str, api: str, body: dict, r: Sent, now, keep: bool) -> None:
    import httpx

    r.sent = now()
    try:
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code >= 400:
                r.status, r.error = f"http_{resp.status_code}", _message(await resp.aread())
                return
            if api == "openai-embeddings":
                raw = await resp.aread()
                try:
                    data = json.loads(raw)
                    emb = data["data"][0]["embedding"]
                except (ValueError, KeyError, IndexError, TypeError):
                    raise Malformed(f"the response is not an embeddings list: {raw[:80]!r}") from None
                if keep:
                    r.embedding = emb
                _usage(r, data.get("usage"))
            else:
                await _stream(resp, r, api, now, keep)
    except Malformed as exc:
        r.status, r.error = "malformed", str(exc)
    except httpx.ConnectError as exc:
        r.status, r.error = "refused", str(exc)[:200] or "connection refused"
    except httpx.TimeoutException as exc:
        r.status, r.error = "timeout", str(exc)[:200] or "timed out"
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        r.status, r.error = "dropped", str(exc)[:200] or "the connection closed"
    except httpx.HTTPError as exc:
        r.status, r.error = "error", f"{type(exc).__name__}: {exc}"[:200]
    finally:
        r.done = now()


def pool_size(plan: LoadPlan) -> int:
    """Connections enough for every request in flight at once (a plan's every request, or its clients), within the
    open files the process may hold: the client never makes a request wait for a connection where it can help it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:  # a process may raise its own soft limit up to the hard one
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ValueError, OSError):
        pass
    wanted = len(plan.arrivals) if plan.arrivals is not None else plan.concurrency
    return max(1, min(wanted, soft - 128))


async def _load(url: str, api: str, bodies, plan: LoadPlan, timeout_s: float) -> HttpTrace:
    import httpx

    pool = pool_size(plan)
    path = API_PATHS[api]
    limits = httpx.Limits(max_connections=pool, max_keepalive_connections=pool)
    t0 = 0.0
    now = lambda: time.perf_counter() - t0  # noqa: E731
    out: list[Sent] = []
    in_flight = peak = 0

    async def one(r: Sent) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:  # the whole request's deadline, body and stream included (httpx's timeouts are per read)
            await asyncio.wait_for(_send(client, path, api, bodies(r), r, now, r.rid < KEEP_OUTPUTS), timeout_s)
        except asyncio.TimeoutError:
            r.status, r.error, r.done = "timeout", f"no complete answer within {timeout_s:g} s", now()
        finally:
            in_flight -= 1

    lengths = plan.lengths
    # The client is built before the clock starts: building it (an SSL context, even for http://) takes tens of
    # milliseconds, which made the first requests late by that much.
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(timeout_s)) as client:
        t0 = time.perf_counter()
        if plan.arrivals is not None:
            tasks = []
            for i, t in enumerate(plan.arrivals):
                delay = t - now() - SPIN_S
                if delay > 0:
                    await asyncio.sleep(delay)
                while now() < t:  # the last stretch: yield to the streams in flight until the planned time
                    await asyncio.sleep(0)
                r = Sent(i, t, lengths[i % len(lengths)])
                out.append(r)
                tasks.append(asyncio.create_task(one(r)))
            await asyncio.gather(*tasks)
        else:
            counter = iter(range(10**12))

            async def client_loop() -> None:
                while True:
                    t = now()
                    if t >= plan.span_s:
                        return
                    i = next(counter)
                    r = Sent(i, t, lengths[i % len(lengths)])
                    out.append(r)
                    await one(r)

            await asyncio.gather(*(client_loop() for _ in range(plan.concurrency)))
    return HttpTrace(out, plan, now(), pool, peak, t0)


def run_http_load(url: str, api: str, bodies, plan: LoadPlan, timeout_s: float) -> HttpTrace:
    """Run the plan against the endpoint. `bodies(sent)` gives a request's JSON body."""
    return asyncio.run(_load(url.rstrip("/"), api, bodies, plan, timeout_s))


def served_models(url: str, timeout_s: float = 10.0) -> list[str]:
    """The model names the endpoint lists at /v1/models (vLLM, TEI, transbench server), [] where it lists none."""
    import httpx

    try:
        resp = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout_s)
        return [m["id"] for m in resp.json().get("data", []) if isinstance(m, dict) and "id" in m]
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        return []
