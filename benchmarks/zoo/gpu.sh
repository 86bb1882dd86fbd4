#!/usr/bin/env bash
# One device call of the outside corpus (docs/zoo.md): generate the data of the scripts named (or
# of the whole half), run them under diagnose and verify, score, and leave in OUT what should
# come back (results.jsonl, score.md, score.json, reports.tgz with every report.json, traces.tgz with
# each script's first run's trace and record).
#
#   python benchmarks/zoo/fetch.py --dest zoo-scripts --mirror /work/.mirror --no-prepare   # here, once
#   bash benchmarks/zoo/gpu.sh "$OUT" evaluation [NAME ...]                                # there, zoo-scripts carried
#
# It stays inside one 10-minute call: run.py stops starting scripts past ZOO_BUDGET seconds
# (default 450) and is stopped at ZOO_SECONDS (default 510), taking its running command down
# with it; the data generation before it takes about a minute. ZOO_RUN_ARGS adds run.py options
# (e.g. "--reruns 1" or "--verify-top 2").
#
# ZOO_LANES=N (a machine of N GPUs): the scripts named are dealt round-robin to N lanes that run
# at once, lane k on GPU k alone (CUDA_VISIBLE_DEVICES) and on its own share of the CPU cores
# (taskset), each with its own output folder and rendezvous port; their results are scored
# together. One lane is one script at a time on a GPU and cores of its own, as on a machine of one.
# ZOO_CPUS="0-15;16-31" gives lane k the k-th of those cpulists instead of the k-th equal share
# (the rest of the host left to something else: another benchmark on the other GPUs).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="$1"
half="$2"
shift 2
work="${ZOO_WORK:-/tmp/zoo-out}"
lanes="${ZOO_LANES:-1}"
only=()
if [ $# -gt 0 ]; then
    only=(--only "$@")
fi
mkdir -p "$out" "$work"
python3 benchmarks/zoo/fetch.py --dest zoo-scripts --prepare-only --half "$half" "${only[@]}"

run_lane() {  # lane-folder [NAME ...]
    local dir="$1"
    shift
    local names=()
    if [ $# -gt 0 ]; then
        names=(--only "$@")
    fi
    local pin=()
    if [ -n "${LANE_CPUS:-}" ]; then
        pin=(taskset -c "$LANE_CPUS")
    fi
    # shellcheck disable=SC2086  # ZOO_RUN_ARGS is a list of options
    "${pin[@]}" timeout -s TERM "${ZOO_SECONDS:-510}" python3 benchmarks/zoo/run.py --scripts zoo-scripts --out "$dir" --half "$half" "${names[@]}" \
        --budget-s "${ZOO_BUDGET:-450}" --timeout-s "${ZOO_TIMEOUT:-150}" ${ZOO_RUN_ARGS:-}
}

if [ "$lanes" -le 1 ]; then
    run_lane "$work" "$@"
    results="$work/results.jsonl"
else
    if [ $# -eq 0 ]; then
        echo "ZOO_LANES needs the scripts named" >&2
        exit 2
    fi
    cores=$(nproc)
    per=$((cores / lanes))
    pids=()
    for ((k = 0; k < lanes; k++)); do
        mine=()
        i=0
        for name in "$@"; do
            if [ $((i % lanes)) -eq "$k" ]; then mine+=("$name"); fi
            i=$((i + 1))
        done
        [ ${#mine[@]} -eq 0 ] && continue
        first=$((k * per))
        last=$((first + per - 1))
        cpus="$first-$last"
        if [ -n "${ZOO_CPUS:-}" ]; then  # the lanes' cpulists, ";"-separated: lane k takes field k
            cpus=$(echo "$ZOO_CPUS" | cut -d';' -f$((k + 1)))
        fi
        (
            export CUDA_VISIBLE_DEVICES="$k" ZOO_MASTER_PORT=$((29517 + 10 * k)) LANE_CPUS="$cpus"
            run_lane "$work/lane$k" "${mine[@]}" 2>&1 | sed -u "s/^/[lane $k] /"
        ) &
        pids+=($!)
    done
    wait "${pids[@]}"
    results="$work/results.jsonl"
    cat "$work"/lane*/results.jsonl >"$results"
fi
cp "$results" "$out/results.jsonl"
python3 benchmarks/zoo/score.py "$results" --json "$out/score.json" | tee "$out/score.md"
(cd "$work" && find . -name report.json -print0 | tar czf "$out/reports.tgz" --null -T -)
# the first run's trace and record of each script (under 8 MB each): what a recorded-trace test of a
# weakness the corpus finds is made from (tests/data/, gzipped)
(cd "$work" && find . -path '*/run0/*' \( -name '*.pt.trace.json*' -size -8M -o -name run.json \) -not -path '*/check-*' -print0 |
    tar czf "$out/traces.tgz" --null -T -)
