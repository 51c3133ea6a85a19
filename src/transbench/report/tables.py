"""Markdown-ready tables of a report: the engine README shape (one table per model, task, dtype and
sequence length; a row per batch size; latency and QPS per backend), the per-cell detail, and the
generation, training, max-batch and micro-benchmark tables."""

from __future__ import annotations

from ..store import export
from .data import ReportData, by_scenario, groups, is_ok, sorted_values
from .document import STATUS_TEXT, Table, cell, measured, num

PRIVATE = "_"
# Keys that identify a run or say nothing about a micro-benchmark point.
META_KEYS = {"run_id", "run_name", "scenario", "error", "speedup", "mem_saved"}
MEASURED = {*export.SPEED_KEYS, "n_samples", "peak_mem_mb", "rel_err"}
FRACTIONS = {"mfu", "share"}  # micro keys stored as 0..1 (pct_of_peak is already in percent)


def _labels(recs: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["_label"] for r in recs))


def engine_tables(data: ReportData) -> list[Table]:
    """As in the seeds' engine README: `| Batch size | X Latency (ms) | X QPS (seq/s) | ... |`."""
    tables = []
    inference = by_scenario(data.records, "inference")
    for (model, task, dtype, seq), recs in groups(inference, ("model", "task", "dtype", "seq_len")).items():
        labels = _labels(recs)
        cell = {(r["_label"], r.get("batch_size")): r for r in recs}
        headers = ["Batch size"] + [h for lab in labels for h in (f"{lab} Latency (ms)", f"{lab} QPS (seq/s)")]
        rows = []
        for batch in sorted_values(recs, "batch_size"):
            row = [str(batch)]
            for lab in labels:
                r = cell.get((lab, batch))
                row += ["", ""] if r is None else [measured(r, "latency_ms"), measured(r, "throughput_per_s")]
            rows.append(row)
        tables.append(Table(f"{model} · {task} · {dtype} · sequence length {seq}", headers, rows))
    return tables


def _run_col(data: ReportData) -> list[tuple[str, str, str]]:
    return [("run_name", "run", "")] if data.multi_run else []


IDENTITY = {"run_name", "model", "task", "backend", "dtype", "quant", "batch_size", "seq_len", "world_size",
            "strategy", "status", "device", "gpu"}


def _detail(data: ReportData, recs: list[dict], title: str, cols: list[tuple[str, str, str]], note: str = "",
            identity: set[str] = IDENTITY) -> Table:
    """cols: (record key, header, number kind). Identity columns print as they are; measured ones through
    `measured`, so a cell that is not ok shows its status there."""
    rows = []
    for r in recs:
        row = []
        for key, _, kind in cols:
            if key in identity:
                v = r.get(key)
                # a training axis such as grad_ckpt printed Python's True/False: true/false as every table has it
                row.append(STATUS_TEXT.get(v, v) if key == "status" else "" if v is None else
                           cell(key, v) if isinstance(v, bool) else str(v))
            elif key == "iqr_pct":
                row.append(_iqr_ratio(r))
            elif key == "repeat_range":
                row.append(_repeat_range(r))
            else:
                row.append(measured(r, key, kind))
        rows.append(row)
    return Table(title, [c[1] for c in cols], rows, note)


def _repeat_range(r: dict) -> str:
    if not is_ok(r) or r.get("latency_repeat_min_ms") is None:
        return ""
    return f"{num(r['latency_repeat_min_ms'])}-{num(r['latency_repeat_max_ms'])} ({r.get('repeats')}x)"


def _iqr_ratio(r: dict) -> str:
    if not is_ok(r):
        return measured(r, "latency_ms")
    if r.get("latency_iqr_ms") is None or not r.get("latency_ms"):
        return ""
    return num(r["latency_iqr_ms"] / r["latency_ms"], "pct")


