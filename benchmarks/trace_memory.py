"""Time and peak memory of diagnose's analysis on large traces, beside ``json.load`` of the same file.

    python benchmarks/trace_memory.py                        # 0.2, 1, 2, 5 and 10 GB
    python benchmarks/trace_memory.py --gb 0.2 1 --json-load-up-to 2
    python benchmarks/trace_memory.py --gb 1 --gzip          # the same trace gzipped
    python benchmarks/trace_memory.py --gb 1 --workers 1     # the reader in one process
    python benchmarks/trace_memory.py --gb 2 --read-only     # the reader and json.load only
    python benchmarks/trace_memory.py --build-only big.pt.trace.json --gb 1
    python benchmarks/trace_memory.py --gb 0.2 1 --repeats 5     # medians of 5 interleaved runs each

Each synthetic trace replicates the recorded step of tests/data/forloop_optimizer (an H200 step of
the for-loop optimizer: thousands of kernels and runtime calls), with fresh timestamps, correlation
ids, flow ids and step numbers for every copy, written in Kineto's layout (one event per object,
one per line) until the file reaches the size asked for. It is written a step at a time, so that
building a 10 GB trace takes little memory.

Each measurement runs in a child process: its time is wall-clock from start to exit, its CPU time
that of the child and its worker processes, its peak memory the largest total resident set of the
child and its descendants (sampled every 20 ms from /proc, and the kernel's own maximum from
wait4, whichever is larger; forked workers' shared pages count once per process, an upper bound).
"read" is ``load_timeline`` alone (the streaming reader: JSON to the Timeline's columns);
"diagnose" is the whole of ``diagnose analyze`` before rendering (read, timeline, breakdown,
replay model, symptoms, rules, report). ``--workers N`` sets DIAGNOSE_READER_WORKERS for both
(default: the reader's own choice, by the machine's cores and the trace's size).
``json.load`` is skipped above --json-load-up-to GB: it takes 5-6x the file's size in memory, and
the child is refused more than --json-load-limit-gb of address space so that a machine shared with
other work is not pushed into swapping; a refusal is printed as "out of memory".
Each trace is deleted after it is measured.

The children import what an installed package would: diagnose's bytecode is written first
(``compileall``; an environment with PYTHONDONTWRITEBYTECODE would otherwise compile every module
in every child, 0.1 s), and a numpy without bytecode (the device machines' image: 0.25-0.45 s an
import instead of 0.13) is named on stderr: compile it once as the message says.
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import descendants  # noqa: E402

FIXTURE = REPO / "tests" / "data" / "forloop_optimizer"
#: correlation and flow ids of copy k are shifted by k * ID_STRIDE (the fixture's stay below it)
ID_STRIDE = 10_000_000


def _fixture_events() -> tuple[dict, list[dict], list[dict]]:
    (source,) = FIXTURE.glob("*.pt.trace.json.gz")
    data = orjson.loads(gzip.decompress(source.read_bytes()))
    events = data.pop("traceEvents")
    metadata = [e for e in events if e.get("ph") == "M"]
    timed = [e for e in events if e.get("ph") != "M" and "ts" in e]
    return data, metadata, timed


def _copy(e: dict, k: int, shift: float) -> dict:
    c = dict(e)
    c["ts"] = e["ts"] + shift
    if "args" in e and "correlation" in e["args"]:
        c["args"] = dict(e["args"], correlation=e["args"]["correlation"] + k * ID_STRIDE)
    if "id" in e:
        c["id"] = e["id"] + k * ID_STRIDE
    if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#"):
        c["name"] = f"ProfilerStep#{k}"
    return c


def _kineto_event(e: dict) -> bytes:
    """One event the way Kineto writes it: an object on its own lines, ", " and ": " separators."""
    body = orjson.dumps(e).decode()
    return ("  " + body.replace('","', '", "').replace('":', '": ')).encode()


def build_trace(target_bytes: int, path: Path, compress: bool = False) -> int:
    """Write a trace of at least ``target_bytes`` of JSON to ``path``; returns the events written."""
    header, metadata, timed = _fixture_events()
    start = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - start + 1000.0
    opener = (lambda p: gzip.open(p, "wb", compresslevel=1)) if compress else (lambda p: open(p, "wb"))  # noqa: SIM115 - the caller's with closes it
    written = 0
    events = 0
    with opener(path) as out:
        head = orjson.dumps(header, option=orjson.OPT_INDENT_2)[:-2] + b',\n  "traceEvents": [\n'
        out.write(head)
        written += len(head)
        first = True
        for e in metadata:
            piece = (b"" if first else b",\n") + _kineto_event(e)
            out.write(piece)
            written += len(piece)
            first = False
            events += 1
        k = 0
        while written < target_bytes:
            piece = b",\n" + b",\n".join(_kineto_event(_copy(e, k, k * span)) for e in timed)
            out.write(piece)
            written += len(piece)
            events += len(timed)
            k += 1
        tail = b"\n  ]\n}\n"
        out.write(tail)
    return events


@dataclass
class Measured:
    seconds: float
    cpu_seconds: float  # user + system time of the child and its waited-for descendants
    peak_rss_bytes: int
    returncode: int
    output: str


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every descendant (worker processes count too)."""
    total = 0
    for p in descendants(pid):
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            continue
    return total


