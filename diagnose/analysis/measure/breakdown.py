"""Stage 4: attribute every microsecond of every step, in two views.

Contract: ``compute_breakdown(timeline) -> Breakdown``; pure, no torch, no I/O.

1. Phases: what the host (main) thread is doing. Each instant of a step belongs to exactly one
   phase: data_wait > h2d_copy > the model phases > other. Among the model phases (optimizer,
   backward, forward) the innermost one wins (``resolve_nesting``): forward and backward that
   run inside ``optimizer.step(closure)`` (Lightning's automatic optimization, LBFGS) are
   forward and backward, and a ``zero_grad`` inside a closure is optimizer work. Optimizer work
   is torch's step and zero_grad, gradient clipping, and GradScaler's unscale_/step/update.
2. Exposed time: what limits the step. Each instant is either "GPU busy with kernels of phase P"
   (``gpu_forward`` ...), or "GPU idle (or only copying) while the host is in state S"
   (``data_wait``, ``h2d_copy``, ``sync``, ``host_forward`` ...). Time the host spends behind
   busy GPU work is hidden: it is not a bottleneck. The exposed view sums to the step's wall time.

A kernel belongs to the phase in which the host launched it (found through the launch's
correlation id), not to the phase during which it happens to run.

On a CPU-only trace there is no GPU activity, so every instant is "host in state S": the exposed
view is then the phase view with synchronisations split out.

Why one module (about 1,070 lines): every microsecond of a step is attributed once, by one
sweep, and every part here feeds it or reads its result: the host intervals (merge, forward and
backward spans, nesting) are the sweep's input, the per-step kernel, copy and sync counters
share its step boundaries and labels, and ``calibrate_to_steady_state`` and ``per_step_stats``
rescale the same ``Breakdown``. Each loop that has a numpy twin keeps it beside it
(``_kernel_stats_loop``/``_kernel_stats_vectorized``), which is what makes the two comparable; the
twins' array code itself is ``trace/vectorized.py``.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import TYPE_CHECKING, Any, cast

from diagnose.analysis.measure.categories import EXPOSED, GPU_EXPOSED, HOST_EXPOSED, LAUNCH_EXPOSED, PHASES  # noqa: F401 - re-exported
from diagnose.analysis.trace import columns as C
from diagnose.analysis.trace import patterns as P
from diagnose.analysis.trace.timeline import HostOp, Interval, SyncCall, Timeline
from diagnose.stats import quantile

if TYPE_CHECKING:
    import numpy as np

    from diagnose.analysis.trace import vectorized as V

# numpy (through ``vectorized``) is imported by the functions that use it, not with this module:
# its BLAS starts a thread at import, and the trace reader forks its workers only from a process
# of one thread (``timeline.threads_in_process``), so the read comes first.


# Host labels in priority order; the phase view skips the waits ("comm_wait", "sync"): a wait
# belongs to the phase around it. "comm_wait" is a sync inside DDP's own code, waiting for its
# all-reduce. "collective" (a CPU collective such as gloo's all-reduce in flight) comes last: it
# is the cause only when the main thread is otherwise idle, waiting for it.
_HOST_LABELS = ("data_wait", "h2d_copy", "comm_wait", "sync", "optimizer", "backward", "forward", "collective")
_FIRST_PHASE_LABEL = _HOST_LABELS.index("optimizer")
_STATE_TO_EXPOSED = {
    "data_wait": "data_wait",
    "h2d_copy": "h2d_copy",
    "comm_wait": "communication",
    "sync": "sync",
    "optimizer": "host_optimizer",
    "backward": "host_backward",
    "forward": "host_forward",
    "collective": "communication",
    None: "host_other",
}
_PHASE_OF_LABEL = {
    "data_wait": "data_wait",
    "h2d_copy": "h2d_copy",
    "optimizer": "optimizer",
    "backward": "backward",
    "forward": "forward",
}
# GPU labels: compute kernels by launch phase, then the non-compute activities.
_GPU_COMPUTE = ("gpu_forward", "gpu_backward", "gpu_optimizer", "gpu_other")
_GPU_LABELS = (*_GPU_COMPUTE, "communication", "copy_h2d", "copy_d2h", "copy_other")


@dataclass
class StepBreakdown:
    """One step: times in microseconds, bytes in bytes."""

    number: int
    start_us: float
    duration_us: float
    phases: dict[str, float]
    exposed: dict[str, float]
    gpu_busy_us: float = 0.0
    kernel_count: int = 0
    kernel_time_us: float = 0.0
    median_kernel_us: float | None = None
    h2d_pageable_bytes: int = 0
    h2d_pinned_bytes: int = 0
    h2d_copies: int = 0
    #: GPU time of the host-to-device copies (they may overlap kernels)
    h2d_copy_us: float = 0.0
    d2h_bytes: int = 0
    sync_count: int = 0
    sync_blocked_us: float = 0.0
    sync_idle_after_us: float = 0.0
    syncs_by_kind: dict[str, int] = field(default_factory=dict)
    #: GPU kernel time by matmul precision (fp32, tf32, bf16, fp16, fp8, unknown)
    matmul_us: dict[str, float] = field(default_factory=dict)
    conv_us: float = 0.0
    transpose_us: float = 0.0
    triton_us: float = 0.0
    communication_us: float = 0.0
    optimizer_kernels: int = 0
    multi_tensor_kernels: int = 0
    graph_launches: int = 0
    #: profiler-recorded host events (operators, CUDA calls) of the training threads that started
    #: in each host phase, GPU busy or not (see correct_profiler_cost)
    phase_events: dict[str, int] = field(default_factory=dict)


@dataclass
class Breakdown:
    steps: list[StepBreakdown]
    has_gpu: bool
    has_step_marks: bool
    #: share of the window's wall time per exposed category (sums to 1.0)
    exposed_share: dict[str, float]
    #: share of the window's wall time per host phase (sums to 1.0)
    phase_share: dict[str, float]
    #: per category: how much of the host phase was hidden behind GPU work (share of window time)
    hidden_share: dict[str, float]
    notes: list[str] = field(default_factory=list)
    #: DataLoader iterator kinds the trace shows ("single" / "multi" process)
    dataloader_kinds: dict[str, int] = field(default_factory=dict)
    #: the exposed shares as the trace shows them, before ``calibrate_to_steady_state``
    trace_exposed_share: dict[str, float] | None = None
    #: profiled step time over the steady-state step time (profiler off), when known
    profiler_inflation: float | None = None
    #: the median step in time order, in ``STRIP_BINS`` equal slices (see ``_strip``)
    timeline_strip: dict[str, Any] | None = None
    #: kernel name -> (GPU time in us, calls) over the profiled steps: the kernel table and the
    #: roofline (analysis/measure/kernels.py) read it; kept out of report.json (the report keeps the top rows)
    kernels_by_name: dict[str, tuple[float, int]] = field(default_factory=dict)
    #: the device the trace shows the host driving but not its activity (None: none such): an
    #: accelerator this version does not analyse, or CUDA calls without a kernel or copy
    untraced_device: str | None = None

    @property
    def total_us(self) -> float:
        return sum(s.duration_us for s in self.steps)

    def gpu_busy_share(self) -> float:
        """Share of step time the GPU runs anything, over the steady step when calibrated."""
        busy = sum(s.gpu_busy_us for s in self.steps) / (self.total_us or 1)
        if self.trace_exposed_share is not None and self.profiler_inflation:
            busy = min(1.0, busy * self.profiler_inflation)
        return busy

    def median(self, attr: str) -> float | None:
        values = [getattr(s, attr) for s in self.steps if getattr(s, attr) is not None]
        return statistics.median(values) if values else None

    def median_of(self, view: str, key: str) -> float:
        """Median over steps of one phase (``view='phases'``) or exposed category, in µs."""
        values = [getattr(s, view).get(key, 0.0) for s in self.steps]
        return statistics.median(values) if values else 0.0


# --- host intervals -------------------------------------------------------------------------------


def merge(intervals: list[Interval]) -> list[Interval]:
    """Union of intervals as a sorted list of disjoint intervals."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _contains(merged: list[Interval], t: float) -> bool:
    i = bisect_right(merged, (t, float("inf"))) - 1
    return i >= 0 and merged[i][0] <= t < merged[i][1]


