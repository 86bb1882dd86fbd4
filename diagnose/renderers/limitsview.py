"""The distance to the hardware limit as renderers show it: MFU, the top kernels, the roofline,
memory by owner, and the out-of-memory explanation.

Contract: ``limits_view(report) -> LimitsView | None``; pure. Joins the report's ``limits``
section (the typed structure: ``diagnose.report.Limits``) with its ``flops.*`` / ``memory.*``
symptoms (the scalars, kept once there), and words the memory owners; None when the run
counted nothing and the trace named no known GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diagnose.report import KernelLine, Report, Roofline

#: memory owners in the order they are drawn and listed
MEMORY_OWNERS = ("parameters", "gradients", "optimizer_state", "activations", "other_tensors", "allocator_cache")


@dataclass(frozen=True)
class MemoryOwner:
    owner: str  # words: "optimizer state"
    bytes: float


@dataclass(frozen=True)
class OomView:
    largest: str
    owners: tuple[MemoryOwner, ...]
    requested_bytes: float | None
    capacity_bytes: float | None
    changes: tuple[str, ...]


@dataclass(frozen=True)
class LimitsView:
    gpu: str | None  # the table's name for this GPU
    dtype: str | None  # the dtype most FLOPs ran in
    mfu: float | None
    achieved_tflops: float | None
    peak_tflops: float | None
    tflop_per_step: float | None
    flops_by_phase: tuple[tuple[str, float], ...]
    kernels: tuple[KernelLine, ...]
    roofline: Roofline | None
    estimated: tuple[str, ...]
    memory: tuple[MemoryOwner, ...]
    capacity_bytes: float | None
    headroom_gb: float | None
    largest_batch: float | None
    oom: OomView | None


def _owners(parts: Mapping[str, Any], suffix: str) -> tuple[MemoryOwner, ...]:
    out = []
    for owner in MEMORY_OWNERS:
        value = parts.get(owner + suffix)
        if value is not None:
            out.append(MemoryOwner(owner.replace("_", " "), float(value)))
    return tuple(out)


def limits_view(report: Report) -> LimitsView | None:
    limits = report.limits
    value = report.symptom_value
    if limits is None and value("flops.mfu") is None and value("flops.achieved_tflops") is None:
        return None
    flops = limits.flops if limits is not None else None
    roof = limits.roofline if limits is not None else None
    split = (limits.memory_split if limits is not None else None) or {}
    oom = limits.oom if limits is not None else None
    return LimitsView(
        gpu=limits.gpu.name if limits is not None and limits.gpu is not None else None,
        dtype=flops.dtype if flops is not None else None,
        mfu=value("flops.mfu"),
        achieved_tflops=value("flops.achieved_tflops"),
        peak_tflops=value("flops.peak_tflops"),
        tflop_per_step=value("flops.tflop_per_step"),
        flops_by_phase=tuple((phase, float(v)) for phase, v in flops.by_phase.items()) if flops is not None else (),
        kernels=tuple(limits.kernels or ()) if limits is not None else (),
        roofline=roof if roof is not None and roof.peak_tflops and roof.memory_gbs else None,
        estimated=tuple(limits.estimated or ()) if limits is not None else (),
        memory=_owners(split, "_bytes"),
        capacity_bytes=split.get("capacity_bytes"),
        headroom_gb=value("memory.headroom_gb"),
        largest_batch=value("memory.largest_batch"),
        oom=OomView(
            oom.largest, _owners(oom.parts_bytes, ""), oom.requested_bytes, oom.capacity_bytes, tuple(oom.changes)
        )
        if oom
        else None,
    )
