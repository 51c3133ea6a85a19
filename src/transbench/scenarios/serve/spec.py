"""What `transbench serve` is asked for (ServeSpec), checked and expanded into cells in the parent process."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from collections import Counter
from pathlib import Path

from ...declare import setting
from ...errors import SpecError
from ...measure.device import DTYPES
from ...measure import timer
from ...measure.load import check_threads, threads_setting
from ...models import build
from ...runner.worker import timeout_setting
from ...spec import MAX_SECONDS, check_once, checked
from . import arrivals as serve_arrivals, lengths as serve_lengths, stats as serve_stats, tails
from . import trace as serve_trace
from .cell import ServeCell, prompt_room
from .load import DRAIN_LIMIT_S, MAX_REQUESTS

# A batch that waits longer than a minute for company is a misconfiguration (`serve --max-wait-ms 1e300` stored an
# `ok` cell that served nothing); `server` takes the same bound.
MAX_WAIT_MS = 60_000.0

PERCENTILE_KEYS = {50.0: "latency_p50_ms", 90.0: "latency_p90_ms", 99.0: "latency_p99_ms", 99.9: "latency_p999_ms"}
PREPARE_BUDGET_S = 20.0  # the fused engine's bucket ladder at bert-base 32 x 512 is ~80 graphs, a few seconds each


def prepare_budget_setting():
    """--prepare-budget, as in-process serving and `transbench server` take it (server_spec.py)."""
    return setting(PREPARE_BUDGET_S, "seconds of preparation (graphs, buckets) before requests are served; a batch "
                   "whose own bucket was left runs a larger prepared one")


def max_wait_setting():
    """--max-wait-ms, as in-process serving and `transbench server` take it (server_spec.py)."""
    return setting(2.0, f"a batch leaves when its oldest request has waited this long (0 to {MAX_WAIT_MS:,.0f})")


# What a cell's deadline holds besides its load: the model's build, the correctness gate and the drain.
DEADLINE_SLACK_S = 30.0
# The shortest span a trace may replay in. A span of a few 1e-320 s (timestamps 0 and 1e-320 ms, or a 2-s trace
# at --trace-speed 1e308) is above 0, but a rate over it (measure.py plan_for: requests over the span) overflows
# to inf, and the cell measured, stored an `error` ("offered_rate is inf") and exited 0.
MIN_TRACE_SPAN_S = 1e-6


@dataclass
class ServeSpec:
    model: str = setting("bert-base-uncased", "preset or local checkpoint folder", short="-m")
    task: str = setting("classification", "an encoder task, or generate (decoders: generation under load)")
    backends: list[str] = setting(["sdpa"], "backends", option="--backend", short="-b", aliases=("--backends",))
    dtype: str | None = setting(None, "default fp16 on GPU, fp32 on CPU", choices=DTYPES[:4])
    device: str = setting("auto", "auto|cpu|cuda|cuda:N")
    rates: list[float] = setting([], "arrival rates, requests/s", option="--rate")
    concurrency: list[int] = setting([], "closed loop: clients, each sending its next request when the last returns")
    offline: bool = setting(False, "every batch full: the throughput bound", flag="--offline")
    lengths: str = setting("lognormal:64:256", "fixed:N | normal:MEAN:MAX[:STDEV] | lognormal:MEAN:MAX[:SIGMA] | "
                           "counts:FILE | text:FILE (tokenized, one request a line)")
    max_batch_size: int = setting(32, "the batcher's largest batch")
    max_wait_ms: float = max_wait_setting()
    duration: float = setting(10.0, "seconds of arrivals measured per cell (at most 86,400); a --rate too low for 20 "
                                    "arrivals in it measures 20 / rate seconds")
    warmup: float = setting(2.0, "seconds of arrivals served first and not counted (at most 86,400)")
    slo_ms: float | None = setting(None, "end-to-end latency target, ms (the e2e objective of --slo)")
    percentile: float = setting(99.0, "the percentile a verdict (--find-max-rate, slo_met) holds under --slo-ms / "
                                "--slo, by MLPerf LoadGen's early-stopping rule")
    find_max_rate: bool = setting(False, "bisect the largest rate meeting the target", flag="--find-max-rate")
    new_tokens: int = setting(32, "tokens generated per request (--task generate)")
    seed: int = setting(0, "seed of arrivals, lengths and weights")
    activation: str | None = setting(None, "gelu|gelu-tanh", cli=False)
    timeout: float = timeout_setting()
    threads: int | None = threads_setting()
    shard: str | None = setting(None, "I/N: serve slice I of N of the grid (whole backends with --find-max-rate); "
                                "auto: from the Slurm array task or Kubernetes Indexed Job pod")
    shard_count: int | None = setting(None, "--shard auto in a Kubernetes Indexed Job: its completions (else "
                                      "TRANSBENCH_SHARD_COUNT)")
    name: str | None = setting(None, "run name; rerunning a name resumes it")
    arrivals: str = setting("poisson", "poisson | gamma:B (burstiness B, vLLM's: 1 is Poisson, below 1 burstier) | "
                            "constant")
    trace: str | None = setting(None, "replay a JSON-lines trace (timestamp ms, input_length, output_length; "
                                "Mooncake's reads as is)")
    trace_speed: float = setting(1.0, "replay the trace this many times faster")
    slo: str | None = setting(None, "objectives a request must all meet, ms: ttft:200,tpot:50,e2e:2000 (goodput; "
                              "--slo-ms is e2e)")
    percentiles: list[float] = setting(list(serve_stats.DEFAULT_PERCENTILES), "latency percentiles stored, each with "
                                       "LoadGen's early-stopping estimate", axis=False)
    goodput_target: float | None = setting(None, "share of requests that must meet every objective (0.99): the "
                                           "verdict --find-max-rate holds")
    prepare_budget: float = prepare_budget_setting()
    # An HTTP endpoint instead of a backend in this process (endpoint.py).
    url: str | None = setting(None, "measure an OpenAI-compatible endpoint (http://HOST:PORT) instead of a backend in "
                              "this process")
    api: str | None = setting(None, "the endpoint's API: openai-completions | openai-chat | openai-embeddings")
    served_model: str | None = setting(None, "the requests' `model` field (default: the first the endpoint lists at "
                                       "/v1/models)")
    tokenizer: str | None = setting(None, "a local folder whose tokenizer makes the prompts and counts tokens the "
                                    "endpoint does not report (default: synthetic words)")
    reference_model: str | None = setting(None, "a local checkpoint folder: a sample of the endpoint's answers checked "
                                          "against its fp32 output")
    request_timeout: float = setting(60.0, "seconds a request may take at the endpoint before it counts as timed out")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def check(spec: ServeSpec) -> tuple[ServeSpec, serve_lengths.Lengths]:
    """The spec with device and dtype resolved, and its lengths; SpecError names what is wrong."""
    from ...measure import device as dev

    if not isinstance(spec, ServeSpec):
        raise SpecError(f"expected a ServeSpec, got {type(spec).__name__}")
    numbers = {"--rate": spec.rates, "--duration": [spec.duration], "--warmup": [spec.warmup],
               "--max-wait-ms": [spec.max_wait_ms], "--slo-ms": [] if spec.slo_ms is None else [spec.slo_ms],
               "--timeout": [spec.timeout], "--prepare-budget": [spec.prepare_budget],
               "--trace-speed": [spec.trace_speed],
               "--goodput-target": [] if spec.goodput_target is None else [spec.goodput_target]}
    for flag, values in numbers.items():  # NaN passes every range check below; inf never ends a load or a wait
        for v in values if isinstance(values, list) else []:  # other types: checked() below names them
            if isinstance(v, float) and not math.isfinite(v):
                raise SpecError(f"{flag} {v}: give a finite number")
    spec = checked(ServeSpec, spec)  # api.serve(ServeSpec(...)): each field's type, as the CLI's options
    check_threads(spec.threads)
    listed = True
    if spec.url is not None:
        from . import endpoint_spec

        listed = spec.served_model is None  # the endpoint's listing is read (it answers, or the check refuses)
        spec = endpoint_spec.check(spec)  # model, task, backends and dtype of an endpoint; the load is checked below
        ref = endpoint_spec.shape_ref(spec)
        device, dtype = spec.device, spec.dtype
    else:
        endpoint_spec_refuse(spec)
        ref = build.resolve(spec.model)
        build.check_task(ref, spec.task)
        from ... import backends

        if not spec.backends:  # `-b ''` stored an empty run and exited 0
            raise SpecError("--backend is empty: give at least one value (an empty axis measures nothing)")
        for b in spec.backends:
            backends.get(b)
    for values, option in ((spec.backends, "--backend"), (spec.rates, "--rate"), (spec.concurrency, "--concurrency")):
        check_once(values, option)
    if spec.url is None:
        device = str(dev.resolve(spec.device))
        # None is "not given"; `--dtype ''` is refused below as any unknown dtype (it served the default silently)
        dtype = spec.dtype if spec.dtype is not None else ("fp16" if device.startswith("cuda") else "fp32")
        from ..inference.measure import TOLERANCE

        if dtype not in TOLERANCE:
            raise SpecError(f"unknown dtype '{dtype}': choose from {', '.join(TOLERANCE)}")
        dev.check_dtype_runs(device, dtype)  # run's check: bad input, not an `unsupported` cell
    if spec.slo_ms is not None and spec.slo_ms <= 0:
        raise SpecError(f"--slo-ms must be above 0, got {spec.slo_ms:g}")
    if spec.timeout <= 0:
        raise SpecError(f"--timeout must be above 0, got {spec.timeout:g}")
    # A trace lasts as its timestamps say (checked with --request-timeout below): a 3-s trace was refused here for
    # the default --duration of 10 s, which --trace refuses to be given
    if spec.url is not None and spec.trace is None \
            and spec.warmup + spec.duration + spec.request_timeout >= spec.timeout:
        total = spec.warmup + spec.duration + spec.request_timeout
        raise SpecError(f"--warmup + --duration + --request-timeout is {total:g} s, not within --timeout "
                        f"{spec.timeout:g} s: the cell could time out waiting on its last requests; shorten them or "
                        "raise --timeout")
    loads = bool(spec.rates) + bool(spec.concurrency) + spec.offline + spec.find_max_rate + (spec.trace is not None)
    if loads != 1:
        raise SpecError("give one load: --rate R[,R...], --concurrency C[,C...], --offline, --trace FILE or "
                        "--find-max-rate")
    arrivals = serve_arrivals.parse(spec.arrivals)
    if arrivals.kind != "poisson" and not (spec.rates or spec.find_max_rate):
        raise SpecError(f"--arrivals {spec.arrivals} shapes a rate's arrivals: add --rate or --find-max-rate")
    serve_trace.parse_speed(spec.trace_speed)
    if spec.trace_speed != 1.0 and spec.trace is None:
        raise SpecError("--trace-speed applies to --trace: add --trace FILE or leave --trace-speed out")
    if spec.trace is not None and spec.lengths != ServeSpec.lengths:
        raise SpecError("--lengths and --trace both say how long requests are: the trace's input_length is used; "
                        "leave --lengths out")
    # A replay lasts as long as its timestamps (measure.py plan_for never reads --duration for a trace): `--trace F
    # --duration 5` replayed the whole trace without a word, and stored the 5 in the cell's settings.
    if spec.trace is not None and spec.duration != ServeSpec.duration:
        raise SpecError("--duration and --trace both say how long the load lasts: the trace's timestamps are used; "
                        "leave --duration out (--trace-speed replays it faster)")
    serve_stats.parse_percentiles(spec.percentiles)
    objectives = {**(serve_stats.parse_slo(spec.slo) if spec.slo is not None else {})}
    if "e2e" in objectives and spec.slo_ms is not None:
        raise SpecError("--slo-ms is the e2e objective and --slo names e2e too: give it once")
    if spec.task != "generate" and set(objectives) - {"e2e"}:
        raise SpecError(f"--slo {spec.slo}: ttft and tpot are generation's; task {spec.task} returns one result a "
                        "request: use e2e (or --slo-ms)")
    if spec.goodput_target is not None:
        if not 0 < spec.goodput_target < 1:
            raise SpecError(f"--goodput-target is a share above 0 and below 1 (0.99), got {spec.goodput_target:g}")
        if not objectives and spec.slo_ms is None:
            raise SpecError("--goodput-target is the share meeting the objectives: add --slo or --slo-ms")
    if not 0 <= spec.prepare_budget:
        raise SpecError(f"--prepare-budget must be at least 0 seconds, got {spec.prepare_budget:g}")
    # The cell would time out preparing, before any load. An endpoint prepares nothing here: `serve --url --timeout 10`
    # was refused for the default budget of 20 s, an option --url has no use for.
    if spec.url is None and spec.prepare_budget >= spec.timeout:
        raise SpecError(f"--prepare-budget {spec.prepare_budget:g} s is not within --timeout {spec.timeout:g} s: lower "
                        "it (the shapes it leaves are prepared on first use)")
    if any(r <= 0 for r in spec.rates) or any(c < 1 for c in spec.concurrency):
        raise SpecError("--rate must be above 0 and --concurrency at least 1")
    if spec.url is not None and spec.concurrency:
        check_clients(max(spec.concurrency))
    if spec.max_batch_size < 1 or not 0 <= spec.max_wait_ms <= MAX_WAIT_MS:  # NaN fails too
        raise SpecError(f"--max-batch-size must be at least 1 and --max-wait-ms in 0..{MAX_WAIT_MS:,.0f}")
    if spec.duration <= 0 or spec.warmup < 0:
        raise SpecError("--duration must be above 0 and --warmup at least 0 seconds")
    for option, seconds in (("--duration", spec.duration), ("--warmup", spec.warmup)):
        if seconds > MAX_SECONDS:
            raise SpecError(f"{option} {seconds:g} s is above its limit of {MAX_SECONDS:,} s (a day): give fewer seconds")
    window = spec.warmup + spec.duration
    for r in spec.rates:
        if r * window > MAX_REQUESTS:
            raise SpecError(f"--rate {r:g} over a {window:g} s window (--warmup + --duration) plans {r * window:,.0f} "
                            f"requests, above the cap of {MAX_REQUESTS:,}: lower --rate or --duration")
    # A load that outlasts the cell's deadline can only end as `timeout`, after --timeout seconds of waiting:
    # --rate 0.01 stretches its window to 2,000 s (20 expected arrivals), and --rate 1e-300 planned arrivals 1e301 s
    # out, whose sleep overflowed in the arrivals thread and left the load waiting for the deadline.
    for r in spec.rates:
        span = serve_arrivals.window_s(r, spec.warmup, spec.duration)
        if span >= spec.timeout:
            raise SpecError(f"--rate {r:g} plans arrivals over {span:,.4g} s (--warmup + --duration, a low rate's "
                            f"stretched to {serve_arrivals.MIN_REQUESTS} expected arrivals), not within --timeout "
                            f"{spec.timeout:g} s: raise --rate or --timeout")
    if (spec.concurrency or spec.offline or spec.find_max_rate) and window >= spec.timeout:
        raise SpecError(f"--warmup + --duration is {window:g} s, not within --timeout {spec.timeout:g} s: the cell "
                        "could only time out; shorten them or raise --timeout")
    if spec.find_max_rate and spec.slo_ms is None and not objectives:
        raise SpecError("--find-max-rate needs a target: add --slo-ms MS or --slo ttft:MS,tpot:MS,e2e:MS")
    # a value off the default was given; the CLI also checks the default given (check_given)
    check_given(spec, percentile=float(spec.percentile) != ServeSpec.percentile,
                new_tokens=spec.new_tokens != ServeSpec.new_tokens)
    if spec.activation is not None and spec.activation not in build.ACTIVATIONS:  # as run's grid checks it
        raise SpecError(f"unknown activation '{spec.activation}': choose from {', '.join(build.ACTIVATIONS)}")
    if spec.new_tokens < 1:
        raise SpecError("--new-tokens must be at least 1")
    # In this process the last new token is never fed back: a 128-position model has room for a 97-token prompt and
    # --new-tokens 32, and a 1-position one for --new-tokens 1 (the advice was "--new-tokens 0 or less").
    endpoint = spec.url is not None
    top = prompt_room(ref.shape.max_positions, spec.task, spec.new_tokens, endpoint)
    if top < 1:
        most = ref.shape.max_positions - (1 if endpoint else 0)
        raise SpecError(f"--new-tokens {spec.new_tokens} leaves no room for a prompt in {ref.name}'s "
                        f"{ref.shape.max_positions} positions: use --new-tokens {most} or less")
    # Generation: a prompt has what the new tokens leave ("the model's 96 positions" misnamed gpt2-tiny's 128).
    fed = "" if endpoint else ", but the last, which is never fed back"
    room = (f"the {top} positions a prompt has ({ref.name}'s {ref.shape.max_positions} less --new-tokens "
            f"{spec.new_tokens}{fed})" if spec.task == "generate" else None)
    if spec.trace is not None:
        trace = serve_trace.read(spec.trace)
        over = [n for n in trace.inputs if n > top]
        if over:
            where = room or f"the model's {top} positions"
            raise SpecError(f"--trace {spec.trace}: {len(over):,} requests ask for more than {where} (the longest "
                            f"{max(over):,} tokens): give a trace that fits the model")
        span = trace.times_s[-1] / spec.trace_speed
        # every request at one time: `lower --warmup` was the advice, with --warmup 0; and a trace of one request at
        # 5000 ms was said to be "at timestamp 0" (times count from the first)
        if span <= 0:
            raise SpecError(f"--trace {spec.trace}: every request is at one timestamp, so the trace spans no time to "
                            "measure a rate over: give a trace whose timestamps advance")
        if span < MIN_TRACE_SPAN_S:
            raise SpecError(f"--trace {spec.trace}: the trace spans {span:.3g} s at --trace-speed "
                            f"{spec.trace_speed:g}, less than a microsecond to measure a rate over: give a trace "
                            "whose timestamps advance further, or a lower --trace-speed")
        if spec.warmup >= span:
            raise SpecError(f"--warmup {spec.warmup:g} s is not shorter than the trace's {span:.4g} s at --trace-speed "
                            f"{spec.trace_speed:g}: nothing would be measured; lower --warmup")
        # An endpoint's last request may take --request-timeout to end: a trace of 100 s with requests of 60 s was
        # taken under --timeout 150, and a slow endpoint made the cell a `timeout`
        after, beside = ((spec.request_timeout, f" beside --request-timeout {spec.request_timeout:g} s")
                         if spec.url is not None else (DEADLINE_SLACK_S, ""))
        if span + after >= spec.timeout:
            raise SpecError(f"the trace lasts {span:,.4g} s at --trace-speed {spec.trace_speed:g}, not within --timeout "
                            f"{spec.timeout:g} s{beside}: raise --trace-speed or --timeout"
                            + (", or lower --request-timeout" if beside else ""))
        # The trace's own lengths as a histogram: the gate, the buckets and the label read it (requests take theirs)
        hist = Counter(trace.inputs)
        counts = tuple(sorted(hist))
        lengths = serve_lengths.Lengths("counts", sum(trace.inputs) / len(trace.inputs), counts[-1], 0.0, counts,
                                        tuple(hist[c] for c in counts), f"trace:{trace.source}")
    else:
        # an endpoint's tokenizer is the one its prompts are made with (prompts.local_tokenizer): a --reference-model
        # folder whose config gives no positions was no tokenizer here
        tokens = (spec.tokenizer or spec.reference_model) if spec.url is not None else ref.path
        lengths = serve_lengths.parse(spec.lengths, top, tokens, room)
    from ...runner import shard as sharding

    spec = sharding.resolved(spec)  # `auto` becomes this task's I/N, stored with the run
    if spec.url is not None and not listed:
        # Last, after every check of what is on this machine: with --served-model no listing was read, and a URL where
        # nothing listens ran the whole load as a cell of failed requests, exit 0
        from .http_client import check_reachable

        check_reachable(spec.url)
    return dataclasses.replace(spec, device=device, dtype=dtype, percentile=float(spec.percentile),
                               percentiles=serve_stats.parse_percentiles(spec.percentiles)), lengths


def check_clients(clients: int) -> None:
    """A closed loop against an endpoint holds a connection per client, on the load's one event loop: clients beyond
    the connections the process may hold waited for one, and those beyond what one event loop drives
    (http_client.MAX_IN_FLIGHT) stretched the load, `--concurrency 100000 --duration 1 --request-timeout 5` to 37 s
    for 6 s planned. Refused before the load."""
    from .http_client import MAX_IN_FLIGHT, OWN_FILES, connection_limit

    held = connection_limit()
    if clients > held:
        raise SpecError(f"--concurrency {clients:,} needs a connection per client, and this process may hold "
                        f"{held:,} (its open-file limit, raised to the hard one, less {OWN_FILES} for its own files): "
                        "lower --concurrency, or raise the limit (ulimit -n)")
    if clients > MAX_IN_FLIGHT:
        raise SpecError(f"--concurrency {clients:,} is above the {MAX_IN_FLIGHT:,} clients one load's event loop "
                        "drives within their deadlines: lower --concurrency, or split the clients over several "
                        "`serve --url` processes")


def estimate_min_requests(q: float) -> int:
    """The fewest requests that carry LoadGen's estimate of the q-th percentile (662 for p99)."""
    return tails.min_requests(q / 100)