def backward_spans(backward_ops: Sequence[Interval], forward_starts: Sequence[float]) -> list[Interval]:
    """Group autograd-engine events into one span per ``backward()`` call.

    Consecutive backward events belong to one call unless a forward operator starts between
    them (gradient accumulation: forward, backward, forward, backward ...). The span covers the
    gaps inside one call, during which the main thread is blocked in ``backward()``.
    Vectorised where that gives the same (``vectorized.backward_calls``).
    """
    if len(backward_ops) > 64:
        from diagnose.analysis.trace import vectorized as V

        starts, ends = (
            (backward_ops.column(0), backward_ops.column(1))
            if hasattr(backward_ops, "column")
            else zip(*backward_ops, strict=True)
        )
        found = V.backward_calls(starts, ends, forward_starts)
        if found is not None:
            return found
    spans: list[Interval] = []
    for start, end in backward_ops:
        if spans:
            cur_start, cur_end = spans[-1]
            k = bisect_right(forward_starts, cur_end)
            forward_between = k < len(forward_starts) and forward_starts[k] < start
            if not forward_between:
                spans[-1] = (cur_start, max(cur_end, end))
                continue
        spans.append((start, end))
    return spans


def forward_spans(forward_ops: Sequence[Interval], backward: list[Interval], steps: list[Interval]) -> list[Interval]:
    """Forward passes: from the first forward operator (one that recorded autograd history)
    after the previous backward to the start of the next backward. Forward operators with no
    backward after them (inference with grad enabled) form one span per step."""
    spans: list[Interval] = []
    # the reader's Records are sorted by start: the scans below become binary searches of the
    # start column (a large trace's hundred thousand forward operators are never built as tuples)
    in_order = hasattr(forward_ops, "column")
    starts: Sequence[float] = forward_ops.column(0) if in_order else [op[0] for op in forward_ops]  # type: ignore[attr-defined]
    i, n = 0, len(starts)
    prev_end = float("-inf")
    for b_start, b_end in backward:
        if in_order:
            i = bisect_left(starts, prev_end, i)
        else:
            while i < n and starts[i] < prev_end:
                i += 1
        if i < n and starts[i] < b_start:
            spans.append((starts[i], b_start))
        if in_order:
            i = bisect_left(starts, b_end, i)
        else:
            while i < n and starts[i] < b_end:
                i += 1
        prev_end = b_end
    rest = [op for op in forward_ops[i:] if op[0] >= prev_end]
    placed = 0
    for s_start, s_end in steps:
        inside = [op for op in rest if s_start <= op[0] < s_end]
        if inside:
            spans.append((inside[0][0], max(op[1] for op in inside)))
            placed += len(inside)
    if placed < len(rest):  # operators outside every step (a trimmed trace's context): their own spans
        spans += [op for op in rest if not any(s <= op[0] < e for s, e in steps)]
    return spans


#: The model phases whose spans may nest, and how a tie between two spans of equal extent is
#: broken. "closure" (the closure an optimizer's step calls) is no phase of its own: inside it,
#: outside forward and backward, the host runs the training step's other code.
NESTED_LABELS = ("optimizer", "closure", "backward", "forward")


def resolve_nesting(spans: dict[str, list[Interval]]) -> dict[str, list[Interval]]:
    """Disjoint intervals per label from spans that may nest: at each instant the innermost
    active span wins, i.e. the one that started last (of two that start together, the one that
    ends first; then the order of ``NESTED_LABELS``). A forward pass inside an optimizer's
    ``step(closure)`` is forward; a ``zero_grad`` inside that forward span is optimizer."""
    import heapq

    rank = {label: i for i, label in enumerate(NESTED_LABELS)}
    items = sorted(
        (start, end, rank[label]) for label, intervals in spans.items() for start, end in intervals if end > start
    )
    bounds = sorted({t for start, end, _ in items for t in (start, end)})
    out: dict[str, list[Interval]] = {label: [] for label in spans}
    heap: list[tuple[float, float, int]] = []  # (-start, end, rank): the innermost on top
    i = 0
    for t, t_next in pairwise(bounds):
        while i < len(items) and items[i][0] <= t:
            start, end, r = items[i]
            heapq.heappush(heap, (-start, end, r))
            i += 1
        while heap and heap[0][1] <= t:  # ended: an inner span is over, the outer one resumes
            heapq.heappop(heap)
        if not heap:
            continue
        intervals = out.setdefault(NESTED_LABELS[heap[0][2]], [])
        if intervals and intervals[-1][1] == t:
            intervals[-1] = (intervals[-1][0], t_next)
        else:
            intervals.append((t, t_next))
    return out


