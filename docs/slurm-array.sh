#!/usr/bin/env bash
# A transbench grid as a Slurm job array: each array task runs its slice of the grid (`--shard auto` reads
# SLURM_ARRAY_TASK_ID with SLURM_ARRAY_TASK_MIN/MAX) into a store on its node's local disk, then copies that store
# to the shared folder. SQLite's locking does not hold over network filesystems (NFS, Lustre), so no task writes
# a store there; one `transbench merge` joins the copies once every task has ended.
#
#   sbatch docs/slurm-array.sh                      # 8 tasks, one GPU each
#   sbatch --dependency=afterok:<jobid> --wrap "transbench merge \$SHARED/shard-*.db --into \$SHARED/grid.db"
#
# Every task gives the same options and the same --name: the shards are one run, and merge refuses stores whose
# grids differ. Each store records its host, its GPUs' UUIDs and its Slurm task, and each cell the host that ran it,
# so the merged grid says where every cell ran; `transbench compare` refuses cells of different GPU models.
#SBATCH --job-name=transbench-grid
#SBATCH --array=0-7
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=8
#SBATCH --time=02:00:00
#SBATCH --output=transbench-%A_%a.log
set -euo pipefail
SHARED=${SHARED:-$HOME/transbench-results}   # a folder every node sees: only finished stores are copied there
LOCAL=${SLURM_TMPDIR:-${TMPDIR:-/tmp}}/transbench-$SLURM_ARRAY_JOB_ID-$SLURM_ARRAY_TASK_ID
mkdir -p "$SHARED" "$LOCAL"

transbench run --model bert-base-uncased,bert-large-uncased,roberta-base --backend eager,sdpa,compile \
  --dtype fp16,bf16 --batch 1,8,64,256 --seq 128,384 \
  --shard auto --name grid --db "$LOCAL/shard.db"

cp "$LOCAL/shard.db" "$SHARED/shard-$SLURM_ARRAY_TASK_ID.db"
# After the whole array (a dependent job, or by hand):
#   transbench merge "$SHARED"/shard-*.db --into "$SHARED/grid.db" && transbench report grid --db "$SHARED/grid.db"
