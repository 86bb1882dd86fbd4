"""The whole run (``diagnose watch``) as renderers read it: wall-clock by bucket, goodput, the
later windows, and the series of the timeline.

Contract: ``whole_view(report) -> WholeView | None``; pure. Built from the report's ``whole``
section (``diagnose.report.Whole``, filled by ``analysis/measure/wholerun.py``): the buckets in words,
largest first, and the series as tuples to draw; None for a run that was not watched.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.analysis.measure.wholerun import BUCKETS, LABELS
from diagnose.report import RankGoodput, Report


@dataclass(frozen=True)
class BucketRow:
    bucket: str
    label: str
    seconds: float
    share: float


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
    whole = report.whole
    if not whole:
        return None
    seconds, shares = whole.seconds, whole.shares
    rows = sorted(
        (
            BucketRow(b, LABELS.get(b, b), float(seconds.get(b, 0.0)), float(shares.get(b, 0.0)))
            for b in BUCKETS
            if seconds.get(b, 0.0) > 0
        ),
        key=lambda r: -r.seconds,
    )
    return WholeView(
        wall_s=float(whole.wall_s),
        goodput=float(whole.goodput),
        named_share=float(whole.named_share),
        steps=whole.steps,
        rows=tuple(rows),
        timeline=tuple((float(p.t0), float(p.t1), dict(p.shares)) for p in whole.timeline),
        step_series=tuple((float(a), float(b), float(c), int(k)) for a, b, c, k in whole.step_series),
        memory_series=tuple((float(t or 0.0), int(k or 0), h, g, w) for t, k, h, g, w in whole.memory_series),
        windows=tuple((w.reason, w.first_step, w.steps, w.trace) for w in whole.windows),
        ranks=tuple(whole.ranks or ()),
        job_goodput=whole.job_goodput,
    )