def measure(code: str, trace: Path, address_limit_bytes: int | None = None, workers: int | None = None) -> Measured:
    """Run ``code`` (``TRACE`` bound to the trace's path) in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if workers is not None:
        env["DIAGNOSE_READER_WORKERS"] = str(workers)

    def limit() -> None:
        if address_limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_limit_bytes, address_limit_bytes))

    program = f"from pathlib import Path\nTRACE = Path({str(trace)!r})\n{code}"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", program],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=limit,
    )
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss(proc.pid))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Measured(
        seconds, usage.ru_utime + usage.ru_stime, max(peak, usage.ru_maxrss * 1024), proc.returncode, output
    )


JSON_LOAD = """
import gzip, json
opener = gzip.open if TRACE.name.endswith(".gz") else open
with opener(TRACE, "rb") as fh:
    data = json.load(fh)
print(len(data["traceEvents"]), "events")
"""

READ = """
from diagnose.analysis.trace.timeline import load_timeline
timeline = load_timeline(TRACE)
print(timeline.meta.event_count, "events,", len(timeline.kernels), "kernels")
"""

DIAGNOSE = """
from diagnose.analysis.pipeline import AnalysisOptions, analyze_trace
report = analyze_trace(TRACE, AnalysisOptions.load())
print(report.source.get("trace_events", 0), "events,", len(report.breakdown["steps"]), "steps")
"""


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, nargs="+", default=[0.2, 1, 2, 5, 10], help="trace sizes, in GB of JSON")
    p.add_argument("--gzip", action="store_true", help="write the traces gzipped (the size is still that of the JSON)")
    p.add_argument("--json-load-up-to", type=float, default=2.0, help="measure json.load only up to this size (GB)")
    p.add_argument("--json-load-limit-gb", type=float, default=16.0, help="address space json.load's child may take")
    p.add_argument("--dir", type=Path, default=None, help="where to write the traces (default: a temporary folder)")
    p.add_argument(
        "--read-only", action="store_true", help="measure the reader (and json.load), not the whole analysis"
    )
    p.add_argument("--workers", type=int, default=None, help="reader worker processes (default: the reader's choice)")
    p.add_argument("--build-only", type=Path, default=None, help="write one trace of the first --gb size here and stop")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="measure each N times, interleaved (json.load, read, diagnose, ...): medians, "
        "the largest peak, and the range of the per-repeat ratios in brackets",
    )
    args = p.parse_args()
    if args.build_only is not None:
        events = build_trace(int(args.gb[0] * 1e9), args.build_only, args.gzip)
        print(f"wrote {args.build_only}: {events:,} events, {args.build_only.stat().st_size / 1e9:.2f} GB")
        return
    _bytecode()
    print(f"{os.cpu_count()} cores; reader workers: {args.workers or 'automatic'}", flush=True)
    print(
        "| JSON | file | events | json.load time (CPU) | json.load peak | read time (CPU) | read peak "
        "| diagnose time (CPU) | diagnose peak | read / json.load (CPU) | diagnose / json.load (CPU) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for gb in args.gb:
            trace = Path(tmp) / ("bench.pt.trace.json" + (".gz" if args.gzip else ""))
            events = build_trace(int(gb * 1e9), trace, args.gzip)
            file_size = trace.stat().st_size
            try:
                reads, ourss, theirss = [], [], []
                for _ in range(max(1, args.repeats)):
                    if gb <= args.json_load_up_to:
                        theirss.append(measure(JSON_LOAD, trace, int(args.json_load_limit_gb * 2**30)))
                    reads.append(measure(READ, trace, workers=args.workers))
                    if not args.read_only:
                        ourss.append(measure(DIAGNOSE, trace, workers=args.workers))
                for name, runs in (("read", reads), ("diagnose", ourss)):
                    for m in runs:
                        if m.returncode != 0:
                            print(f"{name} failed on {gb} GB:\n{m.output}", file=sys.stderr)
                read, ours = _median(reads), _median(ourss) if ourss else None
                load_time, load_peak, read_ratio, ratio = "not run", "", "", ""
                if theirss and all(m.returncode == 0 for m in theirss):
                    theirs = _median(theirss)
                    load_time, load_peak = _time(theirs), _gib(theirs.peak_rss_bytes)
                    read_ratio = _ratio(read, theirs, reads, theirss)
                    ratio = "" if ours is None else _ratio(ours, theirs, ourss, theirss)
                elif theirss:
                    load_time, load_peak = "out of memory", f"> {args.json_load_limit_gb:.0f} GiB"
                print(
                    f"| {gb:g} GB | {file_size / 1e9:.2f} GB | {events:,} | {load_time} | {load_peak} "
                    f"| {_time(read)} | {_gib(read.peak_rss_bytes)} "
                    f"| {'not run' if ours is None else _time(ours)} | {'' if ours is None else _gib(ours.peak_rss_bytes)} "
                    f"| {read_ratio} | {ratio} |",
                    flush=True,
                )
            finally:
                trace.unlink(missing_ok=True)


def _bytecode() -> None:
    """diagnose's modules compiled as an install has them; a numpy without bytecode named."""
    import compileall
    import importlib.util

    compileall.compile_dir(REPO / "diagnose", quiet=1)
    spec = importlib.util.find_spec("numpy")
    if spec is not None and spec.origin and not (Path(spec.origin).parent / "__pycache__").is_dir():
        folder = Path(spec.origin).parent
        print(
            f"numpy at {folder} has no bytecode: each child compiles it (0.1-0.3 s); run python -m compileall -q {folder}",
            file=sys.stderr,
        )


def _time(m: Measured) -> str:
    return f"{m.seconds:.1f} s ({m.cpu_seconds:.1f} s)"


def _median(runs: list[Measured]) -> Measured:
    """The median time and CPU time of ``runs`` (each on its own), the largest peak."""
    return Measured(
        statistics.median(m.seconds for m in runs),
        statistics.median(m.cpu_seconds for m in runs),
        max(m.peak_rss_bytes for m in runs),
        max(m.returncode for m in runs),
        runs[-1].output,
    )


def _ratio(ours: Measured, theirs: Measured, our_runs: list[Measured], their_runs: list[Measured]) -> str:
    text = f"{ours.seconds / theirs.seconds:.2f}x ({ours.cpu_seconds / theirs.cpu_seconds:.2f}x)"
    if len(our_runs) > 1 and len(our_runs) == len(their_runs):  # each repeat's ratio: json.load ran just before
        each = [a.seconds / b.seconds for a, b in zip(our_runs, their_runs, strict=True)]
        text += f" [{min(each):.2f}-{max(each):.2f}]"
    return text


if __name__ == "__main__":
    main()
