"""The distance to the hardware limit: FLOPs, MFU, kernel classes, attention, Tensor Core
alignment, memory by owner, the largest batch that fits, and memory at an out-of-memory error.

Every figure comes from ``analysis.measure.hardware_limits.distance_to_limits`` (the counted step in the run
record, the trace's kernel times, the GPU's table entry); a run that counted nothing (a bare
trace, a CPU run's memory, an unknown GPU's peak) has no such symptom.
"""

from __future__ import annotations

from diagnose.analysis.measure.breakdown import Breakdown
from diagnose.analysis.measure.hardware_limits import Limits, distance_to_limits
from diagnose.analysis.measure.memory_breakdown import GB
from diagnose.analysis.symptoms.registry import symptom
from diagnose.analysis.trace.timeline import TraceMeta
from diagnose.record import RunRecord


def _limits(record: RunRecord, steps: Breakdown | None, meta: TraceMeta | None) -> Limits:
    return distance_to_limits(steps, record, meta)


# --- FLOPs and MFU ------------------------------------------------------------------------------


@symptom(
    "flops.tflop_per_step", "TFLOP", "FLOPs of one step (torch's formulas: matmuls, convolutions, attention), in TFLOP"
)
def tflop_per_step(record: RunRecord, steps: Breakdown | None = None, meta: TraceMeta | None = None) -> float | None:
    flops = _limits(record, steps, meta).flops_per_step
    return flops / 1e12 if flops else None


@symptom("flops.achieved_tflops", "TFLOP/s", "the step's FLOPs over the steady step time")
def achieved_tflops(record: RunRecord, steps: Breakdown | None = None, meta: TraceMeta | None = None) -> float | None:
    util = _limits(record, steps, meta).utilisation
    return util.achieved_tflops if util is not None else None


@symptom("flops.peak_tflops", "TFLOP/s", "this GPU's dense datasheet peak for the dtype most FLOPs ran in")
def peak_tflops(record: RunRecord, steps: Breakdown | None = None, meta: TraceMeta | None = None) -> float | None:
    util = _limits(record, steps, meta).utilisation
    return util.peak_tflops if util is not None else None


@symptom(
    "flops.mfu",
    "share",
    "model FLOPs utilisation: the time the step's FLOPs take at the GPU's peak, of the steady step",
)
def mfu(record: RunRecord, steps: Breakdown | None = None, meta: TraceMeta | None = None) -> float | None:
    util = _limits(record, steps, meta).utilisation
    return util.mfu if util is not None else None


# --- kernel classes -----------------------------------------------------------------------------


def _class_share(kind: str, gpu: Breakdown, record: RunRecord | None, meta: TraceMeta | None) -> float | None:
    table = distance_to_limits(gpu, record, meta).kernels
    return table.share(kind) if table is not None and table.kernel_time_s > 0 else None


@symptom(
    "kernels.elementwise_share",
    "share",
    "share of kernel time in elementwise kernels (activations, arithmetic, optimizer updates)",
)
def elementwise_share(gpu: Breakdown, record: RunRecord | None = None, meta: TraceMeta | None = None) -> float | None:
    return _class_share("elementwise", gpu, record, meta)


@symptom("kernels.reduction_share", "share", "share of kernel time in reductions, softmax, normalisations and losses")
def reduction_share(gpu: Breakdown, record: RunRecord | None = None, meta: TraceMeta | None = None) -> float | None:
    return _class_share("reduction", gpu, record, meta)


@symptom("kernels.matmul_share", "share", "share of kernel time in matmul and convolution kernels")
def matmul_share(gpu: Breakdown, record: RunRecord | None = None, meta: TraceMeta | None = None) -> float | None:
    return _class_share("matmul", gpu, record, meta)


@symptom(
    "kernels.attention_share",
    "share",
    "share of kernel time in fused attention kernels (flash, memory-efficient, cuDNN)",
)
def attention_share(gpu: Breakdown, record: RunRecord | None = None, meta: TraceMeta | None = None) -> float | None:
    return _class_share("attention", gpu, record, meta)


@symptom(
    "attention.unfused_flop_share",
    "share",
    "share of the step's FLOPs in batched matmuls beside a softmax, with no fused attention operator",
)
def unfused_attention(record: RunRecord, steps: Breakdown | None = None, meta: TraceMeta | None = None) -> float | None:
    return _limits(record, steps, meta).unfused_attention_flop_share


@symptom(
    "matmul.misaligned_share",
    "share",
    "share of matmul FLOPs in shapes with a dimension not a multiple of 8 (bf16/fp16), 4 (fp32) or 16 (fp8)",
)
def misaligned_share(record: RunRecord, steps: Breakdown | None = None, meta: TraceMeta | None = None) -> float | None:
    return _limits(record, steps, meta).misaligned_matmul_share


@symptom(
    "matmul.roof_share",
    "share",
    "the most of the compute peak the step's linear-layer matmul shapes allow on this GPU's roofline (low: too few rows, memory-bound on the weights)",
)
def matmul_roof_share(record: RunRecord, steps: Breakdown | None = None, meta: TraceMeta | None = None) -> float | None:
    return _limits(record, steps, meta).matmul_roof_share


