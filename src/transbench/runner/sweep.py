"""The one sweep loop of every scenario: resume by run name, OOM skipping (also across a resume), the
max-batch search, one worker per GPU lane, one SQLite transaction per finished cell.

A scenario supplies its cells and a `Target` (how one cell is measured); this module names no scenario.
A cell is any frozen dataclass with `batch`, `scenario`, `key()` (its identity in a run: every setting
that changes what is measured), `oom_group()` (cells that differ only in batch), `record_fields()` (the
identity as flat record keys) and `to_dict()` / `from_dict()`."""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..cells import CellResult
from ..errors import SpecError
# Spec settings a resumed run may change (where and how long cells run, not what they measure): one set with
# merge's, which joins the shards of one run.
from ..store.db import RESUMABLE, RunExists, cell_problem, new_run_ident
from .worker import Worker


@dataclass(frozen=True)
class Target:
    """How a scenario's cells are measured: `measure` ('module:function', called as function(cell_dict,
    state) in a worker process kept between cells, `state` a dict the scenario keeps built models in), or
    `launch(cell) -> (module, LaunchConfig)` for a process tree per cell (torchrun ranks, whose module
    runs `runner.rank.main`)."""

    cell_type: type  # rebuilds stored cells (which batches were out of memory before a resume)
    measure: str | None = None
    launch: Callable[[Any], tuple] | None = None
    # Called with (store, run_id, cell, result) before a result is stored (training's scaling efficiency).
    after: Callable[..., None] | None = None


# How long an interrupted sweep waits for a lane to end once its worker is killed (worker.py waits up to 5 s for a
# dead worker's exit code, then 10 s to stop it).
LANE_STOP_S = 20.0


@dataclass
class SweepOptions:
    timeout: float = 900.0
    gpus: list[int] | None = None  # one worker per listed GPU; None: one worker
    max_batch: bool = False
    max_batch_limit: int = 65536
    # The search bisects its last gap down to 1/resolution of the batch: 32 for `run --max-batch`; the
    # training ladder takes 4, as each of its probes is a process that builds the model and trains.
    max_batch_resolution: int = 32
    progress: Callable | None = None  # (cell, text): a running cell's word on how it is getting on
    # Compute threads of every worker (torch, OpenMP, MKL), set before any work; None: the cores this process may
    # use (measure/load.available_cores), which torch's own default (the machine's cores) may exceed.
    threads: int | None = None
    # Each cell measured this many times, each in a fresh worker process, one after another (runner/repeat.py).
    repeat: int = 1


def flat_record(cell, result: CellResult) -> dict:
    """The cell's record, with the host that ran it: the shards of one grid, run on several hosts and merged, keep
    where each cell ran (the run's environment names each host's GPUs by UUID)."""
    return {**cell.record_fields(), **result.record, "status": result.status, "error": result.error,
            "host": socket.gethostname()}


def store_result(store, run_id: str, cell, result: CellResult, key: str | None = None,
                 scenario: str | None = None) -> None:
    rec = flat_record(cell, result)
    why = cell_problem(rec, result.samples_ms)
    if why is not None:
        # A figure no store row holds (a negative or infinite rate from an endpoint's usage counts): stored, every
        # later read of the store would refuse it as damaged. The cell is an error, its figures left out.
        result = CellResult("error", info=result.info, warnings=result.warnings,
                            error=f"the measurement gave {why}: a figure no store holds, so none is kept")
        rec = flat_record(cell, result)
        why = cell_problem(rec, [])
        if why is not None:  # the cell's own settings: validation refuses them first (none is known to reach here)
            raise SpecError(f"the cell's settings give {why}: a store cannot hold them, and nothing of the cell "
                            "was stored")
    if scenario:
        rec["scenario"] = scenario
    store.put_cell(run_id, key or cell.key(), scenario or cell.scenario, result.status, rec,
                   cell=cell.to_dict(), samples=result.samples_ms, info=result.info, warnings=result.warnings)


def check_same_grid(stored: dict, given: dict, name: str) -> None:
    """A run name reused with a different grid would mix two grids in one run: refuse it."""
    differ = sorted(k for k in set(stored) | set(given)
                    if k not in RESUMABLE and stored.get(k) != given.get(k))
    if differ:
        shown = ", ".join(f"{k} {json.dumps(stored.get(k))} -> {json.dumps(given.get(k))}" for k in differ[:3])
        raise SpecError(f"run '{name}' already holds a different grid ({shown}): repeat its options to "
                        "resume it, or choose another --name")


