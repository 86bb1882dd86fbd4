"""The ranks of a distributed run side by side: one summary row per rank, the straggler, the
job's throughput. Pure, no torch; the launcher side (rank variables, torchrun, the shared run
directory) is ``diagnose.distributed``.

Each rank analyses its own trace in its own process and keeps a ``RankSummary`` of it: a few
hundred bytes (steady step, phase and exposed shares, communication exposed and overlapped by
collective kind, data wait, step times). The job's view is built from the summaries alone, never
from the traces, so that combining 1,000 ranks costs what combining 2 does, times 500 small dicts.

Contract: ``summarize_rank(rank, record, breakdown, collectives) -> RankSummary`` per rank
(``RankSummary.to_dict``/``from_dict`` round-trip it through JSON or ``all_gather_object``);
``RankSet.of(summaries)`` holds them with their straggler, the input of the ``dist.*`` symptoms
(``diagnose.analysis.symptoms.distributed``); ``notable_ranks(summaries)`` names the ranks whose
full traces are worth keeping (the first, the slowest, the straggler, the outliers).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diagnose.analysis.measure.breakdown import Breakdown
from diagnose.record import RunRecord
from diagnose.report import RankSummary  # the report's own row type: one declaration of a rank's summary

if TYPE_CHECKING:
    from diagnose.analysis.measure.collectives import CollectiveTime


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


#: a rank's status where only its trace was read (no run record says how it ended)
TRACE_ONLY_STATUS = "trace"


def summarize_rank(
    rank: int,
    record: RunRecord | None,
    bd: Breakdown | None,
    collectives: dict[str, CollectiveTime] | None = None,
    backend: str | None = None,
) -> RankSummary:
    """One rank's summary: its row of the side-by-side table and what the job's view needs.
    Without a record (a folder of the user's own traces, one a rank), what the trace shows
    alone: no steady step, no samples, the ``backend`` its ``distributedInfo`` names."""
    steps = bd.steps if bd is not None else []
    median_step = _median([s.duration_us for s in steps])
    top = max(bd.exposed_share, key=bd.exposed_share.get) if bd is not None else None  # type: ignore[arg-type]
    comm_us = _median([s.communication_us for s in steps])
    exposed_comm = bd.exposed_share["communication"] if bd is not None else None
    data_wait_share = bd.exposed_share["data_wait"] if bd is not None else None
    by_kind = {kind: c.to_dict() for kind, c in (collectives or {}).items()}
    exposed_ms = overlapped_ms = None
    communication_ms = comm_us / 1000 if comm_us is not None else None
    if by_kind:  # the collectives as the trace shows them, kind by kind
        exposed_ms = round(sum(c["exposed_ms"] for c in by_kind.values()), 4)
        overlapped_ms = round(sum(c["overlapped_ms"] for c in by_kind.values()), 4)
        # in flight per step, on the backend's own threads too (gloo runs no kernel: the kernels'
        # time said 0.00 ms beside a breakdown of 1.31 ms/step of communication)
        communication_ms = round(sum(c["ms"] for c in by_kind.values()), 4)
    elif exposed_comm is not None and median_step:
        exposed_ms = round(exposed_comm * median_step / 1000, 4)
    mean_s = record.steady_mean_s() if record is not None else None
    steady = mean_s * 1000 if mean_s else None
    return RankSummary(
        rank=rank,
        status=record.status if record is not None else TRACE_ONLY_STATUS,
        median_step_ms=median_step / 1000 if median_step is not None else None,
        data_wait_ms=(data_wait_share * median_step / 1000) if data_wait_share is not None and median_step else None,
        data_wait_share=data_wait_share,
        communication_ms=communication_ms,
        exposed_communication_share=exposed_comm,
        gpu_busy=(sum(s.gpu_busy_us for s in steps) / bd.total_us)
        if bd is not None and bd.has_gpu and bd.total_us
        else None,
        samples_per_step=record.batch_size() if record is not None else None,
        top_exposed=top,
        backend=(record.distributed or {}).get("backend") if record is not None else backend,
        steady_samples_per_s=(
            round(record.timed_samples / record.timed_seconds, 3)
            if record is not None and record.timed_samples and record.timed_seconds
            else None
        ),
        steady_step_ms=round(steady, 4) if steady is not None else None,
        step_ms=[round(s.duration_us / 1000, 4) for s in steps],
        phase_share={k: round(v, 5) for k, v in bd.phase_share.items()} if bd is not None else {},
        exposed_share={k: round(v, 5) for k, v in bd.exposed_share.items()} if bd is not None else {},
        communication_exposed_ms=exposed_ms,
        communication_overlapped_ms=overlapped_ms,
        collectives=by_kind,
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


def _step_of(s: RankSummary) -> float | None:
    """A rank's step time: steady (profiler off) where timed, else the profiled median."""
    return s.steady_step_ms if s.steady_step_ms is not None else s.median_step_ms


def slowest(summaries: list[RankSummary]) -> int | None:
    """The rank with the most work of its own per step: its step less the time it waited at
    collectives. In synchronous training every rank's step is as long as the slowest one's (the
    others wait for it at the all-reduce), so the step alone cannot tell them apart."""
    own = [(s.rank, step - (s.communication_exposed_ms or 0.0)) for s in summaries if (step := _step_of(s)) is not None]
    return max(own, key=lambda r: r[1])[0] if own else None


#: a rank is an outlier when a metric lies this many robust deviations (1.4826 MAD) from the
#: ranks' median, and by at least this share of the median step (a 0.1 ms wobble is no outlier)
OUTLIER_DEVIATIONS = 3.5
OUTLIER_MIN_STEP_SHARE = 0.05
_OUTLIER_METRICS = (
    ("step", _step_of),
    ("data wait", lambda s: s.data_wait_ms),
    ("exposed communication", lambda s: s.communication_exposed_ms),
)


def outliers(summaries: list[RankSummary]) -> dict[int, list[str]]:
    """The ranks that stand out from the others, with the metrics they stand out by (three ranks
    or more: with two, neither is the odd one out)."""
    if len(summaries) < 3:
        return {}
    steps = [x for x in (_step_of(s) for s in summaries) if x is not None]
    floor = OUTLIER_MIN_STEP_SHARE * statistics.median(steps) if steps else 0.0
    found: dict[int, list[str]] = {}
    for label, metric in _OUTLIER_METRICS:
        values = [(s.rank, metric(s)) for s in summaries]
        present = [v for _, v in values if v is not None]
        if len(present) < 3:
            continue
        middle = statistics.median(present)
        spread = 1.4826 * statistics.median([abs(v - middle) for v in present])
        for rank, value in values:
            if value is not None and abs(value - middle) > max(OUTLIER_DEVIATIONS * spread, floor):
                found.setdefault(rank, []).append(f"{label} {value:.2f} ms against a median of {middle:.2f}")
    return found


#: the slowest rank leads the job's report (its breakdown, its findings) instead of the first
#: when its own work per step (its step less its waits at collectives) exceeds the first rank's
#: by at least this share of the step: the others wait for it, and what it does sets the pace
LEAD_MARGIN = 0.10


def lead_rank(summaries: list[RankSummary], default: int) -> int:
    """The rank whose breakdown the job's report shows: the slowest (``slowest``) where it does
    clearly more of its own work per step than ``default`` (``LEAD_MARGIN``), else ``default``.
    On two FSDP ranks (examples/fsdp_exposed_comm.py) either rank may end up the one that waits
    in the all-gathers: rank 0's view gave three different top findings in five runs."""
    by_rank = {s.rank: s for s in summaries}
    slow = slowest(summaries)
    if slow is None or slow == default or default not in by_rank:
        return default

    def own(s: RankSummary) -> float | None:
        step = _step_of(s)
        return None if step is None else step - (s.communication_exposed_ms or 0.0)

    lead_own, default_own, step = own(by_rank[slow]), own(by_rank[default]), _step_of(by_rank[slow])
    if lead_own is None or default_own is None or not step:
        return default
    return slow if lead_own - default_own >= LEAD_MARGIN * step else default


def notable_ranks(summaries: list[RankSummary], lead: int | None = None) -> dict[int, str]:
    """The ranks whose full traces are worth opening, with why: the first, the rank whose
    breakdown is the report's (``lead``, else the first), the slowest, the straggler and the
    outliers."""
    if not summaries:
        return {}
    first = min(s.rank for s in summaries)
    notable: dict[int, list[str]] = {first: []}
    notable.setdefault(first if lead is None else lead, []).append("the report's breakdown")
    if not notable[first]:
        notable[first].append("the first rank")
    lagging = straggler(summaries)
    if lagging is not None:
        notable.setdefault(lagging["rank"], []).append("straggler")
    slow = slowest(summaries)
    if slow is not None:
        notable.setdefault(slow, []).append("slowest step")
    for rank, why in outliers(summaries).items():
        notable.setdefault(rank, []).append("outlier: " + "; ".join(why))
    return {rank: ", ".join(why) for rank, why in sorted(notable.items())}


def job_view(summaries: list[RankSummary]) -> dict[str, Any]:
    """What the ranks together show, from their summaries alone: throughput, step-time spread,
    communication (the least exposed of any rank is what it costs: the last rank to arrive
    waits for nothing but the reduction), and each collective kind at its worst rank."""
    steps = [x for x in (_step_of(s) for s in summaries) if x is not None]
    exposed = [s.communication_exposed_ms for s in summaries if s.communication_exposed_ms is not None]
    kinds: dict[str, dict[str, Any]] = {}
    for s in summaries:
        for kind, c in s.collectives.items():
            worst = kinds.get(kind)
            if worst is None or c["exposed_ms"] > worst["exposed_ms"]:
                kinds[kind] = {"rank": s.rank, **c}
    return {
        "job_samples_per_s": job_samples_per_s(summaries),
        "step_ms": {"min": min(steps), "median": statistics.median(steps), "max": max(steps)} if steps else None,
        "step_imbalance": round(max(steps) / min(steps), 4) if steps and min(steps) > 0 else None,
        "communication_exposed_ms": {"min": min(exposed), "median": statistics.median(exposed), "max": max(exposed)}
        if exposed
        else None,
        "collectives_worst_rank": kinds,
    }
