"""`transbench serve`: a load test of one model through its backends, in this process's workers or at an HTTP
endpoint, with --find-max-rate's search over rate probes."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from ...arguments import RunOutcome, check_callbacks, check_outputs
from ...cells import CellResult
from ...measure import env as env_mod
from ...runner.sweep import SweepOptions, Target, open_run, run_grid
from ...store import Store, export
from . import spec as serve_spec
from .arrivals import MIN_REQUESTS
from .cell import ServeCell
from .search import find_max_rate, hopeless


# The fields endpoint_spec.check resolves for a `serve --url` run (the endpoint serves its own model): stored with the
# run, and refused by `serve --spec` beside --url (set, they would name what runs in this process).
ENDPOINT_RESOLVED = ("model", "task", "backends", "dtype", "device")


def spec_file(stored: dict) -> dict:
    """A stored serve run's spec as `serve --spec` reads it back (`runs --spec`): without the lengths file's digest
    (a key no spec file takes) and, for an endpoint, without what the endpoint resolved. Both were written, and the
    file was refused by the command it was written for."""
    return {k: v for k, v in stored.items()
            if k != "lengths_source" and not (stored.get("url") and k in ENDPOINT_RESOLVED)}


def serve(spec, db: str = "transbench.db", *, json_path: str | None = None, csv_path: str | None = None,
          on_cell: Callable = lambda c, r: None, on_progress: Callable | None = None) -> RunOutcome:
    """A load test (scenarios.serve.spec.ServeSpec): every (backend, load) cell stored as it ends. With
    find_max_rate, per backend an offline cell (the throughput bound), then rate probes (of spec.arrivals) bisecting
    the largest rate whose requests meet the objectives (slo_ms, slo) at the verdict's share (percentile or
    goodput_target) by MLPerf LoadGen's early-stopping rule, each probe stored, then a `serve-max-rate` cell.
    on_progress(cell, text): a running cell's word on its preparation (what, i of n)."""
    from ...runner.sweep import _Lane, store_result  # at call time: a test's fake lane stands in for it

    spec, lengths = serve_spec.check(spec)
    db = check_outputs(db, json_path, csv_path)
    check_callbacks(on_cell=on_cell, **({} if on_progress is None else {"on_progress": on_progress}))
    # An endpoint's cells send HTTP requests from the worker (scenarios/serve/endpoint.py) instead of serving there.
    target = Target(ServeCell, measure="transbench.scenarios.serve." + ("endpoint" if spec.url else "measure")
                    + ":measure")
    opts = SweepOptions(spec.timeout, progress=on_progress, threads=spec.threads)
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
        lane = _Lane(None, target, progress=on_progress, threads=spec.threads)

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
                # "did not run" was said of a probe that ran and whose every request failed (a silent endpoint)
                why = (offline or {}).get("record", {}).get("error") or "see its cell"
                store_result(store, run_id, summary, CellResult(
                    offline["status"] if offline else "error",
                    error=(f"the offline probe ended {offline['status']}: " if offline else
                           "the offline probe did not run: ") + why), scenario="serve-max-rate")
                continue
            share = serve_spec.tail_share(spec)
            # The figure each probe shows beside its verdict: the early-stopping estimate of the latency percentile
            # where the end-to-end latency is the one objective, else the share of requests meeting all of them.
            figure = serve_spec.verdict_keys(spec)[1] if spec.slo is None else "goodput"
            ended: dict[float, str] = {}  # rate -> the status of a probe that did not end ok
            rows: dict[float, dict] = {}
            # The probes run while none passed, with their failed requests by kind (an endpoint's), and why the
            # search stopped where they say no lower rate can pass (serve_search.hopeless): 4.5% of bert-tiny's
            # requests over its 128 positions answered 400 at every rate, and the search probed down to the
            # lowest rate (~14 minutes) for an answer known at the first probe.
            failing: list[tuple[float, int, dict]] = []
            passed: list[float] = []
            stopped: list[str] = []

            def probe(rate: float):
                row = measured(serve_spec.cell(spec, lengths, backend, "rate", rate))
                if not row or row["status"] != "ok":
                    ended[rate] = row["status"] if row else "error"
                    return None
                rows[rate] = row["record"]
                value = row["record"].get(figure)
                # An endpoint's percentile that falls on failed requests is stored empty (endpoint.py): the target
                # was missed, which the search must take as a miss, not as a probe that measured nothing.
                # LoadGen's verdict (stats.account): a probe short of its percentile's requests is never passed
                value, ok = ((math.inf, False) if value is None and row["record"].get("failed") else
                             (value, bool(row["record"].get("slo_met"))))
                if ok:
                    passed.append(rate)
                if passed:  # once one passed, the probes go up from it: a lower rate passes
                    return value, ok
                failing.append((rate, row["record"].get("requests") or 0, (row.get("info") or {}).get("failures")
                                or {}))
                why = hopeless(failing, share)
                if why:
                    stopped.append(f"the search stopped: {why}")
                return value, ok, why

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
            # Failures no lower rate clears (serve_search.hopeless) end the search with no rate: a max rate of 0
            # would read as a server too slow for the target, where the requests (or its answers to some) fail it.
            if stopped:
                result = CellResult("error", record=rec, info={"probes": trail}, error=stopped[0])
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
        recs = export.records(store, [run_id], by_id=True)
    finally:
        if lane is not None:
            lane.close()
        store.close()
    export.write(recs, json_path, csv_path, db=db)
    return RunOutcome(run_id, name, recs, done > 0)
