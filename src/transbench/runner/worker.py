"""Child-process isolation: cells run in a spawned worker with a deadline; a crash, a signal or a hang
ends that cell's worker, never the sweep. A worker keeps its state (built models) between cells, but not
its device memory: after each cell it releases what the cell left, and reports what it still holds so
the sweep can replace it (measure/memory.py says why)."""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
import warnings
from contextlib import contextmanager

from ..boundary import env_int
from ..cells import CellResult
from ..declare import setting
from ..errors import SpecError

LOG_TAIL_CHARS = 2000
# The longest wait for a cell: the pipe's poll takes at most 2^31 ms (~24.8 days; `--timeout 1e7` was an
# OverflowError traceback after the run was stored), and a deadline of 11.5 days is none anyway.
LONGEST_WAIT_S = 1e6
# The thread-count variables of the libraries torch computes with on a CPU; TRANSBENCH_THREADS carries the count.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# A worker's start-up (spawning it, importing torch and the cell's code; a launched cell's ranks, a multi-host
# cell's rendezvous) is not the cell's work: --timeout counts from its end, as users read it (the first cell of a
# sweep had ~3 s of imports on a CPU taken from its limit). A start-up that hangs (an import on a stalled file
# system) still ends: it has the longer of --timeout and this.
WORKER_START_S = 300.0


def start_limit(timeout: float) -> float:
    """The seconds a worker's start-up may take before its cell is `timeout`."""
    return max(timeout, WORKER_START_S)


def timeout_setting(what: str = "a cell"):
    """--timeout of the commands whose cells run in workers (run, serve, train): one declaration, a field in each."""
    return setting(900.0, f"seconds {what} may take before it is `timeout`, counted from when its worker is ready "
                   f"(the start-up, importing torch, has its own limit: the longer of this and {WORKER_START_S:g} s)")


def resolve_target(target: str):
    """'package.module:function' -> the function."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def execute(target: str, cell: dict, state: dict) -> CellResult:
    """Run one cell in this process through `target(cell, state)` and map every failure to a status.
    The memory the process holds when the cell starts is recorded as mem_before_mb. A cell in which a CUDA-graph
    capture failed names `fresh_worker_after` (engine/capture.py failures says why)."""
    from ..errors import Unsupported
    from ..measure import device as dev
    from ..measure import memory

    from ..measure import load

    failed = _capture_failures()
    device_str = cell.get("device", "cpu")
    device = _device(device_str)
    before = None
    with warnings.catch_warnings(record=True) as caught, load.Watch() as watch:
        warnings.simplefilter("always")
        try:
            if device is not None:
                before = memory.allocated_mb(device)
            result = resolve_target(target)(cell, state)
        except Exception as exc:  # every failure of a cell is a result, not a crash
            result = failure(device_str, exc, Unsupported, dev, memory, caught)
    if before is not None and result.status == "ok":
        result.record.setdefault("mem_before_mb", before)
    threads = _threads()
    # Over the timed region where the sampler watched it (measure/context.py), else over the whole cell.
    region = result.record.get("busy_processes")
    busy = (load.Busy(processes=region, total=result.record.get("busy_cores")) if isinstance(region, list)
            else watch.busy)
    result.record.update(load.record(busy, threads))
    # A GPU cell's host needs one core to launch its kernels; a CPU cell, every thread it was given.
    if load.competing(busy, 1 if device_str.startswith("cuda") else threads):
        result.warnings.append(load.warning(busy, threads))
    if device_str.startswith("cuda"):
        result.warnings += _interference()
    if _capture_failures() > failed:
        result.info["fresh_worker_after"] = ("a CUDA-graph capture failed: later captures of this process would run on "
                                             "a second stream")
    return result


def _threads() -> int | None:
    """The intra-op threads torch computes with in this process (None where torch never loaded)."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def apply_cpus() -> None:
    """Keep this process on the cores its lane was given (TRANSBENCH_CPUS, runner/sweep.py lane_cores); set
    before torch starts its thread pools, which then stay on those cores."""
    cpus = os.environ.get("TRANSBENCH_CPUS", "")
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
        except (OSError, ValueError, OverflowError):
            pass  # a core the host took away since: the process keeps the cores it had


