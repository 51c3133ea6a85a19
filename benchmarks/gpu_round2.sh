#!/usr/bin/env bash
# Session 11's second GPU round, one part per device call (each under 10 minutes on an H100); every step is
# time-boxed and writes under $OUT.
#   bash benchmarks/gpu_round2.sh engine   issue 23: fp8 / embedding / generator GPU tests, first calls with the
#                                          tuning budget, fresh vs reused generator, fused vs sdpa fp16/fp8
#   bash benchmarks/gpu_round2.sh serve    issue 26 max rate under p99 10 ms (sdpa, fused, eager, cudagraph),
#                                          issue 24 family GPU tests, issue 21 sampler vs a plain loop
#   bash benchmarks/gpu_round2.sh train    issue 25: DeepSpeed ZeRO 1-3 and the ladder (needs .whl carried)
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 COLUMNS=150
TB="python3 -m transbench"
PART=${1:-engine}
exec > >(tee "$OUT/round2_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
if [ "$PART" = engine ]; then
  E=$OUT/engine23; mkdir -p $E
  TRANSBENCH_CACHE_DIR=$E/tuning-tests timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rs -x \
    tests/gpu/test_engine_fp8_gpu.py 2>&1 | tail -15
  for shape in 1x128 256x128; do
    TRANSBENCH_CACHE_DIR=$E/cold-$shape TRITON_CACHE_DIR=$E/triton-cold-$shape \
      timeout 60 python3 benchmarks/engine_startup.py first-call --shape $shape
  done
  timeout 70 python3 benchmarks/engine_startup.py generate
  export TRANSBENCH_CACHE_DIR=$E/tuned
  timeout 120 $TB run --model bert-base-uncased --backend fused,sdpa --dtype fp16,fp8 --batch 1,256 --seq 128 \
    --encoders-only --min-time 0.5 --timeout 100 --baseline sdpa --name base-enc --db $E/e.db --wide
  timeout 110 $TB run --model bert-large-uncased --backend fused,sdpa --dtype fp16,fp8 --batch 128 --seq 384 \
    --encoders-only --min-time 0.5 --timeout 100 --baseline sdpa --name large-enc --db $E/e.db --wide
fi
if [ "$PART" = serve ]; then
  for b in sdpa fused eager cudagraph; do
    timeout 110 $TB serve --model bert-base-uncased --task classification --dtype fp16 --backend $b \
      --lengths lognormal:64:256 --max-batch-size 16 --max-wait-ms 2 --find-max-rate --slo-ms 10 --percentile 99 \
      --duration 2 --warmup 0.5 --timeout 100 --name maxrate-$b --db $OUT/serve.db
  done
  timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/gpu/test_families_gpu.py 2>&1 | tail -5
  timeout 90 python3 benchmarks/plain_loop_check.py --model bert-base-uncased --backend sdpa,fused --point 8x384 --point 64x512 --rounds 2
fi
if [ "$PART" = train ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
  timeout 280 bash benchmarks/gpu_train_round2.sh deepspeed
  timeout 280 bash benchmarks/gpu_train_round2.sh ladder
fi
