#!/usr/bin/env bash
# Session 27's GPU calls (each part under 10 minutes on an H100); every step is time-boxed and writes under $OUT,
# so a call cut short still returns what was measured. Issue 23's throughput rows: `bash benchmarks/gpu_round16.sh
# targets`.
#   bash benchmarks/gpu_round17.sh verify   the code changed since the last GPU call, on CUDA: a checkpoint folder read
#                                           with local_files_only through `run` and `micro layer`, fp16/bf16 cells at
#                                           points no issue names (the dtype probe), the engine's argument checks and
#                                           generator ownership (tests/gpu/test_engine_configs_gpu.py), and the
#                                           sampler against a plain CUDA-event loop
#   bash benchmarks/gpu_round17.sh startup  issue 23 items 2 and 4: bert-base first calls cold and after `transbench
#                                           tune`, a fresh generator per request against a reused one
#   bash benchmarks/gpu_round17.sh memory   issue 23 item 5: fused against sdpa peak memory over the bert-base grid,
#                                           routes on disk
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=150 PYTHONPATH=src
PART=${1:-verify}
exec > >(tee "$OUT/round17_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
TB="python3 -m transbench"
if [ "$PART" = verify ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r17-verify TRITON_CACHE_DIR=/tmp/r17-verify-triton
  python3 -c "
from transformers import BertConfig, BertForMaskedLM
BertForMaskedLM(BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
    intermediate_size=1024)).save_pretrained('/tmp/r17-bert')"
  timeout 150 $TB run --model /tmp/r17-bert --task mlm --backend sdpa,fused --dtype fp16,bf16 \
    --batch 6 --seq 72 --min-time 0.3 --timeout 100 --db $OUT/verify.db --json $OUT/folder.json > $OUT/folder.txt 2>&1
  echo "folder run rc $?"; python3 benchmarks/print_records.py $OUT/folder.json "folder:"
  # the Python API in a process without HF_HUB_OFFLINE: the folder read with local_files_only, the variable left unset
  timeout 120 env -u HF_HUB_OFFLINE python3 -c "
import os
from transbench import api
from transbench.spec import RunSpec
out = api.run(RunSpec(models=['/tmp/r17-bert'], tasks=['mlm'], backends=['fused'], dtypes=['fp16'], batches=[3],
                      seqs=[50], min_time=0.3), db='$OUT/api.db')
assert 'HF_HUB_OFFLINE' not in os.environ
print('api folder', [(r['status'], r['latency_ms'], r['rel_err']) for r in out.records])"
  timeout 90 $TB micro layer --model /tmp/r17-bert --dtype fp16 --batch 6 --seq 72 --db $OUT/verify.db \
    > $OUT/layer.txt 2>&1
  echo "micro layer rc $?"; tail -6 $OUT/layer.txt | cut -c1-200
  timeout 150 $TB run --model roberta-base --backend sdpa,fused --dtype fp16,bf16 --batch 40 --seq 100 \
    --min-time 0.5 --timeout 120 --db $OUT/verify.db --json $OUT/roberta.json > $OUT/roberta.txt 2>&1
  echo "roberta run rc $?"; python3 benchmarks/print_records.py $OUT/roberta.json "roberta-base 40x100:"
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_configs_gpu.py \
    > $OUT/configs_tests.txt 2>&1
  echo "configs tests rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/configs_tests.txt | tail -6 | cut -c1-300
  timeout 100 python3 benchmarks/plain_loop_check.py --model roberta-base --backend sdpa,fused --point 40x100 \
    --dtype bf16 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -4
  timeout 100 python3 benchmarks/plain_loop_check.py --model gpt2-medium --backend fused --point 3x250 \
    --dtype fp16 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -3
fi
if [ "$PART" = startup ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r17-startup TRITON_CACHE_DIR=/tmp/r17-startup-triton
  for dt in fp16 fp8; do  # cold: empty tuning table and Triton cache for the first; fp8 then shares the compiles
    timeout 120 python3 benchmarks/engine_startup.py first-call --model bert-base-uncased --shape 1x128 --dtype $dt
  done
  timeout 100 python3 benchmarks/engine_startup.py first-call --model bert-base-uncased --shape 8x384 --dtype fp16
  timeout 100 python3 benchmarks/engine_startup.py generate --requests 5
  timeout 60 $TB tune --model bert-base-uncased --batch 8 --seq 384 --dtype fp16 2>&1 | grep -E "^batch"
  timeout 60 python3 benchmarks/engine_startup.py first-call --model bert-base-uncased --shape 8x384 --dtype fp16
fi
if [ "$PART" = memory ]; then
  # Session 27 ran these two steps at the end of `startup` with 200 s each: the tune was cut short, so the shapes it
  # had not reached tuned in their cell (with no budget, as every run cell), and fused 256 x 512 ran in a call of
  # its own. Here each step has the time it needs.
  export TRANSBENCH_CACHE_DIR=/tmp/r17-memory TRITON_CACHE_DIR=/tmp/r17-memory-triton
  timeout 300 $TB tune --model bert-base-uncased --batch 1,8,64,256 --seq 128,384,512 --dtype fp16 2>&1 | grep -E "^batch"
  timeout 270 $TB run --model bert-base-uncased --backend sdpa,fused --dtype fp16 --batch 1,8,64,256 \
    --seq 128,384,512 --encoders-only --min-time 0.3 --timeout 60 --db $OUT/memory.db --json $OUT/memory.json \
    > $OUT/memory.txt 2>&1
  echo "memory run rc $?"; python3 benchmarks/print_records.py $OUT/memory.json "bert-base fp16:"
fi
