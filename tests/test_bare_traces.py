"""A trace on its own (no run record) reaches the verdict a live run would.

The fixtures under tests/data/bare/ are traces a user's own torch.profiler wrote for every
planted example (benchmarks/plain_profiler.py, recorded on an H100); planted.json names the rule
each plants. The hand-written traces check the read-offs and the profiler-cost correction
with exact numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose.analysis.measure.breakdown import compute_breakdown
from diagnose.analysis.measure.profcost import DEFAULT_COST_US, correct_profiler_cost, estimate_cost_per_event
from diagnose.analysis.pipeline import AnalysisOptions, analyze_trace
from diagnose.analysis.trace.timeline import build_timeline
from diagnose.rundir import RunDir
from diagnose.session import analyze_run
from tests.tracebuilder import AUTOGRAD, ELEMENTWISE, TraceBuilder

BARE = Path(__file__).parent / "data" / "bare"
PLANTED = {k: v for k, v in json.loads((BARE / "planted.json").read_text()).items() if not k.startswith("_")}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_bare_trace_gets_its_planted_verdict_first(name: str) -> None:
    report = analyze_trace(BARE / f"{name}.pt.trace.json.gz", AnalysisOptions.load(show_all=True))
    problems = [f["rule"] for f in report.to_dict()["findings"]]
    if PLANTED[name] is None:
        assert problems == [], f"{name}: nothing is planted, yet {problems}"
    else:
        assert problems and problems[0] == PLANTED[name], f"{name}: planted {PLANTED[name]}, found {problems}"


def test_the_bare_well_tuned_trace_is_corrected_for_the_profilers_cost() -> None:
    """Without the correction its host time looks launch-bound (LAUNCH001 at 1.6x)."""
    report = analyze_trace(BARE / "well_tuned.pt.trace.json.gz", AnalysisOptions.load()).to_dict()
    assert any("profiler's own cost" in n for n in report["warnings"])
    window = report["breakdown"]["window"]
    assert window["profiler_inflation"] > 1.2
    trace_launch = window["trace_exposed_share"]["host_forward"] + window["trace_exposed_share"]["host_backward"]
    assert trace_launch >= 0.25  # what LAUNCH001 would have read: launch-bound
    assert report["symptoms"]["exposed.launch_model"]["value"] < 0.25  # corrected: not launch-bound


def _forward_step() -> TraceBuilder:
    """One 100 µs step: the host runs 10 forward operators back to back (0-60 µs, GPU idle) and
    launches one kernel at 55 µs that runs 60-100 µs."""
    b = TraceBuilder()
    b.step(1, 0, 100)
    for i in range(10):
        b.op("aten::relu", 6 * i, 6, forward=True)
    b.kernel(ELEMENTWISE, 60, 40, launch_ts=55)
    return b


def test_profiler_cost_removes_the_events_cost_from_the_phase_it_delays() -> None:
    timeline = build_timeline(_forward_step().to_dict())
    bd = compute_breakdown(timeline)
    step = bd.steps[0]
    assert step.exposed["host_forward"] == 60 and step.exposed["gpu_forward"] == 40
    assert step.phase_events["forward"] == 11  # ten operators and the launch
    corrected = correct_profiler_cost(bd, 2.0)
    # 11 events x 2 µs = 22 µs less GPU idle in forward: 38 + 40 = 78 µs
    assert corrected.exposed_share["host_forward"] == pytest.approx(38 / 78)
    assert corrected.exposed_share["gpu_forward"] == pytest.approx(40 / 78)
    assert corrected.profiler_inflation == pytest.approx(100 / 78)
    assert corrected.trace_exposed_share == bd.exposed_share


def test_profiler_cost_never_takes_more_than_the_exposed_time() -> None:
    bd = compute_breakdown(build_timeline(_forward_step().to_dict()))
    corrected = correct_profiler_cost(bd, 100.0)  # 1100 µs of events against 60 µs exposed
    assert corrected.exposed_share["host_forward"] == 0.0
    assert corrected.exposed_share["gpu_forward"] == pytest.approx(1.0)


def test_profiler_cost_leaves_a_gpu_bound_step_alone() -> None:
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.op("aten::linear", 0, 10, forward=True)
    b.kernel(ELEMENTWISE, 5, 995, launch_ts=4)  # the GPU is busy from 5 µs: the host hides
    bd = compute_breakdown(build_timeline(b.to_dict()))
    corrected = correct_profiler_cost(bd, 2.0)  # 4 µs of 1000: within the tolerance
    assert corrected.exposed_share == bd.exposed_share and corrected.trace_exposed_share is None


def test_the_cost_per_event_is_read_off_the_no_work_operators() -> None:
    b = _forward_step()
    for i in range(20):
        b.op("aten::view", 200 + 10 * i, 4.0)
    assert estimate_cost_per_event(build_timeline(b.to_dict())).per_event_us == pytest.approx(1.75 * 4.0)
    assert estimate_cost_per_event(build_timeline(b.to_dict())).source == "read off the trace"
    few = _forward_step()
    few.op("aten::view", 200, 4.0)
    cost = estimate_cost_per_event(build_timeline(few.to_dict()))
    assert (cost.per_event_us, cost.source) == (DEFAULT_COST_US, "calibrated constant")


def test_the_trace_says_which_optimizer_and_how_it_steps() -> None:
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.optimizer(50, 40, name="Adam")
    for i in range(3):
        b.op("aten::add_", 51 + 10 * i, 2)
        b.op("aten::addcdiv_", 54 + 10 * i, 2)
    b.events.append(
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": AUTOGRAD, "args": {"name": "thread 2 (pt_autograd_0)"}}
    )
    meta = build_timeline(b.to_dict()).meta
    assert meta.optimizer_classes == {"Adam": 1}
    assert meta.optimizer_step_ops == [{"aten::add_": 3, "aten::addcdiv_": 3}]
    assert meta.thread_names == {str(AUTOGRAD): "thread 2 (pt_autograd_0)"}


def test_the_recorded_events_are_the_training_threads() -> None:
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.op("aten::mm", 0, 5)
    b.backward_op(10, 5)
    b.op("aten::mm", 11, 2, tid=AUTOGRAD)
    b.op("aten::pin_memory", 20, 5, tid=99)  # a pin-memory thread: not on the critical path
    assert build_timeline(b.to_dict()).host_event_starts == [0, 10, 11]


def test_a_dominant_data_wait_is_named_even_when_the_trace_hides_the_workers(tmp_path: Path) -> None:
    """95% data wait from a multi-process loader: DATA001 cannot tell how many workers; the
    catch-all says what it sees and what it could not."""
    b = TraceBuilder()
    for n in range(2):
        t0 = 1000 * n
        b.step(n, t0, 1000)
        b.data_wait(t0, 950, workers=True)
        b.op("aten::linear", t0 + 950, 20, forward=True)
        b.kernel(ELEMENTWISE, t0 + 960, 30, launch_ts=t0 + 955)
    report = analyze_trace(b.write(tmp_path / "loader.pt.trace.json"), AnalysisOptions.load()).to_dict()
    rules = [f["rule"] for f in report["findings"]]
    assert rules == ["EXPO001"]
    assert "does not say how many DataLoader workers" in report["findings"][0]["says"]


def test_the_report_says_what_it_read_off_the_trace_and_what_it_could_not_see() -> None:
    single = analyze_trace(BARE / "data_bound.pt.trace.json.gz", AnalysisOptions.load()).to_dict()["trace_only"]
    assert single["read_off"]["dataloader"] == "num_workers=0 (single-process iterator)"
    assert single["read_off"]["device"] == "NVIDIA H100 80GB HBM3"
    assert "how many DataLoader workers, and how busy they are" not in single["not_seen"]
    multi = analyze_trace(BARE / "well_tuned.pt.trace.json.gz", AnalysisOptions.load()).to_dict()
    assert "how many DataLoader workers, and how busy they are" in multi["trace_only"]["not_seen"]
    assert multi["trace_only"]["read_off"]["optimizer"] == {"class": "AdamW", "implementation": "foreach/fused"}
    assert "how many parameter tensors the optimizer updates" in multi["trace_only"]["not_seen"]
    assert any(w.startswith("the trace alone could not show:") for w in multi["warnings"])


def test_a_run_directory_has_no_trace_only_section() -> None:
    report = analyze_run(RunDir(Path(__file__).parent / "data" / "well_tuned"), AnalysisOptions.load()).to_dict()
    assert report["trace_only"] is None


def test_the_constant_cost_never_exceeds_what_the_traces_operators_take() -> None:
    """Kineto's own test trace records operators 0.13 µs long: 3.5 µs an event made its steps
    "an estimated 550% slower". The constant is bounded by the operators' median length."""
    b = TraceBuilder()
    b.step(1, 0, 10)
    for i in range(20):
        b.op("aten::add", 0.5 * i, 0.25, forward=True)
    cost = estimate_cost_per_event(build_timeline(b.to_dict()))
    assert cost.per_event_us == pytest.approx(0.25)
    assert cost.source.startswith("the recorded operators' median length")
