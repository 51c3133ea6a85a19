"""The training step of one cell, on one rank: model, data, precision, optimizer, strategy, timing.

Runs in its own process (one per cell, or one per rank under torchrun), so the memory breakdown starts
from an empty allocator. Each rank trains on its own fixed synthetic micro-batches kept on the device:
the timed step is model and optimizer only, never data loading."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import time

from ...errors import Unsupported
from ...measure import device as dev
from ...measure import memory, timer
from ...measure.record import timing_record
from ...models import build, flops
from ...cells import CellResult
from ...runner.rank import RankInfo
from ..inputs import point_seed
from .cell import ATTENTION, TrainCell

MLM_PROBABILITY = 0.15
BERT_MASK_ID = 103  # [MASK] in the bert-base/large vocabulary


def mlm_predictions(seq: int) -> int:
    """Masked positions per sequence: 15% of it (BERT's masked_lm_prob), at least one. A fixed count per
    row, as BERT's pretraining data has (max_predictions_per_seq), so `--head masked` has a fixed shape and
    the FLOP count knows how many positions the head needs."""
    return max(1, round(MLM_PROBABILITY * seq))


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite: the step's numbers mean nothing."""


def _half(precision: str):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


NO_NEXT_TOKEN = "task causal-lm at seq 1 has no next token to predict (its loss has no target)"


def check_supported(cell: TrainCell, device_type: str) -> None:
    """Raise Unsupported naming what to install or where it runs, before anything is built."""
    cuda = device_type == "cuda"
    too_long = build.too_long(build.resolve(cell.model), cell.seq)  # the grid's cells that fit run (spec.py validate)
    if too_long:
        raise Unsupported(too_long)
    if cell.task == "causal-lm" and cell.seq < 2:
        # transformers' causal LM loss shifts the labels by one: one token leaves no target, the loss is NaN, and the
        # cell was an `error` saying the run diverged (spec.py validate refuses a --seq 1 of only such cells)
        raise Unsupported(NO_NEXT_TOKEN)
    if cell.dtype in ("fp16", "tf32") and not cuda:
        raise Unsupported(f"--dtype {cell.dtype} trains on CUDA only: use fp32 or bf16 on the CPU")
    if cell.backend == "flash-attn2":
        if _missing("flash_attn"):
            raise Unsupported("attention flash-attn2 needs flash_attn: pip install 'transbench[flash]'")
        if not cuda or cell.dtype not in ("fp16", "bf16"):
            raise Unsupported("attention flash-attn2 runs on CUDA in fp16 or bf16 only")
    if cell.backend == "sdpa-cudnn" and not cuda:
        raise Unsupported("attention sdpa-cudnn runs on CUDA only")
    # transformers refuses to build a class with an attention it lacks (DeBERTa-v2 and sdpa, the default): a ValueError
    # in the cell, `error`, where inference's cells read `unsupported`
    missing = build.missing_attention(build.resolve(cell.model).family, cell.task, ATTENTION[cell.backend][0])
    if missing:
        raise Unsupported(f"{missing}: train it with --backend eager")
    if cell.optim == "ds-fused-adam" or cell.strategy == "deepspeed":
        what = "optimizer ds-fused-adam" if cell.optim == "ds-fused-adam" else "strategy deepspeed"
        if _missing("deepspeed"):
            raise Unsupported(f"{what} needs DeepSpeed: pip install 'transbench[deepspeed]'")
        if not cuda:
            raise Unsupported(f"{what} runs on CUDA only")
    if cell.kernels == "liger":
        if _missing("liger_kernel"):
            raise Unsupported("kernels liger needs Liger-Kernel: pip install 'transbench[liger]'")
        if not cuda:
            raise Unsupported("kernels liger runs on CUDA only (Triton GPU kernels): use --kernels torch on the CPU")
    if cell.head == "masked":
        from .head import HEADS

        family = build.resolve(cell.model).family
        if cell.task != "mlm" or family not in HEADS:
            raise Unsupported(f"head masked is the MLM head of {', '.join(HEADS)} on its masked positions: "
                              f"{cell.model} {cell.task} has none (use --head all)")
    if cell.optim == "apex-fused-adam":
        if _missing("apex"):
            raise Unsupported("optimizer apex-fused-adam needs NVIDIA apex, built from source: "
                              "https://github.com/NVIDIA/apex")
        if not cuda:
            raise Unsupported("optimizer apex-fused-adam runs on CUDA only")


def make_batches(cell: TrainCell, shape, rank: int, device) -> list[dict]:
    """One fixed random micro-batch per accumulation step, different on every rank: token ids drawn
    from [1, vocab - 1) (never the GPT-2 pad/eos id; both ids of a 2-id vocabulary), with the task's labels.
    DataParallel's one process feeds all its GPUs: `batch` rows per GPU, split by DataParallel's scatter."""
    import torch

    rows = cell.batch * (cell.nproc if cell.strategy == "dp" else 1)
    out = []
    for micro in range(cell.grad_accum):
        g = torch.Generator().manual_seed(point_seed("train", cell.model, cell.batch, cell.seq, cell.seed, rank, micro))
        # A 2-id vocabulary (build refuses only 1) leaves [1, vocab - 1) empty: every cell was an `error`
        # ("random_ expects 'from' to be less than 'to'"); it draws both ids.
        low, high = (1, shape.vocab - 1) if shape.vocab > 2 else (0, shape.vocab)
        ids = torch.randint(low, high, (rows, cell.seq), generator=g)
        if cell.task == "mlm":
            where = torch.rand(ids.shape, generator=g).argsort(dim=1)[:, :mlm_predictions(cell.seq)]
            chosen = torch.zeros(ids.shape, dtype=torch.bool).scatter_(1, where, True)
            labels = ids.masked_fill(~chosen, -100)
            ids = ids.masked_fill(chosen, min(BERT_MASK_ID, shape.vocab - 1))
        elif cell.task == "causal-lm":
            labels = ids.clone()  # transformers shifts them inside the model
        else:
            labels = build.train_labels(shape, rows, g)  # a checkpoint's regression head takes floats
        batch = {"input_ids": ids.to(device), "labels": labels.to(device)}
        if shape.decoder:
            batch["use_cache"] = False
        out.append(batch)
    return out


def make_optimizer(name: str, params, lr: float):
    import torch

    params = list(params)
    if name == "adamw":  # the single-tensor loop: one small kernel per parameter and operation
        return torch.optim.AdamW(params, lr=lr, foreach=False, fused=False)
    if name == "adamw-foreach":
        return torch.optim.AdamW(params, lr=lr, foreach=True)
    if name == "adamw-fused":
        return torch.optim.AdamW(params, lr=lr, fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "ds-fused-adam":
        plain_arch_list(os.environ)
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam(params, lr=lr, adam_w_mode=True)
    if name == "apex-fused-adam":
        from apex.optimizers import FusedAdam

        return FusedAdam(params, lr=lr, adam_w_mode=True)
    raise Unsupported(f"unknown optimizer {name}")


def plain_arch_list(environ) -> None:
    """TORCH_CUDA_ARCH_LIST without architecture-specific suffixes (9.0a -> 9.0), for DeepSpeed's build of its ops.
    DeepSpeed (0.19.8, op_builder/builder.py) compiles FusedAdam at first use for the archs that variable names and
    reads each one's parts as integers: the GPU image's 9.0a failed every ds-fused-adam cell with "invalid literal
    for int() with base 10: '0a'" (benchmarks/gpu.sh sets 9.0 for the same reason). The suffix enables instructions
    of one architecture that FusedAdam does not use; the cell records the list built for (optimizer_info)."""
    value = environ.get("TORCH_CUDA_ARCH_LIST")
    if value:
        environ["TORCH_CUDA_ARCH_LIST"] = re.sub(r"(\d+\.\d+)[a-z]+", r"\1", value)


def optimizer_info(opt) -> dict:
    d = getattr(opt, "defaults", {})
    info = {"optimizer": f"{type(opt).__module__}.{type(opt).__name__}",
            "optimizer_fused": d.get("fused"), "optimizer_foreach": d.get("foreach")}
    if type(opt).__module__.startswith("deepspeed"):  # its ops were built for these archs (plain_arch_list)
        info["torch_cuda_arch_list"] = os.environ.get("TORCH_CUDA_ARCH_LIST")
    return info


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t  # FSDP2 DTensor: this rank's shard


def _tensors_mb(tensors) -> float:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None) / 2**20


def _layer_list(model, layers: int):
    """The transformer blocks (bert.encoder.layer, transformer.h): the ModuleList with one entry per layer."""
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) == layers:
            return m
    raise RuntimeError("no list of transformer layers found to shard")


