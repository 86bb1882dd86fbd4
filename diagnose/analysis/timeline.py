"""Stage 3 of the pipeline: parse a torch.profiler (Kineto) Chrome trace into one ``Timeline``.

Contract: ``load_timeline(path) -> Timeline``. The JSON is read once and reduced, in one pass over
its events, to plain sorted lists of ``(start_us, end_us, ...)`` tuples: exactly what the
breakdown needs and nothing else. Later stages never see the raw events.

This module does not import torch: a trace can be analysed on a machine without it.
"""

from __future__ import annotations

import gc
import gzip
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from diagnose.analysis import patterns as P
from diagnose.errors import TraceError

try:  # orjson parses Kineto's JSON 2-3x faster than the standard library; it is optional.
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only where orjson is missing
    _orjson = None

import json as _json

Interval = tuple[float, float]

#: Refuse to parse a trace whose JSON is larger than this unless the caller raises the limit:
#: parsed Kineto JSON takes about 6-8x its size in memory.
DEFAULT_MAX_TRACE_BYTES = 2 * 1024**3


class StepMark(NamedTuple):
    """One training step as the trace marks it (a ``ProfilerStep#N`` annotation)."""

    number: int
    start: float
    end: float


class GpuKernel(NamedTuple):
    start: float
    end: float
    correlation: int
    name: str
    stream: int


class GpuMemcpy(NamedTuple):
    start: float
    end: float
    correlation: int
    kind: str  # see patterns.memcpy_kind
    nbytes: int


class HostOp(NamedTuple):
    """A top-level operator on the main thread (not nested inside another operator)."""

    start: float
    end: float
    name: str


class SyncCall(NamedTuple):
    """A CUDA call on the main thread that blocks the host until the GPU caught up."""

    start: float
    end: float
    name: str


@dataclass
class TraceMeta:
    path: str = ""
    size_bytes: int = 0
    device_name: str | None = None
    device_memory_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    num_sms: int | None = None
    cuda_driver_version: int | None = None
    cuda_runtime_version: int | None = None
    unknown_categories: dict[str, int] = field(default_factory=dict)
    event_count: int = 0


@dataclass
class Timeline:
    """Everything the breakdown reads from one trace, times in microseconds (trace clock)."""

    meta: TraceMeta
    main_tid: Any
    steps: list[StepMark]
    data_waits: list[Interval]
    optimizer_spans: list[Interval]
    backward_ops: list[Interval]
    forward_ops: list[Interval]
    host_ops: list[HostOp]
    syncs: list[SyncCall]
    #: correlation id -> host interval of the runtime call that launched the GPU work
    launches: dict[int, Interval]
    kernels: list[GpuKernel]
    memcpys: list[GpuMemcpy]
    memsets: list[Interval]
    #: CPU-side collectives in flight (gloo/MPI all-reduce ... annotations, any thread)
    collectives: list[Interval] = field(default_factory=list)
    #: DistributedDataParallel.forward ... on the main thread
    data_parallel_spans: list[Interval] = field(default_factory=list)
    #: host times of CUDA graph launches (torch.compile mode="reduce-overhead", CUDA graphs)
    graph_launches: list[float] = field(default_factory=list)
    #: user_annotation names other than the ones the analysis interprets (for display)
    annotations: Counter[str] = field(default_factory=Counter)
    #: ``ProfilerStep#N`` marks were found (otherwise ``steps`` holds one window over the trace)
    has_step_marks: bool = True
    #: DataLoader iterator kinds seen on the main thread ("single" process, "multi" process)
    dataloader_kinds: Counter[str] = field(default_factory=Counter)

    @property
    def has_gpu(self) -> bool:
        return bool(self.kernels or self.memcpys)

    def span(self) -> Interval:
        return (self.steps[0].start, self.steps[-1].end) if self.steps else (0.0, 0.0)


