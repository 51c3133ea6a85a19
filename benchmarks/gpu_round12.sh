#!/usr/bin/env bash
# Session 21's GPU calls, one part per device call (each under 10 minutes on an H100); every step is time-boxed and
# writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round12.sh tests  the host-bound GPU test three times (session 20 saw it fail once on a cold
#                                         machine; its GPU-bound cell is now bert-base 256 x 512), then the GPU tests
#                                         of the backends, the families, --gpus and serving
#   bash benchmarks/gpu_round12.sh paths  what session 21 changed, on the GPU: click's errors as one line with the
#                                         image's typer; serve --task generate with prompts that fill the positions
#                                         but the new tokens (the correctness gate's bucket); a bf16 checkpoint
#                                         folder checked against an fp32 reference; onnxruntime --encoders-only on
#                                         BERT with the embedding output as a graph input (CPU provider); then the
#                                         sampler against a plain CUDA-event loop at points no issue names
#   bash benchmarks/gpu_round12.sh gate   serve --task generate on the fused backend with prompts of 1,000 tokens, after
#                                         warming only the buckets its lengths reach (it timed out at 180 s preparing
#                                         every bucket in `paths`), then the plain-loop check `paths` ran out of time for
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=150 TRITON_CACHE_DIR=/tmp/r12-triton PYTHONPATH=src
PART=${1:-tests}
exec > >(tee "$OUT/round12_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
summary() { python3 benchmarks/print_records.py "$@"; }  # json label
if [ "$PART" = tests ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r12-tests
  for i in 1 2 3; do
    timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_backends_gpu.py \
      -k "host_bound or what_ran" > $OUT/host_bound_$i.txt 2>&1
    echo "host-bound round $i rc $?"; grep -E "passed|failed|^FAILED|AssertionError" $OUT/host_bound_$i.txt | cut -c1-300
  done
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_backends_gpu.py \
    tests/gpu/test_families_gpu.py tests/gpu/test_cli_gpus.py tests/gpu/test_serve_gpu.py > $OUT/tests.txt 2>&1
  echo "pytest rc $?"; tail -8 $OUT/tests.txt
fi
if [ "$PART" = paths ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r12-paths
  for args in "run --min-time 0.1s" "models extra" "run --batch 1,,8"; do
    python3 -m transbench $args > $OUT/cli.txt 2>&1; echo "transbench $args: rc $? $(wc -l < $OUT/cli.txt) line(s)"
    cut -c1-200 $OUT/cli.txt
  done
  for b in sdpa fused; do
    timeout 200 python3 -m transbench serve --model gpt2 --task generate --backend $b --dtype fp16 \
      --lengths fixed:1000 --new-tokens 24 --concurrency 2 --max-batch-size 2 --duration 2 --warmup 1 --timeout 180 \
      --name "gate-$b" --db $OUT/serve.db --json $OUT/serve_$b.json > $OUT/serve_$b.txt 2>&1
    echo "serve generate $b rc $?"; tail -4 $OUT/serve_$b.txt | cut -c1-200
    python3 -c "import json,sys; r=json.load(open(sys.argv[1]))[0]; print({k: r.get(k) for k in ('status','rel_err',
      'ttft_p50_ms','itl_p50_ms','latency_p99_ms','achieved_rate','error')})" $OUT/serve_$b.json
  done
  python3 -c "
from transbench.models import build
import torch
build.build_model(build.resolve('bert-base-uncased'), 'base').to(torch.bfloat16).save_pretrained('/tmp/r12-bf16')"
  timeout 200 python3 -m transbench run --model /tmp/r12-bf16 --backend sdpa,fused --dtype fp32,fp16 --batch 8 \
    --seq 128 --min-time 1 --timeout 150 --db $OUT/bf16.db --json $OUT/bf16.json > $OUT/bf16.txt 2>&1
  echo "bf16 folder rc $?"; summary $OUT/bf16.json "bf16 checkpoint folder:"
  for flag in --encoders-only ""; do
    timeout 200 python3 -m transbench run --model bert-base-uncased --backend sdpa,onnxruntime --device cpu \
      --dtype fp32 --batch 2 --seq 64 $flag --min-time 1 --timeout 150 --db $OUT/ort.db \
      --json $OUT/ort$flag.json > $OUT/ort$flag.txt 2>&1
    echo "onnxruntime cpu ${flag:-with embeddings} rc $?"; summary $OUT/ort$flag.json "onnxruntime cpu ${flag:-embeddings}:"
  done
  timeout 240 python3 benchmarks/plain_loop_check.py --model bert-large-uncased --backend sdpa,cudagraph,fused \
    --point 12x160 --point 3x448 --dtype fp16 2>&1 | grep -vE "^\s*$" | tail -10
fi
if [ "$PART" = gate ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r12-gate
  for b in fused sdpa; do
    timeout 300 python3 -m transbench serve --model gpt2 --task generate --backend $b --dtype fp16 \
      --lengths fixed:1000 --new-tokens 24 --concurrency 2 --max-batch-size 2 --duration 2 --warmup 1 --timeout 280 \
      --name "gate-$b" --db $OUT/gate.db --json $OUT/gate_$b.json > $OUT/gate_$b.txt 2>&1
    echo "serve generate $b rc $?"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1]))[0]; print({k: r.get(k) for k in ('status','rel_err',
      'ttft_p50_ms','itl_p50_ms','latency_p99_ms','achieved_rate','error')})" $OUT/gate_$b.json
  done
  PYTHONPATH=src python3 -c "
import sqlite3, json
con = sqlite3.connect('$OUT/gate.db')
for (info,) in con.execute('SELECT info FROM cells'):
    i = json.loads(info); print('prepare_s', i.get('prepare_s'), 'buckets', i.get('shape_buckets'))" 2>&1 | tail -4
  timeout 240 python3 benchmarks/plain_loop_check.py --model bert-large-uncased --backend sdpa,cudagraph,fused \
    --point 12x160 --point 3x448 --dtype fp16 2>&1 | grep -vE "^\s*$" | tail -10
fi
