#!/usr/bin/env bash
# The seeds' multi-GPU tables on one host of 4 GPUs: collectives, training scaling (DDP, DataParallel,
# FSDP2, DeepSpeed ZeRO 1/2/3, NCCL P2P on/off), data-parallel inference and a grid over one lane per GPU.
#
#   bash benchmarks/multi_gpu.sh [PART ...]        (outputs and summary.md under ${OUT:-/tmp/out})
#
# Parts, in the order worth running (the first four fit about 9 minutes on 4 x H100; the default is those four):
#   collectives  all-reduce, all-gather, reduce-scatter, 1 KiB .. 1 GiB, fp32, over all GPUs (nccl-tests' busbw)
#   train-bert   bert-large MLM seq 128, bf16, fused AdamW, masked head: one GPU, DDP on 2 and 4 (scaling,
#                all-reduce time and share per step, memory split per GPU)
#   dp           the same step under torch.nn.DataParallel on 2 and 4 GPUs (one process), beside DDP's
#   infer        run --nproc 1,2,4: bert-base and bert-large, fp16 sdpa, batch 256, seq 128 and 384
#   lanes        a 16-cell grid on one lane, then over --gpus 0,1,2,3, then on one lane again: wall times, each cell's
#                figure on the lanes against one lane, and one lane's own run-to-run change
#                (LANES_BATCHES=8,256 halves the grid)
#   p2p          DDP with NCCL_P2P_DISABLE=1 on 2 and 4 GPUs (bert-large)
#   train-gpt2   gpt2-large causal LM seq 1024, bf16, fused AdamW: one GPU, DDP on 2 and 4
#   fsdp         FSDP2 for both models on 2 and 4 GPUs
#   deepspeed    DeepSpeed ZeRO 1, 2, 3 for both models on 2 and 4 GPUs (installs .whl/ when present);
#                deepspeed-bert and deepspeed-gpt2 run one model each, fsdp-gpt2 FSDP2 for gpt2-large alone
#   all          every part above, in this order
# Each part has its own time box (timeout) and stores as it goes: a part cut short keeps the cells it finished, and
# summary.md is written after every part from the stores (benchmarks/multi_gpu_summary.py). DEADLINE_S (default
# 540) bounds the whole script: no box outlasts it, and parts past it are skipped with a note (a device call's
# 10 minutes then still end with the summary printed).
# NVLink multicast stays off: NCCL_NVLS_ENABLE=0 here and in every rank (runner/launch.py); never turn it on.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
PY=${PY:-python3}
TB="$PY -m transbench"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$NGPU" -ge 1 ] || { echo "no GPU visible (nvidia-smi -L)"; exit 1; }
# 2 and 4 GPUs where there are 4; every count up to what is here otherwise (8 stays unrun until such hosts are lent)
# (NPROCS=4 runs only the 4-GPU cells of the parts that take a count)
NPROCS=${NPROCS:-$($PY -c "n=$NGPU; print(','.join(str(k) for k in (2, 4, 8) if k <= n) or '1')")}
GPULIST=$($PY -c "print(','.join(map(str, range($NGPU))))")
TRAIN_DB="$OUT/train.db"
STEPS="--steps 10 --warmup 3"
BERT="--model bert-large-uncased --task mlm --seq 128 --dtype bf16 --optim adamw-fused --backend sdpa --head masked --batch 128"
GPT2="--model gpt2-large --task causal-lm --seq 1024 --dtype bf16 --optim adamw-fused --backend sdpa --batch 8"
DEADLINE_S=${DEADLINE_S:-540}
# the ZeRO stages of the deepspeed parts (ZERO_STAGES=3 reruns only stage 3)
ZERO_STAGES=${ZERO_STAGES:-1,2,3}
# the models of the inference part (INFER_MODELS=bert-large-uncased reruns only the larger one)
INFER_MODELS=${INFER_MODELS:-bert-base-uncased,bert-large-uncased}
START=$(date +%s)
PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(collectives train-bert dp infer)
[ "${PARTS[0]}" = all ] && PARTS=(collectives train-bert dp infer lanes p2p train-gpt2 fsdp deepspeed)

{ hostname; nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,power.limit,clocks.max.sm --format=csv; } \
  > "$OUT/host.txt" 2>&1
echo "parts: ${PARTS[*]}; GPUs: $NGPU; nproc: $NPROCS" | tee "$OUT/parts.txt"

summary() { $PY benchmarks/multi_gpu_summary.py "$OUT" > "$OUT/summary.md" 2> "$OUT/summary.err" || cat "$OUT/summary.err"; }

# box SECONDS NAME COMMAND...: run one command in its time box, its output in $OUT/NAME.log, its wall time kept.
box() {
  local secs=$1 name=$2; shift 2
  local left=$(( DEADLINE_S - ($(date +%s) - START) ))
  if [ "$left" -lt 20 ]; then
    echo "$name skipped: the script's ${DEADLINE_S} s deadline (DEADLINE_S) is reached" | tee -a "$OUT/walls.txt"
    return
  fi
  [ "$left" -lt "$secs" ] && secs=$left
  local t0; t0=$(date +%s.%N)
  timeout -k 10 "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local t1; t1=$(date +%s.%N)
  echo "$name rc=$rc wall_s=$($PY -c "print(f'{$t1 - $t0:.1f}')")" | tee -a "$OUT/walls.txt"
  [ $rc -eq 124 ] && echo "  $name: cut at its ${secs} s box" | tee -a "$OUT/walls.txt"
  tail -3 "$OUT/$name.log"
}

