"""Run-to-run comparison: is a change a real regression or noise?

Cells of two runs are matched on their stored cell key (the `key` column of the cells table), which holds
every setting that changes what is measured; settings outside it (timing parameters such as --min-time)
may differ. A cell in one run only is listed with the reason.

For each matched pair of ok cells, the verdict comes from the raw per-call samples, in the time order they
were stored:
1. Block medians. A cell's n samples are cut into m = floor(sqrt(n)) blocks of floor(n / m) consecutive
   samples (the first n - m * floor(n / m) samples, nearest the warm-up, fewer than one block, are left out)
   and each block is replaced by its median. Why: per-call samples drift (clock, temperature) and are
   autocorrelated, so they are not n independent draws; a per-sample Mann-Whitney U test called two
   identical back-to-back H100 runs `slower` with p = 6.7e-45 (issue 21). Medians of blocks of
   consecutive samples are close to independent once a block outlasts the correlation, and sqrt(n) blocks
   of sqrt(n) samples is the classical batch-means choice (Flegal and Jones 2010) that lets both the block
   length and the block count grow with n.
2. A percentile bootstrap interval of median(B's block medians) / median(A's block medians): RESAMPLES
   resamples of each side's block medians with replacement, from a fixed seed, so the same data always
   give the same verdict; its level is 1 - alpha (95% by default).
3. `slower` when the whole interval lies above 1 + min_effect, `faster` when it lies below 1 - min_effect,
   else `same`: a change must be both outside the noise and larger than what the gate cares about.
4. Fewer than MIN_BLOCKS blocks on either side (under 25 samples): `n/a`, with a note to time longer, unless
   the two sides do not overlap at all (`separated`): every sample of B above (1 + min_effect) x A's largest is
   `slower`, every one below (1 - min_effect) x A's smallest `faster`, where the chance of that order with no
   change, 1 / C(n_a + n_b, n_b) for exchangeable samples, is under alpha / 2. A regression severe enough to cut
   a cell's samples under --min-time (500x slower: 5 samples) was `n/a`, and the gate passed it.
A cell that was ok in A and is not in B (OOM, wrong, error, ...) is `broken`; the reverse is `fixed`.
Everything is numpy and the standard library; rule 4's count is math.comb, exact Python integers at any n."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..boundary import loads_json
from ..errors import SpecError
from ..store import Store
from .data import load
from .document import STATUS_TEXT, Table, num

# Verdicts that fail a pipeline gate (`transbench compare` exits 1).
REGRESSIONS = ("slower", "broken")
# max-batch cells are matched on everything but the batch they found: their latencies are not comparable.
NOT_COMPARED = ("max-batch",)
# Five blocks is the fewest whose bootstrapped median is not one of two or three values: it needs 25
# samples; any cell timed for the default --min-time 1 s at under 40 ms per call has them.
MIN_BLOCKS = 5
RESAMPLES = 2000
SEED = 0


@dataclass(frozen=True)
class CompareConfig:
    alpha: float = 0.05  # the interval's level is 1 - alpha
    min_effect: float = 0.03

    def __post_init__(self):
        if not 0 < self.alpha < 1:
            raise SpecError(f"--alpha {self.alpha} must be between 0 and 1 (0.05 = a 95% interval)")
        if not 0 <= self.min_effect < 10:
            # 10 (1000%) and above was refused with "must be a fraction >= 0", which it is: say the bound
            raise SpecError(f"--min-effect {self.min_effect} must be a fraction >= 0 and below 10 (0.03 = 3%)")


@dataclass
class CellComparison:
    record_a: dict
    record_b: dict
    median_a: float | None
    median_b: float | None
    ratio: float | None  # B / A median latency
    interval: tuple[float, float] | None  # bootstrap interval of the ratio of block medians
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
                + f" ({percent(1 - self.config.alpha)} interval, min effect {percent(self.config.min_effect)})")


def percent(x: float) -> str:
    """A fraction as a percentage to 3 significant digits, more where that would round onto 0% or 100%: `:.0%`
    printed --min-effect 0.001 as "min effect 0%" (and -0.0 as "-0%"), and --alpha 0.001 as a "100% interval"."""
    p = x * 100 + 0.0
    for digits in range(3, 13):
        text = f"{p:.{digits}g}"
        if p in (0.0, 100.0) or float(text) not in (0.0, 100.0):
            break
    return text + "%"


def block_medians(samples: list[float]) -> np.ndarray:
    """Medians of floor(sqrt(n)) blocks of consecutive samples (the oldest remainder left out)."""
    x = np.asarray(samples, dtype=np.float64)
    m = math.isqrt(len(x))
    if m == 0:
        return x
    size = len(x) // m
    return np.median(x[len(x) - m * size:].reshape(m, size), axis=1)


def ratio_interval(blocks_a: np.ndarray, blocks_b: np.ndarray, alpha: float) -> tuple[float, float]:
    """Percentile bootstrap interval (level 1 - alpha) of median(blocks_b) / median(blocks_a)."""
    rng = np.random.default_rng(SEED)
    med_a = np.median(blocks_a[rng.integers(0, len(blocks_a), (RESAMPLES, len(blocks_a)))], axis=1)
    med_b = np.median(blocks_b[rng.integers(0, len(blocks_b), (RESAMPLES, len(blocks_b)))], axis=1)
    lo, hi = np.quantile(med_b / med_a, [alpha / 2, 1 - alpha / 2])
    if np.array_equal(np.sort(blocks_a), np.sort(blocks_b)):
        # The same block medians on both sides (a run compared with itself): the exact bootstrap distribution of
        # the ratio is then symmetric about 1 (in log), so its interval at any level holds 1. Only the Monte Carlo
        # error of RESAMPLES draws can move it off 1, and did: a run against itself at --alpha 0.99
        # --min-effect 0 was `slower` (exit 1) or `faster` for about 1 cell in 50.
        lo, hi = min(lo, 1.0), max(hi, 1.0)
    return float(lo), float(hi)


def longer(scenario: object) -> str:
    """The option that gives a cell of this scenario more samples: a serve cell's samples are its requests
    and a training cell's its steps, and neither command has the --min-time the n/a note named."""
    text = str(scenario or "")
    return ("--duration or --rate" if text.startswith("serve") else "--steps" if text.startswith("training")
            else "--min-time")


