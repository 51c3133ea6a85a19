"""The load generator's HTTP target: a plan's requests sent to an OpenAI-compatible endpoint over asyncio (HTTP/1.1
through h11, a connection per request in flight, kept alive), each at its planned time (open loop) or on the return
of the last (closed loop), and what came back.

Every request is kept, whatever became of it: answered, refused (HTTP 4xx/5xx or the connection refused), dropped
(the connection or the stream ended early), timed out, or malformed (a body or event that is not the API's JSON).
Latency runs from the *planned* send time, so a stalled server or a client that fell behind delays finishes, never
arrivals (no coordinated omission); the client's own lag, the actual send time less the planned one, is kept per
request so a load that was not offered as planned says so (endpoint.py).

Streaming (server-sent events) for completions and chat: each event carrying text is a token's arrival (servers
such as vLLM send one event a token; one that bundles tokens shows fewer, wider gaps), giving time to first token
and the gaps between tokens. Token counts come from the response's `usage` where the server gives it (streams ask
for it with `stream_options.include_usage`). A server that ignores `"stream": true` and sends the whole completion as
one JSON body (_whole) is answered too: its first token arrived with the rest, so its TTFT is the whole answer's
time and it has no gaps between tokens."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import re
import resource
import socket
import threading
import time
from dataclasses import dataclass, field

from ... import boundary
from ...boundary import one_line
from ...errors import SpecError
from .load import DRAIN_LIMIT_S, MAX_REQUESTS, LoadPlan, no_collector

API_PATHS = {"openai-completions": "/v1/completions", "openai-chat": "/v1/chat/completions",
             "openai-embeddings": "/v1/embeddings"}
APIS = tuple(API_PATHS)
KEEP_OUTPUTS = 64  # requests (the first ones) whose outputs are kept for the reference check
# Seconds the body after a stream's [DONE] may take to end (its last chunk follows at once from a real server) before
# the connection is closed instead of kept for the next request.
AFTER_DONE_S = 1.0
SPIN_S = 0.0015  # the event loop sleeps in whole milliseconds (epoll): the last of a wait is spent yielding instead
# What is kept of an endpoint's answers, each far above a real one's: a body without end (or of gigabytes) was held
# whole until --request-timeout, 2.8 GB in 12 s.
ERROR_BYTES = 4096  # an error answer: its message is all that is kept (_message, 200 characters)
RESPONSE_BYTES = 8 * 2**20  # a JSON answer: an embedding of 8,192 floats is 200 KB as JSON text
LINE_BYTES = 2**20  # a line of an event stream: one event, a token's text
TEXT_CHARS = 2**20  # generated text kept for the reference check (its tokens up to --new-tokens are compared)
# Events carrying text a stream may send per token asked for (and beyond, for a few): a server sends one a token,
# some a few (text split where a character's bytes are). A stream past this is malformed: one that never ended grew
# its list of event times until --request-timeout.
EVENTS_PER_TOKEN, EXTRA_EVENTS = 8, 64
# Lines a stream may send for each event of text it may send (its data line, the blank line that ends it, and event:,
# id: or retry: fields or comments beside it) and more (keep-alives), and bytes, beside a JSON answer's worth: a stream
# of comments, blank lines or events of no text sent as fast as it was read went on until --request-timeout, each of
# its lines parsed on the load's one event loop, and 17 such requests made sends lag a second, a load of 6 s run 26.
LINES_PER_EVENT, EXTRA_LINES = 8, 4096
EVENT_BYTES = 4096
# Pieces (HTTP chunks, or reads of a body) a body read whole may come in: PIECES, and one for each PIECE_BYTES; a
# stream, as many as its lines. A body of 1 MB in chunks of a byte took 15 s of the load's one event loop to read.
PIECES, PIECE_BYTES = 4096, 256
# An answer not streamed and of no usage count keeps this many characters of its text a token asked for, to be
# counted after the load (endpoint.fill_counts): a load keeps up to MAX_REQUESTS answers of up to RESPONSE_BYTES
# each, terabytes of text kept whole, where a real answer runs a few characters a token.
COUNT_CHARS_PER_TOKEN = 64
MODELS_BYTES = 2**20  # the /v1/models listing: tens of bytes a model
MODEL_CHARS = 256  # a listed model name: sent in every request and stored as the record's `model`
MAX_TOKENS = 10**9  # a usage count above this is no model's: a 400-digit one overflowed the accounting
F32_MAX = 3.4028234663852886e38  # an embedding's values: float32 (the reference check's dtype)
# A closed loop short of its plan's min_measured goes on past its window only while the endpoint answers: past this
# long without one answered request it stops. An endpoint that stalled its first seconds (graphs captured under
# load) left an offline probe of a handful of requests; one that never answers must not hold the probe to --timeout.
QUIET_S = 10.0


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
    reasoning_tokens: int | None = None  # of completion_tokens, where usage.completion_tokens_details says
    reasoning_events: int = 0  # of steps: events that carried reasoning and no answer text (chat)
    text: str = ""  # generated text (kept for the first KEEP_OUTPUTS requests)
    # False for an answer sent as one JSON body, not streamed (_whole): `steps` holds its arrival alone, and it has no
    # gaps between tokens or TPOT (endpoint._tpot_ms)
    streamed: bool = True
    # an answer not streamed whose usage gave no completion count: its text, reasoning included, for
    # endpoint.fill_counts to count (then dropped)
    uncounted: str | None = None
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
    waited: int = 0  # requests that waited for a connection (every one of `pool` busy)
    capped_s: float | None = None  # a closed loop stopped at MAX_REQUESTS requests, this long into the load
    # A closed loop that went on past its window, or ended it short of the plan's min_measured: {ended_s, measured,
    # need, why (past_window's reason), sent_past (requests sent past the window)}, for the cell's warning and info
    stretch: dict | None = None
    unsent: int = 0  # open loop: requests not sent, MAX_IN_FLIGHT being in flight (each a `timeout`)


def embedding_values(value) -> list[float]:
    """An embedding as the endpoint sent it: a list of numbers, or base64 of little-endian float32 values (the
    OpenAI API's encoding_format "base64")."""
    if isinstance(value, str):
        import base64
        import binascii
        import struct

        try:
            raw = base64.b64decode(value, validate=True)
        except binascii.Error:
            raise ValueError("not base64") from None
        if not raw or len(raw) % 4:
            raise ValueError("not float32 values")
        value = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    if not isinstance(value, list) or not value or any(type(v) not in (int, float) for v in value):  # bool too
        raise ValueError("not a list of numbers")
    # NaN, infinity (JSON's NaN/Infinity, or their float32 bits) and values past float32's range (infinite there) are
    # no embedding: the reference check's cosine of one is NaN (comparisons are exact for any int, false for NaN)
    if not all(-F32_MAX <= v <= F32_MAX for v in value):
        raise ValueError("a value is NaN, infinite or past float32's range")
    return value


def payload(api: str, model: str, prompt: str, new_tokens: int) -> dict:
    """The request body: greedy (temperature 0), exactly `new_tokens` tokens where the server honours ignore_eos
    (vLLM, SGLang, transbench server: a benchmark wants a known output length; others ignore the field)."""
    if api == "openai-embeddings":
        # base64, as OpenAI's own client asks by default: 4 bytes a value where JSON text takes about 20, and
        # decoded in microseconds where parsing the text took 0.13 ms a bert-base vector (a JSON parse on a 2-core
        # host), time the load's one event loop would not spend sending. A server that ignores the field answers
        # floats, read the same (embedding_values).
        return {"model": model, "input": prompt, "encoding_format": "base64"}
    gen = {"model": model, "max_tokens": new_tokens, "temperature": 0, "stream": True,
           "stream_options": {"include_usage": True}, "ignore_eos": True}
    if api == "openai-chat":
        return {**gen, "messages": [{"role": "user", "content": prompt}]}
    return {**gen, "prompt": prompt}


def _message(body: bytes) -> str:
    """An error answer's message (its error.message, its error, or its body's text), one line of 200 characters."""
    try:
        err = boundary.loads_json(body, "an error response").get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        text = str(msg) if msg else body[:200].decode(errors="replace")
    except (ValueError, AttributeError):
        text = body[:200].decode(errors="replace")
    return one_line(text[:200])[:200]


def shown(url: str) -> str:
    """A URL as it may be printed or stored: credentials before an `@` (user:password@) hidden, up to the last `@`,
    where a password holding one unescaped would otherwise leave its end in clear."""
    return re.sub(r"^((?:[^:/?#]*:)?//).*@", r"\1***@", url, flags=re.DOTALL)  # with a scheme or without (//host)


class Malformed(Exception):
    pass


def _usage(r: Sent, usage) -> None:
    """The token counts of an answer's `usage` (null or absent: none given), each a whole number in 0..MAX_TOKENS
    (a negative, infinite, NaN or text count reached the stored tokens_per_s, which the store then refuses): the one
    check of a count read from an endpoint; anything else makes the request Malformed."""
    if usage is None:
        return
    if not isinstance(usage, dict):
        raise Malformed(f"usage is {type(usage).__name__}, not an object")
    for key in ("prompt_tokens", "completion_tokens"):
        count = usage.get(key)
        if count is None:
            continue
        if type(count) is not int or not 0 <= count <= MAX_TOKENS:
            raise Malformed(f"usage.{key} is {str(count)[:40]!r}, not a whole number of tokens in 0..{MAX_TOKENS:,}")
        setattr(r, key, count)
    details = usage.get("completion_tokens_details")  # OpenAI's, vLLM's, DeepSeek's: reasoning_tokens among them
    count = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if count is not None:
        if type(count) is not int or not 0 <= count <= MAX_TOKENS:
            raise Malformed(f"usage.completion_tokens_details.reasoning_tokens is {str(count)[:40]!r}, not a whole "
                            f"number of tokens in 0..{MAX_TOKENS:,}")
        r.reasoning_tokens = count


class Dropped(Exception):
    pass


# Informational (1xx) answers a request's answer may follow (103 Early Hints, 102 Processing now and then): sent
# without end as fast as they were read, each was parsed until --request-timeout on the load's one event loop, and 20
# such requests made sends lag half a second and their timeouts come 2.6 s late.
INFORMATIONAL = 100
TLS_RECORDS = (b"\x15\x03", b"\x16\x03")  # a TLS alert or handshake record (version 3.x): TLS where HTTP was asked


STATUS_LINE = re.compile(rb"HTTP/1\.[01] [1-5][0-9][0-9][ \r]")
H11_WORDS = {"Receive buffer too long": "its head is over the 16 KiB read of one",  # h11's own words, where unclear
             "Received server _SWITCH_UPGRADE event without a pending proposal":
                 "a 101 Switching Protocols that no request asked for"}


def not_http(first: bytes, why: str = "") -> str:
    """Why an answer that h11 could not read as HTTP/1.1 is none, in words, from its first bytes and h11's reason
    (`why`)."""
    if first.startswith(TLS_RECORDS):
        return "the server answered in TLS, not plain HTTP: give the URL as https://"
    if why and STATUS_LINE.match(first):  # a status line, then a broken head or body: "not HTTP/1.1 (it began
        # b'HTTP/1.1 200 OK')" contradicted itself (a chunk size not in hex, a head of 70 kB, two Content-Lengths)
        return f"the answer began as HTTP/1.1 and broke its rules: {one_line(H11_WORDS.get(why, why), 100)}"
    # the bytes' repr cut to 70 characters: 40 bytes of \xNN escapes ran to 160, a line longer than a terminal's
    return f"the answer is not HTTP/1.1 (it began {repr(first[:40])[:70]})"


class Connection:
    """One HTTP/1.1 connection, h11 (the protocol library under httpx) over asyncio streams: one request at a time,
    kept alive between them, opened again where the server closed it.

    Why not httpx.AsyncClient: on a 2-core host under load, httpx answered 215 requests/s with 32 clients of one
    connection each (87/s with one client of 32 connections), where asyncio streams carried 4,200/s to the same
    server: the client, not the server, set the rate, and its send lag grew with it. The /v1/models listing is asked
    over one of these too (served_models).

    A connection the server closed or reset, or bytes that are not HTTP, end the request with a line in words (Dropped,
    Malformed): h11's own ("can't handle event type ConnectionClosed when role=SERVER and state=SEND_RESPONSE",
    "illegal status line: bytearray(...)") was the reason a cell printed and stored."""

    def __init__(self, host: str, port: int, ssl_context):
        self.host, self.port, self.ssl = host, port, ssl_context
        self.authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address in brackets
        self.reader = self.writer = self.h11 = None
        self.first = b""  # the current answer's first bytes (what a broken one began with)
        self.eof = False  # the server closed the connection: h11's error after it is a drop, not a malformed answer

    async def _open(self) -> None:
        import h11

        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, ssl=self.ssl)
        self.h11 = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = self.h11 = None

    def _cut(self, how: str) -> Dropped:
        """The server closed (or reset) the connection before its answer was whole."""
        return Dropped(f"the server {how} the connection " + ("part way through its answer" if self.first else
                                                              "without answering"))

    async def _event(self):
        import h11

        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise (self._cut("closed") if self.eof else Malformed(not_http(self.first, str(exc)))) from None
            if event is h11.NEED_DATA:
                try:
                    data = await self.reader.read(65536)
                except ConnectionResetError:
                    raise self._cut("reset") from None
                if len(self.first) < 40:
                    self.first += data[:40 - len(self.first)]
                self.eof = not data
                self.h11.receive_data(data)  # b"": the server closed the connection
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise self._cut("closed")
            return event

    async def post(self, path: str, body: bytes | None, method: str = "POST"):
        """Send the request (a GET where `body` is None); the response (h11.Response: status_code, headers; its body:
        chunks()). A request is sent once: one whose connection failed after it was written may have reached the
        server, and sent again it was answered once and counted as one answered request where the server had dropped
        it."""
        import h11

        if self.writer is not None:
            await asyncio.sleep(0)  # let the loop take in a close the server sent while the connection was idle
            if self.reader.at_eof() or self.writer.is_closing():
                self.close()  # a kept-alive connection the server closed while idle (uvicorn after 5 s): a new one
        if self.writer is None:
            await self._open()
        fields = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))] if body is not None else []
        # identity: the answer as it is (the client decodes no gzip); without the field any coding is acceptable
        request = h11.Request(method=method, target=path, headers=[("Host", self.authority), ("Accept", "*/*"),
                                                                   ("Accept-Encoding", "identity"), *fields])
        self.first, self.eof = b"", False
        try:
            self.writer.write(self.h11.send(request) + (self.h11.send(h11.Data(data=body)) if body else b"")
                              + self.h11.send(h11.EndOfMessage()))
            try:
                await self.writer.drain()
            except ConnectionError:  # reset or closed under the request: a sent part may have reached the server
                raise Dropped("the server closed the connection while the request was being sent") from None
            event, informational = await self._event(), 0
            while isinstance(event, h11.InformationalResponse):
                informational += 1
                if informational > INFORMATIONAL:
                    raise Malformed(f"the server sent over {INFORMATIONAL} informational (1xx) answers before its "
                                    "answer")
                event = await self._event()
            return event
        except (Dropped, Malformed, ConnectionError):
            self.close()
            raise

    async def chunks(self):
        import h11

        while True:
            event = await self._event()
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
                    self.h11.start_next_cycle()  # kept alive for the next request
                else:
                    self.close()
                return

    async def read(self, limit: int, chunks=None) -> bytes:
        """The body, or where it is longer than `limit`, its first limit + 1 bytes: the rest is left unread (it may
        never end) and the connection closed. chunks: the body's chunks where some were read already (_sniff)."""
        kept, size = [], 0
        async for chunk in chunks if chunks is not None else self.chunks():
            kept.append(chunk)
            size += len(chunk)
            if size > limit:
                self.close()
                break
            if len(kept) > PIECES + size // PIECE_BYTES:
                self.close()
                raise Malformed(f"the body came in over {PIECES:,} pieces of under {PIECE_BYTES} bytes on average")
        return b"".join(kept)[:limit + 1]


