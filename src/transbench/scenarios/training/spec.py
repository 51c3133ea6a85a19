"""Training throughput: the spec, its grid, and running it (one isolated process per cell, torchrun for
several GPUs or hosts), with scaling efficiency against the same step on one GPU.

    from transbench.scenarios.training.spec import TrainSpec, train
    records = train(TrainSpec(models=["bert-tiny"], batches=[8], seqs=[32]), db="bench.db")
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ...errors import SpecError
from ...cells import CellResult
from ...declare import LIMITS, setting
from ...measure.load import check_cpu_ranks, check_threads, threads_setting
from ...runner.worker import WORKER_START_S, start_limit, timeout_setting
from ...spec import MAX_SECONDS, check_once, checked, coerce
from .cell import ATTENTION, HEADS, KERNELS, OPTIMIZERS, TRAIN_DTYPES, STRATEGIES, TRAIN_TASKS, TrainCell

def default_task(shape) -> str:
    """What a model trains on unless --task says otherwise: its pretraining objective."""
    return "causal-lm" if shape.decoder else "mlm"


# How long a node > 0 tries to reach node 0's --rdzv-endpoint before the run is refused (check_rendezvous), unless
# --rdzv-wait says otherwise: the start-up limit a cell's ranks have (runner/worker.py), as node 0 may itself still be
# starting. A setting (--rdzv-wait), as torchrun's own join_timeout is: a scheduler may start one job's hosts minutes
# apart (an image pulled on one node, a queue on another), and a node that gave up after 300 s failed that job.
RDZV_WAIT_S = WORKER_START_S
NCCL_ENV_KEY = re.compile(r"^(NCCL|TORCH_NCCL|GLOO)_[A-Z0-9_]+$")


@dataclass
class TrainSpec:
    """A training sweep. Lists are sweep axes; None means 'sized for the device' (or the model's own task)."""

    models: list[str] = setting(["bert-base-uncased"], "preset or local checkpoint folder", option="--model",
                                short="-m", aliases=("--models",))
    tasks: list[str] | None = setting(None, "mlm|causal-lm|classification; default: the model's LM task",
                                      option="--task")
    dtypes: list[str] | None = setting(None, "fp16 = autocast + GradScaler, bf16 = autocast with fp32 master "
                                       "weights", option="--dtype", choices=TRAIN_DTYPES, shown="bf16 on GPU, fp32 on CPU",
                                       aliases=("--dtypes", "--precision", "--precisions", "precisions"))
    optims: list[str] = setting(["adamw-fused"], "the optimizer", option="--optim", choices=OPTIMIZERS)
    backends: list[str] = setting(["sdpa"], "attention", option="--backend", short="-b", choices=tuple(ATTENTION),
                                  aliases=("--backends", "--attn", "attns"))
    batches: list[int] | None = setting(None, "micro-batch per GPU", option="--batch", aliases=("--batches",),
                                        shown="16 on GPU, 4 on CPU")
    seqs: list[int] | None = setting(None, "sequence length", option="--seq", aliases=("--seqs",),
                                     shown="128 on GPU, 32 on CPU")
    grad_accums: list[int] = setting([1], "micro-batches per optimizer step", option="--grad-accum")
    grad_ckpts: list[bool] = setting([False], "gradient checkpointing: on|off; alone: on", option="--grad-ckpt",
                                     bare="on")
    compiles: list[bool] = setting([False], "torch.compile: on|off; alone: on", option="--compile", bare="on")
    kernels: list[str] = setting(["torch"], "liger = Liger-Kernel's LayerNorm and fused linear + cross-entropy head "
                                 "(CUDA; pip install 'transbench[liger]')", choices=KERNELS)
    heads: list[str] = setting(["all"], "the MLM head on every position (transformers) or on the 15% masked ones "
                               "only (BERT's own pretraining)", option="--head", choices=HEADS)
    activation: str | None = setting(None, "gelu|gelu-tanh: gelu-tanh is GPT-2's gelu_new in one kernel",
                                     shown="the model's own")
    # GPT-2's and BERT's configs train with 0.1; pretraining recipes of today's decoders (nanoGPT's and llm.c's GPT-2)
    # use none: dropout's masks are memory-bound kernels in every layer, forward and backward
    dropout: float | None = setting(None, "set every dropout probability of the model to P (0: none, as nanoGPT "
                                    "and llm.c pretrain GPT-2)", shown="the model's own")
    # the vocabulary rows padded as nanoGPT's 50,304-row GPT-2 (scenarios/training/loop.py)
    pad_vocab: int = setting(1, "pad the vocabulary (embeddings, LM head) to a multiple of N, as nanoGPT's "
                             "50,304-row GPT-2: aligned GEMMs for the head; 1: as it is")
    strategies: list[str] | None = setting(None, "dp = torch.nn.DataParallel over --nproc GPUs in one process (CUDA "
                                           "only)", option="--strategy", choices=STRATEGIES,
                                           shown="none on one GPU, ddp on several")
    nprocs: list[int] = setting([1], "GPUs (processes) per node, through torchrun", option="--nproc")
    zero_stages: list[int] = setting([2], "DeepSpeed ZeRO stage 1|2|3", option="--zero-stage")
    nccl_p2p: list[str] | None = setting(None, "on|off: NCCL_P2P_DISABLE=0|1")
    nccl_envs: list[str] | None = setting(None, "KEY=VAL[ KEY=VAL] for the ranks; repeat the option: each one is a "
                                          "point of the axis", option="--nccl-env", repeat=True, whole=True)
    comm_timing: bool = setting(True, "on|off: ddp over several GPUs: time each gradient bucket's all-reduce with CUDA "
                                "events (allreduce_ms, comm_share); off: DDP's own hook",
                                read=lambda text: parse_bool(text))
    scaling: bool = setting(False, "also run each multi-GPU point on one GPU, for the scaling efficiency",
                            flag="--scaling")
    ladder: bool = setting(False, "an optimization ladder for one model: fp32, bf16, largest batches, fused Adam, "
                           "accumulation, checkpointing, padded vocabulary, compile, liger; a table and a plot",
                           flag="--ladder")
    max_batch_limit: int = setting(4096, "--ladder's largest-batch searches stop at this batch")
    steps: int | None = setting(None, "timed optimizer steps", shown="20 on GPU, 5 on CPU")
    warmup_steps: int | None = setting(None, "untimed optimizer steps first (at least 1)", option="--warmup",
                                       shown="5 on GPU, 2 on CPU", aliases=("--warmup-steps",))
    lr: float = setting(1e-4, "learning rate")
    device: str = setting("auto", "auto|cpu|cuda")
    nnodes: int = setting(1, "hosts (torchrun --nnodes)")
    node_rank: int = setting(0, "this host's rank (torchrun --node-rank); only node 0 stores")
    rdzv_endpoint: str | None = setting(None, "HOST:PORT of node 0 (torchrun --rdzv-endpoint)")
    rdzv_wait: float | None = setting(None, "seconds a node other than node 0 waits for node 0's rendezvous before "
                                      f"giving up (at most {MAX_SECONDS:,}; node 0 waits each cell's start-up limit "
                                      "for the others)",
                                      shown=f"{RDZV_WAIT_S:g}")
    timeout: float = timeout_setting("a cell (all its ranks)")
    threads: int | None = threads_setting()
    shard: str | None = setting(None, "I/N: train slice I of N of the grid; auto: from the Slurm array task or "
                                "Kubernetes Indexed Job pod")
    shard_count: int | None = setting(None, "--shard auto in a Kubernetes Indexed Job: its completions (else "
                                      "TRANSBENCH_SHARD_COUNT)")
    seed: int = setting(0, "seed of the random weights and tokens")
    name: str | None = setting(None, "run name; rerunning a name resumes it")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainSpec:
        # Each nccl_envs entry is one point of the axis and its values may hold commas: never split.
        return cls(**coerce(cls, data))


def parse_bool(value) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("on", "true", "yes", "1"):
        return True
    if word in ("off", "false", "no", "0"):
        return False
    raise SpecError(f"cannot read '{value}' as on/off")


def device_defaults(spec: TrainSpec, gpu: bool) -> TrainSpec:
    """The spec with its None axes sized for the device (a GPU or the CPU)."""
    out = replace(spec)
    if out.dtypes is None:
        out.dtypes = ["bf16"] if gpu else ["fp32"]
    if out.batches is None:
        out.batches = [16] if gpu else [4]
    if out.seqs is None:
        out.seqs = [128] if gpu else [32]
    if out.steps is None:
        out.steps = 20 if gpu else 5
    if out.warmup_steps is None:
        out.warmup_steps = 5 if gpu else 2
    return out


def _nccl_variants(spec: TrainSpec) -> list[str]:
    """Each point of the NCCL axis as a canonical 'KEY=VAL KEY=VAL' string ('' leaves the environment alone)."""
    p2p = [{}] if not spec.nccl_p2p else [{"NCCL_P2P_DISABLE": "1" if not parse_bool(v) else "0"} for v in spec.nccl_p2p]
    envs = [{}] if not spec.nccl_envs else [dict(kv.split("=", 1) for kv in e.split()) for e in spec.nccl_envs]
    return [" ".join(f"{k}={v}" for k, v in sorted({**a, **b}.items())) for a in p2p for b in envs]


def zero_stage_refusal(stages: list) -> str:
    return (f"--zero-stage {','.join(map(str, stages))} applies to --strategy deepspeed only: "
            "add --strategy deepspeed, or leave --zero-stage out")


def validate(spec: TrainSpec) -> TrainSpec:
    """Check every option (one-line SpecErrors); return the spec with device-sized defaults filled in."""
    from ...measure import device as dev
    from ...models import build

    spec = checked(TrainSpec, spec)  # api.train(TrainSpec(...)): each field's type, as a spec file's
    device = dev.resolve(spec.device)
    gpu = device.type == "cuda"
    spec = device_defaults(spec, gpu)
    for axis, option in (("models", "--model"), ("dtypes", "--dtype"), ("optims", "--optim"),
                         ("backends", "--backend"), ("batches", "--batch"), ("seqs", "--seq"),
                         ("grad_accums", "--grad-accum"), ("grad_ckpts", "--grad-ckpt"), ("compiles", "--compile"),
                         ("nprocs", "--nproc"), ("zero_stages", "--zero-stage"), ("kernels", "--kernels"),
                         ("heads", "--head")):
        if not getattr(spec, axis):
            raise SpecError(f"{option} is empty: give at least one value (an empty axis measures nothing)")
    # These default when None; an empty list (`--task ''`, `tasks=[]`) ran the default without a word, or (heads,
    # kernels above) stored an empty run and exited 0.
    for axis, option in (("tasks", "--task"), ("strategies", "--strategy"), ("nccl_p2p", "--nccl-p2p"),
                         ("nccl_envs", "--nccl-env")):
        if getattr(spec, axis) == []:
            raise SpecError(f"{option} is empty: give at least one value, or leave it out for the default")
    refs = [build.resolve(m) for m in spec.models]
    for ref in refs:
        for task in spec.tasks or [default_task(ref.shape)]:
            if task not in TRAIN_TASKS:
                raise SpecError(f"task '{task}' is not a training task: choose from {', '.join(TRAIN_TASKS)}")
            build.check_task(ref, task)
        if "masked" in spec.heads and "mlm" not in (spec.tasks or [default_task(ref.shape)]):
            raise SpecError(f"--head masked runs the MLM head on the masked positions: {ref.name} trains "
                            f"{'/'.join(spec.tasks or [default_task(ref.shape)])} (use --task mlm or --head all)")
    # A cell longer than its model's positions is `unsupported` where it runs (loop.py check_supported), so the cells
    # of the grid that fit still train; a seq that fits none of the grid's models would train nothing: bad input.
    widest = max(refs, key=lambda ref: ref.shape.max_positions)
    for s in sorted(set(spec.seqs)):
        if build.too_long(widest, s):
            raise SpecError(f"{build.too_long(widest, s)}: use --seq {widest.shape.max_positions} or less")
    if 1 in spec.seqs and {t for ref in refs for t in spec.tasks or [default_task(ref.shape)]} == {"causal-lm"}:
        # each such cell is `unsupported` (loop.py check_supported): a seq at which every cell is would train nothing
        raise SpecError("--seq 1: a causal LM trains on predicting each next token, and one token has none: use "
                        "--seq 2 or more")
    for p in spec.dtypes:
        if p not in TRAIN_DTYPES:
            raise SpecError(f"unknown dtype '{p}': choose from {', '.join(TRAIN_DTYPES)}")
        if p in ("fp16", "tf32") and not gpu:
            raise SpecError(f"dtype {p} trains on CUDA only ({'autocast + GradScaler' if p == 'fp16' else 'TF32 tensor cores'}): "
                            "use fp32 or bf16 on the CPU")
        dev.check_dtype_runs(str(device), p)
    for values, known, what in [(spec.optims, OPTIMIZERS, "optimizer"), (spec.backends, ATTENTION, "attention backend"),
                                (spec.kernels, KERNELS, "kernels"), (spec.heads, HEADS, "head"),
                                (spec.strategies or [], STRATEGIES, "strategy")]:
        for v in values:
            if v not in known:
                raise SpecError(f"unknown {what} '{v}': choose from {', '.join(known)}")
    for values, what in [(spec.batches, "batch"), (spec.seqs, "seq"), (spec.grad_accums, "grad-accum"),
                         (spec.nprocs, "nproc")]:
        if any(v < 1 for v in values):
            raise SpecError(f"{what} must be at least 1, got {min(values)}")
    _check_once(spec)
    if spec.activation is not None and spec.activation not in build.ACTIVATIONS:
        raise SpecError(f"unknown activation '{spec.activation}': choose from {', '.join(build.ACTIVATIONS)}")
    if spec.dropout is not None and not (math.isfinite(spec.dropout) and 0 <= spec.dropout < 1):
        raise SpecError(f"--dropout must be a probability in [0, 1), got {spec.dropout}")
    if spec.pad_vocab < 1:
        raise SpecError(f"--pad-vocab must be at least 1 (1: the vocabulary as it is), got {spec.pad_vocab}")
    if spec.max_batch_limit < 1:
        raise SpecError("--max-batch-limit must be at least 1")
    if spec.steps < 1 or spec.warmup_steps < 1:
        # named as --help names it (--warmup-steps is the old, hidden spelling)
        raise SpecError("--steps and --warmup must be at least 1 (the first step allocates the "
                        "optimizer state and compiles; it is never timed)")
    if not spec.lr > 0:
        raise SpecError("--lr must be positive")
    if spec.timeout <= 0:
        raise SpecError("--timeout must be positive")
    check_threads(spec.threads)
    if any(z not in (1, 2, 3) for z in spec.zero_stages):
        raise SpecError("--zero-stage takes 1, 2 or 3")
    for v in spec.nccl_p2p or []:
        parse_bool(v)
    for e in spec.nccl_envs or []:
        keys = []
        for kv in e.split():
            key = kv.split("=", 1)[0]
            if "=" not in kv or not NCCL_ENV_KEY.match(key):
                raise SpecError(f"--nccl-env '{kv}': write KEY=VAL with a NCCL_, TORCH_NCCL_ or GLOO_ variable")
            keys.append(key)
        # Each of these ran a point other than the one written: an empty one left the environment as it was, a
        # key given twice kept its last value, and NCCL_P2P_DISABLE here overrode --nccl-p2p's without a word.
        if not keys:
            raise SpecError("--nccl-env '' is empty: give KEY=VAL, or leave --nccl-env out")
        twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
        if twice:
            raise SpecError(f"--nccl-env '{e}' sets {twice} twice: give it once")
        if spec.nccl_p2p and "NCCL_P2P_DISABLE" in keys:
            raise SpecError(f"--nccl-env '{e}' sets NCCL_P2P_DISABLE, which --nccl-p2p sets: use one of them")
    if spec.nnodes < 1:  # was "--node-rank must be between 0 and --nnodes - 1 (-1)"
        raise SpecError(f"--nnodes must be at least 1, got {spec.nnodes}")
    world = spec.nnodes * max(spec.nprocs)
    if world > LIMITS["--nnodes"]:  # each within its limit, their product past the world size a rank takes (rank.py)
        raise SpecError(f"--nnodes {spec.nnodes} x --nproc {max(spec.nprocs)} is {world:,} ranks, above the "
                        f"{LIMITS['--nnodes']:,} a run takes: use fewer hosts or processes")
    if not 0 <= spec.node_rank < spec.nnodes:
        raise SpecError(f"--node-rank must be between 0 and --nnodes - 1 ({spec.nnodes - 1})")
    if spec.nnodes > 1 and not (spec.rdzv_endpoint or "").strip():
        raise SpecError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT of node 0 (the same on every node)")
    if spec.nnodes > 1:
        _check_endpoint(spec.rdzv_endpoint)
    if spec.nnodes == 1 and spec.rdzv_endpoint is not None:  # runner/launch.py passes it only to several hosts
        raise SpecError("--rdzv-endpoint joins several hosts, and --nnodes is 1: add --nnodes 2 (or more), "
                        "or leave --rdzv-endpoint out")
    if spec.rdzv_wait is not None:
        if spec.nnodes == 1:  # one host waits for no rendezvous: the option would be dropped without a word
            raise SpecError("--rdzv-wait is how long a node waits for node 0 of several hosts, and --nnodes is 1: "
                            "add --nnodes 2 (or more), or leave --rdzv-wait out")
        if not 0 < spec.rdzv_wait <= MAX_SECONDS:  # NaN fails too; a wait of a year is a typo
            raise SpecError(f"--rdzv-wait must be above 0 and at most {MAX_SECONDS:,} s (a day), got "
                            f"{spec.rdzv_wait:g}")
    # Options of one strategy or of several GPUs, given where no cell uses them, were dropped without a word: the
    # run said ok and measured something else than asked (ZeRO 3 under ddp, NCCL settings on one process).
    if spec.zero_stages != [2] and "deepspeed" not in (spec.strategies or []):
        raise SpecError(zero_stage_refusal(spec.zero_stages))
    if max(spec.nprocs) * spec.nnodes == 1:
        for given, option in ((spec.nccl_p2p, "--nccl-p2p"), (spec.nccl_envs, "--nccl-env"), (spec.scaling, "--scaling")):
            if given:
                raise SpecError(f"{option} applies to cells of several GPUs, and every cell here runs one process: "
                                f"add --nproc 2 (or more), or leave {option} out")
    if not spec.comm_timing and (max(spec.nprocs) * spec.nnodes == 1 or "ddp" not in (spec.strategies or ["ddp"])):
        raise SpecError("--comm-timing off applies to ddp cells of several GPUs, and no cell here is one: "
                        "leave --comm-timing out")
    if "dp" in (spec.strategies or []):
        if not gpu:
            raise SpecError("strategy dp (torch.nn.DataParallel) runs on CUDA GPUs only: use ddp for several "
                            "processes on the CPU (gloo), or none")
        if spec.nnodes > 1:
            raise SpecError("strategy dp is one process over the GPUs of one host: use ddp, fsdp or deepspeed "
                            "with --nnodes > 1")
    if "none" in (spec.strategies or []) and (spec.nnodes > 1 or max(spec.nprocs) > 1):
        raise SpecError("strategy none runs one process: use dp, ddp, fsdp or deepspeed with --nproc > 1 or --nnodes > 1")
    if spec.ladder and spec.max_batch_limit < spec.batches[0]:  # the search doubles from the batch: a traceback
        raise SpecError(f"--max-batch-limit {spec.max_batch_limit} is below --batch {spec.batches[0]}, where the "
                        "ladder's largest-batch searches start: raise the limit or lower --batch")
    if spec.ladder and (spec.shard is not None or spec.shard_count is not None):
        raise SpecError("--shard slices a sweep, and a ladder's steps build on each other: run the ladder whole, "
                        "or leave --ladder out")
    from ...runner import shard as sharding

    spec = sharding.resolved(spec)  # `auto` becomes this task's I/N, stored with the run
    if not gpu:
        check_cpu_ranks(max(spec.nprocs))
    else:
        import torch

        if max(spec.nprocs) > torch.cuda.device_count():
            raise SpecError(f"--nproc {max(spec.nprocs)} needs that many GPUs on this node; "
                            f"{torch.cuda.device_count()} visible")
    return spec


def _check_endpoint(endpoint: str) -> None:
    """--rdzv-endpoint as torchrun reads it (HOST[:PORT]), before any cell: `host:abc`, `host:99999` or `:29500` failed
    every cell's torchrun instead (runner/launch.py passes it on), each an `error` cell, and the sweep said ok."""
    try:
        from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
    except ImportError:  # a torch without distributed support: torchrun cannot run here at all
        return
    try:
        host, port = parse_rendezvous_endpoint(endpoint, 29400)
    except ValueError as exc:
        raise SpecError(f"--rdzv-endpoint {endpoint}: {exc} Give node 0's HOST:PORT, e.g. host0:29500") from None
    if port == 0:  # torchrun takes it: node 0 listens on a free port of its choosing, which no other node knows
        raise SpecError(f"--rdzv-endpoint {endpoint}: port 0 is any free port of node 0, which the other nodes "
                        "cannot know: give the port node 0 listens on, e.g. host0:29500")
    if len(host) > 253:  # the longest DNS name (RFC 1035); torchrun takes any, and each cell failed to resolve it
        raise SpecError(f"--rdzv-endpoint: its host name is {len(host):,} characters long, and a host name has at "
                        "most 253: give node 0's HOST:PORT, e.g. host0:29500")


def _endpoint(spec: TrainSpec) -> tuple[str, int] | None:
    """(host, port) as torchrun reads --rdzv-endpoint (_check_endpoint); None for a torch without torchrun."""
    try:
        from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
    except ImportError:
        return None
    return parse_rendezvous_endpoint(spec.rdzv_endpoint, 29400)


def check_rendezvous(spec: TrainSpec) -> None:
    """Before any cell of several hosts: node 0's host name resolves, and on another node something answers at
    --rdzv-endpoint within --rdzv-wait (default RDZV_WAIT_S). Left to torchrun, a name that did not resolve failed
    every cell one by one, and a node > 0 whose node 0 never answered waited silently: torch's c10d store retries
    its connect for its read_timeout, its rendezvous for a join_timeout of 600 s, and each cell's start-up had
    WORKER_START_S (runner/worker.py) before it was a `timeout`, cell after cell, exit 0."""
    endpoint = _endpoint(spec) if spec.nnodes > 1 else None
    if endpoint is None:
        return
    host, port = endpoint
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise SpecError(f"--rdzv-endpoint {spec.rdzv_endpoint}: the host name {host} does not resolve "
                        f"({getattr(exc, 'strerror', None) or exc}): give node 0's HOST:PORT as every node "
                        "can reach it") from None
    if spec.node_rank == 0:  # node 0 hosts the rendezvous (torchrun's c10d store): nothing to reach
        print(f"note: node 0 of {spec.nnodes}: hosting the rendezvous at {host}:{port}; each cell waits up to "
              f"{start_limit(spec.timeout):g} s (its start-up limit) for the other nodes to join", file=sys.stderr,
              flush=True)
        return
    wait = RDZV_WAIT_S if spec.rdzv_wait is None else spec.rdzv_wait
    print(f"note: node {spec.node_rank} of {spec.nnodes}: waiting up to {wait:g} s for node 0's rendezvous at "
          f"{host}:{port}", file=sys.stderr, flush=True)
    try:
        _reach_store(host, port, wait)
    except (RuntimeError, TimeoutError) as exc:  # torch's DistNetworkError is a RuntimeError
        why = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)[:200].rstrip(".")
        raise SpecError(f"--rdzv-endpoint {host}:{port}: node 0's rendezvous did not answer within {wait:g} s "
                        f"({why}): start node 0 (--node-rank 0) with the same --nnodes and --rdzv-endpoint, and "
                        "check that this host reaches that address and port (firewall, the address node 0 listens "
                        "on), or wait longer (--rdzv-wait)") from None


