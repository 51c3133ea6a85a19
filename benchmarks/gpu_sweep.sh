#!/usr/bin/env bash
# Sweeps that survive (issue 3) on one GPU: bert-large-uncased at seq 512, batch 64..8192, fp32 and fp16.
# fp32 shows OOM and skipped cells; fp16 adds the max-batch search (fp32 probes cost ~15 s a forward each).
# Run from the repo root on a GPU machine: bash benchmarks/gpu_sweep.sh   (about 4 minutes on an H100)
# Writes ${OUT:-/tmp/out}/sweep.db and sweep_log.txt; a second run resumes (finished cells are kept).
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 COLUMNS=200
exec > >(tee "$OUT/sweep_log.txt") 2>&1
TB="python3 -m transbench"
DB="$OUT/sweep.db"
BATCHES=64,128,256,512,1024,2048,4096,8192
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv
$TB run --model bert-large-uncased --dtype fp32 --backend sdpa --seq 512 --batch $BATCHES \
  --warmup 0 --min-count 1 --min-time 0 --timeout 300 --name sweep-fp32 --db "$DB"
$TB run --model bert-large-uncased --dtype fp16 --backend sdpa --seq 512 --batch $BATCHES --max-batch \
  --warmup 1 --min-count 3 --min-time 0 --timeout 120 --name sweep-fp16 --db "$DB"
$TB runs --db "$DB"
python3 - "$DB" <<'PY'
import sys
import pandas as pd
from transbench import api
pd.set_option("display.width", 200)
df = pd.DataFrame(api.records(sys.argv[1]))
cols = ["run_name", "scenario", "dtype", "batch_size", "status", "latency_ms", "throughput_per_s", "mfu",
        "peak_mem_mb", "error"]
print(df[[c for c in cols if c in df]].to_string(index=False, max_colwidth=60))
import sqlite3, json
for info, in sqlite3.connect(sys.argv[1]).execute("SELECT info FROM cells WHERE scenario='max-batch'"):
    print("max-batch probe trail (batch, status):", json.loads(info).get("probes"))
PY
