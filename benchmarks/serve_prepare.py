"""What each serve cell of a transbench store spent before its load and what it captured during it: one line
per cell (backend, load, status, p99, each batch's service time p99 / max, prepare seconds, graphs before
the load and captured under it). A latency p99 far above the service p99 is queueing; near it, the server.
  PYTHONPATH=src python3 benchmarks/serve_prepare.py DB
A fused cell that shows `under 0` ran its whole load on graphs captured and tuned in its prepare time."""
from __future__ import annotations

import argparse
import signal

from transbench.errors import SpecError
from transbench.store.db import Store


def line(c: dict) -> str:
    cell, rec, info = c["cell"], c["record"], c["info"]
    load = {"rate": f"{cell.get('rate', 0):.4g}/s", "concurrency": f"c{cell.get('concurrency')}"}.get(
        cell.get("mode"), cell.get("mode"))
    p99 = rec.get("latency_p99_ms")
    graphs = ""
    if "engine_graphs_before_load" in info:
        graphs = (f"graphs {info['engine_graphs_before_load']} before, "
                  f"under load {info['engine_graphs_captured_under_load']}")
    prep = info.get("prepare_s")
    p99 = "-" if p99 is None else f"{p99:.2f} ms"
    svc = rec.get("service_p99_ms")
    svc = "-" if svc is None else f"{svc:.2f}/{rec['service_max_ms']:.2f} ms"
    prep = "-" if prep is None else f"{prep:.1f} s"
    gcs = info.get("gc_collections_under_load")
    gcs = "" if gcs is None else f"  gc under load {'/'.join(map(str, gcs))}"
    return (f"{cell.get('backend', ''):10s} {load:>10s} {c['status']:7s} p99 {p99:>10s}  service p99/max {svc:>15s}"
            f"  prepare {prep:>7s}  {graphs}{gcs}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    a = ap.parse_args(argv)
    try:  # read-only: a missing, foreign or damaged file is refused and left as it was
        store = Store(a.db, readonly=True)
        runs = store.runs()
    except SpecError as e:
        ap.error(str(e))
    for run in runs:
        print(f"run {run.get('name', run['run_id'])}")
        for c in store.cells(run["run_id"]):
            if c["scenario"] == "serve":
                print("  " + line(c))


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly, as it does a shell tool
    main()