# Content-Types that do not say whether a body is one JSON answer or an event stream: none at all, the one RFC 9110
# (8.3) lets a recipient assume where none is sent, and text/plain, which Go's net/http gives a body it does not
# recognise (its DetectContentType names JSON and an event stream alike so). Such an answer is told by its body.
GENERIC_TYPES = (b"", b"application/octet-stream", b"text/plain")
BLANK = b" \t\r\n"  # JSON's whitespace (RFC 8259), which may come before its first byte
BOM = b"\xef\xbb\xbf"  # a byte order mark that may open a body
SNIFF_BYTES = 2**16  # blanks a body may open with before it is read as a stream (whose reader bounds its lines)


async def _sniff(chunks):
    """(the first byte of the body past a byte order mark and blanks, or b"" where it has none within SNIFF_BYTES,
    the body's chunks from its start): a JSON answer begins with `{` or `[`, which no line of an event stream that
    carries data does (a stream's lines are fields, `data: ...`, or comments, `: ...`). A body of no Content-Type
    whose JSON answer was read as a stream was `malformed` ("came whole with no text and no [DONE] event"), one
    sent as application/octet-stream or text/plain "not an event stream"."""
    held, size, pending, start = [], 0, b"", True
    first = b""
    async for chunk in chunks:
        held.append(chunk)
        size += len(chunk)
        pending += chunk  # at most the 2 bytes of a byte order mark begun, and this chunk
        if start:
            if len(pending) < len(BOM) and BOM.startswith(pending):
                continue  # a byte order mark may be split across chunks
            pending, start = pending.removeprefix(BOM), False
        pending = pending.lstrip(BLANK)
        if pending:
            first = pending[:1]
            break
        if size > SNIFF_BYTES:  # blanks without end: the stream's reader bounds them
            break
    else:
        first = pending[:1] if start else b""  # a body that ended within a byte order mark's first bytes

    async def body():
        for chunk in held:
            yield chunk
        async for chunk in chunks:  # the rest (none where the body ended within the look)
            yield chunk
    return first, body()


