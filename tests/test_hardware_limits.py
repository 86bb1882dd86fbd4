"""The distance to the hardware limit, torch-free: GPU table, MFU, kernel classes, roofline,
memory split, headroom and the out-of-memory explanation, on hand-made values."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from diagnose.analysis.measure import hardware, kernels, memory_breakdown
from diagnose.record import FlopCount, MatmulShape, MemorySplit, OpCount, RunRecord


@dataclass
class K:
    name: str
    start: float
    end: float


@pytest.mark.parametrize(
    "device,expected",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla T4", "T4"),
        ("NVIDIA A10G", None),
        ("AMD Instinct MI300X", None),
        (None, None),
    ],
)
def test_find_gpu(device: str | None, expected: str | None) -> None:
    gpu = hardware.find_gpu(device)
    assert (gpu.name if gpu else None) == expected


def test_measured_h100_rates_sit_below_the_datasheet() -> None:
    h100 = hardware.find_gpu("NVIDIA H100 80GB HBM3")
    for dtype, measured in h100.measured_tflops.items():
        assert 0.6 < measured / h100.peak(dtype) < 1.0, dtype


def test_mfu_of_one_dtype_is_achieved_over_peak() -> None:
    h100 = hardware.find_gpu("NVIDIA H100 80GB HBM3")
    # 2 * 8192^3 FLOPs in 2 ms: 549.76 TFLOP/s against 989.4
    u = hardware.utilisation({"bf16": 2 * 8192**3}, 0.002, h100)
    assert u.achieved_tflops == pytest.approx(549.7558, rel=1e-6)
    assert u.mfu == pytest.approx(549.7558 / 989.4, rel=1e-6)
    assert u.main_dtype == "bf16" and u.peak_tflops == 989.4


def test_mfu_charges_each_dtype_at_its_own_peak() -> None:
    h100 = hardware.find_gpu("NVIDIA H100 80GB HBM3")
    # 989.4 TFLOP in bf16 (1 s at peak) and 67 TFLOP in fp32 (1 s at peak) in 4 s: MFU 0.5
    u = hardware.utilisation({"bf16": 989.4e12, "fp32": 67e12}, 4.0, h100)
    assert u.mfu == pytest.approx(0.5)
    assert u.achieved_tflops == pytest.approx((989.4 + 67) / 4)


def test_mfu_unknown_without_a_peak() -> None:
    assert hardware.utilisation({"bf16": 1e12}, 1.0, None).mfu is None
    t4 = hardware.find_gpu("Tesla T4")
    assert hardware.utilisation({"bf16": 1e12}, 1.0, t4).mfu is None  # no bf16 on Turing
    assert hardware.utilisation({}, 1.0, t4) is None


def test_fp32_matmuls_run_as_tf32_when_allowed() -> None:
    split = hardware.split_by_dtype(100.0, {"float32": 3.0, "bfloat16": 1.0}, tf32_allowed=True)
    assert split == {"tf32": 75.0, "bf16": 25.0}
    assert hardware.split_by_dtype(100.0, {}, tf32_allowed=False) == {"fp32": 100.0}


@pytest.mark.parametrize(
    "name,kind",
    [
        ("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NTT", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(...)", "matmul"),
        ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>, true>", "attention"),
        ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "elementwise"),
        ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", "copy"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps>>", "reduction"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>", "reduction"),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", "reduction"),
        ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "elementwise"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm"),
        ("triton_poi_fused_add_mul_0", "elementwise"),
        ("triton_red_fused_native_layer_norm_1", "reduction"),
        ("triton_tem_fused_mm_2", "matmul"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float>", "copy"),
        ("some_custom_kernel", "other"),
    ],
)
def test_kernel_classes(name: str, kind: str) -> None:
    assert kernels.kernel_class(name) == kind


def _count() -> FlopCount:
    return FlopCount(
        step=15,
        seconds=1.0,
        total=4_000_000_000,
        by_phase={"forward": 2_000_000_000, "backward": 2_000_000_000, "optimizer": 0},
        ops={
            "aten.mm": OpCount(calls=2, flops=4_000_000_000, bytes=10_000_000),
            "aten.add": OpCount(calls=4, bytes=40_000_000, elements_in=8_000_000, elements_out=4_000_000),
            "aten.sum": OpCount(calls=1, bytes=8_000_004, elements_in=2_000_000, elements_out=1),
            "aten.empty": OpCount(calls=3, bytes=999, elements_out=999),
            "aten.t": OpCount(calls=2),
        },
        matmuls=[MatmulShape("aten.mm", 1000, 1000, 2000, "bfloat16", 2, 4_000_000_000)],
    )


def test_kernel_table_spreads_class_work_over_kernel_time() -> None:
    h100 = hardware.find_gpu("NVIDIA H100 80GB HBM3")
    trace = [
        # two steps: a matmul kernel of 8 us and an elementwise one of 20 us each step
        K("nvjet_sm90_tst_bz_NTT", 0, 8),
        K("vectorized_elementwise_kernel<AddFunctor>", 10, 30),
        K("nvjet_sm90_tst_bz_NTT", 100, 108),
        K("vectorized_elementwise_kernel<AddFunctor>", 110, 130),
        K("reduce_kernel<ReduceOp<float, SumOps>>", 140, 142),
    ]
    table = kernels.kernel_table(trace, steps=2, flops=_count(), gpu=h100, dtype="bf16")
    assert table.kernel_time_s == pytest.approx(29e-6)
    assert [r.kind for r in table.rows] == ["elementwise", "matmul", "reduction"]
    assert table.rows[0].calls == 1 and table.rows[0].share == pytest.approx(20 / 29)
    mm = table.classes["matmul"]
    assert mm.flops_counted and mm.tflops == pytest.approx(4e9 / 8e-6 / 1e12)  # 500 TFLOP/s
    add = table.classes["elementwise"]
    assert not add.flops_counted and add.flops == 4_000_000  # one per output element
    assert add.gbs == pytest.approx(40e6 / 20e-6 / 1e9)  # 2,000 GB/s
    assert "none" not in table.classes
    points = {p.kind: p for p in table.roofline}
    assert points["matmul"].bound == "compute" and points["matmul"].roof_tflops == 989.4
    assert points["elementwise"].bound == "memory"
    assert points["elementwise"].roof_tflops == pytest.approx(0.1 * 3350e9 / 1e12)
    assert points["elementwise"].of_roof == pytest.approx(0.2 / 0.335)
    assert table.share("elementwise") == pytest.approx(40 / 58)
    assert table.estimated


def test_kernel_table_without_a_count_or_gpu_has_no_roofline() -> None:
    table = kernels.kernel_table([K("gemm_x", 0, 5)], steps=1)
    assert table.roofline == [] and table.rows[0].tflops is None


@pytest.mark.parametrize(
    "shape,bad",
    [
        (MatmulShape("aten.mm", 4096, 4096, 4096, "bfloat16"), []),
        (MatmulShape("aten.mm", 4096, 50257, 768, "bfloat16"), ["n"]),
        (MatmulShape("aten.addmm", 30, 1000, 100, "float16"), ["m", "k"]),
        (MatmulShape("aten.mm", 30, 1002, 100, "float32"), ["m", "n"]),
        (MatmulShape("aten.convolution", 50176, 64, 3, "bfloat16"), ["k"]),
        (MatmulShape("aten.convolution", 12345, 64, 64, "bfloat16"), []),
        (MatmulShape("aten.mm", 3, 3, 3, "float64"), []),
    ],
)
def test_misaligned_dimensions(shape: MatmulShape, bad: list[str]) -> None:
    assert kernels.misaligned(shape) == bad


def test_misaligned_flop_share() -> None:
    shapes = [MatmulShape("aten.mm", 8, 8, 8, "bfloat16", 1, 300), MatmulShape("aten.mm", 8, 7, 8, "bfloat16", 1, 100)]
    assert kernels.misaligned_flop_share(shapes) == pytest.approx(0.25)
    assert kernels.misaligned_flop_share([]) is None


H100 = hardware.find_gpu("NVIDIA H100 80GB HBM3")  # bf16 989.4 TFLOP/s dense, 3,350 GB/s


def test_a_16_row_bf16_matmul_is_memory_bound_on_its_weight() -> None:
    # 16 x 8192 @ 8192 x 8192: 2.147 GFLOP over (16*8192 + 8192^2 + 16*8192) * 2 bytes
    shape = MatmulShape("aten.mm", 16, 8192, 8192, "bfloat16", 3, 3 * 2 * 16 * 8192 * 8192)
    moved = (2 * 16 * 8192 + 8192 * 8192) * 2
    assert kernels.matmul_roof_time(shape, H100, False) == pytest.approx(3 * moved / 3350e9)
    at_peak = 2 * 16 * 8192 * 8192 / 989.4e12
    assert kernels.matmul_roof_share([shape], H100, False) == pytest.approx(at_peak / (moved / 3350e9))
    assert kernels.matmul_roof_share([shape], H100, False) == pytest.approx(0.0540, abs=1e-4)
    # the backward's weight gradient has the batch as its inner dimension: the same bound
    wgrad = MatmulShape("aten.mm", 8192, 8192, 16, "bfloat16", 1, 2 * 16 * 8192 * 8192)
    assert kernels.matmul_roof_share([wgrad], H100, False) == kernels.matmul_roof_share([shape], H100, False)


def test_a_large_matmul_reaches_the_peak_and_convolutions_and_bmm_are_left_out() -> None:
    big = MatmulShape("aten.addmm", 4096, 4096, 4096, "bfloat16", 1, 2 * 4096**3)
    assert kernels.matmul_roof_share([big], H100, False) == pytest.approx(1.0)
    others = [
        MatmulShape("aten.convolution", 16, 8, 8, "bfloat16", 1, 1),
        MatmulShape("aten.bmm", 16, 8, 8, "bfloat16", 1, 1),
    ]
    assert kernels.matmul_roof_share(others, H100, False) is None
    assert kernels.matmul_roof_share([big], None, False) is None


def test_fp32_matmuls_are_judged_at_the_tf32_peak_when_allowed() -> None:
    shape = MatmulShape("aten.mm", 64, 4096, 4096, "float32", 1, 2 * 64 * 4096 * 4096)
    # 128 FLOP per 4-byte element pair: ~32 FLOP/byte; the fp32 ridge is 67e12/3350e9 = 20 (compute-bound),
    # the TF32 ridge 148 (memory-bound)
    assert kernels.matmul_roof_share([shape], H100, False) == pytest.approx(1.0)
    assert kernels.matmul_roof_share([shape], H100, True) < 0.25


def test_batch_to_fill_stops_where_the_shapes_reach_the_peak_or_memory_ends() -> None:
    layer = [MatmulShape("aten.mm", 16, 8192, 8192, "bfloat16", 1, 2 * 16 * 8192 * 8192)]
    # 16 rows x 32 = 512: intensity ~455 FLOP/byte, past the ridge (295): 90% of the peak reached
    assert kernels.matmul_roof_share(layer, H100, False, 16) < 0.9 <= kernels.matmul_roof_share(layer, H100, False, 32)
    assert kernels.batch_to_fill_matmuls(layer, H100, False, 16, largest=100_000, most=64) == 512
    # three doublings at most by default (MAX_BATCH_FACTOR): 128, short of the 512 that fill them
    assert kernels.batch_to_fill_matmuls(layer, H100, False, 16, largest=100_000) == 128
    assert kernels.batch_to_fill_matmuls(layer, H100, False, 16, largest=100_000, most=2) == 32  # a short epoch
    assert kernels.batch_to_fill_matmuls(layer, H100, False, 16, largest=100_000, most=1) is None
    assert kernels.batch_to_fill_matmuls(layer, H100, False, 16, largest=100, most=64) == 64  # what fits
    assert kernels.batch_to_fill_matmuls(layer, H100, False, 16, largest=31) is None  # not even twice
    assert kernels.batch_to_fill_matmuls(layer, H100, False, 16, largest=None) is None
    big = [MatmulShape("aten.mm", 4096, 4096, 4096, "bfloat16", 1, 2 * 4096**3)]
    assert kernels.batch_to_fill_matmuls(big, H100, False, 4096, largest=100_000) is None  # filled already


def test_a_suggested_batch_grows_three_doublings_at_most_and_keeps_sixteen_batches_an_epoch() -> None:
    assert memory_breakdown.batch_factor_limit() == memory_breakdown.MAX_BATCH_FACTOR == 8
    assert memory_breakdown.batch_factor_limit(10_000) == 8
    assert memory_breakdown.batch_factor_limit(40) == 2  # 2560 images at 64: 20 batches of 128
    assert memory_breakdown.batch_factor_limit(20) == 1  # none larger
    assert memory_breakdown.batch_factor_limit(3) == 1


def test_a_narrow_model_is_not_told_a_larger_batch_widens_its_matmuls() -> None:
    # width 64 at 8192 rows: memory-bound because the model is narrow, not the batch small
    narrow = [
        MatmulShape("aten.mm", 8192, 192, 64, "bfloat16", 1, 2 * 8192 * 192 * 64),
        MatmulShape("aten.mm", 8192, 256, 64, "bfloat16", 1, 2 * 8192 * 256 * 64),
    ]
    assert kernels.matmul_roof_share(narrow, H100, False) < 0.5
    assert kernels.rows_dimension(narrow[0]) is None and kernels.rows_limited_share(narrow, H100, False) == 0.0
    assert kernels.matmul_roof_share(narrow, H100, False, 8) == kernels.matmul_roof_share(narrow, H100, False)
    assert kernels.batch_to_fill_matmuls(narrow, H100, False, 16, largest=100_000) is None


GiB = 1024**3


def _step_split(**overrides: int) -> MemorySplit:
    values = dict(
        when="step",
        parameters_bytes=2 * GiB,
        gradients_bytes=2 * GiB,
        optimizer_state_bytes=4 * GiB,
        gradients_start_bytes=0,  # zero_grad(set_to_none=True): made again in backward
        allocated_start_bytes=9 * GiB,  # 2 params + 4 optimizer state + 3 other tensors
        allocated_end_bytes=11 * GiB,
        peak_allocated_bytes=31 * GiB,
        peak_reserved_bytes=34 * GiB,
        reserved_bytes=34 * GiB,
        capacity_bytes=80 * GiB,
        samples=32,
    )
    values.update(overrides)
    return MemorySplit(**values)  # type: ignore[arg-type]


def test_memory_breakdown_of_a_step() -> None:
    m = memory_breakdown.memory_breakdown(_step_split())
    # peak 31 = start 9 + gradients made 2 + activations 20
    assert m.activations == 20 * GiB
    assert m.other == 3 * GiB  # 9 at the start - 2 params - 4 optimizer state
    assert m.cache == 3 * GiB
    assert sum(m.parts().values()) == m.peak_reserved
    assert m.activations_per_sample == 20 * GiB / 32
    # (80 * 0.9 - (2 + 2 + 4 + 3)) GiB / (0.625 GiB per sample) = 61.0 / 0.625 = 97.6
    assert memory_breakdown.largest_batch(m) == 97
    assert m.headroom == 46 * GiB


def test_gradients_kept_between_steps_are_not_activations() -> None:
    m = memory_breakdown.memory_breakdown(_step_split(gradients_start_bytes=2 * GiB, allocated_start_bytes=11 * GiB))
    assert m.activations == 20 * GiB and m.other == 3 * GiB and m.gradients == 2 * GiB


def test_no_batch_no_estimate() -> None:
    assert memory_breakdown.largest_batch(memory_breakdown.memory_breakdown(_step_split(samples=None))) is None


def test_requested_bytes_from_torch_message() -> None:
    msg = "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.2 GiB is free."
    assert memory_breakdown.requested_bytes(msg) == int(2.5 * GiB)
    assert memory_breakdown.requested_bytes("Tried to allocate 512.00 MiB") == 512 * 1024**2
    assert memory_breakdown.requested_bytes("something else") is None


def test_explain_oom_names_the_largest_owner_and_orders_changes() -> None:
    split = MemorySplit(
        when="oom",
        parameters_bytes=1 * GiB,
        gradients_bytes=1 * GiB,
        optimizer_state_bytes=2 * GiB,
        allocated_end_bytes=76 * GiB,
        peak_allocated_bytes=76 * GiB,
        peak_reserved_bytes=78 * GiB,
        reserved_bytes=78 * GiB,
        capacity_bytes=80 * GiB,
        samples=512,
        message="CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 79.11 GiB",
    )
    why = memory_breakdown.explain_oom(split)
    assert why.largest == "activations" and why.largest_bytes == 72 * GiB
    assert why.requested == 4 * GiB
    assert why.changes[0].startswith("a smaller batch")
    assert any("bf16 autocast" in c for c in why.changes)
    assert not any("bf16 autocast" in c for c in memory_breakdown.explain_oom(split, mixed_precision=True).changes)
    assert why.changes[-1].startswith("optimizer.zero_grad(set_to_none=True)")  # 1 GiB: the least it frees


def test_run_record_keeps_flops_and_memory_split() -> None:
    record = RunRecord(flops=_count(), memory_split=_step_split())
    again = RunRecord.from_dict(record.to_dict())
    assert again.flops == record.flops and again.memory_split == record.memory_split
    assert RunRecord.from_dict(RunRecord().to_dict()).flops is None
