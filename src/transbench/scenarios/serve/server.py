"""`transbench server`: an OpenAI-compatible HTTP server (Starlette on uvicorn) over the model, which runs in a
process of its own (model_process.py, around server_model.py's model thread): `/v1/embeddings` for an encoder,
`/v1/completions` (streamed with `stream: true`) for a decoder,
`/v1/models`, `/health` and `/metrics` (Prometheus text format).

The backend is prepared (correctness gate, shapes warmed) before the server listens, so it is healthy from its first
answer. A bad request (not JSON, a missing field, an unknown model, too long an input) is answered with a 4xx and
an OpenAI-style `{"error": {"message", "type"}}` body (one whose body has not arrived within BODY_S: 408), and
the server goes on; a client that hangs up mid-body is dropped quietly. SIGTERM or SIGINT ends it cleanly: it stops
accepting, lets the requests in flight finish (up to GRACE_S), then stops the model's process.

Decoding is greedy (temperature and top_p are accepted in range and not applied: a benchmark wants a known output),
and `ignore_eos` is what the server always does: a completion has exactly `max_tokens` tokens. A field that asks for
another answer (stop sequences, echo, logprobs, penalties: COMPLETION_FIELDS) is refused, not ignored."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import signal
import socket
import struct
import sys
import threading
import time
import uuid

from ... import boundary
from ...errors import SpecError
from .model_process import ModelProcess
from .prompts import HFTokenizer, WordTokenizer, encode_within, has_tokenizer
from .server_model import Emit, Job

GRACE_S = 10.0  # seconds the requests in flight get to finish after SIGTERM
# Seconds of preparing after which the server says it is still at it (run's on_preparing): past what loading and
# checking a small model take on a CPU, so that a refusal found by then stays one line.
PREPARING_S = 15.0
MAX_BODY = 16 * 2**20  # a request body past this is refused (413) as it arrives, before it is parsed
# A body has this long to arrive in full: a client that stalls part way would otherwise hold its connection (and the
# bytes read so far) for as long as it stays connected; the slowest real client sends a body in well under a second.
BODY_S = 30.0
# A connection whose request line and headers have not arrived this long after it opened (or after its last answer)
# is closed: uvicorn's h11 protocol times a connection out only between requests, so connections that sent nothing,
# or half their headers, were held for ever, and 280 of them used up the descriptors: every other client timed out.
HEADER_S = 10.0
# A connection whose client leaves the server's output backed up this long (its transport's writing paused all that
# time: uvicorn's flow control) is dropped: uvicorn has no write timeout, so a client that opened a stream and never
# read it held its connection, and the events queued for it, for as long as it stayed connected.
WRITE_S = 30.0
STOP_POLL_S = 0.2  # how often a body still arriving looks whether the server is stopping
# uvicorn logs a line for each request that is not HTTP/1.1 (one client sending garbage wrote one a request); each such
# kind of line about what a client sent is logged at most once this often, with the count of those it stood for.
PEER_LOG_S = 60.0
TLS_RECORD = b"\x16\x03"  # a TLS handshake record: a client speaking https:// to this plain-HTTP port
# uvicorn's lines about what a client sent, in words (None: never logged)
PEER_LINES = {
    "Invalid HTTP request received.": "a client sent bytes that are not an HTTP/1.1 request: answered 400",
    "Unsupported upgrade request.": "a client asked to upgrade its connection (WebSocket, h2c), which this server "
                                    "does not do: answered as HTTP/1.1",
    # its advice (install a WebSocket library) is for servers of WebSockets; this one serves none
    "No supported WebSocket library detected. Please use \"pip install 'uvicorn[standard]'\", or install 'websockets' "
    "or 'wsproto' manually.": None,
}
TLS_LINE = "a client began a TLS handshake on this plain-HTTP port, and its connection was closed: the server speaks " \
           "http://, not https://"
# asyncio's words when accept() fails for want of descriptors, and ours: it logged them with a traceback once per
# connection waiting in the backlog, 20,000 tracebacks in 8 s with 120 clients over a limit of 64 open files
ACCEPT_FAILED = "socket.accept() out of system resource"
FILES_LINE = "the server is out of open files (its RLIMIT_NOFILE): new connections wait in the listen backlog until " \
             "others close"
GONE = 499  # nginx's "client closed request", as /metrics counts a client that hung up before its body was read
MAX_INPUTS = 2048  # inputs in one embeddings request
SWITCH_S = 0.0005  # the interpreter's thread switch interval while serving (see run)
# A text longer than this is tokenized in a worker thread: a fast tokenizer lets go of the interpreter while it works
# (about 1.7 MB/s through MiniLM's on one core), so other requests' streams go on; a shorter one costs less than the
# hop to a thread.
INLINE_CHARS = 2048


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


def text(value: str, what: str) -> str:
    """A string from the body that can be encoded: JSON's "\\ud800" escape decodes to a lone surrogate, which
    UTF-8 (the tokenizer, the answer's own JSON) cannot encode."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{what} is not valid Unicode text (a lone surrogate at character {exc.start})") from None
    return value


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _none_or(*neutral):
    """A check that a field is absent (null) or one of the values that change nothing (same type: 0 is not False)."""
    return lambda v: v is None or any(type(v) is type(n) and v == n for n in neutral)


def _none_or_number(at: float):
    return lambda v: v is None or (_number(v) and v == at)


# Fields of a completion request this server does not act on. It decodes greedily and always to max_tokens (the
# module's docstring), so a field is taken only where the answer it asks for is that one: sampling settings in their
# OpenAI ranges (applied by no benchmark that wants a known output), the others only at the value that changes nothing
# (vLLM's benchmark client sends logprobs null, ignore_eos false and repetition_penalty 1). Anything else would be an
# answer other than the one asked for, given silently: refused (400), saying what the server does. Fields not listed
# (user, seed, metadata, ...) change nothing and are ignored.
COMPLETION_FIELDS = {
    "n": (_none_or(1), "n must be 1: this server returns one completion a request"),
    "temperature": (lambda v: v is None or (_number(v) and 0 <= v <= 2), "temperature must be a number in 0..2 "
                    "(decoding here is greedy whatever it is)"),
    "top_p": (lambda v: v is None or (_number(v) and 0 < v <= 1), "top_p must be a number in (0, 1] (decoding here "
              "is greedy whatever it is)"),
    "stop": (_none_or("", []), "stop sequences are not supported: a completion here has exactly max_tokens tokens"),
    "ignore_eos": (lambda v: v is None or isinstance(v, bool), "ignore_eos must be true or false (a completion here "
                   "has exactly max_tokens tokens either way)"),
    "echo": (_none_or(False), "echo is not supported: the answer is the completion alone"),
    "logprobs": (_none_or(False), "logprobs are not supported"),
    "best_of": (_none_or(1), "best_of must be 1: this server returns one greedy completion a request"),
    "suffix": (_none_or(""), "suffix is not supported"),
    "logit_bias": (_none_or({}), "logit_bias is not supported"),
    "presence_penalty": (_none_or_number(0), "presence_penalty is not supported (only 0)"),
    "frequency_penalty": (_none_or_number(0), "frequency_penalty is not supported (only 0)"),
    "repetition_penalty": (_none_or_number(1), "repetition_penalty is not supported (only 1)"),
}


def check_fields(data: dict, fields: dict) -> None:
    """BadRequest for the first field of `fields` (name -> (accepts(value), message)) whose value is not accepted."""
    for name, (accepts, message) in fields.items():
        if not accepts(data.get(name)):
            raise BadRequest(message)


def need_server_extra() -> None:
    """The ASGI stack is an optional extra: one line naming it where it is missing."""
    import importlib.util

    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise SpecError(f"transbench server needs {' and '.join(missing)}: pip install 'transbench[server]'")


class Api:
    """The request handlers, over one model (its process) and one tokenizer."""

    def __init__(self, spec, ref, decoder: bool, model: ModelProcess, tokenizer):
        self.spec, self.ref, self.decoder, self.model, self.tok = spec, ref, decoder, model, tokenizer
        self.name = spec.served_model_name
        self.vocab = ref.shape.vocab
        self.stopping = lambda: False  # run() points it at uvicorn's: SIGTERM or SIGINT has come

    # --- helpers --------------------------------------------------------------------------------------

    def error(self, exc: BadRequest):
        from starlette.responses import JSONResponse

        # 408, 413 and a 503 cutting a body short leave the rest of the body unread on the connection: it is closed,
        # not read as the next request
        close = {"Connection": "close"} if exc.status in (408, 413, 503) else None
        return JSONResponse({"error": {"message": str(exc), "type": exc.kind, "code": exc.status}},
                            status_code=exc.status, headers=close)

    async def read(self, request) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY:  # refused at once, not after waiting out BODY_S for it
            raise BadRequest(f"the body is above the {MAX_BODY:,} bytes accepted (Content-Length {declared[:40]})", 413)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                raise BadRequest(f"the body is above the {MAX_BODY:,} bytes accepted", 413)
            chunks.append(chunk)
        return b"".join(chunks)

    async def body(self, request) -> dict:
        from starlette.requests import ClientDisconnect

        if not self.model.alive:  # the model has failed: nothing would answer a request queued for it
            raise BadRequest(f"the model is not serving: {self.model.failure}", 503, "server_error")
        # The body within BODY_S, unless the server is told to stop first: a body still on its way then held the stop
        # for the whole grace, and was cancelled at its end (a traceback, a text/plain 500 to the client).
        reading = asyncio.ensure_future(self.read(request))
        deadline = asyncio.get_running_loop().time() + BODY_S
        try:
            while not reading.done():
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    raise BadRequest(f"the body did not arrive in full within {BODY_S:g} s", 408)
                if self.stopping():
                    raise BadRequest("the server is stopping, and the body had not arrived", 503, "server_error")
                await asyncio.wait({reading}, timeout=min(left, STOP_POLL_S))
            raw = reading.result()
        except ClientDisconnect:  # the client hung up part way: nothing to answer, and no fault of the server's
            raise BadRequest("the client closed the connection before its body arrived", GONE) from None
        finally:
            reading.cancel()
        try:
            data = boundary.loads_json(raw, "the body")
        except ValueError:
            raise BadRequest("the body is not JSON") from None
        if not isinstance(data, dict):
            raise BadRequest("the body must be a JSON object")
        model = data.get("model")
        if model is None:
            raise BadRequest("missing field 'model'")
        if not isinstance(model, str):  # ["x"] was "the model '['x']' is not served here", a 404 for a wrong type
            raise BadRequest(f"model must be a string, the served name ('{self.name}')")
        if model != self.name:
            raise BadRequest(f"the model '{text(str(model), 'model')[:100]}' is not served here: this server serves "
                             f"'{self.name}'", 404, "model_not_found")
        return data

    async def ids(self, value, what: str, limit: int) -> list[int]:
        """One input's token ids: text through the tokenizer, or a list of token ids as given."""
        whole = True
        if isinstance(value, str):
            value = text(value, what)
            if len(value) > INLINE_CHARS:
                ids, whole = await asyncio.to_thread(encode_within, self.tok, value, limit)
            else:
                ids, whole = encode_within(self.tok, value, limit)
        elif isinstance(value, list) and len(value) > limit and type(value[0]) is int:
            ids = value  # too long whatever the rest are: refused before a look at each of up to 8M of them
        elif isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            if any(not 0 <= i < self.vocab for i in value):
                raise BadRequest(f"{what}: a token id is outside the vocabulary (0..{self.vocab - 1})")
            ids = list(value)
        else:
            raise BadRequest(f"{what} must be a string or a list of token ids")
        if not ids:
            raise BadRequest(f"{what} is empty")
        if len(ids) > limit:
            raise BadRequest(f"{what} is {'' if whole else 'at least '}{len(ids)} tokens, above this server's {limit} "
                             "(--max-length)", 400, "context_length_exceeded")
        return ids

    def failed(self, api: str, why) -> "BadRequest":
        """A request the model failed, counted: 503 where the model process has died (as /health and every request
        after it answer), 500 where the model raised for this request alone."""
        status = 500 if self.model.alive else 503
        self.model.metrics.request(api, status, None)
        return BadRequest(f"the model failed: {why}", status, "server_error")

    def bridge(self):
        """An asyncio queue the model can fill, and the emit function it calls."""
        q: asyncio.Queue = asyncio.Queue()
        return q, Emit(asyncio.get_running_loop(), q)

    # --- endpoints ------------------------------------------------------------------------------------

    async def health(self, request):
        from starlette.responses import JSONResponse

        if self.model.alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "failed", "error": self.model.failure}, status_code=503)

    async def metrics(self, request):
        from starlette.responses import Response

        # In a thread: the model's side is asked of its process, up to METRICS_WAIT_S, and asked on the event loop
        # every stream and request stalled while a scrape waited (scrapes one after another, under one lock)
        body = await asyncio.to_thread(self.model.metrics.text)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def models(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model", "created": 0,
                                                          "owned_by": "transbench"}]})

    async def embeddings(self, request):
        from starlette.responses import JSONResponse

        t0 = time.perf_counter()
        try:
            if self.decoder:
                raise BadRequest(f"'{self.name}' is a decoder: it serves /v1/completions", 404)
            data = await self.body(request)
            if "input" not in data:
                raise BadRequest("missing field 'input'")
            encoding = data.get("encoding_format")
            encoding = "float" if encoding is None else encoding  # absent or null: OpenAI's default
            if encoding not in ("float", "base64"):
                raise BadRequest("encoding_format must be 'float' or 'base64'")
            dims = data.get("dimensions")
            if dims is not None and not (type(dims) is int and dims == self.ref.shape.hidden):
                raise BadRequest(f"dimensions must be {self.ref.shape.hidden}, this model's embedding size: this "
                                 "server does not shorten embeddings")
            given = data["input"]
            # a string, a list of token ids, or a list of either (a batch of inputs)
            many = isinstance(given, list) and bool(given) and all(isinstance(x, (str, list)) for x in given)
            inputs = given if many else [given]
            if len(inputs) > MAX_INPUTS:
                raise BadRequest(f"{len(inputs)} inputs, above the {MAX_INPUTS} accepted in one request")
            ids = [await self.ids(x, f"input[{i}]" if many else "input", self.spec.max_length)
                   for i, x in enumerate(inputs)]
        except BadRequest as exc:
            self.model.metrics.request("embeddings", exc.status, None)
            return self.error(exc)
        q, emit = self.bridge()
        for x in ids:
            self.model.submit(Job(x, emit))
        out: list = []
        for _ in ids:
            kind, value = await q.get()
            if kind == "error":
                return self.error(self.failed("embeddings", value))
            out.append(value)
        # the answers come back in batch order, which is the submission order within one request
        n = sum(len(x) for x in ids)
        self.model.metrics.request("embeddings", 200, time.perf_counter() - t0)
        # The model hands little-endian float32 bytes (server_model.py): base64 as OpenAI's API defines it, or floats
        out = [base64.b64encode(e).decode("ascii") if encoding == "base64"
               else list(struct.unpack(f"<{len(e) // 4}f", e)) for e in out]
        return JSONResponse({"object": "list", "model": self.name,
                             "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(out)],
                             "usage": {"prompt_tokens": n, "total_tokens": n}})

    async def completions(self, request):
        from starlette.responses import JSONResponse, Response, StreamingResponse

        t0 = time.perf_counter()
        try:
            if not self.decoder:
                raise BadRequest(f"'{self.name}' is an encoder: it serves /v1/embeddings", 404)
            data = await self.body(request)
            if "prompt" not in data:
                raise BadRequest("missing field 'prompt'")
            prompt = data["prompt"]
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]  # a batch of one
            # OpenAI's default, 16, where the field is absent or null (the API's "integer or null"; a client that
            # sends every field, null where unset, was refused "max_tokens must be a whole number")
            max_tokens = data.get("max_tokens")
            max_tokens = min(16, self.spec.max_tokens) if max_tokens is None else max_tokens
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= \
                    self.spec.max_tokens:
                raise BadRequest(f"max_tokens must be a whole number in 1..{self.spec.max_tokens} (--max-tokens)")
            check_fields(data, COMPLETION_FIELDS)
            low = data.get("min_tokens")
            if low is not None and not (type(low) is int and 0 <= low <= max_tokens):
                raise BadRequest("min_tokens must be a whole number in 0..max_tokens (a completion here has exactly "
                                 "max_tokens tokens)")
            stream = data.get("stream")
            stream = False if stream is None else stream  # absent or null: OpenAI's default, as max_tokens
            if not isinstance(stream, bool):
                raise BadRequest("stream must be true or false")
            options = data.get("stream_options") or {}
            if not isinstance(options, dict):
                raise BadRequest("stream_options must be an object, such as {\"include_usage\": true}")
            if not isinstance(options.get("include_usage", False), bool):  # "x" was taken as true
                raise BadRequest("stream_options.include_usage must be true or false")
            ids = await self.ids(prompt, "prompt", self.spec.max_length)
            usage = bool(options.get("include_usage")) if stream else True
        except BadRequest as exc:
            self.model.metrics.request("completions", exc.status, None)
            return self.error(exc)
        q, emit = self.bridge()
        job = Job(ids, emit, max_tokens=max_tokens)
        self.model.submit(job)
        rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def chunk(text: str, finish=None, **extra) -> dict:
            return {"id": rid, "object": "text_completion", "created": created, "model": self.name,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], **extra}

        counts = {"prompt_tokens": len(ids), "completion_tokens": max_tokens, "total_tokens": len(ids) + max_tokens}
        if not stream:
            # A client that hangs up is heard (its http.disconnect, after the body): the model ran its completion to
            # max_tokens for no one, its batch holding the requests behind it, as a stream's did (events below)
            watch = asyncio.ensure_future(gone(request, q))
            tokens = []
            try:
                while True:
                    kind, value = await q.get()
                    if kind == "error":
                        return self.error(self.failed("completions", value))
                    if kind == "gone":
                        self.model.cancel(job)
                        self.model.metrics.request("completions", GONE, None)
                        return Response(status_code=GONE)  # to no one: the connection has closed
                    if kind == "done":
                        break
                    tokens.append(value)
            finally:
                watch.cancel()
            self.model.metrics.request("completions", 200, time.perf_counter() - t0)
            return JSONResponse(chunk(self.tok.decode(tokens), "length", usage=counts))

        async def events():
            # Counted once, however the stream ends: a client that hung up mid-stream ends it here (the generator is
            # closed), and was counted nowhere in /metrics.
            # The events already queued go out in one write. Written one by one, no write waited for the event
            # loop, so a client that hung up (a reset) was written to until the loop ran the transport's
            # connection_lost: from the fifth write on, asyncio logged "socket.send() raised exception." each time,
            # and a client hanging up on streams filled the server's log.
            status = GONE
            try:
                ended = False
                while not ended:
                    events = []
                    for kind, value in [await q.get()] + [q.get_nowait() for _ in range(q.qsize())]:
                        if kind == "error":
                            status = self.failed("completions", value).status
                            error = {"error": {"message": str(value), "type": "server_error"}}
                            events.append(f"data: {json.dumps(error)}\n\n")
                            yield "".join(events)
                            return
                        if kind == "done":
                            ended = True
                            break
                        events.append(f"data: {json.dumps(chunk(self.tok.decode([value])))}\n\n")
                    if ended:
                        events.append(f"data: {json.dumps(chunk('', 'length'))}\n\n")
                        if usage:
                            events.append(f"data: {json.dumps({**chunk(''), 'choices': [], 'usage': counts})}\n\n")
                        events.append("data: [DONE]\n\n")
                    if events:
                        yield "".join(events)
                status = 200
                self.model.metrics.request("completions", 200, time.perf_counter() - t0)
            finally:
                if status == GONE:
                    self.model.metrics.request("completions", GONE, None)
                    self.model.cancel(job)  # its slot in the batch freed for the requests behind it

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def gone(request, q: asyncio.Queue) -> None:
    """Puts ("gone", None) on `q` once the client has hung up: after its body, the server's next ASGI message for
    the request is http.disconnect (uvicorn sends it when the connection closes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    q.put_nowait(("gone", None))


def build_app(api: Api):
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    async def http_error(request, exc: HTTPException):  # unknown paths and methods: the same JSON error shape
        return api.error(BadRequest(f"{request.method} {request.url.path}: {exc.detail}", exc.status_code,
                                    "not_found" if exc.status_code == 404 else "invalid_request_error"))

    routes = [Route("/health", api.health), Route("/metrics", api.metrics), Route("/v1/models", api.models),
              Route("/v1/embeddings", api.embeddings, methods=["POST"]),
              Route("/v1/completions", api.completions, methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    # `/v1/completions/` was a 307 to a URL built from the client's Host header (`http://evil.example/...`): an
    # unknown path, a JSON 404 as any other
    app.router.redirect_slashes = False
    return app


def tokenizer_for(ref):
    """The model folder's tokenizer (else one token a word), or SpecError: a tokenizer.json without `added_tokens`
    was a KeyError traceback once the backend had been prepared (run loads it first)."""
    if not has_tokenizer(ref.path):
        return WordTokenizer(ref.shape.vocab)
    try:
        return HFTokenizer(ref.path)
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt file: transformers and tokenizers raise many kinds
        raise SpecError(f"--model {ref.path}: its tokenizer files cannot be read ({type(exc).__name__}: "
                        f"{boundary.exception_line(exc)})") from None


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to the address, refused before minutes of preparing the backend, not after, and held until
    the server ends: a port checked free and bound again once the backend was ready could be taken in between (a test
    beside others took it), and the server said it was ready on that port, then uvicorn failed to bind it, exit 3."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as exc:
        s.close()
        raise SpecError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return s


def header_deadline_protocol():
    """The HTTP protocol uvicorn picks (httptools where it is installed, else h11), with a deadline on each request's
    line and headers (HEADER_S), both of which time a connection out only between requests, and one on a client that
    leaves what is written to it unread (WRITE_S)."""
    import importlib.util

    idle = None  # h11's state of a connection whose next request has not begun; httptools says so itself
    if importlib.util.find_spec("httptools") is not None:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    else:
        import h11  # uvicorn's dependency
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base

        idle = h11.IDLE

    peers = PeerLog()  # one for the server: its limit holds across connections

    class HeaderDeadline(Base):
        _deadline = None
        _headers_in = False  # this request's line and headers have arrived
        _fresh = True  # nothing received on this connection yet
        _stall = None  # the deadline of a client reading nothing, armed while writing is paused

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.logger = peers.over(self.logger)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(HEADER_S, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self._headers_in and not self.transport.is_closing():
                self.transport.close()  # no request begun: nothing to answer

        def _h11_headers_in(self) -> None:
            if idle is not None and self.conn.their_state is not idle:  # h11 parsed the request line and headers
                self._headers_in = True

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._fresh and data.startswith(TLS_RECORD):  # a ClientHello: no 400 in plain text can reach it
                self.transport.close()
                peers.say(self.logger, TLS_LINE)
                return
            self._fresh = False
            super().data_received(data)
            self._h11_headers_in()
            if self._headers_in:  # the body has BODY_S (Api.body)
                self._disarm()

        def on_headers_complete(self) -> None:
            self._headers_in = True
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            self._headers_in = False  # a pipelined request's headers, parsed in super(), set it again
            super().on_response_complete()
            self._h11_headers_in()
            if not self._headers_in and not self.transport.is_closing():
                self._arm()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._stall is None:
                self._stall = self.loop.call_later(WRITE_S, self._stalled)

        def resume_writing(self) -> None:
            self._unstall()
            super().resume_writing()

        def _unstall(self) -> None:
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None

        def _stalled(self) -> None:
            self._stall = None
            if not self.transport.is_closing():
                self.transport.abort()  # close() would wait to flush what the client does not read

        def connection_lost(self, exc) -> None:
            self._disarm()
            self._unstall()
            super().connection_lost(exc)

    return HeaderDeadline


def uvicorn_server(config):
    """uvicorn's Server whose event loop says a failed accept() (out of descriptors) as FILES_LINE, at most once a
    PEER_LOG_S with the count it stood for; every other error in the loop goes to asyncio's own handler."""
    import uvicorn

    peers, log = PeerLog(), logging.getLogger("uvicorn.error")

    def handle(loop, context) -> None:
        message = str(context.get("message", ""))
        if message.startswith(ACCEPT_FAILED):
            peers.say(log, FILES_LINE)
        elif "_start_serving" in message and isinstance(context.get("exception"), ValueError):
            pass  # a retry of accept() (asyncio sets one per failed accept) after the listener closed: nothing to do
        else:
            loop.default_exception_handler(context)

    class Server(uvicorn.Server):
        async def serve(self, sockets=None) -> None:
            asyncio.get_running_loop().set_exception_handler(handle)
            await super().serve(sockets)

    return Server(config)


