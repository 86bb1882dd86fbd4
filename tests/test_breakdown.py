"""The attribution arithmetic on hand-written traces, with exact microseconds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from diagnose.analysis.measure.breakdown import EXPOSED, PHASES, backward_spans, compute_breakdown, forward_spans, merge
from diagnose.analysis.trace.timeline import build_timeline
from tests.tracebuilder import (
    AUTOGRAD,
    BF16_GEMM,
    ELEMENTWISE,
    FP32_GEMM,
    MAIN,
    NCCL_ALLREDUCE,
    TraceBuilder,
    one_gpu_step,
)


def analyse(builder: TraceBuilder):
    return compute_breakdown(build_timeline(builder.to_dict()))


def test_reference_gpu_step_exposed_view_to_the_microsecond() -> None:
    step = analyse(one_gpu_step()).steps[0]
    assert step.number == 7
    assert step.duration_us == 1000
    assert step.exposed == {
        "data_wait": 300,  # [0,300): GPU idle, host in the DataLoader
        "h2d_copy": 50,  # [300,350): host copying, GPU idle or only copying
        "sync": 51,  # [904,906) read-back memcpy + [906,955) blocked with the GPU idle
        "host_forward": 20,  # [350,360) and [600,610): GPU idle while the host runs forward
        "host_backward": 10,  # [610,620)
        "host_optimizer": 30,  # [850,880)
        "host_other": 69,  # [880,904) + [955,1000)
        "communication": 0,
        "gpu_forward": 240,  # two forward kernels [360,600)
        "gpu_backward": 180,  # a backward kernel [620,800), partly under the optimizer
        "gpu_optimizer": 50,  # [800,850)
        "gpu_other": 0,
    }
    assert sum(step.exposed.values()) == step.duration_us


def test_reference_gpu_step_phase_view() -> None:
    step = analyse(one_gpu_step()).steps[0]
    assert step.phases == {
        "data_wait": 300,
        "h2d_copy": 50,
        "forward": 260,  # first forward op (350) to the start of backward (610)
        "backward": 90,
        "optimizer": 180,
        "other": 120,  # [880,1000), the .item() sync included
    }


def test_reference_gpu_step_counters() -> None:
    step = analyse(one_gpu_step()).steps[0]
    assert step.gpu_busy_us == 30 + (600 - 360) + (850 - 620) + 2  # copies + kernel union + read-back
    assert step.kernel_count == 4
    assert step.kernel_time_us == 140 + 100 + 180 + 50
    assert step.median_kernel_us == 120
    assert (step.h2d_pageable_bytes, step.h2d_pinned_bytes, step.h2d_copies, step.d2h_bytes) == (4096, 0, 1, 4)
    # the staging sync inside the pageable copy is part of the copy, not a user sync
    assert step.sync_count == 1
    assert step.syncs_by_kind == {"item": 1}
    assert step.sync_blocked_us == 50
    assert step.sync_idle_after_us == 45  # nothing reaches the GPU after the sync until the step ends
    assert step.matmul_us == {"fp32": 140, "bf16": 100}
    assert (step.optimizer_kernels, step.multi_tensor_kernels) == (1, 1)


def test_window_shares_sum_to_one_and_hidden_is_the_rest_of_each_phase() -> None:
    b = one_gpu_step()
    # a second, GPU-bound step: data wait entirely hidden behind a long kernel
    b.step(8, 1000, 500)
    b.data_wait(1000, 200, workers=True)
    b.op("aten::linear", 1200, 10, forward=True)
    b.kernel(FP32_GEMM, 1000, 500, launch_ts=950)  # launched during step 7's "other" time
    breakdown = analyse(b)
    assert sum(breakdown.exposed_share.values()) == pytest.approx(1.0)
    assert sum(breakdown.phase_share.values()) == pytest.approx(1.0)
    second = breakdown.steps[1]
    assert second.exposed["data_wait"] == 0
    assert second.exposed["gpu_other"] == 500
    assert second.phases["data_wait"] == 200
    assert breakdown.hidden_share["data_wait"] == pytest.approx(200 / 1500)


@dataclass
class CpuCase:
    name: str
    ops: list[tuple[str, float, float, bool]]
    backward: list[tuple[float, float]]
    expected_phases: dict[str, float]
    data: list[tuple[float, float]] = field(default_factory=list)
    optimizer: list[tuple[float, float]] = field(default_factory=list)


CPU_CASES = [
    CpuCase(
        name="gradient accumulation: two forward/backward pairs per step",
        data=[(0, 100)],
        ops=[("aten::linear", 100, 10, True), ("aten::relu", 200, 10, True), ("aten::linear", 450, 10, True)],
        backward=[(300, 350), (350, 400), (500, 600)],
        optimizer=[(650, 800)],
        expected_phases={
            "data_wait": 100,
            "h2d_copy": 0,
            "forward": 250,
            "backward": 200,
            "optimizer": 150,
            "other": 300,
        },
    ),
    CpuCase(
        name="preprocessing between the batch and the model is other host work, not forward",
        data=[(0, 100)],
        ops=[("aten::mul", 100, 300, False), ("aten::linear", 400, 10, True)],
        backward=[(600, 700)],
        optimizer=[(700, 900)],
        expected_phases={
            "data_wait": 100,
            "h2d_copy": 0,
            "forward": 200,
            "backward": 100,
            "optimizer": 200,
            "other": 400,
        },
    ),
    CpuCase(
        name="inference: forward operators and no backward",
        data=[(0, 400)],
        ops=[("aten::linear", 500, 100, True), ("aten::relu", 600, 100, True)],
        backward=[],
        expected_phases={"data_wait": 400, "h2d_copy": 0, "forward": 200, "backward": 0, "optimizer": 0, "other": 400},
    ),
]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.name)
def test_cpu_only_steps(case: CpuCase) -> None:
    b = TraceBuilder(device=False)
    b.step(0, 0, 1000)
    for ts, end in case.data:
        b.data_wait(ts, end - ts)
    for name, ts, dur, fwd in case.ops:
        b.op(name, ts, dur, forward=fwd)
    for ts, end in case.backward:
        b.backward_op(ts, end - ts, tid=MAIN)  # CPU autograd runs on the calling thread
    for ts, end in case.optimizer:
        b.optimizer(ts, end - ts)
    breakdown = analyse(b)
    assert not breakdown.has_gpu
    step = breakdown.steps[0]
    assert step.phases == case.expected_phases
    # with no GPU every instant is host time: the exposed view mirrors the phases
    assert step.exposed["data_wait"] == case.expected_phases["data_wait"]
    assert step.exposed["host_forward"] == case.expected_phases["forward"]
    assert step.exposed["host_backward"] == case.expected_phases["backward"]
    assert step.exposed["host_optimizer"] == case.expected_phases["optimizer"]
    assert step.exposed["host_other"] == case.expected_phases["other"]
    assert step.gpu_busy_us == 0 and step.kernel_count == 0


def test_overlapping_streams_split_equally_between_phases() -> None:
    b = TraceBuilder()
    b.step(0, 0, 100)
    b.op("aten::linear", 0, 10, forward=True)
    b.backward_op(40, 10)
    b.kernel(ELEMENTWISE, 10, 60, launch_ts=5)  # forward kernel [10,70)
    b.kernel(ELEMENTWISE, 50, 50, launch_ts=45, tid=AUTOGRAD, stream=8)  # backward kernel [50,100)
    step = analyse(b).steps[0]
    assert step.exposed["gpu_forward"] == 40 + 10  # [10,50) alone, half of [50,70)
    assert step.exposed["gpu_backward"] == 10 + 30
    assert step.exposed["host_forward"] == 10
    assert step.gpu_busy_us == 90


def test_communication_is_exposed_only_when_no_compute_runs() -> None:
    b = TraceBuilder()
    b.step(0, 0, 100)
    b.backward_op(0, 50)
    b.kernel(ELEMENTWISE, 0, 40, launch_ts=0, tid=AUTOGRAD)
    b.kernel(NCCL_ALLREDUCE, 20, 60, launch_ts=10, tid=AUTOGRAD, stream=20)  # [20,80)
    step = analyse(b).steps[0]
    assert step.exposed["gpu_backward"] == 40
    assert step.exposed["communication"] == 40  # [40,80): overlapped part [20,40) is hidden
    assert step.communication_us == 60


def test_sync_inside_ddp_waits_for_communication_not_for_the_user() -> None:
    """DDP's forward blocks (cudaEventSynchronize) until the last all-reduce ends; on a rank that
    waits for a straggler that is most of the step, and it is not a sync the user can remove."""
    b = TraceBuilder()
    b.step(0, 0, 100)
    b.x("user_annotation", "DistributedDataParallel.forward", 10, 80)
    b.op("aten::linear", 85, 5, forward=True)
    b.kernel(NCCL_ALLREDUCE, 0, 60, launch_ts=0, tid=AUTOGRAD, stream=20)  # [0,60): the peer is late
    b.sync(12, 60, name="cudaEventSynchronize")  # [12,72): waits for it, then 12 us of nothing
    b.kernel(ELEMENTWISE, 88, 10, launch_ts=86)  # [88,98)
    step = analyse(b).steps[0]
    assert step.sync_count == 0 and step.sync_blocked_us == 0 and step.sync_idle_after_us == 0
    assert step.exposed["sync"] == 0
    # [0,60) the all-reduce kernel alone, [60,72) the host still waits for it with the GPU idle
    assert step.exposed["communication"] == 60 + 12
    # the wait belongs to the phase around it: here no model op had started yet
    assert step.phases["forward"] == 5 and step.phases["other"] == 95


def test_idle_after_syncs_counts_real_gpu_idleness_once() -> None:
    b = TraceBuilder()
    b.step(0, 0, 100)
    b.kernel(ELEMENTWISE, 0, 20, launch_ts=0)  # [0,20)
    b.kernel(NCCL_ALLREDUCE, 10, 40, launch_ts=5, stream=20)  # [10,50) on another stream
    b.sync(15, 10)  # [15,25): returns while the all-reduce still runs: no idle time after it
    b.sync(52, 3)  # [52,55) and [56,58): both followed by the same idle gap until 80
    b.sync(56, 2)
    b.kernel(ELEMENTWISE, 80, 10, launch_ts=79)
    step = analyse(b).steps[0]
    assert step.sync_count == 3
    assert step.sync_idle_after_us == 80 - 55  # [55,80) once, not [55,80) + [58,80)


def test_trace_without_step_marks_is_one_window() -> None:
    b = TraceBuilder(device=False)
    b.op("aten::linear", 10, 20, forward=True)
    b.op("aten::relu", 50, 40, forward=True)
    breakdown = analyse(b)
    assert not breakdown.has_step_marks
    assert [(s.start_us, s.duration_us) for s in breakdown.steps] == [(10, 80)]
    assert "no ProfilerStep" in breakdown.notes[0]


def test_unknown_and_legacy_categories() -> None:
    b = TraceBuilder(device=False)
    b.step(0, 0, 100)
    b.x("Operator", "aten::linear", 10, 20)  # torch < 1.10 spelling of cpu_op
    b.x("quantum_op", "teleport", 10, 20)
    timeline = build_timeline(b.to_dict())
    assert [op.name for op in timeline.host_ops] == ["aten::linear"]
    assert timeline.meta.unknown_categories == {"quantum_op": 1}
    assert "quantum_op (1)" in compute_breakdown(timeline).notes[0]


def test_steps_that_overlap_are_clipped_to_tile_the_time_line() -> None:
    b = TraceBuilder(device=False)
    b.step(1, 0, 120)
    b.step(2, 100, 100)
    timeline = build_timeline(b.to_dict())
    assert [(s.start, s.end) for s in timeline.steps] == [(0, 100), (100, 200)]


def test_interval_helpers() -> None:
    assert merge([(5, 10), (0, 3), (2, 4), (10, 12), (20, 20)]) == [(0, 4), (5, 12)]
    assert backward_spans([(0, 5), (5, 9), (20, 30)], forward_starts=[12]) == [(0, 9), (20, 30)]
    assert backward_spans([(0, 5), (20, 30)], forward_starts=[]) == [(0, 30)]
    assert forward_spans([(0, 1), (3, 4), (12, 13)], [(5, 9), (20, 30)], [(0, 40)]) == [(0, 5), (12, 20)]


def test_category_names_are_the_documented_ones() -> None:
    assert PHASES == ("data_wait", "h2d_copy", "forward", "backward", "optimizer", "other")
    assert set(EXPOSED) >= {"data_wait", "h2d_copy", "sync", "gpu_forward", "communication", "host_other"}


def test_bf16_gemm_name_is_classified() -> None:
    b = TraceBuilder()
    b.step(0, 0, 100)
    b.op("aten::linear", 0, 5, forward=True)
    b.kernel(BF16_GEMM, 10, 20, launch_ts=2)
    assert analyse(b).steps[0].matmul_us == {"bf16": 20}


def test_calibration_scales_host_time_to_the_steady_step() -> None:
    from diagnose.analysis.measure.breakdown import calibrate_to_steady_state

    b = TraceBuilder()
    b.step(0, 0, 100)  # profiled: 100 us, of which the GPU is busy 40 and the host launches 60
    b.op("aten::linear", 0, 1, forward=True)
    b.backward_op(90, 10)
    b.kernel(ELEMENTWISE, 20, 40, launch_ts=10)
    raw = analyse(b)
    assert raw.exposed_share["gpu_forward"] == pytest.approx(0.4)
    steady = calibrate_to_steady_state(raw, steady_step_us=70)  # the profiler cost 30 us of host time
    assert steady.profiler_inflation == pytest.approx(100 / 70)
    assert steady.exposed_share["gpu_forward"] == pytest.approx(40 / 70)
    assert sum(steady.exposed_share.values()) == pytest.approx(1.0)
    assert steady.trace_exposed_share == raw.exposed_share
    assert "slower" in steady.notes[-1]
    # a data-bound loop whose profiled steps are not slower is left alone
    assert calibrate_to_steady_state(raw, steady_step_us=120).exposed_share == raw.exposed_share


def test_a_slower_steady_step_is_put_down_to_its_data_wait_where_that_was_measured() -> None:
    """Profiled steps of 100 µs that waited 10 µs for data; steady steps of 200 µs that waited
    50% of their time (the window drew batches the workers had queued before it): the note says
    so. A steady wait no larger than the window's explains nothing: the note says what it may be."""
    from diagnose.analysis.measure.breakdown import calibrate_to_steady_state

    raw = analyse(_waiting_steps([10, 10, 10]))
    queued = calibrate_to_steady_state(raw, steady_step_us=200, steady_data_wait=0.5)
    assert queued.notes[-1].endswith(
        "(its steps waited 50% of their time for data, the profiled ones 10%: the window drew batches the "
        "DataLoader workers had queued before it)"
    )
    assert queued.exposed_share == raw.exposed_share  # the shares stay the profiled step's
    for unexplained in (
        calibrate_to_steady_state(raw, 200, steady_data_wait=0.12),
        calibrate_to_steady_state(raw, 200),
    ):
        assert unexplained.notes[-1].endswith(
            "(the script changed pace after the window: evaluation, checkpoints, "
            "a slower stretch of data, a busier machine)"
        )


