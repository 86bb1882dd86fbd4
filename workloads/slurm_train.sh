#!/bin/bash
# SLURM job for workloads/train.py, in the book's srun + torchrun style: SLURM starts one
# task per node, and torchrun starts one training process per GPU inside each task.
#
# Submit from the repository root (the logs go to ./results, which must exist):
#   mkdir -p results && sbatch workloads/slurm_train.sh
#   sbatch --nodes=2 --export=ALL,MODEL=custom,DATASET=./datasets/micro-224,NW=8 workloads/slurm_train.sh
#
# Add your site's --account/--qos/--partition lines and container or module setup.
#SBATCH --job-name=train_workload
#SBATCH --output=./results/R-%x.%j.out
#SBATCH --error=./results/R-%x.%j.err
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=80
#SBATCH --time=01:00:00
#SBATCH --exclusive

set -euo pipefail

# Training configuration, overridable with sbatch --export (the book's variables).
MODEL="${MODEL:-vit}"
DATASET="${DATASET:-./datasets/tiny-224}"
EPOCHS="${EPOCHS:-5}"
BS="${BS:-128}"
NW="${NW:-10}"
OPTIM="${OPTIM:-sgd}"
PRECISION="${PRECISION-bf16}"    # fp16, bf16, or empty (PRECISION=) for fp32
COMPILE="${COMPILE:-1}"          # 1: --compile
EXTRA_ARGS="${EXTRA_ARGS:-}"     # anything else for train.py, e.g. "--max_steps 200 --pin_memory"
GPUS_PER_NODE="${GPUS_PER_NODE:-4}"

PYTHON_ARGS="--model_name $MODEL --dataset $DATASET --num_epochs $EPOCHS --batch_size $BS \
--eval_batch_size $BS --num_workers $NW --optimizer $OPTIM"
if [[ -n "$PRECISION" ]]; then PYTHON_ARGS+=" --mixed_precision $PRECISION"; fi
if [[ "$COMPILE" == 1 ]]; then PYTHON_ARGS+=" --compile"; fi
PYTHON_ARGS+=" $EXTRA_ARGS"

# torchrun's rendezvous point: the first node of the allocation.
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
MASTER_PORT="${MASTER_PORT:-29500}"

LAUNCHER="torchrun --nnodes=$SLURM_NNODES --nproc_per_node=$GPUS_PER_NODE \
--rdzv_id=$SLURM_JOB_ID --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT"
CMD="$LAUNCHER ${SLURM_SUBMIT_DIR}/workloads/train.py $PYTHON_ARGS"

echo "Running: $CMD"
srun --cpus-per-task "$SLURM_CPUS_PER_TASK" --jobid "$SLURM_JOB_ID" bash -c "$CMD"
