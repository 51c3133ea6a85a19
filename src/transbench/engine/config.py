"""Typed configuration of the engine and the one exception it raises for models it cannot run."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .gemm import PREFETCH_MAX_M
from .packing import PACK_MAX_S, PACK_MAX_TOKENS
from .tuning import RACE_BUDGET_S, TUNE_BUDGET_S, Tuner


class EngineUnsupported(RuntimeError):
    """The engine cannot run this model/option; `reason` says why (backends/fused.py reports it as
    `unsupported`: the engine depends on nothing of the benchmark, so it cannot raise the benchmark's own)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# HF activation names -> our two fused GELU variants; anything else is refused rather than approximated.
GELU_KINDS = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}


def _whole(name: str, v, at_least: int = 1, none: bool = False) -> None:
    if none and v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < at_least:
        what = f"{'None or ' if none else ''}a whole number of at least {at_least}"
        raise ValueError(f"{name} must be {what}, got {v!r}")


def _flag(name: str, v) -> None:
    if not isinstance(v, bool):
        raise ValueError(f"{name} must be True or False, got {v!r}")


def _seconds(name: str, v, none: bool = False) -> None:
    if none and v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
        raise ValueError(f"{name} must be {'None or ' if none else ''}a finite number of seconds >= 0, got {v!r}")


@dataclass(frozen=True)
class EngineOptions:
    """How the engine launches and tunes its kernels (compile_model(options=...)). The defaults are the engine as
    shipped; a benchmark changes a field to measure what it buys."""

    pdl: bool = field(default=True, metadata={"help": "programmatic dependent launch on Hopper and newer GPUs: each "
                                                      "Triton kernel starts under the previous one's tail (launch.py)"})
    prefetch_max_m: int = field(default=PREFETCH_MAX_M, metadata={
        "help": "under PDL, our GEMMs of at most this many rows prefetch their weights into L2 before waiting on the "
                "previous kernel (gemm.PREFETCH_MAX_M says what it buys); 0: never"})
    tuner: Tuner | None = field(default=None, metadata={
        "help": "the tuning table's keeper (tuning.Tuner); None: the process's tuner of the default table "
                "(tuning.cache_path(), $TRANSBENCH_CACHE_DIR)"})
    refine: bool = field(default=True, metadata={
        "help": "settle close route choices by racing whole captured forwards (tuning.Tuner.refine); False: "
                "each op's route timed alone"})
    race_budget_s: float = field(default=RACE_BUDGET_S, metadata={
        "help": "wall seconds one shape's whole-forward races may take (tuning.RACE_BUDGET_S)"})
    max_graphs: int | None = field(default=None, metadata={
        "help": "LRU bound on captured graphs (each keeps its output, B x S x hidden, alive in the shared pool); "
                "None: one (max_batch, max_seq) shape's every packed token count (EngineBase.graph_bound), so "
                "a server which captured all of them before its load (scenarios/serve/measure.py Encoders.warm) never "
                "evicts and recaptures one"})
    fp8_min_rows: int | None = field(default=None, metadata={
        "help": "rows from which an fp8 layer's GEMMs are offered fp8 routes; None: ops.FP8_MIN_ROWS on CUDA, 1 in "
                "the CPU emulation (which exists to check fp8 numerics)"})
    pack_max_s: int = field(default=PACK_MAX_S, metadata={
        "help": "longest padded row whose packing runs in Triton on CUDA (packing.PACK_MAX_S); longer: torch ops"})
    pack_max_tokens: int = field(default=PACK_MAX_TOKENS, metadata={
        "help": "largest mask (elements) whose packing runs in Triton on CUDA (packing.PACK_MAX_TOKENS)"})

    def __post_init__(self):
        # Arguments reach here unchecked; a wrong type would fail at the first call or be taken silently.
        for name in ("pdl", "refine"):
            _flag(name, getattr(self, name))
        for name in ("prefetch_max_m", "pack_max_s", "pack_max_tokens"):
            _whole(name, getattr(self, name), at_least=0)
        for name in ("max_graphs", "fp8_min_rows"):
            _whole(name, getattr(self, name), none=True)
        _seconds("race_budget_s", self.race_budget_s)
        if self.tuner is not None and not isinstance(self.tuner, Tuner):
            raise ValueError(f"tuner must be None or a transbench.engine.tuning.Tuner, got {self.tuner!r}")


@dataclass(frozen=True)
class EngineConfig:
    """One compiled model's settings: compile_model's arguments, and its EngineOptions."""

    dtype: torch.dtype = torch.float16
    device: torch.device = torch.device("cpu")
    max_batch: int = 256
    max_seq: int = 512
    cuda_graphs: bool = True
    fp8: bool = False
    tune_budget_s: float | None = TUNE_BUDGET_S  # tuning seconds a new shape's first call may take (None: no limit)
    options: EngineOptions = EngineOptions()
    # A server's bound on its graphs: packed sizes round up to a geometric ladder (packing.token_ladder), each
    # size at most this factor above the one below; None: every multiple of the packing bucket (128 on CUDA).
    token_growth: float | None = None

    def __post_init__(self):
        # compile_model's arguments reach here unchecked; a wrong type would fail at the first call (max_batch="8")
        # or be taken silently (max_batch=2.5, fp8="yes", a negative or NaN budget).
        for name in ("max_batch", "max_seq"):
            _whole(name, getattr(self, name))
        for name in ("cuda_graphs", "fp8"):
            _flag(name, getattr(self, name))
        _seconds("tune_budget_s", self.tune_budget_s, none=True)
        if not isinstance(self.options, EngineOptions):
            raise ValueError(f"options must be an EngineOptions, got {self.options!r}")
        g = self.token_growth
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not 1 < g <= 4):
            raise ValueError(f"token_growth must be None or a factor above 1 and at most 4, got {g!r}")


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    head_dim: int
    layers: int
    ffn: int
    eps: float
    gelu: str  # "exact" | "tanh"
    causal: bool
    max_positions: int

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5
