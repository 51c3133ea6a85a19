#!/usr/bin/env bash
# Session 16's GPU calls, one part per device call (each under 10 minutes on an H100); every step is time-boxed
# and writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round7.sh base    issue 23: the PDL test again, then bert-base 256 x 128 fp8 tuned, timed and
#                                         its graph replay's timeline (benchmarks/engine_bench.py --parts timeline)
#   bash benchmarks/gpu_round7.sh large   issue 23: the same for bert-large 128 x 384 fp8, then the PDL test again
#                                         (after graphs.GraphCache's fix: eager calls tune under the budget too)
#   bash benchmarks/gpu_round7.sh bound   issue 23: attention writing the output projection's e4m3 input on its bound's
#                                         scales: both fp8 targets tuned anew and timed, the GPU tests of the kernel
#                                         and of whole fp8 models, then the attention routes' times (--parts attn)
#   bash benchmarks/gpu_round7.sh races   issue 23: the kernel's GPU test again, then both fp8 targets tuned anew with
#                                         the races each tuning ran (transbench tune prints them now), and timed
#   bash benchmarks/gpu_round7.sh tests   the fp8 GPU test file, then the engine kernels' GPU tests that session 15 did
#                                         not reach (GPT-2, fp8 linear, tuning table, races, every LayerNorm route)
#   bash benchmarks/gpu_round7.sh ktests  the rest of the engine kernels' GPU tests: every GEMM, split-K and attention
#                                         config, decode attention, and the races test again (now unbudgeted)
#   bash benchmarks/gpu_round7.sh final   the engine kernels' GPU tests not run in this session, then whether a fused
#                                         cell's figures depend on the cells before it: bert-base fp16 8 x 128 alone,
#                                         then inside a sweep that runs 256 x 512 before it (peak memory, latency)
#   bash benchmarks/gpu_round7.sh repeat  issue 23: each fp8 target tuned once, then its cell run three times (what
#                                         varies between runs of one tuning, apart from the tuning's own variation)
#   bash benchmarks/gpu_round7.sh gen     the generation GPU tests of the transformers backends (the KV cache now passed
#                                         under the name the installed transformers takes)
#   bash benchmarks/gpu_round7.sh sweep   our attention kernel per tile config and pipeline depth at bert-large's fp8
#                                         target shape, against cuDNN (benchmarks/engine_bench.py --parts attn-sweep)
#   bash benchmarks/gpu_round7.sh last    the final code's attention and PDL tests: every attention config, the e4m3
#                                         route, whole fp8 models, PDL on against off
#   bash benchmarks/gpu_round7.sh settle  the memory check of `final` again after scenarios/inference.settle (a fused
#                                         cell restarts its peak after its first call), and an fp8 cell through it
# A part that needs an earlier one's files finds them in r7state/ (copied from that call's $OUT, not committed).
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 COLUMNS=150
PART=${1:-base}
TB="python3 -m transbench"
exec > >(tee "$OUT/round7_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
[ -d r7state ] && cp -r r7state/. "$OUT"/
export TRANSBENCH_CACHE_DIR=$OUT/tuning TRITON_CACHE_DIR=/tmp/r7-triton
fp8_target() {  # tune, time and draw the timeline of one fp8 target: model batch seq timeline-part
  timeout ${TUNE_S:-250} $TB tune --model $1 --batch $2 --seq $3 --dtype fp8 | grep -E "race|│"
  timeout 60 $TB run --model $1 --backend fused --dtype fp8 --batch $2 --seq $3 --encoders-only --min-time 0.3 \
    --timeout 55 --name fp8-$1 --db $OUT/r7.db --json $OUT/fp8-$1.json --wide | grep -E "fused|rel"
  [ -n "$4" ] && timeout 90 python3 benchmarks/engine_bench.py --parts $4 2>&1 | sed -n '/## timeline/,$p' | head -60
}
if [ "$PART" = base ]; then
  TRANSBENCH_CACHE_DIR=/tmp/r7p timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_engine_kernels.py -k programmatic > $OUT/pdl_test.txt 2>&1; echo "pytest rc $?"; tail -8 $OUT/pdl_test.txt
  fp8_target bert-base-uncased 256 128 timeline
fi
if [ "$PART" = large ]; then
  TUNE_S=210 fp8_target bert-large-uncased 128 384 timeline-large
  TRANSBENCH_CACHE_DIR=/tmp/r7p timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_engine_kernels.py -k programmatic > $OUT/pdl_test.txt 2>&1; echo "pytest rc $?"; tail -4 $OUT/pdl_test.txt
fi
if [ "$PART" = bound ]; then
  TUNE_S=150 fp8_target bert-base-uncased 256 128
  TUNE_S=150 fp8_target bert-large-uncased 128 384
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_fp8_gpu.py --durations=5 \
    -k "output_projections_e4m3 or fp8_bert_against" > $OUT/bound_tests.txt 2>&1; echo "pytest rc $?"; tail -8 $OUT/bound_tests.txt
  timeout 100 python3 benchmarks/engine_bench.py --parts attn 2>&1 | sed -n '/## attention/,/## routes/p'
fi
if [ "$PART" = races ]; then
  timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_fp8_gpu.py --durations=3 \
    -k "output_projections_e4m3" > $OUT/bound_tests.txt 2>&1; echo "pytest rc $?"; tail -4 $OUT/bound_tests.txt
  TUNE_S=150 fp8_target bert-base-uncased 256 128
  TUNE_S=150 fp8_target bert-large-uncased 128 384
fi
if [ "$PART" = tests ]; then
  TRANSBENCH_CACHE_DIR=/tmp/r7t timeout 320 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_engine_fp8_gpu.py --durations=5 > $OUT/fp8_tests.txt 2>&1; echo "pytest rc $?"; tail -12 $OUT/fp8_tests.txt
  TRANSBENCH_CACHE_DIR=/tmp/r7t timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_engine_kernels.py --durations=5 -k "gpt2_shape or fp8_linear_path or tuning_is_cached or settled or \
    every_linear_add_layernorm" > $OUT/kernel_tests.txt 2>&1; echo "pytest rc $?"; tail -12 $OUT/kernel_tests.txt
fi
if [ "$PART" = ktests ]; then
  TRANSBENCH_CACHE_DIR=/tmp/r7t timeout 560 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_engine_kernels.py --durations=5 -k "settled or every_config or decode_attention" \
    > $OUT/kernel_tests2.txt 2>&1; echo "pytest rc $?"; tail -12 $OUT/kernel_tests2.txt
fi
if [ "$PART" = final ]; then
  TRANSBENCH_CACHE_DIR=/tmp/r7t timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_engine_kernels.py --durations=3 -k "add_layernorm_kernel or bias_gelu_kernel or bert_base_shape or \
    minilm or odd_shapes or failed_capture or second_tune" > $OUT/kernel_tests3.txt 2>&1; echo "pytest rc $?"
  tail -6 $OUT/kernel_tests3.txt
  for grid in "--batch 8 --seq 128" "--batch 256,8 --seq 512,128"; do
    timeout 140 $TB run --model bert-base-uncased --backend fused --dtype fp16 --encoders-only $grid --min-time 0.3 \
      --timeout 100 --name "alone-or-not $grid" --db $OUT/order.db --wide | grep -E "│ inference" | cut -c1-150
  done
fi
if [ "$PART" = repeat ]; then
  for m in "bert-base-uncased 256 128" "bert-large-uncased 128 384"; do set -- $m
    timeout 150 $TB tune --model $1 --batch $2 --seq $3 --dtype fp8 | grep -E "│"
    for i in 1 2 3; do
      timeout 60 $TB run --model $1 --backend fused --dtype fp8 --batch $2 --seq $3 --encoders-only --min-time 0.3 \
        --timeout 55 --name fp8-$1-$i --db $OUT/repeat.db --wide | grep -E "│ inference" | cut -c1-150
    done
  done
fi
if [ "$PART" = gen ]; then
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_backends_gpu.py \
    tests/gpu/test_families_gpu.py -k "generation or static_decoders or decoder_families" --durations=3 > $OUT/gen_tests.txt 2>&1
  echo "pytest rc $?"; tail -6 $OUT/gen_tests.txt
fi
if [ "$PART" = sweep ]; then
  timeout 400 python3 benchmarks/engine_bench.py --parts attn-sweep 2>&1 | sed -n '/## attention/,/## routes/p'
fi
if [ "$PART" = last ]; then
  TRANSBENCH_CACHE_DIR=/tmp/r7l timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider -rf --durations=3 \
    tests/gpu/test_engine_kernels.py tests/gpu/test_engine_fp8_gpu.py -k "programmatic or attention_kernel_every_config \
    or output_projections_e4m3 or fp8_bert_against" > $OUT/last_tests.txt 2>&1; echo "pytest rc $?"; tail -6 $OUT/last_tests.txt
fi
if [ "$PART" = settle ]; then
  for grid in "--batch 8 --seq 128" "${GRID:---batch 256,8 --seq 512,128}"; do
    timeout 140 $TB run --model bert-base-uncased --backend fused --dtype fp16 --encoders-only $grid --min-time 0.3 \
      --timeout 100 --name "alone-or-not $grid" --db $OUT/order.db > /dev/null 2>&1; echo "run rc $?"
  done
  [ -n "$FP8" ] && timeout 100 $TB run --model bert-base-uncased --backend fused --dtype fp8 --encoders-only \
    --batch 256 --seq 128 --min-time 0.3 --timeout 90 --name fp8-settle --db $OUT/order.db > /dev/null 2>&1
  python3 - "$OUT/order.db" <<'PY'
import json, sqlite3, sys
for rec, info in sqlite3.connect(sys.argv[1]).execute("select record, info from cells order by created"):
    r, i = json.loads(rec), json.loads(info or "{}")
    print(r["dtype"], r["batch_size"], r["seq_len"], r["status"], r.get("latency_ms"), r.get("peak_mem_mb"),
          r.get("rel_err"), len(i.get("engine_tuning", {})), r.get("error"))
PY
fi