class PeerLog:
    """uvicorn's lines about what clients sent (PEER_LINES, TLS_LINE), in words, each logged at most once a PEER_LOG_S
    with the count of those it stood for: a client sending garbage in a loop logged a warning a request."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.last: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def say(self, log, line: str) -> None:
        now = self.clock()
        if line in self.last and now - self.last[line] < PEER_LOG_S:
            self.held[line] = self.held.get(line, 0) + 1
            return
        held, since = self.held.pop(line, 0), now - self.last.get(line, now)
        self.last[line] = now
        log.warning(line + (f" ({held:,} more like it in the {since:.0f} s before)" if held else ""))

    def over(self, log) -> "_PeerLogger":
        """`log` (uvicorn's logger of a connection) with its lines about clients said through this."""
        return _PeerLogger(log, self)


class _PeerLogger:
    """A connection's logger whose warnings about what the client sent go through PeerLog.say (one class for every
    connection: it was made anew for each)."""

    def __init__(self, log, peers: PeerLog):
        self._log, self._peers = log, peers

    def __getattr__(self, name):
        return getattr(self._log, name)

    def warning(self, msg, *args, **kwargs):
        if msg not in PEER_LINES:
            return self._log.warning(msg, *args, **kwargs)
        if PEER_LINES[msg] is not None:
            self._peers.say(self._log, PEER_LINES[msg])


def _more_descriptors(most: int = 65_536) -> None:
    """The soft limit on open files raised to the hard one (at most `most`): at the usual soft 1,024 a few hundred
    slow clients left none for the rest, and asyncio's accept loop logged a traceback per refused connection."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = min(most, hard) if hard != resource.RLIM_INFINITY else most
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):  # no such limit here, or not ours to raise
        pass


class Stopped(str):
    """The name of the signal that stopped the server ('done' without one), and `cut`: the requests still in flight
    when the grace (GRACE_S) ran out, which uvicorn cancelled. "requests in flight were answered" was said for those
    too."""
    cut = 0


class _GraceCut(logging.Filter):
    """Counts the requests uvicorn cancels when the graceful shutdown's time runs out (its "Cancel N running task(s)"
    line), and lets every record through."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Cancel %s running task") and record.args:
            self.count += int(record.args[0])
        return True