def _checkpointing_on(model) -> None:
    """Activation checkpointing (non-reentrant); transformers 5.2x renamed the gradient_checkpointing_* API."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _pad_vocab(model, multiple: int) -> int:
    """Pad the vocabulary rows (input embeddings, the tied or untied LM head and its bias) to a multiple of
    `multiple`; returns the rows trained. The token ids and labels stay below the real vocabulary, so the extra
    rows only join the softmax's normalization, as nanoGPT's 50,304-row GPT-2 does. Why: an odd row count
    (GPT-2's 50,257) leaves every GEMM of the head with unaligned strides, and cuBLAS then runs an
    alignment-1 kernel (H100 profile, gpt2 b48 s1024: 25.7 ms of a 153 ms step,
    benchmarks/results/fp8_engine_h100_2026-11.md)."""
    rows = model.get_input_embeddings().weight.shape[0]
    if multiple > 1 and rows % multiple:
        model.resize_token_embeddings(rows, pad_to_multiple_of=multiple, mean_resizing=False)
    return model.get_input_embeddings().weight.shape[0]


# transformers' SDPA attention without a mask, for training cells (their batches are never padded). Under torch.compile
# transformers cannot check the mask's contents, so it builds the (batch, 1, seq, seq) all-true mask that eager mode
# skips, and SDPA with a mask has no flash or cuDNN kernel: on an H100 (benchmarks/studies/sdpa_choice.py,
# benchmarks/results/fp8_gemm_h100_2026-11.md) compiled bert-large ran SDPA's math path, eager cuDNN's attention. A name
# transformers has no mask function for gets no mask, and its attention then runs plain SDPA (is_causal for decoders).
UNMASKED_SDPA = "sdpa_unmasked"
# Families whose every layer attends over the whole sequence (or its causal prefix): dropping an all-true mask is
# exact there, where a local or sliding window (ModernBERT's, Qwen2's) is part of the mask.
FULL_ATTENTION_FAMILIES = ("bert", "roberta", "gpt2")


def _unmasked_sdpa(model) -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register(UNMASKED_SDPA, sdpa_attention_forward)
    model.config._attn_implementation = UNMASKED_SDPA


def _checkpointing(model) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def autocast_module(model, device_type: str, dtype):
    """`model` run under autocast from inside its forward. DataParallel runs each replica in a thread of its own and
    autocast's dtype is thread-local: its threads' autocast (torch's parallel_apply) takes the default dtype, fp16,
    so a bf16 cell trained in fp16 without a scaler. Entered inside forward, each thread gets the cell's dtype."""
    import torch

    class Autocast(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            with torch.autocast(device_type, dtype=dtype):
                return self.inner(*args, **kwargs)

    return Autocast(model)


class Trainer:
    """Everything one training step needs, built in the order that lets memory be measured apart."""

    def __init__(self, cell: TrainCell, rank: RankInfo, device):
        import torch

        self.cell, self.rank, self.device = cell, rank, device
        self.cuda = device.type == "cuda"
        # the GPUs this process trains on: its own, or DataParallel's `nproc` from its own on
        self.devices = ([torch.device("cuda", (device.index or 0) + k) for k in range(cell.nproc)]
                        if cell.strategy == "dp" else [device])
        self.comm = None  # GradSyncTimer of a ddp cell over several GPUs
        self.info: dict = {}
        self.mem: dict = {}
        ref = build.resolve(cell.model)
        self.shape = ref.shape
        attn_impl, self.kernel = ATTENTION[cell.backend]
        dev.set_matmul_precision(cell.dtype)

        before = self._allocated()
        model = build.build_model(ref, cell.task, attn=attn_impl, activation=cell.activation,
                                  dropout=cell.dropout, device=str(device),
                                  seed=cell.seed)
        self.info["vocab_rows"] = _pad_vocab(model, cell.pad_vocab)
        if cell.compile and attn_impl == "sdpa" and ref.family in FULL_ATTENTION_FAMILIES:
            _unmasked_sdpa(model)
        model.train().requires_grad_(True)
        n_params = sum(p.numel() for p in model.parameters())
        if cell.grad_ckpt:
            _checkpointing_on(model)
        self.hf_model = model
        self.info["kernels_replaced"] = []
        predict = mlm_predictions(cell.seq) if cell.head == "masked" else None
        if cell.kernels == "liger":  # before any wrapper: DDP, FSDP and DeepSpeed wrap what trains
            from . import kernels as training_kernels

            model, self.info["kernels_replaced"] = training_kernels.apply(model, cell.task, ref.family, predict)
        if predict and model is self.hf_model:  # no fused Liger head took the masked positions (RoBERTa)
            from .head import MaskedHead

            model = MaskedHead(model, ref.family, predict)
        self.info["head_positions"] = predict or cell.seq
        half = _half(cell.dtype)
        # DeepSpeed casts itself; DataParallel's replicas enter autocast inside their forward (Autocast)
        self.autocast_dtype = None if cell.strategy in ("deepspeed", "dp") else half
        self.scaler = None
        self.engine = None
        if cell.strategy == "deepspeed":
            self.model = self._deepspeed(model)
            self.optimizer = self.engine.optimizer
        else:
            self.model = self._wrap(model, half)
            self.optimizer = make_optimizer(cell.optim, self.model.parameters(), cell.lr)
            if cell.dtype == "fp16":
                self.scaler = torch.amp.GradScaler(device.type)
        self.forward = self.model
        if cell.compile:
            if self.engine is not None:
                if not hasattr(self.engine, "compile"):
                    raise Unsupported("--compile with deepspeed needs DeepSpeed >= 0.14 (engine.compile)")
                self.engine.compile()
            else:
                self.forward = torch.compile(self.model)
        # Parameters, gradients and optimizer state are counted from their tensors (this rank's shards):
        # allocator deltas would also catch lazily allocated workspaces (cuBLAS keeps 32 MiB per handle).
        # DeepSpeed keeps its own flat buffers, so it is measured by allocator deltas instead.
        self.by_allocator = self.engine is not None
        if self.by_allocator:
            self.mem["params_mb"] = (self._allocated() - before) / 2**20
        else:
            self.mem["params_mb"] = _tensors_mb(self.model.parameters())
        self.batches = make_batches(cell, self.shape, rank.rank, device)
        self._base = self._allocated()
        self.info.update({
            "attn_implementation": self.hf_model.config._attn_implementation,
            "sdpa_kernel": self.kernel.lower() if self.kernel else None,
            "param_dtype": str(_local(next(model.parameters())).dtype),  # after wrapping: DeepSpeed casts to half
            "autocast_dtype": str(self.autocast_dtype) if self.autocast_dtype else None,
            "grad_scaler": self.scaler is not None,
            "gradient_checkpointing": _checkpointing(self.hf_model),
            "compiled": cell.compile,
            "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "model_class": type(self.hf_model).__name__,
            "activation": getattr(self.hf_model.config, build.activation_field(self.hf_model.config) or "", None),
            # what the model was built with, each field as its family names it (--dropout sets them all)
            "dropout": {k: getattr(self.hf_model.config, k) for k in build.dropout_fields(self.hf_model.config)},
            "parameters": n_params,
            **optimizer_info(self.optimizer),
        })
        if cell.grad_ckpt and not self.info["gradient_checkpointing"]:
            raise RuntimeError("gradient checkpointing was asked for but the model did not turn it on")

    def _allocated(self) -> int:
        import torch

        return torch.cuda.memory_allocated(self.device) if self.cuda else 0

    def _wrap(self, model, half):
        import torch

        if self.cell.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            self.info["strategy_detail"] = "DistributedDataParallel, fp32 gradients all-reduced in buckets (gradient_as_bucket_view)"
            # Gradients as views into the all-reduce buckets: no second copy of them.
            ddp = DistributedDataParallel(model, device_ids=[self.device.index] if self.cuda else None,
                                          gradient_as_bucket_view=True)
            if self.rank.world_size > 1 and self.cell.comm_timing:
                from .comm import METHOD, GradSyncTimer

                self.comm = GradSyncTimer(self.cuda)
                ddp.register_comm_hook(None, self.comm.hook)
                self.info["comm_method"] = METHOD
            return ddp
        if self.cell.strategy == "dp":
            from torch.nn import DataParallel

            inner = autocast_module(model, self.device.type, half) if half else model
            ids = [d.index for d in self.devices]
            self.info["strategy_detail"] = (f"torch.nn.DataParallel over cuda:{ids[0]}..{ids[-1]} in one process: "
                                            "replicas broadcast and outputs gathered on the first GPU every step, "
                                            "gradients reduced onto it, one optimizer there")
            self.info["dp_devices"] = [str(d) for d in self.devices]
            return DataParallel(inner, device_ids=ids, output_device=ids[0])
        if self.cell.strategy == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mesh = init_device_mesh(self.device.type, (self.rank.world_size,))
            policy = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32) if half else MixedPrecisionPolicy()
            for layer in _layer_list(model, self.shape.layers):
                fully_shard(layer, mesh=mesh, mp_policy=policy)
            fully_shard(model, mesh=mesh, mp_policy=policy)
            self.info["strategy_detail"] = (f"FSDP2 fully_shard per layer then root, params {half or 'fp32'} "
                                            "in compute, fp32 sharded master and gradient reduction")
            return model
        return model

    def _deepspeed(self, model):
        import deepspeed

        c = self.cell
        config = {
            "train_micro_batch_size_per_gpu": c.batch,
            "gradient_accumulation_steps": c.grad_accum,
            "zero_optimization": {"stage": c.zero_stage or 0},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
        }
        if c.dtype == "bf16":
            config["bf16"] = {"enabled": True}
        elif c.dtype == "fp16":
            config["fp16"] = {"enabled": True}
        optimizer = make_optimizer(c.optim, model.parameters(), c.lr)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        self.info["strategy_detail"] = f"DeepSpeed ZeRO stage {c.zero_stage}, its own {c.dtype} handling"
        self.info["deepspeed_config"] = config
        return self.engine

    def _sync(self, last: bool):
        """Gradients are reduced across ranks only on the last micro-batch of a step."""
        if last:
            if self.cell.strategy == "fsdp":
                self.model.set_requires_gradient_sync(True)
            return contextlib.nullcontext()
        if self.cell.strategy == "ddp":
            return self.model.no_sync()
        if self.cell.strategy == "fsdp":
            self.model.set_requires_gradient_sync(False)
        return contextlib.nullcontext()

    def _kernel(self):
        if self.kernel is None:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, self.kernel)])

    def _autocast(self):
        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def step(self, probe: bool = False, mark=lambda phase: None):
        """One optimizer step over `grad_accum` micro-batches; the mean micro-batch loss (a device tensor).
        `mark(phase)` is called as each phase ends (forward, backward, optimizer): the phase clock times
        the stretch since the previous mark."""
        n = len(self.batches)
        total = None
        with self._kernel():
            for i, b in enumerate(self.batches):
                last = i == n - 1
                if self.engine is not None:
                    loss = self.forward(**b)["loss"]
                    mark("forward")
                    self.engine.backward(loss)
                    mark("backward")
                    if last and probe:
                        self._probe("backward")
                    self.engine.step()  # DeepSpeed steps the optimizer at the accumulation boundary only
                    mark("optimizer")
                else:
                    with self._sync(last):
                        with self._autocast():
                            loss = self.forward(**b)["loss"]
                        if loss.dim():  # DataParallel gathers one loss per GPU (equal shares of the batch)
                            loss = loss.mean()
                        mark("forward")
                        scaled = loss / n
                        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
                        mark("backward")
                total = loss.detach().float() if total is None else total + loss.detach().float()
            if self.engine is None:
                if probe:
                    self._probe("backward")
                if self.scaler:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    self.optimizer.step()
            if probe:
                self._probe("optimizer")
            if self.engine is None:
                try:
                    self.optimizer.zero_grad(set_to_none=True)
                except TypeError:  # DeepSpeed's FusedAdam takes no set_to_none
                    self.optimizer.zero_grad()
                mark("optimizer")
        return total / n

    def _probe(self, when: str) -> None:
        if self.by_allocator:
            held = (self._allocated() - self._base) / 2**20
            if when == "backward":
                self.mem["grads_mb"] = held
            else:
                self.mem["optim_state_mb"] = held - self.mem.get("grads_mb", 0.0)
            return
        if when == "backward":
            self.mem["grads_mb"] = _tensors_mb(p.grad for p in self.model.parameters())
        else:
            state = [t for s in self.optimizer.state.values() for t in s.values() if hasattr(t, "numel")]
            self.mem["optim_state_mb"] = _tensors_mb(state)


