#!/usr/bin/env bash
# Issue 23 on one GPU (H100), one command: the fp8 / embedding / generator GPU tests, first-call times (cold, and
# warm from a `transbench tune` table), the fresh-generator timing, and bert-base 1x128, 8x128, 256x128 and
# bert-large 128x384 in fp16 and fp8 through `transbench run --backend fused,sdpa` (encoders-only, with rel_err
# against fp32), then bert-base 1x128 with embeddings, ending with one compact table. Every step has its own
# timeout, so a failing one costs its share only.
#   bash benchmarks/engine_fp8.sh [OUTDIR] [PARTS]     (from the repo root; everything lands in OUTDIR)
# PARTS, comma-separated, default all three; each stands alone (one command may last 10 minutes at most):
#   startup  GPU tests, first calls, tune times, generator (~5 min)
#   tables   tune the encoder table's shapes, then the fp16 / fp8 runs (under 5 min)
#   emb      bert-base 1x128 with embeddings against encoders-only (~1 min)
# 8x128 (1,024 rows) is ops.FP8_MIN_ROWS, where fp8 GEMMs are first offered: its fp16 and fp8 rows check that
# crossover; below it (1x128) an fp8 model runs the fp16 forward, so its time should equal fp16's.
set -u
OUT=${1:-engine23}
PARTS=${2:-startup,tables,emb}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=python3
TB="$PY -m transbench"
SUM=$OUT/startup.jsonl
step() { echo "== $*" >&2; }

if [[ ,$PARTS, == *,startup,* ]]; then
: > "$SUM"
step "GPU tests (fp8 kernels, embedding kernel, fp8 models, generator reuse)"
TRANSBENCH_CACHE_DIR=$OUT/tuning-tests timeout 180 $PY -m pytest -q -m gpu -p no:cacheprovider -s -rs \
  tests/gpu/test_engine_fp8_gpu.py > "$OUT/gpu_tests.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt"

step "first call at a new shape, cold: empty tuning table and Triton cache, default tuning budget"
for shape in 1x128 256x128; do
  TRANSBENCH_CACHE_DIR=$OUT/cold-$shape TRITON_CACHE_DIR=$OUT/triton-cold-$shape \
    timeout 60 $PY benchmarks/engine_startup.py first-call --shape $shape >> "$SUM"
done

step "transbench tune ahead of time (no budget: each shape's time is what a first call cost before the budget)"
TRANSBENCH_CACHE_DIR=$OUT/tuned-startup TRITON_CACHE_DIR=$OUT/triton-startup \
  timeout 150 $TB tune --model bert-base-uncased --batch 1,256 --seq 128 --dtype fp16 | tee "$OUT/tune_startup.txt"

step "first call in a fresh process that finds the tuned table (a serving process shipped with it)"
for shape in 1x128 256x128; do
  TRANSBENCH_CACHE_DIR=$OUT/tuned-startup TRITON_CACHE_DIR=$OUT/triton-startup \
    timeout 45 $PY benchmarks/engine_startup.py first-call --shape $shape >> "$SUM"
done

step "gpt2 generation: a fresh generator per request vs one reused"
timeout 75 $PY benchmarks/engine_startup.py generate >> "$SUM"
fi

export TRANSBENCH_CACHE_DIR=$OUT/tuned TRITON_CACHE_DIR=$OUT/triton-tuned
run() {  # name, model, batch, seq, embeddings flag
  timeout 100 $TB run --model "$2" --backend fused,sdpa --dtype fp16,fp8 --batch "$3" --seq "$4" "$5" \
    --min-time 0.3 --timeout 100 --baseline sdpa --name "$1" --db "$OUT/engine23.db" --json "$OUT/$1.json" > "$OUT/$1.txt" 2>&1
}
if [[ ,$PARTS, == *,tables,* ]]; then
step "tune the table's shapes (fp16 and fp8), so that the runs measure tuned engines"
timeout 120 $TB tune --model bert-base-uncased --batch 1,8,256 --seq 128 --dtype fp16 | tee "$OUT/tune_fp16.txt"
timeout 50 $TB tune --model bert-base-uncased --batch 8,256 --seq 128 --dtype fp8 | tee "$OUT/tune_fp8.txt"
timeout 50 $TB tune --model bert-large-uncased --batch 128 --seq 384 --dtype fp16 | tee -a "$OUT/tune_fp16.txt"
timeout 40 $TB tune --model bert-large-uncased --batch 128 --seq 384 --dtype fp8 | tee -a "$OUT/tune_fp8.txt"

step "transbench run: fused vs sdpa, fp16 and fp8 (sdpa records fp8 unsupported)"
run base-enc bert-base-uncased 1,8,256 128 --encoders-only
run large-enc bert-large-uncased 128 384 --encoders-only
fi

if [[ ,$PARTS, == *,emb,* ]]; then
step "bert-base 1x128 with embeddings (the whole model call)"
run base-emb bert-base-uncased 1 128 --embeddings
fi

step "summary"
$PY - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("\n| model | emb | batch x seq | backend | dtype | status | seq/s | latency ms | rel_err | peak MiB | note |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for name, emb in (("base-enc", "no"), ("large-enc", "no"), ("base-emb", "yes")):
    f = out / f"{name}.json"
    if not f.exists():
        print(f"| {name}: no records (see {name}.txt) |"); continue
    for r in json.loads(f.read_text()):
        fmt = lambda v, p: "" if v is None else f"{v:.{p}f}" if isinstance(v, float) else str(v)
        print(f"| {r['model']} | {emb} | {r['batch_size']}x{r['seq_len']} | {r['backend']} | {r['dtype']} | {r['status']} "
              f"| {fmt(r.get('throughput_per_s'), 0)} | {fmt(r.get('latency_ms'), 3)} | {fmt(r.get('rel_err'), 4)} "
              f"| {fmt(r.get('peak_mem_mb'), 0)} | {(r.get('error') or '')[:60]} |")
import sqlite3
if (out / "engine23.db").exists():  # what each fp8 cell really ran: GEMM ops on an fp8 route (backends/fused.py)
    print("\n| fp8 cell | GEMM ops on fp8 routes |")
    print("|---|---|")
    for cell, info in sqlite3.connect(out / "engine23.db").execute("SELECT cell, info FROM cells"):
        c, i = json.loads(cell), json.loads(info or "{}")
        if c.get("dtype") == "fp8" and "gemm_ops" in i:
            print(f"| {c['model']} {c['batch']}x{c['seq']} | {i['fp8_gemm_ops']} of {i['gemm_ops']} |")
print("\n| start-up | result |")
print("|---|---|")
for line in (out / "startup.jsonl").read_text().splitlines() if (out / "startup.jsonl").exists() else []:
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r["part"] == "first-call":
        print(f"| first call {r['model']} {r['shape']} {r['dtype']} budget={r['budget']} | {r['first_s']} s "
              f"(next call {r['second_ms']} ms; {r['fp8_routes']}/{r['routes']} ops on fp8) |")
    else:
        print(f"| gpt2 1x512+128 greedy | fresh generator {r['fresh_ms']} ms, reused {r['reused_ms']} ms "
              f"({r['fresh_over_reused']}x), first request {r['first_ms']} ms |")
for t in ("tune_startup.txt", "tune_fp16.txt", "tune_fp8.txt"):
    p = out / t
    if p.exists():
        print(f"\n{t}:", *[l for l in p.read_text().splitlines() if " s" in l and "x seq" in l], sep="\n  ")
PYEOF