async def _lines(chunks, most_lines: int | None = None, most_bytes: int | None = None):
    """The stream's lines, ended by CRLF, LF or a bare CR (the event-stream format allows all three; a CR at the end
    of one chunk and an LF at the start of the next are one ending). A line's pieces are joined once, when it ends
    (`buf += chunk` copied the pending line on every chunk: quadratic in a line without end), and a line over
    LINE_BYTES is Malformed, as are more than `most_lines` lines or pieces (chunks) or `most_bytes` bytes in all
    (None: any)."""
    pending, size, after_cr, first = [], 0, False, True
    lines = total = pieces = 0
    async for chunk in chunks:
        total += len(chunk)
        pieces += 1
        if most_bytes is not None and total > most_bytes:
            raise Malformed(f"the stream is over {most_bytes:,} bytes ({EVENT_BYTES:,} for each event of text it may "
                            f"send, and {RESPONSE_BYTES:,})")
        if most_lines is not None and pieces > most_lines:
            raise Malformed(f"the stream came in over {most_lines:,} pieces (HTTP chunks or reads), as many as the "
                            "lines it may send")
        if after_cr and chunk.startswith(b"\n"):
            chunk, after_cr = chunk[1:], False  # the CR's LF, once: a chunk of "\n" alone leaves none pending
        if not chunk:
            continue
        after_cr = chunk.endswith(b"\r")
        parts = _LINE_END.split(chunk)
        for i, part in enumerate(parts):
            pending.append(part)
            size += len(part)
            if size > LINE_BYTES:
                raise Malformed(f"a line of the event stream is over {LINE_BYTES:,} bytes")
            if i < len(parts) - 1:
                lines += 1
                if most_lines is not None and lines > most_lines:
                    raise Malformed(f"the stream sent over {most_lines:,} lines ({LINES_PER_EVENT} for each event of "
                                    f"text it may send, and {EXTRA_LINES:,}): comments, blank lines or events of no "
                                    "text without end")
                yield _text(pending, first)
                pending, size, first = [], 0, False
    if size:
        yield _text(pending, first)


