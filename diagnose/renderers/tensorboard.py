"""TensorBoard output: one event file per run directory, beside the trace.

Contract: ``write_events(report, run_dir) -> Path`` writes ``events.out.tfevents.<secs>.diagnose``
into ``run_dir`` and removes any older event file of ours, so re-analysing a run replaces its
scalars instead of appending a second copy. Raises ImportError when the ``tensorboard``
package is missing (``pip install diagnose[tensorboard]``); never imports torch or TensorFlow:
the records are written with tensorboard's own protos and record writer.

What the file holds (tags documented in docs/tensorboard.md):

* per profiled step, at the step's own number: ``exposed/<category>_ms``, ``phase/<phase>_ms``,
  ``step/duration_ms`` and, on a GPU, ``gpu/*``, ``h2d/*``, ``d2h/*``, ``sync/*``;
* once, at step 0: ``throughput/*``, ``memory/*``, ``share/*`` (shares of the profiled window);
* the text ``diagnose/report``: the report as markdown (``MarkdownRenderer``), with a note on
  which numbers to trust (torch-tb-profiler 0.4.3 drops the DataLoader annotations that these
  figures rest on).

Both read the report's view (``ReportView``), built once per file.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.record_writer import RecordWriter

from diagnose.renderers.markdown import TRUST_NOTE, MarkdownRenderer  # noqa: F401 - TRUST_NOTE is the text's last part
from diagnose.renderers.view import ReportView
from diagnose.report import Report, Step, Timing

#: Our event files end with this, so that we replace ours and leave anyone else's alone.
EVENT_FILE_SUFFIX = ".diagnose"
EVENT_FILE_GLOB = f"events.out.tfevents.*{EVENT_FILE_SUFFIX}"
PARTIAL_NAME = ".diagnose-events.partial"
TEXT_TAG = "diagnose/report"

#: Per-step counters of a GPU run: scalar tag -> field of a step row.
GPU_STEP_SCALARS = {
    "gpu/busy_ms": "gpu_busy_ms",
    "gpu/kernels": "kernels",
    "gpu/median_kernel_us": "median_kernel_us",
    "h2d/pageable_bytes": "h2d_pageable_bytes",
    "h2d/pinned_bytes": "h2d_pinned_bytes",
    "h2d/copies": "h2d_copies",
    "d2h/bytes": "d2h_bytes",
    "sync/count": "syncs",
    "sync/blocked_ms": "sync_blocked_ms",
}
THROUGHPUT_FIGURES = ("samples_per_s", "steps_per_s", "mean_step_ms", "p10_step_ms", "p90_step_ms", "median_step_ms")
MEMORY_FIGURES = (
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "capacity_bytes",
    "peak_allocated_share",
    "peak_reserved_share",
)


def write_events(report: Report, run_dir: Path) -> Path:
    """Write the report's scalars and text as one event file in ``run_dir``, then delete the
    older ones of ours; return its path."""
    wall_time = time.time()
    path = run_dir / f"events.out.tfevents.{int(wall_time):010d}{EVENT_FILE_SUFFIX}"
    # TensorBoard reads any file with "tfevents" in its name: write under another name first
    partial = run_dir / PARTIAL_NAME
    with partial.open("wb") as stream:
        writer = RecordWriter(stream)
        for event in _events(report, wall_time):
            writer.write(event.SerializeToString())
    partial.replace(path)
    for older in run_dir.glob(EVENT_FILE_GLOB):
        if older != path:
            older.unlink()
    return path


def _events(report: Report, wall_time: float) -> Iterator[event_pb2.Event]:
    view = ReportView.from_report(report)
    yield event_pb2.Event(wall_time=wall_time, file_version="brain.Event:2")
    for step, tag, value in view_scalars(view):
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        yield event_pb2.Event(wall_time=wall_time, step=step, summary=summary)
    text = MarkdownRenderer().render_view(view)
    yield event_pb2.Event(wall_time=wall_time, step=0, summary=_text_summary(TEXT_TAG, text))


def _text_summary(tag: str, text: str) -> summary_pb2.Summary:
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING, string_val=[text.encode("utf-8")], tensor_shape=tensor_shape_pb2.TensorShapeProto()
    )
    value = summary_pb2.Summary.Value(
        tag=tag, tensor=tensor, metadata=text_metadata.create_summary_metadata(None, None)
    )
    return summary_pb2.Summary(value=[value])


# --- scalars ------------------------------------------------------------------------------------


def scalars(report: Report) -> list[tuple[int, str, float]]:
    """Every ``(step, tag, value)`` the event file holds, in writing order."""
    return view_scalars(ReportView.from_report(report))


def view_scalars(view: ReportView) -> list[tuple[int, str, float]]:
    out = [*_step_scalars(view), *_window_scalars(view), *_whole_scalars(view)]
    return [(step, tag, float(value)) for step, tag, value in out if value is not None]


def _step_scalars(view: ReportView) -> Iterator[tuple[int, str, Any]]:
    breakdown = view.breakdown
    if breakdown is None:
        return
    for step in breakdown.steps:
        number = step.number
        yield number, "step/duration_ms", step.duration_ms
        for category in breakdown.categories:
            yield number, f"exposed/{category}_ms", step.exposed_ms[category]
        for phase in breakdown.phases:
            yield number, f"phase/{phase.phase}_ms", step.phases_ms[phase.phase]
        if breakdown.on_gpu:
            yield number, "gpu/busy_share", _busy_share(step)
            for tag, name in GPU_STEP_SCALARS.items():
                yield number, tag, getattr(step, name)


def _whole_scalars(view: ReportView) -> Iterator[tuple[int, str, Any]]:
    """``diagnose watch``: over the run, at the training step they were taken at: the step
    time (median and slowest of each point), memory and the DataLoader wait; once, at step 0,
    goodput and each bucket's share of the wall-clock."""
    whole = view.whole
    if whole is None:
        return
    for _, median_ms, max_ms, step in whole.step_series:
        yield step, "whole/step_ms", median_ms
        yield step, "whole/slowest_step_ms", max_ms
    for _, step, host_gb, gpu_gb, wait in whole.memory_series:
        yield step, "whole/host_memory_gb", host_gb
        yield step, "whole/gpu_memory_gb", gpu_gb
        yield step, "whole/data_wait_share", wait
    yield 0, "whole/goodput", whole.goodput
    yield 0, "whole/wall_s", whole.wall_s
    for row in whole.rows:
        yield 0, f"whole/share_{row.bucket}", row.share


