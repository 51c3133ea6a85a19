"""The inference grid's spec: every setting of `transbench run`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ...spec import coerce


@dataclass
class RunSpec:
    """Everything that defines an inference sweep. Lists are sweep axes; None means 'sized for the device'."""

    models: list[str] = field(default_factory=lambda: ["bert-base-uncased"])
    tasks: list[str] = field(default_factory=lambda: ["base"])
    backends: list[str] = field(default_factory=lambda: ["eager", "sdpa"])
    dtypes: list[str] | None = None
    batches: list[int] | None = None
    seqs: list[int] | None = None
    seq_stdev: float = 0.0
    device: str = "auto"
    activation: str | None = None
    embeddings: bool = True
    min_time: float | None = None
    min_count: int | None = None
    warmup: int | None = None
    timeout: float = 900.0
    baseline: str | None = None
    new_tokens: int = 128
    compile_mode: str = "default"
    max_batch: bool = False
    max_batch_limit: int = 65536
    shard: str | None = None
    gpus: list[int] | None = None
    nproc: int = 1
    seed: int = 0
    threads: int | None = field(default=None, metadata={
        "help": "CPU threads of every worker (torch, OpenMP, MKL), set before any work; recorded per cell "
                "(default: the cores this process may use)", "cli": "--threads"})
    repeat: int = field(default=1, metadata={
        "help": "measure each cell N times, each in a fresh process, one after another; tables and compare use "
                "the spread of the N medians", "cli": "--repeat"})
    name: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunSpec:
        return cls(**coerce(cls, data))



def device_defaults(spec: RunSpec, device_type: str) -> RunSpec:
    """Fill the 'sized for the device' values. On a 2-core CPU the default sweep ends within two minutes."""
    gpu = device_type == "cuda"
    out = dataclasses.replace(spec)
    if out.dtypes is None:
        out.dtypes = ["fp16"] if gpu else ["fp32"]
    if out.batches is None:
        out.batches = [1, 8, 64, 256] if gpu else [1, 2]
    if out.seqs is None:
        out.seqs = [128, 384] if gpu else [128]
    if out.min_time is None:
        out.min_time = 1.0 if gpu else 0.5
    if out.min_count is None:
        out.min_count = 20 if gpu else 5
    if out.warmup is None:
        out.warmup = 5 if gpu else 2
    return out
