"""The GPU's limits and the distance to them: dense peaks by dtype, memory bandwidth, MFU.

Contract: ``find_gpu(device_name) -> GpuSpec | None`` looks a device up in a table of known GPUs
(data, each figure with its source); ``utilisation(flops_by_dtype, step_s, gpu) -> Utilisation``
gives achieved TFLOP/s and model FLOPs utilisation (MFU). No torch import.

MFU here is the time the step's counted FLOPs would take at the GPU's dense peak for the dtype
each ran in, over the measured step time. With one dtype that is the usual
``achieved FLOP/s / peak FLOP/s``; with several (bf16 matmuls next to fp32 ones) each dtype's
FLOPs are charged at their own peak. The FLOPs are those that ran (torch.utils.flop_counter's
formulas over one step): with activation checkpointing the recomputed forward is counted too,
which makes the figure what the literature calls hardware FLOPs utilisation (HFU).

Peaks are the vendors' dense figures (no 2:4 sparsity) at boost clock; no real matmul reaches
them. On this workplace's H100 80GB HBM3 (SXM), benchmarks/gpu_rates.py measured (4096^3 and
8192^3 matmuls, torch 2.11): fp32 50-51, tf32 352-389, bf16 673-704, fp16 644-650 TFLOP/s,
i.e. 68-75% of the datasheet's fp32 and 68-71% of its bf16 peak; pinned host-to-device copies
54.4 GB/s, pageable 14.7 GB/s. ``measured`` keeps those figures beside the datasheet's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: dtypes a peak is given for; "tf32" is fp32 storage on Tensor Cores, "fp32" on CUDA cores
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: dense peaks (TFLOP/s) by dtype, memory bandwidth (GB/s), and the source."""

    name: str
    #: regexes searched in ``torch.cuda.get_device_properties().name`` (any one identifies it)
    matches: tuple[str, ...]
    peak_tflops: dict[str, float]
    memory_gbs: float
    source: str
    #: rates measured on this GPU by benchmarks/gpu_rates.py, where we have them
    measured_tflops: dict[str, float] = field(default_factory=dict)

    def peak(self, dtype: str) -> float | None:
        return self.peak_tflops.get(dtype)

    def ridge_point(self, dtype: str) -> float | None:
        """FLOPs per byte above which a kernel is compute-bound on this GPU (the roofline's knee)."""
        peak = self.peak(dtype)
        return peak * 1e12 / (self.memory_gbs * 1e9) if peak else None


