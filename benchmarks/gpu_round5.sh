#!/usr/bin/env bash
# Session 14's GPU calls, one part per device call (each under 10 minutes on an H100); every step is time-boxed
# and writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round5.sh fp8     issue 23: bert-base 256x128 and bert-large 128x384 fp8 tuned and timed
#                                         (encoders-only), and their kernel profiles with the routes chosen
#   bash benchmarks/gpu_round5.sh gemm    issue 23: the fused fp8 GEMM per tile config against torch._scaled_mm
#                                         (benchmarks/engine_bench.py --parts fp8gemm), then the fp8 part again
#   bash benchmarks/gpu_round5.sh tests   issue 23: the fp8 GPU test file, then the fp16 GEMM's and engine's GPU tests
#                                         (the GEMM kernel gained the fp8 epilogue)
#   bash benchmarks/gpu_round5.sh final   issue 23: the fp8 GEMM route tests again (after the shared-memory fix);
#                                         issue 25: the best bert-large and gpt2 training cells, compiled SDPA
#                                         unmasked and the vocabulary padded (needs .whl/ carried)
#   bash benchmarks/gpu_round5.sh train   issue 25: which attention kernel the compiled bert-large step reaches
#                                         (benchmarks/sdpa_choice.py), then the profiles of bert-large with a forced
#                                         SDPA kernel and of gpt2 with its vocabulary padded (needs .whl/ carried:
#                                         benchmarks/wheels.sh)
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 COLUMNS=150
TB="python3 -m transbench"
PART=${1:-fp8}
exec > >(tee "$OUT/round5_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
fp8_tables() {  # tune, then time, the two fp8 targets; then their kernel profiles and the routes chosen
  for m in "bert-base-uncased 256 128" "bert-large-uncased 128 384"; do set -- $m
    timeout 80 $TB tune --model $1 --batch $2 --seq $3 --dtype fp8 | tail -2
    timeout 60 $TB run --model $1 --backend fused --dtype fp8 --batch $2 --seq $3 --encoders-only --min-time 0.3 \
      --timeout 55 --name fp8-$1 --db $OUT/r5.db --json $OUT/fp8-$1.json --wide | grep -E "fused|rel"
  done
  timeout 100 python3 benchmarks/engine_bench.py --parts profile-fp8 2>&1 | sed -n '/## profile/,$p' | grep -v "fp16\]" | head -60
}
if [ "$PART" = fp8 ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r5 TRITON_CACHE_DIR=/tmp/r5-triton
  fp8_tables
fi
if [ "$PART" = gemm ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r5g TRITON_CACHE_DIR=/tmp/r5g-triton
  timeout 200 python3 benchmarks/engine_bench.py --parts fp8gemm 2>&1 | sed -n '/## fp8 GEMM/,/## routes/p'
  fp8_tables
fi
if [ "$PART" = tests ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r5t TRITON_CACHE_DIR=/tmp/r5t-triton
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_fp8_gpu.py --durations=8 \
    > $OUT/fp8_tests.txt 2>&1; echo "pytest rc $?"
  tail -25 $OUT/fp8_tests.txt
  timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_kernels.py --durations=5 \
    -k "triton_gemm_every_config or bert_base_shape or fp8_linear or odd_shapes" > $OUT/kernel_tests.txt 2>&1
  echo "pytest rc $?"; tail -15 $OUT/kernel_tests.txt
fi
if [ "$PART" = final ]; then
  TRANSBENCH_CACHE_DIR=/tmp/r5f timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_engine_fp8_gpu.py -k "gemm_routes or quantize_kernel" > $OUT/fp8_route_tests.txt 2>&1
  echo "pytest rc $?"; tail -4 $OUT/fp8_route_tests.txt
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
  TDB=$OUT/train_round5.db
  timeout 170 $TB train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --batch 384 --optim adamw-fused \
    --head masked --compile on --pad-vocab 64 --steps 5 --warmup 2 --timeout 160 --name best-bert-large --db $TDB --wide
  timeout 150 $TB train --model gpt2 --seq 1024 --dtype bf16 --batch 48 --optim adamw-fused --activation gelu-tanh \
    --compile on --pad-vocab 64 --steps 5 --warmup 2 --timeout 140 --name best-gpt2 --db $TDB --wide
fi
if [ "$PART" = train ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
  for v in "" "--kernel FLASH_ATTENTION" "--kernel EFFICIENT_ATTENTION" "--no-dropout"; do
    timeout 60 python3 benchmarks/sdpa_choice.py --model bert-large-uncased --batch 8 --seq 128 $v
  done
  timeout 60 python3 benchmarks/sdpa_choice.py --model gpt2 --batch 4 --seq 1024
  timeout 130 python3 benchmarks/train_profile.py --model gpt2 --seq 1024 --batch 48 --dtype bf16 \
    --optim adamw-fused --compile --activation gelu-tanh --pad-vocab 64 --out $OUT/profile_gpt2_pad64 | head -40
  timeout 130 python3 benchmarks/train_profile.py --model bert-large-uncased --task mlm --seq 128 --batch 384 \
    --dtype bf16 --optim adamw-fused --compile --head masked --backend sdpa-flash --pad-vocab 64 \
    --out $OUT/profile_bert_large_flash | head -40
fi
