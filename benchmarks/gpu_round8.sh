#!/usr/bin/env bash
# Session 17's GPU calls, one part per device call (each under 10 minutes on an H100); every step is time-boxed
# and writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round8.sh base    issue 23: the GPU tests of a LayerNorm that writes no fp16 output before
#                                         an fp8 GEMM (ops.Normed), then bert-base 256 x 128 fp8 tuned and timed
#                                         twice with the code before it (r8old.tgz: `git archive` of the commit
#                                         before, unpacked to /tmp/old) and with this code
#   bash benchmarks/gpu_round8.sh table   bert-base 256 x 128 fp8 with one route table for both codes (r8tables/old:
#                                         call base's tuning of the code before; r8tables/t2: the same with the MLP's
#                                         second GEMM on our fp8 GEMM, which adds the residual in its epilogue)
#   bash benchmarks/gpu_round8.sh ln      the LayerNorm kernel per rows-per-program and warps, with and without a
#                                         Normed residual (benchmarks/engine_bench.py --parts layernorm)
#     base, table and ln ran commit a843418 (ops.Normed), reverted after them; to repeat them, check it out and
#     `git archive 0933034 src | gzip > r8old.tgz`.
#   bash benchmarks/gpu_round8.sh large8  issue 23: bert-large 128 x 384 fp8 tuned and timed twice, then the
#                                         generation GPU tests of the transformers backends
#   bash benchmarks/gpu_round8.sh order   a cell's figure against the cells before it: bert-base fp16 1 x 128 as a
#                                         process's first cell, then after a 1 x 64 cell, each in a fresh process
#                                         with empty route and Triton caches; the code before (r8old.tgz: `git
#                                         archive` of the commit before fused cells tuned fully), then this code
#   bash benchmarks/gpu_round8.sh final   run cells that now tune fully, with empty route and Triton caches: gpt2
#                                         generation (batch 1, prompt 512, 128 new tokens) and bert-base 256 x 128
#                                         fp8 with no `transbench tune` before it
#   bash benchmarks/gpu_round8.sh leak    what a fully tuned first call leaves allocated: bert-base 256 x 128 fp8
#                                         encoders, tuned with no budget, then after release(), gc.collect(), the
#                                         peak restart and a second capture (what scenarios/inference.settle does),
#                                         then the same in a new process with the routes on disk
#   bash benchmarks/gpu_round8.sh grid    the fp16 grids of the fused engine against the other backends
#                                         (benchmarks/fused_table.sh, PARTS=large or base), resumed from r8state/
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=150 TRITON_CACHE_DIR=/tmp/r8-triton
PART=${1:-base}
exec > >(tee "$OUT/round8_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
[ -f r8old.tgz ] && mkdir -p /tmp/old && tar -xzf r8old.tgz -C /tmp/old
[ -d r8state ] && cp -r r8state/. "$OUT"/  # a resumed part's store and tuned routes, from the call before
ab() {  # code (old|new) model batch seq: tune with that code into its own cache, then time the cell twice
  local src=src; [ "$1" = old ] && src=/tmp/old/src
  export PYTHONPATH=$src TRANSBENCH_CACHE_DIR=$OUT/tuning-$1
  timeout ${TUNE_S:-200} python3 -m transbench tune --model $2 --batch $3 --seq $4 --dtype fp8 | grep -E "race|│"
  for i in 1 2; do
    timeout 60 python3 -m transbench run --model $2 --backend fused --dtype fp8 --batch $3 --seq $4 --encoders-only \
      --min-time 0.3 --timeout 55 --name "$1 $2 $i" --db $OUT/r8.db --wide | grep -E "│ inference" | cut -c1-150
  done
}
if [ "$PART" = base ]; then
  PYTHONPATH=src TRANSBENCH_CACHE_DIR=/tmp/r8t timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf \
    --durations=3 tests/gpu/test_engine_fp8_gpu.py tests/gpu/test_engine_kernels.py -k "layernorm_writes or \
    fp8_bert_against or every_linear_add_layernorm or add_layernorm_kernel" > $OUT/tests.txt 2>&1
  echo "pytest rc $?"; tail -8 $OUT/tests.txt
  ab old bert-base-uncased 256 128
  ab new bert-base-uncased 256 128
fi
if [ "$PART" = large8 ]; then
  ab new bert-large-uncased 128 384
  PYTHONPATH=src timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_backends_gpu.py \
    tests/gpu/test_families_gpu.py -k "generation or static_decoders or decoder_families" --durations=3 > $OUT/gen.txt 2>&1
  echo "pytest rc $?"; tail -6 $OUT/gen.txt
fi
if [ "$PART" = grid ]; then
  mkdir -p $OUT/grid
  timeout ${GRID_S:-570} bash benchmarks/fused_table.sh $OUT/grid/fused.db ${PARTS:-large} > $OUT/grid_${PARTS:-large}.txt 2>&1
  echo "grid rc $?"; grep -cE "│ inference" $OUT/grid_${PARTS:-large}.txt
fi
if [ "$PART" = table ]; then  # one route table, both codes: what the code changes at the same routes
  run_with() {  # code table label
    local src=src; [ "$1" = old ] && src=/tmp/old/src
    rm -rf /tmp/tab && cp -r r8tables/$2 /tmp/tab
    PYTHONPATH=$src TRANSBENCH_CACHE_DIR=/tmp/tab timeout 90 python3 -m transbench run --model bert-base-uncased \
      --backend fused --dtype fp8 --batch 256 --seq 128 --encoders-only --min-time 0.3 --timeout 80 \
      --name "$1 $2 $3" --db $OUT/r8.db --wide | grep -E "│ inference" | cut -c1-150
  }
  run_with new old 1; run_with old old 1; run_with new t2 1; run_with old t2 1; run_with new t2 2; run_with new old 2
  PYTHONPATH=src TRANSBENCH_CACHE_DIR=$OUT/tuning-new2 timeout 200 python3 -m transbench tune \
    --model bert-base-uncased --batch 256 --seq 128 --dtype fp8 > $OUT/tune_new2.txt 2>&1; tail -3 $OUT/tune_new2.txt
fi
if [ "$PART" = ln ]; then  # the LayerNorm kernel's layouts and what a Normed residual costs its readers
  PYTHONPATH=src timeout 300 python3 benchmarks/engine_bench.py --parts layernorm 2>&1 | sed -n '/## layernorm/,$p'
fi
if [ "$PART" = order ]; then
  for code in old new; do
    src=src; [ $code = old ] && src=/tmp/old/src
    for seqs in 128 64,128; do
      PYTHONPATH=$src TRANSBENCH_CACHE_DIR=/tmp/o-$code-$seqs TRITON_CACHE_DIR=/tmp/ot-$code-$seqs timeout 240 \
        python3 -m transbench run --model bert-base-uncased --backend fused --dtype fp16 --encoders-only --batch 1 \
        --seq $seqs --min-time 0.3 --timeout 200 --name "$code first-of $seqs" --db $OUT/order.db --wide \
        | grep -E "│ inference" | cut -c1-150
    done
  done
fi
if [ "$PART" = final ]; then
  export PYTHONPATH=src TRANSBENCH_CACHE_DIR=/tmp/f-routes
  timeout 280 python3 -m transbench run --model gpt2 --task generate --backend fused --dtype fp16 --batch 1 --seq 512 \
    --new-tokens 128 --min-time 0.3 --timeout 260 --name final-generate --db $OUT/final.db --wide \
    | grep -E "│ generat" | cut -c1-150
  timeout 280 python3 -m transbench run --model bert-base-uncased --backend fused --dtype fp8 --batch 256 --seq 128 \
    --encoders-only --min-time 0.3 --timeout 260 --name final-fp8 --db $OUT/final.db --wide | grep -E "│ inference" \
    | cut -c1-150
fi
if [ "$PART" = leak ]; then
  cat > /tmp/leak.py <<'PY'
import gc, sys, torch
from collections import Counter
from transformers import BertConfig, BertModel
from transbench.engine import compile_model
torch.manual_seed(0)
m = BertModel(BertConfig(), add_pooling_layer=False).eval().half().cuda()
c = compile_model(m, dtype="fp8", tune_budget_s=None)
x = torch.randn(256, 128, 768, device="cuda", dtype=torch.float16)
mib = lambda: round(torch.cuda.memory_allocated() / 2**20, 1)
print(sys.argv[1], "after compile", mib(), flush=True)
with torch.inference_mode():
    c.encode(x); torch.cuda.synchronize()
    print(sys.argv[1], "after first call", mib(), flush=True)
    c.release(); print(sys.argv[1], "after release", mib(), flush=True)
    gc.collect(); torch.cuda.synchronize(); print(sys.argv[1], "after gc.collect", mib(), flush=True)
    from transbench.measure import memory
    memory.restart_peak(torch.device("cuda"))  # what scenarios/inference.settle does, then the second capture
    out = c.encode(x); torch.cuda.synchronize()
    peak = lambda: round(torch.cuda.max_memory_allocated() / 2**20, 1)
    print(sys.argv[1], "peak of the second capture", peak(), "allocated", mib(), flush=True)
    for _ in range(5):
        c.encode(x)
    torch.cuda.synchronize(); print(sys.argv[1], "peak after replays", peak(), flush=True)
    for k, v in c.tuning().items():
        print(sys.argv[1], k, sorted(v["routes"].items()), flush=True)
    live = Counter()
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and o.is_cuda:
                live[(tuple(o.shape), str(o.dtype))] += 1
        except Exception:
            pass
    big = sorted(((n * torch.Size(s).numel() * torch.empty(0, dtype=getattr(torch, d.split(".")[1])).element_size() / 2**20, s, d, n)
                  for (s, d), n in live.items()), reverse=True)[:8]
    for mb, s, d, n in big:
        print(sys.argv[1], f"  live {mb:.1f} MiB: {n} x {s} {d}", flush=True)
PY
  export PYTHONPATH=src TRANSBENCH_CACHE_DIR=/tmp/leak-routes
  timeout 200 python3 /tmp/leak.py tuning 2>&1 | grep -E "^tuning" | cut -c1-2500
  timeout 100 python3 /tmp/leak.py on-disk 2>&1 | grep -E "^on-disk" | cut -c1-2500
fi
