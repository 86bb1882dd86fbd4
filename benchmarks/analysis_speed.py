"""How fast is the analysis, against reading the same JSON with the standard library?

    python benchmarks/analysis_speed.py                       # a 50 MB trace built from a fixture
    python benchmarks/analysis_speed.py --trace big.pt.trace.json --repeat 5

The target (issue 2): analysing a 50 MB trace takes at most 1.3x the time of ``json.load`` of
that file on the same machine. "Analysing" is the whole path of ``diagnose analyze``: read and
parse, timeline, breakdown, symptoms, rules, report (not the rendering). Without --trace, the
recorded H200 fixture of the for-loop optimizer (one step, thousands of kernels) is repeated,
shifted in time with its ids renumbered, until the JSON reaches --mb megabytes.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from diagnose.analysis.pipeline import AnalysisOptions, analyze_trace  # noqa: E402
from diagnose.analysis.trace.timeline import read_trace_json  # noqa: E402

FIXTURE = REPO / "tests" / "data" / "forloop_optimizer"


def build_trace(target_bytes: int, path: Path) -> Path:
    (source,) = FIXTURE.glob("*.pt.trace.json.gz")
    data = read_trace_json(source)
    events = data["traceEvents"]
    timed = [e for e in events if "ts" in e and e.get("ph") != "M"]
    start = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - start + 1000.0
    one_copy = len(json.dumps(events))
    copies = max(1, target_bytes // one_copy + 1)
    out = [e for e in events if e.get("ph") == "M"]
    for k in range(copies):
        for e in timed:
            c = dict(e)
            c["ts"] = e["ts"] + k * span
            if "args" in e:
                args = dict(e["args"])
                if "correlation" in args:
                    args["correlation"] = args["correlation"] + k * 10_000_000
                c["args"] = args
            if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#"):
                c["name"] = f"ProfilerStep#{k}"
            if "id" in e:
                c["id"] = e["id"] + k * 10_000_000
            out.append(c)
    data["traceEvents"] = out
    path.write_text(json.dumps(data))
    return path


def best(fn, repeat: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path)
    p.add_argument("--mb", type=float, default=50.0)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace or build_trace(int(args.mb * 1e6), Path(tmp) / "bench.pt.trace.json")
        size = trace.stat().st_size
        options = AnalysisOptions.load()

        def load() -> None:
            with trace.open() as fh:
                json.load(fh)

        def analyse() -> None:
            analyze_trace(trace, options)

        load_best, load_median = best(load, args.repeat)
        analyse_best, analyse_median = best(analyse, args.repeat)
        report = analyze_trace(trace, options)
        parser = "streamed pieces, msgspec"
        print(f"trace: {size / 1e6:.1f} MB, {report.source.get('trace_events', 0):,} events, {len(report.breakdown['steps'])} steps")
        print(f"json.load:          best {load_best:.3f} s, median {load_median:.3f} s")
        print(f"diagnose analysis:  best {analyse_best:.3f} s, median {analyse_median:.3f} s  (parser: {parser})")
        print(f"ratio (best/best):  {analyse_best / load_best:.2f}x   target <= 1.3x")


if __name__ == "__main__":
    main()
