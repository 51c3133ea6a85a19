#!/usr/bin/env bash
# One short device call that gathers the GPU evidence of several issues, most important first; every
# step is time-boxed and writes its store straight under $OUT, so a call cut short still returns what
# was measured. Reports are made afterwards from the stores, on any machine.
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 COLUMNS=200 CUDA_VISIBLE_DEVICES=${GPU:-0}
TB="python3 -m transbench"
exec > >(tee "$OUT/summary.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
# the fused engine against the others on bert-base (issues 6, 8)
timeout 110 $TB run --model bert-base-uncased --dtype fp16 --encoders-only --backend eager,sdpa,cudagraph,fused \
  --batch 1,8,64,256 --seq 128,512 --baseline eager --min-time 0.1 --timeout 60 --name base --db $OUT/main.db
# ceilings (issue 5)
timeout 25 $TB micro gemm --sizes 8192 --model '' --db $OUT/micro.db --name gemm
timeout 15 $TB micro bandwidth --sizes 2^26,2^28 --db $OUT/micro.db --name bw
# OOM as a result, skipped cells and the largest batch (issue 3)
timeout 45 $TB run --model bert-large-uncased --dtype fp16 --backend sdpa --seq 512 --batch 1024,2048,4096,8192 \
  --max-batch --min-time 0 --min-count 1 --warmup 0 --timeout 30 --name oom-fp16 --db $OUT/main.db
# gpt2 generation, engine vs transformers (issue 6)
timeout 40 $TB run --model gpt2 --task generate --dtype fp16 --seq 512 --new-tokens 64 --batch 1 --backend sdpa,fused \
  --min-time 0.1 --timeout 40 --name gen --db $OUT/main.db
timeout 25 $TB micro breakdown --model bert-large-uncased --dtype fp16 --batch 64 --seq 128 --db $OUT/micro.db --name bd