def test_median_step_timeline_in_time_order(monkeypatch) -> None:
    import diagnose.analysis.measure.breakdown as breakdown_module

    monkeypatch.setattr(breakdown_module, "STRIP_BINS", 10)  # 100 us slices of the reference step
    strip = analyse(one_gpu_step()).timeline_strip
    assert strip["step"] == 7 and strip["bins"] == 10 and strip["duration_us"] == 1000
    # each slice shows what filled most of it; [900,1000) is mostly the .item() sync (51 us)
    assert strip["exposed"] == [
        ["data_wait", 3],
        ["h2d_copy", 1],
        ["gpu_forward", 2],
        ["gpu_backward", 2],
        ["gpu_optimizer", 1],
        ["sync", 1],
    ]
    assert strip["phases"] == [
        ["data_wait", 3],
        ["h2d_copy", 1],
        ["forward", 2],
        ["backward", 1],
        ["optimizer", 2],
        ["other", 1],
    ]


def _waiting_steps(waits: list[float], step_us: float = 100) -> TraceBuilder:
    """CPU-only steps of ``step_us`` each, the first ``waits[i]`` us of step i waiting for data."""
    b = TraceBuilder()
    for i, wait in enumerate(waits):
        b.step(i, i * step_us, step_us)
        if wait:
            b.data_wait(i * step_us, wait)
    return b


