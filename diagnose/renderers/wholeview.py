"""The whole run (``diagnose watch``) as renderers read it: wall-clock by bucket, goodput, the
later windows, and the series of the timeline.

Contract: ``whole_view(report) -> WholeView | None``; pure. Built from the report's ``whole``
section (``analysis/measure/wholerun.py``); None for a run that was not watched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagnose.analysis.report import Report
from diagnose.analysis.measure.wholerun import BUCKETS, LABELS


@dataclass(frozen=True)
class BucketRow:
    bucket: str
    label: str
    seconds: float
    share: float


@dataclass(frozen=True)
class RankGoodput:
    rank: int
    goodput: float
    wall_s: float


@dataclass(frozen=True)
class WholeView:
    wall_s: float
    goodput: float
    named_share: float
    steps: int
    #: the buckets that took any time, largest first
    rows: tuple[BucketRow, ...]
    #: ``(t0, t1, {bucket: share})`` over equal slices of the wall-clock
    timeline: tuple[tuple[float, float, dict[str, float]], ...]
    #: ``(t, median_ms, max_ms, first_step)`` of the steps
    step_series: tuple[tuple[float, float, float, int], ...]
    #: ``(t, steps, host_gb, gpu_gb, data_wait_share)`` twice a second at most
    memory_series: tuple[tuple[float, int, float | None, float | None, float | None], ...]
    #: later profiled windows: ``(reason, first_step, steps, trace)``
    windows: tuple[tuple[str, int, int, str | None], ...]
    ranks: tuple[RankGoodput, ...] = ()
    job_goodput: float | None = None


def whole_view(report: Report) -> WholeView | None:
    whole: dict[str, Any] | None = report.whole
    if not whole:
        return None
    seconds = whole.get("seconds", {})
    shares = whole.get("shares", {})
    rows = sorted(
        (BucketRow(b, LABELS.get(b, b), float(seconds.get(b, 0.0)), float(shares.get(b, 0.0))) for b in BUCKETS if seconds.get(b, 0.0) > 0),
        key=lambda r: -r.seconds,
    )
    return WholeView(
        wall_s=float(whole.get("wall_s", 0.0)),
        goodput=float(whole.get("goodput", 0.0)),
        named_share=float(whole.get("named_share", 0.0)),
        steps=int(whole.get("steps", 0)),
        rows=tuple(rows),
        timeline=tuple((float(p["t0"]), float(p["t1"]), dict(p["shares"])) for p in whole.get("timeline", [])),
        step_series=tuple((float(a), float(b), float(c), int(k)) for a, b, c, k in whole.get("step_series", [])),
        memory_series=tuple((float(t), int(k), h, g, w) for t, k, h, g, w in whole.get("memory_series", [])),
        windows=tuple((w.get("reason", ""), int(w.get("first_step", 0)), int(w.get("steps", 0)), w.get("trace")) for w in whole.get("windows", [])),
        ranks=tuple(RankGoodput(int(r["rank"]), float(r["goodput"]), float(r["wall_s"])) for r in whole.get("ranks", [])),
        job_goodput=whole.get("job_goodput"),
    )
