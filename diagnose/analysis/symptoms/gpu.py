"""The GPU's own work: how busy it is, which kernels, in which precision, on which device."""

from __future__ import annotations

import statistics

from diagnose.analysis.measure.breakdown import Breakdown
from diagnose.analysis.measure.categories import GPU_EXPOSED
from diagnose.analysis.symptoms.registry import symptom
from diagnose.analysis.trace.timeline import TraceMeta
from diagnose.record import RunRecord

REDUCED_PRECISIONS = ("bf16", "fp16", "fp8")


def _matmul_us(gpu: Breakdown) -> dict[str, float]:
    """Matmul/conv kernel time over the window, by precision."""
    out: dict[str, float] = {}
    for s in gpu.steps:
        for precision, us in s.matmul_us.items():
            out[precision] = out.get(precision, 0.0) + us
    return out


def _of_matmul(gpu: Breakdown, precisions: tuple[str, ...]) -> float | None:
    matmul = _matmul_us(gpu)
    total = sum(matmul.values())
    return sum(matmul.get(p, 0.0) for p in precisions) / total if total > 0 else None


def _of_step(gpu: Breakdown, us: float) -> float:
    return us / (gpu.total_us or 1.0)


@symptom("gpu.present", "bool", "the trace holds GPU activity")
def present(steps: Breakdown) -> bool:
    return steps.has_gpu


@symptom("gpu.busy", "share", "share of step time the GPU runs anything (kernels, copies, memsets)")
def busy(gpu: Breakdown) -> float:
    return gpu.gpu_busy_share()  # over the steady step, like the exposed shares


@symptom(
    "gpu.kernel_step_share",
    "share",
    "share of step time the GPU runs kernels (copies not counted): the work a copy can hide behind",
)
def kernel_step_share(gpu: Breakdown) -> float:
    return sum(gpu.exposed_share[c] for c in GPU_EXPOSED)


@symptom(
    "gpu.compute_capability", "", "CUDA compute capability, e.g. 9.0 for Hopper (Tensor Cores for bf16/TF32 from 8.0)"
)
def compute_capability(
    gpu: Breakdown | None = None, meta: TraceMeta | None = None, record: RunRecord | None = None
) -> float | None:
    if gpu is not None and meta is not None and meta.compute_capability is not None:
        major, minor = meta.compute_capability
        return major + minor / 10
    if record is not None and record.environment.get("compute_capability"):
        major_text, _, minor_text = str(record.environment["compute_capability"]).partition(".")
        return int(major_text) + int(minor_text or 0) / 10
    return None


@symptom("gpu.kernels_per_step", "count", "GPU kernels launched per step (median)")
def kernels_per_step(gpu: Breakdown) -> float:
    return statistics.median(s.kernel_count for s in gpu.steps)


@symptom("gpu.median_kernel_us", "us", "median kernel duration")
def median_kernel_us(gpu: Breakdown) -> float | None:
    return gpu.median("median_kernel_us")


@symptom("gpu.matmul_step_share", "share", "share of step time in matmul/conv/attention kernels")
def matmul_step_share(gpu: Breakdown) -> float:
    return _of_step(gpu, sum(_matmul_us(gpu).values()))


@symptom(
    "gpu.fp32_matmul_share", "share", "share of matmul/conv kernel time in plain fp32 (CUDA cores, no Tensor Cores)"
)
def fp32_matmul_share(gpu: Breakdown) -> float | None:
    return _of_matmul(gpu, ("fp32",))


@symptom("gpu.fp32_matmul_step_share", "share", "share of step time in plain-fp32 matmul/conv kernels")
def fp32_matmul_step_share(gpu: Breakdown) -> float:
    return _of_step(gpu, _matmul_us(gpu).get("fp32", 0.0))


@symptom("gpu.reduced_precision_share", "share", "share of matmul/conv kernel time in bf16/fp16/fp8")
def reduced_precision_share(gpu: Breakdown) -> float | None:
    return _of_matmul(gpu, REDUCED_PRECISIONS)


@symptom("gpu.tf32_share", "share", "share of matmul/conv kernel time in TF32")
def tf32_share(gpu: Breakdown) -> float | None:
    return _of_matmul(gpu, ("tf32",))


@symptom("gpu.conv_step_share", "share", "share of step time in convolution kernels")
def conv_step_share(gpu: Breakdown) -> float:
    return _of_step(gpu, sum(s.conv_us for s in gpu.steps))


@symptom("gpu.transpose_step_share", "share", "share of step time in cuDNN NCHW<->NHWC layout conversions")
def transpose_step_share(gpu: Breakdown) -> float:
    return _of_step(gpu, sum(s.transpose_us for s in gpu.steps))


@symptom("gpu.triton_share", "share", "share of kernel time in Triton kernels (torch.compile)")
def triton_share(gpu: Breakdown) -> float | None:
    kernel_us = sum(s.kernel_time_us for s in gpu.steps)
    return sum(s.triton_us for s in gpu.steps) / kernel_us if kernel_us > 0 else None


@symptom("gpu.graph_launches_per_step", "count", "CUDA graph launches per step")
def graph_launches_per_step(gpu: Breakdown) -> float:
    return statistics.median(s.graph_launches for s in gpu.steps)


@symptom("gpu.communication_step_share", "share", "share of step time in communication (NCCL) kernels")
def communication_step_share(gpu: Breakdown) -> float:
    return _of_step(gpu, sum(s.communication_us for s in gpu.steps))