def carried(q: float, n: int) -> bool:
    """Whether n requests carry the q-th percentile itself (measure/timer.carried: 100 for p99)."""
    return timer.carried(q / 100, n)


def tail_share(spec: ServeSpec) -> float:
    """The verdict's percentile as a share: --goodput-target, else --percentile / 100."""
    return spec.goodput_target if spec.goodput_target is not None else spec.percentile / 100


def verdict_keys(spec: ServeSpec) -> tuple[str, str, str]:
    """The verdict's percentile in a cell's record: (its latency key, its LoadGen estimate's key, its label, p99.9):
    what a probe's line and its trail show beside the verdict, which --percentile 90 judged on p90."""
    q = round(tail_share(spec) * 100, 6)
    return f"latency_{serve_stats.name(q)}_ms", f"latency_{serve_stats.name(q)}_upper_ms", f"p{q:g}"


def cell(spec: ServeSpec, lengths, backend: str, mode: str, level: float = 0) -> ServeCell:
    share = tail_share(spec)
    # A --find-max-rate probe is planned long enough for its percentile's verdict (LoadGen's minimum, with a fifth
    # more for the Poisson count's spread), within what --timeout leaves beside preparing and draining; one still
    # short of it is not valid, never passed. A --rate cell keeps the --duration asked (its record says whether
    # its requests were enough: tail_valid).
    need = math.ceil(1.2 * tails.min_requests(share)) if spec.find_max_rate else serve_arrivals.MIN_REQUESTS
    limit = spec.timeout - spec.prepare_budget - DEADLINE_SLACK_S - DRAIN_LIMIT_S
    if spec.url is not None:
        # An endpoint prepares nothing here (its default --prepare-budget, 20 s, was taken from each window), and the
        # last request sent may take --request-timeout to end, not DRAIN_LIMIT_S: at --timeout 200 a probe of 1/s
        # stretched to 140 s, and requests timing out at 60 s made it a `timeout` cell, not a measured miss.
        limit = spec.timeout - spec.request_timeout - DEADLINE_SLACK_S
    trace = {}
    if mode == "trace":
        t = serve_trace.read(spec.trace)
        trace = {"path": str(Path(spec.trace).expanduser().resolve()), "source": t.source, "speed": spec.trace_speed}
    return ServeCell(spec.model, spec.task, backend, spec.dtype, mode, rate=float(level) if mode == "rate" else 0.0,
                     concurrency=int(level) if mode == "concurrency" else 0, lengths=lengths.to_dict(),
                     max_batch_size=spec.max_batch_size, max_wait_ms=spec.max_wait_ms, duration=spec.duration,
                     warmup=spec.warmup, slo_ms=spec.slo_ms, new_tokens=spec.new_tokens, device=spec.device,
                     seed=spec.seed, activation=spec.activation, arrivals=serve_arrivals.parse(spec.arrivals).label,
                     trace=trace, slo=serve_stats.parse_slo(spec.slo) if spec.slo is not None else {},
                     percentiles=tuple(sorted(set(spec.percentiles) | {round(share * 100, 6)})), tail_share=share, need=need,
                     window_limit=limit, prepare_budget=spec.prepare_budget, url=spec.url, api=spec.api,
                     served_model=spec.served_model, tokenizer=spec.tokenizer, reference_model=spec.reference_model,
                     request_timeout=spec.request_timeout)


