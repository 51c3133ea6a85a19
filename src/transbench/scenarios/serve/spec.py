"""What `transbench serve` is asked for (ServeSpec), checked and expanded into cells in the parent process."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ...errors import SpecError
from ...models import build
from ...spec import MAX_SECONDS, check_limits, check_once, checked
from . import arrivals as serve_arrivals, lengths as serve_lengths
from .cell import ServeCell

PERCENTILE_KEYS = {50.0: "latency_p50_ms", 90.0: "latency_p90_ms", 99.0: "latency_p99_ms", 99.9: "latency_p999_ms"}
# A rate's arrivals are planned in full before its load starts, and the load keeps every request as Python objects
# (its arrival, start, finish): a million take under a second to plan and ~350 MB in the worker, and cover 80,000/s
# over the default 12 s window (bert-base serves ~9,000/s on an H100). --rate 1e9 planned 7e8 arrivals for minutes
# and grew the worker to gigabytes before the first request. Closed-loop clients are queued at the start alike.
MAX_REQUESTS = 1_000_000


@dataclass
class ServeSpec:
    model: str = "bert-base-uncased"
    task: str = "classification"  # generate: generation under load (decoders)
    backends: list[str] = field(default_factory=lambda: ["sdpa"])
    dtype: str | None = None  # default fp16 on a GPU, fp32 on the CPU
    device: str = "auto"
    rates: list[float] = field(default_factory=list)  # Poisson rates (an axis)
    concurrency: list[int] = field(default_factory=list)  # closed-loop clients (an axis)
    offline: bool = False
    lengths: str = "lognormal:64:256"
    max_batch_size: int = 32
    max_wait_ms: float = 2.0
    duration: float = 10.0
    warmup: float = 2.0
    slo_ms: float | None = None
    percentile: float = 99.0
    find_max_rate: bool = False
    new_tokens: int = 32
    seed: int = 0
    activation: str | None = None
    timeout: float = 900.0
    name: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def check(spec: ServeSpec) -> tuple[ServeSpec, serve_lengths.Lengths]:
    """The spec with device and dtype resolved, and its lengths; SpecError names what is wrong."""
    from ...measure import device as dev

    if not isinstance(spec, ServeSpec):
        raise SpecError(f"expected a ServeSpec, got {type(spec).__name__}")
    numbers = {"--rate": spec.rates, "--duration": [spec.duration], "--warmup": [spec.warmup],
               "--max-wait-ms": [spec.max_wait_ms], "--slo-ms": [] if spec.slo_ms is None else [spec.slo_ms],
               "--timeout": [spec.timeout]}
    for flag, values in numbers.items():  # NaN passes every range check below; inf never ends a load or a wait
        for v in values if isinstance(values, list) else []:  # other types: checked() below names them
            if isinstance(v, float) and not math.isfinite(v):
                raise SpecError(f"{flag} {v}: give a finite number")
    spec = checked(ServeSpec, spec)  # api.serve(ServeSpec(...)): each field's type, as the CLI's options
    ref = build.resolve(spec.model)
    build.check_task(ref, spec.task)
    from ... import backends

    if not spec.backends:  # `-b ''` stored an empty run and exited 0
        raise SpecError("--backend is empty: give at least one value (an empty axis measures nothing)")
    for b in spec.backends:
        backends.get(b)
    for values, option in ((spec.backends, "--backend"), (spec.rates, "--rate"), (spec.concurrency, "--concurrency")):
        check_once(values, option)
    device = str(dev.resolve(spec.device))
    # None is "not given"; `--dtype ''` is refused below as any unknown dtype (it served the default without a word)
    dtype = spec.dtype if spec.dtype is not None else ("fp16" if device.startswith("cuda") else "fp32")
    from ..inference.measure import TOLERANCE

    if dtype not in TOLERANCE:
        raise SpecError(f"unknown dtype '{dtype}': choose from {', '.join(TOLERANCE)}")
    dev.check_dtype_runs(device, dtype)  # run's check: bad input, not an `unsupported` cell
    if spec.slo_ms is not None and spec.slo_ms <= 0:
        raise SpecError(f"--slo-ms must be above 0, got {spec.slo_ms:g}")
    if spec.timeout <= 0:
        raise SpecError(f"--timeout must be above 0, got {spec.timeout:g}")
    loads = bool(spec.rates) + bool(spec.concurrency) + spec.offline + spec.find_max_rate
    if loads != 1:
        raise SpecError("give one load: --rate R[,R...], --concurrency C[,C...], --offline or --find-max-rate")
    if any(r <= 0 for r in spec.rates) or any(c < 1 for c in spec.concurrency):
        raise SpecError("--rate must be above 0 and --concurrency at least 1")
    if spec.max_batch_size < 1 or spec.max_wait_ms < 0:
        raise SpecError("--max-batch-size must be at least 1 and --max-wait-ms at least 0")
    if spec.duration <= 0 or spec.warmup < 0:
        raise SpecError("--duration must be above 0 and --warmup at least 0 seconds")
    for option, seconds in (("--duration", spec.duration), ("--warmup", spec.warmup)):
        if seconds > MAX_SECONDS:
            raise SpecError(f"{option} {seconds:g} s is above its limit of {MAX_SECONDS:,} s (a day): give fewer seconds")
    check_limits(**{"--max-batch-size": spec.max_batch_size, "--new-tokens": spec.new_tokens})  # --concurrency: below
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
    for c in spec.concurrency:
        if c > MAX_REQUESTS:
            raise SpecError(f"--concurrency {c} queues {c:,} requests at once, above the cap of {MAX_REQUESTS:,}")
    if spec.find_max_rate and spec.slo_ms is None:
        raise SpecError("--find-max-rate needs a latency target: add --slo-ms MS")
    # a value off the default was given; the CLI also checks the default given (check_given)
    check_given(spec, percentile=float(spec.percentile) != ServeSpec.percentile,
                new_tokens=spec.new_tokens != ServeSpec.new_tokens)
    if spec.activation is not None and spec.activation not in build.ACTIVATIONS:  # as run's grid checks it
        raise SpecError(f"unknown activation '{spec.activation}': choose from {', '.join(build.ACTIVATIONS)}")
    if spec.new_tokens < 1:
        raise SpecError("--new-tokens must be at least 1")
    top = ref.shape.max_positions - (spec.new_tokens if spec.task == "generate" else 0)
    if top < 1:
        raise SpecError(f"--new-tokens {spec.new_tokens} leaves no room for a prompt in {ref.name}'s "
                        f"{ref.shape.max_positions} positions: use --new-tokens {ref.shape.max_positions - 1} or less")
    # Generation: a prompt has what the new tokens leave ("the model's 96 positions" misnamed gpt2-tiny's 128).
    room = (f"the {top} positions a prompt has ({ref.name}'s {ref.shape.max_positions} less --new-tokens "
            f"{spec.new_tokens})" if spec.task == "generate" else None)
    lengths = serve_lengths.parse(spec.lengths, top, ref.path, room)
    return dataclasses.replace(spec, device=device, dtype=dtype, percentile=float(spec.percentile)), lengths


def cell(spec: ServeSpec, lengths, backend: str, mode: str, level: float = 0) -> ServeCell:
    return ServeCell(spec.model, spec.task, backend, spec.dtype, mode, rate=float(level) if mode == "rate" else 0.0,
                     concurrency=int(level) if mode == "concurrency" else 0, lengths=lengths.to_dict(),
                     max_batch_size=spec.max_batch_size, max_wait_ms=spec.max_wait_ms, duration=spec.duration,
                     warmup=spec.warmup, slo_ms=spec.slo_ms, new_tokens=spec.new_tokens, device=spec.device,
                     seed=spec.seed, activation=spec.activation)


def expand(spec: ServeSpec, lengths) -> list[ServeCell]:
    """The grid's cells (backend x load level); --find-max-rate builds its probes as it goes."""
    out = []
    for b in spec.backends:
        out += [cell(spec, lengths, b, "rate", r) for r in spec.rates]
        out += [cell(spec, lengths, b, "concurrency", c) for c in spec.concurrency]
        if spec.offline:
            out.append(cell(spec, lengths, b, "offline"))
    return out


def check_given(spec: ServeSpec, percentile: bool, new_tokens: bool) -> None:
    """--percentile and --new-tokens where given (the CLI knows; check() sees only values off the default), refused
    where nothing uses them: `serve --rate 10 --percentile 99` ran without a word, as 99 is the default."""
    if percentile and float(spec.percentile) not in PERCENTILE_KEYS:  # checked without --find-max-rate too
        raise SpecError(f"--percentile {spec.percentile:g}: choose from 50, 90, 99, 99.9")
    if percentile and not spec.find_max_rate:
        raise SpecError(f"--percentile {spec.percentile:g} is the percentile --find-max-rate holds under --slo-ms, "
                        "and this load does not search: add --find-max-rate, or leave --percentile out "
                        "(every cell stores p50, p90, p99 and p99.9)")
    if new_tokens and spec.task != "generate":
        raise SpecError(f"--new-tokens {spec.new_tokens} applies to --task generate; task {spec.task} generates "
                        "nothing: leave --new-tokens out, or use --task generate with a decoder")
