#!/usr/bin/env bash
# Session 18's GPU calls, one part per device call (each under 10 minutes on an H100); every step is time-boxed
# and writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round9.sh mem     issue 23's open memory observation: where a bert-base 256 x 128 fp8 cell's
#                                         peak goes when it tunes in the cell, then with its routes on disk
#                                         (benchmarks/cell_memory.py); then bert-base fp16 8 x 128's peak after a
#                                         1 x 128 cell in one `run`, alone with its routes on disk, and alone tuning
#   bash benchmarks/gpu_round9.sh large   issue 23: bert-large 128 x 384 fp8 tuned, then timed for 2 s a cell with the
#                                         tuned routes and with the attention output projection forced onto the fp8
#                                         route (`fp8+ln`: quantize pass, torch._scaled_mm), alternating; then
#                                         session 17's call 8 again: bert-base 256 x 128 fp8 tuned in the cell
#   bash benchmarks/gpu_round9.sh mem2    session 17's 1,441.3 MiB cell: bert-base 256 x 128 fp8 tuned in the cell, then
#                                         with its routes but the last FC2 on the route that cell had
#                                         (fp8+triton+ln128x128x128x4x8xTruexFalse), both through cell_memory.py;
#                                         then the sampler against a plain CUDA-event loop for fp8 at two points
#   bash benchmarks/gpu_round9.sh races   issue 23: bert-large 128 x 384 and bert-base 256 x 128 fp8 tuned with a
#                                         whole-forward race budget of RACE_S seconds (default 60; the engine's is
#                                         engine/tuning.py RACE_BUDGET_S), then timed twice for 2 s
#   bash benchmarks/gpu_round9.sh order   a whole-forward race of one captured forward against itself: does the one
#                                         timed first in each round win? (benchmarks/race_order.py)
#   bash benchmarks/gpu_round9.sh garbage what a tuning first call leaves to the garbage collector: bert-base 256 x 128
#                                         fp8 tuned in the cell (benchmarks/cell_memory.py)
#     mem, mem2 and garbage ran cell_memory.py as of 9ac91bb, whose wrapper collected garbage before settle
#   bash benchmarks/gpu_round9.sh racemem memory held after a first call that tuned, with empty route tables
#                                         (benchmarks/first_call_memory.py), RUNS times (default 1 2 3) for each of
#                                         CODES (default "old new"; old: r9old.tgz, a `git archive` of the commit
#                                         before the collection after tuning in engine/graphs.py, unpacked to /tmp/old)
#   bash benchmarks/gpu_round9.sh tests   the engine's GPU tests (test_engine_kernels.py, test_engine_fp8_gpu.py)
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=150 TRITON_CACHE_DIR=/tmp/r9-triton PYTHONPATH=src
PART=${1:-mem}
exec > >(tee "$OUT/round9_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
if [ "$PART" = mem ]; then
  for label in tuned on-disk; do
    TRANSBENCH_CACHE_DIR=/tmp/r9-mem timeout 200 python3 benchmarks/cell_memory.py --label $label 2>&1 \
      | grep -E "^$label" | cut -c1-1500
  done
  run8() {  # label cache batches
    TRANSBENCH_CACHE_DIR=$2 timeout 200 python3 -m transbench run --model bert-base-uncased --backend fused \
      --dtype fp16 --batch $3 --seq 128 --encoders-only --min-time 0.3 --timeout 150 --name "$1" --db $OUT/mem.db \
      --json $OUT/mem_$1.json > $OUT/mem_$1.txt 2>&1
    python3 - "$OUT/mem_$1.json" "$1" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(sys.argv[2], r.get("batch_size"), r.get("status"), "latency_ms", r.get("latency_ms"), "peak_mem_mb", r.get("peak_mem_mb"))
PY
  }
  run8 sweep /tmp/r9-fp16 1,8
  run8 alone-on-disk /tmp/r9-fp16 8
  run8 alone-tuning /tmp/r9-fp16b 8
fi
if [ "$PART" = large ]; then
  T=/tmp/r9-large; mkdir -p $T
  TRANSBENCH_CACHE_DIR=$T timeout 260 python3 -m transbench tune --model bert-large-uncased --batch 128 --seq 384 \
    --dtype fp8 | grep -E "race|seq 384"
  cp -r $T $OUT/tuning-large
  python3 - $T <<'PY'  # a copy of the table with the output projection's fp16-input key on fp8+ln
import json, shutil, sys
from pathlib import Path
src = Path(sys.argv[1]) / "engine-tuning.json"
table = json.loads(src.read_text())
for k, v in sorted(table.items()):
    if "49152" in k:
        print("tuned", k.split("|", 2)[2].rsplit("|", 1)[0], "->", v)
forced = {k: ("fp8+ln" if "linear_add_ln|store=False|quant|49152x1024x1024|torch.float16|" in k else v) for k, v in table.items()}
dst = Path(sys.argv[1] + "-outfp8"); dst.mkdir(exist_ok=True)
(dst / "engine-tuning.json").write_text(json.dumps(forced))
print("forced", sum(forced[k] != table[k] for k in table), "entries")
PY
  for i in 1 2; do
    for v in "" -outfp8; do
      TRANSBENCH_CACHE_DIR=$T$v timeout 100 python3 -m transbench run --model bert-large-uncased --backend fused \
        --dtype fp8 --batch 128 --seq 384 --encoders-only --min-time 2 --timeout 90 --name "large$v $i" \
        --db $OUT/large.db --json $OUT/large$v-$i.json > $OUT/large$v-$i.txt 2>&1
      python3 - $OUT/large$v-$i.json "large$v $i" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(sys.argv[2], r.get("status"), "seq/s", r.get("throughput_per_s"), "ms", r.get("latency_ms"), "iqr",
          r.get("latency_iqr_ms"), "sm", r.get("sm_clock_min_mhz"), r.get("sm_clock_mhz"), "W", r.get("avg_power_w"),
          "J", r.get("energy_j"), "rel_err", r.get("rel_err"), "peak", r.get("peak_mem_mb"))
PY
    done
  done
  TRANSBENCH_CACHE_DIR=/tmp/r9-call8 TRITON_CACHE_DIR=/tmp/r9-call8t timeout 200 python3 -m transbench run \
    --model bert-base-uncased --backend fused --dtype fp8 --batch 256 --seq 128 --encoders-only --min-time 0.3 \
    --timeout 190 --name call8 --db $OUT/large.db --json $OUT/call8.json > $OUT/call8.txt 2>&1
  python3 -c "import json,sys; [print('call8', r['status'], r.get('throughput_per_s'), 'peak', r.get('peak_mem_mb')) for r in json.load(open('$OUT/call8.json'))]"
fi
if [ "$PART" = mem2 ]; then
  T=/tmp/r9-m2
  TRANSBENCH_CACHE_DIR=$T timeout 200 python3 benchmarks/cell_memory.py --label tuned 2>&1 | grep -E "^tuned" | cut -c1-1500
  python3 - $T <<'PY'
import json, sys
from pathlib import Path
p = Path(sys.argv[1]) / "engine-tuning.json"
t = json.loads(p.read_text())
key = "|linear_add_ln|store=False|32768x768x3072|torch.float16|fp8 input|"
hits = [k for k in t if key in k]
for k in hits:
    print("last FC2", t[k], "-> fp8+triton+ln128x128x128x4x8xTruexFalse")
    t[k] = "fp8+triton+ln128x128x128x4x8xTruexFalse"
Path(sys.argv[1] + "-fc2").mkdir(exist_ok=True)
(Path(sys.argv[1] + "-fc2") / "engine-tuning.json").write_text(json.dumps(t))
PY
  TRANSBENCH_CACHE_DIR=$T-fc2 timeout 120 python3 benchmarks/cell_memory.py --label fc2 2>&1 | grep -E "^fc2" | cut -c1-1500
  TRANSBENCH_CACHE_DIR=/tmp/r9-plain timeout 300 python3 benchmarks/plain_loop_check.py --model bert-base-uncased \
    --backend fused --dtype fp8 --point 64x256 --point 16x384 2>&1 | tail -8
fi
if [ "$PART" = races ]; then
  for shape in "bert-large-uncased 128 384" "bert-base-uncased 256 128"; do
    set -- $shape; T=/tmp/r9-races-$1
    TRANSBENCH_CACHE_DIR=$T timeout 280 python3 -c "import sys; from transbench import api; \
from transbench.engine import EngineOptions; o = EngineOptions(race_budget_s=float(sys.argv[1])); \
[print(r) for r in api.tune(sys.argv[2], [int(sys.argv[3])], [int(sys.argv[4])], 'fp8', options=o)]" \
      ${RACE_S:-60} $1 $2 $3 | grep -E "race|seq" | cut -c1-400
    for i in 1 2; do
      TRANSBENCH_CACHE_DIR=$T timeout 100 python3 -m transbench run --model $1 --backend fused --dtype fp8 --batch $2 \
        --seq $3 --encoders-only --min-time 2 --timeout 90 --name "races $1 $i" --db $OUT/races.db \
        --json $OUT/races-$1-$i.json > $OUT/races-$1-$i.txt 2>&1
      python3 -c "import json; [print('$1 $i', r['status'], 'seq/s', r.get('throughput_per_s'), 'ms', r.get('latency_ms'), 'sm', r.get('sm_clock_mhz'), 'W', r.get('avg_power_w'), 'J', r.get('energy_j')) for r in json.load(open('$OUT/races-$1-$i.json'))]"
    done
  done
fi
if [ "$PART" = order ]; then
  TRANSBENCH_CACHE_DIR=/tmp/r9-order timeout 280 python3 benchmarks/race_order.py --model bert-large-uncased \
    --batch 128 --seq 384 2>&1 | grep -E "trial/best|Error"
  TRANSBENCH_CACHE_DIR=/tmp/r9-order timeout 200 python3 benchmarks/race_order.py --model bert-base-uncased \
    --batch 256 --seq 128 2>&1 | grep -E "trial/best|Error"
fi
if [ "$PART" = garbage ]; then
  TRANSBENCH_CACHE_DIR=/tmp/r9-g timeout 200 python3 benchmarks/cell_memory.py --label tuned 2>&1 | grep -E "^tuned|Error" \
    | grep -v routes | cut -c1-600
fi
if [ "$PART" = racemem ]; then
  [ -f r9old.tgz ] && mkdir -p /tmp/old && tar -xzf r9old.tgz -C /tmp/old
  for i in ${RUNS:-1 2 3}; do for code in ${CODES:-old new}; do
    src=src; [ $code = old ] && src=/tmp/old/src
    PYTHONPATH=$src TRANSBENCH_CACHE_DIR=/tmp/r9-rm-$code-$i timeout 150 python3 benchmarks/first_call_memory.py $code-$i 2>&1 \
      | grep -E "^$code|Error"
  done; done
fi
if [ "$PART" = tests ]; then  # the engine's GPU tests on this code
  TRANSBENCH_CACHE_DIR=/tmp/r9-tests timeout ${TESTS_S:-330} python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    --durations=5 tests/gpu/test_engine_kernels.py tests/gpu/test_engine_fp8_gpu.py > $OUT/tests.txt 2>&1
  echo "pytest rc $?"; tail -12 $OUT/tests.txt
fi
