"""How fast is the analysis, against reading the same JSON with the standard library?

    python benchmarks/analysis_speed.py                       # a 50 MB trace built from a fixture
    python benchmarks/analysis_speed.py --trace big.pt.trace.json --repeat 5
    python benchmarks/analysis_speed.py --gzip --mb 64            # the same trace gzipped, beside it
    python benchmarks/analysis_speed.py --gzip --mb 64 --blob-mb 48   # one event of 48 MB among them

The target (issue 2): analysing a 50 MB trace takes at most 1.3x the time of ``json.load`` of
that file on the same machine. "Analysing" is the whole path of ``diagnose analyze``: read and
parse, timeline, breakdown, symptoms, rules, report (not the rendering). Without --trace, the
recorded H200 fixture of the for-loop optimizer (one step, thousands of kernels) is repeated,
shifted in time with its ids renumbered, until the JSON reaches --mb megabytes.

``--gzip`` also analyses the trace gzipped (level 6, as diagnose writes its traces) and prints the
time against the plain file's: reading a ``.gz`` should cost a constant factor of the plain read,
whatever the trace's size or shape (issue 38: a 256 MB trace took 31 s gzipped against 2.6 s
plain). ``--blob-mb N`` adds one event whose ``args`` hold N MB of text (incompressible: hex
digits), the shape that made the gzipped read quadratic: an event longer than a block is carried
from block to block (run it at two sizes to see how the time grows).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import random
import shutil
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


def add_blob(path: Path, blob_bytes: int) -> None:
    """One event of ``blob_bytes`` of hex digits (in its args), placed in the trace's first step."""
    data = json.loads(path.read_bytes())
    start = min(e["ts"] for e in data["traceEvents"] if "ts" in e and e.get("ph") != "M")
    marker = "@BLOB@"
    data["traceEvents"].insert(
        1,
        {
            "ph": "X",
            "cat": "benchmark_blob",
            "name": "blob",
            "pid": 1,
            "tid": 1,
            "ts": start,
            "dur": 0,
            "args": {"blob": marker},
        },
    )
    head, tail = json.dumps(data).encode().split(marker.encode())
    digits = random.Random(0).randbytes(1 << 20).hex().encode()[: 1 << 20]
    with path.open("wb") as out:
        out.write(head)
        for _ in range(blob_bytes >> 20):
            out.write(digits)
        out.write(tail)


def gzipped(path: Path) -> Path:
    target = path.with_name(path.name + ".gz")
    with path.open("rb") as src, gzip.open(target, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 16 << 20)
    return target


def best(fn, repeat: int) -> float:
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
    p.add_argument("--gzip", action="store_true", help="also analyse the trace gzipped, and compare")
    p.add_argument("--blob-mb", type=int, default=0, help="add one event of this many MB (built trace only)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace or build_trace(int(args.mb * 1e6), Path(tmp) / "bench.pt.trace.json")
        if args.blob_mb and not args.trace:
            add_blob(trace, args.blob_mb << 20)
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
        print(
            f"trace: {size / 1e6:.1f} MB, {report.source.get('trace_events', 0):,} events, {len(report.breakdown['steps'])} steps"
        )
        print(f"json.load:          best {load_best:.3f} s, median {load_median:.3f} s")
        print(f"diagnose analysis:  best {analyse_best:.3f} s, median {analyse_median:.3f} s  (parser: {parser})")
        print(f"ratio (best/best):  {analyse_best / load_best:.2f}x   target <= 1.3x")
        if args.gzip:
            packed = gzipped(trace) if not trace.name.endswith(".gz") else trace
            gz_best, gz_median = best(lambda: analyze_trace(packed, options), args.repeat)
            print(
                f"gzipped:            {packed.stat().st_size / 1e6:.1f} MB, analysis best {gz_best:.3f} s, median {gz_median:.3f} s"
            )
            print(
                f"gzipped / plain:    {gz_best / analyse_best:.2f}x (best/best); {gz_best / size * 1e9:.2f} s a GB of JSON"
            )


if __name__ == "__main__":
    main()
