"""Where one `run` cell's peak memory goes (CUDA only): the cell runs through scenarios.inference.measure.run as `transbench
run` runs it, and this prints what is allocated before and after scenarios.inference.measure.settle, the CUDA tensors
Python holds once it has captured again, and the allocations live at the peak, grouped by where they were made.

    PYTHONPATH=src python3 benchmarks/cell_memory.py --model bert-base-uncased --dtype fp8 --batch 256 --seq 128

Run it twice with one TRANSBENCH_CACHE_DIR: the first run tunes in the cell, the second finds its routes on disk."""
from __future__ import annotations

import argparse
import gc
from collections import Counter, defaultdict

import torch

from transbench.cells import Cell
from transbench.scenarios.inference import measure as inference


def mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def live_tensors(top: int = 10) -> list[str]:
    """The largest groups of CUDA tensors Python holds, by shape and dtype (storage shared between views counted
    once)."""
    seen, sizes, counts = set(), Counter(), Counter()
    for o in gc.get_objects():
        try:
            if not (isinstance(o, torch.Tensor) and o.is_cuda):
                continue
            st = o.untyped_storage()
        except Exception:  # noqa: BLE001 - a half-built object
            continue
        k = (tuple(o.shape), str(o.dtype))
        counts[k] += 1
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            sizes[k] += st.nbytes()
    return [f"{mib(b)} MiB: {counts[k]} x {k[0]} {k[1]}" for k, b in sizes.most_common(top)]


def where(frames: list[dict]) -> str:
    """An allocation's site: its innermost transbench frame and the innermost frame."""
    ours = next((f for f in frames if "transbench" in f["filename"]), None)
    inner = frames[0] if frames else None
    fmt = lambda f: f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}" if f else "?"
    return f"{fmt(ours)} <- {fmt(inner)}" if ours is not inner else fmt(ours)


def peak_sites(snapshot: dict, start_bytes: int, top: int = 12) -> list[str]:
    """Replays the trace's allocations and frees to the moment allocated memory peaked; the blocks live then that
    the trace saw allocated, summed per site."""
    events = snapshot["device_traces"][0]
    live, total, peak, at = {}, start_bytes, start_bytes, {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
        elif e["action"] == "free_completed":  # a block from before the trace counts in start_bytes
            live.pop(e["addr"], None)
            total -= e["size"]
        if total > peak:
            peak, at = total, dict(live)
    sites = defaultdict(int)
    for e in at.values():
        sites[where(e.get("frames", []))] += e["size"]
    lines = [f"peak {mib(peak)} MiB allocated ({mib(start_bytes)} before the trace began)"]
    lines += [f"  {mib(b)} MiB  {s}" for s, b in sorted(sites.items(), key=lambda kv: -kv[1])[:top]]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert-base-uncased")
    ap.add_argument("--dtype", default="fp8")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--label", default="cell")
    a = ap.parse_args()
    say = lambda *xs: print(a.label, *xs, flush=True)
    device = torch.device("cuda")
    orig = inference.settle

    def settle(prepared, dev):  # the scenario's own settle, unchanged, with readings around it (no collection:
        # one here would hide whatever garbage the first call left, which the real settle does not collect)
        say("allocated after the first call", mib(torch.cuda.memory_allocated()))
        torch.cuda.memory._record_memory_history(max_entries=500_000, stacks="python")
        settle.start = torch.cuda.memory_allocated()
        orig(prepared, dev)
        say("allocated after the second capture", mib(torch.cuda.memory_allocated()))
        for line in live_tensors():
            say("  held:", line)

    inference.settle = settle
    cell = Cell(model=a.model, task="base", backend="fused", dtype=a.dtype, batch=a.batch, seq=a.seq, device="cuda",
                embeddings=False, min_time=0.3)
    res = inference.run(cell, inference.ModelCache())
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    mem = (res.info or {}).get("memory", {})
    rec = res.record or {}
    say("status", res.status, res.error or "", "latency_ms", rec.get("latency_ms"), "seq/s",
        rec.get("throughput_per_s"), "peak_mem_mb", mem.get("peak_mem_mb"), "held_at_reset_mb",
        mem.get("held_at_reset_mb"))
    for line in peak_sites(snap, settle.start):
        say(line)
    for shape, t in (res.info or {}).get("engine_tuning", {}).items():
        say("routes", shape, sorted((t["routes"] or {}).items()))


if __name__ == "__main__":
    main()