def expand(spec: ServeSpec, lengths) -> list[ServeCell]:
    """The grid's cells (backend x load level) of this shard; --find-max-rate builds its probes as it goes."""
    from ...runner import shard as sharding

    out = []
    for b in spec.backends:
        out += [cell(spec, lengths, b, "rate", r) for r in spec.rates]
        out += [cell(spec, lengths, b, "concurrency", c) for c in spec.concurrency]
        if spec.offline:
            out.append(cell(spec, lengths, b, "offline"))
        if spec.trace is not None:
            out.append(cell(spec, lengths, b, "trace"))
    return sharding.select(out, sharding.resolve(spec.shard))


def backends(spec: ServeSpec) -> list[str]:
    """The backends whose --find-max-rate search this shard runs (a search is one backend's, never split)."""
    from ...runner import shard as sharding

    return sharding.select(spec.backends, sharding.resolve(spec.shard), group=lambda b: b)


def endpoint_spec_refuse(spec: ServeSpec) -> None:
    """The endpoint's options without --url: refused, as they would be ignored."""
    given = [f"--{f.replace('_', '-')}" for f in ("api", "served_model", "tokenizer", "reference_model")
             if getattr(spec, f) is not None]
    if spec.request_timeout != ServeSpec.request_timeout:
        given.append("--request-timeout")
    if given:
        verb, it = ("applies", "it") if len(given) == 1 else ("apply", "them")
        raise SpecError(f"{', '.join(given)} {verb} to an endpoint: add --url http://HOST:PORT, or leave {it} out")


