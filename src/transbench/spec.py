"""Typed run specs: defaults, validation with one-line messages, and YAML/TOML sweep files."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from .errors import SpecError

SCALAR_SEQUENCE_FIELDS = {"models", "tasks", "backends", "dtypes", "batches", "seqs", "gpus"}


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
    name: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunSpec:
        check_keys(cls, data)
        clean = {}
        for k, v in data.items():
            if k in SCALAR_SEQUENCE_FIELDS and v is not None and not isinstance(v, list):
                v = split_list(v, int if k in ("batches", "seqs", "gpus") else str)
            clean[k] = v
        return cls(**clean)


def check_keys(cls, data: dict) -> None:
    """Spec files and stored specs may only hold the dataclass's fields: a typo is an error, not ignored."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SpecError(f"unknown spec key(s) {', '.join(unknown)}: known keys are {', '.join(sorted(known))}")


def split_list(value, kind=str) -> list:
    """'1,8,64' or 8 or [1, 8] -> a list of `kind`; a clear error for anything else."""
    if isinstance(value, list):
        items = value
    else:
        items = [p.strip() for p in str(value).split(",") if p.strip()]
    try:
        return [kind(x) for x in items]
    except ValueError:
        raise SpecError(f"cannot read '{value}' as a list of {kind.__name__}s (use commas: 1,8,64)") from None


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


def parse_shard(shard: str | None) -> tuple[int, int] | None:
    if shard is None:
        return None
    try:
        i, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise SpecError(f"bad --shard '{shard}': write I/N, e.g. 1/4") from None
    if not (n >= 1 and 1 <= i <= n):
        raise SpecError(f"bad --shard '{shard}': need 1 <= I <= N")
    return i, n


def load_file(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"spec file {path} not found")
    text = p.read_text()
    if p.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text) or {}
    elif p.suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib
        data = tomllib.loads(text)
    elif p.suffix == ".json":
        data = json.loads(text)
    else:
        raise SpecError(f"spec file {path}: use .yaml, .yml, .toml or .json")
    if not isinstance(data, dict):
        raise SpecError(f"spec file {path} must hold a mapping of options")
    return data


def dump_file(spec: RunSpec, path: str) -> None:
    data = {k: v for k, v in spec.to_dict().items() if v is not None}
    p = Path(path)
    if p.suffix == ".toml":
        p.write_text(_toml(data))
    else:
        import yaml

        p.write_text(yaml.safe_dump(data, sort_keys=False))


def _toml(data: dict) -> str:
    """Flat TOML writer: specs are flat mappings of scalars and lists of scalars."""
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in data.items())
