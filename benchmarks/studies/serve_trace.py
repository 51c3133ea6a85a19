"""Where the slow batches of `transbench serve` spend their time. It found the fused tail to be the harness,
not the engine: in one process the tail was absent, which led to the frozen heap and the monitor's mark
(scenarios/serve/load.py run_load, measure/context.py Monitor.mark).

One process; each (backend, rate) cell is run by the serve scenario's own `run()` (gate, warm-up of every
bucket, Monitor, accounting: what a `transbench serve` worker runs per cell), with its `run_load` swapped for
one that wraps the server's `serve` and records per batch:

  start/end (perf_counter), requests, tokens (sum of lengths), idle gap since the previous batch ended,
  the main thread's CPU time, host parts (pre: mask build + copy; fn: prepared.fn(); pack: the fused engine's
  make_packing inside fn, its one host sync; post: output + .cpu()), GPU time from CUDA events recorded around
  the call, around fn and around each CUDA graph replay (read after the load), engine graphs captured during the
  batch, new buckets prepared under load, and the Python GC collections (gc.callbacks: start, stop, generation,
  thread) that overlapped it.

  PYTHONPATH=src python3 benchmarks/studies/serve_trace.py --backend fused,cudagraph --rates 36,300,2000 --duration 2
  PYTHONPATH=src python3 benchmarks/studies/serve_trace.py --device cpu --model bert-tiny --backend sdpa,fused --rates 50

Reading it: gpu and gpu_fn are spans on the GPU's clock, so they include the GPU waiting for the host's launches;
replay is the graph's kernels alone (launched at once). A slow batch with a slow replay is the GPU itself (clocks
after an idle gap: compare the gap > 10 ms line and the sm clock line); with a fast replay it is the host: cpu ~
host is Python work on the main thread, host >> cpu is waiting (a sync, the GIL held by another thread, the
thread descheduled); a gc entry names a collection inside the batch; graphs > 0 a capture under load.
Stats cover the measured window (batches starting after --warmup), as the cell's service_* keys do."""
from __future__ import annotations

import argparse
import gc
import sys
import threading
import time

GAP_MS = 10.0  # batches after an idle gap longer than this are compared with the rest (clocks ramp after idling)
SLOWEST = 10


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backend", default="fused,cudagraph", help="backends, comma-separated")
    ap.add_argument("--rates", default="36,300,2000", help="Poisson rates, requests/s, comma-separated")
    ap.add_argument("--model", default="bert-base-uncased")
    ap.add_argument("--task", default="classification")
    ap.add_argument("--dtype", default=None, help="default: fp16 on CUDA, fp32 on the CPU")
    ap.add_argument("--device", default="cuda", help="cuda|cuda:N|cpu")
    ap.add_argument("--lengths", default="lognormal:64:256")
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--max-wait-ms", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=2.0, help="measured seconds of arrivals per cell")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of arrivals served first, not counted")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