def inference_detail(data: ReportData) -> Table | None:
    recs = by_scenario(data.records, "inference")
    if not recs:
        return None
    cols = [*_run_col(data), ("model", "model", ""), ("task", "task", ""), ("backend", "backend", ""),
            ("dtype", "dtype", ""), ("batch_size", "batch", ""), ("seq_len", "seq", ""), ("status", "status", ""),
            ("latency_ms", "median ms", ""), ("latency_p99_ms", "p99 ms", ""), ("iqr_pct", "IQR/median", ""),
            ("n_samples", "n", ""), ("throughput_per_s", "seq/s", ""), ("tokens_per_s", "tokens/s", ""),
            ("tflops", "TFLOPS", ""), ("mfu", "MFU", "pct"), ("peak_mem_mb", "peak MiB", ""),
            ("rel_err", "rel err", "err")]
    if any(r.get("quant") not in (None, "none") for r in recs):
        cols.insert(cols.index(("dtype", "dtype", "")) + 1, ("quant", "quant", ""))
    if any(r.get("task_agreement") is not None for r in recs):
        cols.append(("task_agreement", "agreement", "pct"))
    if any(r.get("host_ms") is not None for r in recs):
        cols.insert(cols.index(("n_samples", "n", "")), ("host_ms", "host ms", ""))
    if any(r.get("latency_repeat_min_ms") is not None for r in recs):  # `run --repeat`: the repeats' medians, min-max
        cols.insert(cols.index(("latency_p99_ms", "p99 ms", "")), ("repeat_range", "repeats ms", ""))
        cols += [("speedup", "speedup %", "signed"), ("mem_saved", "mem saved %", "signed")]
    bases = sorted({str(r["_baseline"]) for r in recs if r.get("_baseline")})
    note = ("MFU against the dense datasheet peak of the dtype (empty on devices without a known peak). "
            "IQR/median over 5% marks a noisy cell.")
    if any(r.get("host_ms") is not None for r in recs):
        note += (" Host ms: the host's time inside one call; at 90% of the median or more the cell is host-bound, "
                 "its time the CPU's.")
    if bases:
        note += f" Speedup and memory saved against {', '.join(bases)}."
    return _detail(data, recs, "every inference cell", cols, note)


def generation_table(data: ReportData) -> Table | None:
    recs = by_scenario(data.records, "generation")
    if not recs:
        return None
    cols = [*_run_col(data), ("model", "model", ""), ("backend", "backend", ""), ("dtype", "dtype", ""),
            ("batch_size", "batch", ""), ("seq_len", "prompt", ""), ("status", "status", ""),
            ("prefill_ms", "prefill ms", ""), ("decode_ms_per_token", "decode ms/token", ""),
            ("latency_ms", "total ms", ""), ("tokens_per_s", "new tokens/s", ""), ("tflops", "TFLOPS", ""),
            ("peak_mem_mb", "peak MiB", ""), ("rel_err", "rel err", "err")]
    if any(r.get("kv_cache_mb") is not None for r in recs):
        cols += [("kv_cache_mb", "KV cache MiB", ""), ("kv_cache_analytic_mb", "KV analytic MiB", "")]
    return _detail(data, recs, "generation", cols)


# Training axes beyond the columns every training row shows: each one whose value differs between the rows gets
# a column. Without them, `train --grad-ckpt off,on` gave two rows with the same label and different numbers.
TRAINING_AXES = (("task", "task"), ("optim", "optim"), ("grad_accum", "accum"), ("grad_ckpt", "grad ckpt"),
                 ("compile", "compile"), ("kernels", "kernels"), ("head", "head"), ("activation", "activation"),
                 ("dropout", "dropout"), ("pad_vocab", "pad vocab"),
                 ("zero_stage", "ZeRO"), ("nccl", "nccl"), ("lr", "lr"), ("seed", "seed"))


def training_table(data: ReportData) -> Table | None:
    recs = by_scenario(data.records, "training")
    if not recs:
        return None
    axes = [(k, label, "") for k, label in TRAINING_AXES if len({repr(r.get(k)) for r in recs}) > 1]
    cols = [*_run_col(data), ("model", "model", ""), ("backend", "attention", ""), ("dtype", "precision", ""),
            ("batch_size", "batch", ""), ("seq_len", "seq", ""), ("world_size", "GPUs", ""),
            ("strategy", "strategy", ""), *axes, ("status", "status", ""), ("latency_ms", "step ms", ""),
            ("samples_per_s", "samples/s", ""), ("tokens_per_s", "tokens/s", ""),
            ("tflops_per_gpu", "TFLOPS/GPU", ""), ("mfu", "MFU", "pct"), ("peak_mem_mb", "peak MiB", "")]
    if any(r.get("hfu") is not None for r in recs):  # differs from MFU for checkpointed and full-head MLM cells
        cols.insert(cols.index(("mfu", "MFU", "pct")) + 1, ("hfu", "HFU", "pct"))
    return _detail(data, recs, "training", cols, identity=IDENTITY | {k for k, _, _ in axes})