def test_a_table_row_is_the_mean_with_the_steps_spread() -> None:
    from diagnose.analysis.measure.breakdown import per_step_stats, reference_step_us

    bd = analyse(_waiting_steps([0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]))
    wait = per_step_stats(bd, "exposed")["data_wait"]
    # the mean is share x step (50% of 100 us), not the median; p10-p90 interpolated: 10 and 90
    assert reference_step_us(bd) == 100
    assert (wait.mean_us, wait.low_us, wait.high_us) == pytest.approx((50, 10, 90))
    assert per_step_stats(bd, "phases")["data_wait"].mean_us == pytest.approx(50)


def test_calibrated_rows_are_shares_of_the_steady_step_and_their_spread_scales_with_them() -> None:
    from diagnose.analysis.measure.breakdown import calibrate_to_steady_state, per_step_stats, reference_step_us

    b = TraceBuilder()
    for i, forward_us in enumerate((60, 80, 100)):  # host-only steps: all host time, inflated by profiling
        b.step(i, i * 100, 100)
        b.op("aten::linear", i * 100, forward_us, forward=True)
    raw = analyse(b)
    steady = calibrate_to_steady_state(raw, steady_step_us=50)
    assert reference_step_us(steady) == pytest.approx(50)
    assert reference_step_us(steady, "phases") == pytest.approx(100)  # phases stay the profiled step's
    stats = per_step_stats(steady, "exposed")
    for category, row in stats.items():
        assert row.mean_us == pytest.approx(steady.exposed_share[category] * 50)
    forward = stats["host_forward"]
    scale = forward.mean_us / 80  # the trace's mean forward is 80 us
    assert (forward.low_us, forward.high_us) == pytest.approx((64 * scale, 96 * scale))