def _reach_store(host: str, port: int, wait: float) -> None:
    """A client of the c10d store torchrun's rendezvous uses (torch's c10d_rendezvous_backend), connected and
    validated within `wait` seconds, then closed: torch retries a refused connect until then, and a port where something
    other than a store answers (a proxy that takes every connection) fails its validation, where a bare TCP connect
    succeeded. Its C++ side logs each retry as lines and a stack on file descriptor 2: kept off the terminal."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        TCPStore(host, port, is_master=False, timeout=timedelta(seconds=wait), wait_for_workers=False)
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _check_once(spec: TrainSpec) -> None:
    for axis, option in (("models", "--model"), ("tasks", "--task"), ("dtypes", "--dtype"), ("optims", "--optim"),
                         ("backends", "--backend"), ("batches", "--batch"), ("seqs", "--seq"),
                         ("grad_accums", "--grad-accum"), ("grad_ckpts", "--grad-ckpt"), ("compiles", "--compile"),
                         ("kernels", "--kernels"), ("heads", "--head"), ("strategies", "--strategy"),
                         ("nprocs", "--nproc"), ("zero_stages", "--zero-stage"), ("nccl_p2p", "--nccl-p2p"),
                         ("nccl_envs", "--nccl-env")):
        same = (parse_bool if axis == "nccl_p2p" else (lambda v: " ".join(sorted(v.split()))) if axis == "nccl_envs"
                else None)
        check_once(getattr(spec, axis) or [], option, same)


def expand(spec: TrainSpec) -> list[TrainCell]:
    """Cells in grid order, one-GPU points first (the scaling baselines), batches growing within each
    group so an out-of-memory batch skips the larger ones."""
    from ...measure import device as dev
    from ...models import build

    device = dev.resolve(spec.device).type
    nccl = _nccl_variants(spec)
    cells: dict[str, TrainCell] = {}
    for model in spec.models:
        tasks = spec.tasks or [default_task(build.resolve(model).shape)]
        for (task, precision, attn, optim, seq, accum, ckpt, comp, kern, head, nproc, strategy, zero, env,
             batch) in itertools.product(tasks, spec.dtypes, spec.backends, spec.optims, sorted(spec.seqs),
                                         spec.grad_accums, spec.grad_ckpts, spec.compiles, spec.kernels, spec.heads,
                                         sorted(spec.nprocs), spec.strategies or [None], spec.zero_stages, nccl,
                                         sorted(spec.batches)):
            # The head axis applies to the mlm task only; another task runs its own head once (skipping it
            # left `--task mlm,classification --head masked` without a single classification cell).
            head = head if task == "mlm" else "all"
            world = nproc * spec.nnodes
            if strategy is None:
                strategy = "none" if world == 1 else "ddp"
            cell = TrainCell(
                model=model, task=task, backend=attn, dtype=precision, optim=optim, batch=batch, seq=seq,
                grad_accum=accum, grad_ckpt=ckpt, compile=comp, kernels=kern, head=head, activation=spec.activation,
                dropout=spec.dropout, pad_vocab=spec.pad_vocab, strategy=strategy, nproc=nproc,
                nnodes=spec.nnodes, zero_stage=zero if strategy == "deepspeed" else None,
                nccl=env if world > 1 else "", comm_timing=spec.comm_timing or not (strategy == "ddp" and world > 1), device=device, steps=spec.steps,
                warmup_steps=spec.warmup_steps,
                lr=spec.lr, seed=spec.seed,
            )
            if spec.scaling and world > 1:
                # The same step as one plain process on one GPU of this host: with --nnodes 2 a baseline of
                # nproc 1 on every node was a 2-GPU cell of its own, and no cell was ever the efficiency's base.
                one = replace(cell, strategy="none", nproc=1, nnodes=1, zero_stage=None, nccl="", comm_timing=True)
                cells.setdefault(one.key(), one)
            cells.setdefault(cell.key(), cell)
    ordered = sorted(cells.values(), key=lambda c: c.world_size)  # stable: grid order within each size
    from ...runner import shard as sharding

    # With --scaling a shard keeps each step whole (every batch and world size of it, its one-GPU baseline with
    # them), so each shard's store has the baselines of its own efficiencies.
    def step(c: TrainCell) -> str:
        same = c.comparable()
        return json.dumps(same[:5] + same[6:])

    return sharding.select(ordered, sharding.resolve(spec.shard, spec.shard_count),
                           group=step if spec.scaling else None)


def launch_config(cell: TrainCell, spec: TrainSpec):
    from ...runner.launch import LaunchConfig

    return LaunchConfig(
        nproc=cell.nproc, torchrun=cell.launched, nnodes=cell.nnodes, node_rank=spec.node_rank,
        rdzv_endpoint=spec.rdzv_endpoint, rdzv_id="transbench-" + hashlib.sha256(cell.key().encode()).hexdigest()[:12],
        timeout=spec.timeout, env=cell.nccl_env(),
    )


def run_cell(cell: TrainCell, spec: TrainSpec) -> CellResult:
    """One cell in its own process (torchrun for a strategy): the result rank 0 wrote, or why none came.
    Only for the ranks of hosts other than node 0, which measure nothing they store. Launched by a lane as node 0's
    are, so that this host's ranks compute with --threads as node 0's do (they had torchrun's one thread a rank)."""
    from ...runner.sweep import _Lane

    return _Lane(None, target(spec), threads=spec.threads).run(cell, spec.timeout)


def target(spec: TrainSpec):
    """How the sweep loop measures a training cell: a process tree per cell (torchrun for a strategy),
    so each cell's memory split starts from an empty allocator."""
    from ...runner.sweep import Target

    def after(store, run_id: str, cell: TrainCell, result: CellResult) -> None:
        stop_unjoined(spec, cell, result)
        add_scaling(store, run_id, cell, result)

    return Target(TrainCell, launch=lambda cell: ("transbench.scenarios.training.worker", launch_config(cell, spec)),
                  after=after)


def stop_unjoined(spec: TrainSpec, cell: TrainCell, result: CellResult) -> None:
    """Node 0's run stops at a cell whose rendezvous the other nodes never joined (runner/launch.py NOT_JOINED),
    before it is stored: every later cell waited the same start-up limit for them, each stored as a `timeout`."""
    from ...runner.launch import NOT_JOINED

    if spec.node_rank == 0 and cell.nnodes > 1 and result.status == "timeout" and \
            (result.error or "").startswith(NOT_JOINED):
        raise SpecError(f"--nnodes {spec.nnodes}: {result.error}: start the other nodes (--node-rank 1 to "
                        f"{spec.nnodes - 1}) with the same --nnodes and --rdzv-endpoint, then rerun this command with "
                        "its --name to resume (`transbench runs` lists a run's name)")


def find_baseline(store, run_id: str, cell: TrainCell, gpu: str | None) -> dict | None:
    """The same step on one GPU (same GPU model), in this run first, then in the newest other runs; the
    plain single-process run preferred over a one-rank wrapper."""
    runs = [run_id] + [r["run_id"] for r in reversed(store.runs()) if r["kind"] == "training" and r["run_id"] != run_id]
    want = json.dumps(cell.comparable())
    for rid in runs:
        found = []
        for c in store.cells(rid, TrainCell):
            other = c["cell"]
            if c["status"] != "ok" or c["scenario"] != "training" or other.get("nproc", 1) * other.get("nnodes", 1) != 1:
                continue
            if json.dumps(TrainCell.from_dict(other).comparable()) == want and c["record"].get("gpu") == gpu:
                found.append(c)
        if found:
            found.sort(key=lambda c: c["cell"]["strategy"] != "none")
            return {"run_id": rid, **found[0]}
    return None


def add_scaling(store, run_id: str, cell: TrainCell, result: CellResult) -> None:
    """scaling_efficiency = (samples/s over N GPUs / N) / samples/s on one GPU, for the same per-GPU batch."""
    if result.status != "ok" or cell.world_size == 1:
        return
    base = find_baseline(store, run_id, cell, result.record.get("gpu"))
    if base is None:
        result.warnings.append("no one-GPU run of this step in the store: rerun with --scaling for the efficiency")
        return
    one = base["record"]["samples_per_s"]
    result.record["scaling_efficiency"] = result.record["samples_per_s"] / (cell.world_size * one)
    result.info["scaling_baseline"] = {"run_id": base["run_id"], "key": base["key"], "samples_per_s": one,
                                       "strategy": base["cell"]["strategy"]}


def open_training_run(store, spec: TrainSpec, keys: set[str] | None = None) -> tuple[str, str, int]:
    """(run_id, name, cells already stored, of `keys` where given: this shard's): the named run resumed (same grid),
    else a new one."""
    from ...measure import env as env_mod
    from ...runner.sweep import open_run

    return open_run(store, "training", replace(spec, name=None).to_dict(), spec.name,
                    lambda: env_mod.collect(open_cuda=False), keys)


def train(spec: TrainSpec, db: str = "transbench.db", *, json_path: str | None = None,
          csv_path: str | None = None, on_start: Callable[[list[TrainCell], int], None] = lambda cells, done: None,
          on_cell: Callable[[TrainCell, CellResult | None], None] = lambda c, r: None) -> list[dict]:
    """Validate, expand and run a training sweep on the one sweep loop (runner/sweep.py): resume by name,
    larger batches skipped after an OOM (also across a resume), each finished cell stored as it ends (only
    node 0 of a multi-host run stores). Returns the run's records."""
    from ...runner.sweep import SweepOptions, run_grid
    from ...store import Store, export

    spec = validate(spec)
    if spec.ladder:
        raise SpecError("a ladder runs through transbench.api.train (scenarios/training/ladder.py)")
    cells = expand(spec)
    if cells:
        check_rendezvous(spec)
    if spec.node_rank > 0:  # another host's ranks; node 0 measures and stores
        on_start(cells, 0)
        for cell in cells:
            on_cell(cell, run_cell(cell, spec))
        return []
    store = Store(db)
    try:
        run_id, _, done = open_training_run(store, spec, {c.key() for c in cells})
        on_start(cells, done)
        run_grid(store, run_id, cells, target(spec), SweepOptions(timeout=spec.timeout, threads=spec.threads), on_cell)
        recs = export.records(store, [run_id], by_id=True)
    finally:
        store.close()
    export.write(recs, json_path, csv_path, db=db)
    return recs
