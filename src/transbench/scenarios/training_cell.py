"""One point of a training sweep: the model, the choices that change speed or memory, and the launch."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

TRAIN_TASKS = ("mlm", "causal-lm", "classification")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
OPTIMIZERS = ("adamw", "adamw-foreach", "adamw-fused", "sgd", "ds-fused-adam", "apex-fused-adam")
STRATEGIES = ("none", "ddp", "fsdp", "deepspeed")
# Attention choices that apply to training: the attention implementation transformers runs, and the
# SDPA kernel forced around forward and backward (None: PyTorch picks).
ATTENTION = {
    "eager": ("eager", None),
    "sdpa": ("sdpa", None),
    "sdpa-math": ("sdpa", "MATH"),
    "sdpa-efficient": ("sdpa", "EFFICIENT_ATTENTION"),
    "sdpa-flash": ("sdpa", "FLASH_ATTENTION"),
    "sdpa-cudnn": ("sdpa", "CUDNN_ATTENTION"),
    "flash-attn2": ("flash_attention_2", None),
}


@dataclass(frozen=True)
class TrainCell:
    model: str
    task: str
    attn: str
    precision: str
    optim: str
    batch: int  # per GPU and per micro-batch
    seq: int
    grad_accum: int = 1
    grad_ckpt: bool = False
    compile: bool = False
    strategy: str = "none"
    nproc: int = 1  # processes per node
    nnodes: int = 1
    zero_stage: int | None = None  # deepspeed only
    nccl: str = ""  # NCCL environment of this cell, "KEY=VAL KEY=VAL" (sorted), empty: the inherited one
    device: str = "cpu"  # the device type ("cuda" or "cpu"); each rank takes its local GPU
    steps: int = 10
    warmup_steps: int = 2
    lr: float = 1e-4
    seed: int = 0

    @property
    def scenario(self) -> str:
        return "training"

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    @property
    def global_batch(self) -> int:
        return self.batch * self.grad_accum * self.world_size

    def nccl_env(self) -> dict[str, str]:
        return dict(kv.split("=", 1) for kv in self.nccl.split())

    def comparable(self) -> list:
        """What must match for two cells to measure the same training step (all but the launch)."""
        return [self.model, self.task, self.attn, self.precision, self.optim, self.batch, self.seq,
                self.grad_accum, self.grad_ckpt, self.compile]

    def key(self) -> str:
        """Identity within a run (resume matches on it)."""
        return json.dumps(["training", *self.comparable(), self.strategy, self.world_size, self.zero_stage,
                           self.nccl])

    def oom_group(self) -> str:
        """Cells that differ only in batch: once one is out of memory, larger batches are skipped."""
        d = self.to_dict()
        d.pop("batch")
        return json.dumps(d, sort_keys=True)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainCell:
        return cls(**d)