def separated(samples_a: list[float], samples_b: list[float], cfg: CompareConfig) -> tuple[str, str] | None:
    """(verdict, note) for samples too few for blocks whose two sides do not overlap beyond the min effect (the
    module's rule 4), else None."""
    if not samples_a or not samples_b:
        return None
    chance = 1 / math.comb(len(samples_a) + len(samples_b), len(samples_b))
    if chance >= cfg.alpha / 2:
        return None
    for verdict, apart, side in (("slower", min(samples_b) > max(samples_a) * (1 + cfg.min_effect), "above"),
                                 ("faster", max(samples_b) < min(samples_a) * (1 - cfg.min_effect), "below")):
        if apart:
            return verdict, (f"{len(samples_a)} + {len(samples_b)} samples, too few for an interval; every one of B's "
                             f"is {side} A's by over {percent(cfg.min_effect)} (chance with no change {chance:.1e})")
    return None


def judge(samples_a: list[float], samples_b: list[float], median_a: float, median_b: float,
          cfg: CompareConfig, scenario: object = None) -> tuple[float, tuple[float, float] | None, str, str]:
    """(ratio B/A, interval, verdict, note) for two cells that were both ok (of `scenario`: the note's hint)."""
    ratio = median_b / median_a
    blocks_a, blocks_b = block_medians(samples_a), block_medians(samples_b)
    if min(len(blocks_a), len(blocks_b)) < MIN_BLOCKS:
        apart = separated(samples_a, samples_b, cfg)
        if apart:
            return ratio, None, *apart
        need = MIN_BLOCKS * MIN_BLOCKS
        hint = "time longer (--min-time)" if longer(scenario) == "--min-time" else f"raise {longer(scenario)}"
        return ratio, None, "n/a", (f"{len(samples_a)} + {len(samples_b)} samples: a verdict needs {need} per "
                                    f"cell; {hint}")
    lo, hi = ratio_interval(blocks_a, blocks_b, cfg.alpha)
    if lo > 1 + cfg.min_effect:
        return ratio, (lo, hi), "slower", ""
    if hi < 1 - cfg.min_effect:
        return ratio, (lo, hi), "faster", ""
    if lo > 1 or hi < 1:
        return ratio, (lo, hi), "same", f"a change, but not all of it beyond the {percent(cfg.min_effect)} min effect"
    return ratio, (lo, hi), "same", ""


