"""Running a grid: resume, OOM skipping, max-batch search, one worker per GPU, storing each cell."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..store import Store
from ..cells import Cell, CellResult
from .worker import Worker


def flat_record(cell: Cell, result: CellResult) -> dict:
    return {
        "scenario": cell.scenario, "model": cell.model, "task": cell.task, "backend": cell.backend,
        "dtype": cell.dtype, "device": cell.device, "batch_size": cell.batch, "seq_len": cell.seq,
        **result.record, "status": result.status, "error": result.error,
    }


def store_result(store: Store, run_id: str, cell: Cell, result: CellResult, key: str | None = None) -> None:
    store.put_cell(run_id, key or cell.key(), cell.scenario, result.status, flat_record(cell, result),
                   cell=cell.to_dict(), samples=result.samples_ms, info=result.info, warnings=result.warnings)


@dataclass
class SweepOptions:
    timeout: float = 900.0
    gpus: list[int] | None = None  # one worker per listed GPU; None: one worker
    max_batch: bool = False
    max_batch_limit: int = 65536


class _Lane:
    """One worker and the cells it owns; replaced after a timeout or crash."""

    def __init__(self, gpu: int | None):
        self.gpu = gpu
        self.env = {} if gpu is None else {"CUDA_VISIBLE_DEVICES": str(gpu)}
        self.worker: Worker | None = None

    def run(self, cell: Cell, timeout: float) -> CellResult:
        if self.worker is None or not self.worker.alive():
            self.worker = Worker(self.env)
        result = self.worker.run(cell, timeout)
        if self.gpu is not None:  # the worker sees its GPU as cuda:0: keep which physical one it was
            result.info["lane_gpu"] = self.gpu
        if not self.worker.alive():
            self.worker = None
        return result

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None


def run_grid(store: Store, run_id: str, cells: list[Cell], opts: SweepOptions,
             on_cell: Callable[[Cell, CellResult | None], None] = lambda c, r: None) -> None:
    """Run every cell not yet stored for this run. Cells of one OOM group go to one lane, in batch order."""
    done = store.finished_keys(run_id)
    prior_oom: dict[tuple, int] = {}
    for c in store.cells(run_id):
        if c["status"] == "oom":
            cell = Cell.from_dict(c["cell"])
            prior_oom[cell.oom_group()] = min(prior_oom.get(cell.oom_group(), cell.batch), cell.batch)
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.oom_group(), []).append(c)
    work: queue.Queue = queue.Queue()
    for g in groups.values():
        work.put(g)
    lock = threading.Lock()

    def lane_loop(gpu: int | None) -> None:
        lane = _Lane(gpu)
        try:
            while True:
                try:
                    group = work.get_nowait()
                except queue.Empty:
                    return
                oom_at = prior_oom.get(group[0].oom_group())
                fitted = 1  # the largest batch of this group that ran: the max-batch search starts there
                for cell in group:
                    if cell.key() in done:
                        on_cell(cell, None)
                        continue
                    if oom_at is not None and cell.batch > oom_at:
                        result = CellResult("skipped", error=f"batch {oom_at} was out of memory")
                    else:
                        result = lane.run(cell, opts.timeout)
                        if result.status == "oom":
                            oom_at = cell.batch if oom_at is None else min(oom_at, cell.batch)
                        elif result.status == "ok":
                            fitted = max(fitted, cell.batch)
                    with lock:
                        store_result(store, run_id, cell, result)
                        on_cell(cell, result)
                if opts.max_batch:
                    tried: list[tuple[int, str]] = []

                    def probe(b: int) -> CellResult:
                        r = lane.run(replace(group[0], batch=b), opts.timeout)
                        tried.append((b, r.status))
                        return r

                    result, best = find_max_batch(probe, opts.max_batch_limit, start=fitted)
                    result.info["probes"] = tried  # the search's trail: which batches fitted, which did not
                    mcell = replace(group[0], batch=best or 0)
                    rec_key = '["max-batch", ' + group[0].key()[1:]
                    with lock:
                        store.put_cell(run_id, rec_key, "max-batch", "ok" if best else result.status,
                                       {**flat_record(mcell, result), "scenario": "max-batch",
                                        "status": "ok" if best else result.status},
                                       cell=mcell.to_dict(), samples=result.samples_ms, info=result.info)
        finally:
            lane.close()

    lanes = opts.gpus or [None]
    if len(lanes) == 1:
        lane_loop(lanes[0])
        return
    threads = [threading.Thread(target=lane_loop, args=(g,), daemon=True) for g in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def find_max_batch(probe: Callable[[int], CellResult], limit: int = 65536,
                   start: int = 1) -> tuple[CellResult, int | None]:
    """The largest batch whose cell is not out of memory: double from `start` (a batch known to fit
    saves the small probes), then bisect the last gap down to 1/32 of the batch (exact below 64: a probe of
    a batch in the thousands costs a full forward each, and 3% is finer than run-to-run memory noise).
    Returns the result at that batch (its throughput) and the batch, or (first failure, None)."""
    best: tuple[int, CellResult] | None = None
    batch, failed_at = start, None
    while batch <= limit:
        r = probe(batch)
        if r.status == "ok":
            best = (batch, r)
            batch *= 2
            continue
        if r.status != "oom":
            return (best[1], best[0]) if best else (r, None)
        failed_at = batch
        break
    if best is None:
        return r, None
    if failed_at is not None:
        lo, hi = best[0], failed_at  # lo fits, hi does not
        while hi - lo > max(1, lo // 32):
            mid = (lo + hi) // 2
            r = probe(mid)
            if r.status == "ok":
                lo, best = mid, (mid, r)
            elif r.status == "oom":
                hi = mid
            else:
                break
    return best[1], best[0]
