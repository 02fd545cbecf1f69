#!/usr/bin/env bash
# A dispatch map across a Slurm cluster: one part of the plan per GPU node, then one merge.
#
#   sbatch examples/slurm_shards.sh                    # submits the array and the merge after it
#
# Each array task runs `cublas-audit map --shard I/N`: the I-th of N parts of the same plan
# (balanced by estimated work, the same split on every node), into a run directory of its own.
# A task that is requeued or resubmitted finds its directory and resumes it (`--resume`): only its
# unfinished cases run again. When every task has ended, the merge job joins the N directories
# into one run (plan, dispatch.csv in plan order, report.md); it refuses, in one line with exit
# code 2, a missing or unfinished shard, or shards of other cuBLAS/driver versions or settings
# (give --allow-mixed to merge those anyway, reported per GPU model).
#
# Change N in both places (the --array range and SHARDS), the grid, and RUN to a shared directory.
#SBATCH --job-name=cublas-map
#SBATCH --array=1-8
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
#SBATCH --time=01:00:00
#SBATCH --requeue
#SBATCH --output=cublas-map-%A-%a.log

set -euo pipefail

SHARDS=8                                   # N: the size of the --array range above
RUN=${RUN:-$PWD/reports/fleet/map-$(date +%Y%m%d)}
GRID=(--m 64:8192:64 --n 64:8192:64 --k 64:8192:64 --sample 20000 --seed 1 --modes fp32,bf16)

if [[ -z "${SLURM_ARRAY_TASK_ID:-}" ]]; then
    # Submitted by hand: queue the array, then the merge once every task has ended.
    array=$(sbatch --parsable --export=ALL,RUN="$RUN" "$0")
    sbatch --dependency=afterany:"$array" --job-name=cublas-merge \
        --output=cublas-merge-%j.log \
        --wrap "cublas-audit merge $RUN/shard-* --out $RUN/merged"
    exit 0
fi

I=$SLURM_ARRAY_TASK_ID
OUT=$RUN/shard-$I
if [[ -f "$OUT/plan.json" ]]; then
    exec cublas-audit map --resume "$OUT"  # a requeued task: its part and settings are recorded
fi
exec cublas-audit map "${GRID[@]}" --gpu-label "${GPU_LABEL:-h100}" \
    --shard "$I/$SHARDS" --out "$OUT"
