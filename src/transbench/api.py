"""The public Python API. The CLI is a thin layer over these functions.

    from transbench import api
    from transbench.api import RunSpec
    outcome = api.run(RunSpec(models=["bert-tiny"], batches=[1, 8], seqs=[32]), db="bench.db")
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .errors import SpecError
from .measure import env as env_mod
from .measure import load
from .scenarios.inference import cells as grid
from .scenarios.training import spec as training
from .scenarios.training.spec import TrainSpec  # noqa: F401  (api.TrainSpec)
from .cells import Cell, CellResult
from .runner.sweep import SweepOptions, Target, open_run, run_grid
from .scenarios.inference.spec import RunSpec
from .spec import check_once, checked, coerce
from .store import Store, export
from .store.db import Merged, check_sources

if TYPE_CHECKING:  # the engine (and Triton) load when tune runs
    from .engine import EngineOptions


def _path(value, what: str = "db") -> str:
    """A store or output path given in Python: `db=None` made a store named `None` in the current folder."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise SpecError(f"{what} must be a file path (text), got {value!r}")
    return os.fspath(value)


def _names(values, what: str) -> list[str]:
    """Run names, or store paths: one text is a list of one (`records(db, "a")` looked up runs 'a' and 'b'
    of "ab", letter by letter); anything but text is a SpecError, not an AttributeError deep inside."""
    if isinstance(values, (str, os.PathLike)):
        values = [values]
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, (str, os.PathLike)) for v in values):
        raise SpecError(f"{what}: expected a list of names (text), got {values!r}")
    return [os.fspath(v) for v in values]


def _outputs(db: str, json_path, csv_path) -> str:
    """The store and export paths, checked before anything runs, as the CLI does: a bad --json path was
    found only after the whole sweep."""
    db = _path(db)
    export.check_paths(None if json_path is None else _path(json_path, "json_path"),
                       None if csv_path is None else _path(csv_path, "csv_path"), db)
    return db


def _callbacks(**given) -> None:
    """on_start / on_cell / on_probe given as None or a non-function were called only once the store held the new
    run: a TypeError after the store was made, or after the first cell was measured."""
    for what, fn in given.items():
        if not callable(fn):
            raise SpecError(f"{what} must be a function, got {fn!r}")


def _flag(value, what: str) -> bool:
    """resume="no" is a true value: it asked for a resume (and refused a new store) rather than a fresh run."""
    if not isinstance(value, bool):
        raise SpecError(f"{what} must be True or False, got {value!r}")
    return value


@dataclass
class RunOutcome:
    run_id: str
    name: str
    records: list[dict]
    resumed: bool = False


def run(spec: RunSpec, db: str = "transbench.db", *, json_path: str | None = None, csv_path: str | None = None,
        resume: bool = False, on_start: Callable[[list[Cell], int], None] = lambda cells, done: None,
        on_cell: Callable[[Cell, CellResult | None], None] = lambda c, r: None,
        on_probe: Callable[[Cell, CellResult], None] = lambda c, r: None,
        explicit: set[str] | None = None, on_warning: Callable[[str], None] = lambda line: None) -> RunOutcome:
    """Validate, expand and run an inference sweep; every finished cell is stored as it ends.

    A run whose name is already in the store is resumed (its finished cells are not run again); the same
    name with a different grid is refused. `resume=True` without a name resumes the newest run.
    `on_start(cells, already_done)` is called once the grid is known; `on_warning(line)` before the sweep, for
    other processes busy on the CPU (each cell records and warns of its own as well). `explicit`: the fields the
    caller set (the command line's options and --spec keys); None: those that differ from their defaults."""
    asked = checked(RunSpec, spec)  # before the device's defaults fill it: what the caller set (resume below)
    spec = grid.validate(asked)
    db = _outputs(db, json_path, csv_path)
    _flag(resume, "resume")
    _callbacks(on_start=on_start, on_cell=on_cell, on_probe=on_probe, on_warning=on_warning)
    if spec.nproc > 1:
        grid.check_data_parallel(spec)
    cells = grid.expand(spec)
    if resume and not os.path.exists(db):
        raise SpecError(f"nothing to resume: no store at {db}")
    store = Store(db)
    try:
        name = spec.name
        if resume and not name:  # the newest run, with its own grid
            last = store.find_run("last")
            if last is None or last["kind"] != "inference":
                raise SpecError(f"nothing to resume: no inference run in {db}")
            _refuse_ignored_fields(asked, last, explicit)
            spec = grid.validate(RunSpec.from_dict({**last["spec"], "name": last["name"]}))
            cells, name = grid.expand(spec), last["name"]
        elif resume and store.find_run(name) is None:
            raise SpecError(f"nothing to resume: no run named {name} in {db}")
        run_id, name, done = open_run(store, "inference", spec_to_store(spec), name,
                                      lambda: env_mod.collect(open_cuda=False), {c.key() for c in cells})
        on_start(cells, done)
        busy = load.check()
        gpu_only = all(c.device.startswith("cuda") for c in cells)
        if load.competing(busy, 1 if gpu_only else (spec.threads or load.available_cores())):
            on_warning(load.warning(busy, spec.threads or load.available_cores(), "just before this sweep"))
        opts = SweepOptions(spec.timeout, spec.gpus, spec.max_batch, spec.max_batch_limit, threads=spec.threads,
                            repeat=spec.repeat)
        run_grid(store, run_id, cells, inference_target(spec), opts, on_cell, on_probe)
        recs = export.records(store, [run_id])
    finally:
        store.close()
    export.write(recs, json_path, csv_path, db=db)
    return RunOutcome(run_id, name, recs, done > 0)


