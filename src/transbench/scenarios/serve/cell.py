"""One serve cell: a backend under one load (an arrival rate, a trace, a closed-loop concurrency, or offline)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ...cells import SweepCell
from .lengths import Lengths


def prompt_room(max_positions: int, task: str, new_tokens: int, endpoint: bool) -> int:
    """The longest prompt a cell of `task` may send to a model of `max_positions`. A generation in this process feeds
    the prompt and each new token but the last, which is read and never fed back (cells.Cell.positions: S + N - 1,
    as `run` counts it); an endpoint's context holds the prompt and every token it returns (an OpenAI-compatible
    server refuses a prompt plus max_tokens above its length)."""
    if task != "generate":
        return max_positions
    return max_positions - new_tokens + (0 if endpoint else 1)


@dataclass(frozen=True)
class ServeCell(SweepCell):
    model: str
    task: str  # an encoder task, or generate (decoders: generation under load)
    backend: str
    dtype: str
    mode: str  # rate | concurrency | offline
    rate: float = 0.0  # requests per second (mode rate)
    concurrency: int = 0  # clients (mode concurrency)
    lengths: dict = field(default_factory=dict)  # Lengths.to_dict()
    max_batch_size: int = 32
    max_wait_ms: float = 2.0
    duration: float = 10.0
    warmup: float = 2.0
    slo_ms: float | None = None
    new_tokens: int = 32
    device: str = "cpu"
    seed: int = 0
    activation: str | None = None
    embeddings: bool = True  # backends read it (fused, onnxruntime); serving always embeds
    arrivals: str = "poisson"  # mode rate: arrivals.Arrivals' label (poisson | gamma:B | constant)
    trace: dict = field(default_factory=dict)  # mode trace: {path, source (name@digest), speed}
    slo: dict = field(default_factory=dict)  # objectives beside slo_ms (e2e): {ttft, tpot: ms}
    percentiles: tuple = (50.0, 90.0, 99.0)  # stored with LoadGen's early-stopping estimates
    tail_share: float = 0.99  # the verdict's percentile (--percentile / 100, or --goodput-target)
    need: int = 20  # a rate's window stretches to this many expected arrivals (the verdict's minimum)
    window_limit: float | None = None  # ... but never past this many seconds (what --timeout leaves)
    prepare_budget: float = 20.0  # seconds of preparation before the load; the rest is prepared under it
    # An HTTP endpoint (serve --url): requests go there instead of to a backend in this process.
    url: str | None = None
    api: str | None = None  # openai-completions | openai-chat | openai-embeddings
    served_model: str | None = None  # the requests' `model` field
    tokenizer: str | None = None  # a local folder: prompts and token counts
    reference_model: str | None = None  # a local folder: the fp32 reference of the correctness check
    request_timeout: float = 60.0

    @property
    def scenario(self) -> str:
        return "serve"

    @property
    def batch(self) -> int:  # the sweep orders and groups cells by it
        return self.max_batch_size

    @property
    def length_dist(self) -> Lengths:
        return Lengths.from_dict(self.lengths)

    def identity(self) -> dict:
        """What changes what is measured: the load (its kind and level), the lengths, the batcher, the SLO
        (goodput depends on it). Duration and warm-up only change how long it is measured."""
        ident = {"scenario": "serve", "model": self.model, "task": self.task, "backend": self.backend,
                 "dtype": self.dtype, "mode": self.mode, "lengths": self.length_dist.label,
                 "max_batch_size": self.max_batch_size, "max_wait_ms": self.max_wait_ms, "slo_ms": self.slo_ms,
                 "seed": self.seed, "activation": self.activation}
        if self.mode == "rate":
            ident["rate"] = round(self.rate, 6)
            if self.arrivals != "poisson":  # poisson's cells keep the keys they had before arrivals had kinds
                ident["arrivals"] = self.arrivals
        elif self.mode == "trace":  # the file's digest: a resume refuses a changed trace (measure.py checks it)
            ident.update(trace=self.trace["source"], trace_speed=self.trace["speed"])
        elif self.mode == "concurrency":
            ident["concurrency"] = self.concurrency
        if self.task == "generate":
            ident["new_tokens"] = self.new_tokens
        # Settings added later appear only off their defaults, so stored cells keep their keys.
        if self.slo:  # as text (METRIC:MS, sorted): a record's value, a report's grouping key, a CSV cell
            ident["slo"] = ",".join(f"{k}:{v:g}" for k, v in sorted(self.slo.items()))
        if (self.slo or self.slo_ms is not None) and self.tail_share != 0.99:
            ident["tail_percentile"] = round(self.tail_share * 100, 6)
        if self.prepare_budget != 20.0:
            ident["prepare_budget"] = self.prepare_budget
        if self.url is not None:  # the endpoint is what is measured; the in-process batcher is not
            ident.update(url=self.url, api=self.api, served_model=self.served_model, reference=self.reference_model)
            for k in ("max_batch_size", "max_wait_ms", "activation"):
                ident.pop(k)
        return ident


    @classmethod
    def from_dict(cls, d: dict):
        d = dict(d)
        if "percentiles" in d:  # JSON turns the tuple into a list (a frozen cell must hash)
            d["percentiles"] = tuple(d["percentiles"])
        return cls(**d)

    def objectives(self) -> dict[str, float]:
        """Every objective a request must meet (ms): --slo's, and --slo-ms as the end-to-end one."""
        return {**self.slo, **({"e2e": self.slo_ms} if self.slo_ms is not None else {})}

    def oom_group(self) -> str:
        return self.key()

    def record_fields(self) -> dict:
        ident = self.identity()
        ident.update(device=self.device, batch_size=None if self.url else self.max_batch_size)  # an endpoint's own
        return ident

    def model_key(self) -> tuple:
        return (self.model, self.task, self.activation)


