#!/usr/bin/env bash
# Session 20's GPU calls, one part per device call (each under 10 minutes on an H100); every step is time-boxed and
# writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round11.sh serve  serving's fused figures after session 19's fix (engine/capture.py
#                                         side_stream): benchmarks/serve_h100.sh's fused max-rate search on this code
#                                         (tuning into an empty route table), then on the code before the fix (old:
#                                         r11old.tgz, a `git archive` of c83b1b0, unpacked to /tmp/old) with the routes
#                                         the first search stored
#   bash benchmarks/gpu_round11.sh check  transbench's sampler against a plain CUDA-event loop at points no issue names
#                                         (benchmarks/plain_loop_check.py), then a fused cell alone and after a
#                                         torch.compile reduce-overhead cell in one `run`
#   bash benchmarks/gpu_round11.sh verify a fused cell after a compile cell in one `run`, reduce-overhead (now ending its worker,
#                                         backends/compile.py GRAPH_MODES) and default; the new host_ms and host-bound
#                                         warning on sdpa and fused cells (bert-base fp16 2 x 96, 48 x 200); then
#                                         the GPU tests of both and the micro tests (the sampler's per-call parts)
#   bash benchmarks/gpu_round11.sh capture the GPU tests of a failed capture (a deberta cudagraph cell names fresh_worker_after,
#                                         no ok cell does) and of the engine's graphs, captures and tuning, then the
#                                         order check of session 19 (a fused cell after a cudagraph cell)
#   bash benchmarks/gpu_round11.sh final  the README's default `transbench run` on the GPU (host_ms and the warnings it
#                                         printed), then the GPU tests of the backends, the families and --gpus
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=150 TRITON_CACHE_DIR=/tmp/r11-triton PYTHONPATH=src
PART=${1:-serve}
exec > >(tee "$OUT/round11_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
summary() { python3 benchmarks/print_records.py "$@"; }  # json label
if [ "$PART" = serve ]; then
  [ -f r11old.tgz ] && mkdir -p /tmp/old && tar -xzf r11old.tgz -C /tmp/old
  export TRANSBENCH_CACHE_DIR=/tmp/r11-serve-tuning
  for code in ${CODES:-new old}; do
    src=src t=320; [ $code = old ] && src=/tmp/old/src t=230
    PYTHONPATH=$src timeout $t python3 -m transbench serve --model bert-base-uncased \
      --task classification --dtype fp16 --backend fused --lengths lognormal:64:256 --max-batch-size 16 \
      --max-wait-ms 2 --find-max-rate --slo-ms 10 --percentile 99 --duration 3 --warmup 1 --timeout 300 \
      --name "serve-maxrate-fused-$code" --db $OUT/serve.db > $OUT/serve_$code.txt 2>&1
    echo "serve $code rc $?"; grep -iE "max rate|offline|error" $OUT/serve_$code.txt | cut -c1-250
    PYTHONPATH=src python3 -m transbench report serve-maxrate-fused-$code --db $OUT/serve.db \
      --out $OUT/serve_report_$code > /dev/null 2>&1
    sed -n '/Serving under load/,/^## [^S]/p' $OUT/serve_report_$code/report.md | head -40
  done
fi
if [ "$PART" = check ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r11-check
  timeout 300 python3 benchmarks/plain_loop_check.py --model bert-base-uncased --backend sdpa,cudagraph,fused \
    --point 16x256 --point 2x96 --point 48x200 --dtype fp16 2>&1 | grep -vE "^\s*$" | tail -12
  timeout 200 python3 benchmarks/plain_loop_check.py --model gpt2 --backend sdpa,fused --point 4x320 --dtype bf16 \
    2>&1 | grep -vE "^\s*$" | tail -6
  for b in fused compile,fused; do
    cm=; [[ $b == *compile* ]] && cm="--compile-mode reduce-overhead"  # refused where no compile cell uses it
    timeout 150 python3 -m transbench run --model bert-base-uncased --backend $b $cm \
      --dtype fp16 --batch 8 --seq 128 --encoders-only --min-time 1 --timeout 120 --name "order ${b//,/-}" \
      --db $OUT/check.db --json $OUT/check_${b//,/-}.json > $OUT/check_${b//,/-}.txt 2>&1
    summary $OUT/check_${b//,/-}.json "run --backend $b:"
  done
fi
if [ "$PART" = verify ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r11-check
  for mode in reduce-overhead default; do for b in fused compile,fused; do
    name="${b//,/-}-$mode"
    cm=; [[ $b == *compile* ]] && cm="--compile-mode $mode"  # refused where no compile cell uses it
    timeout 150 python3 -m transbench run --model bert-base-uncased --backend $b $cm \
      --dtype fp16 --batch 8 --seq 128 --encoders-only --min-time 1 --timeout 120 --name "$name" \
      --db $OUT/verify.db --json $OUT/verify_$name.json > $OUT/verify_$name.txt 2>&1
    summary $OUT/verify_$name.json "compile-mode $mode, run --backend $b:"
  done; done
  for point in 2:96 48:200; do
    timeout 150 python3 -m transbench run --model bert-base-uncased --backend sdpa,fused --dtype fp16 \
      --batch ${point%:*} --seq ${point#*:} --min-time 1 --timeout 120 --name "host $point" --db $OUT/verify.db \
      --json $OUT/host_${point/:/x}.json > $OUT/host_${point/:/x}.txt 2>&1
    summary $OUT/host_${point/:/x}.json "host"
    grep -i "host-bound" $OUT/host_${point/:/x}.txt | cut -c1-200
  done
  TRANSBENCH_CACHE_DIR=/tmp/r11-tests timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_backends_gpu.py tests/gpu/test_micro_gpu.py -k "what_ran or host_bound or micro or gemm or copy \
    or layer or l2 or oom" > $OUT/verify_tests.txt 2>&1
  echo "pytest rc $?"; tail -5 $OUT/verify_tests.txt
fi
if [ "$PART" = final ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r11-final
  timeout 240 python3 -m transbench run --db $OUT/default.db --json $OUT/default.json > $OUT/default.txt 2>&1
  echo "default run rc $?"; grep -E "warning" $OUT/default.txt | sort | uniq -c | cut -c1-160
  summary $OUT/default.json "default"
  TRANSBENCH_CACHE_DIR=/tmp/r11-tests timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_backends_gpu.py tests/gpu/test_families_gpu.py tests/gpu/test_cli_gpus.py > $OUT/final_tests.txt 2>&1
  echo "pytest rc $?"; tail -8 $OUT/final_tests.txt
fi
if [ "$PART" = capture ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r11-tests
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_families_gpu.py -k generic \
    > $OUT/capture_tests.txt 2>&1; echo "pytest rc $?"; tail -3 $OUT/capture_tests.txt
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_kernels.py \
    -k "graphs or capture or tune or settled" > $OUT/capture_engine_tests.txt 2>&1
  echo "pytest rc $?"; tail -3 $OUT/capture_engine_tests.txt
  for b in fused cudagraph,fused; do
    timeout 150 python3 -m transbench run --model bert-base-uncased --backend $b --dtype fp16 --batch 8 --seq 128 \
      --encoders-only --min-time 1 --timeout 120 --name "cap ${b//,/-}" --db $OUT/capture.db \
      --json $OUT/capture_${b//,/-}.json > $OUT/capture_${b//,/-}.txt 2>&1
    summary $OUT/capture_${b//,/-}.json "run --backend $b:"
  done
fi
