"""Run records built by hand: step boundaries from step times, under a window plan.

``record_from_steps([10, 30, 30, 500, 20, ...], WindowPlan(warmup=1, steps=2, timed=4), 8)``: the
boundaries from 0 s at the given step times (ms), the plan's profiled and timed steps, and the
timed steps' synchronised sum as the runner records it (after ``timed_skipped`` untimed ones).
``report_of_record(record)``: the report of such a record alone (no trace, no symptoms)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from diagnose.record import RunRecord, WindowPlan

if TYPE_CHECKING:
    from diagnose.analysis.report import Report


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


def report_of_record(record: RunRecord) -> Report:
    """The report of ``record`` alone: no trace, no symptoms, no diagnosis (its throughput, warnings)."""
    from diagnose.analysis.report import build_report
    from diagnose.analysis.symptoms import Symptoms

    return build_report(
        record=record, meta=None, breakdown=None, symptoms=Symptoms({}), diagnosis=None, source={}, limit=None
    )
