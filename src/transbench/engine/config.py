"""Typed configuration of the engine and the one exception it raises for models it cannot run."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .tuning import TUNE_BUDGET_S


class EngineUnsupported(RuntimeError):
    """The engine cannot run this model/option; `reason` says why (backends/fused.py reports it as
    `unsupported`: the engine depends on nothing of the benchmark, so it cannot raise the benchmark's own)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# HF activation names -> our two fused GELU variants; anything else is refused rather than approximated.
GELU_KINDS = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}


@dataclass(frozen=True)
class EngineOptions:
    dtype: torch.dtype = torch.float16
    device: torch.device = torch.device("cpu")
    max_batch: int = 256
    max_seq: int = 512
    cuda_graphs: bool = True
    fp8: bool = False
    # LRU bound on captured graphs (each keeps its output, B x S x hidden, alive in the shared pool); None: one
    # (max_batch, max_seq) shape's every packed token count (EngineBase.graph_bound), so that a server which
    # captured all of them before its load (scenarios/serve/measure.py Encoders.warm) never evicts and recaptures one.
    max_graphs: int | None = None
    tune_budget_s: float | None = TUNE_BUDGET_S  # tuning seconds a new shape's first call may take (None: no limit)
    # A server's bound on its graphs: packed sizes round up to a geometric ladder (attention.token_ladder), each
    # size at most this factor above the one below; None: every multiple of the packing bucket (128 on CUDA).
    token_growth: float | None = None

    def __post_init__(self):
        # compile_model's arguments reach here unchecked; a wrong type would fail at the first call (max_batch="8")
        # or be taken silently (max_batch=2.5, fp8="yes", a negative or NaN budget).
        for name in ("max_batch", "max_seq"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, got {v!r}")
        for name in ("cuda_graphs", "fp8"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.max_graphs is not None and (isinstance(self.max_graphs, bool) or not isinstance(self.max_graphs, int)
                                            or self.max_graphs < 1):
            raise ValueError(f"max_graphs must be None or a whole number of at least 1, got {self.max_graphs!r}")
        g = self.token_growth
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not 1 < g <= 4):
            raise ValueError(f"token_growth must be None or a factor above 1 and at most 4, got {g!r}")
        b = self.tune_budget_s
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b < float("inf")):
            raise ValueError(f"tune_budget_s must be None or a finite number of seconds >= 0, got {b!r}")


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
