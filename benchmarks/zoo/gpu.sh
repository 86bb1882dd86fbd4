#!/usr/bin/env bash
# One device call of the outside corpus (docs/zoo.md): generate the data of the scripts named (or
# of the whole half), run them under diagnose and verify, score, and leave in OUT what should
# come back (results.jsonl, score.md, score.json, reports.tgz with every report.json).
#
#   python benchmarks/zoo/fetch.py --dest zoo-scripts --mirror /work/.mirror --no-prepare   # here, once
#   bash benchmarks/zoo/gpu.sh "$OUT" evaluation [NAME ...]                                # there, zoo-scripts carried
#
# It stays inside one 10-minute call: run.py stops starting scripts past ZOO_BUDGET seconds
# (default 450) and is stopped at ZOO_SECONDS (default 510), taking its running command down
# with it; the data generation before it takes about a minute. ZOO_RUN_ARGS adds run.py options
# (e.g. "--reruns 1" or "--verify-top 2").
set -uo pipefail
cd "$(dirname "$0")/../.."
out="$1"
half="$2"
shift 2
work="${ZOO_WORK:-/tmp/zoo-out}"
only=()
if [ $# -gt 0 ]; then
    only=(--only "$@")
fi
mkdir -p "$out" "$work"
python3 benchmarks/zoo/fetch.py --dest zoo-scripts --prepare-only --half "$half" "${only[@]}"
# shellcheck disable=SC2086  # ZOO_RUN_ARGS is a list of options
timeout -s TERM "${ZOO_SECONDS:-510}" python3 benchmarks/zoo/run.py --scripts zoo-scripts --out "$work" --half "$half" "${only[@]}" \
    --budget-s "${ZOO_BUDGET:-450}" --timeout-s "${ZOO_TIMEOUT:-150}" ${ZOO_RUN_ARGS:-}
cp "$work/results.jsonl" "$out/results.jsonl"
python3 benchmarks/zoo/score.py "$work/results.jsonl" --json "$out/score.json" | tee "$out/score.md"
(cd "$work" && find runs -name report.json -print0 | tar czf "$out/reports.tgz" --null -T -)
