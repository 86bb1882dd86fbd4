"""A dependency model of the profiled steps, and its replay (Daydream's idea, on a Kineto trace).

Contract: ``build_model(timeline) -> StepModel | None``; ``replay(model) -> Replay``; both pure,
no torch. ``predict.py`` transforms the model (model -> model) and replays it again.

The model of the profiled window (every ``ProfilerStep`` of the trace, end to end):

- the host is one sequence of ``HostItem``s in time order: plain host work (labelled by phase:
  data wait, host-to-device copy, forward, backward, optimizer, other; data waits carry the index
  of their fetch), the runtime calls that launched GPU work (tied to it through the correlation
  id, on whichever host thread they ran), and the calls that block the host until the GPU
  caught up (``cudaStreamSynchronize``, device and event syncs, blocking memcpys);
- the GPU is a set of ``GpuOp``s (kernels, copies, memsets), each on its stream. An op starts at
  ``max(its launch + latency, the previous op on its stream ends + gap)``. ``latency`` and
  ``gap`` are read off the trace so that the unchanged model replays exactly: an op that started
  right after its predecessor (within ``STREAM_GAP_US``) was waiting for the stream, and its
  latency is capped at the trace's own launch latency; any other op was waiting for its launch
  (or for another stream: a cross-stream event), and keeps its measured latency. The GPU gets
  an op near the end of its launch call, so the part of the latency spent inside the call is
  host code: when the replay speeds the host's code up, the op starts that much sooner;
- a blocking item ends at ``max(host, the awaited GPU work ends) + after``, ``after`` being what
  the call took once the GPU was done (host code: it scales with the host's model code). It waits on the streams whose work launched before it had
  ended when it returned (a stream sync leaves the other streams running).

GPU work already queued when the window opened (launched in an earlier step, or by a launch the
trace does not hold) is "carried in": ready at the window's start. When most of the window's GPU
work is carried in, the host runs ahead of the GPU and its launch calls wait for queue space: its
measured model-code time says nothing about what it costs. ``replay(model, host_code_scale=0)``
then replays the host's model code as free; ``replay_check`` says which replay the predictions
use, and how close each came to the measured window.

Why one module (about 880 lines): the model and its replay are one contract, ``build_model`` and
``replay`` must agree on every field of ``HostItem`` and ``GpuOp`` (tests/reference_model.py keeps
the per-op loops the building must equal), and the host-pace scales (``host_ahead_scale``,
``profiler_scale``, ``host_code_scale``) are read off a replay of the same model. The
transformations that change the model are ``predict.py``.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from itertools import compress, islice, pairwise, repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

from diagnose.analysis.measure.breakdown import (
    backward_spans,
    field_column,
    forward_spans,
    h2d_host_ops,
    merge,
    resolve_nesting,
)
from diagnose.analysis.measure.profcost import estimate_cost_per_event
from diagnose.analysis.trace import columns as C
from diagnose.analysis.trace.timeline import GpuKernel, GpuMemcpy, GpuMemset, Interval, Timeline

if TYPE_CHECKING:  # numpy is imported where it is used (through ``vectorized``), not when this module loads
    import numpy as np

#: An op that starts within this many microseconds of its stream predecessor's end was waiting
#: for the stream, not for its launch (back-to-back kernels on an H200 start 1-3 µs apart).
STREAM_GAP_US = 5.0
#: The replay must reproduce the measured window within this relative error (issue 16, item 1).
REPLAY_TOLERANCE = 0.05
#: Host phases whose time is model code (Python, dispatch, launches): elastic when the host runs
#: ahead of the GPU. Data waits, copies and syncs are not.
MODEL_CODE_PHASES = frozenset({"forward", "backward", "optimizer", "other"})

#: The host "runs ahead" when the GPU starts its work, at the median, this many steps after the
#: launch: the launch queue then holds that much work and back-pressure paces the host.
HOST_AHEAD_STEPS = 0.5

_HOST_PRIORITY = ("data_wait", "h2d_copy", "optimizer", "backward", "forward")


#: GpuOp and HostItem are values: nothing changes one in place (a transformation makes changed
#: copies with ``changed``). They are not frozen because a frozen dataclass sets each
#: field through ``object.__setattr__``: building one took 1.8 µs instead of 0.3, and a model
#: of a large window builds about 80,000 of them, its predictions as many again.
@dataclass(slots=True)
class GpuOp:
    """One kernel, copy or memset. Times in microseconds."""

    stream: int
    duration_us: float
    kind: str  # "kernel", "memcpy" or "memset"
    name: str
    #: the host phase that launched it ("forward", "backward", "optimizer", "other"; "unknown"
    #: when the trace does not hold its launch)
    phase: str
    #: least delay after its launch before it can start
    latency_us: float
    #: least gap after its stream predecessor ends
    gap_us: float
    #: absolute ready time when launched before the window (or by an unseen launch); else None
    carried_ready_us: float | None = None
    copy_kind: str = ""  # see patterns.memcpy_kind
    nbytes: int = 0
    #: still running when the measured window closed: the next window pays for it, not this one
    spills: bool = False


@dataclass(slots=True)
class HostItem:
    """One piece of the host's sequence.

    ``kind``: "work" (the host computes for ``duration_us``), "launch" (a runtime call that
    enqueues ``ops``; ``lead_us`` says how far before the host cursor it started, when it ran on
    another thread overlapping the previous item) or "wait" (a sync; a launch with ``blocking``
    also waits, for its own ops)."""

    kind: str
    duration_us: float
    phase: str
    ops: tuple[int, ...] = ()
    lead_us: float = 0.0
    #: waits only: streams awaited, and the time the call takes once the GPU is done
    streams: tuple[int, ...] = ()
    after_us: float = 0.0
    blocking: bool = False
    #: data waits: which fetch (0, 1, ...) of the window this wait belongs to
    fetch: int | None = None
    #: syncs: "user" (the script's), "staging" (inside a host-to-device copy), "comm" (DDP's)
    sync_kind: str = ""
    #: work that cannot end before this many microseconds after the window's start (a batch
    #: that the DataLoader's workers deliver at their own pace; set by a transformation)
    ready_us: float | None = None


_Value = TypeVar("_Value", GpuOp, HostItem)
_FIELDS: dict[type, tuple[Any, dict[str, int]]] = {
    cls: (attrgetter(*(f.name for f in fields(cls))), {f.name: i for i, f in enumerate(fields(cls))})
    for cls in (GpuOp, HostItem)
}


def changed(value: _Value, **changes: Any) -> _Value:
    """``dataclasses.replace`` for a ``GpuOp`` or a ``HostItem``, without its per-call
    introspection of the fields (a transformation changes tens of thousands of them: 1.1 µs
    each instead of 4; a loop that changes the same fields of many uses ``changer``)."""
    get, index = _FIELDS[type(value)]
    values = list(get(value))
    for name, new in changes.items():
        values[index[name]] = new
    return type(value)(*values)


def changer(cls: type[_Value], *names: str) -> Callable[..., _Value]:
    """``change(value, *new)``: a copy of ``value`` (a ``cls``) with the fields ``names`` set to
    ``new``, every other read off ``value``; written as source once (as dataclasses writes
    ``__init__``), it takes 0.4 µs a copy where ``changed`` takes 1.1 (its keywords and lookups)."""
    own = [f.name for f in fields(cls)]
    unknown = [name for name in names if name not in own]
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {unknown[0]!r}")
    args = ", ".join(f"new_{names.index(name)}" if name in names else f"value.{name}" for name in own)
    params = "".join(f", new_{i}" for i in range(len(names)))
    namespace: dict[str, Any] = {"cls": cls}
    exec(f"def change(value{params}):\n    return cls({args})\n", namespace)  # the class's own field names only
    return namespace["change"]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class StepModel:
    """The profiled window as a dependency model."""

    start_us: float
    measured_us: float
    step_durations_us: tuple[float, ...]
    items: tuple[HostItem, ...]
    ops: tuple[GpuOp, ...]
    #: per stream: busy until (absolute) with work that is not part of the model
    stream_busy_until: dict[int, float]
    #: the trace's launch latency (median over ops that waited for their launch)
    launch_latency_us: float
    #: median host time of a runtime call that launched work and did not block
    launch_cost_us: float
    device_name: str | None = None
    compute_capability: tuple[int, int] | None = None
    #: how far the host runs ahead of the GPU: the median delay from launch to start of the
    #: window's GPU work (work launched by an unseen call counts from the window's start)
    host_lead_us: float = 0.0
    #: samples per step relative to the measured run (a larger batch sets it above 1)
    batch_factor: float = 1.0
    #: host time of the autograd engine's AccumulateGrad nodes in the window (one per parameter
    #: tensor and step): backward host work that a compiled graph leaves outside
    accumulate_grad_us: float = 0.0
    #: how many AccumulateGrad nodes ran in the window (parameter tensors x steps)
    accumulate_grad_nodes: int = 0
    #: the autograd engine's own time between two backward nodes (the median gap between
    #: consecutive nodes on its thread): what each node costs beyond its recorded span
    engine_gap_us: float = 0.0
    #: events the profiler recorded on the training threads in the window, and what each cost
    #: the host (analysis/measure/profcost.py): the profiler's share of the traced host code where no
    #: steady step says it
    host_events: int = 0
    profiler_cost_us: float = 0.0
    #: where that cost came from: "read off the trace", "calibrated constant" or the recorded
    #: operators' median length where shorter (``profcost.ProfilerCost.source``)
    profiler_cost_source: str = ""
    #: the data waits are the main thread's own loading (a DataLoader without workers): traced
    #: code that the profiler slows as it slows the model's, scaled with it (``replay``)
    traced_fetches: bool = False
    #: per step: the time the training threads spent in runtime calls that waited for room in a
    #: full launch queue (or for pinned memory the GPU still held), beyond an unblocked call's
    #: cost (``Timeline.long_runtime_calls``): back-pressure, not host work
    blocked_us: tuple[float, ...] = ()

    @property
    def steps(self) -> int:
        return len(self.step_durations_us)

    def with_ops(self, ops: list[GpuOp] | tuple[GpuOp, ...]) -> StepModel:
        return replace(self, ops=tuple(ops))


@dataclass(frozen=True)
class Replay:
    window_us: float
    host_end_us: float
    gpu_end_us: float
    gpu_busy_us: float

    def step_us(self, steps: int) -> float:
        return self.window_us / max(steps, 1)


# --- building -------------------------------------------------------------------------------------


def _host_labels(timeline: Timeline) -> dict[str, list[Interval]]:
    forward_starts = field_column(timeline.forward_ops, 0)
    backward = backward_spans(timeline.backward_ops, forward_starts)
    # model phases nest (forward and backward inside ``optimizer.step(closure)``): the innermost
    # wins, as in the breakdown
    model_phases = resolve_nesting(
        {
            "optimizer": merge(timeline.optimizer_spans),
            "backward": merge(backward),
            "forward": merge(forward_spans(timeline.forward_ops, backward, [(s.start, s.end) for s in timeline.steps])),
        }
    )
    return {
        "data_wait": merge(timeline.data_waits),
        "h2d_copy": merge(h2d_host_ops(timeline)),
        **{label: model_phases.get(label, []) for label in ("optimizer", "backward", "forward")},
    }


class _Labeller:
    """The host phase at any instant (data wait > copy > optimizer > backward > forward > other)."""

    def __init__(self, labels: dict[str, list[Interval]]) -> None:
        self.labels = labels
        self.starts = {k: [iv[0] for iv in v] for k, v in labels.items()}
        self.bounds = sorted({t for v in labels.values() for iv in v for t in iv})
        # the label is constant between two consecutive bounds: one search per instant after this
        self.segment_labels = [self._search(t) for t in self.bounds]
        self._fetch_of = {iv: i for i, iv in enumerate(labels["data_wait"])}

    def fetch_at(self, t: float) -> int | None:
        """Which fetch (0, 1, ...) of the window the data wait holding ``t`` belongs to."""
        waits = self.labels["data_wait"]
        i = bisect_right(self.starts["data_wait"], t) - 1
        if i >= 0 and waits[i][0] <= t < waits[i][1]:
            return self._fetch_of[waits[i]]
        return None

    def _search(self, t: float) -> str:
        for label in _HOST_PRIORITY:
            ivs = self.labels[label]
            i = bisect_right(self.starts[label], t) - 1
            if i >= 0 and ivs[i][0] <= t < ivs[i][1]:
                return label
        return "other"

    def at(self, t: float) -> str:
        i = bisect_right(self.bounds, t) - 1
        return self.segment_labels[i] if i >= 0 else "other"

    def at_many(self, times: np.ndarray) -> list[str]:
        """``at`` of each instant (the searches made at once)."""
        from diagnose.analysis.trace.vectorized import np

        labels = [*self.segment_labels, "other"]  # before the first bound: index -1, "other"
        return list(
            map(
                labels.__getitem__,
                (np.searchsorted(np.array(self.bounds, dtype=np.float64), times, side="right") - 1).tolist(),
            )
        )

    def cuts(self, a: float, b: float) -> list[float]:
        lo, hi = bisect_right(self.bounds, a), bisect_left(self.bounds, b)
        return [a, *self.bounds[lo:hi], b]


#: The most GPU operations the model holds: a window with more is modelled over its first steps
#: that hold at most this many (at least one step). The model costs a few hundred bytes per op
#: and host item, the largest share of the analysis's memory on a large trace; the predictions
#: are ratios of the modelled steps, which a few steps of a steady window tell as well as all.
MODEL_MAX_OPS = 50_000


def _starts(group: Sequence[Any]) -> Sequence[float]:
    """The start times of a group of GPU ops, in order: the reader's column where it keeps the
    group as columns (sorted by start), else sorted here."""
    if isinstance(group, C.Records):
        return group.column(0)
    return sorted(op.start for op in group)


def _count_before(starts: list[Sequence[float]], t: float) -> int:
    return sum(bisect_left(column, t) for column in starts)


def model_steps(timeline: Timeline, max_ops: int = MODEL_MAX_OPS) -> list[Any]:
    """The window's first steps that hold at most ``max_ops`` GPU operations (by start), at
    least one: the steps the model is built over."""
    steps = list(timeline.steps)
    total = len(timeline.kernels) + len(timeline.memcpys) + len(timeline.memset_ops)
    if total <= max_ops:
        return steps
    starts = [_starts(group) for group in (timeline.kernels, timeline.memcpys, timeline.memset_ops)]
    first = _count_before(starts, steps[0].start)
    kept = 1
    while kept < len(steps) and _count_before(starts, steps[kept].end) - first <= max_ops:
        kept += 1
    return steps[:kept]


@dataclass
class _GpuRows:
    """Every kernel, copy and memset that starts before an instant, as columns: times as arrays
    sorted by (start, end), the other fields in their groups' order (kernels, copies, memsets:
    ``order`` maps a sorted row to them, a stable sort, as a list sorted on (start, end) has it)."""

    starts: np.ndarray
    ends: np.ndarray
    order: np.ndarray
    streams: list[Any]
    correlations: list[Any]
    kinds: list[str]
    names: list[str]
    copy_kinds: list[str]
    nbytes: list[int]

    @classmethod
    def before(cls, timeline: Timeline, t: float) -> _GpuRows:
        from diagnose.analysis.trace.vectorized import floats, np

        kernels = _fields_before(timeline.kernels, GpuKernel, ("start", "end", "stream", "correlation", "name"), t)
        copies = _fields_before(
            timeline.memcpys, GpuMemcpy, ("start", "end", "stream", "correlation", "kind", "nbytes"), t
        )
        memsets = _fields_before(timeline.memset_ops, GpuMemset, ("start", "end", "stream", "correlation"), t)
        k, m, z = len(kernels[0]), len(copies[0]), len(memsets[0])
        starts = np.concatenate([floats(kernels[0]), floats(copies[0]), floats(memsets[0])])
        ends = np.concatenate([floats(kernels[1]), floats(copies[1]), floats(memsets[1])])
        order = np.lexsort((ends, starts))
        return cls(
            starts=starts[order],
            ends=ends[order],
            order=order,
            streams=[*kernels[2], *copies[2], *memsets[2]],
            correlations=[*kernels[3], *copies[3], *memsets[3]],
            kinds=["kernel"] * k + ["memcpy"] * m + ["memset"] * z,
            names=[*kernels[4], *(f"Memcpy {kind}" for kind in copies[4]), *(["Memset"] * z)],
            copy_kinds=[""] * k + list(copies[4]) + [""] * z,
            nbytes=[0] * k + list(copies[5]) + [0] * z,
        )

    def stream_busy(self) -> np.ndarray:
        """For each row (sorted), the latest end of the rows before it on its stream (-inf: none)."""
        from diagnose.analysis.trace.vectorized import np

        code_of = {stream: code for code, stream in enumerate(dict.fromkeys(self.streams))}
        codes = np.fromiter(map(code_of.__getitem__, self.streams), dtype=np.int64, count=len(self.streams))[self.order]
        busy = np.full(len(codes), -np.inf)
        for code in range(len(code_of)):  # a handful of streams
            rows = np.flatnonzero(codes == code)
            if len(rows) > 1:
                busy[rows[1:]] = np.maximum.accumulate(self.ends[rows])[:-1]
        return busy


def _fields_before(group: Sequence[Any], make: Any, names: tuple[str, ...], t: float) -> list[Sequence[Any]]:
    """The named fields of the ops of ``group`` that start before ``t``, as columns: a prefix of
    the reader's columns where it holds them (sorted by start), else read off each op."""
    if isinstance(group, C.Records):
        n = bisect_left(group.column(0), t)
        return [group.column(make._fields.index(name))[:n] for name in names]
    ops = [op for op in group if op.start < t]
    return [[getattr(op, name) for op in ops] for name in names]