def apply_threads(threads: int | None) -> None:
    """Set this process's compute threads before any work: OpenMP and MKL read their variables when they
    start, torch's intra-op pool is set directly (it may have started already)."""
    if not threads:
        return
    for var in THREAD_VARS:
        os.environ[var] = str(threads)
    import torch

    torch.set_num_threads(threads)


def _capture_failures() -> int:
    """CUDA-graph captures that failed so far in this process. Every capture goes through engine/capture.py, so a
    process that never imported it has captured nothing (and the benchmark alone need not import the engine)."""
    module = sys.modules.get("transbench.engine.capture")
    return module.failures if module is not None else 0


def _device(device_str: str):
    try:
        import torch

        return torch.device("cuda", 0 if ":" not in device_str else int(device_str.split(":")[1])) \
            if device_str.startswith("cuda") else torch.device("cpu")
    except Exception:
        return None


def failure(device_str: str, exc, unsupported_cls, dev, memory, caught) -> CellResult:
    """A failed cell's result: oom (device memory freed), unsupported (with the kernels' own reasons) or
    error with its message and traceback."""
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if dev.is_oom(exc):
        traceback.clear_frames(exc.__traceback__)  # frames hold the tensors that filled the device
        device = dev.resolve(device_str)
        dev.free_memory(device)
        return CellResult("oom", info={"memory_at_failure": memory.current(device)}, error=message)
    why = [str(w.message).splitlines()[0] for w in caught if "kernel" in str(w.message).lower()]
    if isinstance(exc, unsupported_cls) or any(s in str(exc) for s in ("No available kernel", "No viable backend")):
        return CellResult("unsupported", error="; ".join([str(exc).splitlines()[0], *why[:4]]))
    return CellResult("error", error=message, info={"traceback": traceback.format_exc()[-4000:]})


def _interference() -> list[str]:
    from ..measure import device as dev

    others = [p for p in dev.nvml_other_processes(0) if p != env_int("TRANSBENCH_PARENT_PID", -1, -1, 1 << 31)]
    return [f"other processes on the GPU: {others}"] if others else []


def _release(cell: dict) -> float | None:
    """Free what the cell left behind; what is still allocated afterwards, in MiB."""
    from ..measure import memory

    device = _device(cell.get("device", "cpu"))
    if device is None:
        return None
    memory.release(device)
    return memory.allocated_mb(device)


def _die_with_parent() -> None:
    """A sweep killed by SIGKILL (`kill -9`, the OOM killer) runs no cleanup: its worker went on with the cell, a hung
    one for ever, holding its device and memory. The kernel now ends it with the sweep (Linux; as runner/rank.py
    does for a rank). The signal follows the thread that started the worker: its lane's, which stops the worker before
    it ends (runner/sweep.py lane_loop)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != env_int("TRANSBENCH_PARENT_PID", -1, -1, 1 << 31):  # the sweep died before the line above
        os._exit(1)


def _child_main(conn, env: dict, log_path: str) -> None:
    os.environ.update(env)
    _die_with_parent()
    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    # A cell may say how it is getting on (what it prepares, i of n): sent to the parent beside the result
    # (Worker.run's on_progress), as ("progress", text) where a result is (dict, float).
    apply_cpus()
    threads = os.environ.get("TRANSBENCH_THREADS", "")
    apply_threads(int(threads) if threads.isdigit() else None)
    import torch  # noqa: F401 - start-up (apply_threads may not have): every cell's execute() needs it

    state: dict = {"progress": lambda text: conn.send(("progress", str(text)))}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        target, cell = msg
        try:  # the cell's code is start-up too (a later cell of this worker finds it imported): then its clock starts
            importlib.import_module(target.partition(":")[0])
        except Exception:  # noqa: BLE001 - execute() makes the same failure the cell's result
            pass
        conn.send(("started", ""))
        result = execute(target, cell, state)
        left = _release(cell)
        conn.send((result.to_dict(), left))


@contextmanager
def temp_files(what: str):
    """Where a sweep makes a file in the temporary folder (a worker's log, a launched cell's folder): a full or
    read-only /tmp, often another file system than the store's, was an OSError traceback mid-sweep; it is one line
    that says the stored cells are whole and how to go on."""
    try:
        yield
    except OSError as exc:
        raise SpecError(f"cannot make {what} in the temporary folder {tempfile.gettempdir()} ({exc.strerror or exc}): "
                        "free space there, or set TMPDIR to a folder with room; the cells stored before are whole: "
                        "rerun the same command with the run's --name to go on") from None


def start_without_main(proc) -> None:
    """Start a spawned process without re-running the user's script in it. Spawn re-imports `__main__`
    from its file (or module name) in every child, so a script that calls the API at module level, with
    no `if __name__ == "__main__":` guard, would run again there and fail. Workers need nothing
    from `__main__` (targets are named by module path), so the file and spec are hidden while the child
    is prepared, and the API needs no guard."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            if "__spec__" in main.__dict__:
                main.__spec__ = None
        proc.start()
    finally:
        if main is not None:
            main.__dict__.update(saved)