# The table. Order matters: the first entry whose pattern matches the device name wins, so the
# more specific names (H100 PCIe, H100 NVL) come before the general one.
GPUS: tuple[GpuSpec, ...] = (
    # NVIDIA H100 PCIe datasheet (2023): FP32 51, TF32 378 (756 sparse), BF16/FP16 756 (1,513
    # sparse), FP8 1,513 (3,026 sparse), FP64 26 TFLOP/s; HBM2e 2.0 TB/s.
    GpuSpec(
        "H100 PCIe",
        ("H100 PCIe",),
        {"fp64": 26, "fp32": 51, "tf32": 378, "bf16": 756, "fp16": 756, "fp8": 1513},
        2000,
        "NVIDIA H100 Tensor Core GPU datasheet, PCIe column, dense",
    ),
    # NVIDIA H100 NVL datasheet: FP32 60, TF32 835 sparse, BF16 1,671 sparse, FP8 3,341 sparse; 3.9 TB/s.
    GpuSpec(
        "H100 NVL",
        ("H100 NVL",),
        {"fp64": 30, "fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
        3900,
        "NVIDIA H100 NVL datasheet, sparse figures halved",
    ),
    # NVIDIA H100 datasheet, SXM column: FP32 67, TF32 989 sparse (494.7 dense), BF16/FP16 1,979
    # sparse (989.4 dense), FP8 3,958 sparse, FP64 34; HBM3 3.35 TB/s. torch names it
    # "NVIDIA H100 80GB HBM3".
    GpuSpec(
        "H100 SXM",
        ("H100 80GB HBM3", "H100 SXM", "H100"),
        {"fp64": 34, "fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        3350,
        "NVIDIA H100 Tensor Core GPU datasheet, SXM column, dense",
        measured_tflops={"fp32": 51, "tf32": 389, "bf16": 704, "fp16": 650},
    ),
    # NVIDIA H200 datasheet, SXM: the same compute as H100 SXM; HBM3e 141 GB at 4.8 TB/s.
    GpuSpec(
        "H200",
        ("H200",),
        {"fp64": 34, "fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        4800,
        "NVIDIA H200 Tensor Core GPU datasheet, SXM column, dense",
    ),
    # NVIDIA A100 datasheet: FP32 19.5, TF32 156, BF16/FP16 312, FP64 9.7 (19.5 Tensor Core);
    # 80GB SXM 2,039 GB/s, 80GB PCIe 1,935 GB/s, 40GB 1,555 GB/s.
    GpuSpec(
        "A100 80GB SXM",
        (r"A100-SXM4-80GB", r"A100 80GB SXM"),
        {"fp64": 19.5, "fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
        2039,
        "NVIDIA A100 Tensor Core GPU datasheet, dense",
    ),
    GpuSpec(
        "A100 80GB PCIe",
        (r"A100 80GB PCIe", r"A100-PCIE-80GB"),
        {"fp64": 19.5, "fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
        1935,
        "NVIDIA A100 Tensor Core GPU datasheet, dense",
    ),
    GpuSpec(
        "A100 40GB",
        (r"A100",),
        {"fp64": 19.5, "fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
        1555,
        "NVIDIA A100 Tensor Core GPU datasheet, 40GB, dense",
    ),
    # NVIDIA L40S datasheet: FP32 91.6, TF32 183 (366 sparse), BF16/FP16 362 (733 sparse),
    # FP8 733 (1,466 sparse); GDDR6 864 GB/s.
    GpuSpec(
        "L40S",
        ("L40S",),
        {"fp32": 91.6, "tf32": 183, "bf16": 362, "fp16": 362, "fp8": 733},
        864,
        "NVIDIA L40S datasheet, dense",
    ),
    # NVIDIA L4 datasheet: FP32 30.3, TF32 60 (120 sparse), BF16/FP16 121 (242 sparse), FP8 242.5
    # (485 sparse); 300 GB/s.
    # NVIDIA L40 datasheet: FP32 90.5, TF32 181 sparse, BF16/FP16 362 sparse, FP8 724 sparse; 864 GB/s.
    GpuSpec(
        "L40",
        (r"\bL40\b",),
        {"fp32": 90.5, "tf32": 90.5, "bf16": 181, "fp16": 181, "fp8": 362},
        864,
        "NVIDIA L40 datasheet, sparse figures halved",
    ),
    GpuSpec(
        "L4",
        (r"\bL4\b",),
        {"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121, "fp8": 242.5},
        300,
        "NVIDIA L4 datasheet, dense",
    ),
    # NVIDIA A10 datasheet: FP32 31.2, TF32 62.5, BF16/FP16 125; 600 GB/s.
    GpuSpec(
        "A10", (r"\bA10\b",), {"fp32": 31.2, "tf32": 62.5, "bf16": 125, "fp16": 125}, 600, "NVIDIA A10 datasheet, dense"
    ),
    # NVIDIA Ada Lovelace architecture whitepaper, RTX 4090 column: FP32 82.6; Tensor TFLOPS with
    # FP32 accumulate (what torch's bf16/fp16 matmuls use): BF16/FP16 165.2, TF32 82.6, FP8 330.3;
    # GDDR6X 1,008 GB/s.
    GpuSpec(
        "RTX 4090",
        ("RTX 4090",),
        {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3},
        1008,
        "NVIDIA Ada Lovelace whitepaper (RTX 4090), FP32 accumulate, dense",
    ),
    # NVIDIA Ampere GA102 whitepaper, RTX 3090: FP32 35.6; FP16/BF16 with FP32 accumulate 71,
    # TF32 35.6; 936 GB/s.
    GpuSpec(
        "RTX 3090",
        ("RTX 3090",),
        {"fp32": 35.6, "tf32": 35.6, "bf16": 71, "fp16": 71},
        936,
        "NVIDIA GA102 whitepaper (RTX 3090), FP32 accumulate, dense",
    ),
    # NVIDIA V100 datasheet: SXM2 FP32 15.7, Tensor (FP16) 125; PCIe 14 and 112; HBM2 900 GB/s.
    # No bf16 or TF32 on Volta: torch emulates bf16 matmuls far below the fp16 rate.
    GpuSpec(
        "V100 SXM2",
        ("V100-SXM2", "V100 SXM2"),
        {"fp64": 7.8, "fp32": 15.7, "fp16": 125},
        900,
        "NVIDIA V100 datasheet, SXM2",
    ),
    GpuSpec("V100 PCIe", ("V100",), {"fp64": 7, "fp32": 14, "fp16": 112}, 900, "NVIDIA V100 datasheet, PCIe"),
    # NVIDIA T4 datasheet: FP32 8.1, FP16 (mixed precision) 65; GDDR6 320 GB/s.
    GpuSpec("T4", (r"\bT4\b",), {"fp32": 8.1, "fp16": 65}, 320, "NVIDIA T4 datasheet"),
)


def find_gpu(device_name: str | None) -> GpuSpec | None:
    """The table's entry for a device name as torch reports it, or None for an unknown GPU."""
    if not device_name:
        return None
    for gpu in GPUS:
        if any(re.search(pattern, device_name) for pattern in gpu.matches):
            return gpu
    return None


#: torch dtype names (as ``MatmulShape.dtype`` holds them) to the table's dtypes
TORCH_DTYPES = {
    "float64": "fp64",
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
}


def compute_dtype(torch_dtype: str, tf32_allowed: bool) -> str:
    """The arithmetic a matmul of ``torch_dtype`` inputs runs in: float32 runs as TF32 when the
    script allowed it (``allow_tf32`` or ``float32_matmul_precision`` high/medium)."""
    dtype = TORCH_DTYPES.get(torch_dtype, "fp32")
    return "tf32" if dtype == "fp32" and tf32_allowed else dtype


@dataclass(frozen=True)
class Utilisation:
    """How far a step is from the GPU's compute peak."""

    achieved_tflops: float
    #: the time the FLOPs would take at peak over the step time (None: no peak known for a dtype)
    mfu: float | None
    #: the dtype that carries most FLOPs, and its peak on this GPU
    main_dtype: str
    peak_tflops: float | None
    #: the step's FLOPs by the dtype they ran in
    flops_by_dtype: dict[str, float]


def utilisation(flops_by_dtype: dict[str, float], step_s: float, gpu: GpuSpec | None) -> Utilisation | None:
    """Achieved TFLOP/s and MFU of a step that ran ``flops_by_dtype`` in ``step_s`` seconds."""
    total = sum(flops_by_dtype.values())
    if step_s <= 0 or total <= 0:
        return None
    main = max(flops_by_dtype, key=lambda d: flops_by_dtype[d])
    achieved = total / step_s / 1e12
    if gpu is None:
        return Utilisation(achieved, None, main, None, dict(flops_by_dtype))
    ideal_s = 0.0
    for dtype, flops in flops_by_dtype.items():
        peak = gpu.peak(dtype)
        if peak is None:
            return Utilisation(achieved, None, main, gpu.peak(main), dict(flops_by_dtype))
        ideal_s += flops / (peak * 1e12)
    return Utilisation(achieved, ideal_s / step_s, main, gpu.peak(main), dict(flops_by_dtype))


def split_by_dtype(total_flops: float, flops_by_torch_dtype: dict[str, float], tf32_allowed: bool) -> dict[str, float]:
    """Spread ``total_flops`` over compute dtypes in the proportions seen in the counted
    matmuls (``FlopCount.matmuls`` keeps the largest shapes only, hence proportions)."""
    shares: dict[str, float] = {}
    for torch_dtype, flops in flops_by_torch_dtype.items():
        dtype = compute_dtype(torch_dtype, tf32_allowed)
        shares[dtype] = shares.get(dtype, 0.0) + flops
    seen = sum(shares.values())
    if seen <= 0:
        return {compute_dtype("float32", tf32_allowed): total_flops} if total_flops > 0 else {}
    return {dtype: total_flops * flops / seen for dtype, flops in shares.items()}
