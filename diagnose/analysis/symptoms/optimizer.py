"""The optimizer: which implementation, over how many tensors, what it costs the step.

The run record says it directly; a bare trace says it through its operators: the
``Optimizer.step#Adam.step`` annotation names the class, and the operators inside it the
implementation (``_foreach_*`` multi-tensor ops, ``_fused_*`` fused ones, else the per-tensor
for-loop, which runs each update operator once per parameter tensor).
"""

from __future__ import annotations

import statistics

from diagnose.analysis.measure.breakdown import Breakdown
from diagnose.analysis.symptoms.registry import symptom
from diagnose.analysis.trace.timeline import TraceMeta
from diagnose.record import RunRecord

#: operator name prefixes of the multi-tensor and fused implementations
MULTI_TENSOR_OP_PREFIXES = ("aten::_foreach_", "aten::_fused_")


def _trace_forloop(meta: TraceMeta | None) -> bool | None:
    """From the trace: an optimizer step ran no multi-tensor operator (None: no step recorded)."""
    if meta is None or not meta.optimizer_step_ops:
        return None
    return not any(name.startswith(MULTI_TENSOR_OP_PREFIXES) for ops in meta.optimizer_step_ops for name in ops)


@symptom("optimizer.present", "bool", "the script steps a torch.optim optimizer")
def present(record: RunRecord | None = None, meta: TraceMeta | None = None) -> bool | None:
    if record is not None:
        return bool(record.optimizers)
    return True if meta is not None and meta.optimizer_classes else None


@symptom(
    "optimizer.param_tensors",
    "count",
    "parameter tensors the optimizers update (a bare trace: the per-tensor operators of a for-loop step, counted)",
)
def param_tensors(record: RunRecord | None = None, meta: TraceMeta | None = None) -> int | None:
    if record is not None:
        return sum(o.param_tensors for o in record.optimizers) if record.optimizers else None
    if meta is None or not _trace_forloop(meta):
        return None  # a foreach or fused step takes all tensors in one call: the trace does not count them
    # The for-loop runs each update operator once per tensor (some twice): per step call, the
    # median count over the operator names is the tensor count.
    return int(statistics.median(statistics.median(ops.values()) for ops in meta.optimizer_step_ops))


@symptom("optimizer.forloop", "bool", "an optimizer runs its per-tensor for-loop (neither foreach nor fused)")
def forloop(record: RunRecord | None = None, meta: TraceMeta | None = None) -> bool | None:
    if record is not None:
        return any(o.implementation == "for-loop" for o in record.optimizers) if record.optimizers else None
    return _trace_forloop(meta)


@symptom("optimizer.name", "text", "the optimizer's class")
def name(record: RunRecord | None = None, meta: TraceMeta | None = None) -> str | None:
    if record is not None and record.optimizers:
        return ", ".join(sorted({o.name for o in record.optimizers}))
    return ", ".join(sorted(meta.optimizer_classes)) if meta is not None and meta.optimizer_classes else None


@symptom("optimizer.kernels_per_step", "count", "GPU kernels the optimizer launches per step (median)")
def kernels_per_step(gpu: Breakdown) -> float:
    return statistics.median(s.optimizer_kernels for s in gpu.steps)


@symptom(
    "optimizer.multi_tensor_share",
    "share",
    "share of the optimizer's GPU kernels that are multi-tensor (foreach/fused)",
)
def multi_tensor_share(gpu: Breakdown) -> float | None:
    kernels = sum(s.optimizer_kernels for s in gpu.steps)
    return sum(s.multi_tensor_kernels for s in gpu.steps) / kernels if kernels else None


@symptom("optimizer.step_share", "share", "share of step time limited by the optimizer (host or GPU)")
def step_share(gpu: Breakdown) -> float:
    return gpu.exposed_share["host_optimizer"] + gpu.exposed_share["gpu_optimizer"]