def _mean_over_ranks(value, rank: RankInfo):
    if rank.world_size > 1:
        import torch.distributed as dist

        dist.all_reduce(value)
        value = value / rank.world_size
    return float(value)


def _check_finite(loss: float, step: int, cell: TrainCell) -> None:
    if not math.isfinite(loss):
        raise NonFiniteLoss(f"loss is {loss} at step {step} ({cell.dtype}, lr {cell.lr:g}, {cell.optim}): "
                            "the run diverged, no speed is reported")


def _gather(obj, rank: RankInfo) -> list:
    if rank.world_size == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * rank.world_size
    dist.all_gather_object(out, obj)
    return out


def _barrier(rank: RankInfo) -> None:
    if rank.world_size > 1:
        import torch.distributed as dist

        dist.barrier()


class PhaseClock:
    """Times one step and its phases: CUDA events at each mark, read once the step's last event has
    completed (so the marks add no synchronization inside the step), perf_counter on the CPU. The phases
    are contiguous stretches between marks, so they sum to the step."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def start(self) -> None:
        self.marks = [("start", timer.mark(self.cuda))]

    def mark(self, phase: str) -> None:
        self.marks.append((phase, timer.mark(self.cuda)))

    def finish(self) -> tuple[float, dict[str, float]]:
        """(step ms, {"forward_ms": ms, "backward_ms": ms, "optimizer_ms": ms}) summed over micro-batches."""
        if self.cuda:
            self.marks[-1][1].synchronize()

            def between(a, b):
                return a.elapsed_time(b)
        else:
            def between(a, b):
                return (b - a) * 1e3
        parts: dict[str, float] = {}
        for (_, a), (phase, b) in zip(self.marks, self.marks[1:]):
            parts[f"{phase}_ms"] = parts.get(f"{phase}_ms", 0.0) + between(a, b)
        return between(self.marks[0][1], self.marks[-1][1]), parts


def _agree(rank: RankInfo):
    """The sampler's decisions taken by all ranks together, so every rank takes the same steps."""
    if rank.world_size == 1:
        return None
    return lambda go_on: any(_gather(bool(go_on), rank))


