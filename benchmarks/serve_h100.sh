#!/usr/bin/env bash
# Serving under load on one GPU (issue 26), measured with transbench itself.
# Run from the repo root: bash benchmarks/serve_h100.sh [DB] [PARTS]
# PARTS (default all), comma-separated: eager, sdpa, cudagraph, fused (one --find-max-rate run each, ~2-3 min:
# bert-base-uncased classification fp16, lognormal lengths mean 64 max 256, p99 <= 10 ms) and generate
# (gpt2 generation under load, 4 backends x 3 Poisson rates, ~3 min). Named runs resume. Then: transbench report DB.
set -x
DB=${1:-serve.db}
PARTS=${2:-eager,sdpa,cudagraph,fused,generate}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TRANSBENCH_CACHE_DIR=${TRANSBENCH_CACHE_DIR:-$(dirname "$DB")/engine-tuning}
TB="python3 -m transbench"
for b in eager sdpa cudagraph fused; do
  [[ ,$PARTS, == *,$b,* ]] || continue
  $TB serve --model bert-base-uncased --task classification --dtype fp16 --backend "$b" \
    --lengths lognormal:64:256 --max-batch-size 16 --max-wait-ms 2 --find-max-rate --slo-ms 10 --percentile 99 \
    --duration 3 --warmup 1 --timeout 300 --name "serve-maxrate-$b" --db "$DB"
done
if [[ ,$PARTS, == *,generate,* ]]; then
  $TB serve --model gpt2 --task generate --dtype fp16 --backend eager,sdpa,cudagraph,fused --new-tokens 32 \
    --lengths lognormal:64:128 --max-batch-size 8 --max-wait-ms 5 --rate 2,8,16 --slo-ms 1000 \
    --duration 6 --warmup 1 --timeout 300 --name serve-gpt2-generate --db "$DB"
fi