def _text(pieces: list[bytes], first: bool) -> str:
    """A line of the stream as text; the stream's first line without its byte order mark (U+FEFF), which the
    event-stream format strips: kept, it made the first event's field another name than `data`, skipped, and the first
    token's time (TTFT) the second's. Bytes that are not UTF-8 are kept as surrogates (surrogateescape), for _events
    to refuse in an event's data: replaced by U+FFFD, a stream of broken text was answered `ok`."""
    line = b"".join(pieces).decode("utf-8", errors="surrogateescape")
    return line.removeprefix("\ufeff") if first else line


_LINE_END = re.compile(rb"\r\n|\r|\n")


async def _events(lines):
    """The data of each event: its `data` fields' values joined by newlines (one event may span several), dispatched
    at the blank line that ends it, as the event-stream format says; other fields (event, id, retry) and comments
    (lines starting with ":") are skipped. An event's data over LINE_BYTES, or not UTF-8, is Malformed. Data left
    without its blank line when the stream ends is dispatched too: a `data: [DONE]` that ends the body is the
    stream's end."""
    data, size = [], 0
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
            data, size = [], 0
            continue
        name, colon, value = line.partition(":")
        if name != "data":
            continue
        value = value[1:] if colon and value.startswith(" ") else value
        try:
            value.encode()
        except UnicodeEncodeError as exc:  # a byte _text kept as a surrogate: JSON text is UTF-8 (RFC 8259)
            bad = value[exc.start].encode(errors="surrogateescape")
            raise Malformed(f"an event is not UTF-8 text (byte {bad!r} in {value[:60].encode(errors='replace')!r})")
        data.append(value)
        size += len(value) + 1
        if size > LINE_BYTES:
            raise Malformed(f"an event of the event stream is over {LINE_BYTES:,} bytes")
    if data:
        yield "\n".join(data)


# Where a reasoning model's chat stream carries its reasoning, before the answer's `content`: vLLM, SGLang and
# DeepSeek send `reasoning_content`, newer vLLM and OpenRouter `reasoning`. Its tokens are output tokens, as vLLM's
# benchmark client and NVIDIA AIPerf count them: read as content alone, TTFT ran to the first answer token, the gaps
# between tokens skipped the reasoning, and a request whose max_tokens all went to reasoning was `malformed`.
REASONING_FIELDS = ("reasoning_content", "reasoning")


def _piece(event: dict, api: str, data: str, whole: bool = False) -> tuple[str | None, str | None]:
    """(the answer text a streamed event carries, the reasoning text it carries), None where none, or Malformed where
    its `choices` are not the API's: a list of objects, each with a `text` (completions) or a `delta` object with a
    `content` and maybe a reasoning field (chat, REASONING_FIELDS), text or null. whole: an answer not streamed
    (_whole), whose chat choice holds a `message` object where a stream's holds a `delta`."""
    what, holder_key = ("the answer", "message") if whole else ("an event", "delta")
    choices = event.get("choices")
    if choices is None or choices == []:  # a usage-only event
        return None, None
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise Malformed(f"{what}'s choices are not a list of objects: {data[:80]!r}")
    holder = choices[0] if api == "openai-completions" else choices[0].get(holder_key)
    if holder is None:
        return None, None
    if not isinstance(holder, dict):
        raise Malformed(f"{what}'s {holder_key} is not an object: {data[:80]!r}")
    piece = holder.get("text" if api == "openai-completions" else "content")
    thought = None
    if api == "openai-chat":
        thought = next((holder[k] for k in REASONING_FIELDS if holder.get(k) is not None), None)
    if any(t is not None and not isinstance(t, str) for t in (piece, thought)):
        raise Malformed(f"{what}'s text is not text: {data[:80]!r}")
    return piece, thought


async def _stream(conn: Connection, r: Sent, api: str, now, keep: bool, asked: int, framed: bool, chunks):
    """Read a stream of events into `r`: more events carrying text than `asked` tokens can send (EVENTS_PER_TOKEN
    each, and EXTRA_EVENTS), or more lines or bytes than those events take (_lines), is Malformed, and so is a usage
    count of more completion tokens than asked, or of none where text came: 10^9 tokens for 4 asked made a token rate
    of billions a second. Returns, where the stream sent its [DONE], what is left of the body to read (_rest), outside
    the request's timeout: the answer is whole. framed: the body has a length or chunks, so its end without [DONE] was
    not a cut connection. chunks: the body's."""
    most = EVENTS_PER_TOKEN * asked + EXTRA_EVENTS
    finished = False
    events = _events(_lines(chunks, LINES_PER_EVENT * most + EXTRA_LINES, RESPONSE_BYTES + EVENT_BYTES * most))
    async for data in events:
        if not data.strip():  # an event of no data (a keep-alive `data:` line) carries nothing: it was `malformed`
            continue
        if data.strip() == "[DONE]":
            finished = True
            r.done = now()  # the answer's end: a server that holds the body open after it does not lengthen it
            break
        try:
            event = boundary.loads_json(data, "a streamed event")
        except ValueError:
            raise Malformed(f"an event is not JSON: {data[:80]!r}") from None
        if not isinstance(event, dict):
            raise Malformed(f"an event is not a JSON object: {data[:80]!r}")
        if event.get("error"):
            r.status, r.error = "error", _message(data.encode())
            continue
        piece, thought = _piece(event, api, data)
        if piece or thought:  # a chat stream's first delta carries the role alone
            if len(r.steps) == most:
                raise Malformed(f"the stream sent over {most:,} events of text ({EVENTS_PER_TOKEN} a token asked for, "
                                f"and {EXTRA_EVENTS})")
            r.steps.append(now())  # a token of either kind: TTFT is the first, every gap counts
            r.reasoning_events += not piece  # an event of both counts as the answer's
            if piece and keep and len(r.text) < TEXT_CHARS:  # the answer alone: the reference check compares it
                r.text += piece
        _usage(r, event.get("usage"))
    if not finished and r.ok and framed:  # the body came whole (its length or last chunk): nothing was cut, and an
        # empty 200 read as `dropped` sent the user after a network fault
        r.status, r.error = "malformed", (f"the stream's body came whole with {'text' if r.steps else 'no text'} and "
                                          "no [DONE] event")
    elif not finished and r.ok:  # a body ended by closing the connection: where [DONE] is missing, it may be cut
        r.status, r.error = "dropped", "the stream ended before its [DONE] event"
    elif r.ok and not r.steps:  # a usage count alone is no generation: there is no token time to measure
        r.status, r.error = "malformed", "no content was streamed: no event carried text"
    elif r.ok:
        _counts_fit(r, asked, f"a stream of {len(r.steps):,} events of text")
    return _rest(conn, events) if finished else None


