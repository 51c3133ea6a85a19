"""The public Python API. The CLI is a thin layer over these functions.

    from transbench import api
    from transbench.api import RunSpec
    outcome = api.run(RunSpec(models=["bert-tiny"], batches=[1, 8], seqs=[32]), db="bench.db")
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from .arguments import (RunOutcome, check_callbacks, check_flag, check_keywords, check_names,  # noqa: F401
                        check_outputs, check_path, keywords_of)
from .errors import SpecError
from .measure import env as env_mod
from .scenarios.inference import run as inference
from .scenarios.inference.run import inference_target, spec_to_store  # noqa: F401
from .scenarios.inference.spec import RunSpec  # noqa: F401  (api.RunSpec)
from .scenarios.serve import run as serving
from .scenarios.training import spec as training
from .scenarios.training.spec import TrainSpec  # noqa: F401  (api.TrainSpec)
from .spec import checked, coerce
from .store import Store, export
from .store.db import Merged, check_sources

# What the command line uses beside the functions below: it imports nothing else of the package but the
# declarations (tests/test_layers.py), so each of these is named here once.
from .backends import registry as backend_registry, family_reason  # noqa: E402,F401
from .backends.compile import check_mode  # noqa: F401
from .demo import format_prob, run_demo  # noqa: F401
from .models import build  # noqa: F401
from .models.presets import PRESETS  # noqa: F401
from .report import CompareConfig, build_report, compare as compare_runs  # noqa: F401
from .report.compare import (comparison_document, comparison_markdown, comparison_table,  # noqa: F401
                             github_benchmark as github_benchmark_export, refusal_markdown, unmatched_table)
from .scenarios import micro as micro_benchmarks  # noqa: F401
from .scenarios.micro import measured_ceilings  # noqa: F401
from .scenarios.training.ladder import plot as ladder_plot  # noqa: F401

if TYPE_CHECKING:  # the engine (and Triton) load when tune runs
    from .engine import EngineOptions


def run(spec: RunSpec, db: str = "transbench.db", **kwargs) -> RunOutcome:
    """An inference sweep: scenarios/inference/run.py run, whose keyword arguments it takes."""
    return inference.run(spec, db, **keywords_of(inference.run, kwargs, "run"))


def serve(spec, db: str = "transbench.db", **kwargs) -> RunOutcome:
    """A load test: scenarios/serve/run.py serve, whose keyword arguments it takes."""
    return serving.serve(spec, db, **keywords_of(serving.serve, kwargs, "serve"))


def train(spec: TrainSpec, db: str = "transbench.db", **kwargs) -> list[dict]:
    """A training sweep (scenarios/training/spec.py), or with `spec.ladder` the seed notebook's ladder of steps
    for one model (scenarios/training/ladder.py); kwargs: json_path, csv_path, on_start, on_cell."""
    spec = checked(TrainSpec, spec)  # a dict or None: a SpecError, not an AttributeError
    check_keywords(kwargs, ("json_path", "csv_path", "on_start", "on_cell"), "train")
    db = check_outputs(db, kwargs.get("json_path"), kwargs.get("csv_path"))
    check_callbacks(**{k: v for k, v in kwargs.items() if k in ("on_start", "on_cell")})
    if spec.ladder:
        from .scenarios.training.ladder import ladder

        return ladder(training.validate(spec), db, **kwargs)
    return training.train(spec, db, **kwargs)


def runs(db: str = "transbench.db") -> list[dict]:
    store = Store(check_path(db), readonly=True)
    try:
        return store.runs()
    finally:
        store.close()


def records(db: str, run_refs: list[str] | None = None, baseline: str | None = None) -> list[dict]:
    run_refs = None if run_refs is None else check_names(run_refs, "run_refs")
    if baseline is not None and not isinstance(baseline, str):
        raise SpecError(f"baseline must be a backend name (text), got {baseline!r}")
    store = Store(check_path(db), readonly=True)
    try:
        missing = [r for r in (run_refs or []) if store.find_run(r) is None]
        if missing:
            # each name quoted, as compare and report say it: a name may hold spaces or commas
            names = ", ".join(f"'{m}'" for m in missing)
            raise SpecError(f"no run {names} in {db}: `transbench runs` lists them")
        recs = export.records(store, run_refs, baseline)
    finally:
        store.close()
    # as api.report refuses it (report/data.py): a misspelt baseline left every speedup None without a word, and
    # baseline="" fell back to each run's own baseline
    export.check_baseline(baseline, recs)
    return recs


def spec_file(run: dict) -> dict:
    """A stored run's spec (a row of runs()) as its own command's --spec reads it back: `runs --spec RUN --out FILE`."""
    from .scenarios.micro import run as micro_run
    from .scenarios.serve import run as serve_run

    if not (isinstance(run, dict) and isinstance(run.get("kind"), str) and isinstance(run.get("spec"), dict)):
        raise SpecError(f"run must be a row of runs() (a dict with a kind and a spec), got {run!r:.200}")
    return {"serve": serve_run.spec_file, "micro": micro_run.spec_file}.get(run["kind"], dict)(run["spec"])


def merge(target: str, sources: list[str]) -> Merged:
    """Join stores (e.g. the shards of one sweep run on several hosts) without duplicate cells: all of them or,
    refused, none. Returns the runs and cells added, and a line per cell stored twice with other results
    (store/db.py merge_from says which copy is kept)."""
    sources = [check_path(s, "sources") for s in check_names(sources, "sources")]
    if not sources:  # an empty store was created and "0 new runs" reported
        raise SpecError("merge needs at least one source store")
    target = check_path(target, "target")
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

    return run_micro(kind, options, check_path(db))


def report(db: str = "transbench.db", runs: list[str] | None = None, out_dir: str = "report",
           baseline: str | None = None, **kwargs):
    """report.md, PNG plots and a self-contained report.html for stored runs."""
    # Only None or an empty list is "the newest run", as no run named on the command line: runs="" (a name left
    # empty by mistake) reported the newest run without a word, where records(db, "") and `report ''` refuse it.
    runs = ["last"] if runs is None or (isinstance(runs, list) and not runs) else runs
    check_keywords(kwargs, ("compare_runs", "config"), "report")
    if kwargs.get("compare_runs") is not None:
        check_flag(kwargs["compare_runs"], "compare_runs")  # "no" was a true value
    if kwargs.get("config") is not None and not isinstance(kwargs["config"], CompareConfig):
        raise SpecError(f"config must be a transbench.report.CompareConfig, got {kwargs['config']!r}")
    return build_report(check_path(db), check_names(runs, "runs"), check_path(out_dir, "out_dir"), baseline, **kwargs)


def compare(db: str, run_a: str, run_b: str, alpha: float = 0.05, min_effect: float = 0.03):
    """Per-cell median ratios B/A with a bootstrap interval over block medians (faster / slower / same)."""
    run_a, run_b = check_names([run_a, run_b], "runs")  # None or a number: a SpecError, not an AttributeError
    for value, what in ((alpha, "alpha"), (min_effect, "min_effect")):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{what} must be a number, got {value!r}")
    return compare_runs(check_path(db), run_a, run_b, CompareConfig(alpha, min_effect))


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
        check_callbacks(progress=progress)
    if model is None:  # "got None" was the CLI's line for a missing --model
        raise SpecError("model must be a preset name or a checkpoint folder: give --model")
    if not isinstance(model, (str, os.PathLike)):
        raise SpecError(f"model must be a preset name or a checkpoint folder, got {model!r}")
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):  # was pathlib's TypeError, unnamed
        raise SpecError(f"cache_dir must be a folder path (text), got {cache_dir!r}")
    if cache_dir:
        check_path(cache_dir, "cache_dir")  # a NUL in it
    spec = TuneSpec(**coerce(TuneSpec, {"model": os.fspath(model), "batches": batches, "seqs": seqs, "dtype": dtype,
                                        "device": device, "cache_dir": cache_dir and os.fspath(cache_dir)}))
    return tuning.run(spec, progress, options)


def server(spec, on_ready: Callable = lambda info: None,
           on_preparing: Callable = lambda seconds: None) -> str | None:
    """`transbench server` (scenarios.serve.server_spec.ServerSpec): prepare the backend, call on_preparing(seconds)
    once if that takes more than scenarios.serve.server.PREPARING_S, call on_ready(info) once it listens, and serve
    until SIGTERM or SIGINT; returns the name of the signal that ended it (scenarios.serve.server.Stopped, a str
    whose `cut` counts the requests still in flight when the grace ran out)."""
    from .scenarios.serve import server as srv
    from .scenarios.serve import server_spec

    srv.need_server_extra()
    check_callbacks(on_ready=on_ready, on_preparing=on_preparing)  # on_ready=5 was called only once prepared
    spec, ref, decoder = server_spec.check(spec)
    return srv.run(spec, ref, decoder, on_ready, on_preparing)


