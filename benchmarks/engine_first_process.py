"""The fused engine's speed in a first process at a new shape against after `transbench tune` of that shape.

  PYTHONPATH=src python3 benchmarks/engine_first_process.py [--model bert-base-uncased] [--dtype fp8] [--shape 256x128]
      [--nearby 128] [--again 1] [--warmup 20] [--reps 50] [--call encode|model] [--plan]

Every step runs in a process of its own (its own tuner and CUDA context), on a tuning table of its own scenario
(TRANSBENCH_CACHE_DIR pointing at a folder under one temporary folder):
  empty          an empty table: compile_model(model, dtype) with the default first-call budget, at SHAPE
  empty, again   the same folder once more (--again times): a later process that goes on with the tuning the first
                 saved
  nearby         a table that `api.tune` (no budget, as `transbench tune`) filled at batch NEARBY x the same seq in a
                 process of its own; then SHAPE as in `empty`: its untuned ops borrow the nearby shape's routes
  tuned          a table tuned at SHAPE itself; then SHAPE as in `empty` (the reference: every route on disk)
A measuring process times the first call (tuning, compiles, capture), then --warmup calls, then --reps calls each
between two CUDA events (median: seq/s = batch / median), and reads where the routes it ran came from
(compiled.tuning()'s origins). Triton's compile cache is shared by the steps (the first compiles, later ones
load), so only the first step's first call includes cold compiles. --call encode (default) times the encoder
layers on precomputed embeddings, as `transbench run --encoders-only` does; model: the whole model call.
Prints one JSON line per step as it ends, then one table. About 2-3 minutes for bert-base fp8 256 x 128 on an H100.
--plan prints the steps and exits (no GPU needed).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP_TIMEOUT_S = 400
ORIGINS = ("table", "tuned", "partial", "neighbour", "rule")  # engine/tuning.py ORIGINS


def batch_by_seq(text: str) -> tuple[int, int]:
    """An argparse type for BATCHxSEQ (transformers_loop_check.py's --point too)."""
    try:
        b, s = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be BATCHxSEQ (256x128), got {text!r}") from None
    if b < 1 or s < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1x1, got {text!r}")
    return b, s


def _whole(at_least: int):
    def read(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if v < at_least:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {at_least}, got {text!r}")
        return v
    return read


_positive, _count = _whole(1), _whole(0)


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", nargs="?", choices=["_measure", "_tune"], help=argparse.SUPPRESS)
    ap.add_argument("--model", default="bert-base-uncased")
    ap.add_argument("--dtype", default="fp8", choices=["fp16", "bf16", "fp8"])
    ap.add_argument("--shape", type=batch_by_seq, default=(256, 128), help="BATCHxSEQ measured (default 256x128)")
    ap.add_argument("--nearby", type=_positive, default=None,
                    help="the batch tuned for the nearby table (default: half of the shape's batch, at least 1)")
    ap.add_argument("--again", type=_count, default=1, help="later processes on the first table (default 1)")
    ap.add_argument("--warmup", type=_positive, default=20, help="calls after the first, before timing")
    ap.add_argument("--reps", type=_positive, default=50, help="timed calls (median)")
    ap.add_argument("--call", choices=["encode", "model"], default="encode")
    ap.add_argument("--plan", action="store_true", help="print the steps and exit")
    a = ap.parse_args(argv)
    batch = a.shape[0]
    if a.nearby is None:
        a.nearby = max(1, batch // 2)
    if a.nearby == batch and a.step is None:  # (a step's own process gets the shape it tunes as --shape)
        ap.error(f"--nearby {a.nearby} is the measured batch: give another batch size for the nearby table")
    return a


def plan(a: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The steps: (row label or "" for a tuning step, step, the scenario folder's name)."""
    b, s = a.shape
    steps = [(f"empty table, {b}x{s}", "_measure", "empty")]
    steps += [(f"empty table, process {i + 2}", "_measure", "empty") for i in range(a.again)]
    steps += [("", f"_tune {a.nearby}x{s}", "nearby"), (f"tuned at {a.nearby}x{s}, run {b}x{s}", "_measure", "nearby")]
    steps += [("", f"_tune {b}x{s}", "tuned"), (f"tuned at {b}x{s}", "_measure", "tuned")]
    return steps


def measure(a: argparse.Namespace) -> dict:
    """One measuring process: the first call at the shape, then the timed calls (see the module's docstring)."""
    import torch
    from engine_bench import bench  # the CUDA-event timer of benchmarks/engine_bench.py (this script's folder)

    from transbench.engine import compile_model, tuning
    from transbench.engine.compiled import BERT_LIKE
    from transbench.measure import device as dev
    from transbench.models import build

    b, s = a.shape
    ref = build.resolve(a.model)
    m = build.build_model(ref, "base", device="cuda").to(dev.torch_dtype(a.dtype))
    before = tuning.Tuner()
    table_before = (len(before.table), len(before.interim))
    c = compile_model(m, dtype="fp8" if a.dtype == "fp8" else dev.torch_dtype(a.dtype), max_batch=b, max_seq=s)
    ids = torch.randint(0, ref.shape.vocab, (b, s), device="cuda")
    with torch.inference_mode():
        if a.call == "encode" and ref.family in BERT_LIKE:
            h = m.base_model.embeddings(input_ids=ids)

            def fn():
                return c.encode(h)
        else:
            def fn():
                return c(input_ids=ids)
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        first_s = time.perf_counter() - start
        for _ in range(a.warmup):
            fn()
        torch.cuda.synchronize()
        ms = bench(fn, min_reps=a.reps, max_reps=a.reps)
    counts = dict.fromkeys(ORIGINS, 0)
    for shape in c.tuning().values():
        for o, n in (shape.get("origins") or {}).items():
            counts[o] = counts.get(o, 0) + n
    after = tuning.Tuner()
    return {"step": "measure", "shape": f"{b}x{s}", "first_call_s": round(first_s, 3), "ms": round(ms, 4),
            "seq_per_s": round(b / ms * 1e3, 1), "origins": counts, "table_before": table_before,
            "table_after": (len(after.table), len(after.interim)), "gpu": torch.cuda.get_device_name()}


def tune(a: argparse.Namespace, batch: int) -> dict:
    from transbench import api

    start = time.perf_counter()
    rows = api.tune(a.model, [batch], [a.shape[1]], dtype=a.dtype, device="cuda",
                    cache_dir=os.environ["TRANSBENCH_CACHE_DIR"])
    return {"step": "tune", "shape": f"{batch}x{a.shape[1]}", "seconds": round(time.perf_counter() - start, 1),
            "routes": sum(r["routes"] for r in rows)}


def _child(a: argparse.Namespace, step: str, folder: Path) -> dict:
    """Run one step in a process of its own on `folder`'s table; its last JSON line, or {"error": ...}."""
    name, *arg = step.split()
    cmd = [sys.executable, str(Path(__file__).resolve()), name, "--model", a.model, "--dtype", a.dtype,
           "--shape", arg[0] if arg else "x".join(map(str, a.shape)), "--nearby", str(a.nearby),
           "--warmup", str(a.warmup), "--reps", str(a.reps), "--call", a.call]
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TRANSBENCH_CACHE_DIR": str(folder)}
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {STEP_TIMEOUT_S} s"}
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {r.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


def table(rows: list[tuple[str, dict]]) -> str:
    """The summary: one row per measuring step, seq/s against the last row's (the shape tuned)."""
    ref = next((r.get("seq_per_s") for _, r in reversed(rows) if r.get("seq_per_s")), None)
    head = (f"{'scenario':<34} {'first call s':>12} {'ms':>9} {'seq/s':>9} {'of tuned':>8}  "
            + " ".join(f"{o:>9}" for o in ORIGINS))
    out = [head, "-" * len(head)]
    for label, r in rows:
        if "error" in r:
            out.append(f"{label:<34} error: {r['error']}")
            continue
        share = f"{r['seq_per_s'] / ref:8.1%}" if ref else f"{'-':>8}"
        out.append(f"{label:<34} {r['first_call_s']:12.2f} {r['ms']:9.3f} {r['seq_per_s']:9.0f} {share}  "
                   + " ".join(f"{r['origins'].get(o, 0):>9}" for o in ORIGINS))
    return "\n".join(out)


def main(argv=None) -> int:
    a = parse(argv)
    if a.plan:
        for label, step, folder in plan(a):
            print(f"{folder:<7} {step:<12} {label}")
        return 0
    from transbench.models import build

    try:  # before any process starts: an unknown model is one line, not a failed step each
        build.resolve(a.model)
    except Exception as e:  # noqa: BLE001 - the registry's own words
        print(f"error: {e}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: engine_first_process.py measures the fused engine on a CUDA GPU; none is visible",
              file=sys.stderr)
        return 2
    if a.step == "_measure":
        print(json.dumps(measure(a)), flush=True)
        return 0
    if a.step == "_tune":
        print(json.dumps(tune(a, a.shape[0])), flush=True)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="first-process-") as root:
        for label, step, folder in plan(a):
            r = _child(a, step, Path(root) / folder)
            print(json.dumps({"scenario": label or step, **r}), flush=True)
            if label:
                rows.append((label, r))
    b, s = a.shape
    print(f"\n{a.model} {a.dtype} {b} x {s}, {a.call}; {rows[-1][1].get('gpu', '')}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
