#!/usr/bin/env bash
# Session 19's GPU calls, one part per device call (each under 10 minutes on an H100); every step is time-boxed
# and writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round10.sh order  issue 23's open latency observation: bert-base fp16 8 x 128 alone in a process
#                                         and after a 1 x 128 cell, with one route table (`transbench tune` first),
#                                         processes alternating (benchmarks/order_latency.py), then once through
#                                         `transbench run` each way
#   bash benchmarks/gpu_round10.sh order2 the same with the graph's replay timed alone (order_latency.py's replay_ms): orders
#                                         8, 8,8 and 1,8, twice, then 8 and 1,8 with gc.freeze() before each cell
#   bash benchmarks/gpu_round10.sh order3 orders 8 and 8,8 with each cell's routes and its graph's kernel times
#                                         (torch.profiler), to find where the GPU time of a second cell goes
#   bash benchmarks/gpu_round10.sh order4 order 8,8 with PDL off (engine/kernels.py USE_PDL), then with PDL on keeping
#                                         each cell's graph (its replay timed again at the end; the script also tried to
#                                         print each graph's nodes, a probe since removed: torch refused it)
#   bash benchmarks/gpu_round10.sh pdl    which step of a second cell slows the first cell's graph (benchmarks/pdl_state.py),
#                                         once per word of PDL_ARGS, its _ read as spaces
#   bash benchmarks/gpu_round10.sh verify the fix (capture.side_stream): orders 8,8 and 1,8 with the routes on disk, pdl_state.py
#                                         as is and with --own-stream, order 1,8 tuning in the cells (an empty route
#                                         table), then the GPU tests on graphs and captures
#   bash benchmarks/gpu_round10.sh backends a fused cell after a cudagraph cell in one `run` (bert-base fp16 8 x 128, routes on
#                                         disk), on the code before the cudagraph backend captured on the shared stream
#                                         (old: r10old.tgz, a `git archive` of e9a1ad2, unpacked to /tmp/old) and on this
#                                         code; then fused alone and after sdpa and cudagraph cells
#   bash benchmarks/gpu_round10.sh mem    session 17's 1,441.3 MiB: bert-base 256 x 128 fp8 through `transbench run`,
#                                         tuning in the cell (an empty route table each run), RUNS times (default
#                                         1 2) for each of CODES (default "old new"; old: r10old.tgz, a `git archive`
#                                         of 56a4cbf, the commit before the collection after tuning, unpacked to
#                                         /tmp/old)
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=150 TRITON_CACHE_DIR=/tmp/r10-triton PYTHONPATH=src
PART=${1:-order}
exec > >(tee "$OUT/round10_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
summary() {  # json label
  python3 - "$1" "$2" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(sys.argv[2], r.get("backend"), r.get("batch_size"), r.get("status"), "latency_ms", r.get("latency_ms"), "seq/s",
          r.get("throughput_per_s"), "peak_mem_mb", r.get("peak_mem_mb"), "sm", r.get("sm_clock_mhz"))
PY
}
if [ "$PART" = order ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r10-order
  timeout 200 python3 -m transbench tune --model bert-base-uncased --batch 1,8 --seq 128 --dtype fp16 | tail -3
  for i in 1 2 3; do
    for order in 8 1,8; do
      timeout 100 python3 benchmarks/order_latency.py --order $order --label "order=$order run=$i" 2>&1 \
        | grep -E "cell|Error"
    done
  done
  timeout 150 python3 benchmarks/order_latency.py --order 8,1,8,8 --label "order=8,1,8,8" 2>&1 | grep -E "cell|Error"
  for b in 8 1,8; do
    timeout 100 python3 -m transbench run --model bert-base-uncased --backend fused --dtype fp16 --batch $b \
      --seq 128 --encoders-only --min-time 1 --timeout 90 --name "run $b" --db $OUT/order.db \
      --json $OUT/order_$b.json > $OUT/order_$b.txt 2>&1
    summary $OUT/order_$b.json "run --batch $b:"
  done
fi
if [ "$PART" = order2 ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r10-order
  timeout 200 python3 -m transbench tune --model bert-base-uncased --batch 1,8 --seq 128 --dtype fp16 | tail -1
  for i in 1 2; do for order in 8 8,8 1,8; do
    timeout 100 python3 benchmarks/order_latency.py --order $order --label "order=$order run=$i" 2>&1 | grep -E "cell|Error"
  done; done
  for order in 8 1,8; do
    timeout 100 python3 benchmarks/order_latency.py --order $order --freeze --label "order=$order freeze" 2>&1 \
      | grep -E "cell|Error"
  done
fi
if [ "$PART" = order3 ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r10-order
  timeout 200 python3 -m transbench tune --model bert-base-uncased --batch 1,8 --seq 128 --dtype fp16 | tail -1
  for order in 8 8,8; do
    timeout 150 python3 benchmarks/order_latency.py --order $order --profile --label "order=$order" > $OUT/order3_${order/,/-}.txt 2>&1
    grep -E "ok median|Error|crc" $OUT/order3_${order/,/-}.txt | cut -c1-260
  done
fi
if [ "$PART" = order4 ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r10-order
  timeout 200 python3 -m transbench tune --model bert-base-uncased --batch 1,8 --seq 128 --dtype fp16 | tail -1
  timeout 150 python3 benchmarks/order_latency.py --order 8,8 --no-pdl --label "no-pdl 8,8" 2>&1 | grep -E "cell|Error" \
    | cut -c1-300
  timeout 150 python3 benchmarks/order_latency.py --order 8,8,8 --keep-graphs --label "kept 8,8,8" 2>&1 \
    | grep -E "ok median|graph|Error" | cut -c1-400
fi
if [ "$PART" = pdl ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r10-order
  timeout 200 python3 -m transbench tune --model bert-base-uncased --batch 1,8 --seq 128 --dtype fp16 | tail -1
  for args in ${PDL_ARGS:-""}; do
    echo "pdl_state.py ${args//_/ }"
    PYTHONPATH=src:benchmarks timeout 200 python3 benchmarks/pdl_state.py ${args//_/ } 2>&1 | grep -E "graph|Error"
  done
fi
if [ "$PART" = verify ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r10-order
  timeout 200 python3 -m transbench tune --model bert-base-uncased --batch 1,8 --seq 128 --dtype fp16 | tail -1
  for order in 8,8 1,8; do
    timeout 100 python3 benchmarks/order_latency.py --order $order --label "fix order=$order" 2>&1 | grep -E "cell|Error" \
      | cut -c1-250
  done
  for args in "" --own-stream; do
    echo "pdl_state.py $args"
    PYTHONPATH=src:benchmarks timeout 100 python3 benchmarks/pdl_state.py $args 2>&1 | grep -E "graph|Error"
  done
  TRANSBENCH_CACHE_DIR=/tmp/r10-tuning timeout 150 python3 benchmarks/order_latency.py --order 1,8 \
    --label "fix tuning order=1,8" 2>&1 | grep -E "cell|Error" | cut -c1-250
  TRANSBENCH_CACHE_DIR=/tmp/r10-tests timeout ${TESTS_S:-150} python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    tests/gpu/test_engine_kernels.py -k "graphs or capture or tune or settled" > $OUT/verify_tests.txt 2>&1
  echo "pytest rc $?"; tail -5 $OUT/verify_tests.txt
fi
if [ "$PART" = backends ]; then
  [ -f r10old.tgz ] && mkdir -p /tmp/old && tar -xzf r10old.tgz -C /tmp/old
  export TRANSBENCH_CACHE_DIR=/tmp/r10-order
  timeout 200 python3 -m transbench tune --model bert-base-uncased --batch 8 --seq 128 --dtype fp16 | tail -1
  for run in old:cudagraph,fused new:cudagraph,fused new:fused new:sdpa,cudagraph,fused; do
    code=${run%%:*}; b=${run#*:}; src=src; [ $code = old ] && src=/tmp/old/src; name="$code-${b//,/-}"
    PYTHONPATH=$src timeout 150 python3 -m transbench run --model bert-base-uncased --backend $b --dtype fp16 \
      --batch 8 --seq 128 --encoders-only --min-time 1 --timeout 120 --name "$name" --db $OUT/backends.db \
      --json $OUT/backends_$name.json > $OUT/backends_$name.txt 2>&1
    summary $OUT/backends_$name.json "$code $b:"
  done
fi
if [ "$PART" = mem ]; then
  [ -f r10old.tgz ] && mkdir -p /tmp/old && tar -xzf r10old.tgz -C /tmp/old
  for i in ${RUNS:-1 2}; do for code in ${CODES:-old new}; do
    src=src; [ $code = old ] && src=/tmp/old/src
    PYTHONPATH=$src TRANSBENCH_CACHE_DIR=/tmp/r10-mem-$code-$i timeout 170 python3 -m transbench run \
      --model bert-base-uncased --backend fused --dtype fp8 --batch 256 --seq 128 --encoders-only --min-time 0.3 \
      --timeout 160 --name "mem $code $i" --db $OUT/mem.db --json $OUT/mem_$code-$i.json > $OUT/mem_$code-$i.txt 2>&1
    summary $OUT/mem_$code-$i.json "$code $i:"
  done; done
fi
