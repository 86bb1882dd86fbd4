"""Traces that other torch versions, devices and tools wrote: the shapes found in public traces
(docs/analysis.md, "Traces from elsewhere"), each written here by hand with exact expectations.
No public trace is copied into the project; each test rebuilds the one feature that mattered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diagnose.analysis.measure.breakdown import compute_breakdown
from diagnose.analysis.trace.timeline import build_timeline, load_timeline
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
