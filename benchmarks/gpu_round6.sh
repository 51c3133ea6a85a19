#!/usr/bin/env bash
# Session 15's GPU calls, one part per device call (each under 10 minutes on an H100); every step is time-boxed
# and writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round6.sh kern    issue 23: the attention routes (SDPA, ours, ours writing e4m3 too) at the
#                                         fp8 targets' shapes (benchmarks/engine_bench.py --parts attn), then the GPU
#                                         tests of the e4m3 attention
#   bash benchmarks/gpu_round6.sh fp8     issue 23: the fp8 targets tuned, timed and profiled (gpu_round5.sh fp8)
#   bash benchmarks/gpu_round6.sh ftests  the fp8 GPU test file
#   bash benchmarks/gpu_round6.sh ktests  the engine kernels' GPU test file (GEMMs, attention, captures, tuning)
#   bash benchmarks/gpu_round6.sh tune16  issue 23: `transbench tune` of the bert-base fp16 grid (batch 1, 8, 64, 256
#                                         x seq 128, 384, 512) into $OUT/tuning
#   bash benchmarks/gpu_round6.sh grid16  issue 23: that grid through `transbench run`, fused against sdpa,
#                                         sdpa-cudnn and cudagraph, in the warm process the tuned table makes
#                                         (speed, rel_err, peak memory)
# A part that needs an earlier one's files finds them in r6state/ (copied from that call's $OUT, not committed).
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 COLUMNS=150
PART=${1:-kern}
TB="python3 -m transbench"
exec > >(tee "$OUT/round6_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
if [ "$PART" = kern ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r6k TRITON_CACHE_DIR=/tmp/r6k-triton
  timeout 250 python3 benchmarks/engine_bench.py --parts attn 2>&1 | sed -n '/## attention/,/## routes/p'
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_fp8_gpu.py --durations=5 \
    -k "attention_writes or fp8_bert_against" > $OUT/kern_tests.txt 2>&1
  echo "pytest rc $?"; tail -25 $OUT/kern_tests.txt
fi
if [ "$PART" = fp8 ]; then
  # bert-base's tuning first, in a box of its own: with cold Triton caches it outran gpu_round5.sh's 80 s (session 15).
  export TRANSBENCH_CACHE_DIR=/tmp/r5 TRITON_CACHE_DIR=/tmp/r5-triton
  timeout 250 $TB tune --model bert-base-uncased --batch 256 --seq 128 --dtype fp8 | tail -2
  bash benchmarks/gpu_round5.sh fp8
fi
if [ "$PART" = ftests ]; then
  TRANSBENCH_CACHE_DIR=/tmp/r6t timeout 560 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_engine_fp8_gpu.py --durations=5 > $OUT/fp8_tests.txt 2>&1; echo "pytest rc $?"; tail -12 $OUT/fp8_tests.txt
fi
if [ "$PART" = ktests ]; then
  TRANSBENCH_CACHE_DIR=/tmp/r6t timeout 560 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_engine_kernels.py --durations=5 > $OUT/kernel_tests.txt 2>&1; echo "pytest rc $?"; tail -15 $OUT/kernel_tests.txt
fi
[ -d r6state ] && cp -r r6state/. "$OUT"/
export TRANSBENCH_CACHE_DIR=$OUT/tuning TRITON_CACHE_DIR=/tmp/r6-triton
if [ "$PART" = tune16 ]; then
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_engine_kernels.py -k "failed_capture"
  timeout 420 $TB tune --model bert-base-uncased --batch 1,8,64,256 --seq 128,384,512 --dtype fp16 | tail -16
fi
if [ "$PART" = grid16 ]; then
  timeout 560 $TB run --model bert-base-uncased --dtype fp16 --encoders-only --backend sdpa,sdpa-cudnn,cudagraph,fused \
    --batch 1,8,64,256 --seq 128,384,512 --baseline sdpa --min-time 0.2 --timeout 100 --name fp16-bert-base \
    --db $OUT/fp16.db --wide | grep -E "fused|sdpa|cudagraph" | tail -60
fi
