"""What the fused engine's tuner settled in each cell of a transbench store: the whole-forward races it ran
(which trial, what it changed, both times, won or not) and the route each op ended on.
  PYTHONPATH=src python3 benchmarks/fused_races.py DB [--routes]
"""
from __future__ import annotations

import argparse

from transbench.errors import SpecError
from transbench.store.db import Store


def describe(tuned: dict, routes: bool = False) -> list[str]:
    """Lines for one captured graph's `engine_tuning` entry: each race, then (if asked) each op's route."""
    lines = []
    for r in tuned.get("races") or []:
        outcome = r.get("error") or f"{r['trial_ms']:.4f} vs {r['best_ms']:.4f} ms {'WON' if r['won'] else 'lost'}"
        changes = ", ".join(f"{op} -> {route}" for op, route in r["routes"].items())
        lines.append(f"  {r['trial']:7s} {outcome}  {changes}")
    if routes:
        lines += [f"    {op:60s} {route}" for op, route in (tuned.get("routes") or {}).items()]
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    ap.add_argument("--routes", action="store_true", help="also print every op's final route")
    a = ap.parse_args(argv)
    try:  # read-only: a missing, foreign or damaged file is refused and left as it was
        store = Store(a.db, readonly=True)
        runs = store.runs()
    except SpecError as e:
        ap.error(str(e))
    printed = 0
    for run in runs:
        for c in store.cells(run["run_id"]):
            cell = c["cell"]
            if cell.get("backend") != "fused":
                continue
            for shape, tuned in c["info"].get("engine_tuning", {}).items():
                printed += 1
                races = tuned.get("races") or []
                print(f"{run['name']} {cell['model']} {cell['batch']}x{cell['seq']} graph {shape}: {len(races)} races, "
                      f"{sum(bool(r.get('won')) for r in races)} won")
                print("\n".join(describe(tuned, a.routes)))
    if not printed:  # silence read as a script that did nothing: a CPU run's fused cells tune and capture nothing
        print(f"no fused cell in {a.db} holds the engine's tuning (engine_tuning): the tuner races its routes on a "
              "CUDA GPU only")


if __name__ == "__main__":
    main()
