#!/usr/bin/env bash
# Session 22's GPU calls, one part per device call (each under 10 minutes on an H100); every step is time-boxed and
# writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round13.sh fp8     issue 23's fp8 rows again on this session's card (engine_fp8.sh tables:
#                                          tuned bert-base 1/8/256 x 128 and bert-large 128 x 384, fused against
#                                          sdpa, fp16 and fp8), the fp8 GPU tests, then the sampler against a plain
#                                          CUDA-event loop at fp8 and fp16 points no issue names
#   bash benchmarks/gpu_round13.sh verify  the GPU tests of the engine, the backends and the families after session
#                                          22's engine changes, and odd model shapes through `transbench run`
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=150 PYTHONPATH=src
PART=${1:-fp8}
exec > >(tee "$OUT/round13_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
if [ "$PART" = fp8 ]; then
  timeout 290 bash benchmarks/engine_fp8.sh $OUT/engine23 tables 2>&1 | tail -14
  TRANSBENCH_CACHE_DIR=/tmp/r13-tests timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_engine_fp8_gpu.py > $OUT/fp8_tests.txt 2>&1
  echo "fp8 tests rc $?"; tail -3 $OUT/fp8_tests.txt
  TRANSBENCH_CACHE_DIR=$OUT/engine23/tuned timeout 150 python3 benchmarks/plain_loop_check.py \
    --model bert-base-uncased --backend fused --point 32x256 --point 6x100 --dtype fp8 2>&1 | grep -vE "^\s*$" | tail -5
  TRANSBENCH_CACHE_DIR=$OUT/engine23/tuned timeout 120 python3 benchmarks/plain_loop_check.py \
    --model gpt2 --backend sdpa,fused --point 4x200 --dtype bf16 2>&1 | grep -vE "^\s*$" | tail -5
fi
if [ "$PART" = verify ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r13-verify TRITON_CACHE_DIR=/tmp/r13-verify-triton
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_kernels.py \
    tests/gpu/test_families_gpu.py -k "bert_base_shape or real_checkpoint or odd_shapes or gpt2_shape or fused_roberta" \
    > $OUT/verify_tests.txt 2>&1
  echo "pytest rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/verify_tests.txt | tail -8 | cut -c1-300
  # session 22's engine changes on the GPU: RoBERTa numbers positions from its ids (left padding, a real token equal
  # to the pad id), a BERT pooler refuses a padded first token, tests/test_engine_configs.py's cases on CUDA
  timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_configs_gpu.py > $OUT/configs.txt 2>&1
  echo "configs on cuda rc $?"; tail -3 $OUT/configs.txt | cut -c1-300
  timeout 80 python3 -m transbench run --model roberta-base --backend fused,sdpa --dtype fp16 --batch 8 --seq 128 \
    --seq-stdev 24 --min-time 0.3 --timeout 70 --db $OUT/verify.db --json $OUT/roberta.json > $OUT/roberta.txt 2>&1
  echo "roberta rc $?"; python3 benchmarks/print_records.py $OUT/roberta.json "roberta-base padded:"
fi
