"""Traces that other torch versions, devices and tools wrote: the shapes found in public traces
(docs/analysis.md, "Traces from elsewhere"), each written here by hand with exact expectations.
No public trace is copied into the project; each test rebuilds the one feature that mattered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diagnose.analysis.measure.breakdown import compute_breakdown
from diagnose.analysis.pipeline import AnalysisOptions
from diagnose.analysis.trace.timeline import build_timeline, load_timeline
from diagnose.rundir import RunDir
from diagnose.session import analyze_run
from diagnose.units import gain_words
from tests import reference_timeline
from tests.tracebuilder import ELEMENTWISE, MAIN, TraceBuilder


def _legacy_steps() -> TraceBuilder:
    """Two 100 µs steps as torch 1.8 wrote them (tb_plugin's resnet50 samples): every host event,
    the step marks, the DataLoader's fetch and the optimizer's step included, in category
    "Operator", thread ids as strings."""
    b = TraceBuilder()
    for number, start in ((5, 0), (6, 100)):
        b.x("Operator", f"ProfilerStep#{number}", start, 100, tid=str(MAIN))
        b.x("Operator", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start, 40, tid=str(MAIN))
        b.x("Operator", "aten::relu", start + 40, 10, tid=str(MAIN))
        b.kernel(ELEMENTWISE, start + 50, 30, launch_ts=start + 45, tid=str(MAIN))
        b.x("Operator", "Optimizer.step#SGD.step", start + 80, 20, tid=str(MAIN))
    return b


def _fields(timeline: Any) -> dict[str, Any]:
    fields = dict(vars(timeline))
    fields["meta"] = dict(vars(timeline.meta), path="", size_bytes=0)
    return fields


def test_torch_1_8_annotations_in_the_operator_category_are_steps_data_waits_and_the_optimizer(
    tmp_path: Path,
) -> None:
    """Before: one step over the whole trace (no ProfilerStep marks seen), no data wait."""
    b = _legacy_steps()
    timeline = load_timeline(b.write(tmp_path / "legacy.json"))
    assert timeline.has_step_marks
    assert [(s.number, s.start, s.end) for s in timeline.steps] == [(5, 0.0, 100.0), (6, 100.0, 200.0)]
    assert timeline.data_waits == [(0.0, 40.0), (100.0, 140.0)]
    assert timeline.optimizer_spans == [(80.0, 100.0), (180.0, 200.0)]
    assert [op.name for op in timeline.host_ops] == ["aten::relu", "aten::relu"]
    assert _fields(timeline) == _fields(reference_timeline.build_timeline(b.to_dict()))
    breakdown = compute_breakdown(build_timeline(b.to_dict()))
    assert [step.phases["data_wait"] for step in breakdown.steps] == [40.0, 40.0]
    assert [step.phases["optimizer"] for step in breakdown.steps] == [20.0, 20.0]


TENSILE_GEMM = "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_ISA90a_WG64_4_1"


def test_a_rocm_trace_has_its_syncs_and_its_tensile_matmuls() -> None:
    """ROCm's torch writes HIP calls under cuda_runtime: hipDeviceSynchronize blocks the host as
    cudaDeviceSynchronize does, and rocBLAS/hipBLASLt run Tensile's ``Cijk_...`` kernels, which name
    no gemm. Before: no sync seen, the matmul counted as "other" kernels."""
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.op("aten::mm", 0, 10, forward=True)
    b.kernel(TENSILE_GEMM, 10, 50, launch_ts=5)
    b.sync(20, 45, name="hipDeviceSynchronize")
    b.op("aten::item", 70, 20)
    b.sync(75, 10, name="hipMemcpyWithStream")
    timeline = build_timeline(b.to_dict())
    assert [(s.start, s.end, s.name) for s in timeline.syncs] == [
        (20.0, 65.0, "hipDeviceSynchronize"),
        (75.0, 85.0, "hipMemcpyWithStream"),
    ]
    (step,) = compute_breakdown(timeline).steps
    assert step.sync_count == 2
    assert step.matmul_us == {"unknown": 50.0}


def test_a_folder_of_traces_named_as_their_user_chose_is_read(tmp_path: Path) -> None:
    """HTA's trace folders hold ``rank-0.json.gz`` and the like. Before: "holds neither run.json
    nor a trace" (only ``*.pt.trace.json(.gz)`` was looked for)."""
    folder = tmp_path / "traces"
    folder.mkdir()
    _legacy_steps().write(folder / "rank-0.json.gz", gz=True)
    _legacy_steps().write(folder / "rank-1.json", gz=False)
    (folder / "notes.txt").write_text("not a trace")
    (folder / "report.json").write_text("{}")  # diagnose's own (the older layout): never a trace
    run_dir = RunDir(folder)
    assert [p.name for p in run_dir.traces()] == ["rank-0.json.gz", "rank-1.json"]
    assert run_dir.trace_for(None) == (folder / "rank-1.json", ["2 traces in the run directory; analysed rank-1.json"])
    report = analyze_run(run_dir, AnalysisOptions.load()).to_dict()
    assert len(report["breakdown"]["steps"]) == 2


def test_a_run_directory_keeps_to_its_pt_trace_files(tmp_path: Path) -> None:
    """Where a ``*.pt.trace.json(.gz)`` is present, another JSON file beside it is not a trace."""
    _legacy_steps().write(tmp_path / "host_1.1.pt.trace.json.gz", gz=True)
    (tmp_path / "settings.json").write_text("{}")
    assert [p.name for p in RunDir(tmp_path).traces()] == ["host_1.1.pt.trace.json.gz"]


def _host_only_step() -> TraceBuilder:
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.op("aten::mm", 0, 80, forward=True)
    return b


def test_another_accelerators_events_are_named_not_taken_for_a_cpu_only_run() -> None:
    """HTA's MTIA traces: mtia_runtime calls and mtia_ccp_events beside the host's operators.
    Before: a "CPU-only run", and mtia_ccp_events an unknown category."""
    b = _host_only_step()
    b.x("mtia_runtime", "runFunction", 10, 5)
    b.x("mtia_ccp_events", "kernel", 12, 30, pid=0, tid=3)
    timeline = build_timeline(b.to_dict())
    assert timeline.meta.other_device_events == {"mtia_runtime": 1, "mtia_ccp_events": 1}
    assert timeline.meta.unknown_categories == {}
    breakdown = compute_breakdown(timeline)
    assert breakdown.untraced_device == "an accelerator"
    assert breakdown.notes == [
        "the trace holds another accelerator's events this version does not analyse "
        "(mtia_ccp_events (1), mtia_runtime (1)): its device time is in no category, and the step reads as host time"
    ]


def test_cuda_calls_without_gpu_activity_are_said_so() -> None:
    """CUPTI's range profiler (HTA's cupti_profiler trace) writes the runtime calls and no kernel."""
    b = _host_only_step()
    b.runtime("cudaLaunchKernel", 20, 5)
    b.runtime("cudaLaunchKernel", 40, 5)
    breakdown = compute_breakdown(build_timeline(b.to_dict()))
    assert not breakdown.has_gpu
    assert breakdown.untraced_device == "the GPU"
    assert breakdown.notes == [
        "the trace records 2 CUDA runtime call(s) but no GPU kernel, copy or memset (was the GPU's activity "
        "traced?): the step reads as host time, the GPU's side is not analysed"
    ]
    assert compute_breakdown(build_timeline(_host_only_step().to_dict())).untraced_device is None


def test_a_bound_near_infinity_is_shown_as_over_100x() -> None:
    """HTA's triton_example: one 13 s step holding a 1.8 µs kernel, 1 / (1 - s) of s = 99.99999%.
    Before: "up to 7578461.37x"."""
    assert gain_words(None, 7578461.37) == "up to >100x"
    assert gain_words(None, 44.52) == "up to 44.52x"
    assert gain_words(None, 100.0) == "up to 100.00x"
    assert gain_words(1.31, 7578461.37) == "predicted 1.31x, at most >100x"
    assert gain_words(300.0, 120.0) == "predicted 300.00x (its share alone: >100x)"


DATA = Path(__file__).parent / "data"


def _user_named(folder: Path, fixture: str) -> list[Path]:
    """A recorded run's rank traces copied under the names ``tensorboard_trace_handler`` gives
    (``<host>_<pid>.<ms>.pt.trace.json.gz``: no rank in the name, only in ``distributedInfo``)."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    copied = []
    for i, trace in enumerate(sorted((DATA / fixture).glob("rank*_*.pt.trace.json.gz"))):
        copied.append(Path(shutil.copy(trace, folder / f"host_{100 + i}.17000000000{i}.pt.trace.json.gz")))
    return copied


def test_a_folder_of_a_users_rank_traces_is_diagnosed_as_one_job(tmp_path: Path) -> None:
    """A DDP job profiled by the user's own torch.profiler code, each rank's trace in one folder:
    before, the last file alone was analysed ("2 traces in the run directory"); now each rank's
    trace is analysed without a record and the ranks combined, as a run's are: the straggling
    rank (rank 1 of examples/ddp_straggler.py, recorded on the CPU) is named."""
    from diagnose.analysis.trace.tracefile import trace_rank
    from diagnose.session import user_rank_traces

    folder = tmp_path / "log"
    traces = _user_named(folder, "ddp_straggler_cpu")
    assert [trace_rank(p) for p in traces] == [0, 1]
    assert user_rank_traces(RunDir(folder)) == {0: [traces[0]], 1: [traces[1]]}
    report = analyze_run(RunDir(folder), AnalysisOptions.load()).to_dict()
    dist = report["distributed"]
    assert dist["world_size"] == 2 and dist["gathered"] == "traces"
    assert [r["rank"] for r in dist["ranks"]] == [0, 1]
    assert {r["status"] for r in dist["ranks"]} == {"trace"} and {r["backend"] for r in dist["ranks"]} == {"gloo"}
    assert dist["straggler"]["rank"] == 1
    assert "DIST003" in [f["rule"] for f in report["findings"]]


def test_traces_of_one_rank_or_of_unknown_ranks_stay_one_trace(tmp_path: Path) -> None:
    """Two cycles of one process's profiler (the same rank twice), or a trace that names no
    rank beside one that does: no job to combine; the latest trace is analysed as before."""
    import shutil

    from diagnose.analysis.trace.tracefile import trace_rank
    from diagnose.session import user_rank_traces

    rank0 = sorted((DATA / "ddp_straggler_cpu").glob("rank0_*.pt.trace.json.gz"))[0]
    same = tmp_path / "same"
    same.mkdir()
    for cycle in (1, 2):
        shutil.copy(rank0, same / f"host_100.{cycle}.pt.trace.json.gz")
    assert user_rank_traces(RunDir(same)) == {}
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(rank0, mixed / "host_100.1.pt.trace.json.gz")
    bare = Path(shutil.copy(DATA / "bare" / "launch_bound.pt.trace.json.gz", mixed / "other.pt.trace.json.gz"))
    assert trace_rank(bare) is None
    assert user_rank_traces(RunDir(mixed)) == {}
    report = analyze_run(RunDir(mixed), AnalysisOptions.load()).to_dict()
    assert report["distributed"] is None
    assert "2 traces in the run directory; analysed other.pt.trace.json.gz" in report["warnings"]


def test_a_window_with_no_backward_and_no_optimizer_step_is_said_to_be_no_training(tmp_path: Path) -> None:
    """HTA's inference and benchmark traces were read as training loops ("CPU work in the
    training loop"): a window with neither a backward nor an optimizer step now says what it is."""
    from diagnose.analysis.pipeline import NO_TRAINING, analyze_trace

    b = TraceBuilder()
    for number, start in ((1, 0), (2, 100)):
        b.step(number, start, 100)
        b.op("aten::mm", start, 60)
    inference = analyze_trace(b.write(tmp_path / "inference.pt.trace.json"), AnalysisOptions.load()).to_dict()
    assert NO_TRAINING in inference["warnings"]
    b = TraceBuilder()
    for number, start in ((1, 0), (2, 100)):
        b.step(number, start, 100)
        b.op("aten::mm", start, 40, forward=True)
        b.backward_op(start + 40, 30)
        b.optimizer(start + 70, 20)
    training = analyze_trace(b.write(tmp_path / "training.pt.trace.json"), AnalysisOptions.load()).to_dict()
    assert NO_TRAINING not in training["warnings"]
