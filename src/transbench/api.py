"""The public Python API. The CLI is a thin layer over these functions.

    from transbench import api
    from transbench.spec import RunSpec
    outcome = api.run(RunSpec(models=["bert-tiny"], batches=[1, 8], seqs=[32]), db="bench.db")
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from .errors import SpecError
from .measure import env as env_mod
from .scenarios.inference import cells as grid
from .scenarios.training import spec as training
from .scenarios.training.spec import TrainSpec  # noqa: F401  (api.TrainSpec)
from .cells import Cell, CellResult
from .runner.sweep import SweepOptions, Target, open_run, run_grid
from .scenarios.inference.spec import RunSpec
from .spec import check_once, checked, coerce
from .store import Store, export
from .store.db import Merged, check_sources


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
        on_probe: Callable[[Cell, CellResult], None] = lambda c, r: None) -> RunOutcome:
    """Validate, expand and run an inference sweep; every finished cell is stored as it ends.

    A run whose name is already in the store is resumed (its finished cells are not run again); the same
    name with a different grid is refused. `resume=True` without a name resumes the newest run.
    `on_start(cells, already_done)` is called once the grid is known."""
    asked = checked(RunSpec, spec)  # before the device's defaults fill it: what the caller set (resume below)
    spec = grid.validate(asked)
    db = _outputs(db, json_path, csv_path)
    _flag(resume, "resume")
    _callbacks(on_start=on_start, on_cell=on_cell, on_probe=on_probe)
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
            _refuse_ignored_fields(asked, last)
            spec = grid.validate(RunSpec.from_dict({**last["spec"], "name": last["name"]}))
            cells, name = grid.expand(spec), last["name"]
        elif resume and store.find_run(name) is None:
            raise SpecError(f"nothing to resume: no run named {name} in {db}")
        run_id, name, done = open_run(store, "inference", spec_to_store(spec), name,
                                      lambda: env_mod.collect(open_cuda=False), {c.key() for c in cells})
        on_start(cells, done)
        opts = SweepOptions(spec.timeout, spec.gpus, spec.max_batch, spec.max_batch_limit)
        run_grid(store, run_id, cells, inference_target(spec), opts, on_cell, on_probe)
        recs = export.records(store, [run_id])
    finally:
        store.close()
    export.write(recs, json_path, csv_path)
    return RunOutcome(run_id, name, recs, done > 0)


def _refuse_ignored_fields(asked: RunSpec, last: dict) -> None:
    """`resume=True` without a name resumes the newest run with its own grid, so a field set otherwise was dropped
    without a word (RunSpec(batches=[2]) after a run of batch 1 measured nothing and came back resumed): refused, as
    the CLI refuses `--resume --batch 2` (cli/run.py). A field left at its default cannot be told from one not
    given, and passes, as an option left out does on the command line."""
    import json

    default, mine = RunSpec().to_dict(), asked.to_dict()
    differ = sorted(k for k in mine if k != "name" and mine[k] != default[k] and mine[k] != last["spec"].get(k))
    if differ:
        listed = ", ".join(f"{k} {json.dumps(last['spec'].get(k))} -> {json.dumps(mine[k])}" for k in differ[:3])
        raise SpecError(f"resume without a name resumes the newest run, '{last['name']}', with its own options, and "
                        f"these differ ({listed}): leave them at their defaults, or give the spec a name to resume "
                        "or start a run with them")


def train(spec: TrainSpec, db: str = "transbench.db", **kwargs) -> list[dict]:
    """A training sweep (scenarios/training/spec.py), or with `spec.ladder` the seed notebook's ladder of steps
    for one model (scenarios/training/ladder.py); kwargs: json_path, csv_path, on_start, on_cell."""
    spec = checked(TrainSpec, spec, training.WHOLE_FIELDS)  # a dict or None: a SpecError, not an AttributeError
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
    """A micro-benchmark: kind gemm|bandwidth|layer|breakdown with its options dataclass
    (transbench.scenarios.micro: GemmOptions, BandwidthOptions, LayerOptions, BreakdownOptions)."""
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
         cache_dir: str | None = None, progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Tune the fused engine's kernel routes for every batch x seq of `model` ahead of time, with no time budget,
    into the on-disk table (`cache_dir`/engine-tuning.json; default $TRANSBENCH_CACHE_DIR or
    ~/.cache/transbench). A process that finds the table starts warm: its first call at a tuned shape captures
    its graph without timing anything. GPT-2: also a generator's prefill at batch x seq and its decode step at
    that batch. Returns one row per shape: batch, seq, seconds, routes (ops of the forward tuned), races (the
    whole-forward trials that settled close choices, tuning.Tuner.refine: routes tried, times, whether it won)."""
    import time
    from pathlib import Path

    import torch

    from .engine import EngineUnsupported, compile_model, tuning
    from .measure import device as dev
    from .models import build

    if dtype not in ("fp16", "bf16", "fp8"):
        raise SpecError(f"dtype {dtype} cannot be tuned: the fused engine tunes fp16, bf16 and fp8")
    if not isinstance(model, (str, os.PathLike)):
        raise SpecError(f"model must be a preset name or a checkpoint folder, got {model!r}")
    if progress is not None:  # progress=5 was called only after the first shape's minutes of tuning
        _callbacks(progress=progress)
    # batches="1,8" or ["8"] hit `v < 1` as text (a TypeError); read them as a spec file's list fields are
    checked_axes = coerce(RunSpec, {"batches": batches, "seqs": seqs})
    batches, seqs = checked_axes["batches"] or [], checked_axes["seqs"] or []
    ref = build.resolve(model)
    for v, what in [*((b, "batch") for b in batches), *((s, "seq") for s in seqs)]:
        if v < 1:
            raise SpecError(f"{what} must be at least 1, got {v}")
    if not batches or not seqs:
        raise SpecError("give at least one --batch and one --seq")
    for values, option in ((batches, "--batch"), (seqs, "--seq")):
        check_once(values, option)  # the shape was tuned again for nothing (minutes on a large one)
    if max(seqs) > ref.shape.max_positions:
        raise SpecError(f"seq {max(seqs)} exceeds {model}'s {ref.shape.max_positions} positions")
    from .engine.compiled import BERT_LIKE

    if ref.family not in (*BERT_LIKE, "gpt2"):  # before the GPU is asked for: a CPU host is told this too
        raise SpecError(f"{model} is a {ref.family} model; the fused engine runs {', '.join(BERT_LIKE)} and gpt2 "
                        "models only, so there is nothing to tune for it")
    if cache_dir is not None and not str(cache_dir).strip():
        raise SpecError("--cache-dir is empty: give a folder, or leave it out for the default")
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):  # was pathlib's TypeError, unnamed
        raise SpecError(f"cache_dir must be a folder path (text), got {cache_dir!r}")
    table = Path(cache_dir) / tuning.TABLE_NAME if cache_dir is not None else tuning.cache_path()
    problem = tuning.table_problem(table)
    if problem:  # else minutes of tuning would be kept nowhere (the engine's tables are caches: a save may fail)
        raise SpecError(f"cannot use the tuning table {table}: {problem}; give --cache-dir another folder "
                        "(or delete a damaged table)")
    if dev.gpu_count() == 0:  # before dev.resolve, whose advice for a missing GPU is --device cpu
        raise SpecError("tune needs a CUDA GPU: the table holds kernel timings of the GPU it ran on")
    target = dev.resolve(device)
    if target.type != "cuda":
        raise SpecError("tune needs a CUDA GPU: the table holds kernel timings of the GPU it ran on")
    if cache_dir is not None:
        tuning.use_table(table)
    hf = build.build_model(ref, "base", device=str(target)).to(dev.torch_dtype(dtype))
    try:
        compiled = compile_model(hf, dtype=dev.torch_dtype(dtype), max_batch=max(batches), max_seq=max(seqs),
                                 fp8=dtype == "fp8", tune_budget_s=None)
    except EngineUnsupported as exc:  # a config the engine refuses (an activation, fp8 on this GPU): one line
        raise SpecError(f"{model} cannot be tuned: {exc.reason}") from None
    rows = []
    try:
        for b in batches:
            for s in seqs:
                ids = torch.randint(0, ref.shape.vocab, (b, s), device=target)
                start = time.perf_counter()
                compiled(input_ids=ids)
                if ref.family == "gpt2" and s < ref.shape.max_positions:  # generation: its one-token decode step too
                    gen = compiled.generator(b, s + 1)
                    gen.decode(gen.prefill(ids).argmax(-1))
                torch.cuda.synchronize(target)
                tuned = compiled.tuning().values()
                rows.append({"batch": b, "seq": s, "seconds": time.perf_counter() - start,
                             "routes": sum(len(t["routes"] or {}) for t in tuned),
                             "races": [r for t in tuned for r in t["races"]]})
                compiled.release()  # one shape's graph at a time: a large grid must not hold them all
                if progress:
                    progress(rows[-1])
    finally:
        compiled.release()
    return rows