def _starting_before(group: Sequence[Any], t: float) -> Iterable[Any]:
    """The ops of ``group`` that start before ``t``: a prefix of the reader's sorted columns
    (a window of the first steps of a large trace reads no further), else a scan."""
    if isinstance(group, C.Records):
        return islice(group, bisect_left(group.column(0), t))
    return (op for op in group if op.start < t)


def build_model(timeline: Timeline) -> StepModel | None:
    """The window's dependency model; None without steps or GPU work."""
    if not timeline.steps or not timeline.has_gpu:
        return None
    from diagnose.analysis.trace.vectorized import np

    steps = model_steps(timeline, MODEL_MAX_OPS)
    w0, w1 = steps[0].start, steps[-1].end
    labeller = _Labeller(_host_labels(timeline))

    gpu = _GpuRows.before(timeline, w1)
    prev_end = gpu.stream_busy()
    busy_before = _busy_before(timeline, w0)
    inside = np.flatnonzero(gpu.starts >= w0)  # every row starts before w1
    starts, ends, prev_end = gpu.starts[inside], gpu.ends[inside], prev_end[inside]
    rows = gpu.order[inside].tolist()  # the ops in the window, as the groups' rows
    corrs = [gpu.correlations[i] for i in rows]
    # each op's launch call (NaN where the trace holds none)
    launched, launch_ends = _launch_times(timeline.launches, corrs)
    has_launch = ~np.isnan(launched)

    # launch latency of the trace: median delay of ops that waited for their launch: started well
    # after its stream went idle, and the stream was idle when it was launched (else it waited on
    # the GPU, however long after its launch)
    with np.errstate(invalid="ignore"):
        waited = has_launch & (launched >= w0) & (starts - prev_end > STREAM_GAP_US) & (prev_end <= launched)
    latency_cap = statistics.median((starts - launched)[waited].tolist()) if waited.any() else STREAM_GAP_US
    after_previous = starts - prev_end
    back_to_back = after_previous[(after_previous >= 0) & (after_previous <= STREAM_GAP_US)].tolist()
    gap_floor = statistics.median(back_to_back) if back_to_back else STREAM_GAP_US

    # work launched before the window (or by an unseen or later call) is carried in: ready at its
    # launch before the window, else at the window's start
    with np.errstate(invalid="ignore"):
        in_window = has_launch & (launched >= w0) & (launched < w1)
        before = has_launch & (launched < w0)
    carried = np.where(before, launched, w0)
    ready = np.where(in_window, launched, carried)
    labelled = in_window | before
    phases = labeller.at_many(np.where(labelled, launched, w0))
    phase = [p if known else "unknown" for p, known in zip(phases, labelled.tolist(), strict=True)]
    phase = ["other" if p in ("data_wait", "h2d_copy") else p for p in phase]
    latency, gap = starts - ready, starts - prev_end
    delays = latency.tolist()
    # waited for the stream: right after its predecessor, or after a gap the GPU set (its stream
    # was still busy when it was launched: a cross-stream wait, the GPU's own scheduling), which
    # stays as measured; any other op waited for its launch, after the trace's usual gap
    on_stream = (gap <= STREAM_GAP_US) | (prev_end > ready)
    latency = np.where(on_stream, np.minimum(latency, latency_cap), latency)
    gap = np.where(on_stream, gap, gap_floor)
    carried_at = [None if own else at for own, at in zip(in_window.tolist(), carried.tolist(), strict=True)]
    ops = list(
        map(
            GpuOp,
            [gpu.streams[i] for i in rows],
            (ends - starts).tolist(),
            [gpu.kinds[i] for i in rows],
            [gpu.names[i] for i in rows],
            phase,
            latency.tolist(),
            gap.tolist(),
            carried_at,
            [gpu.copy_kinds[i] for i in rows],
            [gpu.nbytes[i] for i in rows],
            (ends > w1).tolist(),
        )
    )
    ops_of_corr: dict[int, list[int]] = defaultdict(list)
    for index in np.flatnonzero(in_window).tolist():
        ops_of_corr[corrs[index]].append(index)

    items, nonblocking = _host_items(timeline, w0, w1, labeller, ops_of_corr, ops, ends, launched, launch_ends)
    return step_model(timeline, steps, items, ops, busy_before, latency_cap, nonblocking, delays)


