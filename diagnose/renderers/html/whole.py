"""The whole-run section of the page (``diagnose watch``): where the wall-clock went, as a table
and as a timeline (the buckets' shares over equal slices of the wall-clock, with the step time
drawn over it), beside the window's breakdown."""

from __future__ import annotations

from diagnose.renderers.html.charts import CHART_WIDTH, n, nice_ticks, rect, svg, y_axis
from diagnose.renderers.html.markup import Markup, el, section, swatch
from diagnose.renderers.view import ReportView
from diagnose.renderers.wholeview import WholeView
from diagnose.units import percent


def whole_run(view: ReportView) -> Markup | None:
    w = view.whole
    if w is None:
        return None
    head = el(
        "p",
        f"{w.wall_s:.1f} s of wall-clock, {w.steps} steps: goodput ",
        el("strong", percent(w.goodput)),
        f" (training steps' share); {percent(w.named_share)} of the wall-clock lands in a named bucket.",
    )
    rows = [
        el(
            "tr",
            el("td", swatch(f"w-{r.bucket}"), " ", r.label),
            el("td", f"{r.seconds:.2f} s", class_="num"),
            el("td", percent(r.share), class_="num"),
        )
        for r in w.rows
    ]
    table = el(
        "table",
        el("thead", el("tr", el("th", "where the wall-clock went"), el("th", "seconds"), el("th", "share"))),
        el("tbody", rows),
    )
    parts = [head, table, timeline_chart(w)]
    if w.job_goodput is not None:
        parts.append(
            el(
                "p",
                f"The job's goodput: {percent(w.job_goodput)} ("
                + ", ".join(f"rank {r.rank}: {percent(r.goodput)}" for r in w.ranks)
                + ").",
            )
        )
    if w.windows:
        items = [
            el("li", f"{reason}: steps {k}–{k + steps - 1}", f" ({trace})" if trace else "")
            for reason, k, steps, trace in w.windows
        ]
        parts.append(el("details", el("summary", f"{len(w.windows)} later profiled windows"), el("ul", items)))
    return section("The whole run", *parts, anchor="whole")


def timeline_chart(w: WholeView) -> Markup:
    """Columns over the wall-clock, each slice split by bucket share (bottom: most of the
    height); the step time (median per point, and the slowest dashed) drawn over them on its
    own axis (ms, right)."""
    height, left, right, top, bottom = 300, 64, 64, 26, 40
    plot_w, plot_h = CHART_WIDTH - left - right, height - top - bottom
    if not w.timeline:
        return el("p", "no timeline: the run was too short", class_="muted")
    t_start, t_end = w.timeline[0][0], w.timeline[-1][1]
    span = max(t_end - t_start, 1e-9)

    def x_of(t: float) -> float:
        return left + (t - t_start) / span * plot_w

    parts: list[Markup] = [
        y_axis([0.0, 0.25, 0.5, 0.75, 1.0], plot_h, left, top, plot_w, plot_h, "share", lambda v: f"{v:.0%}")
    ]
    for t0, t1, shares in w.timeline:
        y: float = top + plot_h
        for bucket, share in sorted(shares.items(), key=lambda kv: -kv[1]):
            if share <= 0:
                continue
            y -= share * plot_h
            parts.append(
                rect(
                    x_of(t0),
                    y,
                    max(0.5, x_of(t1) - x_of(t0)),
                    share * plot_h,
                    f"seg w-{bucket}",
                    f"{t0:.1f}–{t1:.1f} s · {bucket} {percent(share)}",
                )
            )
    if w.step_series:
        top_ms = nice_ticks(max(p[2] for p in w.step_series))[-1] or 1.0

        def y_of(v: float) -> float:
            return top + plot_h - min(v, top_ms) / top_ms * plot_h

        median = " ".join(f"{n(x_of(t))},{n(y_of(m))}" for t, m, _, _ in w.step_series)
        slowest = " ".join(f"{n(x_of(t))},{n(y_of(mx))}" for t, _, mx, _ in w.step_series)
        parts.append(el("polyline", points=slowest, class_="step-max"))
        parts.append(el("polyline", points=median, class_="step-line"))
        parts.append(el("text", f"step {top_ms:g} ms", x=n(left + plot_w + 6), y=n(top + 4), class_="tick"))
        parts.append(el("text", "0", x=n(left + plot_w + 6), y=n(top + plot_h + 4), class_="tick"))
    for tick in nice_ticks(span, 6):
        if tick <= span:
            parts.append(
                el(
                    "text",
                    f"{t_start + tick:g}",
                    x=n(x_of(t_start + tick)),
                    y=n(top + plot_h + 16),
                    class_="tick",
                    text_anchor="middle",
                )
            )
    parts.append(
        el(
            "text",
            "seconds from the script's start (step time: line, slowest dashed)",
            x=n(left + plot_w / 2),
            y=n(height - 4),
            class_="axis-title",
            text_anchor="middle",
        )
    )
    return svg(height, parts, "whole-timeline", "the whole run's wall-clock by bucket over time, with the step time")