def _median(rec: dict) -> float | None:
    if rec.get("latency_ms"):
        return rec["latency_ms"]
    return statistics.median(rec["_samples"]) if rec.get("_samples") else None


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def settings(rec: dict) -> dict[str, object]:
    """The settings the record's stored cell key holds, by name. A JSON-object key names them; a list key
    does not, so each value is named by the first field of the record (contract order: the identity
    fields come first) that holds it, else by its position."""
    try:  # through the input boundary: a stored key is a row read back, its nesting bounded
        key = loads_json(rec["_key"], "cell key", fix="")
    except SpecError:  # a key that is not JSON (a store written through Store.put_cell) is one setting, as it is
        key = rec["_key"]
    if isinstance(key, dict):
        return key
    out: dict[str, object] = {}
    for i, value in enumerate(key if isinstance(key, list) else [key]):
        name = next((f for f, v in rec.items() if f not in out and not f.startswith(("_", "run_"))
                     and _same(v, value)), f"#{i}")
        out[name] = value
    return out


def _value(v: object) -> str:
    # A setting is shown as it was given (seq_stdev=16, not 16.00): it names the cell, it is not a measurement.
    return f"{v:g}" if isinstance(v, float) else str(v)


def _text(values: dict[str, object], names) -> str:
    return " ".join(f"{n}={_value(values[n])}" for n in names if n in values)


def varying(records: list[dict]) -> list[str]:
    """Names of the key settings that differ between these records (or that some lack), in key order."""
    all_settings = [settings(r) for r in records]
    names = list(dict.fromkeys(n for s in all_settings for n in s))
    return [n for n in names
            if any(n not in s or not _same(s[n], all_settings[0].get(n)) for s in all_settings)]


def common(records: list[dict]) -> str:
    """The key settings every record shares, as `name=value` text."""
    if not records:
        return ""
    vary = set(varying(records))
    first = settings(records[0])
    return _text(first, [n for n in first if n not in vary])


def _why_unmatched(rec: dict, others: list[tuple[object, dict]], other: str) -> str:
    """Reason a cell has no partner: the other run's nearest cell (same scenario, settings as
    (scenario, settings) pairs) when it differs in at most two settings."""
    mine = settings(rec)
    best: list[str] | None = None
    best_settings: dict = {}
    for scenario, theirs in others:
        if scenario != rec.get("scenario"):
            continue
        diff = [n for n in dict.fromkeys([*mine, *theirs]) if not _same(mine.get(n), theirs.get(n))]
        if best is None or len(diff) < len(best):
            best, best_settings = diff, theirs
    shown = _text(best_settings, best) if best and len(best) <= 2 else ""
    return f"not in {other} ({other} has {shown})" if shown else f"not in {other}"


def hardware(rec: dict) -> tuple[str | None, str | None]:
    """Where a cell ran: (device type, GPU name), None where the record does not say (the GPU of a cell that
    failed before it saw one). cuda:0 and cuda:1 are one device type; GPUs tell apart by their name."""
    device = str(rec.get("device") or "").split(":")[0] or None
    return device, (rec.get("gpu") or None) if device != "cpu" else None


def other_hardware(a: dict, b: dict) -> bool:
    """Two cells known to have run on different hardware (what is unknown on one side does not count)."""
    return any(x is not None and y is not None and x != y for x, y in zip(hardware(a), hardware(b)))


def hardware_text(rec: dict) -> str:
    device, gpu = hardware(rec)
    return f"{device or 'an unknown device'}" + (f" ({gpu})" if gpu else "")


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
        if other_hardware(ra, rb):
            # The key names what runs, not where: a cpu cell against a cuda one (or an A100 against an H100)
            # would judge the machines, and pass or fail a gate for that. Listed, not paired.
            out.only_a.append({**ra, "_why": f"B ran it on {hardware_text(rb)}, A on {hardware_text(ra)}"})
            out.only_b.append({**rb, "_why": f"A ran it on {hardware_text(ra)}, B on {hardware_text(rb)}"})
            continue
        ok_a, ok_b = ra["status"] == "ok", rb["status"] == "ok"
        ma, mb = (_median(ra) if ok_a else None), (_median(rb) if ok_b else None)
        if ok_a and not ok_b:
            out.cells.append(CellComparison(ra, rb, ma, None, None, None, "broken", f"B is {rb['status']}"))
        elif ok_b and not ok_a:
            out.cells.append(CellComparison(ra, rb, None, mb, None, None, "fixed", f"A was {ra['status']}"))
        elif not ok_a or not ma or mb is None:
            # "no latency in either run" was also said where one of them had one
            why = (f"A {ra['status']}, B {rb['status']}" if not ok_a
                   else "no latency in either run" if not ma and mb is None
                   else "no latency in A" if not ma else "no latency in B")
            out.cells.append(CellComparison(ra, rb, ma, mb, None, None, "n/a", why))
        else:
            ratio, interval, verdict, note = judge(ra["_samples"], rb["_samples"], ma, mb, cfg, ra.get("scenario"))
            out.cells.append(CellComparison(ra, rb, ma, mb, ratio, interval, verdict, note))
    return out


