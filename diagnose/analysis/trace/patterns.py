"""Names that classify trace events, kept as data rather than buried in code.

Every pattern here was read off real torch.profiler traces (torch 2.11, NVIDIA H200; torch 2.13 on
CPU). When a newer torch renames something, this is the one file to change, and the tests in
tests/test_patterns.py say which real names each pattern must match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# --- host annotations (category user_annotation) -------------------------------------------------

PROFILER_STEP_PREFIX = "ProfilerStep#"
DATALOADER_PREFIX = "enumerate(DataLoader)#"
OPTIMIZER_STEP_PREFIX = "Optimizer.step#"
OPTIMIZER_ZERO_GRAD_PREFIX = "Optimizer.zero_grad#"
BACKWARD_OP_PREFIX = "autograd::engine::evaluate_function"
#: Optimizer-side work: torch's own step and zero_grad annotations, and the ones diagnose's
#: runtime adds (diagnose.runtime.marks) around gradient clipping, GradScaler's unscale_/step/
#: update and ``Module.zero_grad``: none of it is the model's forward or backward.
OPTIMIZER_SIDE_PREFIXES = (
    OPTIMIZER_STEP_PREFIX,
    OPTIMIZER_ZERO_GRAD_PREFIX,
    "diagnose#clip_grad",
    "diagnose#GradScaler.",
    "diagnose#Module.zero_grad",
)
#: The closure an optimizer's ``step(closure)`` calls (Lightning's automatic optimization, LBFGS):
#: the user's (or the framework's) training step, not the optimizer's own work.
OPTIMIZER_CLOSURE_PREFIX = "diagnose#optimizer_closure"
#: A framework's backward call (Lightning Fabric's ``fabric.backward``; diagnose.runtime.marks):
#: all of it is the backward pass, the work around the autograd engine included.
BACKWARD_MARK_PREFIX = "diagnose#backward"
#: Top-level host ops of torch.compile around a compiled forward: the guard check and the region
#: that runs the compiled graph (its ``CompiledFunction`` records the autograd history).
COMPILED_REGION_PREFIXES = ("Torch-Compiled Region", "TorchDynamo Cache Lookup")
#: Host ops of the AMP GradScaler that a bare trace shows without diagnose's annotations.
AMP_OPTIMIZER_OPS = frozenset({"aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"})
#: user annotations of collectives that run on CPU threads (gloo, MPI, UCC); NCCL's run on the GPU
CPU_COLLECTIVE_PREFIXES = ("gloo:", "mpi:", "ucc:")
#: the operators that issue a collective (``c10d::allreduce_``, ``c10d::_reduce_scatter_base_`` ...)
COLLECTIVE_CALL_PREFIX = "c10d::"
#: the data-parallel wrappers' own annotations; a sync inside one waits for their communication
#: (DDP's forward blocks until the previous step's gradient all-reduce has finished)
DATA_PARALLEL_PREFIXES = ("DistributedDataParallel.", "FullyShardedDataParallel.")
#: Before torch 1.10 every host event, ``record_function`` annotations included, was written in the
#: category "Operator" (tb_plugin's resnet50 samples, torch 1.8): these names are annotations
#: there, as they are in category user_annotation today (the step marks, the DataLoader's fetch,
#: the optimizer's step and zero_grad, CPU collectives, the wrappers' and diagnose's own marks).
LEGACY_ANNOTATION_PREFIXES = (
    PROFILER_STEP_PREFIX,
    DATALOADER_PREFIX,
    OPTIMIZER_STEP_PREFIX,
    OPTIMIZER_ZERO_GRAD_PREFIX,
    "diagnose#",
    *CPU_COLLECTIVE_PREFIXES,
    *DATA_PARALLEL_PREFIXES,
)

# --- CUDA runtime / driver calls ------------------------------------------------------------------

#: Calls that block the host until the GPU (or a stream) has caught up.
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "cuMemcpyDtoH_v2",
        "cuMemcpyHtoD_v2",
        # ROCm (HIP) under the same category, cuda_runtime: torch's blocking copies there are
        # hipMemcpyWithStream (HTA's MI250 trace)
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
        "hipMemcpy",
        "hipMemcpyWithStream",
    }
)

#: Host-side ops whose sync is a scalar or tensor read-back, by what the user wrote.
SYNC_OP_KINDS: dict[str, str] = {
    "aten::item": "item",
    "aten::_local_scalar_dense": "item",
    "aten::nonzero": "data-dependent shape",
    "aten::masked_select": "data-dependent shape",
    "aten::unique": "data-dependent shape",
    "aten::_unique2": "data-dependent shape",
    "aten::index": "data-dependent shape",
    "aten::to": "copy to host",
    "aten::_to_copy": "copy to host",
    "aten::copy_": "copy to host",
    "aten::cpu": "copy to host",
    "aten::tolist": "copy to host",
    "aten::equal": "item",
    "aten::is_nonzero": "item",
}

#: Host ops that copy a tensor (an H2D copy is one of these that launched a host-to-device memcpy).
#: Operators that do no work beyond the profiler's own bookkeeping (a view of a tensor's
#: metadata, sub-microsecond unprofiled): their recorded length measures the profiler's cost.
#: the autograd engine's node that adds a parameter's gradient into ``.grad``: one per parameter
#: tensor and step, run by the engine outside any compiled graph (host time a CUDA graph keeps)
ACCUMULATE_GRAD_OP = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
NO_WORK_OPS = frozenset(
    {"aten::view", "aten::_unsafe_view", "aten::as_strided", "aten::alias", "aten::_reshape_alias", "aten::lift_fresh"}
)
COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_", "aten::pin_memory", "aten::_pin_memory"})

# --- GPU activity ---------------------------------------------------------------------------------

GPU_KERNEL_CATEGORIES = frozenset({"kernel"})
GPU_MEMCPY_CATEGORIES = frozenset({"gpu_memcpy"})
GPU_MEMSET_CATEGORIES = frozenset({"gpu_memset"})

#: Older torch versions (< 1.10) used other category names; map them onto today's. Their host
#: events ("Operator") are operators or annotations by name (``LEGACY_ANNOTATION_PREFIXES``).
LEGACY_HOST_CATEGORIES = frozenset({"Operator", "operator"})
LEGACY_CATEGORIES: dict[str, str] = {
    "Operator": "cpu_op",
    "operator": "cpu_op",
    "Kernel": "kernel",
    "Runtime": "cuda_runtime",
    "runtime": "cuda_runtime",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "Driver": "cuda_driver",
    "User Annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
}

#: Another accelerator's runtime calls and activity (MTIA, Intel XPU, a PrivateUse1 backend):
#: counted, not analysed (HTA's MTIA traces); a step on such a device is not a CPU-only run's.
OTHER_DEVICE_CATEGORIES = frozenset(
    {
        "privateuse1_runtime",
        "privateuse1_driver",
        "mtia_runtime",
        "Mtia_runtime",
        "mtia_ccp_events",
        "xpu_runtime",
        "xpu_driver",
    }
)

#: Categories the analysis reads or knowingly skips; anything else is counted as unknown.
KNOWN_CATEGORIES = frozenset(
    {
        "cpu_op",
        "user_annotation",
        "gpu_user_annotation",
        "cuda_runtime",
        "cuda_driver",
        "kernel",
        "gpu_memcpy",
        "gpu_memset",
        "ac2g",
        "fwdbwd",
        "cpu_instant_event",
        "overhead",
        "python_function",
        "Trace",
        "cuda_profiler_range",
        # Kineto's CUDA sync events on the GPU's rows (the host's waits are its cuda_runtime calls)
        "cuda_sync",
        # launch flows of older Kineto versions (today's ac2g): torch 1.8 wrote "async"
        "async",
        "async_gpu",
        "async_cpu_to_gpu",
        *OTHER_DEVICE_CATEGORIES,
    }
)


def memcpy_kind(name: str) -> str:
    """'HtoD-pageable', 'HtoD-pinned', 'HtoD', 'DtoH', 'DtoD', 'PtoP' or 'other', from a memcpy name.

    Names look like ``Memcpy HtoD (Pageable -> Device)`` or ``Memcpy DtoH (Device -> Pinned)``.
    """
    if "HtoD" in name:
        if "Pageable" in name:
            return "HtoD-pageable"
        if "Pinned" in name:
            return "HtoD-pinned"
        return "HtoD"
    if "DtoH" in name:
        return "DtoH"
    if "DtoD" in name:
        return "DtoD"
    if "PtoP" in name:
        return "PtoP"
    return "other"


# --- kernel classes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelPattern:
    """A named class of GPU kernels: the name matches ``regex`` (searched, case-sensitive)."""

    name: str
    regex: re.Pattern[str]
    why: str


def _p(name: str, pattern: str, why: str) -> KernelPattern:
    return KernelPattern(name, re.compile(pattern), why)


#: Communication kernels (NCCL collectives): time spent here is communication, not compute.
COMMUNICATION = _p("communication", r"nccl|ncclDevKernel|ncclKernel", "NCCL collective kernels")

#: Matrix-multiply and convolution kernels (cuBLAS, cuBLASLt nvjet, CUTLASS, cuDNN, attention; on
#: ROCm Tensile's and hipBLASLt's ``Cijk_...`` kernels, which name no gemm).
MATMUL = _p(
    "matmul",
    r"gemm|gemv|xmma|nvjet|cutlass|sgemm|hgemm|Gemm|wgrad|dgrad|fprop|implicit_gemm|fmha|flash|sdpa"
    r"|conv2d|convolve|wgrad_alg|winograd|cudnn_generated|^Cijk_",
    "cuBLAS/cuBLASLt/CUTLASS/cuDNN (rocBLAS/hipBLASLt Tensile) matrix and convolution kernels",
)

#: The convolution subset of MATMUL.
CONVOLUTION = _p(
    "convolution",
    r"fprop|dgrad|wgrad|implicit_gemm|implicit_convolve|conv2d|convolve|winograd|wgrad_alg|ImplicitGemmConv",
    "cuDNN / CUTLASS convolution kernels",
)

#: Layout transposes that cuDNN inserts when convolutions run NCHW under reduced precision.
LAYOUT_TRANSPOSE = _p(
    "layout transpose", r"nchwToNhwc|nhwcToNchw|NchwToNhwc|NhwcToNchw", "cuDNN NCHW<->NHWC conversions"
)

#: Attention kernels (flash / memory-efficient / cuDNN SDPA): matmul-like, never convolutions.
ATTENTION = _p("attention", r"fmha|flash|sdpa|attention|Attention", "scaled-dot-product attention kernels")

#: Kernels of multi-tensor (foreach / fused) optimizers.
MULTI_TENSOR = _p("multi-tensor", r"multi_tensor_apply|FusedOptimizer|fused_adam|FusedAdam", "foreach/fused ops")

#: Compiled kernels from Inductor (Triton).
TRITON = _p("triton", r"^triton_|triton__", "Triton kernels generated by torch.compile / Inductor")

# Precision of a matmul kernel, in the order the tests must be tried. fp32 on CUDA cores ("ffma",
# "sgemm", "simt") is what the fp32-on-Tensor-Core rule looks for.
_PRECISION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("fp8", re.compile(r"e4m3|e5m2|fp8|nvjet_(?:sm\d+_)?[ef]")),
    ("tf32", re.compile(r"tf32|_xf32|nvjet_(?:sm\d+_)?x")),
    ("bf16", re.compile(r"bf16|bfloat16|BFloat16|nvjet_(?:sm\d+_)?t")),
    ("fp16", re.compile(r"f16|fp16|half|hgemm|h884|h1688|h16816|Half|nvjet_(?:sm\d+_)?h|s161616|s16816")),
    ("fp32", re.compile(r"f32f32_f32f32|ffma|sgemm|simt|gemmSN|gemv2T|gemv2N|<float|_f32_|_fp32|nvjet_(?:sm\d+_)?s")),
)


@dataclass(frozen=True)
class KernelClass:
    """What the analysis needs to know about one kernel name."""

    precision: str | None  # None: not a matmul/conv kernel
    convolution: bool
    layout_transpose: bool
    triton: bool
    communication: bool
    multi_tensor: bool


@lru_cache(maxsize=65536)
def classify_kernel(name: str) -> KernelClass:
    """Classify a kernel by name (cached: a trace repeats a few hundred names thousands of times)."""
    communication = bool(COMMUNICATION.regex.search(name))
    is_matmul = not communication and bool(MATMUL.regex.search(name))
    return KernelClass(
        precision=matmul_precision(name) if is_matmul else None,
        convolution=is_matmul and not ATTENTION.regex.search(name) and bool(CONVOLUTION.regex.search(name)),
        layout_transpose=bool(LAYOUT_TRANSPOSE.regex.search(name)),
        triton=bool(TRITON.regex.search(name)),
        communication=communication,
        multi_tensor=bool(MULTI_TENSOR.regex.search(name)),
    )


def matmul_precision(name: str) -> str:
    """The arithmetic a matmul/conv kernel runs in: fp8, tf32, bf16, fp16, fp32 or 'unknown'.

    fp32 means plain single precision on CUDA cores (no Tensor Cores), the slow path that
    ``torch.backends.cuda.matmul.allow_tf32`` or autocast avoids.
    """
    for precision, regex in _PRECISION_PATTERNS:
        if regex.search(name):
            return precision
    return "unknown"
