"""Host-to-device copies: how many bytes, from which memory, how fast, how much of the step."""

from __future__ import annotations

import statistics

from diagnose.analysis.measure.breakdown import Breakdown
from diagnose.analysis.symptoms.registry import symptom


def _bytes(gpu: Breakdown) -> list[int]:
    return [s.h2d_pageable_bytes + s.h2d_pinned_bytes for s in gpu.steps]


@symptom("h2d.bytes_per_step", "bytes", "bytes copied host-to-device per step")
def bytes_per_step(gpu: Breakdown) -> float:
    return statistics.median(_bytes(gpu))


@symptom("h2d.pageable_bytes_per_step", "bytes", "bytes copied host-to-device per step from pageable (unpinned) memory")
def pageable_bytes_per_step(gpu: Breakdown) -> float:
    return statistics.median(s.h2d_pageable_bytes for s in gpu.steps)


@symptom("h2d.pageable_fraction", "share", "fraction of host-to-device bytes that came from pageable memory")
def pageable_fraction(gpu: Breakdown) -> float | None:
    total = sum(_bytes(gpu))
    return sum(s.h2d_pageable_bytes for s in gpu.steps) / total if total else None


@symptom("h2d.copies_per_step", "count", "host-to-device copies per step")
def copies_per_step(gpu: Breakdown) -> float:
    return statistics.median(s.h2d_copies for s in gpu.steps)


@symptom("h2d.gpu_copy_step_share", "share", "share of step time the GPU spends in host-to-device copies")
def gpu_copy_step_share(gpu: Breakdown) -> float:
    return sum(s.h2d_copy_us for s in gpu.steps) / (gpu.total_us or 1.0)


@symptom("h2d.bandwidth_gbs", "GB/s", "achieved host-to-device bandwidth")
def bandwidth_gbs(gpu: Breakdown) -> float | None:
    copy_us = sum(s.h2d_copy_us for s in gpu.steps)
    return sum(_bytes(gpu)) / (copy_us * 1e-6) / 1e9 if copy_us > 0 else None