def step_model(
    timeline: Timeline,
    steps: Sequence[Any],
    items: Sequence[HostItem],
    ops: Sequence[GpuOp],
    busy_before: dict[int, float],
    latency_cap: float,
    nonblocking: Sequence[float],
    delays: Sequence[float],
) -> StepModel:
    """The model of ``steps`` from its host items and GPU ops, with what the trace says beside
    them (``nonblocking``: the durations of the launches that did not block; ``delays``: each
    op's delay after its launch)."""
    w0, w1 = steps[0].start, steps[-1].end
    launch_cost = statistics.median(nonblocking) if nonblocking else 0.0
    profiler_cost = estimate_cost_per_event(timeline)
    return StepModel(
        start_us=w0,
        measured_us=w1 - w0,
        step_durations_us=tuple(s.end - s.start for s in steps),
        items=tuple(items),
        ops=tuple(ops),
        stream_busy_until=busy_before,
        launch_latency_us=latency_cap,
        launch_cost_us=launch_cost,
        device_name=timeline.meta.device_name,
        compute_capability=timeline.meta.compute_capability,
        host_lead_us=statistics.median(delays) if delays else 0.0,
        accumulate_grad_us=sum(min(b, w1) - max(a, w0) for a, b in timeline.accumulate_grad_ops if b > w0 and a < w1),
        accumulate_grad_nodes=sum(1 for a, b in timeline.accumulate_grad_ops if b > w0 and a < w1),
        engine_gap_us=_engine_gap(timeline.backward_ops, w0, w1),
        host_events=bisect_left(timeline.host_event_starts, w1) - bisect_left(timeline.host_event_starts, w0),
        profiler_cost_us=profiler_cost.per_event_us,
        profiler_cost_source=profiler_cost.source,
        # a trace trimmed before ``trim`` kept the calls that waited says nothing of them
        blocked_us=()
        if timeline.meta.trim_format == 1
        else tuple(_blocked(timeline.long_runtime_calls, (s.start, s.end), launch_cost) for s in steps),
    )