def _counts_fit(r: Sent, asked: int, what: str) -> None:
    """`r` malformed where its usage counts no answer of text could have: a completion count outside 1..asked (10^9
    tokens for 4 asked made a token rate of billions a second, 0 for text sent made 0 tokens/s), or more reasoning
    tokens than completion tokens. what: the answer, in words."""
    if r.completion_tokens is not None and not 1 <= r.completion_tokens <= asked:
        r.status, r.error = "malformed", (f"usage.completion_tokens is {r.completion_tokens:,} for {what}, "
                                          f"{asked:,} tokens asked for")
    elif r.reasoning_tokens is not None and r.reasoning_tokens > (r.completion_tokens or asked):
        r.status, r.error = "malformed", ("usage.completion_tokens_details.reasoning_tokens is "
                                          f"{r.reasoning_tokens:,}, over the {r.completion_tokens or asked:,} "
                                          "completion tokens")


async def _whole(conn: Connection, r: Sent, api: str, now, keep: bool, asked: int, chunks) -> None:
    """Read into `r` a completion sent as one JSON body (Content-Type application/json), where the request asked for
    a stream: servers that ignore `"stream": true` answer so, and AIPerf and vLLM's benchmark client read such an
    answer as one whose first token came with its last. It is answered, its one arrival (`steps`) the body's end, so
    its TTFT is the whole answer's time and it has no gaps between tokens or TPOT (`streamed` False; the cell warns).
    Its tokens are usage.completion_tokens, held to what a stream's are (_usage, _counts_fit); without one, its text
    is kept for endpoint.fill_counts to count. A body over RESPONSE_BYTES, not JSON, of another shape or of no text
    is Malformed; an `error` in it makes the request `error`, as in a stream. chunks: the body's."""
    raw = await conn.read(RESPONSE_BYTES, chunks)
    r.done = now()  # the answer's last byte, and its first token's arrival
    if len(raw) > RESPONSE_BYTES:
        raise Malformed(f"the response is over {RESPONSE_BYTES:,} bytes")
    if not raw.strip():
        raise Malformed("the answer (application/json) has no body: no completion was sent")
    try:  # a byte order mark before it, which RFC 8259 (8.1) lets a reader ignore, as _sniff steps over it
        data = boundary.loads_json(raw.removeprefix(BOM), "the response", fix="")
    except boundary.BadInput as exc:
        raise Malformed(f"{exc} (it began {raw[:60]!r})") from None
    if not isinstance(data, dict):
        raise Malformed(f"the answer is not a JSON object: {raw[:80]!r}")
    if data.get("error"):
        r.status, r.error = "error", _message(raw[:ERROR_BYTES])
        return
    piece, thought = _piece(data, api, raw[:80].decode(errors="replace"), whole=True)
    _usage(r, data.get("usage"))
    if not (piece or thought):
        raise Malformed("the answer was not streamed and carries no text")
    r.steps.append(r.done)
    r.streamed = False
    r.reasoning_events = int(not piece)  # as a stream's event: one of reasoning alone counts as reasoning
    if piece and keep:  # the answer alone: the reference check compares it
        r.text = piece[:TEXT_CHARS]
    if r.completion_tokens is None:
        r.uncounted = ((thought or "") + (piece or ""))[:COUNT_CHARS_PER_TOKEN * max(1, asked)]
    _counts_fit(r, asked, "an answer not streamed")


async def _rest(conn: Connection, events) -> None:
    """What follows a stream's [DONE], read to the body's end within AFTER_DONE_S so that the connection can carry the
    next request; a body held open past that, or cut, reset or garbled after [DONE], closes the connection and leaves
    the answer as it was: read within the request's timeout, a server holding the body open made a whole answer
    `timeout`, and one closing the connection without the body's last chunk made it `dropped`."""
    async def drain() -> None:
        async for _ in events:
            pass
    try:
        await asyncio.wait_for(drain(), AFTER_DONE_S)
    except (asyncio.TimeoutError, Dropped, Malformed, OSError):
        conn.close()


