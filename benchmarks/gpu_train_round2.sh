#!/usr/bin/env bash
# Issue 25 on one H100: DeepSpeed ZeRO-1/2/3 (its FusedAdam) next to plain training, and the seed
# notebook's ladder (`train --ladder`) for bert-large-uncased and gpt2, printing compact tables.
# Needs the wheels of benchmarks/wheels.sh in .whl/ (carried to the GPU machine).
#   bash benchmarks/gpu_train_round2.sh [all|deepspeed|ladder]      (outputs under ${OUT:-/tmp/out})
# Sizing (estimated, not yet timed): each cell is its own process (~5 s to start and build bert-large,
# ~15 s for gpt2-large), DeepSpeed compiles FusedAdam once (~1 min, ninja), each torch.compile cell ~40-60 s.
#   deepspeed: 2 models x 4 cells (none, ZeRO 1, 2, 3), 5 timed steps           ~4 min
#   ladder:    bert-large (start batch 64, search capped at 256: ~8 probes) and gpt2 seq 1024 (start 8,
#              cap 64: ~10 probes), 5 timed steps, 2 compile cells each             ~4-5 min
# so `all` is ~8-9 min: where one call has 10 minutes, run `deepspeed` and `ladder` as two calls.
set -u
PART=${1:-all}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
DB="$OUT/train_round2.db"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv,noheader
python3 -c "import deepspeed, liger_kernel; print('deepspeed', deepspeed.__version__)"

table() {  # the cells of JSON files as one compact table
python3 - "$@" <<'PY'
import json, sys
cols = [("model", "model", "s"), ("strategy", "strategy", "s"), ("zero_stage", "ZeRO", "s"), ("optim", "optim", "s"),
        ("batch_size", "batch", "s"), ("status", "status", "s"), ("samples_per_s", "samples/s", ".1f"),
        ("mfu", "MFU", ".1%"), ("forward_ms", "fwd", ".1f"), ("backward_ms", "bwd", ".1f"), ("optimizer_ms", "opt", ".1f"),
        ("peak_mem_mb", "peak", ".0f"), ("params_mb", "params", ".0f"), ("grads_mb", "grads", ".0f"),
        ("optim_state_mb", "optim", ".0f"), ("activations_mb", "activ", ".0f"), ("j_per_seq", "J/seq", ".3f")]
print(" ".join(f"{h:>10}" for _, h, _ in cols))
for path in sys.argv[1:]:
    for r in json.load(open(path)):
        ok = r["status"] == "ok"
        cells = []
        for k, _, f in cols:
            v = r.get(k)
            cells.append("-" if v is None or (not ok and f != "s") else (format(v, f) if f != "s" else str(v)[:18]))
        print(" ".join(f"{c:>10}" for c in cells))
        if not ok:
            print("   ", (r.get("error") or "")[:300])
PY
}

# DeepSpeed builds its ops (FusedAdam) at first use from TORCH_CUDA_ARCH_LIST, and cannot read an arch with a
# suffix: the GPU image's "9.0a" ended every cell with "invalid literal for int() with base 10: '0a'" (session 11).
export TORCH_CUDA_ARCH_LIST=9.0
if [ "$PART" = all ] || [ "$PART" = deepspeed ]; then
  # Plain training (strategy none) beside ZeRO 1-3 with the same optimizer, so the memory splits compare.
  python3 -m transbench train --model bert-large-uncased --task mlm --seq 128 --dtype bf16 --batch 32 \
    --strategy none,deepspeed --zero-stage 1,2,3 --optim ds-fused-adam --steps 5 --warmup 2 --timeout 300 \
    --db "$DB" --json "$OUT/ds_bert_large.json" > "$OUT/ds_bert_large.log" 2>&1
  table "$OUT/ds_bert_large.json"
  python3 -m transbench train --model gpt2-large --task causal-lm --seq 1024 --dtype bf16 --batch 4 \
    --strategy none,deepspeed --zero-stage 1,2,3 --optim ds-fused-adam --steps 5 --warmup 2 --timeout 300 \
    --db "$DB" --json "$OUT/ds_gpt2_large.json" > "$OUT/ds_gpt2_large.log" 2>&1
  table "$OUT/ds_gpt2_large.json"
fi

if [ "$PART" = all ] || [ "$PART" = ladder ]; then
  python3 -m transbench train --ladder --model bert-large-uncased --task mlm --seq 128 --batch 64 \
    --max-batch-limit 256 --steps 5 --warmup 2 --timeout 300 --plot "$OUT/ladder_bert_large.png" \
    --db "$DB" --json "$OUT/ladder_bert_large.json" > "$OUT/ladder_bert_large.log" 2>&1
  python3 -m transbench train --ladder --model gpt2 --task causal-lm --seq 1024 --batch 8 \
    --max-batch-limit 64 --steps 5 --warmup 2 --timeout 300 --plot "$OUT/ladder_gpt2.png" \
    --db "$DB" --json "$OUT/ladder_gpt2.json" > "$OUT/ladder_gpt2.log" 2>&1
  for m in bert_large gpt2; do
    PYTHONPATH=$PYTHONPATH python3 -c "
import json, sys
from transbench.scenarios.training.ladder import summary
rows = json.load(open('$OUT/ladder_$m.json'))
print(summary(rows))
for r in rows:
    if r['status'] != 'ok':
        print('   ', r['step'], ':', (r.get('error') or '')[:240])
"
  done
fi
