"""`transbench run`: validate, expand and run an inference sweep through the one sweep loop."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

from ...arguments import RunOutcome, check_callbacks, check_flag, check_outputs
from ...cells import Cell, CellResult
from ...errors import SpecError
from ...measure import env as env_mod
from ...measure import load
from ...runner.sweep import SweepOptions, Target, open_run, run_grid
from ...spec import checked
from ...store import Store, export
from . import cells as grid
from .spec import RunSpec


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
    if explicit is not None and not (isinstance(explicit, (set, frozenset, list, tuple))
                                     and all(isinstance(k, str) for k in explicit)):
        raise SpecError(f"explicit must be None or the names of the fields the caller set, got {explicit!r:.200}")
    asked = checked(RunSpec, spec)  # before the device's defaults fill it: what the caller set (resume below)
    spec = grid.validate(asked)
    db = check_outputs(db, json_path, csv_path)
    check_flag(resume, "resume")
    check_callbacks(on_start=on_start, on_cell=on_cell, on_probe=on_probe, on_warning=on_warning)
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
            try:
                spec = grid.validate(RunSpec.from_dict({**last["spec"], "name": last["name"]}))
            except SpecError as exc:  # a value the caller never typed: say it came from the stored run
                raise SpecError(f"cannot resume run '{last['name']}' with the spec stored with it: {exc}") from None
            cells, name = grid.expand(spec), last["name"]
        # the run of exactly that name, as open_run resumes it: find_run also takes another run's id, and a fresh
        # run of that name was measured where nothing could be resumed
        elif resume and store.run_named(name) is None:
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
        recs = export.records(store, [run_id], by_id=True)
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


def inference_target(spec: RunSpec) -> Target:
    """One worker per lane for plain cells; with --nproc, each cell's ranks launched through torchrun."""
    if spec.nproc <= 1:
        return Target(Cell, measure="transbench.scenarios.inference.target:measure")
    from ...runner.launch import LaunchConfig

    cfg = LaunchConfig(nproc=spec.nproc, torchrun=True, timeout=spec.timeout)
    return Target(Cell, launch=lambda cell: ("transbench.scenarios.inference.dp", cfg))


def spec_to_store(spec: RunSpec) -> dict:
    """The spec as stored with its run: every axis resolved, so `run --spec` repeats the same grid."""
    return replace(spec, name=None).to_dict()
