#!/usr/bin/env bash
# On one GPU: the fused server's preparation and its largest rate against cudagraph and sdpa, with
# MLPerf LoadGen's early-stopping estimates beside the empirical percentiles.
# Run from the repo root: bash benchmarks/serve_fused_check.sh [OUT_DIR] [PARTS]
# PARTS (default a,b), comma-separated (BACKENDS="cudagraph sdpa" runs only those backends):
#   a     bert-base classification fp16, --max-batch-size 32 --max-wait-ms 4 --lengths lognormal:128:512,
#         --find-max-rate --slo-ms 25 (p99), for fused, cudagraph, sdpa (on an H100 the fused search alone took 231 s)
#   b     the earlier setting: --max-batch-size 16 --lengths lognormal:64:256, p99 <= 10 ms (estimated ~2.5 min)
#   rate  fused and cudagraph at the issue's single cell, --rate 2000 (setting a), each command timed (~2 min)
#   b-rate  setting b at one rate (B_RATE, default 8907: the fused server's earlier max rate) for 10 s, fused by
#         default: a bisection knows the max rate to 5% only, this says whether that rate holds (~1 min)
# Each part fits one 10-minute device call: `bash benchmarks/serve_fused_check.sh OUT a`, then `... OUT b`.
# Prints per run: preparation seconds (the offline cell's, tuning included; each probe prepares again from the
# tuner's memory), max rate, and p50/p99 at it with the p99's early-stopping estimate and its request count, beside
# the batches' service time (p99, max): a tail that its batches' service time does not explain is queueing or host.
set -euo pipefail
OUT=${1:-serve48}
PARTS=${2:-a,b}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TRANSBENCH_CACHE_DIR=${TRANSBENCH_CACHE_DIR:-$OUT/engine-tuning}
TB="python3 -m transbench"
DB="$OUT/serve48.db"
COMMON=(--model bert-base-uncased --task classification --dtype fp16 --duration 1 --warmup 0.3 --timeout 280)
run() {  # name, then options
  local name=$1; shift
  local t0=$SECONDS
  $TB serve "${COMMON[@]}" "$@" --db "$DB" --name "$name" --json "$OUT/$name.json" || true
  echo "$name wall_s $((SECONDS - t0))" | tee -a "$OUT/wall.txt"
}
for b in ${BACKENDS:-fused cudagraph sdpa}; do
  if [[ ,$PARTS, == *,a,* ]]; then
    run "a-$b" -b "$b" --max-batch-size 32 --max-wait-ms 4 --lengths lognormal:128:512 --find-max-rate --slo-ms 25
  fi
  if [[ ,$PARTS, == *,b,* ]]; then
    run "b-$b" -b "$b" --max-batch-size 16 --max-wait-ms 2 --lengths lognormal:64:256 --find-max-rate --slo-ms 10
  fi
done
if [[ ,$PARTS, == *,rate,* ]]; then
  for b in ${BACKENDS:-fused cudagraph}; do
    run "rate-$b" -b "$b" --max-batch-size 32 --max-wait-ms 4 --lengths lognormal:128:512 --rate 2000 --slo-ms 25 \
      --duration 10 --warmup 2 --timeout 400
  done
fi
if [[ ,$PARTS, == *,b-rate,* ]]; then
  for b in ${BACKENDS:-fused}; do
    run "b-rate-$b" -b "$b" --max-batch-size 16 --max-wait-ms 2 --lengths lognormal:64:256 --rate "${B_RATE:-8907}" \
      --slo-ms 10 --duration 10 --warmup 2 --timeout 400
  done
fi
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
wall = dict(line.split(" wall_s ") for line in (out / "wall.txt").read_text().split("\n") if " wall_s " in line) \
    if (out / "wall.txt").exists() else {}
def f(v, d=2):
    return "" if v is None else f"{v:,.{d}f}" if isinstance(v, float) else str(v)
print(f"| run | backend | prepare s | max rate /s | p50 ms | p99 ms | p99 upper ms | requests | service p99 ms | service max ms | graphs under load | wall s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for p in sorted(out.glob("*.json")):
    doc = json.loads(p.read_text())
    recs = doc.get("cells", []) if isinstance(doc, dict) else doc  # a versioned record: its cells
    for r in recs:
        if r.get("scenario") == "serve-max-rate" or ("rate-" in p.stem and r.get("mode") == "rate"):
            prep = r.get("prepare_s")
            print(f"| {p.stem} | {r['backend']} | {f(prep, 1)} | {f(r.get('max_rate') or r.get('achieved_rate'), 0)} | "
                  f"{f(r.get('latency_p50_ms'))} | {f(r.get('latency_p99_ms'))} | {f(r.get('latency_p99_upper_ms'))} | "
                  f"{f(r.get('n_requests'))} | {f(r.get('service_p99_ms'))} | {f(r.get('service_max_ms'))} | "
                  f"{f(r.get('graphs_captured_under_load'))} | {wall.get(p.stem, '')} |"
                  + ("" if r.get("status") == "ok" else f" {r.get('status')}: {r.get('error')}"))
PY
