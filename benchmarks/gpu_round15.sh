#!/usr/bin/env bash
# Session 24's GPU calls, one part per device call (each under 10 minutes on an H100); every step is time-boxed and
# writes under $OUT, so a call cut short still returns what was measured.
#   bash benchmarks/gpu_round15.sh check   the whole fp8 GPU test file (session 23 cut it at 280 s, cold Triton
#                                          cache), then the padding path at large batches and long rows
#                                          (benchmarks/packing_cost.py: mask_counts is one program)
#   bash benchmarks/gpu_round15.sh final   the six fp8 GPU tests the check part's 430 s did not reach (59 of 65 passed
#                                          there), make_packing's GPU test (a mask past PACK_MAX_TOKENS added),
#                                          then the sampler against a plain CUDA-event loop at a point no issue names
#   bash benchmarks/gpu_round15.sh loop    the sampler against a plain CUDA-event loop at another such point
#   bash benchmarks/gpu_round15.sh host    where the two differ on a host-bound cell (benchmarks/host_bound_check.py)
#   bash benchmarks/gpu_round15.sh verify  demo through every GPU backend, the serve, micro and backend GPU tests after
#                                          session 24's CPU-side changes (sampler caps, energy, serve's max-rate)
#   bash benchmarks/gpu_round15.sh verify2 the training and checkpoint-folder GPU tests, then the two tests `verify`
#                                          failed on session 23's code and this session's (old_head/: a copy of
#                                          HEAD's src and tests, made beside the repository before the call)
#   bash benchmarks/gpu_round15.sh models  a mixture-of-experts and an XLNet folder through `transbench run` (fp16,
#                                          bf16), then the family GPU tests, after session 24's family fixes
#   bash benchmarks/gpu_round15.sh mfu     fused fp16 and fp8 cells at 1 and 8 x 128 (under the fp8 threshold): the
#                                          fp8 cells' MFU against the fp16 peak
set -x
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=150 PYTHONPATH=src
PART=${1:-check}
exec > >(tee "$OUT/round15_$PART.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
TB="python3 -m transbench"
if [ "$PART" = check ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r15-check TRITON_CACHE_DIR=/tmp/r15-check-triton
  timeout 430 python3 -m pytest -q -m gpu -p no:cacheprovider -rf --durations=5 tests/gpu/test_engine_fp8_gpu.py \
    > $OUT/fp8_tests.txt 2>&1
  echo "fp8 tests rc $?"; grep -E "passed|failed|^FAILED|Error|s call" $OUT/fp8_tests.txt | tail -12 | cut -c1-300
  timeout 130 python3 benchmarks/packing_cost.py 2>&1 | grep -vE "Warning|warn_once"
fi
if [ "$PART" = final ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r15-final TRITON_CACHE_DIR=/tmp/r15-final-triton
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rf --durations=6 tests/gpu/test_engine_fp8_gpu.py -k \
    "False-400-16 or below_the_row or refuses or minilm or fresh_generator" > $OUT/fp8_rest.txt 2>&1
  echo "fp8 rest rc $?"; grep -E "passed|failed|^FAILED|Error|s call" $OUT/fp8_rest.txt | tail -12 | cut -c1-300
  timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_engine_kernels.py -k packing \
    > $OUT/packing_tests.txt 2>&1
  echo "packing rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/packing_tests.txt | tail -8 | cut -c1-300
  timeout 100 python3 benchmarks/plain_loop_check.py --model roberta-base --backend sdpa,fused --point 24x256 \
    --dtype bf16 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -4
fi
if [ "$PART" = loop ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r15-loop TRITON_CACHE_DIR=/tmp/r15-loop-triton
  timeout 100 python3 benchmarks/plain_loop_check.py --model gpt2-medium --backend eager,fused --point 2x96 \
    --dtype fp16 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -4
fi
if [ "$PART" = host ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r15-host TRITON_CACHE_DIR=/tmp/r15-host-triton
  timeout 150 python3 benchmarks/host_bound_check.py --model gpt2-medium --backend eager --point 2x96 --dtype fp16 \
    2>&1 | grep -vE "^\s*$|Warning|warn"
  timeout 100 python3 benchmarks/host_bound_check.py --model gpt2 --backend sdpa --point 4x200 --dtype bf16 \
    2>&1 | grep -vE "^\s*$|Warning|warn"
fi
if [ "$PART" = verify ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r15-verify TRITON_CACHE_DIR=/tmp/r15-verify-triton
  # demo through every GPU backend (its attention now switched by models/build.py set_attention, as run's): an MLM
  # folder with a WordPiece vocabulary of its own (the packaged MiniLM checkpoint is too large to travel here)
  python3 - <<'PY'
from transformers import BertConfig, BertForMaskedLM
words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "paris", "is", "capital",
         "of", "france", "."] + [f"w{i}" for i in range(113)]
cfg = BertConfig(vocab_size=len(words), hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                 num_hidden_layers=2, max_position_embeddings=64)
BertForMaskedLM(cfg).save_pretrained("/tmp/r15-mlm")
open("/tmp/r15-mlm/vocab.txt", "w").write("\n".join(words) + "\n")
PY
  timeout 150 $TB demo --prompt "paris is the [MASK] of france." --model /tmp/r15-mlm --device cuda --dtype fp16 \
    --backend eager,sdpa,cudagraph,fused 2>&1 | grep -vE "Warning|warn" | tail -25
  echo "demo rc ${PIPESTATUS[0]}"
  timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_serve_gpu.py tests/gpu/test_micro_gpu.py \
    tests/gpu/test_backends_gpu.py > $OUT/verify_tests.txt 2>&1
  echo "serve+micro+backends rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/verify_tests.txt | tail -8 | cut -c1-300
fi
if [ "$PART" = verify2 ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r15-verify2 TRITON_CACHE_DIR=/tmp/r15-verify2-triton
  timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_training_gpu.py > $OUT/train_tests.txt 2>&1
  echo "training rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/train_tests.txt | tail -8 | cut -c1-300
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_families_gpu.py \
    -k "checkpoint_folders" > $OUT/families_tests.txt 2>&1
  echo "families rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/families_tests.txt | tail -8 | cut -c1-300
  # the two tests call `verify` failed, on session 23's code (old_head/, a copy of its src and tests) and on this
  # session's, one after the other on this host
  for tree in old_head .; do
    (cd $tree && timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_backends_gpu.py \
      tests/gpu/test_serve_gpu.py -k "launch_bound or under_load" 2>&1 | grep -E "passed|failed|^FAILED|^E " | cut -c1-400)
    echo "$tree rc $?"
  done
fi
if [ "$PART" = models ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r15-models TRITON_CACHE_DIR=/tmp/r15-models-triton
  # session 24's family fixes on CUDA: a mixture-of-experts folder (its FLOPs counted on a batched_mm copy) and an
  # XLNet one (counted on one real forward of a host copy), fp16 and bf16
  python3 - <<'PY'
from transformers import MixtralConfig, MixtralForCausalLM, XLNetConfig, XLNetModel
MixtralForCausalLM(MixtralConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                 num_experts_per_tok=2, max_position_embeddings=256)).save_pretrained("/tmp/r15-moe")
XLNetModel(XLNetConfig(vocab_size=512, d_model=128, n_layer=2, n_head=4, d_inner=256)).save_pretrained("/tmp/r15-xlnet")
PY
  for m in /tmp/r15-moe /tmp/r15-xlnet; do
    timeout 150 $TB run --model $m --backend eager,sdpa --dtype fp16,bf16 --batch 2 --seq 64 --min-time 0.3 \
      --timeout 100 --db $OUT/models.db --json $OUT/$(basename $m).json > $OUT/$(basename $m).txt 2>&1
    echo "$m rc $?"; python3 benchmarks/print_records.py $OUT/$(basename $m).json "$m:"
    grep -E "error|unsupported" $OUT/$(basename $m).txt | head -5 | cut -c1-250
  done
  timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_families_gpu.py \
    -k "not fused_roberta and not onnxruntime" > $OUT/families_tests.txt 2>&1
  echo "families rc $?"; grep -E "passed|failed|^FAILED|Error" $OUT/families_tests.txt | tail -8 | cut -c1-300
fi
if [ "$PART" = mfu ]; then
  export TRANSBENCH_CACHE_DIR=/tmp/r15-mfu TRITON_CACHE_DIR=/tmp/r15-mfu-triton
  # an fp8 cell under 1,024 tokens runs the fp16 forward: its MFU now against the fp16 peak, as the fp16 cell's
  timeout 250 $TB run --model bert-base-uncased --backend fused --dtype fp16,fp8 --batch 1,8 --seq 128 \
    --min-time 0.3 --timeout 200 --db $OUT/mfu.db --json $OUT/mfu.json > $OUT/mfu.txt 2>&1
  echo "mfu run rc $?"
  python3 -c "
import json
for r in json.load(open('$OUT/mfu.json')):
    print(r['dtype'], r['batch_size'], r['status'], 'ms', r['latency_ms'], 'tflops', r['tflops'], 'mfu', r['mfu'])
"
  python3 -c "
import sqlite3, json
c = sqlite3.connect('$OUT/mfu.db')
for (info,) in c.execute('select info from cells'):
    i = json.loads(info); print({k: i.get(k) for k in ('fp8_gemm_ops', 'gemm_ops', 'mfu_peak_dtype')})
" 2>&1 | tail -4
fi