def read_trace_json(path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_TRACE_BYTES) -> dict[str, Any]:
    """Read a Chrome trace (``.json`` or ``.json.gz``) into a dict, with clear errors."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"no such trace file: {p}", hint="give the path of a .pt.trace.json(.gz) or a run directory")
    if not p.is_file():
        raise TraceError(f"not a file: {p}")
    size = p.stat().st_size
    if size == 0:
        raise TraceError(f"empty trace file: {p}", hint="the profiler wrote nothing; re-run the capture")
    gz = _is_gzip(p)
    raw_limit = max_bytes
    if not gz and size > raw_limit:
        raise TraceError(
            f"trace is {size / 1e9:.1f} GB, over the {raw_limit / 1e9:.1f} GB that fit in memory here",
            hint="profile fewer steps (diagnose run --steps 3) or raise the limit with --max-trace-gb",
        )
    try:
        if gz:
            with gzip.open(p, "rb") as fh:
                raw = _read_bounded(fh, raw_limit, p)
        else:
            raw = p.read_bytes()
    except (OSError, EOFError) as exc:
        raise TraceError(f"cannot read {p}: {exc}", hint="the file may be truncated or not gzip") from exc
    return parse_trace_bytes(raw, str(p))


def _is_gzip(p: Path) -> bool:
    with p.open("rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def _read_bounded(fh: io.BufferedIOBase | gzip.GzipFile, limit: int, p: Path) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = fh.read(64 * 1024 * 1024)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            raise TraceError(
                f"trace {p} expands to more than {limit / 1e9:.1f} GB of JSON, over what fits in memory here",
                hint="profile fewer steps (diagnose run --steps 3) or raise the limit with --max-trace-gb",
            )
        chunks.append(chunk)


def parse_trace_bytes(raw: bytes, origin: str = "<trace>") -> dict[str, Any]:
    """Parse JSON bytes. The collector is paused while parsing: the parser allocates millions of
    small objects and none is garbage, so every collection it would trigger is wasted work."""
    try:
        with paused_gc():
            data = _orjson.loads(raw) if _orjson is not None else _json.loads(raw)
    except ValueError as exc:
        raise TraceError(
            f"{origin} is not valid JSON ({str(exc).splitlines()[0]})",
            hint="the trace may be truncated: was the profiled process killed while writing it?",
        ) from exc
    if isinstance(data, list):  # a bare Chrome trace array
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{origin} is JSON but not a Chrome trace (no traceEvents list)")
    return data


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector. A parsed trace is millions of small objects, none of
    them garbage; with the collector on, every allocation burst re-scans all of them (this alone
    made the analysis 2-3x slower)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_timeline(path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_TRACE_BYTES) -> Timeline:
    with paused_gc():
        data = read_trace_json(path, max_bytes=max_bytes)
        timeline = build_timeline(data)
        del data
    timeline.meta.path = str(path)
    timeline.meta.size_bytes = Path(path).stat().st_size
    return timeline


def build_timeline(data: dict[str, Any]) -> Timeline:
    """Reduce a parsed trace to a Timeline. One pass buckets the events; small passes follow."""
    events = data["traceEvents"]
    meta = _read_meta(data)
    meta.event_count = len(events)

    annotations: list[dict[str, Any]] = []
    cpu_ops: list[dict[str, Any]] = []
    runtime: list[dict[str, Any]] = []
    kernels_raw: list[dict[str, Any]] = []
    memcpy_raw: list[dict[str, Any]] = []
    memset_raw: list[dict[str, Any]] = []
    flows: list[dict[str, Any]] = []
    ignored: list[dict[str, Any]] = []
    unsorted: list[dict[str, Any]] = []
    buckets: dict[Any, list[dict[str, Any]]] = {
        "cpu_op": cpu_ops,
        "kernel": kernels_raw,
        "cuda_runtime": runtime,
        "cuda_driver": runtime,
        "user_annotation": annotations,
        "gpu_memcpy": memcpy_raw,
        "gpu_memset": memset_raw,
        "fwdbwd": flows,
    }
    for cat in P.KNOWN_CATEGORIES:
        buckets.setdefault(cat, ignored)
    buckets[None] = ignored
    for cat, mapped in P.LEGACY_CATEGORIES.items():
        buckets.setdefault(cat, buckets.get(mapped, ignored))
    bucket_of = buckets.get

    for e in events:  # the hot loop: one dict lookup and one append per event
        try:
            bucket = bucket_of(e.get("cat"), unsorted)
        except (AttributeError, TypeError):  # not an object, or an unhashable category
            continue
        bucket.append(e)
    ignored.clear()
    unknown: Counter[str] = Counter(str(e.get("cat")) for e in unsorted)
    forward_flow_starts = {(e.get("tid"), e.get("ts")) for e in flows if e.get("ph") == "s"}
    meta.unknown_categories = dict(unknown)

    main_tid = _main_thread(annotations, cpu_ops)
    read = _read_annotations(annotations, main_tid)
    steps = read.steps

    main_ops: list[tuple[float, float, str, bool]] = []
    backward_ops: list[Interval] = []
    bw_prefix = P.BACKWARD_OP_PREFIX
    for e in cpu_ops:
        name = e.get("name", "")
        tid = e.get("tid")
        if tid == main_tid or name.startswith(bw_prefix):
            ts = _num(e.get("ts"))
            end = ts + _num(e.get("dur"))
            if name.startswith(bw_prefix):
                backward_ops.append((ts, end))
            if tid == main_tid and e.get("ph", "X") == "X":
                main_ops.append((ts, end, name, (tid, e.get("ts")) in forward_flow_starts))
    main_ops.sort(key=lambda op: (op[0], -op[1]))
    backward_ops.sort()

    host_ops: list[HostOp] = []
    forward_ops: list[Interval] = []
    top_end = float("-inf")
    for start, end, name, is_forward in main_ops:
        if is_forward:
            forward_ops.append((start, end))
        if start >= top_end:
            host_ops.append(HostOp(start, end, name))
            top_end = end
        # nested operators stay inside their top-level parent

    launches: dict[int, Interval] = {}
    syncs: list[SyncCall] = []
    graph_launches: list[float] = []
    sync_names = P.SYNC_CALLS
    for e in runtime:
        args = e.get("args") or {}
        corr = args.get("correlation")
        ts = _num(e.get("ts"))
        end = ts + _num(e.get("dur"))
        if corr is not None:
            launches[corr] = (ts, end)
        name = e.get("name", "")
        if name in sync_names and e.get("tid") == main_tid:
            syncs.append(SyncCall(ts, end, name))
        elif name == "cudaGraphLaunch" or name == "cuGraphLaunch":
            graph_launches.append(ts)
    syncs.sort(key=lambda s: s.start)

    device = _main_device(kernels_raw)
    kernels: list[GpuKernel] = []
    for e in kernels_raw:
        args = e.get("args") or {}
        if device is not None and args.get("device", device) != device:
            continue
        ts = _num(e.get("ts"))
        kernels.append(
            GpuKernel(ts, ts + _num(e.get("dur")), args.get("correlation", -1), e.get("name", ""), args.get("stream", 0))
        )
    kernels.sort(key=lambda k: k.start)
    memcpys: list[GpuMemcpy] = []
    for e in memcpy_raw:
        args = e.get("args") or {}
        if device is not None and args.get("device", device) != device:
            continue
        ts = _num(e.get("ts"))
        memcpys.append(
            GpuMemcpy(
                ts,
                ts + _num(e.get("dur")),
                args.get("correlation", -1),
                P.memcpy_kind(e.get("name", "")),
                int(_num(args.get("bytes"))),
            )
        )
    memcpys.sort(key=lambda m: m.start)
    memsets = sorted((_num(e.get("ts")), _num(e.get("ts")) + _num(e.get("dur"))) for e in memset_raw)

    has_marks = bool(steps)
    if not steps:
        steps = _whole_window(main_ops, kernels, memcpys)

    return Timeline(
        meta=meta,
        main_tid=main_tid,
        steps=steps,
        data_waits=read.data_waits,
        optimizer_spans=read.optimizer_spans,
        backward_ops=backward_ops,
        forward_ops=forward_ops,
        host_ops=host_ops,
        syncs=syncs,
        launches=launches,
        graph_launches=sorted(graph_launches),
        collectives=read.collectives,
        data_parallel_spans=read.data_parallel,
        kernels=kernels,
        memcpys=memcpys,
        memsets=memsets,
        annotations=read.other,
        has_step_marks=has_marks,
        dataloader_kinds=read.loader_kinds,
    )


def _num(value: Any) -> float:
    if type(value) is float:
        return value
    if value is None:
        return 0.0
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _read_meta(data: dict[str, Any]) -> TraceMeta:
    meta = TraceMeta()
    props = data.get("deviceProperties") or []
    if props and isinstance(props, list) and isinstance(props[0], dict):
        first = props[0]
        meta.device_name = first.get("name")
        mem = first.get("totalGlobalMem")
        meta.device_memory_bytes = int(mem) if mem else None
        if first.get("computeMajor") is not None:
            meta.compute_capability = (int(first.get("computeMajor", 0)), int(first.get("computeMinor", 0)))
        meta.num_sms = first.get("numSms")
    meta.cuda_driver_version = data.get("cuda_driver_version")
    meta.cuda_runtime_version = data.get("cuda_runtime_version")
    return meta


def _main_thread(annotations: list[dict[str, Any]], cpu_ops: list[dict[str, Any]]) -> Any:
    """The thread that runs the training loop: the one with ProfilerStep marks, else the busiest."""
    step_threads = Counter(e.get("tid") for e in annotations if e.get("name", "").startswith(P.PROFILER_STEP_PREFIX))
    if step_threads:
        return step_threads.most_common(1)[0][0]
    busy: Counter[Any] = Counter()
    for e in cpu_ops:
        if not e.get("name", "").startswith(P.BACKWARD_OP_PREFIX):
            busy[e.get("tid")] += 1
    for e in annotations:
        busy[e.get("tid")] += 1
    return busy.most_common(1)[0][0] if busy else None


class _Annotations(NamedTuple):
    steps: list[StepMark]
    other: Counter[str]
    data_waits: list[Interval]
    optimizer_spans: list[Interval]
    loader_kinds: Counter[str]
    collectives: list[Interval]
    data_parallel: list[Interval]


def _read_annotations(annotations: list[dict[str, Any]], main_tid: Any) -> _Annotations:
    steps: list[StepMark] = []
    collectives: list[Interval] = []
    data_parallel: list[Interval] = []
    other: Counter[str] = Counter()
    loader_kinds: Counter[str] = Counter()
    data_waits: list[Interval] = []
    optimizer_spans: list[Interval] = []
    for e in annotations:
        name = e.get("name", "")
        ts = _num(e.get("ts"))
        end = ts + _num(e.get("dur"))
        on_main = e.get("tid") == main_tid
        if name.startswith(P.PROFILER_STEP_PREFIX):
            if on_main:
                try:
                    number = int(name[len(P.PROFILER_STEP_PREFIX) :])
                except ValueError:
                    number = len(steps)
                steps.append(StepMark(number, ts, end))
        elif name.startswith(P.DATALOADER_PREFIX):
            if on_main:
                data_waits.append((ts, end))
                loader_kinds["multi" if "MultiProcessing" in name else "single"] += 1
        elif name.startswith(P.OPTIMIZER_STEP_PREFIX) or name.startswith(P.OPTIMIZER_ZERO_GRAD_PREFIX):
            if on_main:
                optimizer_spans.append((ts, end))
        elif name.startswith(P.CPU_COLLECTIVE_PREFIXES):
            collectives.append((ts, end))
        elif name.startswith(P.DATA_PARALLEL_PREFIXES) and on_main:
            data_parallel.append((ts, end))
        else:
            other[name] += 1
    steps.sort(key=lambda s: s.start)
    # A step the profiler closed early (the last one of a window cut by an exception) can overlap
    # the next; clip so that steps tile the time line.
    for i in range(len(steps) - 1):
        if steps[i].end > steps[i + 1].start:
            steps[i] = StepMark(steps[i].number, steps[i].start, steps[i + 1].start)
    steps = [s for s in steps if s.end > s.start]
    return _Annotations(steps, other, sorted(data_waits), sorted(optimizer_spans), loader_kinds, sorted(collectives), sorted(data_parallel))


def _main_device(kernels_raw: list[dict[str, Any]]) -> Any:
    devices = Counter((e.get("args") or {}).get("device") for e in kernels_raw)
    return devices.most_common(1)[0][0] if devices else None


def _whole_window(
    main_ops: list[tuple[float, float, str, bool]], kernels: list[GpuKernel], memcpys: list[GpuMemcpy]
) -> list[StepMark]:
    starts = [op[0] for op in main_ops[:1]] + [k.start for k in kernels[:1]] + [m.start for m in memcpys[:1]]
    ends = [max((op[1] for op in main_ops), default=float("-inf"))]
    ends += [max((k.end for k in kernels), default=float("-inf")), max((m.end for m in memcpys), default=float("-inf"))]
    if not starts:
        return []
    start, end = min(starts), max(ends)
    return [StepMark(0, start, end)] if end > start else []
