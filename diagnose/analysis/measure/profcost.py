"""The profiler's own cost per recorded event, estimated from a trace that comes alone.

Contract: ``estimate_cost_per_event(timeline) -> ProfilerCost`` and
``correct_profiler_cost(breakdown, cost_us) -> Breakdown``; pure, no torch.

With a run record, ``breakdown.calibrate_to_steady_state`` corrects the trace with the step timed
with the profiler off. A trace a user's own ``torch.profiler`` wrote has no such step, yet the
profiler slowed its host just the same: every operator and CUDA call it records costs the host
some bookkeeping, so a loop that records many looks more host-bound (launch-bound) than it is.

How the cost is estimated (tests/test_profcost.py checks both ways):

* read off the trace: the median recorded length of its no-work operators (``aten::view`` and
  kin, ``patterns.NO_WORK_OPS``: metadata only, well under a microsecond unprofiled) measures how
  fast this host does the profiler's bookkeeping; the cost per event is ``COST_PER_NO_WORK_OP``
  times it;
* a calibrated constant, ``DEFAULT_COST_US``, for a trace with none of those operators, never
  more than the median recorded length of its top-level operators (the profiler cannot spend
  more an event than the events it recorded take).

Both come from the recorded H200 runs under tests/data/ (trace plus the step timed with the
profiler off): profiled minus steady step, over the events recorded on the training threads,
gave 1.7 µs (well_tuned), 3.5 µs (launch_bound) and 4.7 µs (forloop_optimizer) per event, median
3.5 µs, where those traces' no-work operators took a median 2.0 µs: 1.75 times.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from diagnose.analysis.measure.breakdown import Breakdown
from diagnose.analysis.measure.categories import EXPOSED
from diagnose.analysis.trace.timeline import Timeline

#: profiler cost per recorded event over the median recorded length of a no-work operator
COST_PER_NO_WORK_OP = 1.75
#: profiler cost per recorded event (µs) where the trace has no no-work operator to measure by
DEFAULT_COST_US = 3.5
#: fewer no-work operators than this and their median says too little: use the constant
MIN_NO_WORK_OPS = 20


@dataclass(frozen=True)
class ProfilerCost:
    per_event_us: float
    #: how it was found: "read off the trace" or "calibrated constant"
    source: str


def estimate_cost_per_event(timeline: Timeline) -> ProfilerCost:
    if len(timeline.no_work_op_us) >= MIN_NO_WORK_OPS:
        return ProfilerCost(COST_PER_NO_WORK_OP * statistics.median(timeline.no_work_op_us), "read off the trace")
    # never more than the trace's own operators take: where they are recorded a fraction of a
    # microsecond long (kineto's own test trace, 0.13 µs apart), 3.5 µs an event made the steps
    # "an estimated 550% slower" than unprofiled
    lengths = [op.end - op.start for op in timeline.host_ops]
    typical = statistics.median(lengths) if lengths else DEFAULT_COST_US
    if typical < DEFAULT_COST_US:
        return ProfilerCost(max(typical, 0.0), "the recorded operators' median length (under the calibrated constant)")
    return ProfilerCost(DEFAULT_COST_US, "calibrated constant")


#: the exposed category that holds the GPU's idle time while the host is in each phase
_EXPOSED_OF_PHASE = {
    "data_wait": "data_wait",
    "h2d_copy": "h2d_copy",
    "forward": "host_forward",
    "backward": "host_backward",
    "optimizer": "host_optimizer",
    "other": "host_other",
}


def correct_profiler_cost(bd: Breakdown, cost_per_event_us: float, tolerance: float = 0.02) -> Breakdown:
    """Correct the exposed view for the profiler's own per-event cost, estimated (no steady step).

    A bare trace comes with no step timed with the profiler off, so ``calibrate_to_steady_state``
    cannot say how much profiling slowed the host. Each event the profiler records on the
    training threads (an operator, a CUDA runtime call) costs the host about
    ``cost_per_event_us`` of bookkeeping. Where the host is behind the GPU, every such cost in a
    phase delays the phase's next launch and so lengthens the GPU's idle time in it: the phase's
    exposed host category loses the cost of the phase's events (``StepBreakdown.phase_events``),
    never more than its own time; where the host runs ahead, that time is near zero and the
    bound keeps it so. Waits (syncs, communication) are not made of recorded events and stay.
    The shares are re-expressed over the corrected step; the trace's own stay in
    ``trace_exposed_share``.
    """
    if not bd.steps or cost_per_event_us <= 0:
        return bd
    corrected = dict.fromkeys(EXPOSED, 0.0)
    for step in bd.steps:
        removed = {
            cat: min(step.exposed[cat], cost_per_event_us * step.phase_events.get(phase, 0))
            for phase, cat in _EXPOSED_OF_PHASE.items()
        }
        for cat in EXPOSED:
            corrected[cat] += step.exposed[cat] - removed.get(cat, 0.0)
    total = sum(corrected.values())
    inflation = bd.total_us / total if total > 0 else 1.0
    if total <= 0 or inflation <= 1 + tolerance:
        return replace(bd, profiler_inflation=inflation if total > 0 else None)
    note = (
        f"the profiler's own cost (about {cost_per_event_us:.1f} µs per recorded event) made the "
        f"traced steps an estimated {100 * (inflation - 1):.0f}% slower; the exposed shares are corrected for it "
        "(report.json keeps the trace's own)"
    )
    return replace(
        bd,
        exposed_share={cat: us / total for cat, us in corrected.items()},
        trace_exposed_share=dict(bd.exposed_share),
        profiler_inflation=inflation,
        notes=[*bd.notes, note],
    )
