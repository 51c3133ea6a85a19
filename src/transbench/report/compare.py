"""Run-to-run comparison: is a change a real regression or noise?

Cells of two runs are matched on their identity (scenario and sweep axes: model, task, backend, dtype,
batch, seq). For each pair: the ratio of median latencies (B / A: above 1 is slower) and a two-sided
Mann-Whitney U test on the raw per-call samples. A cell is `slower` or `faster` only when the difference
is both significant (p < alpha) and large enough (|ratio - 1| >= min_effect); otherwise `same`.
A cell that was ok in A and is not in B (OOM, wrong, error, ...) is `broken`; the reverse is `fixed`."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ..errors import SpecError
from ..store import Store
from .data import load
from .document import STATUS_TEXT, Table, num

# Verdicts that fail a pipeline gate (`transbench compare` exits 1).
REGRESSIONS = ("slower", "broken")
# max-batch cells are matched on everything but the batch they found: their latencies are not comparable.
NOT_COMPARED = ("max-batch",)


@dataclass(frozen=True)
class CompareConfig:
    alpha: float = 0.05
    min_effect: float = 0.03

    def __post_init__(self):
        if not 0 < self.alpha < 1:
            raise SpecError(f"--alpha {self.alpha} must be between 0 and 1 (e.g. 0.05)")
        if not 0 <= self.min_effect < 10:
            raise SpecError(f"--min-effect {self.min_effect} must be a fraction >= 0 (0.03 = 3%)")


@dataclass
class CellComparison:
    record_a: dict
    record_b: dict
    median_a: float | None
    median_b: float | None
    ratio: float | None  # B / A median latency
    p_value: float | None
    verdict: str  # faster | slower | same | broken | fixed | n/a
    note: str = ""


@dataclass
class Comparison:
    run_a: dict
    run_b: dict
    config: CompareConfig
    cells: list[CellComparison] = field(default_factory=list)
    only_a: list[dict] = field(default_factory=list)
    only_b: list[dict] = field(default_factory=list)

    @property
    def regressions(self) -> list[CellComparison]:
        return [c for c in self.cells if c.verdict in REGRESSIONS]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.cells:
            out[c.verdict] = out.get(c.verdict, 0) + 1
        return out

    def summary(self) -> str:
        parts = [f"{n} {v}" for v, n in sorted(self.counts().items())]
        if self.only_a or self.only_b:
            parts.append(f"{len(self.only_a) + len(self.only_b)} unmatched")
        return (f"{self.run_b['name']} vs {self.run_a['name']}: " + (", ".join(parts) or "no cells")
                + f" (alpha {self.config.alpha:g}, min effect {self.config.min_effect:.0%})")


def min_p_value(n_a: int, n_b: int) -> float:
    """The smallest two-sided p the exact Mann-Whitney test can give with these sample counts."""
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a)) if n_a and n_b else 1.0


def judge(samples_a: list[float], samples_b: list[float], median_a: float, median_b: float,
          cfg: CompareConfig) -> tuple[float, float | None, str, str]:
    """(ratio B/A, p, verdict, note) for two cells that were both ok."""
    from scipy.stats import mannwhitneyu

    ratio = median_b / median_a
    if len(samples_a) < 2 or len(samples_b) < 2:
        return ratio, None, "n/a", "too few raw samples for a test"
    p = float(mannwhitneyu(samples_a, samples_b, alternative="two-sided").pvalue)
    note = ""
    if min_p_value(len(samples_a), len(samples_b)) >= cfg.alpha:
        note = f"{len(samples_a)}+{len(samples_b)} samples cannot reach p < {cfg.alpha:g}: time longer"
    if not p < cfg.alpha:
        return ratio, p, "same", note
    if abs(ratio - 1) < cfg.min_effect:
        return ratio, p, "same", f"significant, but under the {cfg.min_effect:.0%} min effect"
    return ratio, p, "slower" if ratio > 1 else "faster", note


def _median(rec: dict) -> float | None:
    if rec.get("latency_ms"):
        return rec["latency_ms"]
    return statistics.median(rec["_samples"]) if rec.get("_samples") else None


def compare_records(run_a: dict, recs_a: list[dict], run_b: dict, recs_b: list[dict],
                    cfg: CompareConfig) -> Comparison:
    def index(recs):
        return {(r.get("scenario"), r["_key"]): r for r in recs if r.get("scenario") not in NOT_COMPARED}

    a, b = index(recs_a), index(recs_b)
    out = Comparison(run_a, run_b, cfg, only_a=[a[k] for k in a if k not in b],
                     only_b=[b[k] for k in b if k not in a])
    for k, ra in a.items():
        rb = b.get(k)
        if rb is None:
            continue
        ok_a, ok_b = ra["status"] == "ok", rb["status"] == "ok"
        ma, mb = (_median(ra) if ok_a else None), (_median(rb) if ok_b else None)
        if ok_a and not ok_b:
            out.cells.append(CellComparison(ra, rb, ma, None, None, None, "broken", f"B is {rb['status']}"))
        elif ok_b and not ok_a:
            out.cells.append(CellComparison(ra, rb, None, mb, None, None, "fixed", f"A was {ra['status']}"))
        elif not ok_a or not ma or mb is None:
            out.cells.append(CellComparison(ra, rb, ma, mb, None, None, "n/a",
                                            "no latency in either run" if ok_a else f"A {ra['status']}, B {rb['status']}"))
        else:
            ratio, p, verdict, note = judge(ra["_samples"], rb["_samples"], ma, mb, cfg)
            out.cells.append(CellComparison(ra, rb, ma, mb, ratio, p, verdict, note))
    return out


def compare(db: str, run_a: str, run_b: str, cfg: CompareConfig | None = None) -> Comparison:
    """Compare two stored runs (names, ids or 'last') of one store."""
    cfg = cfg or CompareConfig()
    store = Store(db, readonly=True)
    try:
        da, db_ = load(store, [run_a]), load(store, [run_b])
    finally:
        store.close()
    return compare_records(da.runs[0], da.records, db_.runs[0], db_.records, cfg)


IDENT = (("scenario", "scenario"), ("model", "model"), ("task", "task"), ("backend", "backend"),
         ("dtype", "dtype"), ("batch_size", "batch"), ("seq_len", "seq"))


def _state(rec: dict, median: float | None) -> str:
    return num(median) if rec["status"] == "ok" else STATUS_TEXT.get(rec["status"], rec["status"])


def comparison_table(cmp: Comparison) -> Table:
    rows = []
    for c in cmp.cells:
        r = c.record_a
        rows.append([num(r.get(k)) for k, _ in IDENT] + [
            _state(c.record_a, c.median_a), _state(c.record_b, c.median_b),
            "" if c.ratio is None else f"{c.ratio:.3f}", "" if c.p_value is None else f"{c.p_value:.2g}",
            c.verdict, c.note])
    headers = [h for _, h in IDENT] + ["A median ms", "B median ms", "B/A", "p", "verdict", "note"]
    return Table(f"A = {cmp.run_a['name']}, B = {cmp.run_b['name']}", headers, rows, cmp.summary())


def unmatched_table(cmp: Comparison) -> Table | None:
    if not (cmp.only_a or cmp.only_b):
        return None
    rows = [[side] + [num(r.get(k)) for k, _ in IDENT] + [STATUS_TEXT.get(r["status"], r["status"])]
            for side, recs in (("A only", cmp.only_a), ("B only", cmp.only_b)) for r in recs]
    return Table("cells in one run only", ["in"] + [h for _, h in IDENT] + ["status"], rows)