class Tracer:
    """Installed around one load: wraps the server's serve and each prepared.fn, and listens to the GC."""

    def __init__(self, torch, cuda: bool):
        self.torch, self.cuda = torch, cuda
        self.batches: list[dict] = []
        self.gcs: list[tuple] = []  # (start, stop, generation, thread), seconds from t0
        self._gc_open = None
        self._cur: dict | None = None

    # -- set up / tear down -------------------------------------------------------------------------------------
    def begin(self, server, plan) -> None:
        self.server, self.plan = server, plan
        self.batches, self.gcs = [], []
        self.wrapped: set = set()
        self._wrap_new()
        self.counts_graphs = any(p.graphs for _, p, _ in server.prepared.values())
        self._graphs = server.engine_graphs() if self.counts_graphs else 0
        # Events made before the load, not in it: at most one batch per arrival, six events a batch.
        n = 6 * (len(plan.arrivals or []) + 8) if self.cuda else 0
        self.pool = [self.torch.cuda.Event(enable_timing=True) for _ in range(n)]
        # The fused engine's packing (one host sync per call) is looked up in its module at call time.
        self.base = sys.modules.get("transbench.engine.base")
        if self.base is not None:
            self._make_packing = self.base.make_packing
            self.base.make_packing = self._packing
        # Graph replays (cudagraph, fused) bracketed by events: the GPU time of the graph's kernels alone, launched
        # at once, so no host delay falls inside; gpu(fn) minus it is host-paced work and waiting.
        if self.cuda:
            self._replay = self.torch.cuda.CUDAGraph.replay
            tracer = self

            def replay(graph, *args, **kwargs):
                cur = tracer._cur
                if cur is None:
                    return tracer._replay(graph, *args, **kwargs)
                e = tracer._event()
                out = tracer._replay(graph, *args, **kwargs)
                cur["replays"].append((e, tracer._event()))
                return out

            self.torch.cuda.CUDAGraph.replay = replay
        gc.callbacks.append(self._gc)
        self.t0 = time.perf_counter()

    def end(self) -> None:
        gc.callbacks.remove(self._gc)
        if self.base is not None:
            self.base.make_packing = self._make_packing
        if self.cuda:
            self.torch.cuda.CUDAGraph.replay = self._replay
        for _, p, _ in self.server.prepared.values():
            p.fn = getattr(p.fn, "orig", p.fn)
        if self.cuda:  # elapsed times are read now, never during the load
            self.torch.cuda.synchronize()
            for b in self.batches:
                ev = b.pop("ev")
                if ev is not None:
                    b["gpu"] = ev[0].elapsed_time(ev[3])
                    b["gpu_fn"] = ev[1].elapsed_time(ev[2]) if b["fn0"] is not None else None
                    reps = b.pop("replays")
                    b["replay"] = sum(a.elapsed_time(z) for a, z in reps) if reps else None
        for b in self.batches:
            b["gc"] = "".join(str(g) + ("a" if th != "MainThread" else "")
                              for s, e, g, th in self.gcs if s < b["end"] and e > b["start"])

    def _wrap_new(self) -> None:
        for key, (_, p, _) in self.server.prepared.items():
            if key not in self.wrapped:
                p.fn = self._fn(p.fn)
                self.wrapped.add(key)

    # -- hooks --------------------------------------------------------------------------------------------------
    def _event(self):
        if not self.cuda:
            return None
        ev = self.pool.pop() if self.pool else self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _fn(self, orig):
        def fn():
            cur = self._cur
            if cur is None:
                return orig()
            cur["e1"] = self._event()
            cur["fn0"] = time.perf_counter()
            out = orig()
            cur["fn1"] = time.perf_counter()
            cur["e2"] = self._event()
            return out

        fn.orig = orig
        return fn

    def _packing(self, *args, **kwargs):
        t = time.perf_counter()
        out = self._make_packing(*args, **kwargs)
        if self._cur is not None:
            self._cur["pack"] = (self._cur["pack"] or 0.0) + time.perf_counter() - t
        return out

    def _gc(self, phase, info) -> None:
        t = time.perf_counter() - self.t0
        if phase == "start":
            self._gc_open = (t, info["generation"], threading.current_thread().name)
        elif self._gc_open is not None:
            s, g, th = self._gc_open
            self.gcs.append((s, t, g, th))
            self._gc_open = None

    def wrap(self, serve_batch):
        def traced(requests):
            cur = self._cur = {"fn0": None, "fn1": None, "e1": None, "e2": None, "pack": None, "replays": []}
            c0 = time.thread_time()
            e0 = self._event()
            t0 = time.perf_counter()
            out = serve_batch(requests)
            t1 = time.perf_counter()
            e3 = self._event()
            c1 = time.thread_time()
            self._cur = None
            # Book-keeping after the timed window (it falls in the next batch's idle gap).
            prev = self.batches[-1]["end"] if self.batches else None
            start, end = t0 - self.t0, t1 - self.t0
            graphs = self._graphs
            if self.counts_graphs:
                self._graphs = self.server.engine_graphs()
            new = len(self.server.prepared) - len(self.wrapped)
            if new:
                self._wrap_new()
            fn0, fn1 = cur["fn0"], cur["fn1"]
            self.batches.append({
                "start": start, "end": end, "n": len(requests), "tokens": sum(r.length for r in requests),
                "gap": None if prev is None else (start - prev) * 1e3, "host": (t1 - t0) * 1e3,
                "cpu": (c1 - c0) * 1e3, "fn0": fn0,
                "pre": None if fn0 is None else (fn0 - t0) * 1e3, "fn": None if fn0 is None else (fn1 - fn0) * 1e3,
                "post": None if fn1 is None else (t1 - fn1) * 1e3,
                "pack": None if cur["pack"] is None else cur["pack"] * 1e3,
                "graphs": self._graphs - graphs, "new_buckets": new,
                "ev": (e0, cur["e1"], cur["e2"], e3) if self.cuda else None, "replays": cur["replays"],
                "gpu": None, "gpu_fn": None, "replay": None})
            return out

        return traced


