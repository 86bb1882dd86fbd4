"""The combine step of a distributed run, against the number of ranks: time and peak memory.

    python benchmarks/ranks_combine.py                         # synthetic 2, 8, 64, 256 ranks
    python benchmarks/ranks_combine.py --real 2 4              # plus real gloo runs on the CPU
    python benchmarks/ranks_combine.py --ranks 2 8 64 256 1024 --out combine.json

Each rank analyses its own trace in its own process; the merging rank then builds the job's
report from rank 0's analysis (already in its memory: it analysed its own trace) and every
rank's summary. That combine step is what is measured here: reading N ``rank<R>.summary.json``
files, ``RankSummary.from_dict``, ``combine_ranks`` (the report with the job's view), and
``notable_ranks``. Synthetic ranks are rank 1 of tests/data/ddp_straggler_cpu's summary, copied
with jittered numbers and one planted straggler. For contrast, the old way's cost (one process
parses every rank's trace) is the per-trace analysis time times N, measured once per trace.

Time is the median of 5 combines without tracemalloc; peak memory is tracemalloc's peak above
the memory held before one more combine (Python allocations: the summaries and the report). ``--real N``: ``diagnose run --nproc-per-node N`` of
examples/ddp_straggler.py --small, N gloo ranks; reports the merge's wall time as the launching
process sees it (``merge_ranks``), and the per-rank own analysis from its run directory.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from _bench import REPO, run_in_repo

sys.path.insert(0, str(REPO))
from diagnose.analysis.measure.ranks import RankSummary, notable_ranks
from diagnose.analysis.pipeline import AnalysisOptions, analyse_rank, combine_ranks
from diagnose.rundir import RunDir

FIXTURE = REPO / "tests" / "data" / "ddp_straggler_cpu"


def _first_rank_analysis(options: AnalysisOptions):  # RankAnalysis
    run_dir = RunDir(FIXTURE)
    record = run_dir.load_record(0)
    assert record is not None
    trace = run_dir.trace_for(record, 0)[0]
    start = time.perf_counter()
    analysis = analyse_rank(0, record, trace, options)
    return analysis, time.perf_counter() - start


def _synthetic_summaries(template: RankSummary, n: int, seed: int = 0) -> list[dict]:
    """n ranks' summaries: the template's numbers jittered by 2%; rank n//2 waits 5x for data."""
    rng = random.Random(seed)
    out = []
    for rank in range(n):
        s = RankSummary.from_dict(template.to_dict())
        s.rank = rank
        jitter = 1 + rng.uniform(-0.02, 0.02)
        s.median_step_ms = (s.median_step_ms or 10.0) * jitter
        s.steady_step_ms = (s.steady_step_ms or 10.0) * jitter
        s.step_ms = [round(x * jitter, 4) for x in s.step_ms]
        s.data_wait_ms = (s.data_wait_ms or 1.0) * jitter * (5.0 if rank == n // 2 else 1.0)
        s.trace = f"rank{rank}_host_{1000 + rank}.1.pt.trace.json.gz"
        out.append(s.to_dict())
    return out


def measure_combine(n: int, options: AnalysisOptions, repeats: int = 5) -> dict:
    first, _ = _first_rank_analysis(options)
    summaries = _synthetic_summaries(first.summary, n)
    times, peaks = [], []
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = RunDir.create(Path(tmp) / "run")
        for s in summaries:
            run_dir.save_rank_summary(s["rank"], s)
        summary_bytes = sum(run_dir.rank_summary_path(r).stat().st_size for r in range(n))

        def combine():
            gathered = [RankSummary.from_dict(d) for d in run_dir.load_rank_summaries().values()]
            return combine_ranks(first, gathered, options, {"kind": "run"}), notable_ranks(gathered)

        for _ in range(repeats):  # time without tracemalloc (it slows every allocation), then memory
            start = time.perf_counter()
            report, notable = combine()
            times.append(time.perf_counter() - start)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        combine()
        peaks.append(tracemalloc.get_traced_memory()[1] - base)
        tracemalloc.stop()
    assert report.distributed is not None and report.distributed["world_size"] == n
    return {
        "ranks": n,
        "combine_ms": round(statistics.median(times) * 1000, 2),
        "peak_mib": round(statistics.median(peaks) / 2**20, 2),
        "summary_kib_per_rank": round(summary_bytes / n / 1024, 2),
        "straggler": report.distributed["straggler"]["rank"] if report.distributed["straggler"] else None,
        "notable": sorted(notable),
    }


def measure_real(n: int, options: AnalysisOptions) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--no-check",
            "--nproc-per-node",
            str(n),
            "--warmup",
            "2",
            "--steps",
            "4",
            "--timed-steps",
            "4",
            "--quiet",
            "--json",
            "--out",
            str(out),
            "examples/ddp_straggler.py",
            "--",
            "--small",
        ]
        start = time.perf_counter()
        proc = run_in_repo(cmd, timeout=600)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{n} ranks failed:\n{proc.stderr[-2000:]}")
        report = json.loads(proc.stdout)
        run_dir = RunDir(out)
        # the merge again, timed on its own (what the launcher did after torchrun returned)
        from diagnose.session import analyze_run

        t0 = time.perf_counter()
        analyze_run(run_dir, options)
        merge_s = time.perf_counter() - t0
        tracemalloc.start()
        analyze_run(run_dir, options)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return {
            "ranks": n,
            "wall_s": round(wall, 1),
            "merge_ms": round(merge_s * 1000, 1),
            "merge_peak_mib": round(peak / 2**20, 2),
            "straggler": (report["distributed"]["straggler"] or {}).get("rank"),
            "traces_kept": sorted(int(p.name[4:].split("_")[0]) for p in run_dir.traces()),
            "traces_removed": report["distributed"]["traces_removed"],
            "gathered": report["distributed"]["gathered"],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 8, 64, 256])
    parser.add_argument("--real", type=int, nargs="*", default=[])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    options = AnalysisOptions.load()
    _, per_trace_s = _first_rank_analysis(options)
    results = {"per_trace_analysis_ms": round(per_trace_s * 1000, 1), "synthetic": [], "real": []}
    print(f"one rank's own analysis of its trace (tests/data/ddp_straggler_cpu rank 0): {per_trace_s * 1000:.1f} ms")
    print(f"{'ranks':>6} {'combine ms':>11} {'peak MiB':>9} {'KiB/rank':>9} {'old way ms (N traces)':>22} straggler")
    for n in args.ranks:
        row = measure_combine(n, options)
        results["synthetic"].append(row)
        print(
            f"{n:>6} {row['combine_ms']:>11.2f} {row['peak_mib']:>9.2f} {row['summary_kib_per_rank']:>9.2f} {per_trace_s * 1000 * n:>22.0f} {row['straggler']}"
        )
    for n in args.real:
        row = measure_real(n, options)
        results["real"].append(row)
        print(f"real {n} gloo ranks: {row}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
