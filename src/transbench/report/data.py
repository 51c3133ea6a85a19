"""What a report reads from the store: the runs, their flat records, and each cell's raw samples."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError
from ..store import Store, export

OK = "ok"


@dataclass
class ReportData:
    runs: list[dict]  # Store.find_run dicts, in the order asked for
    # export.records rows plus private keys: _key, _samples (Store.cells' numpy float64 array; empty for a cell
    # that is not ok), _baseline, _run (index into runs), _series (one run's backend: "backend", or "run/backend"
    # in a report of several runs) and _label (its column in a table: see shared_columns)
    records: list[dict]
    baselines: dict[str, str | None]  # run_id -> the backend its speedup and mem_saved are against

    @property
    def multi_run(self) -> bool:
        return len(self.runs) > 1


def spec_baseline(run: dict) -> str | None:
    return run["spec"].get("baseline") if isinstance(run["spec"], dict) else None


def effective_baseline(explicit: str | None, run: dict, recs: list[dict]) -> str | None:
    """--baseline, else the run spec's baseline, else eager when the run has it (as in the seeds' study)."""
    if explicit or spec_baseline(run):
        return explicit or spec_baseline(run)
    return "eager" if any(r.get("backend") == "eager" for r in recs) else None


def load(store: Store, run_refs: list[str], baseline: str | None = None) -> ReportData:
    runs = []
    for ref in run_refs or ["last"]:
        run = store.find_run(ref)
        if run is None:
            hint = "the store has no runs yet" if not store.runs() else "`transbench runs` lists them"
            raise SpecError(f"no run '{ref}' in {store.path}: {hint}")
        if run["run_id"] not in {r["run_id"] for r in runs}:
            runs.append(run)
    records: list[dict] = []
    baselines: dict[str, str | None] = {}
    for index, run in enumerate(runs):
        # export keeps the contract: no speed for a cell that is not ok. The cells are read once: export.records
        # read them again for the records, and each cell's samples were decoded twice.
        cells = store.cells(run["run_id"])
        recs = export.run_records(run, cells, baseline)
        base = effective_baseline(baseline, run, recs)
        if base and not (baseline or spec_baseline(run)):
            export.apply_baseline(recs, base)
        baselines[run["run_id"]] = base
        for rec, cell in zip(recs, cells, strict=True):
            rec["_key"] = cell["key"]
            rec["_samples"] = cell["samples"] if cell["status"] == OK else cell["samples"][:0]
            rec["_baseline"] = base
            rec["_run"] = index
            rec["_series"] = variant(rec) if len(runs) == 1 else f"{run['name']}/{variant(rec)}"
        records += recs
    shared_columns(records)
    # `is not None`: `--baseline ''` fell back to the run's own baseline without a word
    export.check_baseline(baseline, records)
    return ReportData(runs, records, baselines)


# The cell key's settings besides the point (Cell.identity): records that differ in one of them measured other
# inputs (variable lengths, another activation, ...).
GRID_SETTINGS = ("seq_stdev", "embeddings", "activation", "seed", "nproc", "new_tokens", "compile_mode")


def variant(rec: dict) -> str:
    """What a report's columns and plot lines are per: the backend, and its quant where it has one
    (`sdpa int8-dynamic`), so the quantized cells of a backend are not taken for a second run of it."""
    quant = rec.get("quant")
    return str(rec.get("backend")) if quant in (None, "none") else f"{rec.get('backend')} {quant}"


def shared_columns(records: list[dict]) -> None:
    """Set each record's _label: runs that measure different points of one grid (say batch 1 in one run,
    batch 256 in another) share one column per backend, rows per point. A backend's records stay split
    by run (_series) where two of them measure the same point, or they ran on different devices: one
    column would then have to pick a value or mix hardware."""
    by_backend: dict[tuple, list[dict]] = {}
    for r in records:
        by_backend.setdefault((r.get("scenario"), variant(r)), []).append(r)
    for recs in by_backend.values():
        points = [(*export.point(r), r.get("world_size"), r.get("strategy")) for r in recs]
        devices = {r.get("device") for r in recs}
        gpus = {r.get("gpu") for r in recs if r.get("gpu")}
        # Runs with other settings of the cell key (--seq-stdev, --activation, ...) are not one grid: batch 1 of
        # a fixed-length run and batch 2 of a variable-length one shared a column, the table saying neither.
        settings = {tuple(repr(r.get(k)) for k in GRID_SETTINGS) for r in recs}
        shared = len(set(points)) == len(points) and len(devices) <= 1 and len(gpus) <= 1 and len(settings) <= 1
        for r in recs:
            r["_label"] = variant(r) if shared else r["_series"]


def is_ok(rec: dict, key: str | None = None) -> bool:
    """A record whose value may be shown as a measurement."""
    return rec.get("status") == OK and (key is None or rec.get(key) is not None)


def by_scenario(records: list[dict], scenario: str) -> list[dict]:
    return [r for r in records if r.get("scenario") == scenario]


def groups(records: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in records:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return dict(sorted(out.items(), key=lambda kv: _order(kv[0])))


def _order(values: tuple) -> tuple:
    """Numbers in numeric order (batch 8 before 64), then text, then None."""
    return tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) if v is not None else (2, 0, "")
                 for v in values)


def sorted_values(records: list[dict], key: str) -> list:
    return sorted({r.get(key) for r in records if r.get(key) is not None})