def _launch_times(launches: Mapping[Any, tuple[float, float]], corrs: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The start and end of the call that launched each of ``corrs``, NaN where none did."""
    if isinstance(launches, C.Launches):
        return launches.times_of(corrs)
    from diagnose.analysis.trace.vectorized import np

    found = [launches.get(corr) for corr in corrs]
    return (
        np.array([math.nan if f is None else f[0] for f in found], dtype=np.float64),
        np.array([math.nan if f is None else f[1] for f in found], dtype=np.float64),
    )


def _blocked(calls: Sequence[Interval], step: Interval, call_cost_us: float) -> float:
    """How long the long runtime calls that start in ``step`` waited, beyond ``call_cost_us``."""
    a, b = step
    i, j = bisect_left(calls, (a, float("-inf"))), bisect_left(calls, (b, float("-inf")))
    return sum(max(0.0, end - start - call_cost_us) for start, end in calls[i:j])


#: gaps between two backward nodes longer than this are not the engine's scheduling (the host
#: was elsewhere: the forward, the optimizer, the next step)
ENGINE_GAP_MAX_US = 50.0


def _engine_gap(nodes: Sequence[Interval], w0: float, w1: float) -> float:
    """The median gap between consecutive backward nodes of the window (``ENGINE_GAP_MAX_US`` at
    most): the autograd engine's time per node outside the node's own span."""
    gaps = []
    previous_end = None
    for a, b in _starting_before(nodes, w1):
        if a < w0:
            continue
        if previous_end is not None and 0 <= a - previous_end <= ENGINE_GAP_MAX_US:
            gaps.append(a - previous_end)
        previous_end = b  # a framework's mark around the whole backward leaves one negative gap
    return statistics.median(gaps) if gaps else 0.0


def _host_items(
    timeline: Timeline,
    w0: float,
    w1: float,
    labeller: _Labeller,
    ops_of_corr: dict[Any, list[int]],
    ops: list[GpuOp],
    op_ends: np.ndarray,
    launch_starts: np.ndarray,
    launch_ends: np.ndarray,
) -> tuple[list[HostItem], list[float]]:
    """The host's sequence from ``w0`` to ``w1``: the runtime calls that launched the window's ops
    (``ops_of_corr``: the ops of each correlation id, whose launch is ``launch_starts``/
    ``launch_ends`` of any of them), the syncs, and the work between them, cut where the phase
    changes; and the durations of the launches that did not block. The calls are walked in time
    order with a cursor (the host's time so far) computed for all of them at once: before each
    call it is the latest start or end of the calls before it, at least ``w0``."""
    from diagnose.analysis.trace.vectorized import np

    groups = list(map(tuple, ops_of_corr.values()))
    first = np.array([g[0] for g in groups], dtype=np.intp)
    starts, ends = launch_starts[first], launch_ends[first]
    payloads: list[Any] = list(groups)
    syncs = [s for s in timeline.syncs if w0 <= s.start < w1]
    if syncs:
        launch_spans = set(zip(starts.tolist(), ends.tolist(), strict=True))
        h2d = labeller.labels["h2d_copy"]
        data_parallel = merge(timeline.data_parallel_spans)
        kept = [s for s in syncs if (s.start, s.end) not in launch_spans]
        payloads += [
            "staging" if _inside(h2d, s.start) else "comm" if _inside(data_parallel, s.start) else "user" for s in kept
        ]
        starts = np.concatenate([starts, np.array([s.start for s in kept], dtype=np.float64)])
        ends = np.concatenate([ends, np.array([s.end for s in kept], dtype=np.float64)])
    waits = len(payloads) > len(groups)
    order = np.lexsort((ends, starts))  # by start, then end; stable
    calls = int(np.searchsorted(starts[order], w1, side="left"))  # those that start in the window
    order = order[:calls]
    starts, ends = starts[order], ends[order]
    payloads = [payloads[i] for i in order.tolist()]
    cursor = np.maximum.accumulate(
        np.concatenate([[w0], np.maximum(starts, ends)])
    )  # before each call, and after the last
    at_call = np.maximum(cursor[:-1], starts)  # the cursor once the host has reached the call

    fetch_at = labeller.fetch_at

    # the work before each call (and after the last): one item where one phase holds it, else
    # an item per phase (a few per step)
    work_from = np.concatenate([cursor[:-1], cursor[-1:]])
    work_to = np.concatenate([starts, [w1]])
    has_work = work_from < work_to
    has_work[:-1] &= starts > cursor[:-1]
    before = np.flatnonzero(has_work)
    a, b = work_from[before], work_to[before]
    bounds = np.array(labeller.bounds, dtype=np.float64)
    one_phase = np.searchsorted(bounds, a, side="right") == np.searchsorted(bounds, b, side="left")
    # 2k: the work before call k (several items where it spans phases, in order)
    work_keys = (2 * before[one_phase]).tolist()
    work_items = list(map(HostItem, repeat("work"), (b - a)[one_phase].tolist(), labeller.at_many(a[one_phase])))
    for item, t in zip(work_items, a[one_phase].tolist(), strict=True):
        if item.phase == "data_wait":
            item.fetch = fetch_at(t)
    for k, lo, hi in zip(before[~one_phase].tolist(), a[~one_phase].tolist(), b[~one_phase].tolist(), strict=True):
        cuts = labeller.cuts(lo, hi)
        for x, y in pairwise(cuts):
            if y > x:
                phase = labeller.at(x)
                work_items.append(HostItem("work", y - x, phase, fetch=fetch_at(x) if phase == "data_wait" else None))
                work_keys.append(2 * k)

    # the calls: a launch takes what it took past the cursor; a launch of copies only that
    # returned once they were done blocked; a sync waits for the streams it found busy
    span = ends - at_call
    phases = labeller.at_many(starts)
    leads = (at_call - starts).tolist()
    call_items = list(
        map(HostItem, repeat("launch"), np.where(span > 0.0, span, 0.0).tolist(), phases, payloads, leads)
    )
    is_copy = [op.kind == "memcpy" for op in ops]
    op_end = op_ends.tolist()
    nonblocking = [True] * calls
    copies = [k for k, indices in enumerate(payloads) if type(indices) is tuple and is_copy[indices[0]]]  # a few a step
    for k in copies:
        indices = payloads[k]
        if all(is_copy[i] for i in indices) and ends[k] >= max(op_end[i] for i in indices):
            done = max(op_end[i] for i in indices)
            call_items[k] = HostItem(
                "launch",
                0.0,
                phases[k],
                indices,
                leads[k],
                after_us=float(ends[k]) - max(float(starts[k]), done),
                blocking=True,
            )
            nonblocking[k] = False
    if waits:
        launched_at = np.full(len(ops), -np.inf)
        in_window = [i for g in groups for i in g]
        launched_at[in_window] = launch_starts[in_window]
        streams, last_end_launched_before = stream_ends(timeline, w0, ops, launched_at.tolist(), op_end)
        for k, kind in enumerate(payloads):
            if type(kind) is str:
                start, end = float(starts[k]), float(ends[k])
                awaited = tuple(s for s in streams if last_end_launched_before(s, start) <= end + 1.0)
                done = max((last_end_launched_before(s, start) for s in awaited), default=float("-inf"))
                call_items[k] = HostItem(
                    "wait",
                    0.0,
                    phases[k],
                    lead_us=leads[k],
                    streams=awaited,
                    after_us=end - max(start, done),
                    sync_kind=kind,
                )
                nonblocking[k] = False
    launch_us = list(compress((item.duration_us for item in call_items), nonblocking))

    keys = np.concatenate([np.array(work_keys, dtype=np.int64), 2 * np.arange(calls, dtype=np.int64) + 1])
    everything = work_items + call_items
    return list(map(everything.__getitem__, np.argsort(keys, kind="stable").tolist())), launch_us


def stream_ends(
    timeline: Timeline, w0: float, ops: Sequence[GpuOp], launched_at: Sequence[float], op_ends: Sequence[float]
) -> tuple[list[int], Callable[[int, float], float]]:
    """For the waits: every stream, and ``last_end_launched_before(stream, t)``, the measured end
    of the last op launched on ``stream`` before ``t`` (``launched_at``: each op's launch, -inf
    for one launched before the window or by an unseen call), or of the work before the window."""
    per_stream: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for op, t, end in zip(ops, launched_at, op_ends, strict=True):
        per_stream[op.stream].append((t, end))
    for v in per_stream.values():
        v.sort()
    before_busy = dict(_busy_before(timeline, w0))

    def last_end_launched_before(stream: int, t: float) -> float:
        v = per_stream.get(stream, [])
        i = bisect_left(v, (t, float("-inf")))
        done = [e for _, e in v[:i]]
        best = max(done) if done else float("-inf")
        return max(best, before_busy.get(stream, float("-inf")))

    return sorted(set(per_stream) | set(before_busy)), last_end_launched_before


def _busy_before(timeline: Timeline, w0: float) -> dict[int, float]:
    out: dict[int, float] = {}
    for group in (timeline.kernels, timeline.memcpys, timeline.memset_ops):
        for op in _starting_before(group, w0):
            out[op.stream] = max(out.get(op.stream, float("-inf")), op.end)
    return out


def _inside(merged: list[Interval], t: float) -> bool:
    i = bisect_right(merged, (t, float("inf"))) - 1
    return i >= 0 and merged[i][0] <= t < merged[i][1]


# --- replaying ------------------------------------------------------------------------------------


def replay(model: StepModel, host_code_scale: float = 1.0) -> Replay:
    """Replay the model. ``host_code_scale`` multiplies the host's model-code time (work and
    non-blocking launches in forward, backward, optimizer and other code) and what a sync takes
    once the GPU is done (the runtime's own host code, which the profiler slows like the rest;
    left unscaled, the steady step would be matched by shrinking the model code too far, and a
    removed sync over-predicted): 0 replays a host that keeps ahead of the GPU whatever its
    code costs."""
    w0 = model.start_us
    ops = model.ops
    stream_end = dict(model.stream_busy_until)
    last_end: dict[int, float] = dict(model.stream_busy_until)  # end of the last op enqueued, per stream
    ends = [0.0] * len(ops)
    busy = 0.0
    neg_inf = float("-inf")

    def enqueue(index: int, ready: float, shrink: float = 0.0) -> None:
        # once per op of every replay: max(a, b) written as ``b if b > a else a`` (what max
        # returns, to the last bit), which halves the replay's time
        nonlocal busy
        op = ops[index]
        stream = op.stream
        prev = stream_end.get(stream, neg_inf)
        latency = op.latency_us - shrink
        start, after_prev = ready + (0.0 if latency < 0.0 else latency), prev + op.gap_us
        start = after_prev if after_prev > start else start
        end = start + op.duration_us
        ends[index] = end
        busy += op.duration_us
        stream_end[stream] = end if end > prev else prev
        last_end[stream] = end

    for index, op in enumerate(ops):  # carried-in work is queued before the window's own
        if op.carried_ready_us is not None:
            enqueue(index, op.carried_ready_us)

    h = w0
    traced_fetches = model.traced_fetches
    for item in model.items:
        kind = item.kind
        # ``_elastic``, written out: this loop runs once per host item of every replay
        elastic = (
            (item.phase in MODEL_CODE_PHASES or (traced_fetches and _traced_fetch(item)))
            and not item.blocking
            and kind != "wait"
        )
        duration = item.duration_us * host_code_scale if elastic else item.duration_us
        lead = item.lead_us * host_code_scale if elastic else item.lead_us
        if kind == "work":
            h += duration
            if item.ready_us is not None:
                h = max(h, w0 + item.ready_us)
        elif kind == "launch":
            call_start = h - lead
            # the part of an op's launch latency spent inside the launch call is host code: it
            # shrinks with the call
            shrink = item.duration_us - duration if elastic else 0.0
            for index in item.ops:
                enqueue(index, call_start, shrink)
            if item.blocking:
                done = max(ends[i] for i in item.ops)
                h = max(h, max(call_start, done) + item.after_us * host_code_scale)
            else:
                h += duration
        else:
            done = max((last_end.get(s, neg_inf) for s in item.streams), default=neg_inf)
            h = max(h, max(h - lead, done) + item.after_us * host_code_scale)
    gpu_end = max((end for end, op in zip(ends, model.ops, strict=True) if not op.spills), default=w0)
    return Replay(window_us=max(h, gpu_end) - w0, host_end_us=h - w0, gpu_end_us=gpu_end - w0, gpu_busy_us=busy)


@dataclass(frozen=True)
class ReplayCheck:
    """The unchanged model replayed against the measured window (the report carries it)."""

    measured_us: float
    replayed_us: float
    #: the replay with the host's model code free; used when it also matches (host ahead)
    host_free_us: float
    steps: int
    #: "trace": the predictions replay the host as measured; "host ahead": model code is free
    mode: str

    @property
    def error(self) -> float:
        return (self.replayed_us - self.measured_us) / self.measured_us if self.measured_us else 0.0

    @property
    def reproduces(self) -> bool:
        return abs(self.error) <= REPLAY_TOLERANCE

    @property
    def host_code_scale(self) -> float:
        return 0.0 if self.mode == "host ahead" else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "measured_ms": round(self.measured_us / 1000, 4),
            "replayed_ms": round(self.replayed_us / 1000, 4),
            "error": round(self.error, 4),
            "within_tolerance": self.reproduces,
            "tolerance": REPLAY_TOLERANCE,
            "mode": self.mode,
            "host_free_ms": round(self.host_free_us / 1000, 4),
        }


def replay_check(model: StepModel) -> ReplayCheck:
    """Replay the unchanged model twice: as measured, and with the host's model code free. When
    the free one reproduces the window and the GPU starts its work at least half a step after its
    launch, the host ran ahead of the GPU: its model-code time is back-pressure from a full launch queue, and predictions treat it as free."""
    full = replay(model).window_us
    free = replay(model, host_code_scale=0.0).window_us
    median_step = statistics.median(model.step_durations_us)
    ahead = (
        model.host_lead_us >= HOST_AHEAD_STEPS * median_step
        and abs(free - model.measured_us) <= REPLAY_TOLERANCE * model.measured_us
    )
    return ReplayCheck(model.measured_us, full, free, model.steps, "host ahead" if ahead else "trace")


def host_ahead_scale(model: StepModel) -> float:
    """The host's own time in a window whose host ran ahead of the GPU, as a share of its traced
    model code (0 where the trace cannot say).

    There the launch calls wait for room in a full queue, and the waiting spreads into the code
    around them (lightning_fp32 on an H100: the same operators took 1.5-2x longer in its
    back-pressured steps than in its bf16 run), so the traced code says little of what the host
    needs. Its least back-pressured step says most: each step's length less what its long
    runtime calls waited (``StepModel.blocked_us``; the window's first steps often find the
    queue drained), the shortest of them, less the host's non-code time (data waits, copies) and
    the profiler's own per-event cost. That is the host's time per step, which predictions that
    shrink the GPU's work expose (the bf16 steps of lightning_fp32 and fabric_fp32 were
    host-bound where their fp32 steps were GPU-bound). The result is capped so that the unchanged
    model still replays the window as measured."""
    steps = model.steps
    if not steps or len(model.blocked_us) != steps:
        return 0.0
    code = other = 0.0
    for it in model.items:
        if _elastic(it, model.traced_fetches):
            code += it.duration_us
        elif it.kind == "work":
            other += it.duration_us
    if code <= 0:
        return 0.0
    own = min(d - b for d, b in zip(model.step_durations_us, model.blocked_us, strict=True))
    own -= other / steps + model.host_events / steps * model.profiler_cost_us
    scale = min(1.0, max(0.0, own / (code / steps)))
    if scale <= 0 or abs(replay(model, scale).window_us - model.measured_us) <= REPLAY_TOLERANCE * model.measured_us:
        return scale
    # the host's estimate would not fit the window it ran in: the most that fits
    fits, _ = _bisect(
        lambda s: abs(replay(model, s).window_us - model.measured_us) <= REPLAY_TOLERANCE * model.measured_us,
        0.0,
        scale,
    )
    return fits


def _elastic(item: HostItem, traced_fetches: bool) -> bool:
    return (
        (item.phase in MODEL_CODE_PHASES or (traced_fetches and _traced_fetch(item)))
        and item.kind != "wait"
        and not item.blocking
    )


def _traced_fetch(item: HostItem) -> bool:
    """A data wait of the main thread's own loading, as traced (a transformation that delivers
    the batch from elsewhere sets when it is ready, and that time is not scaled)."""
    return item.fetch is not None and item.ready_us is None


def profiler_scale(model: StepModel) -> float:
    """The share of the traced model code left once the profiler's own cost per recorded event
    is taken out (at least 0)."""
    code = sum(it.duration_us for it in model.items if _elastic(it, model.traced_fetches))
    if code <= 0:
        return 1.0
    return max(0.0, code - model.host_events * model.profiler_cost_us) / code


def host_code_scale(model: StepModel, check: ReplayCheck, steady_step_us: float | None) -> float:
    """How much of the trace's model-code host time a step pays with the profiler off.

    Profiling records every operator, which slows the host; the steady-state step (timed with the
    profiler off) says by how much. The scale is the one at which the replayed step matches the
    steady step (found by bisection: the replay never gets slower as the host gets faster); 0
    when the host runs ahead of the GPU. Where the steady step cannot say (unknown: a trace
    alone; or not faster: the GPU set both), the profiler's own per-event cost is taken out
    (``profiler_scale``), as far as the host stays hidden where a steady step was timed:
    accelerate_fp32's GPU-bound fp32 step hid a host that bf16 exposes, and replaying that host
    at its profiled cost predicted 3.29x where 4.90x was measured."""
    if check.mode == "host ahead":
        return host_ahead_scale(model)
    if model.steps == 0:
        return 1.0
    if steady_step_us is None or steady_step_us <= 0:
        return profiler_scale(model)
    target = steady_step_us * model.steps
    full = replay(model).window_us
    if full <= target * (1 + 0.02):
        floor = profiler_scale(model)
        if floor >= 1.0 or replay(model, floor).window_us >= full * (1 - 0.02):
            return floor
        # shrink the host only while it stays hidden
        _, hidden = _bisect(lambda s: replay(model, s).window_us < full * (1 - 0.02), floor, 1.0)
        return hidden
    if replay(model, 0.0).window_us >= target:
        return 0.0
    lo, hi = _bisect(lambda s: replay(model, s).window_us <= target, 0.0, 1.0)
    return (lo + hi) / 2


def _bisect(holds: Callable[[float], bool], lo: float, hi: float) -> tuple[float, float]:
    """Narrow ``[lo, hi]`` around where ``holds`` stops holding (it holds at ``lo``, not at
    ``hi``; the replay is monotone in the host's scale): 14 halvings, 6e-5 of a unit interval."""
    for _ in range(14):
        mid = (lo + hi) / 2
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi
