#!/usr/bin/env bash
# Single-node DDP run of workloads/train.py: one process per GPU, launched by torchrun.
#
#   workloads/torchrun_train.sh --model_name vit --dataset datasets/tiny-224 \
#       --batch_size 128 --num_workers 8 --mixed_precision bf16 --compile
#
# NPROC (default: the number of visible GPUs) sets the processes; every argument goes to
# train.py unchanged. --batch_size is per process: the global batch is NPROC times larger.
# Without GPUs, NPROC defaults to 2 and the processes use gloo on the CPU.
set -euo pipefail

if [[ $# -eq 0 ]]; then
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GPUS="$(python -c 'import torch; print(torch.cuda.device_count())')"
NPROC="${NPROC:-$(( GPUS > 0 ? GPUS : 2 ))}"

exec torchrun --standalone --nnodes=1 --nproc_per_node="$NPROC" "$HERE/train.py" "$@"
