"""The optimizer: which implementation, over how many tensors, what it costs the step."""

from __future__ import annotations

import statistics

from diagnose.analysis.breakdown import Breakdown
from diagnose.analysis.symptoms.registry import symptom
from diagnose.record import RunRecord


@symptom("optimizer.present", "bool", "the script steps a torch.optim optimizer")
def present(record: RunRecord) -> bool:
    return bool(record.optimizers)


@symptom("optimizer.param_tensors", "count", "parameter tensors the optimizers update")
def param_tensors(record: RunRecord) -> int | None:
    return sum(o.param_tensors for o in record.optimizers) if record.optimizers else None


@symptom("optimizer.forloop", "bool", "an optimizer runs its per-tensor for-loop (neither foreach nor fused)")
def forloop(record: RunRecord) -> bool | None:
    return any(o.implementation == "for-loop" for o in record.optimizers) if record.optimizers else None


@symptom("optimizer.kernels_per_step", "count", "GPU kernels the optimizer launches per step (median)")
def kernels_per_step(gpu: Breakdown) -> float:
    return statistics.median(s.optimizer_kernels for s in gpu.steps)


@symptom("optimizer.multi_tensor_share", "share", "share of the optimizer's GPU kernels that are multi-tensor (foreach/fused)")
def multi_tensor_share(gpu: Breakdown) -> float | None:
    kernels = sum(s.optimizer_kernels for s in gpu.steps)
    return sum(s.multi_tensor_kernels for s in gpu.steps) / kernels if kernels else None


@symptom("optimizer.step_share", "share", "share of step time limited by the optimizer (host or GPU)")
def step_share(gpu: Breakdown) -> float:
    return gpu.exposed_share["host_optimizer"] + gpu.exposed_share["gpu_optimizer"]
