"""The trace reader as it was before streaming (whole JSON parsed into dicts, then reduced), kept
as the reference that tests/test_tracefile.py compares the streaming reader with, fixture by fixture.
Not used by diagnose itself."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from typing import Any, NamedTuple

from diagnose.analysis.trace import patterns as P
from diagnose.analysis.trace.timeline import (
    LONG_RUNTIME_CALL_US,
    TRIM_FORMAT_KEY,
    GpuKernel,
    GpuMemcpy,
    GpuMemset,
    HostOp,
    Interval,
    StepMark,
    SyncCall,
    Timeline,
    TraceMeta,
)


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
    # torch < 1.10 wrote its annotations as operators ("Operator"): annotations by name
    legacy = [
        e
        for e in cpu_ops
        if e.get("cat") in P.LEGACY_HOST_CATEGORIES and str(e.get("name", "")).startswith(P.LEGACY_ANNOTATION_PREFIXES)
    ]
    if legacy:
        marks = {id(e) for e in legacy}
        cpu_ops[:] = [e for e in cpu_ops if id(e) not in marks]
        annotations.extend(legacy)
    thread_names = {
        e.get("tid"): (e.get("args") or {}).get("name")
        for e in ignored
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    thread_names = {tid: name for tid, name in thread_names.items() if isinstance(name, str)}
    meta.other_device_events = dict(Counter(e.get("cat") for e in ignored if e.get("cat") in P.OTHER_DEVICE_CATEGORIES))
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
    training = {main_tid} | {e.get("tid") for e in cpu_ops if e.get("name", "").startswith(bw_prefix)}
    on_training = [e for e in cpu_ops if e.get("tid") in training]
    host_event_starts = sorted(
        _num(e.get("ts")) for e in on_training + [r for r in runtime if r.get("tid") in training]
    )
    collective_calls = sorted(
        {
            HostOp(_num(e.get("ts")), _num(e.get("ts")) + _num(e.get("dur")), e["name"])
            for e in on_training
            if e.get("name", "").startswith(P.COLLECTIVE_CALL_PREFIX)
        }
    )
    accumulate_grad_ops = sorted(
        {
            (_num(e.get("ts")), _num(e.get("ts")) + _num(e.get("dur")))
            for e in on_training
            if e.get("name") == P.ACCUMULATE_GRAD_OP
        }
    )
    no_work_op_us = []
    for e in on_training:
        if e.get("name") in P.NO_WORK_OPS:
            ts = _num(e.get("ts"))
            no_work_op_us.append(ts + _num(e.get("dur")) - ts)
    meta.optimizer_classes = dict(read.optimizer_classes)
    meta.optimizer_step_ops = [dict(c) for c in _ops_inside(main_ops, read.optimizer_steps)]
    meta.thread_names = {str(tid): name for tid, name in thread_names.items()}

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
    long_runtime_calls: list[Interval] = []
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
        if name not in sync_names and end - ts > LONG_RUNTIME_CALL_US and e.get("tid") in training:
            long_runtime_calls.append((ts, end))
    syncs.sort(key=lambda s: s.start)
    long_runtime_calls = sorted(set(long_runtime_calls))

    device = _main_device(kernels_raw)
    kernels: list[GpuKernel] = []
    for e in kernels_raw:
        args = e.get("args") or {}
        if device is not None and args.get("device", device) != device:
            continue
        ts = _num(e.get("ts"))
        kernels.append(
            GpuKernel(
                ts, ts + _num(e.get("dur")), args.get("correlation", -1), e.get("name", ""), args.get("stream", 0)
            )
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
                args.get("stream", 0),
            )
        )
    memcpys.sort(key=lambda m: m.start)
    memsets = sorted((_num(e.get("ts")), _num(e.get("ts")) + _num(e.get("dur"))) for e in memset_raw)
    memset_ops: list[GpuMemset] = []
    for e in memset_raw:
        args = e.get("args") or {}
        if device is not None and args.get("device", device) != device:
            continue
        ts = _num(e.get("ts"))
        memset_ops.append(GpuMemset(ts, ts + _num(e.get("dur")), args.get("correlation", -1), args.get("stream", 0)))
    memset_ops.sort(key=lambda m: m.start)

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
        collective_ops=read.collective_ops,
        collective_calls=collective_calls,
        data_parallel_spans=read.data_parallel,
        closure_spans=read.closures,
        kernels=kernels,
        memcpys=memcpys,
        memsets=memsets,
        annotations=read.other,
        has_step_marks=has_marks,
        dataloader_kinds=read.loader_kinds,
        memset_ops=memset_ops,
        host_event_starts=host_event_starts,
        no_work_op_us=no_work_op_us,
        accumulate_grad_ops=accumulate_grad_ops,
        long_runtime_calls=long_runtime_calls,
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
    dist = data.get("distributedInfo") or {}
    meta.rank, meta.world_size, meta.backend = dist.get("rank"), dist.get("world_size"), dist.get("backend")
    trim_format = data.get(TRIM_FORMAT_KEY)
    meta.trim_format = trim_format if isinstance(trim_format, int) else None
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
    optimizer_steps: list[Interval]
    optimizer_classes: Counter[str]
    collectives: list[Interval]
    data_parallel: list[Interval]
    closures: list[Interval]
    collective_ops: list[HostOp]


def _read_annotations(annotations: list[dict[str, Any]], main_tid: Any) -> _Annotations:
    steps: list[StepMark] = []
    collectives: list[Interval] = []
    collective_ops: list[HostOp] = []
    data_parallel: list[Interval] = []
    other: Counter[str] = Counter()
    loader_kinds: Counter[str] = Counter()
    data_waits: list[Interval] = []
    optimizer_spans: list[Interval] = []
    closure_spans: list[Interval] = []
    optimizer_steps: list[Interval] = []
    optimizer_classes: Counter[str] = Counter()
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
        elif name.startswith(P.OPTIMIZER_SIDE_PREFIXES):
            if on_main:
                optimizer_spans.append((ts, end))
                if name.startswith(P.OPTIMIZER_STEP_PREFIX):
                    optimizer_steps.append((ts, end))
                    optimizer_classes[name[len(P.OPTIMIZER_STEP_PREFIX) :].rsplit(".", 1)[0]] += 1
        elif name.startswith(P.OPTIMIZER_CLOSURE_PREFIX):
            if on_main:
                closure_spans.append((ts, end))
        elif name.startswith(P.CPU_COLLECTIVE_PREFIXES):
            collectives.append((ts, end))
            collective_ops.append(HostOp(ts, end, name))
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
    return _Annotations(
        steps,
        other,
        sorted(data_waits),
        sorted(optimizer_spans),
        loader_kinds,
        sorted(optimizer_steps),
        optimizer_classes,
        sorted(collectives),
        sorted(data_parallel),
        sorted(closure_spans),
        sorted(collective_ops),
    )


def _ops_inside(main_ops: list[tuple[float, float, str, bool]], spans: list[Interval]) -> list[Counter[str]]:
    out: list[Counter[str]] = []
    starts = [op[0] for op in main_ops]
    for start, end in spans:
        names: Counter[str] = Counter()
        i = bisect_left(starts, start)
        while i < len(main_ops) and main_ops[i][0] < end:
            names[main_ops[i][2]] += 1
            i += 1
        if names:
            out.append(names)
    return out


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
