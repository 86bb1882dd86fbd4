"""The top kernels by time, their class, and where each class sits on this GPU's roofline.

Contract: ``kernel_table(kernels, steps, flops, gpu, dtype) -> KernelTable``; pure, no torch.
``kernels`` are the trace's GPU kernels (anything with ``name``, ``start``, ``end`` in us) over
``steps`` profiled steps; ``flops`` is the ``FlopCount`` of one step (``runtime/flops.py``).
``table_from_totals`` does the same from each name's total time and calls (what the breakdown
keeps, ``Breakdown.kernels_by_name``).

Kernel classes come from names, kept as data below (as in ``patterns.py``): matmul, attention,
elementwise, reduction, copy, comm, other. Operator classes (``aten.mm`` ...) come from the same
kind of table, so that the counted step's FLOPs and bytes can be set against the trace's kernel
time class by class.

What is measured and what is estimated: kernel times are measured (the trace). The trace carries
no FLOPs or bytes per kernel, so a class's FLOPs and bytes per step come from the counted step
(matmul and attention FLOPs from torch's formulas; elementwise FLOPs estimated as one per output
element, reduction FLOPs as one per input element; bytes as the tensors' sizes read and written)
and are spread over the class's kernels in proportion to their time. Every kernel of a class
therefore shows the class's average rate; ``estimated`` says so. A class with no FLOPs and no
bytes (copies, communication, ...) gets no point on the roofline.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

from diagnose.analysis.measure.hardware import GpuSpec
from diagnose.analysis.measure.memory_breakdown import MAX_BATCH_FACTOR
from diagnose.analysis.trace.patterns import KernelPattern
from diagnose.record import FlopCount, MatmulShape

CLASSES = ("matmul", "attention", "elementwise", "reduction", "copy", "comm", "other")


def _k(kind: str, pattern: str, why: str) -> KernelPattern:
    return KernelPattern(kind, re.compile(pattern), why)


#: Kernel names to classes, tried in order (attention kernels also look like matmuls; copies and
#: reductions also run through torch's elementwise templates).
KERNEL_PATTERNS: tuple[KernelPattern, ...] = (
    _k("comm", r"nccl", "NCCL collectives"),
    _k(
        "attention",
        r"fmha|flash|sdpa|[Aa]ttention|_mha_",
        "fused scaled-dot-product attention (flash, memory-efficient, cuDNN)",
    ),
    _k(
        "matmul",
        r"gemm|gemv|xmma|nvjet|cutlass|Gemm|wgrad|dgrad|fprop|implicit_gemm|conv2d|convolve|winograd"
        r"|cudnn_generated|^triton_tem_|splitKreduce",
        "cuBLAS, cuBLASLt, CUTLASS, cuDNN and Inductor template matmuls and convolutions",
    ),
    _k(
        "copy",
        r"direct_copy|copy_kernel|CatArray|cat_|[Tt]ranspose|nchwToNhwc|nhwcToNchw|[Mm]emcpy|index_select|gather_kernel",
        "copies, concatenations, layout transposes",
    ),
    _k(
        "reduction",
        r"reduce|Reduce|[Ss]oft[Mm]ax|layer_norm|LayerNorm|batch_norm|BatchNorm|welford|Welford|nll_loss"
        r"|cross_entropy|cub::|DeviceScan|DeviceRadix|^triton_red_|^triton_per_|norm_kernel|RowwiseMoments",
        "reductions, softmax, normalisations, losses",
    ),
    _k(
        "elementwise",
        r"elementwise|Functor|pointwise|^triton_poi_|multi_tensor_apply|fused_adam|FusedAdam|dropout|fill"
        r"|vectorized|activation|gelu|relu|sigmoid|tanh|unrolled",
        "one output per input element: activations, arithmetic, optimizers",
    ),
)

#: aten operators to classes; operators missing here are elementwise when they move bytes.
OP_CLASSES: dict[str, str] = {
    **dict.fromkeys(
        (
            "aten.mm",
            "aten.addmm",
            "aten.bmm",
            "aten.baddbmm",
            "aten._scaled_mm",
            "aten.convolution",
            "aten._convolution",
            "aten.cudnn_convolution",
            "aten.convolution_backward",
            "aten._slow_conv2d_forward",
            "aten.convolution_overrideable",
        ),
        "matmul",
    ),
    **dict.fromkeys(
        (
            "aten._scaled_dot_product_flash_attention",
            "aten._scaled_dot_product_efficient_attention",
            "aten._scaled_dot_product_cudnn_attention",
            "aten._scaled_dot_product_flash_attention_backward",
            "aten._scaled_dot_product_efficient_attention_backward",
            "aten._scaled_dot_product_cudnn_attention_backward",
            "aten._flash_attention_forward",
            "aten._flash_attention_backward",
            "aten._efficient_attention_forward",
            "aten._efficient_attention_backward",
        ),
        "attention",
    ),
    **dict.fromkeys(
        (
            "aten.sum",
            "aten.mean",
            "aten.amax",
            "aten.amin",
            "aten.max",
            "aten.min",
            "aten.argmax",
            "aten.argmin",
            "aten.norm",
            "aten.linalg_vector_norm",
            "aten._softmax",
            "aten._log_softmax",
            "aten._softmax_backward_data",
            "aten._log_softmax_backward_data",
            "aten.native_layer_norm",
            "aten.native_layer_norm_backward",
            "aten.native_batch_norm",
            "aten.native_batch_norm_backward",
            "aten._native_batch_norm_legit",
            "aten._native_batch_norm_legit_functional",
            "aten._native_batch_norm_legit_no_training",
            "aten.cudnn_batch_norm",
            "aten.cudnn_batch_norm_backward",
            "aten.native_group_norm",
            "aten.native_group_norm_backward",
            "aten.nll_loss_forward",
            "aten.nll_loss_backward",
            "aten.nll_loss2d_forward",
            "aten.nll_loss2d_backward",
            "aten.cumsum",
            "aten.var",
            "aten.std",
            "aten.var_mean",
            "aten.prod",
            "aten.logsumexp",
            "aten._fused_rms_norm",
            "aten._fused_rms_norm_backward",
            "aten.topk",
            "aten.sort",
        ),
        "reduction",
    ),
    **dict.fromkeys(
        (
            "aten.copy_",
            "aten._to_copy",
            "aten.clone",
            "aten.cat",
            "aten.index_select",
            "aten.gather",
            "aten.embedding",
            "aten.embedding_dense_backward",
            "aten.index",
            "aten.index_put_",
            "aten._pin_memory",
            "aten.scatter_add_",
        ),
        "copy",
    ),
    # no kernel of their own: allocations, scalar reads, profiler marks
    **dict.fromkeys(
        (
            "aten.empty",
            "aten.empty_strided",
            "aten.empty_like",
            "aten.new_empty",
            "aten.new_empty_strided",
            "aten.lift_fresh",
            "aten._local_scalar_dense",
            "aten.set_",
            "aten.resize_",
            "aten.record_stream",
        ),
        "none",
    ),
}


@lru_cache(maxsize=65536)
def kernel_class(name: str) -> str:
    """The class of a kernel, by name (cached: the same few hundred names are classified for
    every step's table)."""
    for pattern in KERNEL_PATTERNS:
        if pattern.regex.search(name):
            return pattern.name
    return "other"


def op_class(op: str) -> str:
    """The class of an aten operator, by the table (``profiler.*`` and the like: none)."""
    if op in OP_CLASSES:
        return OP_CLASSES[op]
    return "elementwise" if op.startswith("aten.") else "none"


class _Kernel(Protocol):
    name: str
    start: float
    end: float


@dataclass(frozen=True)
class ClassWork:
    """One class's work per step: measured kernel time, counted or estimated FLOPs and bytes."""

    kind: str
    time_s: float
    flops: float
    bytes: float
    #: FLOPs from torch's formulas (matmul, attention) rather than an element count
    flops_counted: bool

    @property
    def tflops(self) -> float | None:
        return self.flops / self.time_s / 1e12 if self.time_s > 0 and self.flops > 0 else None

    @property
    def gbs(self) -> float | None:
        return self.bytes / self.time_s / 1e9 if self.time_s > 0 and self.bytes > 0 else None

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte (the roofline's x axis)."""
        return self.flops / self.bytes if self.bytes > 0 and self.flops > 0 else None


@dataclass(frozen=True)
class RooflinePoint:
    kind: str
    intensity: float
    tflops: float
    #: the roof over this intensity on this GPU: min(compute peak, intensity x bandwidth)
    roof_tflops: float
    bound: str  # "memory" or "compute": which side of the ridge point it sits on
    time_share: float

    @property
    def of_roof(self) -> float:
        return self.tflops / self.roof_tflops if self.roof_tflops > 0 else 0.0


@dataclass(frozen=True)
class KernelRow:
    name: str
    kind: str
    time_s: float  # per step
    share: float  # of all kernel time
    calls: float  # per step
    tflops: float | None  # the class's average rate (estimated)
    gbs: float | None


@dataclass
class KernelTable:
    rows: list[KernelRow]
    classes: dict[str, ClassWork]
    roofline: list[RooflinePoint]
    kernel_time_s: float  # all kernels, per step
    #: the peak and bandwidth the roofline used, and the dtype of the peak
    peak_tflops: float | None = None
    memory_gbs: float | None = None
    dtype: str | None = None
    estimated: list[str] = field(default_factory=list)

    def share(self, kind: str) -> float:
        work = self.classes.get(kind)
        return work.time_s / self.kernel_time_s if work and self.kernel_time_s > 0 else 0.0


def class_work_from_flops(flops: FlopCount) -> dict[str, tuple[float, float, bool]]:
    """(FLOPs, bytes, counted) per class for one step from the counted operators."""
    out: dict[str, list[Any]] = defaultdict(lambda: [0.0, 0.0, False])
    for op, count in flops.ops.items():
        kind = op_class(op)
        if kind == "none":
            continue
        entry = out[kind]
        if count.flops:
            entry[0] += count.flops
            entry[2] = True
        elif kind == "elementwise":
            entry[0] += count.elements_out
        elif kind == "reduction":
            entry[0] += count.elements_in
        entry[1] += count.bytes
    return {kind: (f, b, counted) for kind, (f, b, counted) in out.items()}


def kernel_table(
    kernels: Iterable[_Kernel],
    steps: int,
    flops: FlopCount | None = None,
    gpu: GpuSpec | None = None,
    dtype: str | None = None,
    top: int = 15,
    samples_scale: float = 1.0,
) -> KernelTable:
    """Top kernels per step, class totals and roofline points. ``samples_scale`` scales the
    counted step's work to the profiled steps' batch (when the counted step's batch differed)."""
    totals: dict[str, tuple[float, int]] = {}
    for k in kernels:
        us, calls = totals.get(k.name, (0.0, 0))
        totals[k.name] = (us + (k.end - k.start), calls + 1)
    return table_from_totals(totals, steps, flops, gpu, dtype, top, samples_scale)


def table_from_totals(
    totals: dict[str, tuple[float, int]],
    steps: int,
    flops: FlopCount | None = None,
    gpu: GpuSpec | None = None,
    dtype: str | None = None,
    top: int = 15,
    samples_scale: float = 1.0,
) -> KernelTable:
    """:func:`kernel_table` from each kernel name's (time in us, calls) over ``steps`` steps."""
    steps = max(steps, 1)
    by_name = {name: (us / 1e6, calls) for name, (us, calls) in totals.items()}
    total = sum(t for t, _ in by_name.values()) / steps
    class_time: dict[str, float] = defaultdict(float)
    for name, (t, _) in by_name.items():
        class_time[kernel_class(name)] += t / steps
    work = class_work_from_flops(flops) if flops is not None else {}
    classes = {}
    for kind in CLASSES:
        t = class_time.get(kind, 0.0)
        f, b, counted = work.get(kind, (0.0, 0.0, False))
        if t > 0 or f > 0:
            classes[kind] = ClassWork(kind, t, f * samples_scale, b * samples_scale, counted)
    rows = []
    for name, (t, calls) in sorted(by_name.items(), key=lambda item: -item[1][0])[:top]:
        kind = kernel_class(name)
        cw = classes.get(kind)
        rows.append(
            KernelRow(
                name,
                kind,
                t / steps,
                (t / steps) / total if total else 0.0,
                calls / steps,
                cw.tflops if cw else None,
                cw.gbs if cw else None,
            )
        )
    peak = gpu.peak(dtype) if gpu is not None and dtype else None
    bandwidth = gpu.memory_gbs if gpu is not None else None
    points = roofline_points(classes, total, peak, bandwidth)
    estimated = []
    if flops is not None:
        estimated.append(
            "per-kernel FLOP/s and bytes/s: the class's counted step totals spread over its kernels by time"
        )
        estimated.append("elementwise FLOPs: one per output element; reduction FLOPs: one per input element")
        estimated.append("bytes: tensor sizes read and written by each operator (cache reuse not seen)")
    return KernelTable(rows, classes, points, total, peak, bandwidth, dtype, estimated)


def roofline_points(
    classes: dict[str, ClassWork], kernel_time_s: float, peak_tflops: float | None, memory_gbs: float | None
) -> list[RooflinePoint]:
    """A point per class with both FLOPs and bytes, against ``min(peak, intensity x bandwidth)``."""
    if not peak_tflops or not memory_gbs:
        return []
    ridge = peak_tflops * 1e12 / (memory_gbs * 1e9)
    points = []
    for kind, cw in classes.items():
        intensity, tflops = cw.intensity, cw.tflops
        if intensity is None or tflops is None:
            continue
        roof = min(peak_tflops, intensity * memory_gbs * 1e9 / 1e12)
        share = cw.time_s / kernel_time_s if kernel_time_s > 0 else 0.0
        points.append(RooflinePoint(kind, intensity, tflops, roof, "memory" if intensity < ridge else "compute", share))
    return points


# --- Tensor Core alignment ---------------------------------------------------------------------

#: elements per 16 bytes: the multiple Tensor Core matmuls want in each dimension (cuBLAS
#: "Matrix Multiplication Background" guide: multiples of 8 for fp16/bf16, 4 for tf32, 16 for fp8)
ALIGNMENT = {"float16": 8, "bfloat16": 8, "float32": 4, "float8_e4m3fn": 16, "float8_e5m2": 16}


def misaligned(shape: MatmulShape) -> list[str]:
    """The dimensions of ``shape`` that are not multiples of its dtype's alignment. For a
    convolution only the channels count (``n``, ``k``); for a matmul all three."""
    align = ALIGNMENT.get(shape.dtype)
    if align is None:
        return []
    dims = {"n": shape.n, "k": shape.k} if "conv" in shape.op else {"m": shape.m, "n": shape.n, "k": shape.k}
    return [name for name, value in dims.items() if value % align]


def misaligned_flop_share(matmuls: list[MatmulShape]) -> float | None:
    """Share of the counted matmul FLOPs in shapes with a misaligned dimension."""
    total = sum(s.flops for s in matmuls)
    if total <= 0:
        return None
    return sum(s.flops for s in matmuls if misaligned(s)) / total


# --- matmuls too small for the Tensor Cores (a tiny batch) -------------------------------------

#: bytes per element of the dtypes matmuls run in
ELEMENT_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
#: the 2-d matmuls of linear layers: one of their dimensions is the rows (batch x positions).
#: Batched matmuls fold their batch into ``m`` (their bytes cannot be told from the shape) and
#: convolutions reuse each input many times (im2col): neither is sized by this model.
LINEAR_MATMULS = ("aten.mm", "aten.addmm")
#: a dimension this many times smaller than both others is taken for the rows: a linear layer's
#: other two are its weight's (in and out features, within a few times of each other), and a
#: tiny batch makes the rows the odd one out in the forward, input-gradient and weight-gradient
#: matmul alike. A shape with no such dimension (a narrow model at any batch) is not one a
#: larger batch widens.
ROWS_RATIO = 8


def rows_dimension(shape: MatmulShape) -> int | None:
    """The dimension of a linear matmul that a larger batch would widen, when one stands out."""
    small, b, _ = sorted((shape.m, shape.n, shape.k))
    return small if small * ROWS_RATIO <= b else None


def _roof(shape: MatmulShape, gpu: GpuSpec, tf32_allowed: bool, batch_factor: float) -> tuple[float, float] | None:
    """(FLOPs, least time) of ``shape``'s calls on the roofline, its rows scaled by ``batch_factor``."""
    from diagnose.analysis.measure.hardware import compute_dtype

    peak = gpu.peak(compute_dtype(shape.dtype, tf32_allowed))
    size = ELEMENT_BYTES.get(shape.dtype)
    if not peak or not size or not gpu.memory_gbs or shape.calls <= 0:
        return None
    small: float  # scaled by the batch below
    small, b, c = sorted((shape.m, shape.n, shape.k))
    if rows_dimension(shape) is not None:
        small = small * batch_factor
    flops = 2 * small * b * c
    moved = (small * b + small * c + b * c) * size
    return shape.calls * flops, shape.calls * max(flops / (peak * 1e12), moved / (gpu.memory_gbs * 1e9))


def matmul_roof_time(shape: MatmulShape, gpu: GpuSpec, tf32_allowed: bool, batch_factor: float = 1.0) -> float | None:
    """The least time ``shape``'s calls can take on ``gpu``: each call's FLOPs at the compute
    peak or its three operands read and written once at the memory bandwidth, whichever is
    longer (the roofline). ``batch_factor`` scales the rows (``rows_dimension``) to ask what a
    larger batch would allow."""
    roof = _roof(shape, gpu, tf32_allowed, batch_factor)
    return roof[1] if roof is not None else None


def matmul_roof_share(
    matmuls: list[MatmulShape], gpu: GpuSpec | None, tf32_allowed: bool, batch_factor: float = 1.0
) -> float | None:
    """The most of the GPU's compute peak the counted linear-layer matmul shapes allow: their
    FLOPs at the peak over their least time on the roofline (1.0: every shape is right of the
    ridge point; 0.05: the shapes, not the kernels, hold the matmuls to 5% of the peak, as a
    16-row matmul in bf16 on an H100 does, memory-bound on its weights). None without a GPU
    table entry or linear matmuls."""
    if gpu is None:
        return None
    from diagnose.analysis.measure.hardware import compute_dtype

    at_peak = at_roof = 0.0
    for shape in matmuls:
        roof = _roof(shape, gpu, tf32_allowed, batch_factor) if shape.op in LINEAR_MATMULS else None
        if roof is None:
            continue
        at_peak += roof[0] / (gpu.peak(compute_dtype(shape.dtype, tf32_allowed)) * 1e12)  # type: ignore[operator]
        at_roof += roof[1]
    return at_peak / at_roof if at_roof > 0 else None


def rows_limited_share(matmuls: list[MatmulShape], gpu: GpuSpec | None, tf32_allowed: bool) -> float:
    """Share of the linear matmuls' least time in shapes whose rows stand out as small."""
    if gpu is None:
        return 0.0
    times = [
        (rows_dimension(s) is not None, _roof(s, gpu, tf32_allowed, 1.0)) for s in matmuls if s.op in LINEAR_MATMULS
    ]
    total = sum(r[1] for _, r in times if r is not None)
    return sum(r[1] for rows, r in times if rows and r is not None) / total if total > 0 else 0.0


def batch_to_fill_matmuls(
    matmuls: list[MatmulShape],
    gpu: GpuSpec | None,
    tf32_allowed: bool,
    batch: int,
    largest: int | None,
    enough: float = 0.9,
    most: int = MAX_BATCH_FACTOR,
) -> int | None:
    """The batch to suggest when the linear matmuls are too small: the first power-of-two
    multiple of ``batch`` whose shapes allow ``enough`` of the peak, or the largest that stays
    within ``largest`` (the batch that fits the memory), at most ``most`` times the batch.
    None when the shapes already allow ``enough``, when most of their time is not in shapes
    with few rows (a narrow model: a larger batch does not widen its matmuls), when even
    twice the batch does not fit, or when nothing is known."""
    if not batch or not largest or gpu is None:
        return None
    now = matmul_roof_share(matmuls, gpu, tf32_allowed)
    if now is None or now >= enough or rows_limited_share(matmuls, gpu, tf32_allowed) < 0.5:
        return None
    factor = 1
    while factor < most and batch * factor * 2 <= largest:
        factor *= 2
        share = matmul_roof_share(matmuls, gpu, tf32_allowed, factor)
        if share is None or share >= enough:
            break
    return batch * factor if factor > 1 else None