async def _send(conn: Connection, path: str, api: str, body: bytes, r: Sent, now, keep: bool, asked: int,
                widths: dict):
    """Send one request and read its answer into `r`; returns what is left to read of a whole stream (_stream), or
    None. widths: the load's embedding width, set by its first answered
    embedding (an endpoint serves one model, so another width is a wrong answer: a mixed pool behind one URL)."""
    r.sent = now()
    clean, rest = False, None
    try:
        response = await conn.post(path, body)
        status, headers = response.status_code, dict(response.headers)
        if not 200 <= status < 300:  # redirects are not followed: a 307's empty body read as a stream was `dropped`
            # an answer of no body (a 429 or 500 of its status line alone) left its error empty: "http_500: " the
            # cell's only word; its reason phrase and Retry-After (a server shedding load) say what it sent
            reason = one_line(f"HTTP {status} " + bytes(response.reason)[:60].decode(errors="replace"))
            message = _message(await conn.read(ERROR_BYTES)) or f"no message ({reason})"
            wait = one_line(headers.get(b"retry-after", b"")[:40].decode(errors="replace"))
            if wait:
                message = f"{message[:200 - len(wait) - 16]} (Retry-After: {wait})"
            # credentials in it hidden (shown): a redirect to `http://user:token@other-host/` stored the token in clear
            moved = shown(one_line(headers.get(b"location", b"")[:120].decode(errors="replace")))
            r.status, r.error = f"http_{status}", f"redirected to {moved!r}, not followed" if moved else message
        elif headers.get(b"content-encoding", b"identity").strip().lower() != b"identity":
            # a gzip stream read as events was `dropped` ("the stream ended before its [DONE] event"), its lines none
            coding = headers[b"content-encoding"][:40].decode(errors="replace")
            raise Malformed(f"the answer is encoded ({one_line(coding)!r}, its Content-Encoding), where the request "
                            "asked for none (Accept-Encoding: identity)")
        elif api == "openai-embeddings":
            raw = await conn.read(RESPONSE_BYTES)
            if len(raw) > RESPONSE_BYTES:
                raise Malformed(f"the response is over {RESPONSE_BYTES:,} bytes")
            if not raw.strip():  # a 204, or a 200 with nothing in it: "not an embeddings list: b''" said less
                raise Malformed(f"the answer ({status}) has no body: no embedding was sent")
            try:
                data = boundary.loads_json(raw, "the response", fix="")
            except boundary.BadInput as exc:  # not UTF-8, nested past the bound, a number of 4,300 digits: said
                raise Malformed(f"{exc} (it began {raw[:60]!r})") from None
            try:
                emb = embedding_values(data["data"][0]["embedding"])
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                why = f" ({exc})" if type(exc) is ValueError else ""  # embedding_values' reason
                raise Malformed(f"the response is not an embeddings list{why}: {raw[:80]!r}") from None
            first = widths.setdefault("embedding", len(emb))
            if len(emb) != first:
                raise Malformed(f"the embedding has {len(emb):,} values, where the load's first answer had {first:,}")
            if keep:
                r.embedding = emb
            _usage(r, data.get("usage"))
        else:
            # an HTML page (a proxy's error) read as a stream was `dropped`, its lines being no events; an answer
            # whose Content-Type is generic or absent is told by its body (_sniff): JSON, else a stream whose events,
            # or their absence, decide
            kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            chunks = conn.chunks()
            if kind in GENERIC_TYPES:
                first, chunks = await _sniff(chunks)
                kind = b"application/json" if first in (b"{", b"[") else b"text/event-stream"
            if kind == b"application/json":  # the whole answer at once: a server that ignores "stream"
                await _whole(conn, r, api, now, keep, asked, chunks)
            elif kind != b"text/event-stream":
                raise Malformed(f"the answer is not an event stream (Content-Type {kind.decode(errors='replace')!r})")
            else:
                # 204 No Content has no body by its status (RFC 9110, 15.3.5): it came whole, and was `dropped`
                framed = status == 204 or b"content-length" in headers or b"chunked" in headers.get(
                    b"transfer-encoding", b"").lower()
                rest = await _stream(conn, r, api, now, keep, asked, framed, chunks)
        clean = True
    except Malformed as exc:
        r.status, r.error = "malformed", str(exc)
    except (ConnectionRefusedError, socket.gaierror) as exc:
        r.status, r.error = "refused", str(exc)[:200] or "connection refused"
    except Dropped as exc:
        r.status, r.error = "dropped", str(exc)
    except ConnectionError:  # reset while a connection was opened (a closed or reset one mid-answer is Dropped above)
        r.status, r.error = "dropped", "the server reset the connection without answering"
    except OSError as exc:
        r.status, r.error = "error", f"{type(exc).__name__}: {exc}"[:200]
    finally:
        if not clean or r.done is None:
            r.done = now()
        if not clean:  # cancelled (timed out) or failed mid-response: the connection's state is unknown
            conn.close()
    return rest


def past_window(t: float, measured: int, plan: LoadPlan, last_answer: float | None,
                timeout_s: float) -> str | None:
    """Why a closed loop's client, free at `t` past its plan's window with `measured` requests sent after the warm-up,
    sends no more (None: it sends another): as the in-process loop (load.py), it goes on until min_measured requests
    are measured, within the plan's limit_s (a request sent then ends, answered or timed out, within the drain the
    cell's deadline leaves after it); over HTTP only while the endpoint answers: `silent` where no request was ever
    answered, `quiet` where none was for QUIET_S."""
    if measured >= plan.min_measured:
        return "measured"
    if last_answer is None:
        return "silent"
    if t - last_answer > QUIET_S:
        return "quiet"
    if t + timeout_s > plan.limit_s + DRAIN_LIMIT_S:
        return "limit"
    return None


# Open files the process keeps for its own (its modules, the store, a tokenizer's files) beside its connections.
OWN_FILES = 128
# Requests one load keeps in flight at once: a closed loop's clients (--concurrency above it is refused, spec.check),
# an open loop's requests (one planned while this many are in flight is not sent, and counts as a `timeout`). The
# load's one event loop opens, serves and times out every request; measured on a 2-core host against a local endpoint
# in another process, --duration 1 --request-timeout 5 (6 s planned): 10,000 clients ran 4.3 s against an endpoint
# that answers at once and 6.2 s against one that never answers (a rate of 10,000/s, 6.9 s); 15,000 clients ran
# 7.4 s and 19,000 ran 11.5 s and 17.6 s, every request a timeout; 100,000 (80,000 waiting for a connection) ran 37 s.
MAX_IN_FLIGHT = 10_000


