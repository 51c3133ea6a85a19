#!/usr/bin/env bash
# The fused engine against the other backends (issue 6 table), measured with transbench itself:
# bert-base and bert-large, fp16, task base, encoders-only, batch 1,8,64,256 x seq 128,384,512;
# gpt2 generation at batch 1 (prompt 512, 128 new tokens); variable lengths (mean ~0.6 x max) vs padded.
# Run from the repo root on a GPU machine: bash benchmarks/fused_table.sh [DB] [PARTS]
# PARTS (default all): any of base, large, extra (compile, generation, varlen), comma-separated;
# parts of one DB may run in separate calls (named runs resume). Then: transbench report DB.
set -x
DB=${1:-fused.db}
PARTS=${2:-base,large,extra}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# The engine's tuned routes live beside the store: a run resumed in a later call (both brought back) re-tunes nothing.
export TRANSBENCH_CACHE_DIR=${TRANSBENCH_CACHE_DIR:-$(dirname "$DB")/engine-tuning}
TB="python3 -m transbench"
grid() {  # model, batches, seqs, run name
  $TB run --model "$1" --dtype fp16 --encoders-only --backend eager,sdpa,sdpa-flash,sdpa-cudnn,cudagraph,fused \
    --batch "$2" --seq "$3" --baseline sdpa --min-time 0.2 --timeout 300 --name "$4" --db "$DB"
}
[[ ,$PARTS, == *,base,* ]] && grid bert-base-uncased 1,8,64,256 128,384,512 fused-bert-base-uncased
if [[ ,$PARTS, == *,large,* ]]; then
  grid bert-large-uncased 128 384 fused-bert-large-target  # the bert-large target point
  grid bert-large-uncased 1,8,64,256 128,384,512 fused-bert-large-uncased
fi
if [[ ,$PARTS, == *,extra,* ]]; then
  $TB run --model gpt2 --task generate --dtype fp16 --seq 512 --new-tokens 128 --batch 1 --backend eager,sdpa,cudagraph,fused \
    --min-time 0.3 --timeout 180 --name fused-generate --db "$DB"
  # Variable lengths: 0.6 x 512 mean; the same engine padded (stdev 0) vs packed.
  $TB run --model bert-base-uncased --dtype fp16 --encoders-only --backend sdpa,fused --batch 64 --seq 307 \
    --seq-stdev 100 --min-time 0.2 --name fused-varlen --db "$DB"
  $TB run --model bert-base-uncased --dtype fp16 --encoders-only --backend fused --batch 64 --seq 512 \
    --min-time 0.2 --name fused-padded --db "$DB"
  $TB run --model bert-base-uncased --dtype fp16 --encoders-only --backend compile,fused --batch 1,256 --seq 128 \
    --baseline compile --min-time 0.2 --timeout 240 --name fused-vs-compile --db "$DB"
fi