def max_batch_table(data: ReportData) -> Table | None:
    recs = by_scenario(data.records, "max-batch")
    if not recs:
        return None
    cols = [*_run_col(data), ("model", "model", ""), ("task", "task", ""), ("backend", "backend", ""),
            ("dtype", "dtype", ""), ("seq_len", "seq", ""), ("status", "status", ""),
            ("batch_size", "largest batch", ""), ("latency_ms", "median ms", ""),
            ("throughput_per_s", "seq/s", "")]
    # The batch is what a max-batch cell measured: a failed search is stored at batch 0, and showed "largest
    # batch 0" beside its error; it says its status there, as every measured column does.
    return _detail(data, recs, "largest batch that fits", cols, identity=IDENTITY - {"batch_size"})


def micro_tables(data: ReportData) -> list[Table]:
    """One table per micro-benchmark kind, with the keys its rows carry (they differ by kind)."""
    tables = []
    scenarios = sorted({r["scenario"] for r in data.records if str(r.get("scenario")).startswith("micro-")})
    for scen in scenarios:
        recs = by_scenario(data.records, scen)
        keys = [k for k in dict.fromkeys(k for r in recs for k in r)
                if not k.startswith(PRIVATE) and k not in META_KEYS and any(r.get(k) is not None for r in recs)]
        # Sizes and names (ints, text) say which point it is; floats are what was measured.
        shape = {k for k in keys if k not in MEASURED and all(
            isinstance(r.get(k), (int, str)) and not isinstance(r.get(k), bool) for r in recs if r.get(k) is not None)}
        keys = [k for k in keys if k in shape and k != "status"] + [k for k in keys if k not in shape] + ["status"]
        # mfu and a breakdown part's share are fractions (0..1): shown as percentages, as the CLI prints them
        cols = [*_run_col(data)] + [(k, k, "pct" if k in FRACTIONS else "err" if k == "rel_err" else "") for k in keys]
        tables.append(_detail(data, recs, scen, cols, identity=IDENTITY | shape))
    return tables


def problems_table(data: ReportData) -> Table | None:
    """Cells without a valid measurement, with the reason, so nobody mistakes a gap for a result."""
    bad = [r for r in data.records if r.get("status") != "ok"]
    if not bad:
        return None
    from .compare import settings

    # The task, and the other settings of the cell key that take two values among these cells (GPUs, a serve
    # rate, a GEMM's size, ...): two failed cells that differed only there were two identical rows.
    shown = {"scenario", "model", "task", "backend", "dtype", "batch", "seq", "batch_size", "seq_len"}
    keys = [settings(r) for r in bad]
    names = dict.fromkeys(n for k in keys for n in k if n not in shown)
    others = [n for n in names if len({repr(k[n]) for k in keys if n in k}) > 1]
    rows = [[*([r["run_name"]] if data.multi_run else []),
             *(num(r.get(k)) for k in ("scenario", "model", "task", "backend", "dtype", "batch_size", "seq_len")),
             *([" ".join(f"{n}={key[n]}" for n in others if n in key)] if others else []),
             STATUS_TEXT.get(r["status"], r["status"]), (r.get("error") or "")[:300]] for r, key in zip(bad, keys)]
    headers = [*(["run"] if data.multi_run else []), "scenario", "model", "task", "backend", "dtype", "batch", "seq",
               *(["settings"] if others else []), "status", "reason"]
    return Table("cells without a valid measurement", headers, rows,
                 "No speed is reported or plotted for these cells.")


def runs_table(data: ReportData) -> Table:
    rows = []
    for run in data.runs:
        env = run.get("env") or {}
        gpus = env.get("gpus") or []
        recs = [r for r in data.records if r["run_id"] == run["run_id"]]
        counts = {}
        for r in recs:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        statuses = ", ".join(f"{n} {STATUS_TEXT.get(s, s)}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        rows.append([run["name"], run["run_id"], run["kind"], run["created"],
                     ", ".join(sorted({str(g.get("name", "?")) if isinstance(g, dict) else str(g) for g in gpus}))
                     or "cpu",
                     *(str(env.get(k) or "") for k in ("torch", "transformers", "cuda", "driver")),
                     str(data.baselines.get(run["run_id"]) or ""), statuses])
    return Table("", ["run", "id", "kind", "created", "GPU", "torch", "transformers", "CUDA", "driver",
                      "baseline", "cells"], rows)
