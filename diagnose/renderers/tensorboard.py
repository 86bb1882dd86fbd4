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
* the text ``diagnose/report``: the report as markdown, with a note on which numbers to trust
  (torch-tb-profiler 0.4.3 drops the DataLoader annotations that these figures rest on).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.record_writer import RecordWriter

from diagnose.analysis.breakdown import EXPOSED, HOST_EXPOSED, PHASES
from diagnose.analysis.report import PHASE_LABELS, Report
from diagnose.analysis.rules import human_bytes

#: Our event files end with this, so that we replace ours and leave anyone else's alone.
EVENT_FILE_SUFFIX = ".diagnose"
EVENT_FILE_GLOB = f"events.out.tfevents.*{EVENT_FILE_SUFFIX}"
PARTIAL_NAME = ".diagnose-events.partial"
TEXT_TAG = "diagnose/report"
#: The text's breakdown table lists the categories with at least this share (as the terminal does).
MIN_SHARE_LISTED = 0.0005

#: Per-step counters of a GPU run: scalar tag -> key of a step in ``report.breakdown["steps"]``.
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
THROUGHPUT_FIGURES = ("samples_per_s", "steps_per_s", "median_step_ms", "p90_step_ms")
MEMORY_FIGURES = (
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "capacity_bytes",
    "peak_allocated_share",
    "peak_reserved_share",
)
DATALOADER_SETTINGS = ("num_workers", "pin_memory", "batch_size", "prefetch_factor", "persistent_workers", "drop_last")

TRUST_NOTE = """\
**Which numbers to trust.** The `exposed/*` and `phase/*` scalars and this text come from diagnose's
own attribution of every microsecond of every profiled step, which uses the DataLoader, optimizer
and step annotations of the trace. The PyTorch Profiler tab (torch-tb-profiler 0.4.3) drops every
user annotation except `ProfilerStep#N`: its Overview shows *DataLoader 0* and counts the data wait
as CPU Exec or Other. Use its Trace, Operator and Kernel views to drill into ops and kernels, and
these scalars for where the step time goes. `throughput/steady_*` is measured with the profiler
off and is the real speed; `throughput/profiled_*` includes the profiler's overhead."""


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
    yield event_pb2.Event(wall_time=wall_time, file_version="brain.Event:2")
    for step, tag, value in scalars(report):
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        yield event_pb2.Event(wall_time=wall_time, step=step, summary=summary)
    yield event_pb2.Event(wall_time=wall_time, step=0, summary=_text_summary(TEXT_TAG, report_markdown(report)))


def _text_summary(tag: str, text: str) -> summary_pb2.Summary:
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING, string_val=[text.encode("utf-8")], tensor_shape=tensor_shape_pb2.TensorShapeProto()
    )
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=text_metadata.create_summary_metadata(None, None))
    return summary_pb2.Summary(value=[value])


# --- scalars ------------------------------------------------------------------------------------


def scalars(report: Report) -> list[tuple[int, str, float]]:
    """Every ``(step, tag, value)`` the event file holds, in writing order."""
    out = [*_step_scalars(report), *_window_scalars(report)]
    return [(step, tag, float(value)) for step, tag, value in out if value is not None]


def exposed_categories(report: Report) -> tuple[str, ...]:
    """The exposed categories a run can have: all on a GPU, the host ones on a CPU-only run."""
    return EXPOSED if report.on_gpu else HOST_EXPOSED


def _step_scalars(report: Report) -> Iterator[tuple[int, str, Any]]:
    if not report.breakdown:
        return
    categories = exposed_categories(report)
    for step in report.breakdown["steps"]:
        number = step["number"]
        yield number, "step/duration_ms", step["duration_ms"]
        for category in categories:
            yield number, f"exposed/{category}_ms", step["exposed_ms"][category]
        for phase in PHASES:
            yield number, f"phase/{phase}_ms", step["phases_ms"][phase]
        if report.on_gpu:
            yield number, "gpu/busy_share", step["gpu_busy_ms"] / step["duration_ms"] if step["duration_ms"] else None
            for tag, key in GPU_STEP_SCALARS.items():
                yield number, tag, step.get(key)


def _window_scalars(report: Report) -> Iterator[tuple[int, str, Any]]:
    for window in ("steady", "profiled"):
        timing = (report.throughput or {}).get(window) or {}
        for figure in THROUGHPUT_FIGURES:
            yield 0, f"throughput/{window}_{figure}", timing.get(figure)
    for figure in MEMORY_FIGURES:
        yield 0, f"memory/{figure}", (report.memory or {}).get(figure)
    if not report.breakdown:
        return
    window = report.breakdown["window"]
    for category in exposed_categories(report):
        yield 0, f"share/exposed_{category}", window["exposed_share"][category]
    for phase in PHASES:
        yield 0, f"share/phase_{phase}", window["phase_share"][phase]
    if report.on_gpu:
        yield 0, "share/gpu_busy", window["gpu_busy_share"]
        for phase in PHASES:
            yield 0, f"share/hidden_{phase}", window["hidden_share"][phase]


