"""The replay model and the predictions: hand-written traces with exact microseconds, then the
recorded GPU fixtures (the replay reproduces the measured window; the planted fix is predicted
to help, unrelated changes are not)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from diagnose.analysis.measure.breakdown import calibrate_to_steady_state, compute_breakdown
from diagnose.analysis.pipeline import AnalysisOptions, _steady_step_us, gpu_stretch
from diagnose.analysis.prediction.predict import (
    KERNEL_FLOOR_MAX_US,
    LOADER_RECEIVE_BATCH_MS,
    LOADER_RECEIVE_CONTENTION,
    LOADER_RECEIVE_MS_PER_MB,
    QUEUE_PACED_MIN_SHARE,
    TRANSFORMATIONS,
    Predictor,
    autocast_bf16,
    compile_model,
    counted_share_edges,
    cuda_graphs,
    fused_optimizer,
    graph_breaks,
    graphs_of_compiled,
    grow_batch_building,
    kernel_floor_us,
    larger_batch,
    more_workers,
    paced_by_own_producers,
    pinned_copies,
    predict,
    remove_syncs,
    step_spread,
    tf32,
)
from diagnose.analysis.prediction.replay import (
    StepModel,
    build_model,
    host_code_scale,
    profiler_scale,
    replay,
    replay_check,
)
from diagnose.analysis.prediction.uncertainty import downside_error
from diagnose.analysis.symptoms import compute_symptoms, symptoms_from_values
from diagnose.analysis.trace.timeline import build_timeline, load_timeline
from diagnose.analysis.verdict.findings import MIN_GAIN, Diagnosis, diagnose_symptoms
from diagnose.analysis.verdict.rules import load_rules
from diagnose.record import RunRecord
from diagnose.rundir import RunDir
from diagnose.session import analyze_run
from tests.tracebuilder import ELEMENTWISE, FP32_GEMM, TraceBuilder, one_gpu_step

DATA = Path(__file__).parent / "data"


def model_of(b: TraceBuilder) -> StepModel:
    model = build_model(build_timeline(b.to_dict()))
    assert model is not None
    return model


def synced_step() -> TraceBuilder:
    """Forward (a matmul, then a relu that waits for it on the stream), then .item() blocked
    until the GPU is done, then 60 µs of host code. 200 µs."""
    b = TraceBuilder()
    b.step(1, 0, 200)
    b.op("aten::linear", 0, 40, forward=True)
    b.kernel(FP32_GEMM, 20, 100, launch_ts=10)  # waits 10 µs after its launch
    b.op("aten::relu", 40, 20, forward=True)
    b.kernel(ELEMENTWISE, 120, 10, launch_ts=45)  # waits for the matmul
    b.op("aten::item", 100, 45)
    b.sync(110, 30)  # returns 10 µs after the GPU's work ends at 130
    return b


# --- the replay reproduces hand-written traces ---------------------------------------------------


def test_replay_reproduces_the_reference_step_exactly() -> None:
    model = model_of(one_gpu_step())
    result = replay(model)
    assert result.window_us == 1000.0
    assert result.host_end_us == 1000.0
    assert replay_check(model).error == 0.0


def test_replay_reproduces_a_synced_step_and_reads_its_dependencies() -> None:
    model = model_of(synced_step())
    assert replay(model).window_us == 200.0
    matmul, relu = model.ops
    assert (matmul.latency_us, relu.latency_us, relu.gap_us) == (10.0, 10.0, 0.0)  # relu waited for the stream
    waits = [it for it in model.items if it.kind == "wait"]
    assert len(waits) == 1 and waits[0].after_us == 10.0 and waits[0].streams == (7,)
    assert replay(model).gpu_end_us == 130.0


def test_forward_and_backward_inside_a_closure_are_forward_and_backward() -> None:
    """``optimizer.step(closure)`` (Lightning, LBFGS): the innermost phase launches, as in the
    breakdown, so that bf16 casts and compiled pieces find the forward."""
    b = TraceBuilder()
    b.step(1, 0, 200)
    b.optimizer(0, 200, name="SGD")
    b.op("aten::linear", 10, 40, forward=True)
    b.kernel(FP32_GEMM, 30, 20, launch_ts=20)
    b.backward_op(60, 40)
    b.kernel(ELEMENTWISE, 80, 10, launch_ts=70, tid=2)
    b.kernel(ELEMENTWISE, 160, 10, launch_ts=150)
    model = model_of(b)
    assert [op.phase for op in model.ops] == ["forward", "backward", "optimizer"]
    assert replay(model).window_us == 200.0


def test_a_gpu_that_runs_behind_makes_the_host_wait_longer_at_the_sync() -> None:
    model = model_of(synced_step())
    slower = model.with_ops([dataclasses.replace(model.ops[0], duration_us=150.0), model.ops[1]])
    # the matmul ends at 170, the relu at 180, the sync returns at 190, 60 µs of host code follow
    assert replay(slower).window_us == 250.0


# --- each transformation on a hand-written trace ----------------------------------------------------


def test_tf32_speeds_the_matmul_but_the_host_is_the_critical_path() -> None:
    model = model_of(synced_step())
    # the matmul ends at 33.5; the relu starts 10 µs after its launch (55-65); the sync returns
    # at 110 + 10, then 60 µs of host code
    assert replay(tf32(model, {})).window_us == pytest.approx(180.0)


def test_bf16_adds_a_cast_kernel_and_its_launch() -> None:
    model = model_of(synced_step())
    changed = autocast_bf16(model, {})
    assert [op.name for op in changed.ops][-1] == "autocast cast"
    assert len(changed.items) == len(model.items) + 1
    assert changed.ops[1].duration_us == 5.0  # the relu moves bf16: half the bytes, half the time
    # host: +1 µs for the cast's launch; the relu then starts at 56 and ends at 66, the sync
    # returns at 121, 60 µs later the step ends
    assert replay(changed).window_us == pytest.approx(181.0)


def test_bf16_halves_memory_bound_kernels_but_not_those_autocast_keeps_in_fp32() -> None:
    b = TraceBuilder()
    b.step(1, 0, 300)
    b.op("aten::linear", 0, 300, forward=True)
    b.kernel(FP32_GEMM, 20, 100, launch_ts=10)
    b.kernel(ELEMENTWISE, 120, 40, launch_ts=20)
    b.kernel(
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>", 160, 40, launch_ts=30
    )
    b.kernel(
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >",
        200,
        40,
        launch_ts=40,
    )
    model = model_of(b)
    changed = autocast_bf16(model, {})
    assert [op.duration_us for op in changed.ops[1:4]] == [20.0, 40.0, 40.0]
    # the GPU: the cast (the median memory-bound kernel, 40 µs) launched at 10 runs 20-60, the
    # matmul right after for 100 / 14.77 µs, then 20 + 40 + 40
    assert replay(changed).gpu_end_us == pytest.approx(60 + 100 / (989.4 / 67) + 100)


def test_an_op_launched_onto_a_busy_stream_waits_for_the_gpu_not_its_launch() -> None:
    """The host queued the elementwise kernel long before it ran; it started 10 µs after the
    matmul: a gap the GPU set. Faster matmuls bring it forward."""
    b = TraceBuilder()
    b.step(1, 0, 320)
    b.op("aten::linear", 0, 50, forward=True)
    b.kernel(FP32_GEMM, 20, 280, launch_ts=10)
    b.kernel(ELEMENTWISE, 310, 10, launch_ts=20)
    model = model_of(b)
    assert replay(model).gpu_end_us == 320.0
    assert (model.ops[1].latency_us, model.ops[1].gap_us) == (10.0, 10.0)
    assert replay(tf32(model, {})).gpu_end_us == pytest.approx(20 + 280 / (494.7 / 67) + 10 + 10)


def test_removing_the_sync_lets_the_host_go_on() -> None:
    model = model_of(synced_step())
    assert replay(remove_syncs(model, {})).window_us == 170.0


def long_forward_step() -> TraceBuilder:
    """A 1000 µs forward that launches two matmuls (at 100 and 900 µs, 10 µs after each its
    kernel starts), then 200 µs of other host code. 1200 µs."""
    b = TraceBuilder()
    b.step(1, 0, 1200)
    b.op("aten::linear", 0, 1000, forward=True)
    b.kernel(FP32_GEMM, 110, 50, launch_ts=100)
    b.kernel(FP32_GEMM, 910, 10, launch_ts=900)
    return b


def test_compile_shrinks_the_forward_host_code_to_its_launches_and_one_call() -> None:
    model = model_of(long_forward_step())
    assert replay(model).window_us == 1200.0
    # the forward's 1000 µs become its two 1 µs launches and one compiled call
    # (COMPILED_CALL_HOST_US = 176 µs): 178 µs, then the 200 µs of other code
    assert replay(compile_model(model, {})).window_us == pytest.approx(378.0)
    # CUDA graphs: one graph launch (1 µs) and the call with cudagraph trees' checks and the
    # graph launch (176 + 169 µs)
    assert replay(cuda_graphs(model, {})).window_us == pytest.approx(546.0)
    # on a host whose profiled code ran twice as slow as without the profiler (host_scale 0.5),
    # the traced code halves but the call does not: it was measured without the profiler
    # (600 µs -> 176 µs of call, two launches of 0.5 µs, 100 µs of other code)
    p = predict(model, replay_check(model), "compile", {}, host_scale=0.5)
    assert p.speedup == pytest.approx(600.0 / 277.0)


def test_fuse_false_leaves_a_run_of_pointwise_kernels_unfused() -> None:
    """compile_model's ``fuse``: a run of pointwise kernels of the forward becomes one (as long
    as the longest) only where it is set; graphs_of_compiled (a model compiled already) sets it
    off. (An inner function named ``fuse`` once hid the flag, and every run was fused.)"""
    b = TraceBuilder()
    b.step(1, 0, 1200)
    b.op("aten::linear", 0, 1000, forward=True)
    b.kernel(ELEMENTWISE, 110, 30, launch_ts=100)
    b.kernel(ELEMENTWISE, 910, 10, launch_ts=900)
    model = model_of(b)
    assert [op.duration_us for op in model.ops] == [30.0, 10.0]
    assert [op.duration_us for op in compile_model(model, {}).ops] == [30.0]
    assert [op.duration_us for op in compile_model(model, {}, fuse=False).ops] == [30.0, 10.0]
    assert [op.duration_us for op in graphs_of_compiled(model, {}).ops] == [30.0, 10.0]


def test_compile_leaves_a_small_piece_its_eager_cost() -> None:
    model = model_of(synced_step())
    # 60 µs of forward host code with two launches: one compiled call (176 µs) would cost more
    assert replay(compile_model(model, {})).window_us == 200.0
    # left eager, it launches its kernels as before, with their launch latency
    assert [op.latency_us for op in cuda_graphs(model, {}).ops] == [op.latency_us for op in model.ops]
    # judged at the steady host's pace: on a host whose profiled code ran 4x slow (host_scale
    # 0.25) its 60 µs are 15, and the call (176 µs, measured without the profiler) costs more still
    assert compile_model(model, {}, host_scale=0.25).items == model.items


def test_a_compiled_backward_keeps_the_engines_accumulate_grad_nodes() -> None:
    """One parameter tensor's AccumulateGrad node per step runs outside any compiled graph: a
    CUDA-graphed backward still pays for them (on the H200 they were most of what it cost)."""
    b = TraceBuilder()
    b.step(1, 0, 1500)
    b.op("aten::linear", 0, 400, forward=True)
    b.kernel(FP32_GEMM, 110, 50, launch_ts=100)
    b.backward_op(400, 800)  # the matmul's node on the autograd thread
    b.kernel(FP32_GEMM, 520, 50, launch_ts=500, tid=2)
    for i in range(4):  # four parameter tensors, 50 µs each
        b.backward_op(1200 + 50 * i, 50, name="torch::autograd::AccumulateGrad")
    timeline = build_timeline(b.to_dict())
    assert timeline.accumulate_grad_ops == [(1200.0, 1250.0), (1250.0, 1300.0), (1300.0, 1350.0), (1350.0, 1400.0)]
    model = model_of(b)
    assert (model.accumulate_grad_us, replay(model).window_us) == (200.0, 1500.0)
    # forward: one launch and the compiled call (1 + 176 µs); backward: one launch and the four
    # nodes (1 + 200 µs); then 100 µs of other code
    assert replay(compile_model(model, {})).window_us == pytest.approx(177.0 + 201.0 + 100.0)
    # CUDA graphs: each call also pays cudagraph trees' checks and the graph launch (169 µs) and
    # 2.3 µs for each of the four parameter tensors it takes (9.2 µs)
    graph = 169.0 + 4 * 2.3
    assert replay(cuda_graphs(model, {})).window_us == pytest.approx(177.0 + graph + 201.0 + graph + 100.0)
    # a model compiled already: nothing more fuses, each call becomes a graph replay
    assert replay(graphs_of_compiled(model, {})).window_us == pytest.approx(177.0 + graph + 201.0 + graph + 100.0)
    # the parameter tensors a run record counted take precedence over the trace's nodes: with 100,
    # a graphed forward (176 + 169 + 230 µs) costs more than the eager one (400 µs), which stays;
    # the backward (1,000 µs eager) becomes its launch, the nodes and its replay (201 + 399 µs)
    assert replay(cuda_graphs(model, {"optimizer.param_tensors": 100})).window_us == pytest.approx(
        400.0 + 201.0 + 399.0 + 100.0
    )


def test_a_compiled_backward_keeps_the_engines_time_around_each_node() -> None:
    """The autograd engine spends time between two nodes outside either's span (4-6 µs a node on
    the H200, eager and CUDA-graphed alike: examples/launch_bound.py): the nodes that stay outside
    a compiled backward keep theirs (launch_bound's LAUNCH001 predicted 4.95x without it, 2.63x
    with it and the graph's per-tensor checks; measured 2.90x and 2.44x)."""
    b = TraceBuilder()
    b.step(1, 0, 1500)
    b.op("aten::linear", 0, 400, forward=True)
    b.kernel(FP32_GEMM, 110, 50, launch_ts=100)
    b.backward_op(400, 795)
    b.kernel(FP32_GEMM, 520, 50, launch_ts=500, tid=2)
    for i in range(4):  # four nodes of 45 µs, each 5 µs after the one before
        b.backward_op(1200 + 50 * i, 45, name="torch::autograd::AccumulateGrad")
    model = model_of(b)
    assert (model.accumulate_grad_nodes, model.engine_gap_us) == (4, 5.0)
    # backward keeps one launch (1 µs) and four nodes of 45 + 5 µs; then 105 µs of other code
    assert replay(compile_model(model, {})).window_us == pytest.approx(177.0 + 201.0 + 105.0)


def checked_layers(sync: bool, layers: int = 10) -> TraceBuilder:
    """A forward of ``layers`` layers of 100 µs, each launching a 10 µs matmul 10 µs in; with
    ``sync`` each layer ends checking its output on the host (``if not isfinite(x).all():``):
    a 10 µs sync at 85 µs (the GPU is long done). 100 µs of other host code follow."""
    b = TraceBuilder()
    b.step(1, 0, layers * 100 + 100)
    for i in range(layers):
        t = i * 100
        b.op("aten::linear", t, 100, forward=True)
        b.kernel(FP32_GEMM, t + 20, 10, launch_ts=t + 10)
        if sync:
            b.sync(t + 85, 10)
    return b


def test_a_sync_in_the_forward_breaks_the_compiled_graph_at_each_site() -> None:
    unchecked = model_of(checked_layers(sync=False))
    assert replay(unchecked).window_us == 1100.0
    # one graph: the forward's 1000 µs become one call (176 µs: the guards, first) and ten 1 µs
    # launches, 286 µs of host with the other code; the ten 10 µs matmuls, launched together,
    # then run one after another (10 µs after the first launch, 5 µs apart): the GPU ends at 331.1
    compiled = replay(compile_model(unchecked, {}))
    assert (compiled.host_end_us, compiled.window_us) == (pytest.approx(286.0), pytest.approx(186.1 + 10 * 10 + 9 * 5))
    checked = model_of(checked_layers(sync=True))
    assert len(graph_breaks(checked)) == 10
    assert replay(checked).window_us == 1100.0
    # ten breaks make eleven pieces (ten layers' 90 µs of host code, then the last 5 µs after the
    # last sync), 900 µs in all; each becomes a compiled call (176 µs) then its launch (1 µs;
    # the last has none), more than its few eager launches cost: the syncs stay, the step grows.
    # Each sync now waits for its layer's matmul, launched after the call (10 µs latency, 10 µs
    # long): about 19 µs a layer more than the bare calls and launches
    assert replay(compile_model(checked, {})).window_us == pytest.approx(
        200.0 + 10 * 177.0 + 176.0 + 191.6176, abs=1e-3
    )
    # CUDA graphs: each call also pays cudagraph trees' checks and the graph launch (169 µs)
    assert replay(cuda_graphs(checked, {})).window_us == pytest.approx(200.0 + 10 * 346.0 + 345.0 + 91.6176, abs=1e-3)
    assert predict(checked, replay_check(checked), "cuda_graphs", {}).speedup == pytest.approx(
        1100.0 / 4096.6176, abs=1e-6
    )
    # each piece is a graph of its own, its kernels run without launch latency
    assert {op.latency_us for op in cuda_graphs(checked, {}).ops} == {0.0}
    assert {op.latency_us for op in cuda_graphs(unchecked, {}).ops} == {0.0}


#: symptoms of ``checked_layers(sync=True)``'s window under which SYNC001 and LAUNCH001 both fire
SYNCED_LAYERS_VALUES = {
    "sync.per_step": 10,
    "sync.cost_share": 0.3,
    "sync.blocked_share": 0.1,
    "sync.idle_after_share": 0.2,
    "exposed.launch_model": 0.8,
    "gpu.busy": 0.1,
    "exposed.data_wait": 0.0,
    "gpu.kernels_per_step": 60,
    "gpu.present": 1,
    "model.compiled": 0,
}


def test_removing_the_syncs_ranks_above_compiling_a_forward_they_break() -> None:
    rules = {r.id: r for r in load_rules()}
    model = model_of(checked_layers(sync=True))
    values = dict(SYNCED_LAYERS_VALUES)
    symptoms = symptoms_from_values(values)
    assert rules["SYNC001"].fires(values) and rules["LAUNCH001"].fires(values)
    diagnosis = diagnose_symptoms(
        [rules["LAUNCH001"], rules["SYNC001"]], symptoms, Predictor(model, replay_check(model), 1.0, spread=0.01)
    )
    assert [f.rule_id for f in diagnosis.findings] == ["SYNC001"]
    assert diagnosis.considered == ["considered LAUNCH001: predicted 0.27x, slower than the step as it is"]


def loader_steps() -> TraceBuilder:
    """Two steps of 150 µs: a 100 µs single-process fetch, then 50 µs of forward with a kernel."""
    b = TraceBuilder()
    for start in (0, 150):
        b.step(start // 150, start, 150)
        b.data_wait(start, 100)
        b.op("aten::linear", start + 100, 50, forward=True)
        b.kernel(ELEMENTWISE, start + 120, 10, launch_ts=start + 110)
    return b


def test_more_workers_deliver_batches_at_their_measured_rate() -> None:
    model = model_of(loader_steps())
    assert replay(model).window_us == 300.0
    facts = {"dataloader.num_workers": 0, "cpu.count": 8}
    # one batch takes 100 µs of one core; 4 workers deliver one every 25 µs: the host no longer waits
    assert replay(more_workers(model, facts, num_workers=4)).window_us == 100.0
    # on 2 CPUs only one worker fits (one core stays with the main process): batches every 100 µs,
    # and in the steady state every step waits for its batch, the window's first one too (ready
    # 100 - 50 µs after the window starts): two steps of 100 µs
    assert replay(more_workers(model, {**facts, "cpu.count": 2}, num_workers=4)).window_us == 200.0


def test_a_single_process_loaders_fetches_are_host_code_that_the_profiler_slows() -> None:
    """Without workers the data waits are the main thread's own loading, traced like the model's
    code: scaling the host to the steady step scales them too (100 -> 50 µs a fetch, the forward's
    50 -> 25), and the profiler's per-event cost is taken out of them as well."""
    model = model_of(loader_steps())
    traced = dataclasses.replace(model, traced_fetches=True)
    assert replay(model, 0.5).window_us == 2 * (100 + 25)
    assert replay(traced, 0.5).window_us == 2 * (50 + 25)
    assert replay(traced).window_us == replay(model).window_us == 300.0
    assert profiler_scale(traced) > profiler_scale(model)  # the same events' cost over more traced time


def test_a_recorded_single_process_loader_is_predicted_at_the_pace_of_the_main_process_receiving() -> None:
    """data_bound (num_workers=0, 77 MB batches, H200): its fetches scale with the host to the
    steady step, and 15 workers are predicted no faster than the main process can take their
    batches (the tabled cost: the fixture's run had no probe). 5.77x replayed; measured 5.76x to
    7.78x on H100 and H200 hosts (docs/truth.md)."""
    report = analyze_run(RunDir(DATA / "data_bound"), AnalysisOptions.load())
    top = report.findings[0]
    assert top["rule"] == "DATA001" and report.replay is not None
    assert report.replay["host_code_scale"] > 0
    steady_ms = report.throughput["steady"]["mean_step_ms"]
    batch_mb = report.symptoms["h2d.bytes_per_step"]["value"] / 1e6
    assert 1.15 < top["predicted_speedup"] <= steady_ms / (batch_mb * LOADER_RECEIVE_MS_PER_MB)


@pytest.mark.parametrize(
    ("trace", "traced"), [("data_bound", True), ("pageable_copies", False), ("fp32_transformer", False)]
)
def test_a_trace_alone_says_whether_the_main_thread_loads(trace: str, traced: bool) -> None:
    """Without a run record, the DataLoader iterator the trace names decides: the single-process
    one (data_bound) makes the data waits traced code; workers (pageable_copies) or no DataLoader
    at all do not."""
    from diagnose.analysis.pipeline import make_predictor

    timeline = load_timeline(DATA / "bare" / f"{trace}.pt.trace.json.gz")
    model = build_model(timeline)
    assert model is not None
    predictor = make_predictor(model, None, timeline.dataloader_kinds)
    assert predictor.model.traced_fetches is traced


def loader_copy_steps() -> TraceBuilder:
    """Two steps of 150 µs: a 100 µs single-process fetch, a pinned copy of 1 MB to the GPU (the
    batch), then 45 µs of forward with a kernel."""
    b = TraceBuilder()
    for start in (0, 150):
        b.step(start // 150, start, 150)
        b.data_wait(start, 100)
        b.op("aten::to", start + 100, 5)
        b.memcpy("Memcpy HtoD (Pinned -> Device)", start + 102, 3, 1_000_000, launch_ts=start + 101, launch_dur=2)
        b.op("aten::linear", start + 105, 45, forward=True)
        b.kernel(ELEMENTWISE, start + 120, 10, launch_ts=start + 110)
    return b


def test_more_workers_are_bounded_by_the_main_process_receiving_each_batch() -> None:
    """Workers deliver a batch every 25 µs, but the main process spends R receiving each 1 MB
    batch from shared memory: the run's measured 0.08 ms per MB (as paid while the workers load:
    LOADER_RECEIVE_CONTENTION times the idle probe's) plus the tabled cost of a batch beyond its
    bytes. Pinned: the pin thread takes one batch per R, beside the main thread: two
    steps of R. Not pinned: the main thread pays R itself at each fetch, before its 50 µs of work."""
    model = model_of(loader_copy_steps())
    assert replay(model).window_us == 300.0
    facts = {"dataloader.num_workers": 0, "cpu.count": 8, "host.loader_receive_ms_per_mb": 0.08}
    receive = 80.0 * LOADER_RECEIVE_CONTENTION + LOADER_RECEIVE_BATCH_MS * 1e3
    assert replay(more_workers(model, facts, num_workers=4, pin_memory=1)).window_us == pytest.approx(2 * receive)
    assert replay(more_workers(model, facts, num_workers=4, pin_memory=0)).window_us == pytest.approx(
        2 * (receive + 50.0)
    )
    # where pin_memory is not given, the loader's own setting; without a measured cost, the tabled
    # one (its bytes only: the tabled rate was measured on whole batches)
    assert replay(more_workers(model, {**facts, "dataloader.pin_memory": 1}, num_workers=4)).window_us == pytest.approx(
        2 * receive
    )
    tabled = LOADER_RECEIVE_MS_PER_MB * 1e3  # µs for the 1 MB batch
    unmeasured = {k: v for k, v in facts.items() if k != "host.loader_receive_ms_per_mb"}
    assert replay(more_workers(model, unmeasured, num_workers=4, pin_memory=1)).window_us == pytest.approx(2 * tabled)
    # a loader that already has workers: taking a batch costs what the trace shows (its smallest
    # fetch, 100 µs here), the receiving included; nothing is added to it
    assert (
        replay(
            more_workers(
                model,
                {**facts, "dataloader.num_workers": 1, "workers.cpu_per_batch_ms": 0.1},
                num_workers=4,
                pin_memory=1,
            )
        ).window_us
        == 300.0
    )


def pageable_step() -> TraceBuilder:
    b = TraceBuilder()
    b.step(1, 0, 250)
    b.op("aten::to", 0, 200)
    b.memcpy("Memcpy HtoD (Pageable -> Device)", 20, 160, 1 << 20, launch_ts=10, launch_dur=180)  # blocks the host
    b.sync(190, 5)  # the copy's own staging sync
    b.op("aten::linear", 205, 10, forward=True)
    b.kernel(ELEMENTWISE, 215, 10, launch_ts=210, tid=1)
    return b


def test_pinned_copies_run_at_the_link_rate_and_stop_blocking() -> None:
    model = model_of(pageable_step())
    assert replay(model).window_us == 250.0
    assert [it.blocking for it in model.items if it.kind == "launch"] == [True, False]
    changed = pinned_copies(model, {})
    # 1 MiB at the H200's tabled 63 GB/s: 16.64 µs; the host pays the trace's 1 µs launch instead
    # of the blocking 180 µs call, and no staging sync: 10 + 1 + 15 + 1 + 39 = 66 µs
    assert replay(changed).window_us == 66.0
    assert changed.ops[0].duration_us == pytest.approx((1 << 20) / 63e3)


def optimizer_step() -> TraceBuilder:
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.op("aten::linear", 0, 10, forward=True)
    b.kernel(FP32_GEMM, 5, 10, launch_ts=2)
    b.optimizer(20, 60)
    for i, launch in enumerate((25, 35, 45, 55)):  # two tensors, two per-tensor kernels each
        b.kernel(ELEMENTWISE, 30 + 10 * i, 5, launch_ts=launch)
    return b


def test_fused_optimizer_collapses_the_per_tensor_loop() -> None:
    model = model_of(optimizer_step())
    assert replay(model).window_us == 100.0
    changed = fused_optimizer(model, {"optimizer.param_tensors": 2})
    fused = [op for op in changed.ops if op.phase == "optimizer"]
    assert len(fused) == 1 and fused[0].duration_us == 20.0
    # the optimizer's 60 µs of host code become one launch at the forward's host cost per
    # launch (10 µs); 20 µs of other code follow: 10 + 10 + 10 + 20
    assert replay(changed).window_us == 50.0


def test_a_larger_batch_grows_weight_bound_matmuls_only_once_their_flops_catch_up() -> None:
    model = model_of(synced_step())
    plain = larger_batch(model, {}, factor=4)
    weight_bound = larger_batch(model, {}, factor=4, matmul_roof_share=0.5)
    # 4x the rows: each kernel keeps the 3 µs no batch changes (its floor: the window's shortest
    # kernels, at most KERNEL_FLOOR_MAX_US) and the rest grows; the relu's 10 µs -> 3 + 7 x 4
    # either way; the matmul's rest grows 4x when its time is its FLOPs, but 4 x 0.5 = 2x when
    # it runs at half the peak its shape allows (its weight reads are paid once)
    assert kernel_floor_us(model) == KERNEL_FLOOR_MAX_US == 3.0
    assert [op.duration_us for op in plain.ops] == [3 + 97 * 4, 3 + 7 * 4]
    assert [op.duration_us for op in weight_bound.ops] == [3 + 97 * 2, 3 + 7 * 4]
    # the matmul sits on the path to the sync: 194 µs less GPU time, 194 µs shorter step
    assert (replay(plain).window_us, replay(weight_bound).window_us) == (512.0, 318.0)
    check = replay_check(model)
    speedup = predict(model, check, "larger_batch", {}, {"factor": 4, "matmul_roof_share": 0.5}).speedup
    assert speedup == pytest.approx(200.0 / 318.0 * 4)


def tiny_kernels_step() -> TraceBuilder:
    """One 100 µs step: a 1 µs fetch from idle workers, a 4 KB pinned copy (3 µs) and twenty 2 µs
    elementwise kernels, each launched 4 µs after the last: the host sets the pace."""
    b = TraceBuilder()
    b.step(0, 0, 100)
    b.data_wait(0, 1)
    b.op("aten::to", 1, 4)
    b.memcpy("Memcpy HtoD (Pinned -> Device)", 3, 3, 4096, launch_ts=2, launch_dur=2)
    b.op("aten::gelu", 5, 95, forward=True)
    for i in range(20):
        b.kernel(ELEMENTWISE, 10 + 4 * i, 2, launch_ts=6 + 4 * i)
    return b


def test_a_larger_batch_keeps_each_kernels_floor_and_idle_workers_keep_up() -> None:
    """32x the batch: each 2 µs kernel keeps its floor (2 µs, the window's shortest) and grows
    nothing; the 4 KB copy grows by 31 x 4 KB at the link's tabled 63 GB/s (Hopper, PCIe 5);
    workers busy 1% of the time would be busy 32%: the fetch stays 1 µs. The step stays host
    bound at 100 µs: 32x the samples per second."""
    model = model_of(tiny_kernels_step())
    facts = {"dataloader.num_workers": 4, "workers.busy": 0.01}
    bigger = larger_batch(model, facts, factor=32)
    assert kernel_floor_us(model) == 2.0
    assert [op.duration_us for op in bigger.ops if op.kind == "kernel"] == [2.0] * 20
    (copy,) = [op for op in bigger.ops if op.kind == "memcpy"]
    assert copy.duration_us == pytest.approx(3 + 31 * 4096 / 63e3)
    assert [it.duration_us for it in bigger.items if it.fetch is not None] == [1.0]
    assert replay(bigger).window_us == replay(model).window_us
    # workers busy 5% would be busy all the time at 32x: the wait grows with the batch
    busy = larger_batch(model, {**facts, "workers.busy": 0.05}, factor=32)
    assert [it.duration_us for it in busy.items if it.fetch is not None] == [32.0]


def hand_built_steps(copy: bool = True) -> TraceBuilder:
    """Two 100 µs steps of a script that builds its batch itself (no DataLoader): a 4 KB pinned
    copy launched 2 µs in, then 90 µs of forward with one 10 µs kernel. The host sets the pace."""
    b = TraceBuilder()
    for start in (0, 100):
        b.step(start // 100, start, 100)
        b.op("aten::to", start + 1, 4)
        if copy:
            b.memcpy("Memcpy HtoD (Pinned -> Device)", start + 3, 3, 4096, launch_ts=start + 2, launch_dur=2)
        b.op("aten::linear", start + 5, 90, forward=True)
        b.kernel(ELEMENTWISE, start + 20, 10, launch_ts=start + 10)
    return b


def test_a_batch_built_by_hand_grows_its_building_with_the_batch() -> None:
    """A tenth of each step builds the batch a sample at a time (``host.batch_build_share``):
    at 4x the batch it takes 4x as long, 30 µs more each step, added before the step's copy to
    the GPU. The host still sets the pace, so each step is 30 µs longer than the larger batch
    without it: 4x the samples in 1.3x the time. Without a copy from the host nothing is added
    (the batch is sliced on the GPU), nor without the share."""
    model = model_of(hand_built_steps())
    without = larger_batch(model, {}, factor=4)
    bigger = larger_batch(model, {"host.batch_build_share": 0.1}, factor=4)
    added = [it for it in bigger.items if it.kind == "work" and it not in without.items]
    assert [it.duration_us for it in added] == [30.0, 30.0]
    assert replay(bigger).window_us == pytest.approx(replay(without).window_us + 60.0)
    assert replay(without).window_us == pytest.approx(200.0, abs=1.0)
    assert predict(
        model, replay_check(model), "larger_batch", {"host.batch_build_share": 0.1}, {"factor": 4}
    ).speedup == (pytest.approx(4 * replay(model).window_us / replay(bigger).window_us))
    sliced = model_of(hand_built_steps(copy=False))
    assert grow_batch_building(sliced, 0.1, 4) is sliced
    assert grow_batch_building(model, None, 4) is model and grow_batch_building(model, 0.1, 1) is model


def test_a_batch_from_the_scripts_own_producers_comes_no_faster_per_sample() -> None:
    """The main thread waited a quarter of its samples on a queue its own producers fill
    (``host.queue_wait_share``): they deliver a batch a step. At 4x the batch they take 4x as
    long, so each step takes four of now (a wait added before its copy to the GPU): 4x the samples
    in 4x the time, 1.00x. Below the least share that says they pace, or at a batch no larger,
    the larger batch is predicted as before."""
    model = model_of(hand_built_steps())
    without = larger_batch(model, {}, factor=4)
    paced = larger_batch(model, {"host.queue_wait_share": 0.25}, factor=4)
    assert replay(without).window_us < 2 * replay(model).window_us  # the host's 100 µs steps barely grow
    assert replay(paced).window_us == pytest.approx(4 * replay(model).window_us)
    added = [it for it in paced.items if it not in without.items]
    assert [it.phase for it in added] == ["data_wait", "data_wait"]
    assert predict(
        model, replay_check(model), "larger_batch", {"host.queue_wait_share": 0.25}, {"factor": 4}
    ).speedup == pytest.approx(1.0)
    assert larger_batch(model, {"host.queue_wait_share": QUEUE_PACED_MIN_SHARE / 2}, factor=4) == without
    assert paced_by_own_producers(model, model, 0.25, 1.0) is model


def test_a_few_waits_on_the_scripts_own_producers_make_a_larger_batch_a_guess_reaching_down_to_paced() -> None:
    """The main thread waited on its own producers' queue in 2% of its samples: under the share
    that says they pace, the larger batch is predicted as before, but the prediction is weak (so
    ``diagnose run`` measures it) and its interval reaches down to the batch as the producers
    would pace it, 1.00x. Without a wait, neither."""
    model = model_of(hand_built_steps())
    check = replay_check(model)
    free = predict(model, check, "larger_batch", {"host.queue_wait_share": 0.0}, {"factor": 4})
    some = predict(model, check, "larger_batch", {"host.queue_wait_share": 0.02}, {"factor": 4})
    assert some.speedup == pytest.approx(free.speedup) and free.speedup > 2
    assert free.weak is None and free.floor is None
    assert some.weak is not None and "2.0% of its samples" in some.weak
    assert some.floor == pytest.approx(1.0)


def test_a_sampled_building_share_widens_the_prediction_by_its_counting_error() -> None:
    """The share of the step that builds the batch is read off the line sampler: 10% of 100
    samples is 10% +- 1.645 * 3% at the interval's edges (5.07% .. 14.93%). The larger batch is
    predicted again at both edges; the interval reaches down to the larger share's figure and up to
    the smaller's, and the note says so. Without the count, nothing is widened."""
    model = model_of(hand_built_steps())
    facts = {"host.batch_build_share": 0.1, "host.samples": 100.0}
    low_share, high_share = counted_share_edges(facts)
    assert low_share == pytest.approx(0.05065)  # Z_INTERVAL 1.645
    assert high_share == pytest.approx(0.14935)

    def at(share: float) -> float:
        speedup = predict(
            model, replay_check(model), "larger_batch", {"host.batch_build_share": share}, {"factor": 4}
        ).speedup
        assert speedup is not None
        return speedup

    p = predict(model, replay_check(model), "larger_batch", facts, {"factor": 4})
    assert p.speedup == pytest.approx(at(0.1))
    assert p.floor == pytest.approx(at(high_share)) and p.floor < p.speedup
    assert p.reach == pytest.approx(at(low_share)) and p.reach > p.speedup
    assert "of 100 samples" in p.note
    uncounted = predict(model, replay_check(model), "larger_batch", {"host.batch_build_share": 0.1}, {"factor": 4})
    assert (uncounted.floor, uncounted.reach) == (None, None)
    assert counted_share_edges({"host.batch_build_share": 0.1}) is None
    # 100 samples: both edges within the transformation's own 19%, the interval as it was
    assert downside_error("larger_batch", weak=False, floor=p.floor, speedup=p.speedup) is None
    # 10 samples: 0% .. 25.6% of the step; the lower edge reaches the larger share's figure
    few = predict(model, replay_check(model), "larger_batch", {**facts, "host.samples": 10.0}, {"factor": 4})
    assert few.floor == pytest.approx(at(0.1 + 1.645 * math.sqrt(0.09 / 10)))
    assert downside_error("larger_batch", weak=False, floor=few.floor, speedup=few.speedup) == pytest.approx(
        few.speedup / few.floor - 1
    )
    assert few.speedup / few.floor - 1 > 0.19


def worker_steps() -> TraceBuilder:
    """Two steps of 100 µs: a 2 µs fetch of a batch the workers had ready, then 98 µs of forward
    with one 10 µs kernel."""
    b = TraceBuilder()
    for start in (0, 100):
        b.step(start // 100, start, 100)
        b.data_wait(start, 2)
        b.op("aten::linear", start + 2, 98, forward=True)
        b.kernel(ELEMENTWISE, start + 20, 10, launch_ts=start + 10)
    return b


def test_a_larger_batch_is_loaded_at_the_workers_measured_cpu_per_sample() -> None:
    """Two workers, 100 µs of CPU per batch: one batch every 50 µs, ahead of the 100 µs step.
    At 4x the batch a batch costs 400 µs of CPU, one every 200 µs: the loader sets the pace.
    Taking a ready batch costs 4x its 2 µs (8 µs, inside the wait: it ends when the batch is
    ready); the kernel keeps its floor (the window's shortest: it grows nothing). With every
    batch at hand a step's work is 8 + 98 = 106 µs, so the first batch is ready 200 - 106 = 94 µs
    in and the second 200 µs later: the steps end at 94 + 98 = 192 and 294 + 98 = 392 µs, 4x the
    samples in 1.96x the time. Workers twice as fast (50 µs a batch, one every 100 µs at 4x)
    keep up: 2 x 106 µs."""
    model = model_of(worker_steps())
    assert replay(model).window_us == 200.0
    facts = {"dataloader.num_workers": 2, "workers.cpu_per_batch_ms": 0.1, "cpu.count": 8}
    bigger = larger_batch(model, facts, factor=4)
    assert replay(bigger).window_us == pytest.approx(392.0)
    assert predict(model, replay_check(model), "larger_batch", facts, {"factor": 4}).speedup == pytest.approx(
        4 * 200 / 392
    )
    faster = larger_batch(model, {**facts, "workers.cpu_per_batch_ms": 0.05}, factor=4)
    assert replay(faster).window_us == pytest.approx(212.0)
    # on 2 CPUs one worker builds at a time (one core stays with the main process): one every
    # 400 µs, the first ready at 400 - 106 = 294 µs: steps end at 392 and 792 µs
    one_core = larger_batch(model, {**facts, "cpu.count": 2}, factor=4)
    assert replay(one_core).window_us == pytest.approx(792.0)
    # measured, the prediction stands; with workers whose CPU per batch is unknown it is a guess
    assert predict(model, replay_check(model), "larger_batch", facts, {"factor": 4}).weak is None
    unknown = {"dataloader.num_workers": 2, "workers.busy": 0.1}
    weak = predict(model, replay_check(model), "larger_batch", unknown, {"factor": 4}).weak
    assert weak is not None and weak.startswith("the DataLoader workers' CPU time per batch was not measured")
    assert (
        predict(model, replay_check(model), "larger_batch", {"dataloader.num_workers": 0}, {"factor": 4}).weak is None
    )
    # the workers' sampled stacks say they idle 99% of the time: they keep up (a CPU time per batch
    # holds what no batch size changes: it is not scaled), and the two disagree
    sampled = {**facts, "workers.busy": 0.01}
    assert replay(larger_batch(model, sampled, factor=4)).window_us == 200.0  # the fetch as it was
    weak_one = predict(model, replay_check(model), "larger_batch", sampled, {"factor": 4})
    # 4x the samples in the same 200 µs on the sampled share; paced by the CPU time, 392 µs: the
    # interval reaches down to that
    assert weak_one.speedup == pytest.approx(4.0) and weak_one.floor == pytest.approx(4 * 200 / 392)
    disagree = weak_one.weak
    assert disagree == (
        "the DataLoader workers' CPU time per batch (0.10 ms) and their sampled busy share (1%) "
        "disagree on whether they keep up with 4x the batch"
    )
    # both say the workers would be busy all the time: paced, and sure of it
    both = {**facts, "workers.busy": 0.3}
    assert replay(larger_batch(model, both, factor=4)).window_us == pytest.approx(392.0)
    assert predict(model, replay_check(model), "larger_batch", both, {"factor": 4}).weak is None


@dataclass
class CannotCase:
    name: str
    trace: TraceBuilder
    facts: dict[str, float]
    reason: str


@pytest.mark.parametrize(
    "case",
    [
        CannotCase("pinned_copies", synced_step(), {}, "no pageable host-to-device copy"),
        CannotCase("fused_optimizer", optimizer_step(), {}, "number of parameter tensors is unknown"),
        CannotCase("more_workers", synced_step(), {}, "no DataLoader fetch"),
        CannotCase("more_workers", loader_steps(), {"suggest.num_workers": 4}, "num_workers is unknown"),
        CannotCase("remove_syncs", loader_steps(), {}, "does not sync"),
        CannotCase("larger_batch", synced_step(), {}, "no larger batch"),
        CannotCase("no_such_change", synced_step(), {}, "no transformation called"),
    ],
    ids=lambda c: c.name,
)
def test_a_change_the_model_cannot_express_says_why(case: CannotCase) -> None:
    model = model_of(case.trace)
    p = predict(model, replay_check(model), case.name, case.facts)
    assert p.speedup is None and case.reason in p.note


def test_no_tabled_rate_for_an_unknown_gpu() -> None:
    b = synced_step()
    data = b.to_dict()
    data["deviceProperties"][0].update(name="Some GPU", computeMajor=7, computeMinor=5)
    model = build_model(build_timeline(data))
    assert model is not None
    p = predict(model, replay_check(model), "tf32", {})
    assert p.speedup is None and "no tabled Tensor Core rate" in p.note


def test_predict_reports_the_speedup_of_the_replayed_step() -> None:
    model = model_of(synced_step())
    p = predict(model, replay_check(model), "remove_syncs", {})
    assert p.speedup == pytest.approx(200 / 170)
    assert p.step_us == 170.0


def test_a_sync_returns_after_the_gpu_at_the_hosts_pace() -> None:
    """What a sync takes once the GPU is done is the runtime's host code (and the profiler's cost
    on it): it scales with the host, like the model code around it."""
    model = model_of(synced_step())
    # host code halved: the matmul's launch call (at 5) takes 0.5 µs instead of 1, so the matmul
    # starts 9.5 µs after it and ends at 114.5; the relu waits for it and ends at 124.5; the host
    # reaches the sync at 55 and leaves it at 124.5 + 10 / 2; then 60 / 2 µs
    assert replay(model, 0.5).window_us == 159.5


def test_the_part_of_a_launch_latency_inside_the_call_shrinks_with_the_host() -> None:
    """An op cannot start before its launch call hands it to the GPU, near the call's end: the
    part of its measured latency spent inside the call is host code (the profiler slows it like
    the rest), and at a faster host the op starts that much sooner. (examples/item_syncs.py on
    the H200: 256 reads a step, each waiting for a copy 5.7 µs after a 4.2 µs launch call;
    removing them was predicted 1.66x with the whole latency kept, 1.34x with this; measured
    1.12x.)"""
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.op("aten::item", 0, 100)
    b.kernel(ELEMENTWISE, 2, 1, launch_ts=0, stream=8)  # the value read back
    b.memcpy("Memcpy DtoH (Device -> Pageable)", 10, 2, 4, launch_ts=4, launch_dur=4)  # 6 µs after the call starts
    b.sync(8, 10)  # returns 6 µs after the copy ends at 12
    model = model_of(b)
    assert replay(model).window_us == 100.0
    copy = model.ops[1]
    assert copy.latency_us == 6.0
    # at a quarter of the host's pace the host reaches the copy's call at 1 (not 4) and the call
    # takes 1 µs (not 4): the copy starts 6 - 3 µs after the call starts, at 4, and ends at 6;
    # with the whole latency kept it would start at 7
    result = replay(model, 0.25)
    assert result.gpu_end_us == 6.0


def test_host_scale_matches_the_steady_step() -> None:
    model = model_of(synced_step())
    check = replay_check(model)
    # a trace alone: the profiler's own cost per recorded event (3.5 µs, the calibrated constant:
    # this trace has no no-work operators) is taken out of the 170 µs of model code, 6 events
    assert model.host_events == 6 and model.profiler_cost_us == 3.5
    assert host_code_scale(model, check, None) == pytest.approx((170 - 6 * 3.5) / 170)
    # the steady step is not faster (the GPU set it): the host shrinks the same way, but only as
    # far as the replayed step stays within 2% of the traced one
    slow = host_code_scale(model, check, 250.0)
    assert (170 - 6 * 3.5) / 170 < slow < 1.0
    assert replay(model, slow).window_us == pytest.approx(200.0 * 0.98, abs=0.05)
    scale = host_code_scale(model, check, 150.0)
    assert replay(model, scale).window_us == pytest.approx(150.0, abs=0.01)


def test_step_spread_ignores_outlying_steps() -> None:
    assert step_spread([100.0, 100.0, 100.0, 100.0, 200.0]) == 0.0
    assert step_spread([90.0, 110.0]) == pytest.approx(0.05)  # quartiles 95 and 105
    assert step_spread([100.0]) == 0.0


# --- findings: ranked by the prediction, left out under the spread ----------------------------------


def test_findings_rank_by_prediction_and_leave_out_what_cannot_be_told_from_noise() -> None:
    rules = {r.id: r for r in load_rules()}
    model = model_of(synced_step())
    # single steps spread by 90%, but the mean step is uncertain by 20%: the floor is the mean's
    predictor = Predictor(model, replay_check(model), 1.0, spread=0.9, mean_uncertainty=0.2)
    symptoms = symptoms_from_values(
        {"sync.per_step": 50, "sync.cost_share": 0.4, "exposed.sync": 0.3, "gpu.present": 1, "sync.blocked_share": 0.3}
    )
    assert rules["SYNC001"].fires(symptoms.values_by_name())
    diagnosis = diagnose_symptoms([rules["SYNC001"]], symptoms, predictor)
    # removing the sync replays to 1.18x: under the floor of hypot(20%, 4%) = 20.4%
    assert diagnosis.findings == []
    assert diagnosis.considered == [
        "considered SYNC001: predicted 1.18x, within the ±20% that the mean step's uncertainty (±20%) and a rerun (4%) leave"
    ]
    kept = diagnose_symptoms(
        [rules["SYNC001"]], symptoms, Predictor(model, replay_check(model), 1.0, spread=0.9, mean_uncertainty=0.01)
    )
    assert [f.predicted for f in kept.findings] == [pytest.approx(200 / 170)]
    assert kept.findings[0].to_dict()["predicted_speedup"] == round(200 / 170, 4)
    assert kept.replay is not None and kept.replay["within_tolerance"]
    # a bound under the replay (a sync cost share of 10%: 1.11x) leaves the prediction as it is
    low = symptoms_from_values(
        {"sync.per_step": 50, "sync.cost_share": 0.1, "exposed.sync": 0.3, "gpu.present": 1, "sync.blocked_share": 0.3}
    )
    above = diagnose_symptoms(
        [rules["SYNC001"]], low, Predictor(model, replay_check(model), 1.0, spread=0.01, mean_uncertainty=0.01)
    ).findings[0]
    assert (above.predicted, above.gain) == (pytest.approx(200 / 170), pytest.approx(1 / 0.9))
    assert "capped" not in above.prediction_note


def test_a_prediction_near_the_gain_a_change_must_beat_is_borderline_either_way() -> None:
    """The floor is estimated from one run's steps and a prediction near 1x is uncertain: within
    a factor 2 of the floor, a finding kept says it is borderline, and one left out is a near
    miss (examples/implicit_syncs.py on the H200: SYNC001 predicted 1.04-1.07x over five runs,
    left out in three, top finding in two, with nothing saying a rerun may differ)."""
    from diagnose.analysis.verdict import findings as F

    rules = {r.id: r for r in load_rules()}
    model = model_of(synced_step())  # SYNC001 replays to 200 / 170 = 1.18x
    symptoms = symptoms_from_values(
        {"sync.per_step": 50, "sync.cost_share": 0.4, "exposed.sync": 0.3, "gpu.present": 1, "sync.blocked_share": 0.3}
    )

    def run(uncertainty: float) -> Diagnosis:
        return diagnose_symptoms(
            [rules["SYNC001"]],
            symptoms,
            Predictor(model, replay_check(model), 1.0, spread=0.0, mean_uncertainty=uncertainty),
        )

    left_out = run(0.2)  # 0.18 of gain against a floor of 0.20: left out, but within a factor 2
    assert left_out.findings == [] and len(left_out.borderline) == 1
    assert (
        left_out.borderline[0].startswith("borderline: SYNC001")
        and "left out at a predicted 1.18x" in left_out.borderline[0]
    )
    kept = run(0.1)  # 0.18 against 0.10: kept, within a factor 2
    assert F.PREDICTED_EVIDENCE in kept.findings[0].borderline
    clear = run(0.01)  # 0.18 against the 4% a rerun moves the step: clear
    assert clear.findings[0].borderline == [] and clear.borderline == []


def test_the_floor_counts_what_a_rerun_moves_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """One run's steps can be steady while reruns differ (implicit_syncs: steps within 2%, runs
    14% apart): a predicted gain must also beat ``RUN_TO_RUN_SPREAD``."""
    from diagnose.analysis.verdict import findings as F

    rules = {r.id: r for r in load_rules()}
    model = model_of(synced_step())
    symptoms = symptoms_from_values(
        {"sync.per_step": 50, "sync.cost_share": 0.4, "exposed.sync": 0.3, "gpu.present": 1, "sync.blocked_share": 0.3}
    )
    from diagnose.analysis.prediction import uncertainty as U

    monkeypatch.setattr(F, "RUN_TO_RUN_SPREAD", 0.25)
    monkeypatch.setattr(U, "RUN_TO_RUN_SPREAD", 0.25)
    diagnosis = diagnose_symptoms(
        [rules["SYNC001"]], symptoms, Predictor(model, replay_check(model), 1.0, spread=0.01, mean_uncertainty=0.01)
    )
    assert diagnosis.findings == []
    assert diagnosis.considered == [
        "considered SYNC001: predicted 1.18x, within the ±25% that the mean step's uncertainty (±1%) and a rerun (25%) leave"
    ]


# --- the recorded GPU fixtures ----------------------------------------------------------------------

#: fixture -> the transformation of its planted fix (None: nothing planted, or no transformation)
PLANTED = {
    "data_bound": "more_workers",
    "pageable_copies": "pinned_copies",
    "fp32_transformer": "autocast_bf16",
    "launch_bound": "cuda_graphs",
    "item_syncs": "remove_syncs",
    "forloop_optimizer": "fused_optimizer",
    "cpu_preprocessing": None,
    "well_tuned": None,
}
UNRELATED = ("autocast_bf16", "tf32", "fused_optimizer", "more_workers", "pinned_copies", "remove_syncs")
#: changes that fix the same thing as the planted one (TF32 is the smaller step towards bf16)
SAME_FIX = {"autocast_bf16": {"tf32"}}
FIXTURE_TRACES = sorted(p for p in DATA.glob("*/*.pt.trace.json.gz"))


@pytest.mark.parametrize("trace", FIXTURE_TRACES, ids=lambda p: f"{p.parent.name}/{p.name[:6]}")
def test_the_replay_reproduces_each_recorded_window(trace: Path) -> None:
    model = build_model(load_timeline(trace))
    if model is None:  # a CPU-only run: nothing to replay
        assert "cpu" in trace.parent.name
        return
    check = replay_check(model)
    assert check.reproduces, f"replayed {check.replayed_us:.0f} µs against {check.measured_us:.0f} µs"


def _fixture(name: str) -> tuple[StepModel, Predictor, dict[str, float]]:
    run = DATA / name
    record = RunRecord.load(run / "run.json")
    timeline = load_timeline(next(run.glob("*.pt.trace.json.gz")))
    model = build_model(timeline)
    assert model is not None
    bd = compute_breakdown(timeline)
    steady = _steady_step_us(record)
    if steady:
        bd = calibrate_to_steady_state(bd, steady)
    facts = compute_symptoms(bd, record, timeline.meta).values_by_name()
    check = replay_check(model)
    return model, Predictor(model, check, host_code_scale(model, check, steady), 0.0), facts


@pytest.mark.parametrize("name", sorted(PLANTED), ids=str)
def test_the_planted_fix_is_predicted_to_help_and_unrelated_changes_are_not(name: str) -> None:
    _model, predictor, facts = _fixture(name)
    planted = PLANTED[name]
    if planted is not None:
        p = predictor.predict(planted, facts)
        assert p.speedup is not None and p.speedup >= 1.15, p.note
    for other in UNRELATED:
        if other == planted or other in SAME_FIX.get(planted or "", set()):
            continue
        p = predictor.predict(other, facts)
        assert p.speedup is None or abs(p.speedup - 1) <= 0.05, f"{other}: {p.speedup} ({p.note})"


@pytest.mark.parametrize("name", [n for n, t in PLANTED.items() if t], ids=str)
def test_reports_carry_the_prediction_beside_the_bound(name: str) -> None:
    report = analyze_run(RunDir(DATA / name), AnalysisOptions.load())
    expected = json.loads((DATA / name / "expected.json").read_text())
    top = report.findings[0]
    assert top["rule"] == expected["planted_rule"]
    assert top["predicted_speedup"] is not None and top["gain_bound"] is not None
    assert top["prediction_note"].startswith(PLANTED[name])
    assert report.replay is not None and report.replay["within_tolerance"]


def test_every_transformation_is_named_by_a_rule_or_tested_here() -> None:
    named = {r.predict for r in load_rules() if r.predict}
    assert named <= set(TRANSFORMATIONS)
    assert MIN_GAIN > 1


def test_verify_says_predicted_beside_measured() -> None:
    from diagnose.experiments import Baseline, Outcome, VerifyResult, summarize_verify

    baseline = Baseline([Outcome("baseline", {}, "ok", "runs/b", steps_per_s=10.0)], by_samples=False)
    tried = Outcome(
        "SYNC001",
        {"item_every": "1000"},
        "ok",
        "runs/t",
        rule="SYNC001",
        steps_per_s=12.0,
        speedup=1.2,
        verdict="helped",
    )
    report = {"findings": [{"rule": "SYNC001", "gain_bound": 1.5, "predicted_speedup": 1.32}]}
    summary = summarize_verify(VerifyResult(baseline, [tried], None, []), report)
    assert "  predicted 1.32x, measured 1.20x (+10%)" in summary["conclusions"]
    assert summary["rows"][-1]["predicted_speedup"] == 1.32


def test_a_window_with_too_many_gpu_ops_is_modelled_over_its_first_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's memory is bounded: three steps of two kernels each, at most three ops."""
    from diagnose.analysis.prediction import replay as replay_module

    b = TraceBuilder()
    for n, start in enumerate((0, 100, 200)):
        b.step(n, start, 100)
        b.op("aten::linear", start, 40, forward=True)
        b.kernel(FP32_GEMM, start + 10, 20, launch_ts=start + 5)
        b.kernel(ELEMENTWISE, start + 30, 10, launch_ts=start + 20)
    timeline = build_timeline(b.to_dict())
    assert [s.number for s in replay_module.model_steps(timeline, max_ops=6)] == [0, 1, 2]
    assert [s.number for s in replay_module.model_steps(timeline, max_ops=3)] == [0]
    assert [s.number for s in replay_module.model_steps(timeline, max_ops=1)] == [0]  # never less than one step
    monkeypatch.setattr(replay_module, "MODEL_MAX_OPS", 4)
    model = model_of(b)
    assert (model.steps, model.measured_us, len(model.ops)) == (2, 200.0, 4)
    assert replay_check(model).error == 0.0


def test_a_prediction_above_the_bound_is_kept_and_said_so() -> None:
    """The bound counts the finding's own share alone; the change may do more (more workers also
    pin the batches; compile also removes launches). The prediction is not capped at it."""
    from diagnose.units import gain_words

    assert gain_words(1.31, 1.53) == "predicted 1.31x, at most 1.53x"
    assert gain_words(None, 1.53) == "up to 1.53x"
    assert gain_words(2.98, 2.53) == "predicted 2.98x (its share alone: 2.53x)"
    assert gain_words(1.2, None) == "predicted 1.20x" and gain_words(None, None) == ""


def test_a_dominant_idle_share_is_named_when_no_change_is_predicted_to_relieve_it() -> None:
    from types import SimpleNamespace

    from diagnose.analysis.report import _verdict, dominant_idle
    from diagnose.analysis.verdict.findings import Diagnosis

    shares = dict.fromkeys(
        ("data_wait", "h2d_copy", "host_forward", "host_backward", "host_optimizer", "host_other", "communication"), 0.0
    )
    breakdown = SimpleNamespace(
        has_gpu=True, exposed_share={**shares, "sync": 0.35, "gpu_forward": 0.65}, gpu_busy_share=lambda: 0.65
    )
    report = SimpleNamespace(breakdown={}, symptom_value=lambda name: None)
    considered = Diagnosis(
        findings=[],
        next_steps=[],
        considered=["considered SYNC001: predicted 1.04x, within the 10% step-to-step spread"],
    )
    assert _verdict(report, considered, breakdown) == (
        "No change predicted to help beyond the run-to-run spread, though the GPU idles 35% of the step: "
        "host-GPU syncs (.item(), .cpu(), ...); what was considered is listed below."
    )
    assert dominant_idle(breakdown) == ("sync", 0.35)
    breakdown.exposed_share["sync"], breakdown.exposed_share["gpu_forward"] = 0.1, 0.9
    assert _verdict(report, considered, breakdown).startswith("No bottleneck found: GPU busy")
    assert dominant_idle(breakdown) is None


def test_changed_is_dataclasses_replace_for_ops_and_host_items() -> None:
    from diagnose.analysis.prediction.replay import GpuOp, HostItem, changed

    values = {
        "kind": "wait",
        "duration_us": 1.5,
        "phase": "other",
        "ops": (1, 2),
        "lead_us": 0.25,
        "streams": (7,),
        "after_us": 3.0,
        "blocking": True,
        "fetch": 4,
        "sync_kind": "user",
        "ready_us": 9.0,
    }
    assert set(values) == {f.name for f in dataclasses.fields(HostItem)}  # every field set to a value of its own
    item = HostItem(**values)
    assert changed(item, ops=(5,)) == dataclasses.replace(item, ops=(5,)) == HostItem(**{**values, "ops": (5,)})
    assert changed(item) == item and changed(item) is not item
    op = GpuOp(3, 2.0, "memcpy", "Memcpy HtoD", "forward", 1.0, 4.0, 10.0, "HtoD", 64, True)
    assert changed(op, latency_us=0.0, gap_us=5.0) == dataclasses.replace(op, latency_us=0.0, gap_us=5.0)
    with pytest.raises(KeyError):
        changed(op, no_such_field=1)


# --- a host that runs ahead of the GPU: its own time, read off its least back-pressured step ------


def host_ahead_steps(blocked: tuple[float, ...] = (600.0, 700.0, 700.0)) -> TraceBuilder:
    """Three 1000 µs steps whose host runs a step ahead of a GPU busy all window long: each
    step's 1000 µs matmul starts when the previous one ends, 900 µs after its launch. Each step:
    forward code (0-200, launching its matmul at 100 for 10 µs), a launch call that waits for
    room in the full queue (200 on, ``blocked[k]`` µs; its kernel runs after the window), code to
    the step's end. A pin-memory thread's long call and a sync of another thread do not count."""
    b = TraceBuilder()
    b.kernel(FP32_GEMM, 0, 1000, launch_ts=-900)  # carried in
    for k, wait in enumerate(blocked):
        s = 1000.0 * k
        b.step(k + 1, s, 1000)
        b.op("aten::linear", s, 200, forward=True)
        corr = b.runtime("cudaLaunchKernel", s + 100, 10)
        if k < 2:  # the last step's matmul starts at the window's end: outside the model
            b.x("kernel", FP32_GEMM, s + 1000, 1000, tid=7, pid=0, device=0, stream=7, correlation=corr)
        b.runtime("cudaLaunchKernel", s + 200, wait)
        b.op("aten::add", s + 900, 100, forward=True)
    b.runtime("cudaHostAlloc", 150, 400, tid=3)  # the pin-memory thread: not the training threads'
    return b


def test_the_calls_that_waited_for_the_gpu_are_read_per_step() -> None:
    timeline = build_timeline(host_ahead_steps().to_dict())
    assert timeline.long_runtime_calls == [(200.0, 800.0), (1200.0, 1900.0), (2200.0, 2900.0)]
    model = build_model(timeline)
    assert model is not None and model.launch_cost_us == 10.0
    assert model.blocked_us == (590.0, 690.0, 690.0)  # beyond an unblocked call's 10 µs


def test_a_host_ahead_windows_host_is_its_least_back_pressured_step_less_the_profilers_cost() -> None:
    model = model_of(host_ahead_steps())
    check = replay_check(model)
    assert check.mode == "host ahead" and check.reproduces
    # own time per step: 1000 - 590 = 410, 310, 310; the least, 310, less 4 events a step at the
    # profiler's 3.5 µs (no no-work operator to read it off): 296 µs of the 1000 µs of traced
    # model code a step (every µs of the host's window is model code here)
    assert model.host_events == 12 and model.profiler_cost_us == 3.5
    assert host_code_scale(model, check, None) == pytest.approx(296 / 1000)
    assert host_code_scale(model, check, 1300.0) == pytest.approx(296 / 1000)  # a steady step cannot say more
    # the unchanged window still replays as measured: the host (296 µs a step) stays hidden
    assert replay(model, 0.296).window_us == pytest.approx(3000.0)


def test_a_host_ahead_estimate_that_would_not_fit_its_window_is_capped() -> None:
    # no call waited in the first step (the queue was drained): its own time, 1000 µs less the
    # profiler's cost, would make the host set the step, which the window says it did not
    model = model_of(host_ahead_steps(blocked=(5.0, 700.0, 700.0)))
    check = replay_check(model)
    scale = host_code_scale(model, check, None)
    assert 0 < scale < (1000 - 14) / 1000
    assert abs(replay(model, scale).window_us - 3000.0) <= 0.05 * 3000.0


def test_a_trace_trimmed_without_the_calls_that_waited_keeps_the_host_free() -> None:
    data = host_ahead_steps().to_dict()
    data["diagnoseTrimFormat"] = 1  # trimmed before ``diagnose trim`` kept them
    model = build_model(build_timeline(data))
    assert model is not None and model.blocked_us == ()
    assert host_code_scale(model, replay_check(model), None) == 0.0


def test_a_host_ahead_windows_gpu_time_is_stretched_to_its_gpu_paced_step() -> None:
    model = model_of(host_ahead_steps())
    check = replay_check(model)
    # every step is 1000 µs and the window replays 3000 µs: nothing is missing
    assert gpu_stretch(model, check, 1300.0) == gpu_stretch(model, check, None) == 1.0
    # a first step that found the queue drained (400 µs) and two GPU-paced ones (1300 µs) where
    # the window replays 3000 µs: the paced step is the median, 1300 µs
    drained = dataclasses.replace(model, step_durations_us=(400.0, 1300.0, 1300.0))
    assert gpu_stretch(drained, check, None) == pytest.approx(1.3)
    assert gpu_stretch(drained, check, 2000.0) == pytest.approx(1.3)  # a steady mean that holds more: not it
    assert gpu_stretch(drained, check, 1200.0) == pytest.approx(1.2)  # never more than the steady step
    assert gpu_stretch(drained, check, 900.0) == 1.0  # never shrunk
    assert gpu_stretch(drained, dataclasses.replace(check, mode="trace"), 1300.0) == 1.0
    assert (
        gpu_stretch(dataclasses.replace(model, step_durations_us=(400.0, 2400.0, 2400.0)), check, None) == 1.5
    )  # capped
    scale = host_code_scale(model, check, 1300.0)
    plain, stretched = (predict(model, check, "tf32", {}, None, scale, stretch) for stretch in (1.0, 1.3))
    after = replay(tf32(model, {}), scale)
    # TF32 leaves the step host-bound: the before is the steady step, the after the host's
    assert after.gpu_busy_us * 1.3 < after.window_us
    assert plain.speedup == pytest.approx(3000.0 / after.window_us)
    assert stretched.speedup == pytest.approx(3900.0 / after.window_us)
    assert "GPU time x1.30 (the window held 77% of a steady step's GPU work)" in stretched.note


def test_trim_keeps_the_calls_that_waited_and_says_so() -> None:
    from diagnose.analysis.trace.trim import trim_trace

    data = host_ahead_steps().to_dict()
    trimmed = trim_trace(data, steps=3, skip=0)
    assert trimmed["diagnoseTrimFormat"] == 2
    full, small = build_model(build_timeline(data)), build_model(build_timeline(trimmed))
    assert full is not None and small is not None
    assert small.blocked_us == full.blocked_us == (590.0, 690.0, 690.0)


def test_a_duplicated_call_that_waited_counts_once() -> None:
    b = host_ahead_steps()
    b.events.append(dict(next(e for e in b.events if e.get("cat") == "cuda_runtime" and e["dur"] == 700.0)))
    model = model_of(b)
    assert model.blocked_us == (590.0, 690.0, 690.0)


TRACES = sorted(DATA.rglob("*.pt.trace.json*"))


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: str(p.relative_to(DATA)))
def test_the_model_is_the_per_op_loops_model_field_for_field(trace: Path) -> None:
    """``build_model`` computes its GPU ops with array operations; on every recorded trace it
    gives what the per-op loops it replaced gave (tests/reference_model.py), every field of every
    op and host item to the last bit, from the reader's columns and from plain lists alike."""
    from tests import reference_model

    timeline = load_timeline(trace)
    expected = reference_model.build_model(timeline)
    assert build_model(timeline) == expected
    as_lists = dataclasses.replace(
        timeline, kernels=list(timeline.kernels), memcpys=list(timeline.memcpys), memset_ops=list(timeline.memset_ops)
    )
    assert build_model(as_lists) == expected


def test_the_model_of_streams_carried_work_and_syncs_is_the_loops_model() -> None:
    """Hand-written: two streams, work launched before the window (carried in), a launch the
    trace does not hold, a sync, equal starts (the sort's ties): the same model both ways."""
    from tests import reference_model

    b = synced_step()
    b.kernel("early", -30, 40, launch_ts=-35)  # launched before the window: carried in
    b.x("kernel", "unseen", 150, 5, tid=7, pid=0, device=0, stream=7, correlation=999)  # no launch in the trace
    b.kernel("tie_a", 150, 10, launch_ts=146)
    b.kernel("tie_b", 150, 10, launch_ts=147)
    b.kernel("tie_c", 150, 4, launch_ts=148, stream=9)
    b.kernel("late", 160, 60, launch_ts=149, stream=9)  # runs past the window's end
    b.memcpy("Memcpy HtoD (Pageable -> Device)", 170, 5, 4096, launch_ts=165)
    timeline = build_timeline(b.to_dict())
    expected = reference_model.build_model(timeline)
    assert expected is not None and len(expected.ops) >= 5
    assert build_model(timeline) == expected


# --- compile over cuDNN's recurrent layers (issue 32: an LSTM measured 0.89x, predicted 2.98x) -------

RNN_CELL = "void elemWiseRNNcell<float, float, float, (cudnnRNNMode_t)2, (cudnnRNNBiasMode_t)2>(int, int, int, int, int, bool, float const*)"
RNN_BACKWARD = "void RNN_blockPersist_bp_LSTM<float, float, float, 128, true>(RNN_persist_bp_params)"


def lstm_step() -> TraceBuilder:
    """A word-language model's step (1200 µs): embedding (50 µs of host code), an nn.LSTM whose
    cuDNN call spends 700 µs on the host launching a matmul and a cell per time step (ten
    launches, 70 µs apart), the decoder and its log-softmax (80 µs), then a backward whose
    cuDNN call launches four persistent kernels over 300 µs."""
    b = TraceBuilder()
    b.step(1, 0, 1200)
    b.op("aten::embedding", 0, 50, forward=True)
    b.kernel(ELEMENTWISE, 12, 5, launch_ts=10)
    b.op("aten::lstm", 50, 700, forward=True)
    for n in range(10):
        launch = 60 + 70 * n
        b.kernel(FP32_GEMM if n % 2 == 0 else RNN_CELL, launch + 2, 20, launch_ts=launch)
    b.op("aten::linear", 750, 50, forward=True)
    b.kernel(FP32_GEMM, 762, 20, launch_ts=760)
    b.op("aten::log_softmax", 800, 30, forward=True)
    b.kernel("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", 812, 5, launch_ts=810)
    b.backward_op(850, 300, name="CudnnRnnBackward0")
    for n in range(4):
        launch = 870 + 70 * n
        b.kernel(RNN_BACKWARD, launch + 2, 20, launch_ts=launch, tid=2)
    return b


def test_compile_leaves_cudnn_recurrent_layers_eager_and_predicts_no_gain() -> None:
    """Dynamo does not trace nn.LSTM (``allow_rnn`` is off): its call is a graph break and its
    host code, cuDNN's own, stays. Compiling the rest pays a call per piece (two forward pieces
    around the LSTM): the prediction is near 1x, not the 2-3x of compiling the LSTM's host
    code away; and the model says it predicts such a change badly (the run measures it)."""
    from diagnose.analysis.prediction.predict import RNN_KERNEL, fusible, library_layers, weakness

    model = model_of(lstm_step())
    check = replay_check(model)
    assert check.reproduces and replay(model).window_us == 1200.0
    rnn = library_layers(model)
    # the LSTM's launches from its first cell to its last (nine: its first matmul, before any
    # cell, cannot be told from the model's own) and the host code between them; the backward's four
    assert sum(1 for i in rnn if model.items[i].kind == "launch") == 13
    assert all(model.items[i].phase in ("forward", "backward") for i in rnn)
    assert not any(fusible(op) for op in model.ops if RNN_KERNEL.search(op.name) or "gemm" in op.name)
    changed = compile_model(model, {})
    kept = [model.items[i] for i in sorted(rnn)]
    assert [it for it in changed.items if it in kept] == kept  # the layer's host code as it was
    p = predict(model, check, "compile", {})
    assert p.speedup is not None and 0.8 <= p.speedup <= 1.05
    assert p.weak == "compiling a model with cuDNN recurrent layers, which run eagerly"
    assert weakness(model, check, "pinned_copies") is None