def spread(values) -> str:
    from transbench.scenarios.serve.stats import percentile

    v = [x for x in values if x is not None]
    if not v:
        return "-"
    return f"{percentile(v, 50):.2f}/{percentile(v, 99):.2f}/{max(v):.2f}"


def mean_line(label: str, chosen: list, rest: list) -> str:
    def m(bs):
        return f"{len(bs)} batches, service mean {sum(b['host'] for b in bs) / len(bs):.2f} ms" if bs else "0 batches"
    return f"{label}: {m(chosen)}; others: {m(rest)}"


def fmt(v, width: int, digits: int = 2) -> str:
    return "-".rjust(width) if v is None else f"{v:{width}.{digits}f}"


def report(cell, result, tracer: Tracer) -> list[str]:
    rec, info = result.record, result.info
    head = f"== {cell.backend} {cell.rate:g}/s: {result.status}"
    if result.status != "ok":
        return [head + f" ({result.error})"]
    lines = [head + f"; run(): service p50/p99/max {rec['service_p50_ms']:.2f}/{rec['service_p99_ms']:.2f}/"
             f"{rec['service_max_ms']:.2f} ms, latency p99 {rec['latency_p99_ms']:.2f} ms, {rec['requests']} requests,"
             f" mean batch {rec['mean_batch']:.2f}, graphs captured under load "
             f"{info.get('engine_graphs_captured_under_load', '-')}"]
    ctx = info.get("device_context") or {}
    if ctx.get("sm_clock_mhz") is not None:  # run()'s own NVML monitor over the measured window
        lines.append(f"  sm clock MHz median {ctx['sm_clock_mhz']:g} min {ctx['sm_clock_min_mhz']:g} max "
                     f"{ctx['sm_clock_max_mhz']}; throttle {','.join(ctx['throttle_reasons']) or '-'}")
    w = cell.warmup
    bs = [b for b in tracer.batches if b["start"] >= w]
    gcs = [g for g in tracer.gcs if g[1] > w]
    if not bs:
        return lines + ["  no batch started after the warm-up"]
    lines += [
        f"  {len(bs)} batches measured (+{len(tracer.batches) - len(bs)} warm-up), requests/batch mean "
        f"{sum(b['n'] for b in bs) / len(bs):.2f}, tokens/batch mean {sum(b['tokens'] for b in bs) / len(bs):.0f}",
        f"  ms p50/p99/max  service {spread(b['host'] for b in bs)}  gpu {spread(b['gpu'] for b in bs)}  "
        f"gpu(fn) {spread(b['gpu_fn'] for b in bs)}  replay {spread(b['replay'] for b in bs)}",
        f"  ms p50/p99/max  main-thread cpu {spread(b['cpu'] for b in bs)}",
        f"  parts ms p50/p99/max  pre {spread(b['pre'] for b in bs)}  fn {spread(b['fn'] for b in bs)}  "
        f"(pack {spread(b['pack'] for b in bs)})  post {spread(b['post'] for b in bs)}",
    ]
    by_gen = {g: sum(1 for x in gcs if x[2] == g) for g in (0, 1, 2)}
    other = sum(1 for x in gcs if x[3] != "MainThread")
    durs = [(e - s) * 1e3 for s, e, _, _ in gcs]
    hit = [b for b in bs if b["gc"]]
    lines.append(f"  gc: {len(gcs)} collections (gen0 {by_gen[0]}, gen1 {by_gen[1]}, gen2 {by_gen[2]}; {other} in "
                 f"other threads), ms total {sum(durs):.2f} max {max(durs, default=0):.2f}; batches overlapping one: "
                 f"{len(hit)}")
    gap = [b for b in bs if b["gap"] is not None and b["gap"] > GAP_MS]
    lines.append("  " + mean_line(f"after idle gap > {GAP_MS:g} ms", gap, [b for b in bs if b not in gap]))
    lines.append("  " + mean_line("overlapping gc", hit, [b for b in bs if not b["gc"]]))
    new = sum(b["new_buckets"] for b in bs)
    if new:
        lines.append(f"  {new} buckets were prepared under load (not warmed)")
    lines.append(f"  slowest {SLOWEST} (ms; gc: generations, a = in another thread; graphs: captured in the batch)")
    lines.append("    start_s   gap    n   tok    host    cpu    gpu  gpu_fn replay    pre     fn   pack   post"
                 "  gc graphs")
    for b in sorted(bs, key=lambda b: b["host"], reverse=True)[:SLOWEST]:
        lines.append(f"    {b['start']:7.3f} {fmt(b['gap'], 6, 1)} {b['n']:3d} {b['tokens']:5d} {b['host']:7.2f} "
                     f"{b['cpu']:6.2f} {fmt(b['gpu'], 6)} {fmt(b['gpu_fn'], 7)} {fmt(b['replay'], 6)} "
                     f"{fmt(b['pre'], 6)} {fmt(b['fn'], 6)} {fmt(b['pack'], 6)} {fmt(b['post'], 6)} "
                     f"{b['gc'] or '-':>3s} {b['graphs']:6d}")
    return lines


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch  # the CUDA check before transformers and the package are imported

    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("error: no CUDA device here: run it on the GPU, or check it on the CPU with --device cpu --model "
              "bert-tiny", file=sys.stderr)
        return 2
    from transbench.errors import SpecError
    from transbench.scenarios.serve import measure as serve, spec as serve_spec
    from transbench.scenarios.inference.measure import ModelCache

    try:
        rates = [float(r) for r in a.rates.split(",") if r]
        spec = serve_spec.ServeSpec(model=a.model, task=a.task, backends=[b for b in a.backend.split(",") if b],
                                    dtype=a.dtype, device=a.device, rates=rates, lengths=a.lengths,
                                    max_batch_size=a.max_batch_size, max_wait_ms=a.max_wait_ms,
                                    duration=a.duration, warmup=a.warmup, seed=a.seed)
        spec, lengths = serve_spec.check(spec)
    except ValueError:
        print(f"error: --rates '{a.rates}' is not a list of numbers: give requests/s, comma-separated (36,300)",
              file=sys.stderr)
        return 2
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if spec.task == "generate":
        print("error: --task generate is not traced (its server is Decoders): use an encoder task", file=sys.stderr)
        return 2

    tracer = Tracer(torch, cuda)
    real_run_load = serve.run_load

    def traced_load(serve_batch, plan, policy, **kw):
        tracer.begin(serve_batch.__self__, plan)
        try:
            return real_run_load(tracer.wrap(serve_batch), plan, policy, **kw)
        finally:
            tracer.end()

    serve.run_load = traced_load
    gpu = torch.cuda.get_device_name(spec.device) if cuda else "cpu"
    print(f"serve_trace: {spec.model} {spec.task} {spec.dtype} on {gpu}, lengths {spec.lengths}, max batch "
          f"{spec.max_batch_size}, max wait {spec.max_wait_ms:g} ms, warmup {spec.warmup:g} s + {spec.duration:g} s; "
          f"torch {torch.__version__}, python {sys.version.split()[0]}, gc thresholds {gc.get_threshold()}, "
          f"switch interval {sys.getswitchinterval() * 1e3:g} ms")
    cache = ModelCache()  # as a serve worker keeps it across its cells
    for cell in serve_spec.expand(spec, lengths):
        tracer.batches, tracer.gcs = [], []
        result = serve.run(cell, cache)
        print("\n".join(report(cell, result, tracer)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
