#!/usr/bin/env bash
# On a GPU machine: a plain torch.profiler trace (no diagnose) of every planted example, for
# tests/test_bare_traces.py. Writes $OUT/plain_traces.tar.gz. About 3 minutes on an H100.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}/plain
mkdir -p "$out"
for ex in data_bound pageable_copies fp32_transformer launch_bound item_syncs forloop_optimizer cpu_preprocessing well_tuned; do
    start=$(date +%s.%N)
    PLAIN_ACTIVE=3 timeout 240 python3 benchmarks/plain_profiler.py "$out" "examples/$ex.py" > "$out/$ex.log" 2>&1
    echo "$ex: exit $? in $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s; $(tail -1 "$out/$ex.log")"
done
gzip -f "$out"/*.pt.trace.json
tar -czf "${OUT:-/tmp/out}/plain_traces.tar.gz" -C "$out" .
ls -la "$out"
