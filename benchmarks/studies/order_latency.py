"""Does a cell's latency depend on the cells before it in one process? Runs cells through
scenarios.inference.measure.run, as `transbench run` runs them (one ModelCache), in the order given, and prints for each
the sampler's figures, the fused routes it ran (and their crc), and probes of the same prepared call, taken right
after the sampler:

- host_ms: the host's time to issue one call on an idle GPU (synchronize, then the wall time until the call
  returns), median of 200; a fused call's own synchronize (attention.make_packing) waits inside it;
- sync_ms: the wall time of one call followed by a synchronize, median of 200;
- replay_ms (fused only): CUDA events around 200 back-to-back replays of the cell's captured graph, per replay: the
  GPU's time for the forward without the host's work of a call;
and the Python collections of the oldest generation during the sampler, and the CUDA segments the allocator holds.
--profile adds each graph's kernel times (torch.profiler), --keep-graphs times every cell's graph again at the end,
--no-pdl turns programmatic dependent launch off, --freeze runs gc.freeze() before each cell.

    PYTHONPATH=src python3 benchmarks/studies/order_latency.py --model bert-base-uncased --dtype fp16 --seq 128 --order 1,8

Run `transbench tune` for the shapes first, so that no cell tunes."""
from __future__ import annotations

import argparse
import gc
import statistics
import threading
import time
import zlib

import torch

from transbench.cells import Cell
from transbench.measure import timer
from transbench.scenarios.inference import measure as inference


def probe(fn, n: int = 200) -> tuple[float, float]:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    host, synced = [], []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        synced.append((t2 - t0) * 1e3)
    return statistics.median(host), statistics.median(synced)


def compiled_of(fn):
    """The CompiledModel the fused backend's prepared call closes over (backends/fused.py), or None."""
    return next((c.cell_contents for c in fn.__closure__ or () if hasattr(c.cell_contents, "engine")), None)


def newest_graph(fn):
    """The CUDA graph of the prepared call's newest captured shape, or None (another backend, or no graph)."""
    entries = getattr(getattr(getattr(compiled_of(fn), "engine", None), "graphs", None), "entries", None)
    return next(reversed(entries.values())).graph if entries else None


def replay_ms(fn, n: int = 200) -> float | None:
    """The newest graph's replay alone, back to back, per replay."""
    graph = newest_graph(fn)
    if graph is None or not torch.cuda.is_available():
        return None
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def kernel_times(fn, n: int = 50) -> list[tuple[str, float, int]]:
    """(kernel, us per replay, launches per replay) over n replays of the newest graph, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    graph = newest_graph(fn)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            graph.replay()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / n, e.count // n) for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert-base-uncased")
    ap.add_argument("--backend", default="fused")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--order", default="1,8", help="batch sizes, in the order the cells run")
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--freeze", action="store_true", help="gc.freeze() before each cell")
    ap.add_argument("--profile", action="store_true", help="print each cell's kernel times in its graph (fused)")
    ap.add_argument("--keep-graphs", action="store_true",
                    help="keep every cell's prepared call (and its graph) and time each one's replay again after the "
                         "last cell")
    ap.add_argument("--no-pdl", action="store_true", help="the fused engines with EngineOptions(pdl=False)")
    a = ap.parse_args()
    if a.no_pdl:
        import functools

        from transbench.backends import fused
        from transbench.engine import EngineOptions
        fused._compile = functools.partial(fused._compile, options=EngineOptions(pdl=False))
    orig, probes, full, kept = timer.sample, {}, [0], []
    gc.callbacks.append(lambda phase, info: phase == "start" and info["generation"] == 2 and full.__setitem__(
        0, full[0] + 1))

    def sample(fn, device, cfg=timer.TimerConfig(), **kw):
        full[0] = 0
        out = orig(fn, device, cfg, **kw)
        probes["gen2"] = full[0]
        probes["host_ms"], probes["sync_ms"] = probe(fn)
        probes["replay_ms"] = replay_ms(fn)
        probes["kernels"] = kernel_times(fn) if a.profile and probes["replay_ms"] is not None else []
        if a.keep_graphs:
            kept.append(fn)
        if torch.cuda.is_available():
            probes["segments"] = torch.cuda.memory_stats().get("segment.all.current")
        return out

    timer.sample = sample
    cache = inference.ModelCache()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for i, b in enumerate(int(x) for x in a.order.split(",")):
        if a.freeze:
            gc.collect()
            gc.freeze()
        objects, threads = len(gc.get_objects()), threading.active_count()
        cell = Cell(model=a.model, task="base", backend=a.backend, dtype=a.dtype, batch=b, seq=a.seq, device=device,
                    embeddings=False, min_time=a.min_time)
        res = inference.run(cell, cache)
        rec, st = res.record or {}, (res.info or {}).get("stats", {})
        ctx = (res.info or {}).get("device_context", {})
        print(f"{a.label} cell {i} {b}x{a.seq} {res.status} median_ms {rec.get('latency_ms', 0):.4f} "
              f"min {st.get('min_ms', 0):.4f} p90 {st.get('p90_ms', 0):.4f} n {st.get('n')} "
              f"host_ms {probes.get('host_ms', 0):.4f} sync_ms {probes.get('sync_ms', 0):.4f} "
              f"replay_ms {probes.get('replay_ms') or 0:.4f} gen2 {probes.get('gen2')} "
              f"segments {probes.get('segments')} "
              f"sm {ctx.get('sm_clock_min_mhz')}-{ctx.get('sm_clock_mhz')} objects {objects} threads {threads}",
              flush=True)
        for shape, t in (res.info or {}).get("engine_tuning", {}).items():
            routes = sorted((t["routes"] or {}).items())
            print(f"{a.label} cell {i} routes {shape} crc {zlib.crc32(str(routes).encode()):08x} {routes}")
        for name, us, count in probes["kernels"]:
            print(f"{a.label} cell {i} kernel {us:9.2f} us {count:3d}x {name[:110]}")
    for i, fn in enumerate(kept):
        print(f"{a.label} after the last cell, cell {i}'s graph: replay_ms {replay_ms(fn) or 0:.4f}")


if __name__ == "__main__":
    main()