def _busy_share(step: Step) -> float | None:
    return step.gpu_busy_ms / step.duration_ms if step.duration_ms and step.gpu_busy_ms is not None else None


def _window_scalars(view: ReportView) -> Iterator[tuple[int, str, Any]]:
    timings: dict[str, Timing | None] = {"steady": view.throughput.steady, "profiled": view.throughput.profiled}
    for window, timing in timings.items():
        for figure in THROUGHPUT_FIGURES:
            yield 0, f"throughput/{window}_{figure}", getattr(timing, figure) if timing else None
    for figure in MEMORY_FIGURES:
        yield 0, f"memory/{figure}", getattr(view.memory, figure)
    limits = view.limits
    if limits is not None:  # the distance to the hardware limit (renderers/limitsview.py)
        yield 0, "limits/mfu", limits.mfu
        yield 0, "limits/achieved_tflops", limits.achieved_tflops
        yield 0, "limits/peak_tflops", limits.peak_tflops
        yield 0, "limits/tflop_per_step", limits.tflop_per_step
        for owner in limits.memory:
            yield 0, f"memory/{owner.owner.replace(' ', '_')}_bytes", owner.bytes
        yield 0, "memory/largest_batch", limits.largest_batch
    breakdown = view.breakdown
    if breakdown is None:
        return
    for category in breakdown.categories:
        yield 0, f"share/exposed_{category}", breakdown.share(category)
    for row in breakdown.exposed:  # the table's own rows: mean = share x its step
        if row.category in breakdown.categories:
            yield 0, f"mean/exposed_{row.category}_ms", row.mean_ms
    for phase in breakdown.phases:
        yield 0, f"share/phase_{phase.phase}", phase.share
        yield 0, f"mean/phase_{phase.phase}_ms", phase.mean_ms
    if breakdown.gpu is not None:
        yield 0, "share/gpu_busy", breakdown.gpu.busy_share
        for phase in breakdown.phases:
            yield 0, f"share/hidden_{phase.phase}", phase.hidden_share
