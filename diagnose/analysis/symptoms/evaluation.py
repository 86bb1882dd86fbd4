"""Evaluation passes inside the training steps of the profiled window (``RunRecord.eval_spans_s``:
``model.eval()`` to ``model.train()`` with no backward or optimizer step between)."""

from __future__ import annotations

from diagnose.analysis.symptoms.registry import symptom
from diagnose.record import RunRecord


def _profiled_steps(record: RunRecord) -> list[tuple[float, float]]:
    """The profiled steps' (start, end), as ``perf_counter`` seconds; empty where the record has
    no window, or holds no evaluation pass."""
    if not record.eval_spans_s or not record.plan or record.profiled_steps <= 0:
        return []
    first = record.window_plan().warmup
    b = record.boundaries_s
    return [(b[i], b[i + 1]) for i in range(first, min(first + record.profiled_steps, len(b) - 1))]


def _overlap(start: float, end: float, lo: float, hi: float) -> float:
    return max(0.0, min(end, hi) - max(start, lo))


@symptom(
    "step.eval_share",
    "share",
    "share of the profiled steps' time spent in evaluation passes (a model in eval mode, no backward or optimizer step, "
    "until it trains again)",
)
def eval_share(record: RunRecord) -> float | None:
    steps = _profiled_steps(record)
    if not steps:
        return None
    lo, hi = steps[0][0], steps[-1][1]
    inside = sum(_overlap(start, end, lo, hi) for start, end in record.eval_spans_s)
    return min(1.0, inside / (hi - lo)) if hi > lo else None


@symptom(
    "step.eval_steps",
    "share",
    "share of the profiled steps that hold an evaluation pass (1: the script evaluates inside every training step)",
)
def eval_steps(record: RunRecord) -> float | None:
    steps = _profiled_steps(record)
    if not steps:
        return None
    held = sum(1 for lo, hi in steps if any(_overlap(s, e, lo, hi) > 0 for s, e in record.eval_spans_s))
    return held / len(steps)


@symptom("step.eval_passes", "count", "evaluation passes that began inside the profiled window")
def eval_passes(record: RunRecord) -> int | None:
    steps = _profiled_steps(record)
    if not steps:
        return None
    lo, hi = steps[0][0], steps[-1][1]
    return sum(1 for start, _ in record.eval_spans_s if lo <= start < hi)