def compiled_forward_ops(timeline: Timeline) -> Sequence[Interval]:
    """The forward operators, with torch.compile's regions around a compiled forward counted as
    forward from their start: the guard check (``TorchDynamo Cache Lookup``) and the
    ``Torch-Compiled Region`` that holds the ``CompiledFunction`` recording autograd history."""
    ops = timeline.forward_ops
    if not _names_among(timeline.host_ops, lambda name: name.startswith(P.COMPILED_REGION_PREFIXES)):
        return ops  # nothing compiled (the usual case): no pass over the operators
    starts = field_column(ops, 0)
    extra: list[Interval] = []
    pending_lookup: HostOp | None = None
    for op in timeline.host_ops:
        if not op.name.startswith(P.COMPILED_REGION_PREFIXES):
            pending_lookup = None
            continue
        if op.name.startswith("TorchDynamo Cache Lookup"):
            pending_lookup = op
            continue
        k = bisect_right(starts, op.start)
        if k < len(starts) and starts[k] < op.end:  # a forward op inside: a compiled forward
            extra.append((pending_lookup.start if pending_lookup is not None else op.start, op.end))
        pending_lookup = None
    return sorted([*ops, *extra]) if extra else ops


def field_column(records: Any, index: int) -> Any:
    """Field ``index`` of every record: the reader's column itself, else gathered."""
    return records.column(index) if isinstance(records, C.Records) else [r[index] for r in records]


def _names_among(host_ops: Any, wanted: Any) -> set[str]:
    """The distinct operator names for which ``wanted(name)`` holds (a few hundred names are
    tested, not every operator)."""
    return {name for name in set(field_column(host_ops, 2)) if wanted(name)}


def h2d_host_ops(timeline: Timeline) -> list[Interval]:
    """Host intervals of the copies that launched host-to-device memcpys: the enclosing top-level
    operator (``aten::to`` ...) where there is one, else the runtime call itself."""
    host = timeline.host_ops
    if not any(m.kind.startswith("HtoD") for m in timeline.memcpys):
        return []
    starts = field_column(host, 0)
    out: list[Interval] = []
    for m in timeline.memcpys:
        if not m.kind.startswith("HtoD"):
            continue
        launch = timeline.launches.get(m.correlation)
        if launch is None:
            continue
        op = _enclosing(host, starts, launch[0])
        out.append((op.start, op.end) if op is not None else launch)
    return out


def _enclosing(host: Sequence[HostOp], starts: Sequence[float], t: float) -> HostOp | None:
    i = bisect_right(starts, t) - 1
    if i >= 0 and host[i].start <= t < host[i].end:
        return host[i]
    return None


# --- the sweep ------------------------------------------------------------------------------------


def compute_breakdown(timeline: Timeline) -> Breakdown:
    from diagnose.analysis.trace import vectorized as V

    steps = timeline.steps
    step_bounds = [(s.start, s.end) for s in steps]
    forward_ops = compiled_forward_ops(timeline)
    forward_starts = field_column(forward_ops, 0)
    backward = backward_spans(timeline.backward_ops, forward_starts)
    forward = forward_spans(forward_ops, backward, step_bounds)
    amp_names = _names_among(timeline.host_ops, P.AMP_OPTIMIZER_OPS.__contains__)
    amp_ops = [(op.start, op.end) for op in timeline.host_ops if op.name in amp_names] if amp_names else []
    model = resolve_nesting(
        {
            "optimizer": timeline.optimizer_spans + amp_ops,
            "closure": timeline.closure_spans,
            "backward": backward,
            "forward": forward,
        }
    )
    h2d = h2d_host_ops(timeline)
    host_starts = field_column(timeline.host_ops, 0)
    h2d_merged = merge(h2d)

    # Syncs inside an H2D copy are the copy's own staging, not a user read-back; syncs inside
    # DDP's own code wait for its all-reduce (on a rank that waits for a straggler, most of it).
    data_parallel = merge(timeline.data_parallel_spans)
    comm_waits: list[SyncCall] = []
    user_syncs: list[SyncCall] = []
    for s in timeline.syncs:
        if not _contains(h2d_merged, s.start):
            (comm_waits if _contains(data_parallel, s.start) else user_syncs).append(s)

    host_intervals: dict[str, list[Interval]] = {
        "data_wait": merge(timeline.data_waits),
        "h2d_copy": h2d_merged,
        "comm_wait": merge([(s.start, s.end) for s in comm_waits]),
        "sync": merge([(s.start, s.end) for s in user_syncs]),
        "optimizer": merge(model["optimizer"]),
        "backward": merge(model["backward"]),
        "forward": merge(model["forward"]),
        "collective": merge(timeline.collectives),
    }

    gpu_intervals, kernel_labels = _gpu_intervals(timeline, host_intervals)

    median_index = _median_index([end - start for start, end in step_bounds])
    if V.steps_disjoint(step_bounds):
        per_step_phases, per_step_exposed, per_step_busy, segments, per_step_events = V.sweep(
            step_bounds,
            [_spans(host_intervals[label]) for label in _HOST_LABELS],
            [gpu_intervals[label] for label in _GPU_LABELS],
            _state,
            PHASES,
            EXPOSED,
            median_index,
            timeline.host_event_starts,
        )
    else:
        per_step_phases, per_step_exposed, per_step_busy, segments, per_step_events = _sweep(
            step_bounds, host_intervals, gpu_intervals, median_index, timeline.host_event_starts
        )

    result_steps: list[StepBreakdown] = []
    for index, mark in enumerate(steps):
        result_steps.append(
            StepBreakdown(
                number=mark.number,
                start_us=mark.start,
                duration_us=mark.end - mark.start,
                phases=per_step_phases[index],
                exposed=per_step_exposed[index],
                gpu_busy_us=per_step_busy[index],
                phase_events=per_step_events[index],
            )
        )
    kernels_by_name = _kernel_stats(timeline, result_steps, kernel_labels)
    _copy_stats(timeline, result_steps)
    # the GPU's merged busy time matters only after a sync (0.03 s on a large trace without one)
    gpu_busy = V.merged(list(gpu_intervals.values())) if user_syncs and timeline.has_gpu else []
    _sync_stats(timeline, result_steps, user_syncs, host_starts, gpu_busy)

    total = sum(s.duration_us for s in result_steps) or 1.0
    exposed_share = {k: sum(s.exposed[k] for s in result_steps) / total for k in EXPOSED}
    phase_share = {k: sum(s.phases[k] for s in result_steps) / total for k in PHASES}
    hidden_share = _hidden(phase_share, exposed_share)
    notes: list[str] = []
    if not timeline.has_step_marks:
        notes.append("the trace has no ProfilerStep marks: analysed as one window")
    if timeline.meta.unknown_categories:
        cats = ", ".join(f"{k} ({v})" for k, v in sorted(timeline.meta.unknown_categories.items()))
        notes.append(f"ignored event categories this version does not know: {cats}")
    untraced_device = _untraced_device(timeline)
    if untraced_device is not None:
        notes.append(untraced_device[1])
    if timeline.meta.detail is not None:
        notes.append(timeline.meta.detail.note())
    if timeline.meta.duplicate_events:
        notes.append(
            f"the trace holds {timeline.meta.duplicate_events} duplicated event(s) (identical to another one: "
            "was it merged or written twice?); each was counted once"
        )
    return Breakdown(
        steps=result_steps,
        has_gpu=timeline.has_gpu,
        has_step_marks=timeline.has_step_marks,
        exposed_share=exposed_share,
        phase_share=phase_share,
        hidden_share=hidden_share,
        notes=notes,
        dataloader_kinds=dict(timeline.dataloader_kinds),
        timeline_strip=_strip(segments, steps[median_index], STRIP_BINS) if median_index is not None else None,
        kernels_by_name=kernels_by_name,
        untraced_device=untraced_device[0] if untraced_device is not None else None,
    )


