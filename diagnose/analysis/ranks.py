"""The ranks of a distributed run side by side: one summary row per rank, the straggler, the
job's throughput. Pure, no torch; the launcher side (rank variables, torchrun, the shared run
directory) is ``diagnose.distributed``.

Contract: ``summarize_rank(rank, record, breakdown) -> RankSummary`` per rank;
``RankSet.of(summaries)`` holds them with their straggler, the input of the ``dist.*`` symptoms
(``diagnose.analysis.symptoms.distributed``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from diagnose.analysis.breakdown import Breakdown
from diagnose.record import RunRecord


@dataclass
class RankSummary:
    rank: int
    status: str
    median_step_ms: float | None
    data_wait_ms: float | None  # exposed, per step (median)
    data_wait_share: float | None
    communication_ms: float | None  # kernel time per step (median)
    exposed_communication_share: float | None
    gpu_busy: float | None
    samples_per_step: float | None
    top_exposed: str | None
    backend: str | None
    #: measured with the profiler off, after the window (None when too few steps ran)
    steady_samples_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize_rank(rank: int, record: RunRecord, bd: Breakdown | None) -> RankSummary:
    """One rank's row of the side-by-side table."""
    steps = bd.steps if bd is not None else []
    median_step = _median([s.duration_us for s in steps])
    top = max(bd.exposed_share, key=bd.exposed_share.get) if bd is not None else None  # type: ignore[arg-type]
    comm_us = _median([s.communication_us for s in steps])
    exposed_comm = bd.exposed_share["communication"] if bd is not None else None
    data_wait_share = bd.exposed_share["data_wait"] if bd is not None else None
    return RankSummary(
        rank=rank,
        status=record.status,
        median_step_ms=median_step / 1000 if median_step is not None else None,
        data_wait_ms=(data_wait_share * median_step / 1000) if data_wait_share is not None and median_step else None,
        data_wait_share=data_wait_share,
        communication_ms=comm_us / 1000 if comm_us is not None else None,
        exposed_communication_share=exposed_comm,
        gpu_busy=(sum(s.gpu_busy_us for s in steps) / bd.total_us) if bd is not None and bd.has_gpu and bd.total_us else None,
        samples_per_step=record.batch_size(),
        top_exposed=top,
        backend=(record.distributed or {}).get("backend"),
        steady_samples_per_s=(
            round(record.timed_samples / record.timed_seconds, 3) if record.timed_samples and record.timed_seconds else None
        ),
    )


def job_samples_per_s(summaries: list[RankSummary]) -> float | None:
    """The whole job's steady throughput: every rank trains on its own samples, so they add up."""
    rates = [s.steady_samples_per_s for s in summaries]
    if not rates or any(r is None for r in rates):
        return None
    return round(sum(r for r in rates if r is not None), 3)


def straggler(summaries: list[RankSummary]) -> dict[str, Any] | None:
    """The rank whose exposed data wait stands out from the others', with the numbers."""
    waits = [(s.rank, s.data_wait_ms or 0.0, s.median_step_ms or 0.0) for s in summaries if s.median_step_ms]
    if len(waits) < 2:
        return None
    rank, wait, step = max(waits, key=lambda w: w[1])
    others = [w for r, w, _ in waits if r != rank]
    # The share of the straggler's own step: its wait lies inside it, and the others' steps are
    # as long on average (they wait for it), but cut differently by their step marks.
    excess = wait - statistics.median(others)
    return {
        "rank": rank,
        "data_wait_ms": round(wait, 3),
        "others_data_wait_ms": round(statistics.median(others), 3),
        "excess_ms": round(excess, 3),
        "excess_share": round(excess / step, 4) if step else None,
        "median_step_ms": round(step, 3),
    }


@dataclass(frozen=True)
class RankSet:
    """Every rank's summary, and the straggler among them (None when none can be told)."""

    summaries: list[RankSummary]
    straggler: dict[str, Any] | None

    @classmethod
    def of(cls, summaries: list[RankSummary]) -> RankSet:
        return cls(summaries, straggler(summaries))
