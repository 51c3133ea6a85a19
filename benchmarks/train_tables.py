"""Compact text tables of stored training runs, for the GPU script's logs (benchmarks/gpu.sh).

    PYTHONPATH=src python3 benchmarks/train_tables.py DB RUN [RUN ...]     every stored cell of each run, in order
    PYTHONPATH=src python3 benchmarks/train_tables.py --ladder LADDER.json  a finished ladder (train --ladder)

The cell table reads the store, so a run cut short by its time box still shows what it measured (a
ladder's steps and its batch-search probes alike)."""

from __future__ import annotations

import argparse
import json
import signal
import sys

COLUMNS = [("dtype", "dtype", "s"), ("optim", "optim", "s"), ("batch", "batch", "s"), ("flags", "options", "s"),
           ("strategy", "strategy", "s"), ("status", "status", "s"), ("samples_per_s", "samples/s", ".1f"),
           ("mfu", "MFU", ".1%"), ("hfu", "HFU", ".1%"), ("forward_ms", "fwd", ".1f"), ("backward_ms", "bwd", ".1f"),
           ("optimizer_ms", "opt", ".1f"), ("peak_mem_mb", "peak", ".0f"), ("params_mb", "params", ".0f"),
           ("grads_mb", "grads", ".0f"), ("optim_state_mb", "optim", ".0f"), ("activations_mb", "activ", ".0f")]
WIDTH = {"flags": 30, "optim": 13}


def flags(cell: dict) -> str:
    on = [f"x{cell['grad_accum']}" if cell.get("grad_accum", 1) != 1 else "",
          "ckpt" if cell.get("grad_ckpt") else "", "compile" if cell.get("compile") else "",
          cell.get("kernels") if cell.get("kernels", "torch") != "torch" else "",
          "masked-head" if cell.get("head") == "masked" else "", cell.get("activation") or "",
          f"ZeRO-{cell['zero_stage']}" if cell.get("zero_stage") else ""]
    return " ".join(f for f in on if f) or "-"


def cell_rows(cells: list[dict]) -> list[str]:
    """One line per stored cell (and a line with the error of each that did not run)."""
    lines = [" ".join(f"{h:>{WIDTH.get(k, 9)}}" for k, h, _ in COLUMNS)]
    for c in cells:
        cell, rec = c["cell"], c["record"]
        cell = {"dtype": cell.get("precision"), **cell}  # stores written before `dtype` named it `precision`
        ok = c["status"] == "ok"
        values = {**rec, **cell, "flags": flags(cell), "status": c["status"] if c["scenario"] != "max-batch"
                  else f"max:{c['status']}", "batch": cell.get("batch")}
        out = []
        for k, _, f in COLUMNS:
            v = values.get(k)
            text = "-" if v is None or (not ok and f != "s") else (format(v, f) if f != "s" else str(v))
            out.append(f"{text[:WIDTH.get(k, 9)]:>{WIDTH.get(k, 9)}}")
        lines.append(" ".join(out))
        if not ok:
            lines.append("    " + (rec.get("error") or "")[:300])
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ladder", help="a ladder's --json file")
    p.add_argument("db", nargs="?")
    p.add_argument("runs", nargs="*")
    args = p.parse_args(argv)
    if args.ladder:
        from transbench.scenarios.training.ladder import summary

        data = json.load(open(args.ladder))
        rows = data["cells"] if isinstance(data, dict) else data  # the versioned record, or an older bare list
        print(summary(rows))
        for r in rows:
            if r["status"] != "ok":
                print("   ", r["step"], ":", (r.get("error") or "")[:240])
        return 0
    from transbench.store import Store

    store = Store(args.db)
    try:
        for name in args.runs:
            run = store.find_run(name)
            if run is None:
                print(f"run {name}: not stored")
                continue
            cells = store.cells(run["run_id"])
            model = cells[0]["cell"].get("model") if cells else "-"
            print(f"run {name}: {model}, {len(cells)} cells")
            print("\n".join(cell_rows(cells)))
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly, as it does a shell tool
    sys.exit(main())
