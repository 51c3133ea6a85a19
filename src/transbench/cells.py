"""One point of a sweep and what measuring it produced."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field


class SweepCell:
    """What the one sweep loop (runner/sweep.py) needs of every scenario's cell, from its `identity()` (every
    setting that changes what is measured): the key resume, merge and compare match on, and the stored form.
    Subclasses are frozen dataclasses with a `batch` field."""

    def identity(self) -> dict:
        raise NotImplementedError

    def key(self) -> str:
        """Identity within a run: resume, merge and compare match cells on it."""
        return json.dumps(self.identity(), sort_keys=True)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        return cls(**d)

    @classmethod
    def field_problem(cls, d: dict) -> str | None:
        """What in a store row's `cell` column breaks the type a field declares, or None. A row edited by hand
        (batch "1") made a cell whose batch compared with numbers as text: a traceback in the resume that skips
        larger batches after an `oom`. A column of another version's fields, which from_dict cannot build, is its
        readers' to skip (runner/sweep.py prior_ooms)."""
        try:
            cell = cls.from_dict(d)  # subclasses read older forms there (TrainCell's renamed fields, ServeCell's tuple)
        except (TypeError, ValueError):
            return None
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            value, want = getattr(cell, f.name), hints[f.name]
            if not _fits(value, want):
                return (f"a {cls.__name__} whose {f.name} is {json.dumps(value, default=str)[:60]}, not "
                        f"{' or '.join(getattr(t, '__name__', str(t)) for t in _members(want))}")
        return None


def _members(hint) -> tuple:
    """The types a field's annotation admits: `int | None` is (int, NoneType)."""
    return typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)


def _fits(value, hint) -> bool:
    for t in _members(hint):
        if t is type(None) and value is None:
            return True
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if t not in (int, float, type(None)) and isinstance(t, type) and isinstance(value, t):
            return True
    return False


@dataclass(frozen=True)
class Cell(SweepCell):
    model: str
    task: str
    backend: str
    dtype: str
    batch: int
    seq: int
    device: str = "cpu"
    seq_stdev: float = 0.0
    activation: str | None = None
    embeddings: bool = True
    new_tokens: int = 128
    compile_mode: str = "default"
    seed: int = 0
    warmup: int = 3
    min_time: float = 1.0
    min_count: int = 10
    nproc: int = 1
    quant: str = "none"  # models/quant.py QUANTS
    # Serving and the demo run the fused engine as a server starts it: a new shape's first call tunes kernel routes
    # within the engine's first-call budget (engine/tuning.py TUNE_BUDGET_S). A `run` cell tunes its shape fully
    # instead (backends/fused.py says why).
    first_call_budget: bool = False

    @property
    def scenario(self) -> str:
        return "generation" if self.task == "generate" else "inference"

    @property
    def positions(self) -> int:
        """Positions the cell feeds the model: the prompt, and in generation each new token but the last, which is
        read from the logits and never fed back. A generation's static cache holds this many."""
        return self.seq + (self.new_tokens - 1 if self.task == "generate" else 0)

    def identity(self) -> dict:
        """Every setting that changes what this cell measures (timing settings such as min_time do not).
        Settings that only apply to some cells appear only there: new_tokens for generation, the compile
        mode for the compile backend, a quant other than none (so the keys of runs stored before --quant, all
        unquantized, still match)."""
        ident = {"scenario": self.scenario, "model": self.model, "task": self.task, "backend": self.backend,
                 "dtype": self.dtype, "batch": self.batch, "seq": self.seq, "seq_stdev": self.seq_stdev,
                 "embeddings": self.embeddings, "activation": self.activation, "seed": self.seed,
                 "nproc": self.nproc}
        if self.task == "generate":
            ident["new_tokens"] = self.new_tokens
        if self.backend == "compile":
            ident["compile_mode"] = self.compile_mode
        if self.quant != "none":
            ident["quant"] = self.quant
        return ident

    def oom_group(self) -> str:
        """Cells that differ only in batch: once one is out of memory, larger batches are skipped."""
        ident = self.identity()
        ident.pop("batch")
        return json.dumps(ident, sort_keys=True)

    def record_fields(self) -> dict:
        """The identity as the contract's flat record keys."""
        ident = self.identity()
        ident.update(device=self.device, batch_size=ident.pop("batch"), seq_len=ident.pop("seq"), quant=self.quant)
        return ident

    def model_key(self) -> tuple:
        """Cells sharing one built model inside a worker."""
        return (self.model, self.task, self.activation)


@dataclass
class CellResult:
    status: str
    record: dict = field(default_factory=dict)  # the contract's record keys that this cell measured
    samples_ms: list[float] = field(default_factory=list)
    info: dict = field(default_factory=dict)  # what ran: kernel, attention, compile time, memory detail, ...
    warnings: list[str] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CellResult:
        return cls(**d)