def open_run(store, kind: str, spec: dict, name: str | None, env: Callable[[], dict],
             keys: set[str] | None = None) -> tuple[str, str, int]:
    """(run_id, name, cells already stored, of `keys` where given: a shard's own, not its sibling shards'
    in the same store): the named run when it exists (same grid, else SpecError), else a new run."""
    # By its exact name: find_run would also take another run's id or 'last' (the newest run) and add this
    # sweep's cells to that run.
    # The name is held for this process before anything is looked up or measured (store.claim): a second process
    # on it refuses, where both had measured and the later one's cell replaced the other's.
    part = str(spec.get("shard") or "")
    # A run the user did not name is named here, so its name is held before its row is written: a lock refused
    # after the insert left an empty run in the store, exit 2.
    run_id, name = (None, name) if name else new_run_ident(kind)
    store.claim(name, part)
    existing = store.run_named(name)
    if existing is None:
        try:
            run_id, name = store.create_run(name, kind, spec, env(), run_id=run_id)
            return run_id, name, 0
        except RunExists:  # made meanwhile by another process (two shards started at once): resume it
            existing = store.run_named(name)
            if existing is None:  # the id is another name's: nothing to resume
                raise
    if existing["kind"] != kind:
        # the kinds' names as `runs` lists them: "is a inference run" named neither what the run is nor this command's
        raise SpecError(f"run '{name}' is of kind {existing['kind']}, and this command stores {kind} runs: choose "
                        "another --name")
    check_same_grid(existing["spec"], spec, name)
    stored = store.finished_keys(existing["run_id"])
    return existing["run_id"], existing["name"], len(stored if keys is None else stored & keys)


class _Interrupted(Exception):
    """A lane's cell ended because the sweep was interrupted (run_grid): its result is not the cell's."""