# --- the array loops give what the Python loops give, to the last bit -----------------------------

RECORDED_TRACES = sorted(Path(__file__).parent.joinpath("data").rglob("*.pt.trace.json.gz"))


@pytest.mark.parametrize("trace", RECORDED_TRACES, ids=lambda p: f"{p.parent.name}/{p.name[:12]}")
def test_the_vectorized_breakdown_equals_the_loops_on_every_recorded_trace(
    trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diagnose.analysis.measure import breakdown as B
    from diagnose.analysis.trace import vectorized as V
    from diagnose.analysis.trace.timeline import load_timeline

    timeline = load_timeline(trace)
    if not timeline.steps:
        pytest.skip("no steps")
    fast = B.compute_breakdown(timeline)
    assert B._kernel_labels_vectorized(timeline, _host_intervals_of(timeline)) is not None or not timeline.kernels
    monkeypatch.setattr(B, "_kernel_labels_vectorized", lambda *a: None)
    monkeypatch.setattr(V, "steps_disjoint", lambda bounds: False)
    monkeypatch.setattr(B, "_kernel_stats_vectorized", B._kernel_stats_loop)
    slow = B.compute_breakdown(timeline)
    assert fast == slow  # every step's phases, exposed time, busy time, event counts, the strip, kernel stats
    assert fast.timeline_strip == slow.timeline_strip
    assert list(fast.kernels_by_name) == list(slow.kernels_by_name)  # the same order too
    assert [list(s.matmul_us) for s in fast.steps] == [list(s.matmul_us) for s in slow.steps]


def _host_intervals_of(timeline) -> dict:
    from diagnose.analysis.measure import breakdown as B

    forward_ops = B.compiled_forward_ops(timeline)
    backward = B.backward_spans(timeline.backward_ops, [op[0] for op in forward_ops])
    model = B.resolve_nesting(
        {
            "optimizer": timeline.optimizer_spans,
            "closure": timeline.closure_spans,
            "backward": backward,
            "forward": B.forward_spans(forward_ops, backward, [(s.start, s.end) for s in timeline.steps]),
        }
    )
    return {label: B.merge(model.get(label, [])) for label in ("optimizer", "backward", "forward")}


def test_the_vectorized_sweep_equals_the_loop_on_hand_made_intervals() -> None:
    """Ties everywhere: intervals that touch, nest, share ends with steps, and GPU work of no width."""
    import random

    from diagnose.analysis.measure import breakdown as B
    from diagnose.analysis.trace import vectorized as V

    rng = random.Random(7)
    steps = [(0.0, 40.0), (40.0, 75.0), (90.0, 130.0)]
    host = {label: [] for label in B._HOST_LABELS}
    gpu = {label: [] for label in B._GPU_LABELS}
    for labels, out in ((B._HOST_LABELS, host), (B._GPU_LABELS, gpu)):
        for _ in range(60):
            start = float(rng.randrange(-5, 135))
            out[rng.choice(labels)].append((start, start + float(rng.choice([0, 1, 2.5, 7, 30]))))
    marks = sorted(float(rng.randrange(-5, 135)) + rng.choice([0.0, 0.5]) for _ in range(200))
    spans = {label: B._spans(ivs) for label, ivs in gpu.items()}
    loop = B._sweep(steps, host, spans, 1, B.C.Records(None, [B.C.float_column(marks)]))
    arrays = V.sweep(
        steps,
        [B._spans(host[label]) for label in B._HOST_LABELS],
        [spans[label] for label in B._GPU_LABELS],
        B._state,
        B.PHASES,
        B.EXPOSED,
        1,
        marks,
    )
    assert arrays == loop
    assert V.merged(list(spans.values())) == B.merge([iv for ivs in gpu.values() for iv in ivs])
