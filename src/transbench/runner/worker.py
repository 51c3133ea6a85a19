"""Child-process isolation: cells run in a spawned worker with a deadline; a crash, a signal or a hang
ends that cell's worker, never the sweep. A worker keeps its built models between cells."""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import traceback
import warnings

from ..cells import Cell, CellResult

LOG_TAIL_CHARS = 2000


def execute(cell: Cell, cache) -> CellResult:
    """Run one cell in this process and map every failure to a status."""
    from ..errors import Unsupported
    from ..measure import device as dev
    from ..measure import memory

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if cell.scenario == "generation":
                from ..scenarios import generation as scenario
            else:
                from ..scenarios import inference as scenario
            result = scenario.run(cell, cache)
        except Exception as exc:  # every failure of a cell is a result, not a crash
            result = _failure(cell, exc, Unsupported, dev, memory, caught)
    if cell.device.startswith("cuda"):
        result.warnings += _interference(cell)
    return result


def _failure(cell, exc, unsupported_cls, dev, memory, caught) -> CellResult:
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if dev.is_oom(exc):
        traceback.clear_frames(exc.__traceback__)  # frames hold the tensors that filled the device
        device = dev.resolve(cell.device)
        dev.free_memory(device)
        return CellResult("oom", info={"memory_at_failure": memory.current(device)}, error=message)
    why = [str(w.message).splitlines()[0] for w in caught if "kernel" in str(w.message).lower()]
    if isinstance(exc, unsupported_cls) or any(s in str(exc) for s in ("No available kernel", "No viable backend")):
        return CellResult("unsupported", error="; ".join([str(exc).splitlines()[0], *why[:4]]))
    return CellResult("error", error=message, info={"traceback": traceback.format_exc()[-4000:]})


def _interference(cell: Cell) -> list[str]:
    from ..measure import device as dev

    index = int(cell.device.split(":")[1]) if ":" in cell.device else 0
    out = []
    others = [p for p in dev.nvml_other_processes(index) if p != int(os.environ.get("TRANSBENCH_PARENT_PID", -1))]
    if others:
        out.append(f"other processes on the GPU: {others}")
    throttled = dev.nvml_throttle_reasons(index)
    if throttled:
        out.append(f"clocks throttled: {', '.join(throttled)}")
    return out


def _child_main(conn, env: dict, log_path: str) -> None:
    os.environ.update(env)
    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    from ..scenarios.inference import ModelCache

    cache = ModelCache()
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        conn.send(execute(Cell.from_dict(msg), cache).to_dict())


class Worker:
    """A spawned child that runs cells one at a time; killed and replaced after a timeout or crash."""

    def __init__(self, env: dict | None = None):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        fd, self.log_path = tempfile.mkstemp(prefix="transbench-worker-", suffix=".log")
        os.close(fd)
        env = {"TRANSBENCH_PARENT_PID": str(os.getpid()), **(env or {})}
        self.proc = ctx.Process(target=_child_main, args=(child, env, self.log_path), daemon=True)
        self.proc.start()
        child.close()

    def alive(self) -> bool:
        return self.proc.is_alive()

    def run(self, cell: Cell, timeout: float) -> CellResult:
        try:
            self.conn.send(cell.to_dict())
            if not self.conn.poll(timeout):
                tail = self._log_tail()
                self.stop(kill=True)
                return CellResult("timeout", error=f"no result within the {timeout:g} s deadline",
                                  info={"log_tail": tail})
            return CellResult.from_dict(self.conn.recv())
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self.proc.join(5)
            code = self.proc.exitcode
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
            tail = self._log_tail()
            self.stop(kill=True)
            return CellResult("error", error=f"worker process {how}", info={"log_tail": tail})

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