def _refuse_ignored_fields(asked: RunSpec, last: dict, explicit: set[str] | None) -> None:
    """Resuming without a name resumes the newest run with its own grid, so a field set otherwise would be dropped
    without a word (`--resume --batch 2` after a run of batch 1 measured nothing and said "resumed"): refused,
    naming it. A field equal to the stored one passes; without `explicit`, a field left at its default cannot be
    told from one not given, and passes too."""
    import json

    mine = asked.to_dict()
    if explicit is None:
        default = RunSpec().to_dict()
        explicit = {k for k in mine if mine[k] != default[k]}
    differ = sorted(k for k in explicit if k != "name" and mine.get(k) != last["spec"].get(k))
    if differ:
        listed = ", ".join(f"{k} {json.dumps(last['spec'].get(k))} -> {json.dumps(mine.get(k))}" for k in differ[:3])
        raise SpecError(f"--resume without --name resumes the newest run, '{last['name']}', with its own options, "
                        f"and these differ ({listed}): leave them out, or give --name to resume or start a run "
                        "with them")


def train(spec: TrainSpec, db: str = "transbench.db", **kwargs) -> list[dict]:
    """A training sweep (scenarios/training/spec.py), or with `spec.ladder` the seed notebook's ladder of steps
    for one model (scenarios/training/ladder.py); kwargs: json_path, csv_path, on_start, on_cell."""
    spec = checked(TrainSpec, spec)  # a dict or None: a SpecError, not an AttributeError
    db = _outputs(db, kwargs.get("json_path"), kwargs.get("csv_path"))
    _callbacks(**{k: v for k, v in kwargs.items() if k in ("on_start", "on_cell")})
    if spec.ladder:
        from .scenarios.training.ladder import ladder

        return ladder(training.validate(spec), db, **kwargs)
    return training.train(spec, db, **kwargs)


def inference_target(spec: RunSpec) -> Target:
    """One worker per lane for plain cells; with --nproc, each cell's ranks launched through torchrun."""
    if spec.nproc <= 1:
        return Target(Cell, measure="transbench.scenarios.inference.target:measure")
    from .runner.launch import LaunchConfig

    cfg = LaunchConfig(nproc=spec.nproc, torchrun=True, timeout=spec.timeout)
    return Target(Cell, launch=lambda cell: ("transbench.scenarios.inference.dp", cfg))


def spec_to_store(spec: RunSpec) -> dict:
    """The spec as stored with its run: every axis resolved, so `run --spec` repeats the same grid."""
    return replace(spec, name=None).to_dict()


def runs(db: str = "transbench.db") -> list[dict]:
    store = Store(_path(db), readonly=True)
    try:
        return store.runs()
    finally:
        store.close()


