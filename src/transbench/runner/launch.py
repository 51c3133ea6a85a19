"""Launching one cell in its own process(es): a plain child for one process, torchrun for several ranks
or hosts. A deadline ends the whole process tree; every rank's log tail is kept with the result."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..cells import CellResult
from .rank import READY
from .worker import start_limit, temp_files

# The GPU hosts this runs on need NVLink multicast off; a user's own setting wins.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
LOG_TAIL_CHARS = 2000
KILL_GRACE_S = 5.0
POLL_S = 0.2
# How a cell of several hosts whose ranks never started says so (outcome): torchrun starts a node's ranks only once
# every node joined its rendezvous, and node 0's training run stops at it (scenarios/training/spec.py).
NOT_JOINED = "the other nodes did not join the rendezvous"


@dataclass(frozen=True)
class LaunchConfig:
    nproc: int = 1  # processes on this node
    torchrun: bool = False  # False: one plain process, no process group
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # host:port of node 0, for several hosts
    rdzv_id: str = "transbench"
    timeout: float = 900.0
    env: dict = field(default_factory=dict)  # extra environment for the ranks (NCCL choices)


@dataclass
class Launched:
    results: dict[int, CellResult]  # by rank: rank 0's, and those of failed ranks
    returncode: int | None
    timed_out: bool
    logs: dict[str, str]  # log file name -> its tail
    wall_s: float
    started: bool = True  # every rank of this host started (a timeout before that was the start-up's)


def environment(extra: dict) -> dict:
    env = dict(os.environ)
    for k, v in SAFE_ENV.items():
        env.setdefault(k, v)
    env.update(extra)
    package_root = str(Path(__file__).resolve().parents[2])  # the children import this same transbench
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def command(module: str, workdir: Path, cfg: LaunchConfig) -> list[str]:
    cmd = [sys.executable]
    if cfg.torchrun:
        cmd += ["-m", "torch.distributed.run", f"--nproc-per-node={cfg.nproc}", f"--nnodes={cfg.nnodes}",
                "--max-restarts=0"]
        if cfg.nnodes == 1:
            cmd.append("--standalone")  # a free local port for the rendezvous
        else:
            # torch's join_timeout (600 s by default) set past the start-up limit (_wait), so that the limit ends a
            # rendezvous the other nodes never joined, with outcome's NOT_JOINED line: torch's 600 s came first
            # under the default --timeout 900, an `error` cell whose line was a rendezvous exception's
            join = math.ceil(start_limit(cfg.timeout) + 2 * KILL_GRACE_S)
            cmd += [f"--node-rank={cfg.node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={cfg.rdzv_endpoint}",
                    f"--rdzv-id={cfg.rdzv_id}", f"--rdzv-conf=join_timeout={join}"]
    return cmd + ["-m", module, "--cell", str(workdir / "cell.json"), "--out", str(workdir)]


def _ours(workdir: Path) -> list[int]:
    """Live processes of this launch: every one carries the launch's unique folder in its command line."""
    mark = str(workdir).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _stop(proc: subprocess.Popen, workdir: Path) -> None:
    """SIGTERM first (torchrun then stops its ranks itself), SIGKILL whatever is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _kill_leftovers(workdir)
    proc.wait()


def _kill_leftovers(workdir: Path) -> None:
    if not Path("/proc").is_dir():
        return
    for pid in _ours(workdir):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + KILL_GRACE_S
    while _ours(workdir) and time.monotonic() < deadline:
        time.sleep(POLL_S)


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return ""


def _wait(proc: subprocess.Popen, workdir: Path, cfg: LaunchConfig, started: float) -> tuple[int | None, bool]:
    """(return code, None past the deadline; whether every rank of this host started). The deadline is
    cfg.timeout from when the last of this host's ranks said it started (runner/rank.py), before that the
    start-up's own limit (worker.start_limit) from the launch."""
    ready_at = None
    while True:
        if ready_at is None and len(list(workdir.glob(READY + "*"))) >= cfg.nproc:
            ready_at = time.monotonic()
        deadline = started + start_limit(cfg.timeout) if ready_at is None else ready_at + cfg.timeout
        try:
            return proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic()))), ready_at is not None
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                return None, ready_at is not None


def launch(module: str, payload: dict, cfg: LaunchConfig) -> Launched:
    """Run `python -m module --cell ... --out ...` (through torchrun when cfg.torchrun) until it ends or
    its deadline passes; no process of it is left running afterwards."""
    with temp_files("a launched cell's folder"):
        workdir = Path(tempfile.mkdtemp(prefix="transbench-launch-"))
    try:
        with temp_files("a launched cell's folder"):
            (workdir / "cell.json").write_text(json.dumps(payload))
        started = time.monotonic()
        with open(workdir / "launcher.log", "w") as log:
            proc = subprocess.Popen(command(module, workdir, cfg), env=environment(cfg.env), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc, ready = _wait(proc, workdir, cfg, started)
                timed_out = rc is None
                if timed_out:
                    _stop(proc, workdir)
            except BaseException:  # Ctrl-C: take the ranks down with us
                _stop(proc, workdir)
                raise
        _kill_leftovers(workdir)  # a rank that outlived its launcher
        results = {}
        for f in sorted(workdir.glob("result-rank*.json")):
            results[int(f.stem.removeprefix("result-rank"))] = CellResult.from_dict(json.loads(f.read_text()))
        logs = {f.name: _tail(f) for f in sorted(workdir.glob("*.log"))}
        return Launched(results, rc, timed_out, logs, time.monotonic() - started, ready)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def outcome(launched: Launched, cfg: LaunchConfig) -> CellResult:
    """The cell's result: rank 0's, else the first failed rank's, else a timeout or an error, with the
    ranks' log tails kept whenever it is not ok."""
    res = launched.results
    if 0 in res:
        result = res[0]
    elif res:
        result = res[min(res)]
    elif launched.timed_out:
        silent = [name for name, text in launched.logs.items() if name.startswith("rank") and not text.strip()]
        limit = start_limit(cfg.timeout)
        what = (f"no result within the {cfg.timeout:g} s deadline" if launched.started else
                f"{NOT_JOINED} at {cfg.rdzv_endpoint} within {limit:g} s (or the ranks' start-up took that long)"
                if cfg.nnodes > 1 else f"the ranks did not start within {limit:g} s (importing torch, the rendezvous)")
        result = CellResult("timeout", error=what + (f" (no output from {', '.join(silent)})" if silent else ""))
    elif launched.returncode == 0 and cfg.node_rank > 0:
        result = CellResult("ok", info={"note": "this node's ranks finished; node 0 stores the result"})
    else:
        why = next((_last_line(t) for n, t in sorted(launched.logs.items()) if n.startswith("rank") and t.strip()),
                   _last_line(launched.logs.get("launcher.log", "")))
        # A process the OS killed (the OOM killer's SIGKILL) has a negative code and often no line: said as a run's
        # worker says it (runner/worker.py), not "exited with code -9 and no result: ".
        code = launched.returncode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        result = CellResult("error", error=f"{how} and no result" + (f": {why}" if why else ""))
    result.info = {**result.info, "wall_s": launched.wall_s}
    if result.status != "ok":
        result.info["logs"] = launched.logs
    return result