def run(cell: TrainCell, rank: RankInfo | None = None, device=None) -> CellResult | None:
    """Train `cell` on this rank (its process group already up); rank 0 returns the cell's result,
    the other ranks None. The steps go through the one sampler: `warmup_steps` untimed (at least; on a
    GPU until its clocks have left idle), then exactly `steps` timed ones."""
    rank = rank or RankInfo()
    device = device if device is not None else rank.device(cell.device)
    check_supported(cell, device.type)
    t0 = time.perf_counter()
    trainer = Trainer(cell, rank, device)
    build_s = time.perf_counter() - t0
    clock = PhaseClock(device)
    losses: list[float] = []
    steps_ms: list[float] = []

    comm: list[tuple[float, float, int]] = []

    def step():
        _barrier(rank)
        if len(steps_ms) == 1:  # the first step allocated gradients and optimizer state: the peak of the
            for d in trainer.devices:  # steps after it is the steady one
                memory.reset_peak(d)
        clock.start()
        loss = trainer.step(probe=not steps_ms, mark=clock.mark)  # the first step measures the memory split
        ms, parts = clock.finish()
        steps_ms.append(ms)
        if trainer.comm is not None:
            comm.append(trainer.comm.take())
        losses.append(_mean_over_ranks(loss, rank))
        _check_finite(losses[-1], len(losses) - 1, cell)
        return ms, parts

    cfg = timer.TimerConfig(warmup=cell.warmup_steps, min_time_s=0.0, min_count=cell.steps, max_count=cell.steps,
                            max_time_s=math.inf)  # the cell's timeout bounds it, not the sampler
    sampled = timer.sample_steps(step, device, cfg, sync=_agree(rank))
    timed_comm = [c for c in comm[len(comm) - len(sampled.samples_ms):] if c is not None] if comm else []
    mine = []
    for i, d in enumerate(trainer.devices):  # one entry per GPU: this rank's, or each of DataParallel's
        mem = {**(trainer.mem if i == 0 else {}), **memory.snapshot(d)}
        if mem["peak_mem_mb"] is not None:  # the split needs the whole peak, from an empty process: snapshot
            mem["peak_mem_mb"] += mem.pop("held_at_reset_mb")  # counts above the reset (parameters, state)
        mine.append({"samples": sampled.samples_ms, "parts": sampled.parts, "mem": mem, "device": str(d),
                     "comm": timed_comm if i == 0 else []})
    per_rank = [entry for entries in _gather(mine, rank) for entry in entries]
    if rank.rank != 0:
        return None
    warm_ms = steps_ms[:len(steps_ms) - len(sampled.samples_ms)]
    return _result(cell, trainer, per_rank, sampled, losses, warm_ms, build_s, device, rank)


