"""One serve cell: a backend under one load (a Poisson rate, a closed-loop concurrency, or offline)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ...cells import SweepCell
from .lengths import Lengths


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
        elif self.mode == "concurrency":
            ident["concurrency"] = self.concurrency
        if self.task == "generate":
            ident["new_tokens"] = self.new_tokens
        if self.url is not None:  # the endpoint is what is measured; the in-process batcher is not
            ident.update(url=self.url, api=self.api, served_model=self.served_model, reference=self.reference_model)
            for k in ("max_batch_size", "max_wait_ms", "activation"):
                ident.pop(k)
        return ident


    def oom_group(self) -> str:
        return self.key()

    def record_fields(self) -> dict:
        ident = self.identity()
        ident.update(device=self.device, batch_size=None if self.url else self.max_batch_size)  # an endpoint's own
        return ident

    def model_key(self) -> tuple:
        return (self.model, self.task, self.activation)