def connection_limit() -> int:
    """Connections this process may hold: its open-file limit, the soft limit raised first to the hard one (a process
    may raise its own), less OWN_FILES; no limit at all, MAX_REQUESTS (no load has more requests)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ValueError, OSError):
        pass
    if soft == resource.RLIM_INFINITY:  # -1: soft - OWN_FILES made a pool of one connection
        return MAX_REQUESTS
    return max(1, soft - OWN_FILES)


def pool_size(plan: LoadPlan) -> int:
    """Connections enough for every request in flight at once (a plan's every request, or its clients, at most
    MAX_IN_FLIGHT), within the open files the process may hold (connection_limit): the client never makes a request
    wait for a connection where it can help it."""
    wanted = len(plan.arrivals) if plan.arrivals is not None else plan.concurrency
    return max(1, min(wanted, MAX_IN_FLIGHT, connection_limit()))


class Connections:
    """Idle connections, taken by one request at a time; a new one where none is idle, up to `limit` (the load's
    requests in flight at once), so no request waits for a connection while one can be opened."""

    def __init__(self, url: str, limit: int):
        import ssl
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        https = parts.scheme == "https"
        self.host, self.port = parts.hostname, parts.port or (443 if https else 80)
        self.ssl = ssl.create_default_context() if https else None  # one context for every connection
        self.limit, self.made, self.idle = limit, 0, []
        self.waiters: asyncio.Queue | None = None
        self.waited = 0

    async def take(self) -> Connection:
        if self.idle:
            return self.idle.pop()
        if self.made < self.limit:
            self.made += 1
            return Connection(self.host, self.port, self.ssl)
        if self.waiters is None:
            self.waiters = asyncio.Queue()
        self.waited += 1
        return await self.waiters.get()  # every connection busy: wait for one (counted in the request's latency)

    def give(self, conn: Connection) -> None:
        if self.waiters is not None and self.waiters._getters:  # noqa: SLF001  (a request waits for a connection)
            self.waiters.put_nowait(conn)
        else:
            self.idle.append(conn)

    def close(self) -> None:
        for c in self.idle:
            c.close()
        while self.waiters is not None and not self.waiters.empty():  # given to a waiter whose deadline then came
            self.waiters.get_nowait().close()


async def _load(url: str, api: str, bodies, plan: LoadPlan, timeout_s: float) -> HttpTrace:
    import h11  # noqa: F401  (imported before the clock starts: imported at the first connection, its 0.1 s was the
    # first request's send lag)

    pool = pool_size(plan)
    path = API_PATHS[api]
    conns = Connections(url, pool)
    t0 = time.perf_counter()
    now = lambda: time.perf_counter() - t0  # noqa: E731
    out: list[Sent] = []
    in_flight = peak = 0
    widths: dict = {}
    capped = None
    measured = 0  # closed loop: requests sent after the warm-up
    last_answer: float | None = None  # when the latest answered request ended
    past = 0  # closed loop: requests sent past the window
    stops: list[tuple[float, str]] = []  # closed loop: when each client stopped past its window, and why
    ended = unsent = 0  # open loop: requests ended, and not sent (MAX_IN_FLIGHT were in flight)

    async def one(r: Sent) -> None:
        nonlocal in_flight, peak, last_answer, ended
        in_flight += 1
        peak = max(peak, in_flight)
        body = bodies(r)
        client = None

        async def exchange():
            nonlocal client
            client = await conns.take()
            return await _send(client, path, api, json.dumps(body).encode(), r, now, r.rid < KEEP_OUTPUTS,
                               body.get("max_tokens", 0), widths)
        # The whole request's deadline, the wait for a free connection included: with every connection of the pool
        # busy (its size held down by the open-file limit) a request waited outside it, and against an endpoint that
        # stalled, the fourth of four requests on one connection ended four timeouts after it was planned.
        try:
            rest = await asyncio.wait_for(exchange(), timeout_s)
            if rest is not None:  # the answer is whole: the body after its [DONE] is the connection's business
                await rest
        except asyncio.TimeoutError:
            r.status, r.error, r.done = "timeout", f"no complete answer within {timeout_s:g} s", now()
            if client is None:
                r.error = (f"no connection free within {timeout_s:g} s: every one of the {conns.limit:,} the "
                           "client may open (its open-file limit) was busy")
        finally:
            in_flight -= 1
            ended += 1
            if client is not None:
                conns.give(client)
            if r.ok:
                last_answer = now()

    lengths = plan.lengths
    try:
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
                # counted from the tasks made, not from those begun: behind its plan the loop makes tasks without a
                # pause, and none has begun
                if len(tasks) - ended >= MAX_IN_FLIGHT:
                    unsent += 1
                    r.status, r.done = "timeout", now()
                    r.error = (f"not sent: {MAX_IN_FLIGHT:,} requests were in flight, the most the client keeps at "
                               "once")
                    continue
                tasks.append(asyncio.create_task(one(r)))
            await asyncio.gather(*tasks)
        else:
            counter = iter(range(10**12))

            async def client_loop() -> None:
                nonlocal capped, measured, past
                while True:
                    t = now()
                    if t >= plan.span_s:
                        why = past_window(t, measured, plan, last_answer, timeout_s)
                        if why is not None:
                            stops.append((t, why))
                            return
                        past += 1
                    # A closed loop keeps every request, as an open loop's plan does, and is held to the same cap:
                    # against an endpoint that died mid-run each connection is refused at once, and 4 clients sent
                    # 17,000 requests a second, the worker growing by about 1 KB each until --duration ended.
                    if len(out) >= MAX_REQUESTS:
                        capped = t if capped is None else capped
                        return
                    i = next(counter)
                    r = Sent(i, t, lengths[i % len(lengths)])
                    out.append(r)
                    measured += t >= plan.warmup_s
                    await one(r)

            await asyncio.gather(*(client_loop() for _ in range(plan.concurrency)))
    finally:
        conns.close()
    if capped is not None:  # the load's window ends where it stopped: every rate is over the seconds it ran
        plan = dataclasses.replace(plan, span_s=capped)
    stretch = None
    if stops and (past or measured < plan.min_measured):  # the last client to stop says why the load ended
        stretch = {"ended_s": stops[-1][0], "measured": measured, "need": plan.min_measured, "why": stops[-1][1],
                   "sent_past": past}
    return HttpTrace(out, plan, now(), pool, peak, t0, conns.waited, capped, stretch, unsent)


class _Daemons(concurrent.futures.ThreadPoolExecutor):
    """The event loop's executor, where asyncio resolves host names (getaddrinfo blocks): a daemon thread a call, never
    waited for. asyncio.run waits for its default executor's threads as it ends, so a resolver that did not answer
    held `serve --url`'s reachability check past its deadline (30 s for one of 1 s), and the load past its requests'
    timeouts; a host name is resolved once per connection opened, so these threads are few."""

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()

        def work() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001  (handed to whoever waits, as the pool's own threads do)
                    future.set_exception(exc)
        threading.Thread(target=work, name="transbench-resolve", daemon=True).start()
        return future

    def shutdown(self, wait=True, *, cancel_futures=False) -> None:
        pass


def run(coro):
    """asyncio.run(coro) with _Daemons for its executor: it ends when `coro` does."""
    async def main():
        asyncio.get_running_loop().set_default_executor(_Daemons(max_workers=1))
        return await coro
    return asyncio.run(main())


def run_http_load(url: str, api: str, bodies, plan: LoadPlan, timeout_s: float) -> HttpTrace:
    """Run the plan against the endpoint, without the cyclic collector (load.no_collector: a full collection stalls
    the sends). `bodies(sent)` gives a request's JSON body."""
    with no_collector():
        return run(_load(url.rstrip("/"), api, bodies, plan, timeout_s))


def tls_words(exc: Exception) -> str:
    """Why a TLS handshake failed, in words: ssl's own ("[SSL: WRONG_VERSION_NUMBER] wrong version number
    (_ssl.c:1006)") named no cause a user could act on."""
    import ssl

    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"its TLS certificate is not trusted here ({exc.verify_message or exc.reason})"
    if isinstance(exc, (ssl.SSLEOFError, ConnectionError)):  # transbench server closes a TLS handshake's connection
        return "the server closed the connection during the TLS handshake: is the URL http://?"
    reason = getattr(exc, "reason", None) or ""
    if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"):
        return "it does not answer in TLS: give the URL as http://"
    return f"the TLS handshake failed ({reason or type(exc).__name__})"