def _untraced_device(timeline: Timeline) -> tuple[str, str] | None:
    """The device whose work the trace does not show, and the note that says so: another
    accelerator's events (HTA's MTIA traces), or CUDA runtime calls without a single kernel, copy
    or memset (CUPTI's range profiler, which counts kernels instead of tracing them). Its steps
    then read as host time, not as a CPU-only run's."""
    if timeline.has_gpu or timeline.memsets:
        return None
    other = timeline.meta.other_device_events
    if other:
        events = ", ".join(f"{cat} ({count})" for cat, count in sorted(other.items()))
        return "an accelerator", (
            f"the trace holds another accelerator's events this version does not analyse ({events}): "
            "its device time is in no category, and the step reads as host time"
        )
    if timeline.launches:
        return "the GPU", (
            f"the trace records {len(timeline.launches)} CUDA runtime call(s) but no GPU kernel, copy or memset "
            "(was the GPU's activity traced?): the step reads as host time, the GPU's side is not analysed"
        )
    return None


def _hidden(phase_share: dict[str, float], exposed_share: dict[str, float]) -> dict[str, float]:
    """Host time per phase that ran while the GPU was busy (and so cost nothing)."""
    exposed_of_phase = {
        "data_wait": exposed_share["data_wait"],
        "h2d_copy": exposed_share["h2d_copy"],
        "forward": exposed_share["host_forward"],
        "backward": exposed_share["host_backward"],
        "optimizer": exposed_share["host_optimizer"],
        "other": exposed_share["host_other"] + exposed_share["sync"],
    }
    return {k: max(0.0, phase_share[k] - exposed_of_phase[k]) for k in PHASES}


def _launch_phase(t: float, host_intervals: dict[str, list[Interval]]) -> str:
    for label, gpu_label in (("optimizer", "gpu_optimizer"), ("backward", "gpu_backward"), ("forward", "gpu_forward")):
        if _contains(host_intervals[label], t):
            return gpu_label
    return "gpu_other"


def _model_phase_spans(host_intervals: dict[str, list[Interval]]) -> list[tuple[float, float, str]] | None:
    """The model phases' intervals as (start, end, GPU label), sorted; None where two overlap
    (built by hand: ``resolve_nesting`` makes them disjoint)."""
    spans = sorted(
        (start, end, gpu_label)
        for label, gpu_label in (
            ("optimizer", "gpu_optimizer"),
            ("backward", "gpu_backward"),
            ("forward", "gpu_forward"),
        )
        for start, end in host_intervals[label]
    )
    return None if any(a[1] > b[0] for a, b in pairwise(spans)) else spans


def _phase_lookup(host_intervals: dict[str, list[Interval]]) -> Any:
    """``_launch_phase`` as one binary search: the model phases' intervals come disjoint from
    ``resolve_nesting`` (at each instant one phase), so the one that holds ``t`` is the last to
    start at or before it. Intervals that overlap (built by hand) keep the ordered search."""
    spans = _model_phase_spans(host_intervals)
    if spans is None:
        return lambda t: _launch_phase(t, host_intervals)
    starts = [span[0] for span in spans]

    def phase(t: float) -> str:
        i = bisect_right(starts, t) - 1
        if i >= 0 and spans[i][0] <= t < spans[i][1]:
            return spans[i][2]
        return "gpu_other"

    return phase


def _gpu_intervals(timeline: Timeline, host_intervals: dict[str, list[Interval]]) -> tuple[dict[str, V.Spans], Any]:
    """GPU activity by label (start and end columns), and each kernel's label (in
    ``timeline.kernels`` order): in arrays where the launches' ids are machine integers and the
    model phases are disjoint (the reader's usual output; the labels as indices into
    ``_GPU_LABELS``), else one kernel at a time (the labels as strings)."""
    from diagnose.analysis.trace.vectorized import np

    found = _kernel_labels_vectorized(timeline, host_intervals)
    labels: np.ndarray | list[str]
    if found is not None:
        codes, starts, ends = found
        spans = {
            label: (starts[codes == i], ends[codes == i])
            for i, label in enumerate(_GPU_LABELS[: len(_GPU_COMPUTE) + 1])
        }
        labels = codes
    else:
        intervals, labels = _kernel_intervals_loop(timeline, host_intervals)
        spans = {label: _spans(intervals.get(label, [])) for label in _GPU_LABELS[: len(_GPU_COMPUTE) + 1]}
    copies: dict[str, list[Interval]] = {"copy_h2d": [], "copy_d2h": [], "copy_other": []}
    for m in timeline.memcpys:
        if m.kind.startswith("HtoD"):
            copies["copy_h2d"].append((m.start, m.end))
        elif m.kind == "DtoH":
            copies["copy_d2h"].append((m.start, m.end))
        else:
            copies["copy_other"].append((m.start, m.end))
    spans.update({label: _spans(intervals_of) for label, intervals_of in copies.items()})
    if len(timeline.memsets):  # the memsets' own columns, after the other copies
        from diagnose.analysis.trace.vectorized import floats

        memset_starts, memset_ends = (floats(field_column(timeline.memsets, i)) for i in (0, 1))
        other_starts, other_ends = spans["copy_other"]
        spans["copy_other"] = (np.concatenate([other_starts, memset_starts]), np.concatenate([other_ends, memset_ends]))
    return spans, labels


