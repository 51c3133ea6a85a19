"""The one seam to CUDA and NVML: everything device-specific goes through here, so the rest runs on CPU."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..errors import SpecError

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


def torch_dtype(name: str):
    """The model's storage dtype. fp8 is stored in fp16: only the fused engine runs it (its GEMMs in e4m3)."""
    import torch

    table = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
             "fp8": torch.float16}
    if name not in table:
        raise SpecError(f"unknown dtype '{name}': choose from {', '.join(DTYPES)}")
    return table[name]


def resolve(device: str = "auto"):
    """'auto' is the first CUDA device when there is one, else the CPU."""
    import torch

    if device == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise SpecError(f"unknown device '{device}': use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecError(f"device '{device}' asked for but no CUDA GPU is visible: use --device cpu")
        index = dev.index or 0
        if index >= torch.cuda.device_count():
            raise SpecError(f"device '{device}' does not exist: {torch.cuda.device_count()} GPU(s) visible")
        return torch.device("cuda", index)
    if dev.type != "cpu":
        raise SpecError(f"device type '{dev.type}' is not supported: use cpu or cuda")
    return dev


def gpu_count() -> int:
    """CUDA GPUs this process may use (CUDA_VISIBLE_DEVICES applies). torch.cuda.device_count asks NVML
    (or the driver) without creating a CUDA context, so the parent of the workers holds no GPU memory."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@functools.lru_cache(maxsize=None)
def check_dtype_runs(device_str: str, dtype: str) -> None:
    """Bad input when `dtype` cannot run on the device (run and serve): tf32 is a GPU mode, fp8 needs a GPU's
    e4m3 tensor cores, bf16 an Ampere or newer GPU."""
    import torch

    from ..errors import SpecError

    if dtype == "tf32" and torch.device(device_str).type != "cuda":
        raise SpecError("dtype tf32 needs a CUDA GPU: use fp32 on the CPU")
    if not dtype_runs(device_str, dtype):
        raise SpecError(f"dtype {dtype} does not run on {device_str}: use fp32 there, or a GPU")


def dtype_runs(device_str: str, dtype: str) -> bool:
    """Whether the basic ops of a transformer layer run in `dtype` on this device."""
    import torch

    dev = torch.device(device_str)
    t = torch_dtype(dtype)
    if dev.type == "cuda":
        # Asked through NVML so the parent process never opens a CUDA context (it would hold memory
        # on the GPU being measured for the whole sweep).
        cap = nvml_capability(dev.index or 0)
        if dtype == "fp8":  # e4m3 tensor cores: Ada / Hopper on
            return cap is None or cap >= (8, 9)
        return dtype != "bf16" or cap is None or cap >= (8, 0)
    if dtype == "fp8":
        return False  # no fp8 GEMM kernels on the CPU
    try:
        # Fixed values, not torch.randn: this runs in the caller's process (api.run, api.serve, api.train
        # validate with it), and drawing from the global generator moved a seeded script's random stream.
        x = torch.linspace(-1, 1, 32, device=dev).reshape(4, 8).to(t)
        w = torch.linspace(1, -1, 64, device=dev).reshape(8, 8).to(t)
        y = torch.nn.functional.layer_norm(torch.nn.functional.gelu(x @ w), (8,))
        torch.softmax(y, -1).sum().item()
        return True
    except (RuntimeError, NotImplementedError):
        return False


def set_matmul_precision(dtype: str) -> None:
    """tf32 is fp32 storage with TF32 tensor-core matmuls; fp32 means true fp32 arithmetic."""
    import torch

    allow = dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    # The CPU allocator's refusal ("DefaultCPUAllocator: can't allocate memory") is the CPU's out of memory: as
    # an `error` it skipped no larger batch and ended a --max-batch search without bisecting.
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def free_memory(device) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@dataclass
class GpuInfo:
    name: str
    memory_gb: float
    index: int


def gpu_info(device) -> GpuInfo | None:
    import torch

    if device.type != "cuda":
        return None
    p = torch.cuda.get_device_properties(device)
    return GpuInfo(p.name, p.total_memory / 2**30, device.index or 0)


# --- NVML: device-wide facts torch cannot see (other processes, clocks, throttling) -----------------

@functools.lru_cache(maxsize=1)
def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no driver, no library, no GPU: NVML facts stay empty
        return None


def nvml_handle(index: int):
    """NVML numbers GPUs physically; torch numbers those CUDA_VISIBLE_DEVICES shows, in its order."""
    import os

    nv = _nvml()
    if nv is None:
        return None, None
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip().isdigit()]
    if index < len(visible):
        index = int(visible[index])
    try:
        return nv, nv.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None, None


def nvml_capability(index: int) -> tuple[int, int] | None:
    nv, h = nvml_handle(index)
    if h is None:
        return None
    try:
        return tuple(nv.nvmlDeviceGetCudaComputeCapability(h))
    except Exception:
        return None


def nvml_gpus() -> list[dict]:
    """Name and memory of every GPU, without a CUDA context."""
    nv = _nvml()
    if nv is None:
        return []
    out = []
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(h)
            out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                        "memory_gb": nv.nvmlDeviceGetMemoryInfo(h).total / 2**30})
    except Exception:
        return out
    return out


def nvml_used_mb(index: int) -> float | None:
    nv, h = nvml_handle(index)
    if h is None:
        return None
    return nv.nvmlDeviceGetMemoryInfo(h).used / 2**20


def nvml_other_processes(index: int) -> list[int]:
    """PIDs of compute processes on this GPU other than this one."""
    import os

    nv, h = nvml_handle(index)
    if h is None:
        return []
    try:
        procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
    except Exception:
        return []
    return [p.pid for p in procs if p.pid != os.getpid()]