def serve(spec, db: str = "transbench.db", *, json_path: str | None = None, csv_path: str | None = None,
          on_cell: Callable = lambda c, r: None) -> RunOutcome:
    """A load test (scenarios.serve.spec.ServeSpec): every (backend, load) cell stored as it ends. With
    find_max_rate, per backend an offline cell (the throughput bound), then Poisson probes bisecting the
    largest rate whose latency percentile meets slo_ms, each probe stored, then a `serve-max-rate` cell."""
    from .scenarios.serve import spec as serve_spec
    from .scenarios.serve.cell import ServeCell
    from .scenarios.serve.arrivals import MIN_REQUESTS
    from .scenarios.serve.search import find_max_rate
    from .runner.sweep import _Lane, store_result

    spec, lengths = serve_spec.check(spec)
    db = _outputs(db, json_path, csv_path)
    _callbacks(on_cell=on_cell)
    target = Target(ServeCell, measure="transbench.scenarios.serve.measure:measure")
    opts = SweepOptions(spec.timeout)
    store = Store(db)
    lane = None
    try:
        stored_spec = replace(spec, name=None).to_dict()
        if lengths.source:  # the file's name and digest: a resume after the file changed is another grid, refused
            stored_spec["lengths_file"] = lengths.source
        run_id, name, done = open_run(store, "serve", stored_spec, spec.name,
                                      lambda: env_mod.collect(open_cuda=False))

        # The search decides each probe from the last one, so it drives one lane (one worker, its models kept
        # between probes) itself instead of a run_grid per probe (a new worker process each).
        lane = _Lane(None, target)

        def measured(cell) -> dict | None:
            """Run one cell (or find it stored by an earlier attempt of this run) and return its stored row."""
            if cell.key() not in store.finished_keys(run_id):
                result = lane.run(cell, opts.timeout)
                store_result(store, run_id, cell, result)
                on_cell(cell, result)
            return next((c for c in store.cells(run_id) if c["key"] == cell.key()), None)

        if not spec.find_max_rate:
            run_grid(store, run_id, serve_spec.expand(spec, lengths), target, opts, on_cell)
        for backend in spec.backends if spec.find_max_rate else []:
            offline = measured(serve_spec.cell(spec, lengths, backend, "offline"))
            summary = serve_spec.cell(spec, lengths, backend, "max-rate")
            if offline is None or offline["status"] != "ok":
                store_result(store, run_id, summary, CellResult(
                    offline["status"] if offline else "error", error="the offline probe did not run: "
                    + ((offline or {}).get("record", {}).get("error") or "see its cell")), scenario="serve-max-rate")
                continue
            metric = serve_spec.PERCENTILE_KEYS[spec.percentile]
            ended: dict[float, str] = {}  # rate -> the status of a probe that did not end ok

            def probe(rate: float) -> float | None:
                row = measured(serve_spec.cell(spec, lengths, backend, "rate", rate))
                if not row or row["status"] != "ok":
                    ended[rate] = row["status"] if row else "error"
                return row["record"].get(metric) if row and row["status"] == "ok" else None

            # A probe's window must end within --timeout, else it can only time out after waiting all of it (a model
            # too slow for the target bisected down to rates whose 20 expected arrivals took longer than that).
            floor = MIN_REQUESTS / max(spec.timeout - spec.warmup, 1e-9)
            best, trail = find_max_rate(probe, spec.slo_ms, offline["record"]["achieved_rate"], lowest=floor)
            rec = {"max_rate": best, "percentile": spec.percentile, "slo_ms": spec.slo_ms,
                   "offline_rate": offline["record"]["achieved_rate"]}
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
            # sdpa bert-base take 13-15 ms a batch, over a 10 ms p99 at any rate (session 11).
            lowest = min(trail, key=lambda t: t[0]) if trail else None
            result = CellResult("ok", record={**rec, "max_rate": best or 0.0}, info={"probes": trail},
                                warnings=[] if best else [
                                    f"no probed rate met p{spec.percentile:g} <= {spec.slo_ms:g} ms"
                                    + (f" (the lowest, {lowest[0]:.3g}/s, had {lowest[1]:.3g} ms)" if lowest and
                                       lowest[1] is not None else "")
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
    export.write(recs, json_path, csv_path)
    return RunOutcome(run_id, name, recs, done > 0)
