#!/usr/bin/env bash
# The framework examples on a GPU: for each one, `diagnose verify --top 1` (its first baseline is
# a full `diagnose run`, trace kept; then the top recommendation applied through its knob, which
# takes the framework's own switch where it has one). About 6-8 minutes on one H100.
#   bash benchmarks/frameworks_gpu.sh OUT_DIR
# OUT_DIR gets one log per example and frameworks.tar.gz: each run's report.json, run.json and
# a trimmed trace (3 steps). DEADLINE (epoch seconds, optional): examples that would start after
# it are skipped. ONLY (names separated by spaces): run these alone, e.g. ONLY="lightning hf".
set -u
OUT=${1:?output folder}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
D="python3 -m diagnose"
FAST=(--top 1 --repeats 1 --warmup 3 --steps 4 --timed-steps 12 --timeout 200)
STARTED=$(date +%s)

example() {  # name, script, then the script's own arguments
    local name=$1 script=$2; shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    local left=$(( ${DEADLINE:-$(( STARTED + 480 ))} - $(date +%s) ))
    if [ "$left" -lt 40 ]; then echo "== $name skipped: past the deadline" | tee -a "$OUT/summary.txt"; return; fi
    echo "== $name $(date +%T) (${left}s left)"
    timeout "$left" $D verify --no-color --out "$OUT/runs/$name" "${FAST[@]}" "examples/$script" -- "$@" \
        > "$OUT/$name.log" 2>&1
    echo "== $name exit $?" >> "$OUT/$name.log"
    { echo "== $name"; grep -E "^ 1\. |    where:|^    \| |helped|no effect|slower|could not|framework" "$OUT/$name.log" | head -20; } \
        | tee -a "$OUT/summary.txt"
}

example lightning lightning_fp32.py
example hf hf_trainer_workers.py
example accelerate accelerate_fp32.py
example closure closure_optimizer.py
example compiled compiled_launch_bound.py
example fabric fabric_fp32.py

# one archive: report.json, run.json and 3 steps of each trace (the full traces are large)
STAGE=$(mktemp -d)
for record in $(find "$OUT/runs" -name run.json); do
    meta=$(dirname "$record"); run=$meta; [ "$(basename "$meta")" = diagnose ] && run=$(dirname "$meta")
    rel=${run#"$OUT/runs/"}; mkdir -p "$STAGE/$rel"
    cp "$meta"/report.json "$meta"/run.json "$STAGE/$rel/" 2>/dev/null
    trace=$(ls "$run"/*.pt.trace.json* 2>/dev/null | head -1)
    [ -n "$trace" ] && $D trim "$trace" "$STAGE/$rel/trace.trimmed.json.gz" --keep 3 >/dev/null 2>&1
done
tar -czf "$OUT/frameworks.tar.gz" -C "$STAGE" .
rm -rf "$STAGE" "$OUT/runs"
ls -la "$OUT"
