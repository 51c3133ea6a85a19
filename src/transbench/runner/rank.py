"""The rank side of a launched cell: who this process is, its device, its log file and its result file.

A rank process is `python -m <module> --cell CELL.json --out DIR`, started by runner/launch.py directly
(one process) or through torchrun (which sets RANK, LOCAL_RANK and WORLD_SIZE). It writes its output to
DIR/rank<R>.log and its CellResult to DIR/result-rank<R>.json: rank 0 always, other ranks when they fail."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..boundary import env_int
from ..cells import CellResult

ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "NVSHMEM_", "TORCH_SYMM_MEM_")
READY = "ready-rank"  # the file a rank makes in its launch's folder once started (READY + its rank)


@dataclass
class RankInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    launched: bool = False  # under torchrun: a process group is needed even for a world of one
    backend: str | None = None

    @classmethod
    def from_env(cls) -> RankInfo:
        if "WORLD_SIZE" not in os.environ:
            return cls()
        # Set by torchrun; read through the input boundary, so a stray WORLD_SIZE=x is one line, not a traceback.
        return cls(env_int("RANK", 0, 0, 1 << 20, strict=True), env_int("LOCAL_RANK", 0, 0, 1 << 20, strict=True),
                   env_int("WORLD_SIZE", 1, 1, 1 << 20, strict=True), launched=True)

    def device(self, device: str):
        """This rank's device: its local GPU when the cell runs on CUDA."""
        import torch

        if str(device).startswith("cuda"):
            if not self.launched:
                from ..measure import device as dev

                d = dev.resolve(str(device))
            else:
                d = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(d)
            return d
        return torch.device("cpu")

    def init(self, device) -> None:
        """NCCL between GPUs, gloo on the CPU."""
        if not self.launched:
            return
        import torch.distributed as dist

        self.backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(self.backend, **kwargs)

    @staticmethod
    def nccl_env() -> dict[str, str]:
        return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def _redirect(log_path: Path) -> None:
    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


def _die_with_parent() -> None:
    """If the launcher is killed, take this rank down with it (Linux), so no rank is orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def write_result(out: Path, rank: int, result: CellResult) -> None:
    tmp = out / f".result-rank{rank}.json.tmp"
    tmp.write_text(json.dumps(result.to_dict(), default=str))
    tmp.replace(out / f"result-rank{rank}.json")  # whole or absent, never half-written


def guarded(body: Callable[[object], CellResult | None], info: RankInfo,
            device_str: str) -> tuple[CellResult | None, bool]:
    """Set up this rank's device and process group, run `body(device)`, and turn any failure into a
    result (oom, unsupported with what to install, or error with the message). Returns (result, failed)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            device = info.device(device_str)
            device_str = str(device)
            info.init(device)
            return body(device), False
        except Exception as exc:  # every failure of a rank is a result, not a crash
            from ..errors import Unsupported
            from ..measure import device as dev
            from ..measure import memory
            from .worker import failure

            result = failure(device_str, exc, Unsupported, dev, memory, caught)
            result.info["rank"] = info.rank
            return result, True


def main(run: Callable[[dict, RankInfo, object], CellResult | None], argv: list[str] | None = None) -> None:
    """Parse --cell/--out, set up the rank, run `run(cell_dict, rank, device)`, write the result."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--cell", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out)
    info = RankInfo.from_env()
    _redirect(out / f"rank{info.rank}.log")
    _die_with_parent()
    cell = json.loads(Path(args.cell).read_text())
    from .worker import _threads, apply_cpus, apply_threads

    apply_cpus()
    threads = os.environ.get("TRANSBENCH_THREADS", "")
    apply_threads(int(threads) if threads.isdigit() else None)  # torchrun's default is 1 thread a rank
    import torch  # noqa: F401 - start-up (apply_threads may not have): every rank needs it

    (out / f"{READY}{info.rank}").touch()  # start-up is over: the cell's clock starts (runner/launch.py)
    result, failed = guarded(lambda device: run(cell, info, device), info, cell.get("device", "cpu"))
    if result is not None:
        # The record's `threads` is the cell's, which its ranks share (runner/sweep.py _launch): what this rank's
        # torch computed with is said here, where the launching process cannot see it.
        result.info.setdefault("torch_threads", _threads())
        write_result(out, info.rank, result)
    sys.stdout.flush()
    sys.stderr.flush()
    if failed:
        os._exit(1)  # the other ranks may be stuck in a collective: torchrun ends them when this one exits
    if info.launched:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