FLOPS_COUNTED = ("mfu: 3 x the forward the model needs (no checkpointing recompute; an MLM head on its masked "
                 "positions only); hfu: what ran (recompute, the head on every position unless --head masked)")


def step_flops(cell: TrainCell, shape) -> tuple[int, int]:
    """(FLOPs the step needs: MFU's, FLOPs it executes: HFU's), over the cell's global batch."""
    predict = mlm_predictions(cell.seq) if cell.task == "mlm" else None
    needed = flops.training_flops(shape, cell.seq, cell.task, head_tokens=predict)
    ran = flops.training_flops(shape, cell.seq, cell.task, head_tokens=predict if cell.head == "masked" else None,
                               recompute=cell.grad_ckpt)
    return needed * cell.global_batch, ran * cell.global_batch


def _comm_figures(per_rank: list[dict], step_ms: float, world: int) -> dict:
    """The gradient all-reduce of a timed ddp cell: its median time per step over the slowest rank, its share of the
    median step, the part no backward hid, the bytes reduced and the bus bandwidth they ran at (nccl-tests'
    definition: bytes x 2(n-1)/n over the time)."""
    timed = [r["comm"] for r in per_rank if r.get("comm")]
    if not timed:
        return {}
    steps = min(len(t) for t in timed)
    ms = [max(t[i][0] for t in timed) for i in range(steps)]
    exposed = [max(t[i][1] for t in timed) for i in range(steps)]
    nbytes = timed[0][0][2]
    allreduce = timer.summarize(ms).median_ms
    return {"allreduce_ms": allreduce, "comm_share": allreduce / step_ms if step_ms else None,
            "allreduce_exposed_ms": timer.summarize(exposed).median_ms, "allreduce_mb": nbytes / 2**20,
            "allreduce_busbw_gbs": nbytes * 2 * (world - 1) / world / (allreduce / 1e3) / 1e9 if allreduce else None}