def records(db: str, run_refs: list[str] | None = None, baseline: str | None = None) -> list[dict]:
    run_refs = None if run_refs is None else _names(run_refs, "run_refs")
    if baseline is not None and not isinstance(baseline, str):
        raise SpecError(f"baseline must be a backend name (text), got {baseline!r}")
    store = Store(_path(db), readonly=True)
    try:
        missing = [r for r in (run_refs or []) if store.find_run(r) is None]
        if missing:
            raise SpecError(f"no run {', '.join(missing)} in {db}: `transbench runs` lists them")
        recs = export.records(store, run_refs, baseline)
    finally:
        store.close()
    # as api.report refuses it (report/data.py): a misspelt baseline left every speedup None without a word, and
    # baseline="" fell back to each run's own baseline
    if baseline is not None and not any(r.get("backend") == baseline for r in recs):
        present = sorted({str(r.get("backend")) for r in recs})
        raise SpecError(f"baseline '{baseline}' is not a backend of these runs: use one of {', '.join(present)}")
    return recs


def merge(target: str, sources: list[str]) -> Merged:
    """Join stores (e.g. the shards of one sweep run on several hosts) without duplicate cells: all of them or,
    refused, none. Returns the runs and cells added, and a line per cell stored twice with other results
    (store/db.py merge_from says which copy is kept)."""
    sources = _names(sources, "sources")
    if not sources:  # an empty store was created and "0 new runs" reported
        raise SpecError("merge needs at least one source store")
    target = _path(target, "target")
    check_sources(sources)  # before the target is opened (or created)
    store = Store(target)
    try:
        return store.merge_from(*sources)
    finally:
        store.close()


def environment() -> dict:
    return env_mod.collect(open_cuda=True)


def micro(kind: str, options, db: str = "transbench.db"):
    """A micro-benchmark: kind gemm|bandwidth|layer|breakdown|collectives with its options dataclass
    (transbench.scenarios.micro: GemmOptions, BandwidthOptions, LayerOptions, BreakdownOptions, CollectivesOptions)."""
    from .scenarios.micro import run_micro

    return run_micro(kind, options, _path(db))


def report(db: str = "transbench.db", runs: list[str] | None = None, out_dir: str = "report",
           baseline: str | None = None, **kwargs):
    """report.md, PNG plots and a self-contained report.html for stored runs."""
    from .report import build_report

    # Only None or an empty list is "the newest run", as no run named on the command line: runs="" (a name left
    # empty by mistake) reported the newest run without a word, where records(db, "") and `report ''` refuse it.
    runs = ["last"] if runs is None or (isinstance(runs, list) and not runs) else runs
    return build_report(_path(db), _names(runs, "runs"), _path(out_dir, "out_dir"), baseline, **kwargs)


def compare(db: str, run_a: str, run_b: str, alpha: float = 0.05, min_effect: float = 0.03):
    """Per-cell median ratios B/A with a bootstrap interval over block medians (faster / slower / same)."""
    from .report import CompareConfig
    from .report import compare as compare_runs

    run_a, run_b = _names([run_a, run_b], "runs")  # None or a number: a SpecError, not an AttributeError
    for value, what in ((alpha, "alpha"), (min_effect, "min_effect")):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{what} must be a number, got {value!r}")
    return compare_runs(_path(db), run_a, run_b, CompareConfig(alpha, min_effect))


def tune(model: str, batches: list[int], seqs: list[int], dtype: str = "fp16", device: str = "auto",
         cache_dir: str | None = None, progress: Callable[[dict], None] | None = None,
         options: EngineOptions | None = None) -> list[dict]:
    """Tune the fused engine for every batch x seq of `model` ahead of time (scenarios/tune/run.py); one row
    per shape: batch, seq, seconds, routes (ops of the forward tuned), races (the whole-forward trials).
    options: the engine's launch and tuning switches (transbench.engine.EngineOptions; its tuner is cache_dir's
    table's where cache_dir is given)."""
    from .scenarios.tune import run as tuning
    from .scenarios.tune.spec import TuneSpec

    if progress is not None:  # progress=5 was called only after the first shape's minutes of tuning
        _callbacks(progress=progress)
    if not isinstance(model, (str, os.PathLike)):
        raise SpecError(f"model must be a preset name or a checkpoint folder, got {model!r}"
                        + (": give --model" if model is None else ""))
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):  # was pathlib's TypeError, unnamed
        raise SpecError(f"cache_dir must be a folder path (text), got {cache_dir!r}")
    spec = TuneSpec(**coerce(TuneSpec, {"model": os.fspath(model), "batches": batches, "seqs": seqs, "dtype": dtype,
                                        "device": device, "cache_dir": cache_dir and os.fspath(cache_dir)}))
    return tuning.run(spec, progress, options)


