"""The CPU a cell ran on: the threads it used and what else was busy on the machine.

Why: on a 2-core machine, sdpa bert batch 1 read 93.65 ms beside one busy process against 0.81 ms on the quiet
machine (torch's threads competing with it for the cores), and nothing said so. A CPU figure only holds with
the threads it ran with and a machine that was otherwise quiet, so every cell records both, and a cell that
shared its cores warns, as a GPU cell warns of other processes on its GPU.

Linux only (/proc/loadavg, /proc/PID/stat): elsewhere the readings are empty and nothing warns. psutil would read
the same files; it is not a dependency, and this is two small readers."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from ..boundary import env_int
from ..declare import setting
from ..errors import SpecError

# A process counts as busy once it used this share of one core over the window, and the machine as loaded once
# the busy processes together used BUSY_TOTAL cores while the cell's threads needed every core.
BUSY_CORE_SHARE = 0.2
BUSY_TOTAL = 0.5
WINDOW_S = 0.25  # the check before a sweep: long enough to see a busy loop, short beside any sweep
SHOWN = 3  # busy processes named in a warning
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") and "SC_CLK_TCK" in os.sysconf_names else 100


def available_cores() -> int:
    """The cores this process may run on (its affinity mask: a container or `taskset` limits it), else the
    machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# --threads past any machine's cores: refused, not handed to OpenMP.
MAX_THREADS = 4096


def threads_setting():
    """--threads of the commands that run cells in workers (run, micro, serve, train): one declaration, a field in
    each spec."""
    return setting(None, "CPU threads of every worker (torch, OpenMP, MKL; a cell's ranks share them), set before "
                   "any work; recorded per cell", shown="the cores this process may use")


def check_threads(threads: int | None) -> None:
    """--threads None (the cores this process may use) or 1 to MAX_THREADS."""
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise SpecError(f"--threads must be between 1 and {MAX_THREADS}, got {threads} (this process may use "
                        f"{available_cores()} cores)")


def check_cpu_ranks(nproc: int) -> None:
    """Processes of one CPU cell (gloo ranks), each a whole torch process of 150 MB or more: at most one per core
    this process may use. More only time-slice the same cores (the cell measures the host, not the strategy),
    and `train --nproc 2000` on the CPU started processes until the kernel killed the parent, leaving the rest."""
    cores = available_cores()
    if nproc > cores:
        raise SpecError(f"--nproc {nproc} on the CPU: at most one process per core, {cores} here; give --nproc "
                        f"{cores} or fewer")


def load_avg() -> float | None:
    """The one-minute load average (runnable tasks, ours included), None where /proc/loadavg is missing."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_times() -> dict[int, tuple[str, float, int]]:
    """pid -> (command name, CPU seconds so far: user + system, parent pid) of every process readable in /proc."""
    out: dict[int, tuple[str, float, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:  # ended meanwhile, or not ours to read
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ')'
        left, _, rest = text.rpartition(")")
        fields = rest.split()
        try:
            out[int(name)] = (left.partition("(")[2], (int(fields[11]) + int(fields[12])) / _TICK, int(fields[1]))
        except (IndexError, ValueError):
            continue
    return out


def own_family() -> set[int]:
    """This process and the sweep that started it (TRANSBENCH_PARENT_PID): with this process's descendants
    (torch.compile's compile workers; busy_between), the benchmark's own work, which is not load beside it. Other
    children of the sweep are not excluded: another lane's worker takes cores too."""
    pids = {os.getpid()}
    # through the boundary, as the worker reads it (runner/worker.py): isdigit() took '٣' and int() refused a value
    # of over 4,300 digits with a traceback
    parent = env_int("TRANSBENCH_PARENT_PID", None, 0, 1 << 31)
    if parent is not None:
        pids.add(parent)
    return pids


def _descendants(times: dict[int, tuple[str, float, int]], roots: set[int]) -> set[int]:
    out, grew = set(roots), True
    while grew:
        grew = False
        for pid, (_, _, ppid) in times.items():
            if ppid in out and pid not in out:
                out.add(pid)
                grew = True
    return out


@dataclass
class Busy:
    """Other processes' CPU use over a window."""

    seconds: float = 0.0
    processes: list[dict] = field(default_factory=list)  # {pid, name, cores} of the busy ones, busiest first
    # Cores every other process used together, the many that each stayed under BUSY_CORE_SHARE included: on a
    # shared 2-core machine a dozen light processes kept a 1-thread cell at IQR/median 11% with none named busy.
    total: float | None = None

    @property
    def cores(self) -> float:
        return self.total if self.total is not None else sum(p["cores"] for p in self.processes)


def busy_between(before: dict, after: dict, seconds: float, exclude: set[int] | None = None,
                 descendants: bool = True) -> Busy:
    """Processes that used at least BUSY_CORE_SHARE of a core between two cpu_times() readings `seconds` apart,
    other than `exclude` (default: own_family) and, with `descendants`, this process's descendants."""
    exclude = own_family() if exclude is None else set(exclude)
    if descendants:
        exclude |= _descendants(after, {os.getpid()})
    out = Busy(seconds)
    if seconds <= 0:
        return out
    out.total = 0.0
    for pid, (name, t1, _) in after.items():
        if pid in exclude or pid not in before:
            continue
        cores = (t1 - before[pid][1]) / seconds
        out.total += cores
        if cores >= BUSY_CORE_SHARE:
            out.processes.append({"pid": pid, "name": name, "cores": round(cores, 2)})
    out.processes.sort(key=lambda p: -p["cores"])
    out.total = round(out.total, 2)
    return out


class Watch:
    """`with Watch() as w:` around a region; `w.busy` afterwards: the other processes busy during it."""

    def __init__(self, exclude: set[int] | None = None, descendants: bool = True):
        self.exclude, self.descendants = exclude, descendants
        self.busy = Busy()

    def __enter__(self) -> Watch:
        self._before, self._t0 = cpu_times(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.busy = busy_between(self._before, cpu_times(), time.perf_counter() - self._t0, self.exclude,
                                 self.descendants)


def check(window_s: float = WINDOW_S, exclude: set[int] | None = None, descendants: bool = False) -> Busy:
    """Other processes busy now, over a short window. Before a sweep this process has no child of its own work
    yet (its workers start with the sweep), so a child busy now is load like any other (a script that started
    one, or a test's busy loop)."""
    with Watch(exclude, descendants) as w:
        time.sleep(window_s)
    return w.busy


def competing(busy: Busy, threads: int | None, cores: int | None = None) -> bool:
    """Busy processes that took cores the cell's threads needed: together over the cores there are."""
    cores = cores or available_cores()
    return busy.cores >= BUSY_TOTAL and busy.cores + (threads or cores) > cores


def warning(busy: Busy, threads: int | None, where: str = "during this cell") -> str:
    cores = available_cores()
    named = ", ".join(f"{p['name']} (pid {p['pid']}) {p['cores']:.0%} of a core" for p in busy.processes[:SHOWN])
    more = f" and {len(busy.processes) - SHOWN} more" if len(busy.processes) > SHOWN else ""
    named = f" ({named}{more})" if named else " (none over a fifth of a core: many light ones)"
    return (f"busy: other processes used {busy.cores:.2g} of the {cores} cores {where}{named}, beside "
            f"{threads or cores} thread(s) of this benchmark: CPU figures move with that load; measure on a quiet "
            "machine, or with fewer threads than free cores (--threads)")


def record(busy: Busy, threads: int | None) -> dict:
    """The record keys of a cell's CPU context."""
    return {"threads": threads, "load_avg": load_avg(), "busy_processes": busy.processes, "busy_cores": busy.total}
