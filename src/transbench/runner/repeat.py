"""A cell measured N times (`run --repeat N`), each time in a fresh worker process, as one stored result.

Order: a cell's repeats run one after another (cell 1 repeat 1, cell 1 repeat 2, ..., then cell 2), each in a
new process. Round-robin (every cell once, then every cell again) would spread slow drift more evenly, but a
cell would then be finished only in the last round: the sweep's one transaction per finished cell, its resume
and its out-of-memory skipping all work on whole cells, and a sweep stopped half-way would hold no usable cell.
What repeats must capture is what one process shares between its calls (allocator state, thread placement,
which cores it got, a warm or cold cache of the model): a fresh process per repeat captures it, in either
order.

The stored record is the median repeat's (the lower of the two middle ones for an even N), so its latency,
throughput and FLOPS stay one measurement's consistent figures; `repeat_medians_ms` holds every repeat's median
latency, `latency_repeat_min_ms` / `latency_repeat_max_ms` their range (tables show it), and the stored samples
are every repeat's, in time order (`n_samples` counts them all). The spread (p90, p99, IQR) is over those stored
samples, the count `n_samples` states: the median repeat's own spread rested on a third of them at N = 3, and a
reader recomputing p99 from the stored samples got another figure (0.75 ms stored, 2.03 ms over the samples).
`compare` judges two repeated runs on their repeat medians (report/compare.py, rule 5)."""

from __future__ import annotations

from ..cells import CellResult
from ..measure.timer import summarize

# A spread of the repeat medians (max - min over their median) above this is worth a line: the processes
# disagreed more than the noisy threshold of one cell's calls (measure/timer.py NOISY_IQR_RATIO).
SPREAD_WARN = 0.05


def combine(results: list[CellResult], asked: int) -> CellResult:
    """One result for a cell's repeats. A repeat that did not end ok ends the cell with its status (the later
    repeats are not run): its failure is the cell's answer, as one run's would be."""
    last = results[-1]
    if last.status != "ok" or any(r.status != "ok" for r in results):
        failed = next(r for r in results if r.status != "ok")
        failed.info = {**failed.info, "repeat_failed": len(results), "repeats": asked}
        if len(results) > 1:
            failed.warnings = [*failed.warnings, f"repeat {len(results)} of {asked} ended {failed.status}; the "
                                                 f"{len(results) - 1} before it were ok"]
        return failed
    medians = [r.record.get("latency_ms") for r in results]
    if any(not isinstance(m, (int, float)) for m in medians):  # a cell with no latency: its last repeat stands
        last.info = {**last.info, "repeats": asked}
        return last
    order = sorted(range(len(results)), key=lambda i: medians[i])
    middle = results[order[(len(order) - 1) // 2]]
    samples = [s for r in results for s in (r.samples_ms or [])]
    record = {**middle.record, "repeats": len(results), "repeat_medians_ms": medians,
              "latency_repeat_min_ms": min(medians), "latency_repeat_max_ms": max(medians),
              "n_samples": len(samples) if samples else middle.record.get("n_samples")}
    if samples:  # the spread of the samples stored and counted, not of the median repeat's alone
        pooled = summarize(samples)
        tails = {"latency_p90_ms": pooled.p90_ms, "latency_p99_ms": pooled.p99_ms, "latency_iqr_ms": pooled.iqr_ms}
        record.update({key: value for key, value in tails.items() if key in middle.record})
    warnings = list(middle.warnings)
    for r in results:  # another repeat's busy neighbours are the cell's too
        warnings += [w for w in r.warnings if w.startswith("busy:") and w not in warnings]
    centre = sorted(medians)[(len(medians) - 1) // 2]
    spread = (max(medians) - min(medians)) / centre if centre else 0.0
    if spread > SPREAD_WARN:
        warnings.append(f"repeats: the {len(medians)} processes' medians spread {spread:.1%} "
                        f"({min(medians):.4g}-{max(medians):.4g} ms): the run-to-run noise a comparison must see past")
    info = {**middle.info, "repeats": len(results), "repeat_samples": [len(r.samples_ms or []) for r in results]}
    return CellResult("ok", record, samples, info, warnings, middle.error)