def _result(cell: TrainCell, trainer: Trainer, per_rank: list[dict], sampled: timer.Sampled, losses: list[float],
            warm_ms: list[float], build_s: float, device, rank: RankInfo) -> CellResult:
    # A step is as slow as its slowest rank: the step time is the max over ranks, step by step.
    step_ms = [max(r["samples"][i] for r in per_rank) for i in range(len(sampled.samples_ms))]
    steps = timer.Sampled(step_ms, timer.summarize(step_ms), len(step_ms), sampled.context, sampled.parts)
    world = cell.world_size  # GPUs: the ranks, or DataParallel's GPUs in one process
    flops_per_step, hw_flops_per_step = step_flops(cell, trainer.shape)
    gpu = dev.gpu_info(device)
    record, warnings = timing_record(steps, items=cell.global_batch, tokens=cell.global_batch * cell.seq,
                                     flops=flops_per_step, gpu=gpu, dtype=cell.dtype, world=world)
    # HFU: the same over what the GPU executed (checkpointing's recompute, an MLM head on every position);
    # MFU is linear in the FLOPs (measure/peaks.mfu), so it scales by their ratio.
    mfu = record.get("mfu")
    record["hfu"] = None if mfu is None else mfu * hw_flops_per_step / flops_per_step
    record["flops_method"] = "analytic" if trainer.shape.family in flops.ANALYTIC else "counted"  # as inference's
    info_energy = None
    if world > 1 and ("energy_j" in record or record.get("avg_power_w") is not None):
        # NVML reads rank 0's GPU; the ranks do the same work. Power too: a 2-GPU record read 6 J per 10 ms step
        # beside rank 0's 300 W, where data-parallel inference sums the ranks' boards for both (inference_dp.py).
        for k in ("energy_j", "j_per_seq", "j_per_token", "avg_power_w"):
            if record.get(k) is not None:
                record[k] *= world
        info_energy = "rank 0's GPU times the world size"

    def worst(key):
        values = [r["mem"].get(key) for r in per_rank if r["mem"].get(key) is not None]
        return max(values) if values else None

    # Per GPU: the split of the GPU whose peak is highest (every rank's under ddp, fsdp and deepspeed; DataParallel's
    # first GPU, which holds the parameters, gradients, optimizer state and gathered outputs), not sums over GPUs.
    top = max(per_rank, key=lambda r: r["mem"].get("peak_mem_mb") or 0)
    split = ("params_mb", "grads_mb", "optim_state_mb")
    mem = {**{k: top["mem"].get(k, 0.0) for k in split}, **{k: worst(k) for k in ("peak_mem_mb", "peak_reserved_mb")}}
    persistent = sum(mem[k] or 0 for k in split)
    activations = mem["peak_mem_mb"] - persistent if mem["peak_mem_mb"] is not None else None
    # Phases of rank 0 (medians over the timed steps). Communication is not a phase of its own: DDP and
    # FSDP overlap their gradient reduction with the backward and DeepSpeed with its backward and step,
    # so it is inside backward_ms / optimizer_ms rather than separable by events on the host's stream.
    phases = {k: timer.summarize(v).median_ms for k, v in sampled.parts.items() if v}
    record.update({
        "samples_per_s": record["throughput_per_s"], "tflops_per_gpu": record["tflops"] / world,
        "gpu": gpu.name if gpu else None, **phases,
        "loss_start": losses[0], "loss_end": losses[-1], **mem, "activations_mb": activations,
        **_comm_figures(per_rank, steps.stats.median_ms, world),
    })
    info = {
        **trainer.info, "device": str(device), "stats": steps.stats.as_dict(), "flops_per_step": flops_per_step,
        "hw_flops_per_step": hw_flops_per_step, "flops_counted": FLOPS_COUNTED,
        "build_s": build_s, "warmup_step_ms": warm_ms, "losses": losses, "phases_ms": sampled.parts,
        "memory_method": "allocator deltas (torch.cuda.memory_allocated)" if trainer.by_allocator else "tensor sizes",
        "per_rank": [{"device": r["device"], "mem": r["mem"], "median_ms": timer.summarize(r["samples"]).median_ms}
                     for r in per_rank],
        "dist_backend": rank.backend, "nccl_env": rank.nccl_env(),
    }
    if getattr(trainer, "comm", None) is not None:  # a Trainer of a ddp cell over several GPUs
        info["comm_method"] = trainer.info.get("comm_method")
    if info_energy:
        info["energy_method"] = info_energy
    if trainer.scaler is not None:
        info["grad_scale_end"] = float(trainer.scaler.get_scale())
    return CellResult("ok", record=record, samples_ms=step_ms, info=info, warnings=warnings)
