"""One point of a training sweep: the model, the choices that change speed or memory, and the launch."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ...cells import SweepCell
from ...measure.device import DTYPES

TRAIN_TASKS = ("mlm", "causal-lm", "classification")
TRAIN_DTYPES = tuple(d for d in DTYPES if d != "fp8")  # fp8 is the fused inference engine's
OPTIMIZERS = ("adamw", "adamw-foreach", "adamw-fused", "sgd", "ds-fused-adam", "apex-fused-adam")
# dp: the seed's single-process baseline, torch.nn.DataParallel over `nproc` GPUs of this process (no torchrun);
# the others launch one process per GPU through torchrun.
STRATEGIES = ("none", "dp", "ddp", "fsdp", "deepspeed")
ONE_PROCESS = ("none", "dp")
# Where the model's own kernels come from: PyTorch's modules, or Liger-Kernel's fused Triton ones
# (LayerNorm, and the LM/MLM head fused with its cross-entropy so the full logits never exist).
KERNELS = ("torch", "liger")
# Which positions the MLM head (transform + vocabulary decoder) runs on: transformers' BertForMaskedLM
# scores every position and the loss ignores all but the ~15% masked ones; BERT's own pretraining
# (google-research/bert's gather_indexes, NVIDIA's and Megatron's BERT) gathers the masked positions first,
# which skips ~85% of the head's vocabulary-sized product and its fp32 logits.
HEADS = ("all", "masked")
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
class TrainCell(SweepCell):
    model: str
    task: str
    backend: str  # the attention implementation
    dtype: str
    optim: str
    batch: int  # per GPU and per micro-batch
    seq: int
    grad_accum: int = 1
    grad_ckpt: bool = False
    compile: bool = False
    kernels: str = "torch"
    head: str = "all"  # mlm: the head on every position, or on the masked ones only (HEADS)
    activation: str | None = None  # None: the model's own; else a name of models.build.ACTIVATIONS
    dropout: float | None = None  # every dropout probability of the model's config; None: the model's own
    pad_vocab: int = 1  # the vocabulary rows (embeddings, LM head) padded to a multiple of this; 1: as they are
    strategy: str = "none"
    nproc: int = 1  # processes per node
    nnodes: int = 1
    zero_stage: int | None = None  # deepspeed only
    nccl: str = ""  # NCCL environment of this cell, "KEY=VAL KEY=VAL" (sorted), empty: the inherited one
    comm_timing: bool = True  # ddp over several GPUs: time each gradient bucket's all-reduce (comm.GradSyncTimer)
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
    def launched(self) -> bool:
        """One process per GPU through torchrun (ddp, fsdp, deepspeed); none and dp run in one process."""
        return self.strategy not in ONE_PROCESS

    @property
    def global_batch(self) -> int:
        return self.batch * self.grad_accum * self.world_size

    def nccl_env(self) -> dict[str, str]:
        return dict(kv.split("=", 1) for kv in self.nccl.split())

    def comparable(self) -> list:
        """What must match for two cells to measure the same training step (all but the launch). The padded
        vocabulary too: a 2-GPU cell of `--pad-vocab 64` took its scaling baseline from an unpadded run."""
        return [self.model, self.task, self.backend, self.dtype, self.optim, self.batch, self.seq,
                self.grad_accum, self.grad_ckpt, self.compile, self.kernels, self.head, self.activation,
                self.dropout, self.pad_vocab]

    def identity(self) -> dict:
        """Every setting that changes what this cell measures (its speed, memory or losses); the step
        counts are how long it is sampled, not what, as min_time is for inference cells."""
        # "attn" and "precision" are the keys these settings were stored under: kept, so stored cells still match
        ident = {"scenario": "training", "model": self.model, "task": self.task, "attn": self.backend,
                 "precision": self.dtype, "optim": self.optim, "batch": self.batch, "seq": self.seq,
                 "grad_accum": self.grad_accum, "grad_ckpt": self.grad_ckpt, "compile": self.compile,
                 "kernels": self.kernels, "strategy": self.strategy, "nproc": self.nproc, "nnodes": self.nnodes,
                 "zero_stage": self.zero_stage, "nccl": self.nccl, "lr": self.lr, "seed": self.seed}
        if self.head != "all":  # only where it is not the default: cells stored before it keep their keys
            ident["head"] = self.head
        if self.activation is not None:
            ident["activation"] = self.activation
        if self.pad_vocab != 1:
            ident["pad_vocab"] = self.pad_vocab
        if self.dropout is not None:
            ident["dropout"] = self.dropout
        if not self.comm_timing:
            ident["comm_timing"] = False
        return ident

    def record_fields(self) -> dict:
        """The identity as the contract's flat record keys."""
        return {"scenario": "training", "model": self.model, "task": self.task, "backend": self.backend,
                "dtype": self.dtype, "device": self.device, "batch_size": self.batch, "seq_len": self.seq,
                "world_size": self.world_size, "strategy": self.strategy, "optim": self.optim,
                "grad_accum": self.grad_accum, "grad_ckpt": self.grad_ckpt, "compile": self.compile,
                "kernels": self.kernels, "head": self.head, "activation": self.activation, "dropout": self.dropout,
                # None: the vocabulary as it is (as in identity); without it a ladder's padded step and the step
                # before it were two rows of the same settings and different speeds in the report
                "pad_vocab": self.pad_vocab if self.pad_vocab != 1 else None,
                "zero_stage": self.zero_stage, "nccl": self.nccl or None,
                "global_batch": self.global_batch, "lr": self.lr, "seed": self.seed}

    def oom_group(self) -> str:
        """Cells that differ only in batch: once one is out of memory, larger batches are skipped."""
        ident = self.identity()
        ident.pop("batch")
        return json.dumps(ident, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> TrainCell:
        # cells stored before the kernels and head axes ran PyTorch's kernels and the head on every position
        # and before the one name per concept, `attn` and `precision` named the backend and the dtype
        d = {{"attn": "backend", "precision": "dtype"}.get(k, k): v for k, v in d.items()}
        return cls(**{"kernels": "torch", "head": "all", "activation": None, "dropout": None, "comm_timing": True,
                      **d})
