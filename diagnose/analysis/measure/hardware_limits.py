"""The distance to the hardware limit of one run: MFU, the kernel table and roofline, the memory
split, the largest batch that fits, and what filled the memory at an out-of-memory error.

Contract: ``distance_to_limits(breakdown, record, meta) -> Limits``; pure, no torch;
``limits_to_dict(limits, record)`` is the report's ``limits`` section. It joins
what the runner counted (``record.flops``, ``record.memory_split``, ``record.memory_at_oom``)
with what the trace measured (the steady step time, each kernel's time) and the GPU's table
entry (``hardware.find_gpu``). The symptoms (``symptoms/limits.py``) and the report's
``limits`` section both read it; every part is None where the run did not show it.

The counted step may hold another batch than the steady steps (the last, short batch of an
epoch): its FLOPs and bytes are scaled by the steady steps' samples per step over its own.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from diagnose.analysis.measure.breakdown import Breakdown
from diagnose.analysis.measure.hardware import GpuSpec, Utilisation, find_gpu, split_by_dtype, utilisation
from diagnose.analysis.measure.kernels import (
    KernelTable,
    batch_to_fill_matmuls,
    matmul_roof_share,
    misaligned_flop_share,
    table_from_totals,
)
from diagnose.analysis.measure.memory_breakdown import (
    MemoryBreakdown,
    OomExplanation,
    batch_factor_limit,
    explain_oom,
    largest_batch,
    memory_breakdown,
)
from diagnose.analysis.trace.timeline import TraceMeta
from diagnose.record import FlopCount, RunRecord

#: the aten operators of attention written by hand (``softmax(q @ k.T) @ v``): batched matmuls
#: beside a softmax, where a fused kernel would run one operator
UNFUSED_ATTENTION_MATMULS = ("aten.bmm", "aten.baddbmm")
SOFTMAX_OPS = ("aten._softmax", "aten._safe_softmax")
FUSED_ATTENTION_OPS = (
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention",
    "aten._flash_attention_forward",
    "aten._efficient_attention_forward",
    "aten._scaled_dot_product_flash_attention_for_cpu",
)


@dataclass(frozen=True)
class Limits:
    gpu: GpuSpec | None
    #: the steady step time (profiler off) where measured, else the profiled steps' median
    step_s: float | None
    #: the counted step's FLOPs, scaled to the steady steps' batch
    flops_per_step: float | None
    utilisation: Utilisation | None
    kernels: KernelTable | None
    memory: MemoryBreakdown | None
    largest_batch: int | None
    oom_memory: MemoryBreakdown | None
    oom: OomExplanation | None
    #: share of the step's FLOPs in batched matmuls next to a softmax with no fused attention
    #: operator in the step (None: no count); 0 when attention is fused or absent
    unfused_attention_flop_share: float | None
    #: share of the counted matmul FLOPs in shapes with a dimension Tensor Cores do not want
    misaligned_matmul_share: float | None
    #: what scaled the counted step to the steady batch (1.0: the same batch)
    samples_scale: float = 1.0
    #: the most of the compute peak the counted linear-layer matmul shapes allow (roofline)
    matmul_roof_share: float | None = None
    #: a larger batch for matmuls too small for the Tensor Cores, within what memory holds
    batch_to_fill: int | None = None


def device_name(record: RunRecord | None, meta: TraceMeta | None) -> str | None:
    name = None
    if record is not None and record.environment.get("device") == "cuda":
        name = record.environment.get("device_name")  # on a CPU run it names the processor
    return (meta.device_name if meta is not None else None) or name


def steady_step_s(record: RunRecord | None, breakdown: Breakdown | None) -> float | None:
    steady = record.steady_mean_s() if record is not None else None
    if steady:
        return steady
    if breakdown is not None and breakdown.steps:
        return statistics.median(s.duration_us for s in breakdown.steps) / 1e6
    return None


def samples_scale(record: RunRecord, count: FlopCount) -> float:
    """Steady samples per step over the counted step's samples (1.0 when either is unknown)."""
    if not count.samples or not record.timed_samples or not record.timed_steps:
        return 1.0
    return (record.timed_samples / record.timed_steps) / count.samples


def tf32_allowed(record: RunRecord) -> bool:
    flags = record.flags or {}
    return bool(flags.get("matmul_allow_tf32")) or flags.get("float32_matmul_precision") in ("high", "medium")


def flops_by_dtype(record: RunRecord, scale: float) -> dict[str, float]:
    """The step's FLOPs spread over the dtypes its matmuls ran in."""
    count = record.flops
    if count is None or count.total <= 0:
        return {}
    by_torch_dtype: dict[str, float] = {}
    for shape in count.matmuls:
        by_torch_dtype[shape.dtype] = by_torch_dtype.get(shape.dtype, 0.0) + shape.flops
    return split_by_dtype(count.total * scale, by_torch_dtype, tf32_allowed(record))


def unfused_attention_share(count: FlopCount) -> float | None:
    if count.total <= 0:
        return None
    if any(op in count.ops for op in FUSED_ATTENTION_OPS) or not any(op in count.ops for op in SOFTMAX_OPS):
        return 0.0
    return sum(count.ops[op].flops for op in UNFUSED_ATTENTION_MATMULS if op in count.ops) / count.total


