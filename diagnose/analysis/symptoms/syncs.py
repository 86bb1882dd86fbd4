"""Host-GPU synchronisations: how many per step, how long the host blocks, how long the GPU idles after."""

from __future__ import annotations

import statistics

from diagnose.analysis.measure.breakdown import Breakdown
from diagnose.analysis.symptoms.registry import Known, symptom


@symptom("sync.per_step", "count", "host-GPU synchronisations per step (.item(), .cpu(), synchronize, ...), median")
def per_step(gpu: Breakdown) -> float:
    return statistics.median(s.sync_count for s in gpu.steps)


@symptom("sync.blocked_share", "share", "share of step time the host is blocked in synchronisations")
def blocked_share(gpu: Breakdown) -> float:
    return sum(s.sync_blocked_us for s in gpu.steps) / (gpu.total_us or 1.0)


@symptom("sync.idle_after_share", "share", "share of step time the GPU idles after a sync until new work arrives")
def idle_after_share(gpu: Breakdown) -> float:
    return sum(s.sync_idle_after_us for s in gpu.steps) / (gpu.total_us or 1.0)


@symptom(
    "sync.cost_share",
    "share",
    "exposed sync time plus the GPU idle time that follows syncs",
    uses=("sync.idle_after_share",),
)
def cost_share(gpu: Breakdown, known: Known) -> float | None:
    idle_after = known.get("sync.idle_after_share")
    return gpu.exposed_share["sync"] + idle_after if idle_after is not None else None