def _spans(intervals: Any) -> V.Spans:
    from diagnose.analysis.trace.vectorized import np

    if not len(intervals):
        return np.empty(0), np.empty(0)
    pairs = np.array([(start, end) for start, end in intervals], dtype=np.float64)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def _kernel_labels_vectorized(
    timeline: Timeline, host_intervals: dict[str, list[Interval]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each kernel's label as an index into ``_GPU_LABELS``, with the kernels' starts and ends;
    None where the arrays cannot say it (ids that are not machine integers, phases that overlap)."""
    from diagnose.analysis.trace import vectorized as V
    from diagnose.analysis.trace.vectorized import np

    kernels, launches = timeline.kernels, timeline.launches
    if not isinstance(kernels, C.Records) or not isinstance(launches, C.Launches):
        return None
    spans = _model_phase_spans(host_intervals)
    if spans is None:
        return None
    kernel_ids, launch_ids = V.ints(kernels.column(2)), V.ints(launches.correlations)
    if kernel_ids is None or launch_ids is None:
        return None
    starts, ends = V.floats(kernels.column(0)), V.floats(kernels.column(1))
    launched = V.launch_times(kernel_ids, launch_ids, V.floats(launches.starts))
    span_starts, span_ends = np.array([sp[0] for sp in spans]), np.array([sp[1] for sp in spans])
    span_codes = np.array([_GPU_COMPUTE.index(sp[2]) for sp in spans], dtype=np.int64)
    codes = V.labels_at(launched, span_starts, span_ends, span_codes, _GPU_COMPUTE.index("gpu_other"))
    names = kernels.column(3)
    communication = {name for name in set(names) if P.classify_kernel(name).communication}
    if communication:
        is_communication = np.fromiter((name in communication for name in names), dtype=bool, count=len(names))
        codes[is_communication] = _GPU_LABELS.index("communication")
    return codes, starts, ends


def _kernel_intervals_loop(
    timeline: Timeline, host_intervals: dict[str, list[Interval]]
) -> tuple[dict[str, list[Interval]], list[str]]:
    """The kernels' intervals by label, and each kernel's label, one kernel at a time."""
    out: dict[str, list[Interval]] = {}
    kernel_labels: list[str] = []
    launches = timeline.launches
    classify = P.classify_kernel
    phase_of_correlation: dict[int, str] = {}
    launch_phase = _phase_lookup(host_intervals)
    label: str | None
    for k in timeline.kernels:
        if classify(k.name).communication:
            label = "communication"
        else:
            label = phase_of_correlation.get(k.correlation)  # CUDA graph replays share one launch
            if label is None:
                launch = launches.get(k.correlation)
                label = launch_phase(launch[0]) if launch else "gpu_other"
                phase_of_correlation[k.correlation] = label
        out.setdefault(label, []).append((k.start, k.end))
        kernel_labels.append(label)
    return out, kernel_labels


def _sweep(
    step_bounds: list[Interval],
    host_intervals: dict[str, list[Interval]],
    gpu_intervals: dict[str, V.Spans],
    traced_step: int | None = None,
    event_starts: Sequence[float] | None = None,
) -> tuple[
    list[dict[str, float]],
    list[dict[str, float]],
    list[float],
    list[tuple[float, float, str, str]],
    list[dict[str, int]],
]:
    """One sweep over all interval boundaries; per elementary segment decide phase and cause.
    For ``traced_step`` it also returns the segments in time order: (start, end, phase, cause);
    for every step, how many of ``event_starts`` (sorted) fell in segments of each phase."""
    host_index = {label: i for i, label in enumerate(_HOST_LABELS)}
    gpu_index = {label: i for i, label in enumerate(_GPU_LABELS)}
    events: list[tuple[float, int, int, int]] = []  # (time, kind, index, delta); kind 0 host, 1 gpu
    for label, intervals in host_intervals.items():
        i = host_index[label]
        for start, end in intervals:
            events.append((start, 0, i, 1))
            events.append((end, 0, i, -1))
    for label, (gpu_starts, gpu_ends) in gpu_intervals.items():
        i = gpu_index[label]
        for start, end in zip(gpu_starts.tolist(), gpu_ends.tolist(), strict=True):
            if end > start:
                events.append((start, 1, i, 1))
                events.append((end, 1, i, -1))
    events.sort()

    phases = [dict.fromkeys(PHASES, 0.0) for _ in step_bounds]
    exposed = [dict.fromkeys(EXPOSED, 0.0) for _ in step_bounds]
    busy = [0.0 for _ in step_bounds]
    host_count = [0] * len(_HOST_LABELS)
    gpu_count = [0] * len(_GPU_LABELS)
    host_mask = gpu_mask = 0  # bit i set while label i is active (its count above 0)
    states: dict[tuple[int, int], tuple[str, tuple[str, ...], str]] = {}  # a few dozen distinct ones
    pos, n_events = 0, len(events)
    segments: list[tuple[float, float, str, str]] = []
    marks = event_starts or []
    if hasattr(marks, "column"):  # the reader's Records: index its column, not a tuple per record
        marks = marks.column(0)
    n_marks = len(marks)
    counted = [dict.fromkeys(PHASES, 0) for _ in step_bounds]
    mark = bisect_left(marks, step_bounds[0][0]) if step_bounds else 0

    def apply(kind: int, idx: int, delta: int) -> None:
        nonlocal host_mask, gpu_mask
        if kind == 0:
            host_count[idx] += delta
            host_mask = host_mask | (1 << idx) if host_count[idx] > 0 else host_mask & ~(1 << idx)
        else:
            gpu_count[idx] += delta
            gpu_mask = gpu_mask | (1 << idx) if gpu_count[idx] > 0 else gpu_mask & ~(1 << idx)

    for step_i, (s_start, s_end) in enumerate(step_bounds):
        while pos < n_events and events[pos][0] <= s_start:  # state at the step's first instant
            _, kind, idx, delta = events[pos]
            apply(kind, idx, delta)
            pos += 1
        ph, ex = phases[step_i], exposed[step_i]
        step_counted = counted[step_i]
        t_prev = s_start
        while True:
            t_next = events[pos][0] if pos < n_events and events[pos][0] < s_end else s_end
            width = t_next - t_prev
            if width > 0:
                key = (host_mask, gpu_mask)
                state = states.get(key)
                if state is None:
                    state = states[key] = _state(host_mask, gpu_mask)
                phase_name, active, cause = state
                ph[phase_name] += width
                if active:
                    share = width / len(active)
                    for label in active:
                        ex[label] += share
                else:
                    ex[cause] += width
                while mark < n_marks and marks[mark] < t_prev:  # before this step, or in a gap
                    mark += 1
                while mark < n_marks and marks[mark] < t_next:
                    step_counted[phase_name] += 1
                    mark += 1
                if gpu_mask:
                    busy[step_i] += width
                if step_i == traced_step:
                    segments.append((t_prev, t_next, phase_name, cause))
            if t_next >= s_end:
                break
            while pos < n_events and events[pos][0] == t_next:
                _, kind, idx, delta = events[pos]
                apply(kind, idx, delta)
                pos += 1
            t_prev = t_next
    return phases, exposed, busy, segments, counted


def _state(host_mask: int, gpu_mask: int) -> tuple[str, tuple[str, ...], str]:
    """What one elementary segment is, from which host labels and GPU labels are active (bit i
    of a mask: label i of ``_HOST_LABELS`` / ``_GPU_LABELS``): its phase, the GPU compute labels
    that share its time (none: the GPU is not computing) and its exposed cause."""
    state = next((label for i, label in enumerate(_HOST_LABELS) if host_mask >> i & 1), None)
    phase = state
    if phase in ("sync", "comm_wait"):  # a wait belongs to the phase around it
        phase = next(
            (_HOST_LABELS[i] for i in range(_FIRST_PHASE_LABEL, len(_HOST_LABELS)) if host_mask >> i & 1), None
        )
    phase_name = _PHASE_OF_LABEL.get(phase, "other") if phase else "other"  # a collective wait is "other"

    active = tuple(label for i, label in enumerate(_GPU_COMPUTE) if gpu_mask >> i & 1)
    if active:
        cause = active[0]
    elif gpu_mask >> _GPU_LABELS.index("communication") & 1:
        cause = "communication"
    elif gpu_mask >> _GPU_LABELS.index("copy_h2d") & 1:
        cause = "h2d_copy"
    elif gpu_mask >> _GPU_LABELS.index("copy_d2h") & 1:
        cause = "sync"
    elif gpu_mask >> _GPU_LABELS.index("copy_other") & 1:
        cause = "gpu_other"
    else:
        cause = _STATE_TO_EXPOSED[state]
    return phase_name, active, cause


# --- one step in time order -------------------------------------------------------------------

STRIP_BINS = 240


def _median_index(durations: list[float]) -> int | None:
    """The step of median duration (the lower one of two)."""
    if not durations:
        return None
    order = sorted(range(len(durations)), key=lambda i: durations[i])
    return order[(len(order) - 1) // 2]


def _strip(segments: list[tuple[float, float, str, str]], step: Any, bins: int) -> dict[str, Any]:
    """The step's segments cut into ``bins`` equal slices; each slice shows the phase and the
    cause that filled most of it. Run-length encoded: ``[[label, slices], ...]``."""
    start, width = step.start, (step.end - step.start) / bins
    phase_time = [dict[str, float]() for _ in range(bins)]
    cause_time = [dict[str, float]() for _ in range(bins)]
    for seg_start, seg_end, phase, cause in segments:
        first = min(bins - 1, int((seg_start - start) / width))
        last = min(bins - 1, int((seg_end - start) / width))
        for b in range(first, last + 1):
            lo, hi = max(seg_start, start + b * width), min(seg_end, start + (b + 1) * width)
            if hi > lo:
                phase_time[b][phase] = phase_time[b].get(phase, 0.0) + hi - lo
                cause_time[b][cause] = cause_time[b].get(cause, 0.0) + hi - lo

    def encode(slices: list[dict[str, float]]) -> list[list[Any]]:
        runs: list[list[Any]] = []
        for times in slices:
            label = max(times, key=times.__getitem__) if times else "other"
            if runs and runs[-1][0] == label:
                runs[-1][1] += 1
            else:
                runs.append([label, 1])
        return runs

    return {
        "step": step.number,
        "duration_us": step.end - step.start,
        "bins": bins,
        "phases": encode(phase_time),
        "exposed": encode(cause_time),
    }


# --- profiler overhead -----------------------------------------------------------------------


#: a steady (profiler-off) step this many times the profiled one is said in a note: the shares,
#: which stay the profiled step's, would otherwise switch basis without a word
STEADY_SLOWER = 1.10
#: the steady steps' measured data wait this much over the profiled ones' explains a slower steady step
STEADY_WAIT_GAP = 0.10


def calibrate_to_steady_state(
    bd: Breakdown, steady_step_us: float, tolerance: float = 0.02, steady_data_wait: float | None = None
) -> Breakdown:
    """Correct the exposed view for the profiler's own host overhead.

    Profiling records every operator and kernel launch, which slows the host: a loop that
    launches many kernels looks more host-bound in the trace than it is. The steady-state step
    (timed with the profiler off) says by how much. GPU work is barely affected, so the host
    categories are scaled by ``k = (t_steady - g) / (t_profiled - g)`` (``g``: GPU-side time per
    step) and the shares re-expressed over the steady step; they still sum to one. When the
    profiled steps are not slower (data-bound loops), nothing changes; when the steady steps are
    much slower (``STEADY_SLOWER``), nothing changes either, and a note says so, naming the
    steady steps' measured data wait (``steady_data_wait``) where it explains the difference: a
    window right after the warm-up can draw the batches the DataLoader workers queued before it.
    """
    n = len(bd.steps)
    if not n or steady_step_us <= 0:
        return bd
    t_profiled = bd.total_us / n
    inflation = t_profiled / steady_step_us
    if inflation * STEADY_SLOWER <= 1:  # said, as the opposite case is: the shares stay the trace's
        window_wait = bd.phase_share.get("data_wait", 0.0)
        why = (
            f"its steps waited {steady_data_wait:.0%} of their time for data, the profiled ones {window_wait:.0%}: "
            "the window drew batches the DataLoader workers had queued before it"
            if steady_data_wait is not None and steady_data_wait >= window_wait + STEADY_WAIT_GAP
            else "the script changed pace after the window: evaluation, checkpoints, a slower stretch of data, a "
            "busier machine"
        )
        note = (
            f"the profiler-off window was {100 * (1 / inflation - 1):.0f}% slower than the profiled one "
            f"({steady_step_us / 1e3:.1f} vs {t_profiled / 1e3:.1f} ms/step): the shares are of the profiled step, "
            f"not corrected to the steady one ({why})"
        )
        return replace(bd, profiler_inflation=inflation, notes=[*bd.notes, note])
    if inflation <= 1 + tolerance:
        return replace(bd, profiler_inflation=inflation)
    per_step = {k: v * t_profiled for k, v in bd.exposed_share.items()}
    gpu = sum(per_step[c] for c in GPU_EXPOSED)
    host = t_profiled - gpu
    if steady_step_us > gpu and host > 0:
        scale = (steady_step_us - gpu) / host
        corrected = {c: (per_step[c] * scale if c in HOST_EXPOSED else per_step[c]) / steady_step_us for c in EXPOSED}
    else:  # even the GPU work took longer than a steady step: only it is left to show
        corrected = {c: (per_step[c] / gpu if c in GPU_EXPOSED and gpu else 0.0) for c in EXPOSED}
    note = (
        f"profiling made steps {100 * (inflation - 1):.0f}% slower than with the profiler off; "
        "the exposed shares are corrected to the steady-state step (report.json keeps the trace's own)"
    )
    return replace(
        bd,
        exposed_share=corrected,
        trace_exposed_share=dict(bd.exposed_share),
        profiler_inflation=inflation,
        notes=[*bd.notes, note],
    )


# --- per-step counters ----------------------------------------------------------------------------


def _step_of(step_starts: list[float], steps: list[StepBreakdown], t: float) -> int | None:
    i = bisect_right(step_starts, t) - 1
    if i >= 0 and t < steps[i].start_us + steps[i].duration_us:
        return i
    return None


def _kernel_stats(
    timeline: Timeline, steps: list[StepBreakdown], kernel_labels: Sequence[str] | np.ndarray
) -> dict[str, tuple[float, int]]:
    """Fill the steps' kernel figures; return each kernel name's time and calls over the steps.
    In arrays for the reader's kernels (the loop below gives the same, to the last bit: each sum
    is taken in kernel order), one kernel at a time otherwise."""
    if isinstance(timeline.kernels, C.Records) and len(timeline.kernels) and steps:
        return _kernel_stats_vectorized(timeline.kernels, steps, kernel_labels)
    if not isinstance(kernel_labels, list):  # indices into _GPU_LABELS
        kernel_labels = [_GPU_LABELS[code] for code in cast("np.ndarray", kernel_labels).tolist()]
    return _kernel_stats_loop(timeline.kernels, steps, kernel_labels)


def _kernel_stats_loop(
    kernels: Any, steps: list[StepBreakdown], kernel_labels: Sequence[str]
) -> dict[str, tuple[float, int]]:
    starts = [s.start_us for s in steps]
    durations: list[list[float]] = [[] for _ in steps]
    by_name: dict[str, tuple[float, int]] = {}
    classify = P.classify_kernel
    for k, label in zip(kernels, kernel_labels, strict=True):
        i = _step_of(starts, steps, k.start)
        if i is None:
            continue
        step = steps[i]
        dur = k.end - k.start
        total, calls = by_name.get(k.name, (0.0, 0))
        by_name[k.name] = (total + dur, calls + 1)
        durations[i].append(dur)
        step.kernel_count += 1
        step.kernel_time_us += dur
        cls = classify(k.name)
        if cls.precision is not None:
            step.matmul_us[cls.precision] = step.matmul_us.get(cls.precision, 0.0) + dur
            if cls.convolution:
                step.conv_us += dur
        if cls.layout_transpose:
            step.transpose_us += dur
        if cls.triton:
            step.triton_us += dur
        if cls.communication:
            step.communication_us += dur
        if label == "gpu_optimizer":
            step.optimizer_kernels += 1
            if cls.multi_tensor:
                step.multi_tensor_kernels += 1
    for step, durs in zip(steps, durations, strict=True):
        step.median_kernel_us = statistics.median(durs) if durs else None
    return by_name


def _kernel_stats_vectorized(
    kernels: Any, steps: list[StepBreakdown], kernel_labels: Sequence[str] | np.ndarray
) -> dict[str, tuple[float, int]]:
    from diagnose.analysis.trace import vectorized as V
    from diagnose.analysis.trace.vectorized import np

    starts, ends, names = V.floats(kernels.column(0)), V.floats(kernels.column(1)), kernels.column(3)
    step_starts = np.array([s.start_us for s in steps])
    step_ends = np.array([s.start_us + s.duration_us for s in steps])  # as ``_step_of`` adds them
    step = np.searchsorted(step_starts, starts, side="right") - 1
    chosen = np.flatnonzero((step >= 0) & (starts < step_ends[np.maximum(step, 0)]))
    step, durations = step[chosen], (ends - starts)[chosen]
    # each distinct name, numbered in the order first met (the names mapped in C: a large
    # trace has a few hundred thousand kernels and a few hundred names)
    code_of: dict[str, int] = {name: code for code, name in enumerate(dict.fromkeys(names))}
    codes = np.fromiter(map(code_of.__getitem__, names), dtype=np.int64, count=len(names))[chosen]
    distinct = list(code_of)
    classes = [P.classify_kernel(name) for name in distinct]

    by_name: dict[str, tuple[float, int]] = {}
    if len(codes):
        totals, calls = np.bincount(codes, weights=durations).tolist(), np.bincount(codes).tolist()
        _, seen_first = np.unique(codes, return_index=True)
        for code in np.unique(codes)[np.argsort(seen_first, kind="stable")].tolist():  # in the order first met
            by_name[distinct[code]] = (totals[code], calls[code])

    n = len(steps)

    def time_per_step(flags: list[bool]) -> list[float]:
        """The time of the kernels whose name's flag is set, per step."""
        mask = np.array(flags, dtype=bool)[codes]
        times: list[float] = np.bincount(step[mask], weights=durations[mask], minlength=n).tolist()
        return times

    time_of = np.bincount(step, weights=durations, minlength=n).tolist()
    count_of = np.bincount(step, minlength=n).tolist()
    conv = time_per_step([c.precision is not None and c.convolution for c in classes])
    transpose = time_per_step([c.layout_transpose for c in classes])
    triton = time_per_step([c.triton for c in classes])
    communication = time_per_step([c.communication for c in classes])
    if isinstance(kernel_labels, np.ndarray):  # indices into _GPU_LABELS
        optimizer = (kernel_labels == _GPU_LABELS.index("gpu_optimizer"))[chosen]
    else:
        optimizer = np.fromiter(map("gpu_optimizer".__eq__, kernel_labels), dtype=bool, count=len(kernel_labels))[
            chosen
        ]
    multi_tensor = (
        np.array([c.multi_tensor for c in classes], dtype=bool)[codes] if len(codes) else np.zeros(0, dtype=bool)
    )
    optimizer_count = np.bincount(step[optimizer], minlength=n).tolist()
    multi_tensor_count = np.bincount(step[optimizer & multi_tensor], minlength=n).tolist()
    for i, s in enumerate(steps):
        s.kernel_count += count_of[i]
        s.kernel_time_us += time_of[i]
        s.conv_us += conv[i]
        s.transpose_us += transpose[i]
        s.triton_us += triton[i]
        s.communication_us += communication[i]
        s.optimizer_kernels += optimizer_count[i]
        s.multi_tensor_kernels += multi_tensor_count[i]

    # matmul time by precision, each step's precisions in the order its kernels first show them
    precisions = sorted({c.precision for c in classes if c.precision is not None})
    if precisions:
        precision_code = np.array(
            [precisions.index(c.precision) if c.precision is not None else -1 for c in classes], dtype=np.int64
        )[codes]
        matmul = precision_code >= 0
        pair = step[matmul] * len(precisions) + precision_code[matmul]
        sums = np.bincount(pair, weights=durations[matmul], minlength=n * len(precisions)).tolist()
        met, first = np.unique(pair, return_index=True)
        for key in met[np.argsort(first, kind="stable")].tolist():
            at, precision = divmod(key, len(precisions))
            steps[at].matmul_us[precisions[precision]] = steps[at].matmul_us.get(precisions[precision], 0.0) + sums[key]

    order = np.argsort(step, kind="stable")
    bounds = np.searchsorted(step[order], np.arange(n + 1))
    ordered = durations[order]
    for i, s in enumerate(steps):
        a, b = int(bounds[i]), int(bounds[i + 1])
        s.median_kernel_us = float(np.median(ordered[a:b])) if b > a else None
    return by_name


def _copy_stats(timeline: Timeline, steps: list[StepBreakdown]) -> None:
    starts = [s.start_us for s in steps]
    for m in timeline.memcpys:
        launch = timeline.launches.get(m.correlation)
        i = _step_of(starts, steps, launch[0] if launch else m.start)
        if i is None:
            continue
        step = steps[i]
        if m.kind.startswith("HtoD"):
            if m.kind == "HtoD-pageable":
                step.h2d_pageable_bytes += m.nbytes
            else:
                step.h2d_pinned_bytes += m.nbytes
            step.h2d_copies += 1
            step.h2d_copy_us += m.end - m.start
        elif m.kind == "DtoH":
            step.d2h_bytes += m.nbytes


def _sync_stats(
    timeline: Timeline,
    steps: list[StepBreakdown],
    user_syncs: list[SyncCall],
    host_starts: Sequence[float],
    gpu_busy: list[Interval],
) -> None:
    """Count the syncs per step and kind; add the GPU's idle time after each one (``gpu_busy``:
    merged GPU activity, every stream). A sync that returns while the GPU still works (another
    stream, a collective) leaves no idle time; idle spans that several syncs share count once."""
    starts = [s.start_us for s in steps]
    busy_starts = [b[0] for b in gpu_busy]
    idle_after: list[list[Interval]] = [[] for _ in steps]
    for sync in user_syncs:
        i = _step_of(starts, steps, sync.start)
        if i is None:
            continue
        step = steps[i]
        step.sync_count += 1
        step.sync_blocked_us += sync.end - sync.start
        op = _enclosing(timeline.host_ops, host_starts, sync.start)
        kind = P.SYNC_OP_KINDS.get(op.name, "other op") if op is not None else "synchronize"
        step.syncs_by_kind[kind] = step.syncs_by_kind.get(kind, 0) + 1
        if not timeline.has_gpu:
            continue
        # After a sync the GPU's queue is empty: it idles until the host launches the next work.
        k = bisect_right(busy_starts, sync.end)
        if k > 0 and gpu_busy[k - 1][1] > sync.end:
            continue  # still busy when the host got control back
        step_end = step.start_us + step.duration_us
        next_busy = busy_starts[k] if k < len(busy_starts) else step_end
        if min(next_busy, step_end) > sync.end:
            idle_after[i].append((sync.end, min(next_busy, step_end)))
    for step, spans in zip(steps, idle_after, strict=True):
        step.sync_idle_after_us += sum(end - start for start, end in merge(spans))
    for t in timeline.graph_launches:
        i = _step_of(starts, steps, t)
        if i is not None:
            steps[i].graph_launches += 1


# --- one statistic per table ------------------------------------------------------------------

#: the quantiles of the per-step spread every table shows beside the mean
SPREAD_QUANTILES = (0.1, 0.9)


@dataclass(frozen=True)
class PerStep:
    """One category's time per step: the mean, and the p10-p90 range of the steps (µs).

    The mean is the category's share times the reference step, so that a table's ms column and
    its share column say the same thing (ms = share x step)."""

    mean_us: float
    low_us: float
    high_us: float


def one_step(bd: Breakdown, index: int) -> Breakdown:
    """The breakdown of one of its steps alone (shares of that step, uncalibrated): what the
    symptoms are computed on to find their step-to-step spread."""
    step = bd.steps[index]
    total = step.duration_us or 1.0
    exposed_share = {k: step.exposed.get(k, 0.0) / total for k in EXPOSED}
    phase_share = {k: step.phases.get(k, 0.0) / total for k in PHASES}
    return Breakdown(
        steps=[step],
        has_gpu=bd.has_gpu,
        has_step_marks=bd.has_step_marks,
        exposed_share=exposed_share,
        phase_share=phase_share,
        hidden_share=_hidden(phase_share, exposed_share),
        dataloader_kinds=bd.dataloader_kinds,
        untraced_device=bd.untraced_device,
    )


def reference_step_us(bd: Breakdown, view: str = "exposed") -> float:
    """The step the shares of ``view`` are shares of: the steady (profiler-off) step for the
    calibrated exposed view, else the profiled window's mean step."""
    n = len(bd.steps)
    profiled_mean = bd.total_us / n if n else 0.0
    if view == "exposed" and bd.trace_exposed_share is not None and bd.profiler_inflation:
        return profiled_mean / bd.profiler_inflation
    return profiled_mean


def per_step_stats(bd: Breakdown, view: str) -> dict[str, PerStep]:
    """Mean and spread per category of ``view`` ("exposed" or "phases").

    The spread is read off the profiled steps; when the exposed view was calibrated to the
    steady state, each category's per-step values are scaled by the same factor as its mean."""
    shares = bd.exposed_share if view == "exposed" else bd.phase_share
    step_us = reference_step_us(bd, view)
    out: dict[str, PerStep] = {}
    for key, share in shares.items():
        values = [getattr(s, view).get(key, 0.0) for s in bd.steps]
        mean_us = share * step_us
        measured_mean = sum(values) / len(values) if values else 0.0
        scale = mean_us / measured_mean if measured_mean > 0 else 0.0
        low, high = (quantile(values, q) * scale for q in SPREAD_QUANTILES)
        out[key] = PerStep(mean_us, low, high)
    return out