async def _connect(conns: "Connections", phase: list) -> Connection:
    """An open connection to the URL's endpoint, `phase[0]` saying how far it got (connect, tls, then answer): over
    https a plain TCP connection first, so a TLS handshake that never ends is told apart from no connection."""
    phase[0] = "connect"
    if conns.ssl is not None:
        _, writer = await asyncio.open_connection(conns.host, conns.port)
        writer.close()
        phase[0] = "tls"
    conn = Connection(conns.host, conns.port, conns.ssl)
    await conn._open()  # noqa: SLF001
    phase[0] = "answer"
    return conn


def _unreachable(url: str, phase: str, exc: BaseException, timeout_s: float) -> SpecError:
    """SpecError, one line: no connection (or TLS handshake) with the endpoint, in words."""
    import ssl

    nothing = f"--url {url}: nothing accepts a connection there"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        if phase == "tls":
            return SpecError(f"--url {url}: the TLS handshake did not end within {timeout_s:g} s (a plain HTTP server "
                             "waits for a request: is the URL http://?)")
        return SpecError(f"{nothing} (no connection within {timeout_s:g} s)")
    if isinstance(exc, ssl.SSLError) or (phase == "tls" and isinstance(exc, ConnectionError)):
        return SpecError(f"--url {url}: {tls_words(exc)}")
    if isinstance(exc, ConnectionRefusedError):
        return SpecError(f"{nothing} (connection refused)")
    if isinstance(exc, socket.gaierror):
        return SpecError(f"{nothing} (the host name does not resolve)")
    if isinstance(exc, ConnectionError):
        return SpecError(f"--url {url}: the server closed the connection at once")
    return SpecError(f"{nothing} ({type(exc).__name__}: {str(exc)[:120]})")


def check_reachable(url: str, timeout_s: float = 10.0) -> None:
    """SpecError, one line, where nothing accepts a connection at the URL within `timeout_s` (a host name that does
    not resolve, nothing listening, a TLS handshake refused or never ended). With --served-model no listing is asked
    for first, and such a load ran to its end as a cell of failed requests, exit 0."""
    phase = ["connect"]

    async def connect() -> None:
        (await _connect(Connections(url, 1), phase)).close()

    try:
        run(asyncio.wait_for(connect(), timeout_s))
    except (OSError, asyncio.TimeoutError) as exc:  # ssl.SSLError is an OSError
        raise _unreachable(url, phase[0], exc, timeout_s) from None


def is_model_name(name) -> bool:
    """A model's name as an endpoint lists it and every request sends it: text of 1 to MODEL_CHARS printable
    characters, not all blank (`serve --url U --served-model ' '` measured a load whose model no endpoint serves)."""
    return isinstance(name, str) and 0 < len(name) <= MODEL_CHARS and name.isprintable() and bool(name.strip())


def served_models(url: str, timeout_s: float = 10.0) -> list[str]:
    """The model names the endpoint lists at /v1/models (vLLM, TEI, transbench server): text of 1 to MODEL_CHARS
    printable characters (a number or a list landed in the record's text key `model`, a 5 MB name in every request).
    SpecError, one line, where it lists none or its listing cannot be read: no answer, an answer over MODELS_BYTES or
    not whole within `timeout_s`. The deadline holds for the whole exchange, headers included: httpx's timeout is a
    read's, and a listing sent a byte a second, or headers a line a second, held `serve --url` for ever. Asked over
    the load's own connection (Connection), whose failures are said in words: httpx's were its class names ("no
    answer: RemoteProtocolError"), and an endpoint that accepted and never answered was told to name its model."""
    def refuse(why: str):
        raise SpecError(f"--url {url}: the endpoint lists no model at /v1/models ({why}): name it with --served-model")

    phase = ["connect"]
    held: list[Connection] = []

    async def fetch() -> tuple[int, bytes, str]:
        conn = await _connect(Connections(url, 1), phase)
        held.append(conn)  # its first bytes say whether an answer had begun by the deadline
        try:
            response = await conn.post("/v1/models", None, method="GET")
            phase[0] = "read"
            body = await conn.read(MODELS_BYTES)
        finally:
            conn.close()
        headers = dict(response.headers)
        moved = shown(one_line(headers.get(b"location", b"")[:120].decode(errors="replace")))
        wait = one_line(headers.get(b"retry-after", b"")[:40].decode(errors="replace"))
        return response.status_code, body, moved, wait

    try:
        status, body, moved, wait = run(asyncio.wait_for(fetch(), timeout_s))
    except (Dropped, Malformed) as exc:
        raise SpecError(f"--url {url}: GET /v1/models: {exc}") from None
    except (OSError, asyncio.TimeoutError) as exc:
        if phase[0] in ("connect", "tls"):
            raise _unreachable(url, phase[0], exc, timeout_s) from None
        if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
            if phase[0] == "read" or (held and held[0].first):
                refuse(f"no whole answer within {timeout_s:g} s")
            raise SpecError(f"--url {url}: the endpoint accepted a connection and sent no answer to GET /v1/models "
                            f"within {timeout_s:g} s") from None
        raise SpecError(f"--url {url}: GET /v1/models: {type(exc).__name__}: {str(exc)[:120]}") from None
    if 300 <= status < 400 and moved:  # "lists no model ... name it with --served-model" sent the user to a load
        # whose every request was redirected too (http:// to https://, another host): redirects are not followed
        raise SpecError(f"--url {url}: GET /v1/models was redirected (HTTP {status}) to {moved!r}, and redirects are "
                        "not followed: give the URL it redirects to")
    # "lists no model: name it with --served-model" sent the user to a load whose every request was refused the same:
    # credentials asked for (this client sends none), or an endpoint shedding load or not serving
    said = _message(body[:ERROR_BYTES]) or "no message"
    if status in (401, 403):
        raise SpecError(f"--url {url}: GET /v1/models was refused (HTTP {status}: {said[:120]}): the endpoint asks for "
                        "credentials, which this client does not send")
    if status == 429 or status >= 500:
        after = f"; Retry-After: {wait}" if wait else ""
        raise SpecError(f"--url {url}: GET /v1/models answered HTTP {status} ({said[:120]}{after}): the endpoint is "
                        "not serving now")
    if not 200 <= status < 300:
        refuse(f"HTTP {status}")
    if len(body) > MODELS_BYTES:
        refuse(f"its answer is over {MODELS_BYTES:,} bytes")
    try:
        listed = boundary.loads_json(bytes(body), "the listing").get("data")
    except (ValueError, AttributeError):
        refuse("its answer is not a JSON object")
    ids = [m.get("id") for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
    names = [i for i in ids if is_model_name(i)]
    if not names:
        refuse(f"no id is a name of 1 to {MODEL_CHARS} printable characters, not all blank" if ids else "none listed")
    return names