@symptom(
    "suggest.batch_to_fill",
    "count",
    "a power-of-two multiple of the measured batch whose matmul shapes reach 90% of the peak on the roofline, or the largest that fits the memory (at most 8x the batch, 16 batches an epoch)",
)
def batch_to_fill(record: RunRecord, steps: Breakdown | None = None, meta: TraceMeta | None = None) -> int | None:
    return _limits(record, steps, meta).batch_to_fill


# --- memory by owner ------------------------------------------------------------------------------


def _gb(value: int | None) -> float | None:
    return value / GB if value is not None else None


@symptom("memory.parameters_gb", "GB", "GPU memory held by the model's parameters")
def parameters_gb(record: RunRecord) -> float | None:
    m = _limits(record, None, None).memory
    return _gb(m.parameters) if m else None


@symptom("memory.gradients_gb", "GB", "GPU memory held by gradients at their largest in the step")
def gradients_gb(record: RunRecord) -> float | None:
    m = _limits(record, None, None).memory
    return _gb(m.gradients) if m else None


@symptom("memory.optimizer_gb", "GB", "GPU memory held by the optimizer's state")
def optimizer_gb(record: RunRecord) -> float | None:
    m = _limits(record, None, None).memory
    return _gb(m.optimizer_state) if m else None


@symptom(
    "memory.activations_gb",
    "GB",
    "GPU memory the step allocated above its start, less the gradients it made (activations and temporaries)",
)
def activations_gb(record: RunRecord) -> float | None:
    m = _limits(record, None, None).memory
    return _gb(m.activations) if m else None


@symptom("memory.headroom_gb", "GB", "GPU memory beyond the counted step's peak reservation")
def headroom_gb(record: RunRecord) -> float | None:
    m = _limits(record, None, None).memory
    return _gb(m.headroom) if m and m.capacity else None


@symptom(
    "memory.samples",
    "count",
    "samples in the step whose memory was measured: the DataLoader's batch, else the leading dimension of the model's input",
)
def memory_samples(record: RunRecord) -> int | None:
    m = _limits(record, None, None).memory
    return m.samples if m else None


@symptom(
    "memory.largest_batch",
    "count",
    "the batch whose activations would fit beside what persists, 10% of the device kept free (an estimate)",
)
def largest_batch(record: RunRecord) -> int | None:
    return _limits(record, None, None).largest_batch


# --- at an out-of-memory error --------------------------------------------------------------------


def _oom_part(record: RunRecord, owner: str) -> float | None:
    m = _limits(record, None, None).oom_memory
    return _gb(m.parts()[owner]) if m else None


@symptom("oom.allocated_gb", "GB", "GPU memory held by tensors when the out-of-memory error was raised")
def oom_allocated_gb(record: RunRecord) -> float | None:
    m = _limits(record, None, None).oom_memory
    return _gb(m.parameters + m.gradients + m.optimizer_state + m.activations) if m else None


@symptom("oom.requested_gb", "GB", "the allocation that failed, from torch's message")
def oom_requested_gb(record: RunRecord) -> float | None:
    oom = _limits(record, None, None).oom
    return _gb(oom.requested) if oom is not None else None


@symptom(
    "oom.activations_gb",
    "GB",
    "at the error: memory beyond parameters, gradients and optimizer state (the failing step's activations and batch)",
)
def oom_activations_gb(record: RunRecord) -> float | None:
    return _oom_part(record, "activations")


@symptom("oom.parameters_gb", "GB", "at the error: memory held by parameters")
def oom_parameters_gb(record: RunRecord) -> float | None:
    return _oom_part(record, "parameters")


@symptom("oom.gradients_gb", "GB", "at the error: memory held by gradients")
def oom_gradients_gb(record: RunRecord) -> float | None:
    return _oom_part(record, "gradients")


@symptom("oom.optimizer_gb", "GB", "at the error: memory held by optimizer state")
def oom_optimizer_gb(record: RunRecord) -> float | None:
    return _oom_part(record, "optimizer state")


@symptom("oom.largest", "text", "what held the most GPU memory at the out-of-memory error")
def oom_largest(record: RunRecord) -> str | None:
    oom = _limits(record, None, None).oom
    return oom.largest if oom is not None else None


@symptom("oom.changes", "text", "the changes that free the most memory, largest first, one per line")
def oom_changes(record: RunRecord) -> str | None:
    oom = _limits(record, None, None).oom
    return (
        "\n".join(f"# {i}. {change}" for i, change in enumerate(oom.changes, 1))
        if oom is not None and oom.changes
        else None
    )


@symptom(
    "kernels.summary",
    "text",
    "kernel time by class, largest first, with each class's place on the roofline where counted",
)
def kernels_summary(gpu: Breakdown, record: RunRecord | None = None, meta: TraceMeta | None = None) -> str | None:
    table = distance_to_limits(gpu, record, meta).kernels
    if table is None or table.kernel_time_s <= 0:
        return None
    points = {p.kind: p for p in table.roofline}
    parts = []
    for kind in sorted(table.classes, key=lambda k: -table.classes[k].time_s):
        share = table.share(kind)
        if share < 0.01:
            continue
        point = points.get(kind)
        where = f" ({point.bound}-bound, {point.of_roof:.0%} of its roof)" if point is not None else ""
        parts.append(f"{kind} {share:.0%}{where}")
    return ", ".join(parts) or None
