#!/usr/bin/env bash
# Session 23's GPU calls, one part per device call (each under 10 minutes on an H100); every step is time-boxed and
# writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round14.sh large   issue 23's bert-large 128 x 384 row on this session's card: tune fp8 and
#                                          fp16, then fused (fp8, fp16) against sdpa fp16 through `transbench run`,
#                                          at 0.3 s and at 2 s a cell (encoders-only)
#   bash benchmarks/gpu_round14.sh verify  the padding path's host cost (benchmarks/packing_cost.py), the GPU tests
#                                          of make_packing's kernels and of padded models through the engine, and
#                                          padded bert-base / roberta-base cells through `transbench run`
#   bash benchmarks/gpu_round14.sh padded  the same after a change: make_packing's GPU test, packing_cost.py (whole
#                                          calls with the two packing paths interleaved), and padded 8 x 128 cells
#                                          (roberta-base: session 22's verify command) through `transbench run`
#   bash benchmarks/gpu_round14.sh final   the serve, micro and training GPU tests after session 23's CPU-side
#                                          changes there, then the sampler against a plain CUDA-event loop at points
#                                          no issue names
#   bash benchmarks/gpu_round14.sh models  the GPU family tests after session 23's model-building changes
#                                          (checkpoint folders rebuilt for SDPA, QA backbones remapped)
#   bash benchmarks/gpu_round14.sh base    issue 23's bert-base 256 x 128 fp8 row on this session's card (tuned
#                                          fused fp8 and fp16 against sdpa fp16, encoders-only)
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=150 PYTHONPATH=src
PART=${1:-large}
exec > >(tee "$OUT/round14_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
TB="python3 -m transbench"
if [ "$PART" = large ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r14-tuned TRITON_CACHE_DIR=/tmp/r14-triton
  timeout 170 $TB tune --model bert-large-uncased --batch 128 --seq 384 --dtype fp8 2>&1 | tail -3
  timeout 140 $TB tune --model bert-large-uncased --batch 128 --seq 384 --dtype fp16 2>&1 | tail -3
  for t in 0.3 2; do
    timeout 100 $TB run --model bert-large-uncased --backend fused,sdpa --dtype fp16,fp8 --batch 128 --seq 384 \
      --encoders-only --min-time $t --timeout 90 --baseline sdpa --name large-$t --db $OUT/r14.db \
      --json $OUT/large-$t.json > $OUT/large-$t.txt 2>&1
    echo "large min-time $t rc $?"; python3 benchmarks/print_records.py $OUT/large-$t.json "bert-large 128x384 min-time $t:"
  done
fi
if [ "$PART" = padded ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r14-padded TRITON_CACHE_DIR=/tmp/r14-padded-triton
  timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_kernels.py -k packing \
    > $OUT/packing_tests.txt 2>&1
  echo "pytest rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/packing_tests.txt | tail -8 | cut -c1-300
  timeout 170 python3 benchmarks/packing_cost.py 2>&1 | grep -vE "Warning|warn_once"
  for m in roberta-base bert-base-uncased; do
    timeout 120 $TB run --model $m --backend fused,sdpa --dtype fp16 --batch 8 --seq 128 --seq-stdev 24 \
      --min-time 0.3 --timeout 110 --db $OUT/padded.db --json $OUT/$m.json > $OUT/$m.txt 2>&1
    echo "$m rc $?"; python3 benchmarks/print_records.py $OUT/$m.json "$m padded:"
  done
fi
if [ "$PART" = verify ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r14-verify TRITON_CACHE_DIR=/tmp/r14-verify-triton
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_kernels.py \
    -k "packing or bert_base_shape or real_checkpoint or gpt2_shape" > $OUT/packing_tests.txt 2>&1
  echo "pytest rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/packing_tests.txt | tail -8 | cut -c1-300
  timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_configs_gpu.py > $OUT/configs.txt 2>&1
  echo "configs on cuda rc $?"; tail -3 $OUT/configs.txt | cut -c1-300
  timeout 150 python3 benchmarks/packing_cost.py 2>&1 | grep -vE "Warning|warn_once"
  for m in bert-base-uncased roberta-base; do
    timeout 80 $TB run --model $m --backend fused,sdpa --dtype fp16 --batch 1,8 --seq 128 --seq-stdev 24 \
      --min-time 0.3 --timeout 70 --db $OUT/verify.db --json $OUT/$m.json > $OUT/$m.txt 2>&1
    echo "$m rc $?"; python3 benchmarks/print_records.py $OUT/$m.json "$m padded:"
  done
fi
if [ "$PART" = final ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r14-final TRITON_CACHE_DIR=/tmp/r14-final-triton
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_serve_gpu.py tests/gpu/test_micro_gpu.py \
    > $OUT/serve_micro_tests.txt 2>&1
  echo "serve+micro rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/serve_micro_tests.txt | tail -8 | cut -c1-300
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_training_gpu.py > $OUT/train_tests.txt 2>&1
  echo "training rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/train_tests.txt | tail -8 | cut -c1-300
  timeout 100 python3 benchmarks/plain_loop_check.py --model gpt2 --backend sdpa,fused --point 4x200 --dtype bf16 \
    2>&1 | grep -vE "^\s*$|Warning|warn" | tail -4
  timeout 100 python3 benchmarks/plain_loop_check.py --model bert-large-uncased --backend cudagraph,fused --point 3x77 \
    --dtype fp16 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -4
fi
if [ "$PART" = models ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r14-models TRITON_CACHE_DIR=/tmp/r14-models-triton
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_families_gpu.py -k "not fused_roberta and not onnxruntime" \
    > $OUT/families_tests.txt 2>&1
  echo "families rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/families_tests.txt | tail -12 | cut -c1-300
fi
if [ "$PART" = base ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r14-base TRITON_CACHE_DIR=/tmp/r14-base-triton
  timeout 150 $TB tune --model bert-base-uncased --batch 256 --seq 128 --dtype fp8 2>&1 | tail -2
  timeout 120 $TB tune --model bert-base-uncased --batch 256 --seq 128 --dtype fp16 2>&1 | tail -2
  timeout 150 $TB run --model bert-base-uncased --backend fused,sdpa --dtype fp16,fp8 --batch 256 --seq 128 \
    --encoders-only --min-time 0.3 --timeout 140 --baseline sdpa --db $OUT/base.db --json $OUT/base.json > $OUT/base.txt 2>&1
  echo "base rc $?"; python3 benchmarks/print_records.py $OUT/base.json "bert-base 256x128:"
fi