def distance_to_limits(breakdown: Breakdown | None, record: RunRecord | None, meta: TraceMeta | None) -> Limits:
    gpu = find_gpu(device_name(record, meta)) if breakdown is None or breakdown.has_gpu else None
    step_s = steady_step_s(record, breakdown)
    count = record.flops if record is not None else None
    scale = samples_scale(record, count) if record is not None and count is not None else 1.0
    by_dtype = flops_by_dtype(record, scale) if record is not None else {}
    util = utilisation(by_dtype, step_s, gpu) if by_dtype and step_s else None
    kernels = None
    if breakdown is not None and breakdown.has_gpu and breakdown.kernels_by_name:
        dtype = util.main_dtype if util is not None else None
        kernels = table_from_totals(
            breakdown.kernels_by_name, len(breakdown.steps), count, gpu, dtype, samples_scale=scale
        )
    split = record.memory_split if record is not None else None
    memory = memory_breakdown(split) if split is not None else None
    at_oom = record.memory_at_oom if record is not None else None
    mixed = bool(util is not None and util.main_dtype in ("bf16", "fp16", "fp8"))
    tf32 = tf32_allowed(record) if record is not None else False
    fits = largest_batch(memory) if memory is not None else None
    roof = matmul_roof_share(count.matmuls, gpu, tf32) if count is not None else None
    fill = None
    if roof is not None and memory is not None and memory.samples:
        most = batch_factor_limit(record.epoch_batches() if record is not None else None)
        fill = batch_to_fill_matmuls(count.matmuls, gpu, tf32, memory.samples, fits, most=most)  # type: ignore[union-attr]
    return Limits(
        gpu=gpu,
        step_s=step_s,
        flops_per_step=sum(by_dtype.values()) if by_dtype else None,
        utilisation=util,
        kernels=kernels,
        memory=memory,
        largest_batch=fits,
        oom_memory=memory_breakdown(at_oom) if at_oom is not None else None,
        oom=explain_oom(at_oom, mixed_precision=mixed) if at_oom is not None else None,
        unfused_attention_flop_share=unfused_attention_share(count) if count is not None else None,
        misaligned_matmul_share=misaligned_flop_share(count.matmuls) if count is not None else None,
        samples_scale=scale,
        matmul_roof_share=roof,
        batch_to_fill=fill,
    )


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def limits_to_dict(limits: Limits, record: RunRecord | None) -> dict[str, Any] | None:
    """The report's ``limits`` section (docs/report-schema.md): the structured parts behind the
    ``flops.*``, ``kernels.*``, ``memory.*`` and ``oom.*`` symptoms, which keep the scalars."""
    out: dict[str, Any] = {}
    gpu = limits.gpu
    if gpu is not None:
        out["gpu"] = {
            "name": gpu.name,
            "peak_tflops": dict(gpu.peak_tflops),
            "memory_gbs": gpu.memory_gbs,
            "measured_tflops": dict(gpu.measured_tflops),
            "source": gpu.source,
        }
    count = record.flops if record is not None else None
    if count is not None:
        scale = limits.samples_scale
        out["flops"] = {
            "step": count.step,
            "per_step": limits.flops_per_step,
            "by_phase": {k: v * scale for k, v in count.by_phase.items()},
            "by_dtype": dict(limits.utilisation.flops_by_dtype) if limits.utilisation is not None else {},
            "dtype": limits.utilisation.main_dtype if limits.utilisation is not None else None,
            "step_s": _r(limits.step_s, 6),
            "samples_scale": _r(scale),
            "notes": list(count.notes),
        }
    table = limits.kernels
    if table is not None:
        out["kernels"] = [
            {
                "name": r.name,
                "class": r.kind,
                "ms_per_step": _r(r.time_s * 1e3),
                "share": _r(r.share),
                "calls_per_step": _r(r.calls, 2),
                "tflops": _r(r.tflops),
                "gbs": _r(r.gbs, 1),
            }
            for r in table.rows
        ]
        out["classes"] = {
            kind: {
                "ms_per_step": _r(cw.time_s * 1e3),
                "share": _r(table.share(kind)),
                "flops": cw.flops,
                "bytes": cw.bytes,
                "flops_counted": cw.flops_counted,
                "tflops": _r(cw.tflops),
                "gbs": _r(cw.gbs, 1),
                "intensity": _r(cw.intensity, 3),
            }
            for kind, cw in table.classes.items()
        }
        if table.roofline:
            out["roofline"] = {
                "peak_tflops": table.peak_tflops,
                "memory_gbs": table.memory_gbs,
                "dtype": table.dtype,
                "points": [
                    {
                        "class": p.kind,
                        "intensity": _r(p.intensity, 3),
                        "tflops": _r(p.tflops),
                        "roof_tflops": _r(p.roof_tflops),
                        "bound": p.bound,
                        "time_share": _r(p.time_share),
                    }
                    for p in table.roofline
                ],
            }
        out["estimated"] = list(table.estimated)
    if limits.memory is not None:
        m = limits.memory
        out["memory_split"] = {
            **{k.replace(" ", "_") + "_bytes": v for k, v in m.parts().items()},
            "peak_allocated_bytes": m.peak_allocated,
            "peak_reserved_bytes": m.peak_reserved,
            "capacity_bytes": m.capacity,
            "samples": m.samples,
            "largest_batch": limits.largest_batch,
        }
    if limits.oom is not None and limits.oom_memory is not None:
        o = limits.oom
        out["oom"] = {
            "largest": o.largest,
            "parts_bytes": {k.replace(" ", "_"): v for k, v in o.parts.items()},
            "requested_bytes": o.requested,
            "capacity_bytes": o.capacity,
            "changes": list(o.changes),
        }
    return out or None
