#!/usr/bin/env bash
# Micro-benchmarks on the GPU: GEMM and bandwidth ceilings, one bert-large layer, its parts, rooflines.
# Run from the repo root: bash benchmarks/gpu_micro.sh   (about 3 minutes on an H100)
# Writes under ${OUT:-/tmp/out}: micro.db, micro_log.txt, micro_records.json, roofline_*.png
set -x
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
DB="$OUT/micro.db"
rm -f "$DB" "$DB-wal" "$DB-shm"
export PYTHONPATH=src PYTHONUNBUFFERED=1 COLUMNS=200
exec > >(tee "$OUT/micro_log.txt") 2>&1
TB="python3 -m transbench"

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv || true
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"

# 1. GPU checks: dtypes take effect, L2 rotation, OOM row, sdpa kernel (about 30 s)
python3 -m pytest -q -m gpu tests/gpu/test_micro_gpu.py -s -p no:cacheprovider || echo "GPU TESTS FAILED"

# 2. The full GEMM grid: square 128..16384 and bert-base/large layer GEMMs at 8192 tokens, fp32 tf32 fp16 bf16 fp8
$TB micro gemm --db "$DB" --name gemm --plot "$OUT/roofline_gemm.png" || echo "GEMM FAILED"

# 3. Bandwidth: copy, scale, add over 2^14..2^28 fp32 elements
$TB micro bandwidth --db "$DB" --name bandwidth || echo "BANDWIDTH FAILED"

# 4. One bert-large layer, fwd and fwd+bwd, batch 4..128 x seq 128, 512 (the seeds' grid), fp16
$TB micro layer --model bert-large-uncased --dtype fp16 --db "$DB" --name layer-fp16 || echo "LAYER FAILED"

# 5. Its parts at batch 64 x seq 128 (classified against the ceilings measured above), and GPT-2's
$TB micro breakdown --model bert-large-uncased --dtype fp16 --batch 64 --seq 128 --db "$DB" --name breakdown-bert \
    --plot "$OUT/roofline_breakdown_bert.png" || echo "BREAKDOWN BERT FAILED"
$TB micro breakdown --model gpt2-medium --dtype bf16 --batch 16 --seq 1024 --db "$DB" --name breakdown-gpt2 \
    --plot "$OUT/roofline_breakdown_gpt2.png" || echo "BREAKDOWN GPT2 FAILED"

# 6. The measured ceilings as `env` shows them
$TB env --db "$DB" || echo "ENV FAILED"

# 7. Compact summary
python3 - "$DB" "$OUT/micro_records.json" <<'EOF' || echo "SUMMARY FAILED"
import sys
import pandas as pd
from transbench import api
from transbench.store import export

db, path = sys.argv[1], sys.argv[2]
recs = api.records(db)
export.write(recs, json_path=path)
df = pd.DataFrame(recs)
pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 30)
print("status counts by scenario:\n", df.groupby(["scenario", "status"]).size().to_string())
bad = df[df.status != "ok"]
if len(bad):
    print("\nnot ok:\n", bad[[c for c in ("scenario", "dtype", "m", "op", "part", "status", "error") if c in bad]].to_string())
g = df[(df.scenario == "micro-gemm") & (df.status == "ok")].astype({"m": int}, errors="ignore")
if len(g):
    sq = g[g["shape"] == "square"].pivot_table(index="m", columns="dtype", values="tflops")
    print("\nsquare GEMM TFLOPS (rows n):\n", sq.round(1).to_string())
    print("\nbest % of datasheet peak per dtype:\n", g.groupby("dtype").pct_of_peak.max().round(1).to_string())
    lg = g[g["shape"] != "square"].pivot_table(index=["model", "shape"], columns="dtype", values="tflops")
    print("\nlayer-shaped GEMM TFLOPS at 8192 tokens:\n", lg.round(1).to_string())
b = df[(df.scenario == "micro-bandwidth") & (df.status == "ok")].astype({"elements": int}, errors="ignore")
if len(b):
    print("\nbandwidth GB/s (rows elements):\n", b.pivot_table(index="elements", columns="op", values="gbps").round(0).to_string())
lay = df[(df.scenario == "micro-layer") & (df.status == "ok")].astype({"batch_size": int, "seq_len": int}, errors="ignore")
if len(lay):
    print("\nlayer TFLOPS:\n", lay.pivot_table(index="batch_size", columns=["pass", "seq_len"], values="tflops").round(1).to_string())
bd = df[df.scenario == "micro-breakdown"]
if len(bd):
    cols = ["run_name", "part", "status", "latency_ms", "share", "tflops", "gbps", "intensity", "bound", "pct_of_roofline", "ceiling_source"]
    print("\nbreakdown:\n", bd[[c for c in cols if c in bd]].round(3).to_string(index=False))
EOF
ls -la "$OUT"