class Worker:
    """A spawned child that runs cells one at a time; killed and replaced after a timeout or crash."""

    def __init__(self, env: dict | None = None):
        ctx = mp.get_context("spawn")
        with temp_files("a worker's log file"):
            fd, self.log_path = tempfile.mkstemp(prefix="transbench-worker-", suffix=".log")
        os.close(fd)
        self.conn, child = ctx.Pipe()
        env = {"TRANSBENCH_PARENT_PID": str(os.getpid()), **(env or {})}
        self.proc = ctx.Process(target=_child_main, args=(child, env, self.log_path), daemon=True)
        start_without_main(self.proc)
        child.close()
        self.left_mb: float | None = None  # what the last cell left allocated after its release

    def alive(self) -> bool:
        return self.proc.is_alive()

    def run(self, target: str, cell: dict, timeout: float, on_progress=None) -> CellResult:
        """The cell's result. `timeout` counts from the worker's word that the cell started (WORKER_START_S)."""
        try:
            self.conn.send((target, cell))
            started = False
            deadline = time.monotonic() + min(start_limit(timeout), LONGEST_WAIT_S)
            while True:
                if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                    tail = self._log_tail()
                    self.stop(kill=True)
                    error = (f"no result within the {timeout:g} s deadline" if started else
                             f"the worker did not start within {start_limit(timeout):g} s (importing torch and the "
                             "cell's code)")
                    return CellResult("timeout", error=error, info={"log_tail": tail})
                msg = self.conn.recv()
                if msg[0] == "started":  # start-up is over: the cell's own clock starts
                    started = True
                    deadline = time.monotonic() + min(timeout, LONGEST_WAIT_S)
                    continue
                if isinstance(msg[0], str):  # ("progress", text): the cell is getting on; its deadline stands
                    if on_progress is not None:
                        on_progress(msg[1])
                    continue
                result, self.left_mb = msg
                return CellResult.from_dict(result)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self.proc.join(5)
            code = self.proc.exitcode
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
            tail = self._log_tail()
            self.stop(kill=True)
            return CellResult("error", error=f"worker process {how}", info={"log_tail": tail})
        except BaseException:
            # Ctrl-C or SIGTERM (cli/app.py) while the cell runs: its result is lost either way (a resume measures
            # it again), and the sweep's graceful stop waited up to 10 s for the cell to end before killing it.
            self.stop(kill=True)
            raise

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-LOG_TAIL_CHARS:]
        except OSError:
            return ""

    def stop(self, kill: bool = False) -> None:
        if self.proc.is_alive():
            if kill:
                self.proc.kill()
            else:
                try:
                    self.conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
        self.conn.close()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass
