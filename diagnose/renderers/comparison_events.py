"""TensorBoard events for a comparison: a verify or sweep directory's runs side by side.

Contract: ``write_comparison_events(comparison, folder) -> Path`` writes
``events.out.tfevents.<secs>.diagnose-compare`` into ``folder`` (a verify or sweep parent) and
removes the older ones of ours. Each child run already has its own event file, so
``tensorboard --logdir PARENT`` lists them as runs; this file adds one chart per figure with the
runs as its x axis (step ``i`` is the i-th run, the baseline at 0), and the text
``diagnose/compare``: the runs by index, the shift sentences and the comparison's tables.
Raises ImportError without the ``tensorboard`` package. Tags are listed in docs/tensorboard.md.
"""

from __future__ import annotations

import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from diagnose.analysis.compare import Comparison
from diagnose.renderers.comparison_text import rate_words, signed_points, speedup_text
from diagnose.renderers.tensorboard import PARTIAL_NAME, _text_summary
from diagnose.units import percent

EVENT_FILE_SUFFIX = ".diagnose-compare"
TEXT_TAG = "diagnose/compare"


def comparison_scalars(comparison: Comparison) -> list[tuple[int, str, float]]:
    """Every ``(run index, tag, value)`` the file holds."""
    out: list[tuple[int, str, float | None]] = []
    for i, run in enumerate(comparison.runs):
        out += [
            (i, f"compare/{comparison.rate_key}", run.throughput),
            (i, "compare/speedup", run.speedup),
            (i, "compare/mean_step_ms", run.mean_step_ms),
            (i, "compare/gpu_busy", run.gpu_busy),
        ]
        out += [(i, f"compare/exposed_{row.name}", row.shares[i]) for row in comparison.exposed]
    return [(i, tag, float(value)) for i, tag, value in out if value is not None]


def comparison_markdown(comparison: Comparison) -> str:
    c = comparison
    # the rates are means over the steps (steady when timed): the statistic verify and sweep compare
    lines = ["| step | run | mean " + rate_words(c.rate_key) + " | speedup | findings |", "|---|---|---|---|---|"]
    for i, run in enumerate(c.runs):
        rate = "" if run.throughput is None else f"{run.throughput:,.1f}"
        lines.append(
            f"| {i} | {run.label} | {rate} | {speedup_text(run.speedup)} | {', '.join(run.findings) or 'none'} |"
        )
    lines += ["", *[f"- **{run.label}**: {run.shift}" for run in c.runs[1:]], ""]
    lines += ["| what limits the step | " + " | ".join(c.labels) + " |", "|---" * (len(c.runs) + 1) + "|"]
    for row in c.exposed:
        cells = [
            ("—" if s is None else percent(s) + (f" ({signed_points(d)})" if i else ""))
            for i, (s, d) in enumerate(zip(row.shares, row.deltas, strict=True))
        ]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_comparison_events(comparison: Comparison, folder: Path) -> Path:
    wall_time = time.time()
    path = folder / f"events.out.tfevents.{int(wall_time):010d}{EVENT_FILE_SUFFIX}"
    partial = folder / PARTIAL_NAME  # TensorBoard reads any file named *tfevents*: write it aside first
    with partial.open("wb") as stream:
        writer = RecordWriter(stream)
        writer.write(event_pb2.Event(wall_time=wall_time, file_version="brain.Event:2").SerializeToString())
        for step, tag, value in comparison_scalars(comparison):
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
            writer.write(event_pb2.Event(wall_time=wall_time, step=step, summary=summary).SerializeToString())
        text = _text_summary(TEXT_TAG, comparison_markdown(comparison))
        writer.write(event_pb2.Event(wall_time=wall_time, step=0, summary=text).SerializeToString())
    partial.replace(path)
    for older in folder.glob(f"events.out.tfevents.*{EVENT_FILE_SUFFIX}"):
        if older != path:
            older.unlink()
    return path
