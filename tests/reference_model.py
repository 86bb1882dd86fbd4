"""The replay model's builder as it was before its per-op loops were vectorised, kept as the
reference that tests/test_replay.py compares ``replay.build_model`` with, fixture by fixture
(every field of every op and host item). Not used by diagnose itself."""

from __future__ import annotations

import statistics
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

from diagnose.analysis.measure.breakdown import merge
from diagnose.analysis.prediction.replay import (
    MODEL_MAX_OPS,
    STREAM_GAP_US,
    GpuOp,
    HostItem,
    StepModel,
    _busy_before,
    _host_labels,
    _inside,
    _Labeller,
    _starting_before,
    model_steps,
    step_model,
    stream_ends,
)
from diagnose.analysis.trace import columns as C
from diagnose.analysis.trace.timeline import Timeline


def build_model(timeline: Timeline) -> StepModel | None:
    """The window's dependency model; None without steps or GPU work."""
    if not timeline.steps or not timeline.has_gpu:
        return None
    steps = model_steps(timeline, MODEL_MAX_OPS)
    w0, w1 = steps[0].start, steps[-1].end
    labeller = _Labeller(_host_labels(timeline))

    # every GPU activity up to the model's end, per stream in start order:
    # (start, end, kind, name, corr, copy_kind, nbytes)
    raw: list[tuple[float, float, str, str, int, int, str, int]] = []
    for k in _starting_before(timeline.kernels, w1):
        raw.append((k.start, k.end, "kernel", k.name, k.correlation, k.stream, "", 0))
    for m in _starting_before(timeline.memcpys, w1):
        raw.append((m.start, m.end, "memcpy", f"Memcpy {m.kind}", m.correlation, m.stream, m.kind, m.nbytes))
    for s in _starting_before(timeline.memset_ops, w1):
        raw.append((s.start, s.end, "memset", "Memset", s.correlation, s.stream, "", 0))
    raw.sort(key=lambda r: (r[0], r[1]))

    stream_busy: dict[int, float] = {}
    in_model: list[tuple[float, float, str, str, int, int, str, int, float]] = []  # + measured prev end
    for r in raw:
        start, end, stream = r[0], r[1], r[5]
        prev_end = stream_busy.get(stream, float("-inf"))
        if w0 <= start < w1:
            in_model.append((*r, prev_end))
        elif start < w0:
            stream_busy[stream] = max(prev_end, end)
            continue
        stream_busy[stream] = max(prev_end, end)
    busy_before = _busy_before(timeline, w0)
    # each op's launch (None where the trace holds none), looked up once per correlation id
    corrs = {r[4] for r in in_model}
    every = timeline.launches
    launches = every.many(corrs) if isinstance(every, C.Launches) else {corr: every.get(corr) for corr in corrs}

    # launch latency of the trace: median delay of ops that waited for their launch
    waited = []
    for start, _end, _k, _n, corr, _s, _ck, _b, prev_end in in_model:
        launch = launches.get(corr)
        # waited for its launch: started well after its stream went idle, and the stream was
        # idle when it was launched (else it waited on the GPU, however long after its launch)
        if launch is not None and w0 <= launch[0] and start - prev_end > STREAM_GAP_US and prev_end <= launch[0]:
            waited.append(start - launch[0])
    latency_cap = statistics.median(waited) if waited else STREAM_GAP_US
    back_to_back = [r[0] - r[-1] for r in in_model if 0 <= r[0] - r[-1] <= STREAM_GAP_US]
    gap_floor = statistics.median(back_to_back) if back_to_back else STREAM_GAP_US

    delays: list[float] = []
    ops: list[GpuOp] = []
    ops_of_corr: dict[int, list[int]] = defaultdict(list)
    for start, end, kind, name, corr, stream, copy_kind, nbytes, prev_end in in_model:
        launch = launches.get(corr)
        carried = None
        if launch is None or launch[0] < w0 or launch[0] >= w1:
            carried = launch[0] if launch is not None and launch[0] < w0 else w0
            ready, phase = carried, labeller.at(launch[0]) if launch is not None and launch[0] < w0 else "unknown"
        else:
            ready, phase = launch[0], labeller.at(launch[0])
        if phase in ("data_wait", "h2d_copy"):
            phase = "other"
        latency, gap = start - ready, start - prev_end
        delays.append(latency)
        if gap <= STREAM_GAP_US or prev_end > ready:
            # waited for the stream: right after its predecessor, or after a gap the GPU set (its
            # stream was still busy when it was launched: a cross-stream wait, the GPU's own
            # scheduling), which stays as measured
            latency = min(latency, latency_cap)
        else:
            gap = gap_floor
        ops.append(GpuOp(stream, end - start, kind, name, phase, latency, gap, carried, copy_kind, nbytes, end > w1))
        if carried is None:
            ops_of_corr[corr].append(len(ops) - 1)

    items = _host_items(
        timeline, w0, w1, labeller, launches, ops_of_corr, ops, [r[0] for r in in_model], [r[1] for r in in_model]
    )
    nonblocking = [it.duration_us for it in items if it.kind == "launch" and not it.blocking]
    return step_model(timeline, steps, items, ops, busy_before, latency_cap, nonblocking, delays)


