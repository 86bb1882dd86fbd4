"""Run records built by hand: step boundaries from step times, under a window plan.

``record_from_steps([10, 30, 30, 500, 20, ...], WindowPlan(warmup=1, steps=2, timed=4), 8)``: the
boundaries from 0 s at the given step times (ms), the plan's profiled and timed steps, and the
timed steps' synchronised sum as the runner records it (after ``timed_skipped`` untimed ones)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from diagnose.record import RunRecord, WindowPlan


def record_from_steps(
    durations_ms: list[float], plan: WindowPlan, samples: int, timed_skipped: int = 0, **fields: Any
) -> RunRecord:
    boundaries = [0.0]
    for d in durations_ms:
        boundaries.append(boundaries[-1] + d / 1000)
    first = plan.first_timed + timed_skipped
    return RunRecord(
        plan=asdict(plan),
        boundaries_s=boundaries,
        samples_per_step=[samples] * len(durations_ms),
        profiled_steps=plan.steps,
        timed_steps=plan.timed,
        timed_skipped=timed_skipped,
        timed_seconds=boundaries[first + plan.timed] - boundaries[first],
        **fields,
    )
