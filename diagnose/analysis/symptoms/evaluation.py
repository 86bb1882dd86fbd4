"""Evaluation passes inside the training steps of the profiled window (``RunRecord.eval_spans_s``:
``model.eval()`` to ``model.train()`` with no backward or optimizer step between)."""

from __future__ import annotations

from diagnose.analysis.symptoms.registry import symptom
from diagnose.record import RunRecord


def _window(record: RunRecord) -> tuple[float, float, list[tuple[float, float]]] | None:
    """The profiled window's start and end and its steps, as ``perf_counter`` seconds (None:
    the record has no window, or it holds no evaluation pass)."""
    if not record.eval_spans_s or not record.plan or record.profiled_steps <= 0:
        return None
    first = record.window_plan().warmup
    b = record.boundaries_s
    last = min(first + record.profiled_steps, len(b) - 1)
    if last <= first:
        return None
    return b[first], b[last], [(b[i], b[i + 1]) for i in range(first, last)]


def _overlap(start: float, end: float, lo: float, hi: float) -> float:
    return max(0.0, min(end, hi) - max(start, lo))


@symptom(
    "step.eval_share",
    "share",
    "share of the profiled steps' time spent in evaluation passes (a model in eval mode, no backward or optimizer step, "
    "until it trains again)",
)
def eval_share(record: RunRecord) -> float | None:
    window = _window(record)
    if window is None:
        return None
    lo, hi, _ = window
    inside = sum(_overlap(start, end, lo, hi) for start, end in record.eval_spans_s)
    return min(1.0, inside / (hi - lo)) if hi > lo else None


@symptom(
    "step.eval_steps",
    "share",
    "share of the profiled steps that hold an evaluation pass (1: the script evaluates inside every training step)",
)
def eval_steps(record: RunRecord) -> float | None:
    window = _window(record)
    if window is None:
        return None
    _, _, steps = window
    held = sum(1 for lo, hi in steps if any(_overlap(s, e, lo, hi) > 0 for s, e in record.eval_spans_s))
    return held / len(steps)


@symptom("step.eval_passes", "count", "evaluation passes that began inside the profiled window")
def eval_passes(record: RunRecord) -> int | None:
    window = _window(record)
    if window is None:
        return None
    lo, hi, _ = window
    return sum(1 for start, _ in record.eval_spans_s if lo <= start < hi)