def _siblings(cpu: int) -> frozenset[int]:
    """The logical CPUs that share `cpu`'s physical core (its hyperthreads), from sysfs; the CPU alone where the
    kernel does not say."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            text = f.read().strip()
    except OSError:
        return frozenset({cpu})
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if lo.strip().isdigit() and (not hi or hi.strip().isdigit()):
            out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out) if cpu in out else frozenset({cpu})


def lane_cores(lanes: int) -> list[list[int] | None]:
    """The host cores of each of `lanes` lanes: disjoint slices of this process's affinity, so one lane's model
    build or CPU reference does not run on the cores another lane launches its kernels from. A slice takes whole
    physical cores (a core's hyperthreads stay in one lane), since two lanes' launch threads on the two halves of
    one core slow each other down. Measured on 4 x H100 with unpinned lanes
    (benchmarks/results/multi_gpu_h100x4_2026-11.md): the host-bound cells of one lane moved by factors of 0.778
    to 1.518 while the other lanes kept 40.17 to 50.78 cores busy. One lane, or fewer cores than lanes: no pinning."""
    from ..measure.load import available_cores

    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(available_cores()))
    if lanes <= 1 or len(cpus) < lanes:
        return [None] * max(1, lanes)
    mine, groups, seen = set(cpus), [], set()
    for c in cpus:  # physical cores in order of their first CPU, each the CPUs of it this process may use
        if c not in seen:
            group = sorted(_siblings(c) & mine) or [c]
            seen.update(group)
            groups.append(group)
    if len(groups) < lanes:  # fewer physical cores than lanes: split the logical CPUs instead
        groups = [[c] for c in cpus]
    size, extra = divmod(len(groups), lanes)
    out, start = [], 0
    for i in range(lanes):
        end = start + size + (1 if i < extra else 0)
        out.append(sorted(c for g in groups[start:end] for c in g))
        start = end
    return out


class _Lane:
    """One GPU (or the one device) and its worker; the worker is replaced after a timeout, a crash, a cell
    that left device memory behind, or a cell whose info names `fresh_worker_after`: it changed the process in a way
    later cells would measure (a compile cell's CUDA graphs, backends/compile.py GRAPH_MODES; a failed capture,
    runner/worker.py). `stopping`, once set, ends the lane: no cell starts, and the one it was running raises
    _Interrupted instead of returning the result its killed worker gave."""

    def __init__(self, gpu: int | None, target: Target, stopping: threading.Event | None = None,
                 progress: Callable | None = None, threads: int | None = None, cpus: list[int] | None = None):
        from ..measure.load import available_cores
        from .worker import THREAD_VARS

        self.gpu, self.target, self.progress = gpu, target, progress
        self.threads = threads or (len(cpus) if cpus else available_cores())
        self.env = {"TRANSBENCH_THREADS": str(self.threads), **{v: str(self.threads) for v in THREAD_VARS}}
        self.cpus = cpus
        # Always set, empty for a lane of no cores of its own: a TRANSBENCH_CPUS in the user's environment reached the
        # workers, pinned every cell to cores no option had named, and one too large for the kernel's CPU set killed
        # every worker, each cell stored as `error` with no reason, exit 0.
        self.env["TRANSBENCH_CPUS"] = ",".join(map(str, cpus)) if cpus else ""
        if gpu is not None:
            self.env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        self._thread_vars = ("TRANSBENCH_THREADS", *THREAD_VARS)
        self.worker: Worker | None = None
        self.stopping = stopping

    def _check(self) -> None:
        if self.stopping is not None and self.stopping.is_set():
            raise _Interrupted

    def interrupt(self) -> None:
        """From another thread: end the cell this lane's worker is running (the lane's own thread cleans up)."""
        worker = self.worker
        if worker is not None:
            worker.proc.kill()

    def run(self, cell, timeout: float, repeat: int = 1) -> CellResult:
        """The cell's result; with `repeat` > 1, measured that many times, each in a fresh worker (repeat.py)."""
        from .repeat import combine

        if repeat <= 1:
            self._check()
            result = self._run(cell, timeout)
            self._check()
            return result
        results = []
        for _ in range(repeat):
            self.close()  # a fresh process for every repeat: what one process shares is not a repeat
            self._check()
            results.append(self._run(cell, timeout))
            self._check()
            if results[-1].status != "ok":
                break
        self.close()
        return combine(results, repeat)

    def _run(self, cell, timeout: float) -> CellResult:
        if self.target.launch is not None:
            result = self._launch(cell, timeout)
        else:
            if self.worker is None or not self.worker.alive():
                self.worker = Worker(self.env)
                self._check()  # interrupted while the worker started: interrupt() found none to end
            job = (self.target.measure, cell.to_dict(), timeout)
            result = self.worker.run(*job) if self.progress is None else \
                self.worker.run(*job, on_progress=lambda text, cell=cell: self.progress(cell, text))
            left = self.worker.left_mb if self.worker.alive() else None
            if not self.worker.alive():
                self.worker = None
            elif result.info.get("fresh_worker_after"):
                self.close()
            elif left is not None:
                from ..measure.memory import LEFTOVER_MB

                if left > LEFTOVER_MB:  # the next cell must not start on this one's leftovers
                    result.info["worker_replaced_mb_left"] = left
                    self.close()
        if self.gpu is not None:  # the worker sees its GPU as cuda:0: keep which physical one it was
            result.info["lane_gpu"] = self.gpu
        if self.cpus:
            result.info["lane_cpus"] = f"{len(self.cpus)} cores from {self.cpus[0]}"
        return result

    def _launch(self, cell, timeout: float) -> CellResult:
        from . import launch

        from ..measure import load

        module, cfg = self.target.launch(cell)
        # --threads is the cell's: its ranks share it (torchrun's own default, 1 a rank, left cores idle on a CPU)
        per_rank = str(max(1, self.threads // max(1, cfg.nproc)))
        cfg = replace(cfg, timeout=timeout, env={**cfg.env, **self.env, **dict.fromkeys(self._thread_vars, per_rank)})
        with load.Watch() as watch:  # the ranks are this process's children: their own work is not counted
            result = launch.outcome(launch.launch(module, cell.to_dict(), cfg), cfg)
        result.record.update(load.record(watch.busy, self.threads))  # the threads every rank was given
        gpu = str(getattr(cell, "device", "")).startswith("cuda")
        if load.competing(watch.busy, 1 if gpu else self.threads):
            result.warnings.append(load.warning(watch.busy, self.threads))
        return result

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None


def _device_type(device) -> str:
    return str(device or "").split(":")[0]


def check_same_device(stored: list[dict], todo: list) -> None:
    """A resumed run measures its other cells on the device type its stored cells ran on. The stored spec says
    `--device auto`, so a run killed on a GPU host and resumed where no GPU is visible had the same grid and
    went on on the CPU: one run, two machines, its tables and its comparisons mixing them."""
    ran = {_device_type(c["cell"].get("device")) for c in stored} - {""}
    new = {_device_type(getattr(c, "device", None)) for c in todo} - {""}
    if ran and new - ran:
        raise SpecError(f"this run's stored cells ran on {', '.join(sorted(ran))}, and its other cells would run on "
                        f"{', '.join(sorted(new - ran))} here: resume it where a {sorted(ran)[0]} device is visible, "
                        "or choose another --name")


def prior_ooms(store, run_id: str, cell_type: type) -> dict:
    """The smallest out-of-memory batch of each OOM group already stored in this run."""
    out: dict = {}
    for c in store.cells(run_id, cell_type):
        if c["status"] == "oom":
            try:
                cell = cell_type.from_dict(c["cell"])
            except TypeError:  # a cell stored by another version of transbench
                continue
            g = cell.oom_group()
            out[g] = min(out.get(g, cell.batch), cell.batch)
    return out


def run_grid(store, run_id: str, cells: list, target: Target, opts: SweepOptions,
             on_cell: Callable[[Any, CellResult | None], None] = lambda c, r: None,
             on_probe: Callable[[Any, CellResult], None] = lambda c, r: None) -> None:
    """Run every cell not yet stored for this run. Cells of one OOM group go to one lane, in batch order;
    a batch above one that ran out of memory (now or before a resume) is `skipped`."""
    done = store.finished_keys(run_id)
    rows = store.cells(run_id, target.cell_type)  # its `cell` columns checked: the resume builds cells from them
    check_same_device(rows, [c for c in cells if c.key() not in done])
    stored = {c["key"]: c for c in rows} if opts.max_batch else {}
    prior_oom = prior_ooms(store, run_id, target.cell_type)
    groups: dict = {}
    for c in cells:
        groups.setdefault(c.oom_group(), []).append(c)
    work: queue.Queue = queue.Queue()
    for g in groups.values():
        work.put(sorted(g, key=lambda c: c.batch))
    lock = threading.Lock()
    stopping = threading.Event()  # set when the sweep is interrupted: every lane ends (several lanes, below)
    lanes: list[_Lane] = []

    def finish(cell, result: CellResult) -> None:
        with lock:
            if target.after is not None:
                target.after(store, run_id, cell, result)
            store_result(store, run_id, cell, result)
            on_cell(cell, result)

    gpus = opts.gpus or [None]
    shares = dict(zip(gpus, lane_cores(len(gpus))))

    def lane_loop(gpu: int | None) -> None:
        lane = _Lane(gpu, target, stopping, opts.progress, opts.threads, shares.get(gpu))
        lanes.append(lane)
        try:
            while True:
                try:
                    group = work.get_nowait()
                except queue.Empty:
                    return
                oom_at = prior_oom.get(group[0].oom_group())
                # The largest batch of this group that ran and its result: the max-batch search starts
                # there and does not measure it again. A cell stored before (a resume, or a ladder step
                # whose cell an earlier step measured) counts too, else the search would start from 1.
                fitted, known = 1, None
                for cell in group:
                    if cell.key() in done:
                        before = stored.get(cell.key())
                        if before is not None and before["status"] == "ok" and cell.batch >= fitted:
                            fitted, known = cell.batch, CellResult(
                                "ok", before["record"], before["samples"].tolist(), before["info"], before["warnings"])
                        on_cell(cell, None)
                        continue
                    if oom_at is not None and cell.batch > oom_at:
                        result = CellResult("skipped", error=f"batch {oom_at} was out of memory")
                    else:
                        result = (lane.run(cell, opts.timeout, opts.repeat) if opts.repeat > 1
                                  else lane.run(cell, opts.timeout))
                        if result.status == "oom":
                            oom_at = cell.batch if oom_at is None else min(oom_at, cell.batch)
                        elif result.status == "ok" and cell.batch >= fitted:
                            fitted, known = cell.batch, result
                    finish(cell, result)
                if opts.max_batch:
                    search_max_batch(store, run_id, group[0], lane, opts, fitted, done, lock, on_probe, known)
        finally:
            lane.close()

    if len(gpus) == 1:
        lane_loop(gpus[0])
        return
    failures: list[BaseException] = []

    def guarded_lane(gpu: int, ended: threading.Event) -> None:
        try:
            lane_loop(gpu)
        except BaseException as exc:  # a full disk in one lane stops the sweep, as it does with one lane
            failures.append(exc)
            while True:  # the other lanes take no new group
                try:
                    work.get_nowait()
                except queue.Empty:
                    break
        finally:
            ended.set()

    # Waited for through events, not Thread.join: a join that Ctrl-C interrupts marks its thread as ended while it
    # still runs (CPython 3.11's bpo-45274 handling releases the running thread's own lock), so a second join
    # returned at once.
    ended = [threading.Event() for _ in gpus]
    for g, e in zip(gpus, ended):
        threading.Thread(target=guarded_lane, args=(g, e), daemon=True).start()
    try:
        for e in ended:
            e.wait()
    except BaseException:
        # Ctrl-C or SIGTERM (cli/app.py) reaches the main thread only. Left alone, the lanes went on after run_grid
        # had raised: a hung cell's worker outlived the process, and a lane stored its cell as `error: worker process
        # killed by signal 15` when the interpreter's exit ended that worker, which a resume then skipped as finished.
        stopping.set()
        for lane in list(lanes):
            lane.interrupt()
        for e in ended:
            e.wait(LANE_STOP_S)
        raise
    if failures:
        raise failures[0]


def max_batch_key(cell) -> str:
    return json.dumps({"max-batch": json.loads(replace(cell, batch=0).key())}, sort_keys=True)


def search_max_batch(store, run_id: str, first, lane: _Lane, opts: SweepOptions, fitted: int, done: set,
                     lock, on_probe, known: CellResult | None = None) -> None:
    """The largest batch of `first`'s group, from `fitted` (whose result, when `known`, is not measured
    again), stored under max_batch_key."""
    key = max_batch_key(first)
    if key in done:
        return
    tried: list[tuple[int, str]] = []

    def probe(b: int) -> CellResult:
        r = lane.run(replace(first, batch=b), opts.timeout)
        tried.append((b, r.status))
        on_probe(replace(first, batch=b), r)
        return r

    if known is not None:
        tried.append((fitted, known.status))
    result, best = find_max_batch(probe, opts.max_batch_limit, start=fitted, known=known,
                                  resolution=opts.max_batch_resolution)
    result.info = {**result.info, "probes": tried}  # the search's trail: which batches fitted, which did not
    capped = best is not None and best * 2 > opts.max_batch_limit and all(s == "ok" for _, s in tried)
    if capped:  # it never ran out of memory: the answer is the cap, not the largest batch that fits
        # named for both commands: `run` has no --max-batch-limit option, only the spec key
        result.warnings.append(f"batch {best} is the search's cap ({opts.max_batch_limit}: train's --max-batch-limit, "
                               "run's spec key max_batch_limit), not the largest batch that fits: raise the limit to "
                               "search further")
        result.info["capped"] = True
    stopped = next(((b, s) for b, s in tried if s not in ("ok", "oom")), None)
    if best is not None and stopped is not None:  # a timeout or a crash is no answer to "does it fit"
        result.warnings.append(f"the search stopped at batch {stopped[0]}, which ended {stopped[1]}, not out of "
                               f"memory: the largest batch that fits may be above {best}")
        result.info["stopped_at"] = stopped[0]
    status = "ok" if best else result.status
    answer = CellResult(status, result.record, result.samples_ms, result.info, result.warnings, result.error)
    with lock:
        store_result(store, run_id, replace(first, batch=best or 0), answer, key=key, scenario="max-batch")
    # The answer with its own warnings (the cap, a search cut short), which no probe carried and were only stored;
    # told from a probe by its trail, info["probes"].
    on_probe(replace(first, batch=best or 0), answer)


def find_max_batch(probe: Callable[[int], CellResult], limit: int = 65536, start: int = 1,
                   known: CellResult | None = None, resolution: int = 32) -> tuple[CellResult, int | None]:
    """The largest batch whose cell is not out of memory: double from `start` (a batch known to fit
    saves the small probes; `known`, its result, saves probing it again), then bisect the last gap down to
    1/`resolution` of the batch (32: exact below 64; a probe of a batch in the thousands costs a full
    forward each, and 3% is finer than run-to-run memory noise).
    Returns the result at that batch (its throughput) and the batch, or (first failure, None)."""
    if start > limit:  # a batch above the cap already ran (a ladder's --batch): answer at the cap, probed
        start, known = limit, None
    best: tuple[int, CellResult] | None = None
    batch, failed_at = start, None
    while batch <= limit:
        r = known if known is not None and batch == start else probe(batch)
        if r.status == "ok":
            best = (batch, r)
            if batch == limit:
                break
            # Doubling past the cap probes the cap itself: on an H100 a checkpointed bert-large ladder step at
            # 384 (23.6 GB) stopped there under --max-batch-limit 512 without trying 512.
            batch = min(batch * 2, limit)
            continue
        if r.status != "oom":
            return (best[1], best[0]) if best else (r, None)
        failed_at = batch
        break
    if best is None:
        return r, None
    if failed_at is not None:
        lo, hi = best[0], failed_at  # lo fits, hi does not
        while hi - lo > max(1, lo // resolution):
            mid = (lo + hi) // 2
            r = probe(mid)
            if r.status == "ok":
                lo, best = mid, (mid, r)
            elif r.status == "oom":
                hi = mid
            else:
                break
    return best[1], best[0]
