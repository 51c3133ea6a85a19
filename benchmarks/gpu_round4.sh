#!/usr/bin/env bash
# Session 13's GPU calls, one part per device call (each under 10 minutes on an H100); every step is time-boxed
# and writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round4.sh fp8     issue 23: tune and time the fp16 / fp8 engine tables, bert-base 1x128
#                                         with embeddings, and the fp8 forwards' kernel profiles
#   bash benchmarks/gpu_round4.sh checks  issue 23: the fp8 GPU tests, the fp8 quantize pass's variants; issue 26: where the fused serve tail goes
#                                         (benchmarks/serve_trace.py)
#   bash benchmarks/gpu_round4.sh verify  issue 23: the fp8 rows and profiles again after the quantize pass's fix;
#                                         issue 26: the fused max-rate search after the serve fixes (frozen heap,
#                                         no NVML call on the serving thread)
#   bash benchmarks/gpu_round4.sh train   issue 25: bert-large's best options with Liger, the profiles of the
#                                         best bert-large and gpt2 steps, the Liger GPU tests (needs .whl/ carried:
#                                         benchmarks/wheels.sh)
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 COLUMNS=150
TB="python3 -m transbench"
PART=${1:-fp8}
exec > >(tee "$OUT/round4_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
if [ "$PART" = fp8 ]; then
  # Caches outside $OUT (Triton's is large); the tables, records and profile come back.
  timeout 420 bash benchmarks/engine_fp8.sh /tmp/e23 tables,emb 2>&1 | sed -n '/^| model/,$p'
  TRANSBENCH_CACHE_DIR=/tmp/e23/tuned TRITON_CACHE_DIR=/tmp/e23/triton-tuned timeout 120 \
    python3 benchmarks/engine_bench.py --parts profile-fp8 2>&1 | sed -n '/## profile/,/## routes/p'
  mkdir -p $OUT/e23 && cp /tmp/e23/*.txt /tmp/e23/*.json /tmp/e23/*.db $OUT/e23/
fi
if [ "$PART" = checks ]; then
  TRANSBENCH_CACHE_DIR=/tmp/fp8-tests timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_engine_fp8_gpu.py 2>&1 | tail -6
  timeout 90 python3 benchmarks/engine_bench.py --parts quant
  timeout 300 python3 benchmarks/serve_trace.py --backend fused,cudagraph --rates 36,300,2000 --duration 2
fi
if [ "$PART" = verify ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/v23 TRITON_CACHE_DIR=/tmp/v23-triton
  timeout 40 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_fp8_gpu.py -k quantize 2>&1 | tail -2
  timeout 50 $TB tune --model bert-base-uncased --batch 256 --seq 128 --dtype fp8
  timeout 50 $TB tune --model bert-large-uncased --batch 128 --seq 384 --dtype fp8
  for m in "bert-base-uncased 256 128" "bert-large-uncased 128 384"; do set -- $m
    timeout 60 $TB run --model $1 --backend fused --dtype fp8 --batch $2 --seq $3 --encoders-only --min-time 0.3 \
      --timeout 55 --name fp8-$1 --db $OUT/verify.db --json $OUT/fp8-$1.json | tail -3
  done
  timeout 100 python3 benchmarks/engine_bench.py --parts profile-fp8 2>&1 | sed -n '/## profile/,/## routes/p'
  export TRANSBENCH_CACHE_DIR=$OUT/serve-tuning
  timeout 250 $TB serve --model bert-base-uncased --task classification --dtype fp16 --lengths lognormal:64:256 \
    --max-batch-size 16 --max-wait-ms 2 --find-max-rate --slo-ms 10 --percentile 99 --duration 2 --warmup 0.5 \
    --backend fused --timeout 240 --name maxrate-fused --db $OUT/verify.db
  timeout 20 python3 benchmarks/serve_prepare.py $OUT/verify.db
  rm -rf $OUT/serve-tuning
fi
if [ "$PART" = train ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
  export TORCH_CUDA_ARCH_LIST=9.0  # DeepSpeed cannot read the image's "9.0a" (session 11)
  TDB=$OUT/train_round4.db
  timeout 130 $TB train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --batch 384 --optim adamw-fused \
    --head masked --compile on --kernels torch,liger --steps 5 --warmup 2 --timeout 120 --name best-bert-large \
    --db $TDB --wide
  timeout 130 python3 benchmarks/train_profile.py --model bert-large-uncased --task mlm --seq 128 --batch 384 \
    --dtype bf16 --optim adamw-fused --compile --head masked --out $OUT/profile_bert_large_best
  timeout 130 python3 benchmarks/train_profile.py --model gpt2 --seq 1024 --batch 48 --dtype bf16 \
    --optim adamw-fused --compile --activation gelu-tanh --out $OUT/profile_gpt2_best
  timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_training_gpu.py -k liger 2>&1 | tail -5
fi
