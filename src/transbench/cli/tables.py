"""Rich tables for the terminal."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

console = Console()


def fmt(value, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def records_table(recs: list[dict], title: str = "") -> Table:
    t = Table(title=title, show_lines=False)
    cols = [("model", "model"), ("task", "task"), ("backend", "backend"), ("dtype", "dtype"),
            ("batch_size", "batch"), ("seq_len", "seq"), ("status", "status"), ("latency_ms", "ms (median)"),
            ("latency_iqr_ms", "IQR ms"), ("throughput_per_s", "seq/s"), ("tflops", "TFLOPS"), ("mfu", "MFU"),
            ("peak_mem_mb", "peak MiB"), ("rel_err", "rel err"), ("speedup", "speedup %")]
    extra = [c for c in (("prefill_ms", "prefill ms"), ("decode_ms_per_token", "ms/token")) if any(r.get(c[0]) for r in recs)]
    cols += extra
    if any(r.get("speedup") is not None for r in recs):
        cols.append(("mem_saved", "mem saved %"))
    for _, label in cols:
        t.add_column(label, justify="right" if label not in ("model", "task", "backend", "dtype", "status") else "left")
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