def run(spec, ref, decoder: bool, on_ready=lambda info: None, on_preparing=lambda seconds: None) -> str | None:
    """Prepare the backend, then serve until SIGTERM or SIGINT; returns the signal's name that ended it. A backend
    that cannot run here (or whose output is wrong) is refused with one line before anything listens, or after
    on_preparing's where preparing took more than PREPARING_S."""
    sock = bind(spec.host, spec.port)
    try:
        return _serve(spec, ref, decoder, sock, on_ready, on_preparing)
    finally:
        sock.close()


def _serve(spec, ref, decoder: bool, sock: socket.socket, on_ready, on_preparing) -> str | None:
    import uvicorn

    tokenizer = tokenizer_for(ref)  # a broken one refused before minutes of preparing, not after
    stopped: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = {}
    if main:  # noted here; uvicorn takes these over while it serves and raises them again once it has shut down
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda s, f: stopped.append(s))
    # The model runs in a process of its own (model_process.py says why); here the event loop shares the interpreter
    # lock with the threads that pass messages to it, and gets it back within the switch interval (5 ms by default).
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)
    model = ModelProcess(spec, ref, decoder)
    try:
        model.start()
        began, said = time.monotonic(), False
        while not model.ready.wait(0.2):
            if stopped:
                return signal.Signals(stopped[0]).name
            if not said and time.monotonic() - began >= PREPARING_S:
                said = True
                on_preparing(time.monotonic() - began)
        if model.failure:
            raise SpecError(f"{spec.backend} {spec.dtype} could not be prepared for {ref.name}: {model.failure}")
        if stopped:
            return signal.Signals(stopped[0]).name
        api = Api(spec, ref, decoder, model, tokenizer)
        _more_descriptors()
        config = uvicorn.Config(build_app(api), host=spec.host, port=spec.port, log_level="warning",
                                access_log=False, lifespan="off", timeout_graceful_shutdown=GRACE_S,
                                http=header_deadline_protocol())
        server = uvicorn_server(config)
        api.stopping = lambda: server.should_exit
        sock.listen(config.backlog)  # before the ready line: a client that connects on reading it waits, not refused
        on_ready({**model.info, "dtype": spec.dtype, "backend": spec.backend, "model": api.name,
                  "url": f"http://{f'[{spec.host}]' if ':' in spec.host else spec.host}:{spec.port}",  # IPv6 in []
                  "tokenizer": api.tok.name, "endpoint": "/v1/completions" if decoder else "/v1/embeddings"})
        cut = _GraceCut()
        logging.getLogger("uvicorn.error").addFilter(cut)
        try:
            server.run(sockets=[sock])
        finally:
            logging.getLogger("uvicorn.error").removeFilter(cut)
        if not server.started and not stopped:
            raise SpecError(f"cannot listen on {spec.host}:{spec.port}")
        ended = Stopped(signal.Signals(stopped[0]).name if stopped else "done")
        ended.cut = cut.count
        return ended
    finally:
        sys.setswitchinterval(switch)
        model.stop(timeout=GRACE_S)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
