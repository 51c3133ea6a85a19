"""Rich tables for the terminal."""

from __future__ import annotations

import shutil
import sys

from rich.console import Console
from rich.table import Table

# Piped output (CI logs, `| tee`) gets a wide console rather than rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else max(180, shutil.get_terminal_size().columns))

COLUMNS = [("scenario", "scenario"), ("model", "model"), ("task", "task"), ("backend", "backend"), ("dtype", "dtype"),
           ("batch_size", "batch"), ("seq_len", "seq"), ("status", "status"), ("latency_ms", "ms (median)"),
           ("latency_iqr_ms", "IQR ms"), ("latency_p99_ms", "p99 ms"), ("throughput_per_s", "seq/s"),
           ("tokens_per_s", "tokens/s"), ("prefill_ms", "prefill ms"), ("decode_ms_per_token", "ms/token"),
           ("tflops", "TFLOPS"), ("mfu", "MFU"), ("peak_mem_mb", "peak MiB"), ("rel_err", "rel err"),
           ("speedup", "speedup %"), ("mem_saved", "mem saved %")]
TEXT = {"scenario", "model", "task", "backend", "dtype", "status"}


def fmt(value, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def records_table(recs: list[dict], title: str = "") -> Table:
    """One row per cell. Columns that are the same in every row move to the title; empty ones go."""
    constant = {k: recs[0].get(k) for k in ("scenario", "model", "task", "dtype") if recs and len({r.get(k) for r in recs}) == 1}
    cols = [(k, label) for k, label in COLUMNS
            if k not in constant and (k in ("status",) or any(r.get(k) is not None for r in recs))]
    if constant:
        title = f"{title}  " + "  ".join(f"{k}={v}" for k, v in constant.items())
    t = Table(title=title.strip())
    for _, label in cols:
        t.add_column(label, justify="left" if _ in TEXT else "right")
    for r in recs:
        row = []
        for key, _ in cols:
            v = r.get(key)
            if key == "mfu" and v is not None:
                row.append(f"{v:.1%}")
            elif key == "status" and v != "ok":
                row.append(f"[bold red]{v.upper() if v == 'oom' else v}[/]")
            elif key in ("speedup", "mem_saved") and v is not None:
                row.append(f"{v:+.1f}")
            else:
                row.append(fmt(v, ".2e" if key == "rel_err" else ".4g"))
        t.add_row(*row)
    return t
