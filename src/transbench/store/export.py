"""Flat records with the contract's keys, baseline comparisons, and JSON/CSV export."""

from __future__ import annotations

import csv
import json

from .db import Store

RECORD_KEYS = (
    "run_id", "run_name", "scenario", "model", "task", "backend", "dtype", "device", "gpu", "batch_size",
    "seq_len", "status", "latency_ms", "latency_p90_ms", "latency_p99_ms", "latency_iqr_ms", "n_samples",
    "throughput_per_s", "tokens_per_s", "tflops", "mfu", "peak_mem_mb", "rel_err", "speedup", "mem_saved",
    "error",
)
TRAINING_KEYS = ("samples_per_s", "tflops_per_gpu", "world_size", "strategy")
GENERATION_KEYS = ("prefill_ms", "decode_ms_per_token", "kv_cache_mb", "kv_cache_analytic_mb")
# A speed is never shown for these: the output was wrong or nothing was measured.
SPEED_KEYS = ("latency_ms", "latency_p90_ms", "latency_p99_ms", "latency_iqr_ms", "throughput_per_s",
              "tokens_per_s", "tflops", "mfu", "hfu", "samples_per_s", "tflops_per_gpu", "prefill_ms",
              "decode_ms_per_token", "decode_p90_ms_per_token", "ms_per_token", "speedup", "host_ms")


def point(rec: dict) -> tuple:
    """What makes two records comparable across backends."""
    return (rec.get("scenario"), rec.get("model"), rec.get("task"), rec.get("dtype"), rec.get("batch_size"),
            rec.get("seq_len"))


def apply_baseline(records: list[dict], baseline: str | None) -> list[dict]:
    """speedup % = (baseline latency / latency - 1) x 100; mem_saved % = (1 - peak / baseline peak) x 100."""
    if not baseline:
        return records
    base = {point(r): r for r in records if r.get("backend") == baseline and r.get("status") == "ok"}
    for r in records:
        b = base.get(point(r))
        if r.get("status") != "ok" or b is None or r is b:
            continue
        if r.get("latency_ms") and b.get("latency_ms"):
            r["speedup"] = (b["latency_ms"] / r["latency_ms"] - 1) * 100
        if r.get("peak_mem_mb") and b.get("peak_mem_mb"):
            r["mem_saved"] = (1 - r["peak_mem_mb"] / b["peak_mem_mb"]) * 100
    return records


def records(store: Store, run_refs: list[str] | None = None, baseline: str | None = None) -> list[dict]:
    runs = [store.find_run(r) for r in run_refs] if run_refs else store.runs()
    out: list[dict] = []
    for run in runs:
        if run is None:
            continue
        recs = []
        for c in store.cells(run["run_id"]):
            rec = {k: None for k in RECORD_KEYS}
            rec.update(c["record"])
            rec.update(run_id=run["run_id"], run_name=run["name"], status=c["status"])
            if rec["status"] != "ok":
                for k in SPEED_KEYS:
                    rec[k] = None
            recs.append(rec)
        out += apply_baseline(recs, baseline or run["spec"].get("baseline"))
    return out


def columns(recs: list[dict]) -> list[str]:
    extra = [k for k in (*GENERATION_KEYS, *TRAINING_KEYS) if any(k in r for r in recs)]
    rest = sorted({k for r in recs for k in r} - set(RECORD_KEYS) - set(extra))
    return [*RECORD_KEYS, *extra, *rest]


def write(recs: list[dict], json_path: str | None = None, csv_path: str | None = None) -> None:
    """The --json / --csv exports of a command, where asked for."""
    if json_path:
        write_json(recs, json_path)
    if csv_path:
        write_csv(recs, csv_path)


def write_json(recs: list[dict], path: str) -> None:
    cols = columns(recs)
    with open(path, "w") as f:
        json.dump([{k: r.get(k) for k in cols} for r in recs], f, indent=1, default=str)


def write_csv(recs: list[dict], path: str) -> None:
    cols = columns(recs)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in recs:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})


def check_paths(json_path: str | None, csv_path: str | None, db: str | None = None) -> None:
    """Refuse --json/--csv targets that could not be written, before a sweep spends its time: the folder
    must exist and be writable, and the path must not be a folder. Nor may an export overwrite the store
    (`db`) or the other export. Nothing is created here."""
    import os
    from pathlib import Path

    from ..errors import SpecError

    if json_path and csv_path and Path(json_path).resolve() == Path(csv_path).resolve():
        raise SpecError(f"--json and --csv both write {json_path}: give them different files")
    for path in (json_path, csv_path):
        if not path:
            continue
        p = Path(path)
        if db and p.resolve() == Path(db).resolve():
            raise SpecError(f"cannot write {path}: it is the store (--db); exporting there would overwrite "
                            "every stored run: give another file")
        folder = p.parent if str(p.parent) else Path(".")
        if p.is_dir():
            raise SpecError(f"cannot write {path}: it is a folder; give a file path such as {p / 'records.json'}")
        if not folder.is_dir():
            raise SpecError(f"cannot write {path}: folder {folder} does not exist (create it first)")
        if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
            raise SpecError(f"cannot write {path}: {'the file' if p.exists() else f'folder {folder}'} is not "
                            "writable (choose another path)")