deepspeed_ready() {
  $PY -c "import deepspeed" >/dev/null 2>&1 && return 0
  if compgen -G ".whl/*.whl" > /dev/null; then
    $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
    $PY -c "import deepspeed" >/dev/null 2>&1 && return 0
  fi
  echo "deepspeed: not installed and no .whl/ to install from: its part is skipped" | tee -a "$OUT/walls.txt"
  return 1
}

for part in "${PARTS[@]}"; do
  case $part in
    collectives)
      box 140 collectives $TB micro collectives --sizes 1KiB..1GiB --nproc "$NGPU" --dtype fp32 --min-time 0.2 \
        --timeout 130 --name collectives --db "$OUT/micro.db" ;;
    train-bert)
      box 200 train_bert $TB train $BERT --strategy ddp --nproc "$NPROCS" --scaling $STEPS --timeout 120 \
        --name bert-ddp --db "$TRAIN_DB" --wide ;;
    dp)
      # the one-GPU baseline is train-bert's (the same step, found in the store)
      box 120 train_dp $TB train $BERT --strategy dp --nproc "$NPROCS" $STEPS --timeout 100 \
        --name bert-dp --db "$TRAIN_DB" --wide ;;
    infer)
      for n in 1 ${NPROCS//,/ }; do
        extra=""; [ "$n" -gt 1 ] && extra="--nproc $n"
        box 150 "infer_$n" $TB run --model "$INFER_MODELS" --backend sdpa --dtype fp16 \
          --batch 256 --seq 128,384 --min-time 0.5 $extra --timeout 140 --name "infer-nproc$n" --db "$OUT/infer.db"
      done ;;
    lanes)
      GRID="--model bert-base-uncased,bert-large-uncased --backend sdpa --dtype fp16 --batch ${LANES_BATCHES:-1,8,64,256} --seq 128,384 --min-time 0.5"
      box 200 lanes_1 $TB run $GRID --name lanes-one --db "$OUT/lanes.db"
      box 120 lanes_n $TB run $GRID --gpus "$GPULIST" --name lanes-all --db "$OUT/lanes.db"
      # one lane once more: how far a cell moves between two runs on one lane, the yardstick for the lanes' ratios
      box 200 lanes_1b $TB run $GRID --name lanes-one-again --db "$OUT/lanes.db" ;;
    p2p)
      box 150 train_p2p $TB train $BERT --strategy ddp --nproc "$NPROCS" --nccl-p2p off $STEPS --timeout 120 \
        --name bert-ddp-nop2p --db "$TRAIN_DB" --wide ;;
    train-gpt2)
      box 300 train_gpt2 $TB train $GPT2 --strategy ddp --nproc "$NPROCS" --scaling $STEPS --timeout 200 \
        --name gpt2-ddp --db "$TRAIN_DB" --wide ;;
    fsdp-gpt2)
      box 240 fsdp_gpt2 $TB train $GPT2 --strategy fsdp --nproc "$NPROCS" $STEPS --timeout 200 \
        --name gpt2-fsdp --db "$TRAIN_DB" --wide ;;
    fsdp)
      box 150 fsdp_bert $TB train $BERT --strategy fsdp --nproc "$NPROCS" $STEPS --timeout 120 \
        --name bert-fsdp --db "$TRAIN_DB" --wide
      box 240 fsdp_gpt2 $TB train $GPT2 --strategy fsdp --nproc "$NPROCS" $STEPS --timeout 200 \
        --name gpt2-fsdp --db "$TRAIN_DB" --wide ;;
    deepspeed-bert|deepspeed-gpt2)
      if deepspeed_ready; then
        if [ "$part" = deepspeed-bert ]; then model=bert; args=$BERT; box=300; else model=gpt2; args=$GPT2; box=420; fi
        box $box "ds_$model" $TB train $args --strategy deepspeed --zero-stage "$ZERO_STAGES" --nproc "$NPROCS" $STEPS \
          --timeout 200 --name "$model-deepspeed" --db "$TRAIN_DB" --wide
      fi ;;
    deepspeed)
      if deepspeed_ready; then
        # torch's fused AdamW under ZeRO (zero_allow_untested_optimizer): no DeepSpeed op to build with ninja first
        box 300 ds_bert $TB train $BERT --strategy deepspeed --zero-stage "$ZERO_STAGES" --nproc "$NPROCS" $STEPS \
          --timeout 150 --name bert-deepspeed --db "$TRAIN_DB" --wide
        box 420 ds_gpt2 $TB train $GPT2 --strategy deepspeed --zero-stage "$ZERO_STAGES" --nproc "$NPROCS" $STEPS \
          --timeout 200 --name gpt2-deepspeed --db "$TRAIN_DB" --wide
      fi ;;
    *) echo "unknown part '$part'"; exit 2 ;;
  esac
  summary
done
summary
cat "$OUT/summary.md"
