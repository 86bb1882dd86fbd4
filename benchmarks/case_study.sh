#!/usr/bin/env bash
# The book's case study (Tables 11.1-11.6) with `diagnose sweep` over workloads/train.py, on
# micro-224 generated on the spot. Needs a GPU; about 8 minutes on one H200.
#   bash benchmarks/case_study.sh OUT_DIR [DATA_DIR]
# Each sweep writes OUT_DIR/<table>/report.json (+ sweep.png); docs/case-study.md quotes them.
# DEADLINE (epoch seconds, optional): sweeps that would start after it are skipped, and a
# running sweep is stopped at it (for a lease with little device time left).
# ONLY (optional, names separated by spaces): run these sweeps alone, e.g. ONLY="vit_compile".
set -u
OUT=${1:?output folder}; DATA=${2:-/tmp/micro-224}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
D="python3 -m diagnose"
T="workloads/train.py"
FAST=(--warmup 2 --steps 2 --timed-steps 4 --timeout 240)

[ -d "$DATA/train" ] || python3 workloads/make_dataset.py --preset micro-224 --out "$DATA" 2>&1 | tail -1

sweep() {  # name, diagnose sweep options..., then -- and the script's own arguments
    local name=$1; shift
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    local left=$(( ${DEADLINE:-$(( $(date +%s) + 3600 ))} - $(date +%s) ))
    if [ "$left" -lt 30 ]; then echo "== $name skipped: past the deadline"; return; fi
    echo "== $name $(date +%T) (${left}s left)"
    timeout "$left" $D sweep --no-color --out "$OUT/$name" "$@" 2>&1 | grep -v "^diagnose ▸" | tail -25
}

# 11.3 custom MLP num_workers sweep
sweep mlp_workers "${FAST[@]}" --set arg.num_workers=0,2,4,8,12,15 $T -- \
    --model_name custom --dataset "$DATA" --batch_size 128 --epochs_eval 0 --num_epochs 1
# 11.2 custom MLP batch sweep, data loaded in the main process (num_workers=0)
sweep mlp_batch "${FAST[@]}" --set arg.batch_size=16,32,64,128,256,512 $T -- \
    --model_name custom --dataset "$DATA" --num_workers 0 --epochs_eval 0 --num_epochs 1
# 11.5 ViT precision: fp32, fp16 (with a gradient scaler), bf16
sweep vit_precision "${FAST[@]}" --set arg.mixed_precision=none,fp16,bf16 $T -- \
    --model_name vit --dataset "$DATA" --batch_size 64 --num_workers 8 --epochs_eval 0 --num_epochs 1
# 11.1 ViT-H/14 fp32 batch sweep, until memory runs out
sweep vit_batch "${FAST[@]}" --set arg.batch_size=16,32,64,128,256 $T -- \
    --model_name vit --dataset "$DATA" --num_workers 8 --epochs_eval 0 --num_epochs 1
# 11.6 torch.compile at batch 128, bf16 (compile time and break-even come from the run records)
sweep vit_compile --warmup 3 --steps 2 --timed-steps 6 --timeout 420 --set arg.compile=none,flag $T -- \
    --model_name vit --dataset "$DATA" --batch_size 128 --mixed_precision bf16 --num_workers 8 --epochs_eval 0 --num_epochs 1
# 11.4 ViT num_workers: flat (the GPU is the bottleneck)
sweep vit_workers "${FAST[@]}" --set arg.num_workers=0,8 $T -- \
    --model_name vit --dataset "$DATA" --batch_size 64 --epochs_eval 0 --num_epochs 1
echo "== done $(date +%T)"
