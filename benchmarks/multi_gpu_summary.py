"""The markdown summary of benchmarks/multi_gpu.sh, from its stores: python3 benchmarks/multi_gpu_summary.py OUT.

Tables: collectives (time, algbw, busbw per size and op), training (samples/s, MFU, scaling efficiency, gradient
all-reduce time and share, per-GPU memory split), DataParallel against DDP, data-parallel inference (throughput
and efficiency against one GPU), and one lane against one lane per GPU (wall times, each cell's ratio)."""

from __future__ import annotations

import os
import re
import signal
import sys

from transbench import api

# NVLink 4 (H100 and H200 SXM): 18 links of 50 GB/s, 900 GB/s per GPU both ways together, 450 GB/s each way.
# nccl-tests' busbw is what each GPU's links carry in one direction, so it is read against the one-way rate.
LINK_GBS = {"H100": 450.0, "H200": 450.0}


def fmt(v, spec=".4g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def table(head: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def records(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    try:
        return api.records(path)
    except Exception as exc:  # noqa: BLE001 - a summary says what it could not read and goes on
        print(f"cannot read {path}: {exc}", file=sys.stderr)
        return []


def size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def collectives(out: str) -> list[str]:
    recs = [r for r in records(os.path.join(out, "micro.db")) if r.get("scenario") == "micro-collectives"]
    if not recs:
        return []
    ops = list(dict.fromkeys(r["op"] for r in recs))
    by = {(r["op"], r["bytes"]): r for r in recs}
    rows = []
    for b in sorted({r["bytes"] for r in recs}):
        row = [size(b)]
        for op in ops:
            r = by.get((op, b))
            if r is None or r["status"] != "ok":
                row += [r["status"] if r else "-", "", ""]
            else:
                row += [fmt(r["latency_ms"] * 1e3), fmt(r["algbw_gbs"]), fmt(r["busbw_gbs"])]
        rows.append(row)
    n, gpu = recs[0].get("world_size"), recs[0].get("gpu")
    lines = [f"## Collectives: {n} x {gpu}, {recs[0].get('dtype')} (`micro collectives`)", "",
             table(["bytes"] + [f"{op} {u}" for op in ops for u in ("us", "algbw GB/s", "busbw GB/s")], rows), ""]
    top = by.get(("all-reduce", max(b for o, b in by if o == "all-reduce"))) if any(o == "all-reduce" for o, _ in by) else None
    link = next((v for k, v in LINK_GBS.items() if gpu and k in gpu), None)
    if top and top["status"] == "ok":
        against = f", {100 * top['busbw_gbs'] / link:.0f}% of NVLink 4's {link:g} GB/s each way" if link else ""
        lines += [f"All-reduce at {size(top['bytes'])}: busbw {top['busbw_gbs']:.4g} GB/s{against} "
                  "(NCCL_NVLS_ENABLE=0: no NVLink SHARP).", ""]
    return lines


TRAIN_HEAD = ["model", "strategy", "ZeRO", "GPUs", "nccl", "batch/GPU", "status", "step ms", "samples/s", "MFU",
              "scaling", "all-reduce ms", "share", "exposed ms", "hook busbw", "peak MiB/GPU", "params", "grads",
              "optim", "activ."]


def train_row(r: dict) -> list:
    bad = r["status"] != "ok"
    return [r["model"], r["strategy"], fmt(r.get("zero_stage")), r.get("world_size"), r.get("nccl") or "-",
            r.get("batch_size"), r["status"] if not bad else f"{r['status']}: {(r.get('error') or '')[:80]}".replace("|", "/"),
            fmt(r.get("latency_ms")), fmt(r.get("samples_per_s")), pct(r.get("mfu")),
            pct(r.get("scaling_efficiency")), fmt(r.get("allreduce_ms")), pct(r.get("comm_share")),
            fmt(r.get("allreduce_exposed_ms")), fmt(r.get("allreduce_busbw_gbs")), fmt(r.get("peak_mem_mb"), ".0f"),
            fmt(r.get("params_mb"), ".0f"), fmt(r.get("grads_mb"), ".0f"), fmt(r.get("optim_state_mb"), ".0f"),
            fmt(r.get("activations_mb"), ".0f")]


def training(out: str) -> list[str]:
    recs = [r for r in records(os.path.join(out, "train.db")) if r.get("scenario") == "training"]
    if not recs:
        return []
    order = {"none": 0, "dp": 1, "ddp": 2, "fsdp": 3, "deepspeed": 4}
    recs.sort(key=lambda r: (r["model"], order.get(r["strategy"], 9), r.get("nccl") or "", r.get("zero_stage") or 0,
                             r.get("world_size") or 0))
    gpu = next((r["gpu"] for r in recs if r.get("gpu")), None)
    kinds = sorted({f"{r.get('dtype')} {r.get('optim')}" for r in recs})
    lines = [f"## Training on {gpu}: {', '.join(kinds)}; batch per GPU (`train`)", "",
             "Scaling = (samples/s over N GPUs / N) / samples/s of the same step on one GPU. All-reduce: DDP's gradient "
             "all-reduce per step (a comm hook timing each bucket with CUDA events: the union of the buckets' spans), "
             "its share of the step, the part after the backward's last bucket (exposed), and the bus bandwidth it ran "
             "at. Memory per GPU: the GPU with the highest peak, its split.", "",
             table(TRAIN_HEAD, [train_row(r) for r in recs]), ""]
    dp = [r for r in recs if r["strategy"] in ("none", "dp", "ddp") and not r.get("nccl")
          and any(x["strategy"] == "dp" for x in recs if x["model"] == r["model"])]
    if dp:
        lines += ["### DataParallel (one process) against DDP (one process per GPU)", "",
                  table(["model", "strategy", "GPUs", "samples/s", "scaling", "step ms", "peak MiB/GPU"],
                        [[r["model"], r["strategy"], r["world_size"], fmt(r.get("samples_per_s")),
                          pct(r.get("scaling_efficiency")), fmt(r.get("latency_ms")), fmt(r.get("peak_mem_mb"), ".0f")]
                         for r in dp]), ""]
    low = [r for r in recs if r["status"] == "ok" and r.get("scaling_efficiency") is not None
           and r["scaling_efficiency"] < 0.9]
    for r in low:
        why = (f"gradient all-reduce {r['allreduce_ms']:.3g} ms a step ({pct(r.get('comm_share'))}), "
               f"{r.get('allreduce_exposed_ms') or 0:.3g} ms of it after the backward"
               if r.get("allreduce_ms") is not None else "no all-reduce timing for this strategy: see its phases")
        # the stage and the NCCL setting name the cell: two cells of one strategy and GPU count differ by them
        what = " ".join([r["strategy"]] + ([f"ZeRO-{r['zero_stage']}"] if r.get("zero_stage") else [])
                        + ([r["nccl"]] if r.get("nccl") else []))
        lines.append(f"- {r['model']} {what} on {r['world_size']} GPUs: {pct(r['scaling_efficiency'])} "
                     f"scaling; step {r['latency_ms']:.4g} ms (forward {fmt(r.get('forward_ms'))}, backward "
                     f"{fmt(r.get('backward_ms'))}, optimizer {fmt(r.get('optimizer_ms'))}); {why}.")
    return lines + ([""] if low else [])


def inference(out: str) -> list[str]:
    recs = [r for r in records(os.path.join(out, "infer.db")) if r.get("scenario") in ("inference", None)
            and r.get("batch_size") == 256]
    if not recs:
        return []
    one = {(r["model"], r["seq_len"]): r for r in recs if (r.get("world_size") or 1) == 1 and r["status"] == "ok"}
    rows = []
    for r in sorted(recs, key=lambda r: (r["model"], r["seq_len"], r.get("world_size") or 1)):
        n = r.get("world_size") or 1
        base = one.get((r["model"], r["seq_len"]))
        eff = (r["throughput_per_s"] / (n * base["throughput_per_s"])
               if base and r["status"] == "ok" and r.get("throughput_per_s") else None)
        rows.append([r["model"], r["seq_len"], n, r["status"], fmt(r.get("latency_ms")), fmt(r.get("throughput_per_s")),
                     pct(eff), pct(r.get("mfu")), fmt(r.get("rel_err"), ".2g")])
    return [f"## Data-parallel inference (`run --nproc N`), fp16 sdpa, batch 256 split over N GPUs", "",
            table(["model", "seq", "GPUs", "status", "ms / batch", "sequences/s", "efficiency", "MFU", "rel_err"], rows),
            ""]


def lanes(out: str) -> list[str]:
    recs = records(os.path.join(out, "lanes.db"))
    if not recs:
        return []
    walls = {}
    path = os.path.join(out, "walls.txt")
    if os.path.exists(path):
        for line in open(path):
            m = re.match(r"(lanes_\w+) rc=(\S+) wall_s=(\S+)", line)
            if m:
                walls[m.group(1)] = (m.group(2), m.group(3))
    key = lambda r: (r["model"], r["backend"], r["dtype"], r["batch_size"], r["seq_len"])  # noqa: E731
    ok = lambda name: {key(r): r for r in recs if r["run_name"] == name and r["status"] == "ok"}  # noqa: E731
    one, many, again = ok("lanes-one"), ok("lanes-all"), ok("lanes-one-again")
    rows, within, spread = [], 0, 0
    for k in sorted(set(one) & set(many)):
        ratio = many[k]["latency_ms"] / one[k]["latency_ms"]
        within += abs(ratio - 1) <= 0.05
        row = [*k, fmt(one[k]["latency_ms"]), fmt(many[k]["latency_ms"]), f"{ratio:.3f}"]
        if k in again:
            # the lanes' figure against the range of the two one-lane runs, widened by 5%
            lo = min(one[k]["latency_ms"], again[k]["latency_ms"]) * 0.95
            hi = max(one[k]["latency_ms"], again[k]["latency_ms"]) * 1.05
            inside = lo <= many[k]["latency_ms"] <= hi
            spread += inside
            row += [fmt(again[k]["latency_ms"]), f"{again[k]['latency_ms'] / one[k]['latency_ms']:.3f}",
                    "yes" if inside else "no"]
        else:
            row += ["-", "-", "-"]
        rows.append(row + [many[k].get("gpu") or "-"])
    lines = ["## One lane against one lane per GPU (`run --gpus`)", ""]
    for name, label in (("lanes_1", "one lane"), ("lanes_n", "--gpus (all)"), ("lanes_1b", "one lane again")):
        if name in walls:
            lines.append(f"- {label}: wall {walls[name][1]} s (exit {walls[name][0]})")
    lines += ["", f"{within} of {len(rows)} cells within 5% of the same cell on one lane."]
    if again:
        lines.append(f"{spread} of {len(rows)} cells within the two one-lane runs' range widened by 5% "
                     "(one lane's own run-to-run change: the 'again' ratio).")
    lines += ["", table(["model", "backend", "dtype", "batch", "seq", "one lane ms", "lanes ms", "ratio",
                         "one lane again ms", "again ratio", "in range", "gpu"], rows), ""]
    return lines


def main(out: str) -> None:
    lines = ["# Multi-GPU tables (benchmarks/multi_gpu.sh)", ""]
    host = os.path.join(out, "host.txt")
    if os.path.exists(host):
        text = open(host).read().splitlines()
        lines += [f"Host `{text[0] if text else '?'}`; GPUs:", "", "```", *[t for t in text[1:] if t.startswith("GPU ")],
                  "```", ""]
    for part in (collectives, training, inference, lanes):
        lines += part(out)
    walls = os.path.join(out, "walls.txt")
    if os.path.exists(walls):
        lines += ["## Wall time per step of the script", "", "```", *open(walls).read().splitlines(), "```"]
    print("\n".join(lines))


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly, as it does a shell tool
    main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/out"))
