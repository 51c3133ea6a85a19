#!/usr/bin/env bash
# Issue 21's GPU evidence, two device calls of about 9 minutes on an H100; every step is time-boxed and
# writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_one_path.sh memory   1. memory per cell: a gpt2 grid of fused, compile, cudagraph
#                                               and sdpa, then each sdpa cell alone
#   bash benchmarks/gpu_one_path.sh timing   2. the sampler against a plain CUDA-event loop in the same
#                                               process (bert-base sdpa and fused)
#                                            3. micro gemm with its clock and power, and against a plain loop
#                                            4. energy per sequence, bert-base sdpa vs fused at 256 x 128
#                                            5. compare: two identical runs back to back
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 COLUMNS=160
TB="python3 -m transbench"
STAGE=${1:-memory}
exec > >(tee "$OUT/one_path_$STAGE.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu,driver_version --format=csv
if [ "$STAGE" = memory ]; then
timeout 470 $TB run --model gpt2 --task causal-lm --backend fused,compile,cudagraph,sdpa --dtype fp16,bf16 \
  --batch 1,8 --seq 128 --min-time 0.3 --timeout 150 --name mixed --db $OUT/mem.db
for d in fp16 bf16; do for b in 1 8; do
  timeout 40 $TB run --model gpt2 --task causal-lm --backend sdpa --dtype $d --batch $b --seq 128 --min-time 0.3 \
    --name alone-$d-$b --db $OUT/mem.db > /dev/null
done; done
python3 - "$OUT/mem.db" <<'PY'
import sys
from transbench.store import Store, export
s = Store(sys.argv[1]); recs = export.records(s); s.close()
alone = {(r["dtype"], r["batch_size"]): r for r in recs if r["run_name"].startswith("alone")}
print(f"{'cell':<28} {'peak_mem_mb':>11} {'mem_before_mb':>13} {'alone peak':>10} {'alone before':>12} {'diff':>7}")
for r in recs:
    if r["run_name"] != "mixed":
        continue
    a = alone.get((r["dtype"], r["batch_size"])) if r["backend"] == "sdpa" else None
    peak, before = r.get("peak_mem_mb"), r.get("mem_before_mb")
    line = f"{r['backend']} {r['dtype']} b{r['batch_size']} {r['status']:<8} {peak or 0:>11.1f} {before or 0:>13.2f}"
    if a and peak and a.get("peak_mem_mb"):
        line += f" {a['peak_mem_mb']:>10.1f} {a.get('mem_before_mb') or 0:>12.2f} {peak / a['peak_mem_mb'] - 1:>7.1%}"
    print(line)
PY
exit 0
fi
timeout 150 python3 benchmarks/plain_loop_check.py --model bert-base-uncased --backend sdpa,fused --point 64x512 --point 8x384
timeout 60 python3 benchmarks/gemm_vs_plain.py --sizes 4096,8192 --dtype fp16,bf16
timeout 40 $TB micro gemm --sizes 4096,8192 --dtype fp16,bf16 --model '' --db $OUT/micro.db --name gemm
timeout 120 $TB run --model bert-base-uncased --backend sdpa,fused --dtype fp16 --batch 256 --seq 128 --min-time 1 \
  --timeout 100 --name energy --db $OUT/mem.db --json $OUT/energy.json
python3 - "$OUT/energy.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["backend"], r["status"], "ms", r.get("latency_ms"), "seq/s", r.get("throughput_per_s"), "J/seq",
          r.get("j_per_seq"), "W", r.get("avg_power_w"), "MHz", r.get("sm_clock_mhz"), r.get("error") or "")
PY
for r in a b; do
  timeout 60 $TB run --model bert-base-uncased --backend sdpa,cudagraph --dtype fp16 --batch 1,8 --seq 128 \
    --min-time 1 --name back-$r --db $OUT/cmp.db > /dev/null
done
timeout 30 $TB compare back-a back-b --db $OUT/cmp.db; echo "compare exit=$?"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cli_gpus.py -m gpu 2>&1 | tail -3
