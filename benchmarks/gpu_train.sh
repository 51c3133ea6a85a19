#!/usr/bin/env bash
# Training throughput on one GPU (H100, < 4 min): bert-large MLM seq 128 and gpt2 causal-lm seq 1024,
# bf16 (autocast, fp32 master weights), fused AdamW, SDPA attention, compile off/on.
# Run from the repo root: bash benchmarks/gpu_train.sh   (outputs under ${OUT:-/tmp/out})
set -x
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
DB="$OUT/train.db"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv

# The quick GPU checks (the compile and torchrun ones take ~80 s more: run the whole file with `pytest tests/gpu`).
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_training_gpu.py -m gpu -k "not compile and not torchrun" \
  > "$OUT/pytest_training_gpu.log" 2>&1
tail -5 "$OUT/pytest_training_gpu.log"

# bert-large MLM, seq 128: the batch that fills the GPU best (an OOM skips the larger ones).
python3 -m transbench train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --optim adamw-fused \
  --backend sdpa --batch 128,256 --steps 10 --warmup 3 --timeout 120 \
  --db "$DB" --json "$OUT/bert_large.json" > "$OUT/bert_large.log" 2>&1
tail -5 "$OUT/bert_large.log"

# gpt2 causal-lm, seq 1024, batch 16: compile off, then on.
python3 -m transbench train --model gpt2 --task causal-lm --seq 1024 --dtype bf16 --optim adamw-fused \
  --backend sdpa --batch 16 --compile off,on --steps 10 --warmup 3 --timeout 150 \
  --db "$DB" --json "$OUT/gpt2.json" > "$OUT/gpt2.log" 2>&1
tail -5 "$OUT/gpt2.log"

# bert-large with compile at the largest batch that fitted above.
BEST=$(python3 - "$OUT/bert_large.json" <<'PY'
import json, sys
ok = [r for r in json.load(open(sys.argv[1])) if r["status"] == "ok"]
print(max(ok, key=lambda r: r["samples_per_s"])["batch_size"] if ok else 64)
PY
)
python3 -m transbench train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --optim adamw-fused \
  --backend sdpa --batch "${BEST:-128}" --compile on --steps 10 --warmup 3 --timeout 150 \
  --db "$DB" --json "$OUT/bert_large_compile.json" > "$OUT/bert_large_compile.log" 2>&1
tail -5 "$OUT/bert_large_compile.log"

python3 - "$OUT" <<'PY'
import glob, json, os, sys
rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    try:
        rows += json.load(open(f))
    except Exception as e:
        print("cannot read", f, e)
cols = ["model", "backend", "dtype", "optim", "batch_size", "seq_len", "compile", "status", "latency_ms",
        "samples_per_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_mem_mb", "params_mb", "grads_mb",
        "optim_state_mb", "activations_mb", "loss_start", "loss_end"]
def f(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)
print("\t".join(cols))
for r in rows:
    print("\t".join(f(r.get(c)) for c in cols))
    if r["status"] != "ok":
        print("   ", (r.get("error") or "")[:300])
PY