# --- the text summary ---------------------------------------------------------------------------


def report_markdown(report: Report) -> str:
    """The report as markdown for TensorBoard's Text tab (tables and fenced code render there)."""
    sections = [
        f"## {_cell(report.verdict or 'No verdict: nothing was profiled.')}",
        f"status: {_cell(report.status.get('message', ''))}",
        _throughput_markdown(report),
        _findings_markdown(report),
        _breakdown_markdown(report),
        _dataloader_markdown(report),
        _warnings_markdown(report),
        TRUST_NOTE,
    ]
    return "\n\n".join(section for section in sections if section) + "\n"


def _cell(value: Any) -> str:
    """Text made safe for one markdown table cell (TensorBoard sanitises the HTML itself)."""
    return " ".join(str(value).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _throughput_markdown(report: Report) -> str:
    rows = []
    for window, label in (("steady", "steady state (profiler off)"), ("profiled", "profiled window")):
        timing = (report.throughput or {}).get(window)
        if not timing or not timing.get("steps"):
            continue
        samples = timing.get("samples_per_s")
        rows.append(
            [
                label,
                str(timing["steps"]),
                f"{timing['median_step_ms']:.2f}",
                f"{timing['steps_per_s']:.2f}",
                f"{samples:.0f}" if samples else "-",
            ]
        )
    if not rows:
        return ""
    return "### Throughput\n\n" + _table(["window", "steps", "median ms/step", "steps/s", "samples/s"], rows)


def _findings_markdown(report: Report) -> str:
    if not report.findings:
        return ""
    rows = [
        [
            f"{i}",
            f"`{f['rule']}`",
            f"**{f['title']}**: {f['says']}",
            " · ".join(f"{e['symptom']} {e['text']}" for e in f.get("evidence", [])),
            f"up to {f['gain_bound']:.2f}x" if f.get("gain_bound") else "-",
        ]
        for i, f in enumerate(report.findings, 1)
    ]
    fixes = [f"**{i}. {f['rule']}**\n\n```python\n{f['do']}\n```" for i, f in enumerate(report.findings, 1) if f.get("do")]
    table = _table(["#", "rule", "finding", "evidence", "gain"], rows)
    return "\n\n".join(["### Findings", table, *fixes])


def _breakdown_markdown(report: Report) -> str:
    if not report.breakdown:
        return ""
    window = report.breakdown["window"]
    labels = report.exposed_labels()
    exposed_rows = [
        [labels[c], f"{window['median_ms']['exposed'][c]:.3f}", f"{window['exposed_share'][c] * 100:.1f}%"]
        for c in EXPOSED
        if window["exposed_share"][c] >= MIN_SHARE_LISTED
    ]
    phase_header = ["host thread phase", "ms/step", "share"] + (["hidden behind GPU"] if report.on_gpu else [])
    phase_rows = []
    for phase in PHASES:
        row = [PHASE_LABELS[phase], f"{window['median_ms']['phases'][phase]:.3f}", f"{window['phase_share'][phase] * 100:.1f}%"]
        if report.on_gpu:
            row.append(f"{window['hidden_share'][phase] * 100:.1f}%")
        phase_rows.append(row)
    lines = [
        f"### Where a step goes ({window['steps']} profiled steps, median {window['median_step_ms']:.2f} ms)",
        _table(["exposed: what limits the step", "ms/step (median)", "share"], exposed_rows),
        _table(phase_header, phase_rows),
    ]
    if report.on_gpu:
        h2d = window.get("h2d_bytes_per_step", {})
        lines.append(
            f"GPU busy {window['gpu_busy_share'] * 100:.0f}% · {window['kernels_per_step']:g} kernels/step · "
            f"H2D {human_bytes(h2d.get('pageable') or 0)} pageable, {human_bytes(h2d.get('pinned') or 0)} pinned per step · "
            f"{window['syncs_per_step']:g} syncs/step"
        )
    return "\n\n".join(lines)


def _dataloader_markdown(report: Report) -> str:
    loader = report.dataloader
    if not loader:
        return ""
    rows = [[key, str(loader.get(key))] for key in DATALOADER_SETTINGS if key in loader]
    where = f" (created at `{_cell(loader['created_at'])}`)" if loader.get("created_at") else ""
    return f"### DataLoader{where}\n\n" + _table(["setting", "value"], rows)


def _warnings_markdown(report: Report) -> str:
    if not report.warnings:
        return ""
    return "### Notes\n\n" + "\n".join(f"* {_cell(w)}" for w in report.warnings)