def check_given(spec: ServeSpec, percentile: bool, new_tokens: bool) -> None:
    """--percentile and --new-tokens where given (the CLI knows; check() sees only values off the default), refused
    where nothing uses them: `serve --rate 10 --percentile 99` ran without a word, as 99 is the default."""
    q = float(spec.percentile)
    if percentile and not (math.isfinite(q) and 0 < q < 100 and round(q, 4) == q):  # checked without a target too
        raise SpecError(f"--percentile {spec.percentile:g}: give a percentile above 0 and below 100 (99, 99.9)")
    if percentile and spec.slo_ms is None and spec.slo is None:
        raise SpecError(f"--percentile {spec.percentile:g} is the percentile a verdict holds under --slo-ms or --slo, "
                        "and none is given: add one, or leave --percentile out (--percentiles says which are stored)")
    if percentile and spec.goodput_target is not None:
        raise SpecError("--percentile and --goodput-target both set the verdict's share: give one")
    if new_tokens and spec.url is not None:  # an endpoint's task is its API's
        if spec.api in ("openai-completions", "openai-chat"):
            return
        raise SpecError(f"--new-tokens {spec.new_tokens} applies to --api openai-completions or openai-chat")
    if new_tokens and spec.task != "generate":
        raise SpecError(f"--new-tokens {spec.new_tokens} applies to --task generate; task {spec.task} generates "
                        "nothing: leave --new-tokens out, or use --task generate with a decoder")
