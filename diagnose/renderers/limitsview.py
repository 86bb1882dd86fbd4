"""The distance to the hardware limit as renderers read it: MFU, the top kernels, the roofline,
memory by owner, and the out-of-memory explanation.

Contract: ``limits_view(report) -> LimitsView | None``; pure. Built from the report's ``limits``
section (the structured parts) and its ``flops.*`` / ``memory.*`` symptoms (the scalars, kept
once there); None when the run counted nothing and the trace named no known GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diagnose.analysis.report import Report

#: memory owners in the order they are drawn and listed
MEMORY_OWNERS = ("parameters", "gradients", "optimizer_state", "activations", "other_tensors", "allocator_cache")


@dataclass(frozen=True)
class KernelLine:
    name: str
    kind: str
    ms_per_step: float
    share: float
    tflops: float | None
    gbs: float | None


@dataclass(frozen=True)
class RooflineDot:
    kind: str
    intensity: float  # FLOPs per byte
    tflops: float
    roof_tflops: float
    bound: str  # "memory" or "compute"
    time_share: float


@dataclass(frozen=True)
class Roofline:
    peak_tflops: float
    memory_gbs: float
    dtype: str | None
    dots: tuple[RooflineDot, ...]

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the memory roof meets the compute roof."""
        return self.peak_tflops * 1e12 / (self.memory_gbs * 1e9)


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
    limits = report.limits or {}
    value = report.symptom_value
    if not limits and value("flops.mfu") is None and value("flops.achieved_tflops") is None:
        return None
    flops = limits.get("flops") or {}
    roof = limits.get("roofline")
    roofline = None
    if roof and roof.get("peak_tflops") and roof.get("memory_gbs"):
        roofline = Roofline(
            roof["peak_tflops"], roof["memory_gbs"], roof.get("dtype"),
            tuple(RooflineDot(p["class"], p["intensity"], p["tflops"], p["roof_tflops"], p["bound"], p["time_share"]) for p in roof.get("points", [])),
        )
    split = limits.get("memory_split") or {}
    oom = limits.get("oom")
    return LimitsView(
        gpu=(limits.get("gpu") or {}).get("name"),
        dtype=flops.get("dtype"),
        mfu=value("flops.mfu"),
        achieved_tflops=value("flops.achieved_tflops"),
        peak_tflops=value("flops.peak_tflops"),
        tflop_per_step=value("flops.tflop_per_step"),
        flops_by_phase=tuple((phase, float(v)) for phase, v in (flops.get("by_phase") or {}).items()),
        kernels=tuple(KernelLine(k["name"], k["class"], k["ms_per_step"], k["share"], k.get("tflops"), k.get("gbs")) for k in limits.get("kernels") or []),
        roofline=roofline,
        estimated=tuple(limits.get("estimated") or ()),
        memory=_owners(split, "_bytes"),
        capacity_bytes=split.get("capacity_bytes"),
        headroom_gb=value("memory.headroom_gb"),
        largest_batch=value("memory.largest_batch"),
        oom=OomView(oom["largest"], _owners(oom.get("parts_bytes") or {}, ""), oom.get("requested_bytes"), oom.get("capacity_bytes"),
                    tuple(oom.get("changes") or ())) if oom else None,
    )
