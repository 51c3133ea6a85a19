#!/usr/bin/env bash
# Sessions 25 and 26's GPU calls (each part under 10 minutes on an H100); every step is time-boxed and writes under
# $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round16.sh targets  issue 23's two fp8 throughput rows on this session's card: tune, then
#                                           fused fp16 and fp8 against sdpa at bert-base 256 x 128 and bert-large
#                                           128 x 384 (encoders only, as the issue's table)
#   bash benchmarks/gpu_round16.sh check    after session 25's changes: sliding-window decoder folders through `run`
#                                           on CUDA (their FLOPs count the window), the family, micro and training
#                                           GPU tests (plots now written whole), then the sampler against a plain
#                                           CUDA-event loop at points no issue names
#   bash benchmarks/gpu_round16.sh int8     would an int8 path keep fp8's GEMM speed: benchmarks/int8_gemm.py
#   bash benchmarks/gpu_round16.sh review   session 26's review fixes on CUDA: a regression-head checkpoint (num_labels
#                                           1) through every backend and `train`, the max-batch answer line, then the
#                                           family and training GPU tests
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=150 PYTHONPATH=src
PART=${1:-targets}
exec > >(tee "$OUT/round16_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
TB="python3 -m transbench"
if [ "$PART" = targets ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r16-targets TRITON_CACHE_DIR=/tmp/r16-targets-triton
  for point in "bert-base-uncased 256 128" "bert-large-uncased 128 384"; do
    set -- $point
    for dt in fp8 fp16; do
      timeout 170 $TB tune --model $1 --batch $2 --seq $3 --dtype $dt 2>&1 | tail -2
    done
    timeout 150 $TB run --model $1 --backend fused,sdpa --dtype fp16,fp8 --batch $2 --seq $3 --encoders-only \
      --min-time 1 --timeout 140 --baseline sdpa --db $OUT/targets.db --json $OUT/$1.json > $OUT/$1.txt 2>&1
    echo "$1 rc $?"; python3 benchmarks/print_records.py $OUT/$1.json "$1 ${2}x$3:"
  done
fi
if [ "$PART" = check ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r16-check TRITON_CACHE_DIR=/tmp/r16-check-triton
  # decoders whose layers attend a window of 16 tokens (every layer: Mistral; every other: Gemma2), at 64 tokens
  python3 - <<'PY'
from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM
MistralForCausalLM(MistralConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, sliding_window=16,
                                 max_position_embeddings=256)).save_pretrained("/tmp/r16-mistral")
Gemma2ForCausalLM(Gemma2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=16,
                               max_position_embeddings=256)).save_pretrained("/tmp/r16-gemma2")
PY
  for m in /tmp/r16-mistral /tmp/r16-gemma2; do
    timeout 150 $TB run --model $m --task causal-lm --backend eager,sdpa --dtype bf16 --batch 2 --seq 64 \
      --min-time 0.3 --timeout 100 --db $OUT/window.db --json $OUT/$(basename $m).json > $OUT/$(basename $m).txt 2>&1
    echo "$m rc $?"; python3 benchmarks/print_records.py $OUT/$(basename $m).json "$m:"
    grep -E "error|unsupported" $OUT/$(basename $m).txt | head -5 | cut -c1-250
  done
  timeout 100 python3 benchmarks/plain_loop_check.py --model bert-base-uncased --backend sdpa,fused \
    --point 12x200 --dtype bf16 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -4
  timeout 100 python3 benchmarks/plain_loop_check.py --model gpt2 --backend cudagraph,fused --point 5x300 \
    --dtype fp16 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -4
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_micro_gpu.py \
    tests/gpu/test_training_gpu.py > $OUT/micro_train_tests.txt 2>&1
  echo "micro+training rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/micro_train_tests.txt | tail -8 | cut -c1-300
fi
if [ "$PART" = int8 ]; then
  export TRITON_CACHE_DIR=/tmp/r16-int8-triton
  timeout 300 python3 benchmarks/int8_gemm.py
  echo "int8_gemm rc $?"
fi
if [ "$PART" = review ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r16-review TRITON_CACHE_DIR=/tmp/r16-review-triton
  python3 -c "
from transformers import BertConfig, BertForSequenceClassification
BertForSequenceClassification(BertConfig(vocab_size=512, hidden_size=200, num_hidden_layers=2, num_attention_heads=8,
    intermediate_size=400, num_labels=1)).save_pretrained('/tmp/r16-regress')"
  timeout 120 $TB run --model /tmp/r16-regress --task classification --backend eager,sdpa,fused --dtype fp16 \
    --batch 4 --seq 64 --min-time 0.3 --timeout 100 --db $OUT/review.db --json $OUT/regress.json > $OUT/regress.txt 2>&1
  echo "regress run rc $?"; python3 benchmarks/print_records.py $OUT/regress.json "regress:"
  timeout 90 $TB train --model /tmp/r16-regress --task classification --dtype bf16 --batch 4 --seq 64 --steps 5 \
    --db $OUT/review.db > $OUT/regress_train.txt 2>&1
  echo "regress train rc $?"; grep -E "ok|error|unsupported" $OUT/regress_train.txt | tail -3 | cut -c1-200
  timeout 90 $TB run --model bert-tiny --backend sdpa --dtype fp16 --seq 32 --max-batch --min-time 0.2 \
    --db $OUT/review.db 2>&1 | grep -E "max-batch|warning" | tail -3 | cut -c1-250
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_families_gpu.py > $OUT/families.txt 2>&1
  echo "families rc $?"; grep -E "passed|failed|^FAILED" $OUT/families.txt | tail -6 | cut -c1-300
fi
