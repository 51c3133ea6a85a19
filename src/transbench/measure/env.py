"""The environment a result was measured in: GPUs, driver, clocks, library versions, peak row."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata

from . import device as dev
from . import load, peaks

# Versions recorded with every run: what the figures depend on. importlib.metadata reads each in microseconds;
# torch.utils.collect_env runs pip, conda and nvidia-smi in subprocesses (seconds), so it is not used.
PACKAGES = ("torch", "transformers", "triton", "pytorch-triton", "numpy", "accelerate", "safetensors", "tokenizers",
            "onnxruntime", "onnxruntime-gpu", "onnx", "flash-attn", "deepspeed", "liger-kernel", "torchao",
            "bitsandbytes", "nvidia-ml-py", "nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-nccl-cu12")
GIT_TIMEOUT_S = 2.0


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _transbench_version() -> str:
    from .. import __version__

    return __version__


def git_commit(cwd: str | None = None) -> str | None:
    """The commit checked out where the benchmark runs (the code under test, when that is a repository), with
    "-dirty" where tracked files changed; None outside a repository, without git, or past a short timeout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip() or None
    return commit and commit + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo on Linux), else what platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model")) and ":" in line:  # x86; some ARM kernels say "Model"
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def packages() -> dict[str, str]:
    return {p: v for p in PACKAGES if (v := _version(p)) is not None}


def _nvml_gpu(index: int) -> dict:
    nv, h = dev.nvml_handle(index)
    if h is None:
        return {}
    out: dict = {}
    for key, call in {
        "uuid": lambda: _text(nv.nvmlDeviceGetUUID(h)),
        "sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "mem_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "max_sm_clock_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "max_mem_clock_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
        "power_limit_w": lambda: nv.nvmlDeviceGetPowerManagementLimit(h) / 1000,
        "temperature_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "uuid": lambda: _text(nv.nvmlDeviceGetUUID(h)),
        "pci_bus_id": lambda: _text(nv.nvmlDeviceGetPciInfo(h).busId),
        "memory_used_mb": lambda: nv.nvmlDeviceGetMemoryInfo(h).used / 2**20,
    }.items():
        try:
            out[key] = call()
        except Exception:
            out[key] = None
    return out


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# Where a run ran, beside what it ran on: a merged grid of shards from several hosts names each cell's host
# (runner/sweep.py stores it with the cell) and the hosts' GPUs by UUID here. NODE_NAME is a Kubernetes pod's node,
# where its manifest passes it (docs/k8s-indexed-job.yaml): the pod's hostname is the pod's own name.
SCHEDULER_PREFIXES = ("SLURM_JOB_ID", "SLURM_ARRAY_", "SLURM_JOB_NODELIST", "SLURM_NODEID", "JOB_COMPLETION_INDEX",
                      "TRANSBENCH_SHARD_COUNT", "NODE_NAME")


def where() -> dict:
    """This host's name, the GPUs this process may see, and the cluster scheduler's job and task, if any."""
    return {
        "hostname": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "scheduler": {k: v for k, v in sorted(os.environ.items()) if k.startswith(SCHEDULER_PREFIXES)},
    }


def collect(open_cuda: bool = True) -> dict:
    """With open_cuda=False, GPUs are read through NVML only (no CUDA context in this process)."""
    import torch

    env: dict = {
        **where(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_threads": load.available_cores(),  # the cores this process may use: the workers' default --threads
        "hostname": socket.gethostname(),
        "git_commit": git_commit(),
        "packages": packages(),
        "load_avg": load.load_avg(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "triton": _version("triton") or _version("pytorch-triton"),
        # The running code's own version: a checkout run as PYTHONPATH=src (the GPU scripts) has no installed
        # metadata, and an installed copy elsewhere may be another version than the one running.
        "transbench": _transbench_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpus": [],
    }
    nv = dev._nvml()
    if nv is not None:
        try:
            env["driver"] = nv.nvmlSystemGetDriverVersion()
        except Exception:
            env["driver"] = None
    if not open_cuda:
        for g in dev.nvml_gpus():
            row = peaks.lookup(g["name"], g["memory_gb"])
            peak = None if row is None else {"gpu": row.gpu, "tflops": row.tflops, "bandwidth_gbs": row.bandwidth_gbs}
            env["gpus"].append({**g, "memory_gb": round(g["memory_gb"], 2), "peak": peak, **_nvml_gpu(g["index"])})
    elif torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            mem_gb = p.total_memory / 2**30
            row = peaks.lookup(p.name, mem_gb)
            env["gpus"].append({
                "index": i,
                "name": p.name,
                "memory_gb": round(mem_gb, 2),
                "capability": f"{p.major}.{p.minor}",
                "multiprocessors": p.multi_processor_count,
                "uuid": f"GPU-{p.uuid}" if getattr(p, "uuid", None) is not None else None,  # NVML's spelling
                "peak": None if row is None else {"gpu": row.gpu, "tflops": row.tflops, "bandwidth_gbs": row.bandwidth_gbs},
                **_nvml_gpu(i),
            })
    return env