def _host_items(
    timeline: Timeline,
    w0: float,
    w1: float,
    labeller: _Labeller,
    launches: Mapping[Any, tuple[float, float] | None],
    ops_of_corr: dict[int, list[int]],
    ops: list[GpuOp],
    op_starts: list[float],
    op_ends: list[float],
) -> list[HostItem]:
    # (start, end, "launch"|"sync", payload)
    calls: list[tuple[float, float, str, Any]] = [
        (*launches[corr], "launch", tuple(indices)) for corr, indices in ops_of_corr.items()
    ]  # type: ignore[misc]
    syncs = [s for s in timeline.syncs if w0 <= s.start < w1]
    if syncs:
        launch_spans = {(c[0], c[1]) for c in calls}
        h2d = labeller.labels["h2d_copy"]
        data_parallel = merge(timeline.data_parallel_spans)
        for s in syncs:
            if (s.start, s.end) not in launch_spans:
                kind = "staging" if _inside(h2d, s.start) else "comm" if _inside(data_parallel, s.start) else "user"
                calls.append((s.start, s.end, "sync", kind))
    waits = len(calls) > len(ops_of_corr)
    calls.sort(key=lambda c: (c[0], c[1]))

    fetch_at = labeller.fetch_at
    # measured end of the last op launched before time t, per stream (for the waits, if any)
    streams: list[int] = []
    if waits:
        launch_time_of_op = {index: launches[corr][0] for corr, indices in ops_of_corr.items() for index in indices}  # type: ignore[index]
        launched_at = [launch_time_of_op.get(index, float("-inf")) for index in range(len(ops))]
        streams, last_end_launched_before = stream_ends(timeline, w0, ops, launched_at, op_ends)
    items: list[HostItem] = []
    cursor = w0

    bounds = labeller.bounds

    def work(a: float, b: float) -> None:
        if bisect_right(bounds, a) == bisect_left(
            bounds, b
        ):  # one phase from a to b (the usual gap between two launches)
            if b > a:
                phase = labeller.at(a)
                items.append(HostItem("work", b - a, phase, fetch=fetch_at(a) if phase == "data_wait" else None))
            return
        cuts = labeller.cuts(a, b)
        for lo, hi in pairwise(cuts):
            if hi > lo:
                phase = labeller.at(lo)
                items.append(HostItem("work", hi - lo, phase, fetch=fetch_at(lo) if phase == "data_wait" else None))

    for start, end, kind, payload in calls:
        if start > cursor:
            work(cursor, min(start, w1))
            cursor = min(start, w1)
        if start >= w1:
            break
        lead = cursor - start
        phase = labeller.at(start)
        if kind == "launch":
            indices = payload
            if len(indices) == 1:  # the usual launch
                blocking = ops[indices[0]].kind == "memcpy" and end >= op_ends[indices[0]]
            else:
                blocking = all(ops[i].kind == "memcpy" for i in indices) and end >= max(op_ends[i] for i in indices)
            if blocking:
                done = max(op_ends[i] for i in indices)
                items.append(
                    HostItem("launch", 0.0, phase, indices, lead, after_us=end - max(start, done), blocking=True)
                )
            else:
                items.append(HostItem("launch", max(0.0, end - cursor), phase, indices, lead))
        else:
            awaited = tuple(s for s in streams if last_end_launched_before(s, start) <= end + 1.0)
            done = max((last_end_launched_before(s, start) for s in awaited), default=float("-inf"))
            items.append(
                HostItem(
                    "wait",
                    0.0,
                    phase,
                    lead_us=lead,
                    streams=awaited,
                    after_us=end - max(start, done),
                    sync_kind=payload,
                )
            )
        cursor = max(cursor, end)
    if cursor < w1:
        work(cursor, w1)
    return items