def server(spec, on_ready: Callable = lambda info: None) -> str | None:
    """`transbench server` (scenarios.serve.server_spec.ServerSpec): prepare the backend, call on_ready(info) once it
    listens, and serve until SIGTERM or SIGINT; returns the name of the signal that ended it."""
    from .scenarios.serve import server as srv
    from .scenarios.serve import server_spec

    srv.need_server_extra()
    spec, ref, decoder = server_spec.check(spec)
    return srv.run(spec, ref, decoder, on_ready)


def serve(spec, db: str = "transbench.db", *, json_path: str | None = None, csv_path: str | None = None,
          on_cell: Callable = lambda c, r: None, on_progress: Callable | None = None) -> RunOutcome:
    """A load test (scenarios.serve.spec.ServeSpec): every (backend, load) cell stored as it ends. With
    find_max_rate, per backend an offline cell (the throughput bound), then rate probes (of spec.arrivals) bisecting
    the largest rate whose requests meet the objectives (slo_ms, slo) at the verdict's share (percentile or
    goodput_target) by MLPerf LoadGen's early-stopping rule, each probe stored, then a `serve-max-rate` cell.
    on_progress(cell, text): a running cell's word on its preparation (what, i of n)."""
    from .scenarios.serve import spec as serve_spec
    from .scenarios.serve.cell import ServeCell
    from .scenarios.serve.arrivals import MIN_REQUESTS
    from .scenarios.serve.search import find_max_rate
    from .scenarios.serve.stats import name as percentile_name
    from .runner.sweep import _Lane, store_result

    spec, lengths = serve_spec.check(spec)
    db = _outputs(db, json_path, csv_path)
    _callbacks(on_cell=on_cell, **({} if on_progress is None else {"on_progress": on_progress}))
    # An endpoint's cells send HTTP requests from the worker (scenarios/serve/endpoint.py) instead of serving there.
    target = Target(ServeCell, measure="transbench.scenarios.serve." + ("endpoint" if spec.url else "measure")
                    + ":measure")
    opts = SweepOptions(spec.timeout, progress=on_progress)
    store = Store(db)
    lane = None
    try:
        stored_spec = replace(spec, name=None).to_dict()
        if lengths.source:  # a trace's or a lengths file's digest: resuming a run over a changed file is refused
            stored_spec["lengths_source"] = lengths.source
        run_id, name, done = open_run(store, "serve", stored_spec, spec.name,
                                      lambda: env_mod.collect(open_cuda=False))

        # The search decides each probe from the last one, so it drives one lane (one worker, its models kept
        # between probes) itself instead of a run_grid per probe (a new worker process each).
        lane = _Lane(None, target, progress=on_progress)

        def measured(cell) -> dict | None:
            """Run one cell (or find it stored by an earlier attempt of this run) and return its stored row."""
            if cell.key() not in store.finished_keys(run_id):
                result = lane.run(cell, opts.timeout)
                store_result(store, run_id, cell, result)
                on_cell(cell, result)
            return next((c for c in store.cells(run_id) if c["key"] == cell.key()), None)

        if not spec.find_max_rate:
            run_grid(store, run_id, serve_spec.expand(spec, lengths), target, opts, on_cell)
        for backend in serve_spec.backends(spec) if spec.find_max_rate else []:
            offline = measured(serve_spec.cell(spec, lengths, backend, "offline"))
            summary = serve_spec.cell(spec, lengths, backend, "max-rate")
            if offline is None or offline["status"] != "ok":
                store_result(store, run_id, summary, CellResult(
                    offline["status"] if offline else "error", error="the offline probe did not run: "
                    + ((offline or {}).get("record", {}).get("error") or "see its cell")), scenario="serve-max-rate")
                continue
            share = serve_spec.tail_share(spec)
            # The figure each probe shows beside its verdict: the early-stopping estimate of the latency percentile
            # where the end-to-end latency is the one objective, else the share of requests meeting all of them.
            figure = (f"latency_{percentile_name(round(share * 100, 6))}_upper_ms" if spec.slo is None else "goodput")
            ended: dict[float, str] = {}  # rate -> the status of a probe that did not end ok
            rows: dict[float, dict] = {}

            def probe(rate: float):
                row = measured(serve_spec.cell(spec, lengths, backend, "rate", rate))
                if not row or row["status"] != "ok":
                    ended[rate] = row["status"] if row else "error"
                    return None
                rows[rate] = row["record"]
                value = row["record"].get(figure)
                # An endpoint's percentile that falls on failed requests is stored empty (endpoint.py): the target
                # was missed, which the search must take as a miss, not as a probe that measured nothing.
                if value is None and row["record"].get("failed"):
                    return math.inf, False
                # LoadGen's verdict (stats.account): a probe short of its percentile's requests is never passed
                return value, bool(row["record"].get("slo_met"))

            # A probe's window must end within --timeout, else it can only time out after waiting all of it (a model
            # too slow for the target bisected down to rates whose 20 expected arrivals took longer than that).
            floor = MIN_REQUESTS / max(spec.timeout - spec.warmup, 1e-9)
            best, trail = find_max_rate(probe, spec.slo_ms, offline["record"]["achieved_rate"], lowest=floor)
            trail = [(r, None if lat == math.inf else lat, ok) for r, lat, ok in trail]  # stored as JSON
            rec = {"max_rate": best, "percentile": round(share * 100, 6), "slo_ms": spec.slo_ms,
                   "goodput_target": spec.goodput_target, "arrivals": spec.arrivals,
                   "offline_rate": offline["record"]["achieved_rate"], "prepare_s": offline["record"].get("prepare_s")}
            # The passing probe's own figures beside its rate (its cell holds the rest)
            at_best = rows.get(best, {})
            rec.update({k: v for k, v in at_best.items() if k in (
                "n_requests", "tail_valid", "goodput", "graphs_captured_under_load") or
                (k.startswith("latency_p") and k.endswith("_ms"))})
            # A probe that crashed or timed out ends the search (serve_search.find_max_rate) and answers nothing about
            # the target: with no rate passed before it, 0 would be a rate never measured (as the max-batch search,
            # runner/sweep.py, takes a timeout or a crash for no answer); after one, the answer is a lower bound.
            failed = next(((r, ended[r]) for r, lat, _ in trail if lat is None and r in ended), None)
            if best is None and (failed is not None or not trail):  # not trail: even the first probe was under floor
                why = (f"the probe at {failed[0]:.3g}/s ended {failed[1]} (see its cell)" if failed else
                       f"every rate to probe was under {floor:.3g}/s, whose {MIN_REQUESTS} arrivals would outlast "
                       f"--timeout {spec.timeout:g} s")
                result = CellResult("error", record=rec, info={"probes": trail},
                                    error=f"{why}: no rate was measured against the target")
                store_result(store, run_id, summary, result, scenario="serve-max-rate")
                on_cell(summary, result)
                continue
            # No rate meeting the target is a measured answer (max rate 0), not a failure: on an H100 eager and
            # sdpa bert-base take 13-15 ms a batch, over a 10 ms p99 at any rate
            # (benchmarks/results/measurement_path_h100_2026-11.md).
            lowest = min(trail, key=lambda t: t[0]) if trail else None
            target = (f"p{share * 100:g} <= {spec.slo_ms:g} ms" if spec.slo is None else
                      f"{share:.4g} of requests meeting {spec.slo}" + (f", e2e:{spec.slo_ms:g}" if spec.slo_ms else ""))
            low_rows = rows.get(lowest[0], {}) if lowest else {}
            result = CellResult("ok", record={**rec, "max_rate": best or 0.0}, info={"probes": trail},
                                warnings=[] if best else [
                                    f"no probed rate met {target}"
                                    + (f" (the lowest, {lowest[0]:.3g}/s, had {figure} {lowest[1]:.4g})" if lowest and
                                       lowest[1] is not None else "")
                                    + (f"; its {low_rows['n_requests']} requests were fewer than the "
                                       f"{low_rows.get('tail_min_requests')} a p{share * 100:g} verdict needs"
                                       if low_rows and low_rows.get("tail_valid") is False else "")
                                    + (f"; rates under {floor:.3g}/s were not probed, as their {MIN_REQUESTS} "
                                       f"arrivals would outlast --timeout {spec.timeout:g} s" if lowest and
                                       lowest[0] / 2 <= floor else "")])
            if failed is not None:
                result.warnings.append(f"the search stopped at {failed[0]:.3g}/s, which ended {failed[1]}: the largest "
                                       f"rate meeting the target may be above {best:.3g}/s")
            store_result(store, run_id, summary, result, scenario="serve-max-rate")
            on_cell(summary, result)
        recs = export.records(store, [run_id])
    finally:
        if lane is not None:
            lane.close()
        store.close()
    export.write(recs, json_path, csv_path, db=db)
    return RunOutcome(run_id, name, recs, done > 0)