def compare(db: str, run_a: str, run_b: str, cfg: CompareConfig | None = None) -> Comparison:
    """Compare two stored runs (names, ids or 'last') of one store. Runs without one pair of cells are a
    SpecError: a gate that compared nothing must not pass."""
    cfg = cfg or CompareConfig()
    store = Store(db, readonly=True)  # a missing or foreign store is refused without a file left behind
    try:
        da, db_ = load(store, [run_a]), load(store, [run_b])
    finally:
        store.close()
    cmp = compare_records(da.runs[0], da.records, db_.runs[0], db_.records, cfg)
    why = nothing_compared(cmp)
    if why is not None:
        raise SpecError(why)
    return cmp


def nothing_compared(cmp: Comparison) -> str | None:
    """Why two runs share no measured cell to compare, or None where they share one. `report` shows this line
    where `compare` refuses the runs: its comparison of two runs of other kinds was an empty table."""
    # Cells that ran on other hardware are not paired; where that leaves only pairs of failed cells (whose
    # records may not name their GPU), the runs are of two machines and nothing was compared. Pairs failed in
    # both runs alone compare nothing either: every verdict was n/a and the gate passed.
    if any("ok" in (c.record_a["status"], c.record_b["status"]) for c in cmp.cells):
        return None
    a, b = cmp.run_a, cmp.run_b
    moved = next((r for r in cmp.only_a if "_why" in r), None)
    if a["kind"] != b["kind"]:
        why = f"'{a['name']}' holds {a['kind']} cells, '{b['name']}' {b['kind']} cells"
    elif moved is not None:
        why = (f"their cells ran on other hardware ({moved['_why']}): their latencies would compare the "
               "machines, not the code")
    elif cmp.cells:
        why = (f"the {len(cmp.cells)} cell(s) they share ran ok in neither (A: {_statuses(c.record_a for c in cmp.cells)};"
               f" B: {_statuses(c.record_b for c in cmp.cells)}): fix what failed and run them again")
    else:
        why = ("no cell of one has the settings of a cell of the other (`transbench runs --spec RUN` prints "
               "a run's grid)")
    return f"runs '{a['name']}' and '{b['name']}' share no cell to compare: {why}"


def _statuses(records) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(Counter(r["status"] for r in records).items()))


def _state(rec: dict, median: float | None) -> str:
    return num(median) if rec["status"] == "ok" else STATUS_TEXT.get(rec["status"], rec["status"])


def comparison_table(cmp: Comparison) -> Table:
    """One row per matched cell: the key settings that vary between the cells (`cell`; those all share are
    in the title), both medians, B/A, its interval and the verdict."""
    records = [c.record_a for c in cmp.cells]
    vary = varying(records)
    rows = []
    for c in cmp.cells:
        interval = "" if c.interval is None else f"{c.interval[0]:.3f}-{c.interval[1]:.3f}"
        rows.append(([_text(settings(c.record_a), vary)] if vary else []) + [
            _state(c.record_a, c.median_a), _state(c.record_b, c.median_b),
            "" if c.ratio is None else f"{c.ratio:.3f}", interval, c.verdict, c.note])
    headers = (["cell"] if vary else []) + ["A ms", "B ms", "B/A", f"{percent(1 - cmp.config.alpha)} interval",
                                            "verdict", "note"]
    shared = common(records)
    title = f"A = {cmp.run_a['name']}, B = {cmp.run_b['name']}" + (f"; every cell: {shared}" if shared else "")
    return Table(title, headers, rows, cmp.summary())


def unmatched_table(cmp: Comparison) -> Table | None:
    if not (cmp.only_a or cmp.only_b):
        return None
    rows = []
    for side, recs, other, others in (("A", cmp.only_a, "B", cmp.only_b), ("B", cmp.only_b, "A", cmp.only_a)):
        parsed = [(o.get("scenario"), settings(o)) for o in others]
        for r in recs:
            rows.append([f"only in {side}", _text(settings(r), settings(r)),
                         STATUS_TEXT.get(r["status"], r["status"]), r.get("_why") or _why_unmatched(r, parsed, other)])
    return Table("cells in one run only", ["in", "cell", "status", "why"], rows)
