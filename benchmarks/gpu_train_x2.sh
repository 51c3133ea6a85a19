#!/usr/bin/env bash
# Two GPUs (2 x H200, < 4 min): DDP and FSDP2 for bert-large MLM seq 128 and gpt2 seq 1024 at nproc 1 and 2
# with the scaling efficiency, NCCL P2P on/off for DDP, and data-parallel inference of bert-base fp16.
# Run from the repo root: bash benchmarks/gpu_train_x2.sh   (outputs under ${OUT:-/tmp/out})
set -x
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
DB="$OUT/train_x2.db"
nvidia-smi topo -m

python3 -m transbench train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --optim adamw-fused \
  --backend sdpa --batch 128 --strategy ddp,fsdp --nproc 2 --scaling --steps 10 --warmup 3 --timeout 150 \
  --db "$DB" --json "$OUT/x2_bert_large.json" > "$OUT/x2_bert_large.log" 2>&1
tail -5 "$OUT/x2_bert_large.log"

python3 -m transbench train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --optim adamw-fused \
  --backend sdpa --batch 128 --strategy ddp --nproc 2 --nccl-p2p off --steps 10 --warmup 3 --timeout 150 \
  --db "$DB" --json "$OUT/x2_bert_large_nop2p.json" > "$OUT/x2_bert_large_nop2p.log" 2>&1
tail -5 "$OUT/x2_bert_large_nop2p.log"

python3 -m transbench train --model gpt2 --task causal-lm --seq 1024 --dtype bf16 --optim adamw-fused \
  --backend sdpa --batch 16 --strategy ddp,fsdp --nproc 2 --scaling --steps 10 --warmup 3 --timeout 150 \
  --db "$DB" --json "$OUT/x2_gpt2.json" > "$OUT/x2_gpt2.log" 2>&1
tail -5 "$OUT/x2_gpt2.log"

# Data-parallel inference: the batch of 256 split over 2 GPUs, against the same cell on one GPU.
python3 -m transbench run --model bert-base-uncased --backend sdpa --dtype fp16 --batch 256 --seq 128 \
  --db "$OUT/infer_x2.db" --json "$OUT/infer_x1.json" > "$OUT/infer_x1.log" 2>&1
python3 -m transbench run --model bert-base-uncased --backend sdpa --dtype fp16 --batch 256 --seq 128 --nproc 2 \
  --timeout 200 --db "$OUT/infer_x2.db" --json "$OUT/infer_x2.json" > "$OUT/infer_x2.log" 2>&1
tail -5 "$OUT/infer_x2.log"

python3 - "$OUT" <<'PY'
import glob, json, os, sys
def f(v):
    return f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v))
def show(pattern, cols):
    rows = []
    for p in sorted(glob.glob(os.path.join(sys.argv[1], pattern))):
        try:
            rows += json.load(open(p))
        except Exception as e:
            print("cannot read", p, e)
    print("\t".join(cols))
    for r in rows:
        print("\t".join(f(r.get(c)) for c in cols))
        if r["status"] != "ok":
            print("   ", (r.get("error") or "")[:300])
show("x2_*.json", ["model", "strategy", "world_size", "nccl", "batch_size", "global_batch", "status", "latency_ms",
                   "samples_per_s", "tokens_per_s", "tflops_per_gpu", "mfu", "scaling_efficiency", "peak_mem_mb",
                   "params_mb", "optim_state_mb", "loss_end"])
show("infer_x*.json", ["model", "backend", "dtype", "batch_size", "world_size", "strategy", "status", "latency_ms",
                       "throughput_per_s", "tflops", "mfu", "rel_err", "peak_mem_mb"])
PY
