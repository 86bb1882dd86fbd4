"""Communication by collective kind (all-gather, reduce-scatter, all-reduce, ...): how long each
kind is in flight per step, and how much of that runs with compute beside it (overlapped) or
alone (exposed). FSDP's cost is its all-gathers (forward and backward) and reduce-scatters
(backward); DDP's is its gradient all-reduce. Pure, no torch.

Contract: ``collective_times(timeline, steps) -> dict[kind, CollectiveTime]`` over the profiled
steps, per step.

Where a collective is and what "beside compute" means:

* NCCL (GPU): the communication kernels (``ncclDevKernel_AllGather_...``); compute is every other
  kernel, on any stream. Exposed is the kernel time with no compute kernel running.
* gloo/MPI/UCC (CPU): the backend's own annotations (``gloo:all_gather`` ...) on its worker
  threads; compute is the training threads' work (forward and backward operators, the optimizer,
  the main thread's top-level operators other than the collectives' own ``c10d::`` calls). gloo
  runs a reduce-scatter as an all-reduce: its kind is that of the ``c10d::`` call that issued it
  (the training threads' last one before it started: FSDP issues reduce-scatters from the
  autograd thread).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from diagnose.analysis.measure.breakdown import merge
from diagnose.analysis.trace.patterns import classify_kernel as classify
from diagnose.analysis.trace.timeline import Interval, Timeline

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "send_recv", "other")

# the order matters: "_reduce_scatter_base_" holds "reduce", "allgather_into_tensor" holds "all"
_KIND_PATTERNS = (
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.I)),
    ("all_gather", re.compile(r"all_?gather", re.I)),
    ("all_reduce", re.compile(r"all_?reduce", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("send_recv", re.compile(r"send|recv|all_?to_?all", re.I)),
)
#: main-thread operators that issue or wait for a collective: not compute
_COMMUNICATION_OPS = ("c10d::", "nccl:", "gloo:", "record_param_comms")


def collective_kind(name: str) -> str:
    """``ncclDevKernel_AllGather_RING_LL`` -> "all_gather", ``c10d::_reduce_scatter_base_`` ->
    "reduce_scatter"; a name of no known kind -> "other"."""
    for kind, pattern in _KIND_PATTERNS:
        if pattern.search(name):
            return kind
    return "other"


@dataclass(frozen=True)
class CollectiveTime:
    """One kind of collective, per profiled step (median-free: the window's total over its steps)."""

    kind: str
    calls_per_step: float
    ms: float  # in flight, per step (calls that overlap one another count once)
    exposed_ms: float  # with no compute beside it
    overlapped_ms: float  # with compute beside it

    def to_dict(self) -> dict[str, float]:
        return {
            "calls_per_step": self.calls_per_step,
            "ms": self.ms,
            "exposed_ms": self.exposed_ms,
            "overlapped_ms": self.overlapped_ms,
        }


def collective_times(timeline: Timeline) -> dict[str, CollectiveTime]:
    """Each kind's time in flight per profiled step, split into exposed and overlapped."""
    steps = [(s.start, s.end) for s in timeline.steps]
    if not steps:
        return {}
    by_kind, compute = _gpu_collectives(timeline) if timeline.has_gpu else _cpu_collectives(timeline)
    compute = _clip(merge(compute), steps)
    result = {}
    for kind in KINDS:
        spans = by_kind.get(kind)
        if not spans:
            continue
        in_flight = _clip(merge(spans), steps)
        total = _length(in_flight)
        overlapped = _length(_intersect(in_flight, compute))
        calls = sum(1 for start, _ in spans if any(a <= start < b for a, b in steps))
        n = len(steps)
        result[kind] = CollectiveTime(
            kind,
            round(calls / n, 3),
            round(total / n / 1000, 4),
            round((total - overlapped) / n / 1000, 4),
            round(overlapped / n / 1000, 4),
        )
    return result


def _gpu_collectives(timeline: Timeline) -> tuple[dict[str, list[Interval]], list[Interval]]:
    by_kind: dict[str, list[Interval]] = {}
    compute: list[Interval] = []
    for k in timeline.kernels:
        if classify(k.name).communication:
            by_kind.setdefault(collective_kind(k.name), []).append((k.start, k.end))
        else:
            compute.append((k.start, k.end))
    return by_kind, compute


def _cpu_collectives(timeline: Timeline) -> tuple[dict[str, list[Interval]], list[Interval]]:
    issued = timeline.collective_calls
    issued_starts = [op.start for op in issued]
    by_kind: dict[str, list[Interval]] = {}
    for op in timeline.collective_ops:
        i = bisect.bisect_right(issued_starts, op.start) - 1
        # the issuing call names the kind (gloo's reduce-scatter runs as "gloo:all_reduce")
        kind = collective_kind(issued[i].name) if i >= 0 else "other"
        if kind == "other":
            kind = collective_kind(op.name)
        by_kind.setdefault(kind, []).append((op.start, op.end))
    compute = [*timeline.forward_ops, *timeline.backward_ops, *timeline.optimizer_spans]
    compute += [(op.start, op.end) for op in timeline.host_ops if not op.name.startswith(_COMMUNICATION_OPS)]
    return by_kind, compute


def _length(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def _intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The overlap of two merged, sorted interval lists."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _clip(intervals: list[Interval], steps: list[Interval]) -> list[Interval]:
    return _intersect(intervals, merge(steps))
