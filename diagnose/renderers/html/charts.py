"""The page's charts, drawn here as inline SVG: per-step stacked columns, the median step's
strips, a sweep's bar charts, and the roofline. Inputs are the view's rows; output is ``Markup``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from diagnose.renderers.html.markup import Markup, el
from diagnose.renderers.view import Segment
from diagnose.report import ExperimentRow, Roofline, Step
from diagnose.units import count, ms, percent

CHART_WIDTH = 960
#: Width of one character of an 11 px chart label, to decide whether a label fits.
LABEL_CHAR_PX = 6.6
Formatter = Callable[[float], str]


def steps_chart(
    steps: tuple[Step, ...], categories: list[str], labels: dict[str, str], max_ms: float | None = None
) -> Markup:
    """Stacked columns, one per step, one segment per exposed category with time in that step.
    ``max_ms`` sets the axis (charts side by side share one scale), else the longest step."""
    height, left, right, top, bottom = 310, 64, 16, 26, 40
    plot_w, plot_h = CHART_WIDTH - left - right, height - top - bottom
    ticks = nice_ticks(max(max_ms or 0.0, *(step.duration_ms for step in steps)))
    scale = plot_h / ticks[-1]
    slot = plot_w / len(steps)
    bar_w = min(slot * 0.7, 56)
    label_every = math.ceil(len(steps) / 30)
    parts: list[Markup] = [y_axis(ticks, scale, left, top, plot_w, plot_h, "ms")]
    for i, step in enumerate(steps):
        x = left + slot * i + (slot - bar_w) / 2
        y: float = top + plot_h
        for cat in categories:
            step_ms = step.exposed_ms[cat]
            if step_ms <= 0:
                continue
            y -= step_ms * scale
            tip = f"step {step.number} · {labels[cat]}: {ms(step_ms)} ({percent(step_ms / step.duration_ms)})"
            parts.append(rect(x, y, bar_w, step_ms * scale, f"seg c-{cat}", tip, category=cat))
        if i % label_every == 0:
            parts.append(
                el("text", step.number, x=n(x + bar_w / 2), y=n(top + plot_h + 16), class_="tick", text_anchor="middle")
            )
    parts.append(
        el("text", "profiled step", x=n(left + plot_w / 2), y=n(height - 4), class_="axis-title", text_anchor="middle")
    )
    return svg(height, parts, "steps-chart", "step time per profiled step, by exposed category")


def strip(segments: tuple[Segment, ...], total_ms: float, title: str) -> Markup:
    """One horizontal bar: segments proportional to their time, coloured by category or phase."""
    height, bar_top, bar_h = 58, 20, 30
    parts = [el("text", title, x="0", y="13", class_="strip-title")]
    x = 0.0
    for segment in segments:
        if segment.ms <= 0:
            continue
        colour_class = f"{'c' if segment.kind == 'exposed' else 'p'}-{segment.name}"
        share = percent(segment.ms / total_ms)
        width = segment.ms / total_ms * CHART_WIDTH
        parts.append(
            rect(x, bar_top, width, bar_h, f"strip-seg {colour_class}", f"{segment.label}: {ms(segment.ms)} ({share})")
        )
        text = fit_label(f"{segment.label} {share}", share, width)
        if text:
            parts.append(
                el("text", text, x=n(x + 6), y=n(bar_top + bar_h / 2 + 4), class_=f"seg-label on-{colour_class}")
            )
        x += width
    return svg(height, parts, "strip", title)


def fit_label(long: str, short: str, width: float) -> str | None:
    """The longest of the two labels that fits in ``width`` pixels at the chart's font size."""
    for text in (long, short):
        if len(text) * LABEL_CHAR_PX + 12 <= width:
            return text
    return None


@dataclass(frozen=True)
class SweepMetric:
    """One bar chart of a sweep: which row figure, how to print it, and what to draw with it."""

    key: str
    title: str
    fmt: Formatter
    limit: float | None = None  # drawn as a dashed line (the device's memory)
    with_speedup: bool = False


def bar_chart(rows: Sequence[ExperimentRow], metric: SweepMetric) -> Markup:
    """One bar per experiment row; a row that failed or ran out of memory gets a red marker."""
    plot_h, left, right, top = 212, 72, 16, 28
    plot_w = CHART_WIDTH - left - right
    slot = plot_w / len(rows)
    longest = max(len(row.label) for row in rows)
    rotate = longest * LABEL_CHAR_PX > slot
    # rotated labels hang below the axis at -35 degrees: sin(35) of their length
    bottom = 24 + int(longest * LABEL_CHAR_PX * 0.57) if rotate else 40
    values = [v for row in rows if (v := row.figure(metric.key)) is not None and not row.failed]
    ticks = nice_ticks(max([*values, metric.limit or 0]))
    scale = plot_h / ticks[-1]
    bar_w = min(slot * 0.6, 72)
    parts = [
        el("text", metric.title, x="0", y="14", class_="strip-title"),
        y_axis(ticks, scale, left, top, plot_w, plot_h, "", metric.fmt),
    ]
    for i, row in enumerate(rows):
        x = left + slot * i + (slot - bar_w) / 2
        parts.append(_bar(row, metric, x, bar_w, top + plot_h, plot_h, scale))
        label_x, label_y = n(x + bar_w / 2), n(top + plot_h + 16)
        turn = (
            {"text_anchor": "end", "transform": f"rotate(-35 {label_x} {label_y})"}
            if rotate
            else {"text_anchor": "middle"}
        )
        parts.append(el("text", row.label, x=label_x, y=label_y, class_="tick", **turn))
    if metric.limit:
        y = top + plot_h - metric.limit * scale
        parts.append(el("line", x1=n(left), x2=n(left + plot_w), y1=n(y), y2=n(y), class_="limit"))
        parts.append(
            el("text", f"capacity {metric.fmt(metric.limit)}", x=n(left + 4), y=n(y - 5), class_="limit-label")
        )
    return svg(top + plot_h + bottom, parts, f"bar-chart chart-{metric.key}", metric.title)


def _bar(
    row: ExperimentRow, metric: SweepMetric, x: float, width: float, base: float, plot_h: float, scale: float
) -> Markup:
    if row.failed:
        return el(
            "g",
            rect(x, base - plot_h, width, plot_h, f"bar-failed status-{row.status}", f"{row.label}: {row.status}"),
            el(
                "text",
                "OOM" if row.status == "oom" else row.status,
                x=n(x + width / 2),
                y=n(base - 8),
                class_="failed-label",
                text_anchor="middle",
            ),
            class_="bar",
        )
    value = row.figure(metric.key)
    if value is None:
        return el("text", "not measured", x=n(x + width / 2), y=n(base - 8), class_="tick", text_anchor="middle")
    text = metric.fmt(value)
    if metric.with_speedup and row.reference:
        text += " · reference"
    elif metric.with_speedup and row.speedup:
        text += f" · {row.speedup:.2f}x"
    return el(
        "g",
        rect(x, base - value * scale, width, value * scale, "bar-ok", f"{row.label}: {text}"),
        el("text", text, x=n(x + width / 2), y=n(base - value * scale - 5), class_="bar-value", text_anchor="middle"),
        class_="bar",
    )


# --- SVG helpers ---------------------------------------------------------------------------------


def nice_ticks(maximum: float, count: int = 5) -> list[float]:
    """Round axis ticks from 0 to at least ``maximum`` (steps of 1, 2 or 5 times a power of ten)."""
    raw = maximum / count if maximum > 0 else 1.0
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [step * i for i in range(math.ceil(maximum / step - 1e-9) + 1 if maximum > 0 else 2)]


def y_axis(
    ticks: list[float],
    scale: float,
    left: float,
    top: float,
    plot_w: float,
    plot_h: float,
    unit: str,
    fmt: Formatter | None = None,
) -> Markup:
    parts = []
    for tick in ticks:
        y = top + plot_h - tick * scale
        text = fmt(tick) if fmt else f"{tick:g}"
        parts.append(el("line", x1=n(left), x2=n(left + plot_w), y1=n(y), y2=n(y), class_="grid-line"))
        parts.append(el("text", text, x=n(left - 8), y=n(y + 4), class_="tick", text_anchor="end"))
    if unit:
        parts.append(el("text", unit, x=n(left - 8), y=n(top - 14), class_="axis-title", text_anchor="end"))
    return el("g", parts, class_="axis")


def rect(
    x: float, y: float, width: float, height: float, css_class: str, tip: str, category: str | None = None
) -> Markup:
    return el(
        "rect",
        el("title", tip),
        x=n(x),
        y=n(y),
        width=n(width),
        height=n(height),
        class_=css_class,
        data_category=category,
    )


def svg(height: float, parts: list[Markup], css_class: str, label: str) -> Markup:
    return el(
        "svg",
        parts,
        xmlns="http://www.w3.org/2000/svg",
        viewBox=f"0 0 {CHART_WIDTH} {n(height)}",
        class_=f"chart {css_class}",
        role="img",
        aria_label=label,
    )


def n(value: float) -> str:
    """An SVG coordinate: one decimal at most, no trailing zeros."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


# --- the roofline ----------------------------------------------------------------------------------


def _decades(low: float, high: float) -> list[float]:
    """Powers of ten from below ``low`` to above ``high``: the ticks of a log axis."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    if last == first:
        last += 1
    return [10.0**e for e in range(first, last + 1)]


def roofline_chart(roofline: Roofline) -> Markup:
    """Log-log: arithmetic intensity (FLOPs per byte) across, TFLOP/s up; the memory roof
    (intensity x bandwidth) meets the compute roof (the dtype's dense peak) at the ridge point;
    one dot per kernel class, its area proportional to its share of kernel time."""
    height, left, right, top, bottom = 360, 72, 24, 28, 44
    plot_w, plot_h = CHART_WIDTH - left - right, height - top - bottom
    # a roofline is drawn only with both roofs known (the limits section has none otherwise)
    peak, ridge = float(roofline.peak_tflops or 0.0), roofline.ridge
    memory_gbs = float(roofline.memory_gbs or 1.0)
    intensities = [d.intensity for d in roofline.points] + [ridge]
    rates = [d.tflops for d in roofline.points if d.tflops > 0] + [peak]
    xs = _decades(min(intensities) / 3, max(intensities) * 3)
    ys = _decades(min(rates) / 3, peak * 1.5)

    def x_of(intensity: float) -> float:
        return left + (math.log10(intensity) - math.log10(xs[0])) / (math.log10(xs[-1]) - math.log10(xs[0])) * plot_w

    def y_of(tflops: float) -> float:
        return (
            top + plot_h - (math.log10(tflops) - math.log10(ys[0])) / (math.log10(ys[-1]) - math.log10(ys[0])) * plot_h
        )

    parts: list[Markup] = []
    for tick in xs:
        x = x_of(tick)
        parts.append(el("line", x1=n(x), x2=n(x), y1=n(top), y2=n(top + plot_h), class_="grid-line"))
        parts.append(el("text", f"{tick:g}", x=n(x), y=n(top + plot_h + 16), class_="tick", text_anchor="middle"))
    for tick in ys:
        y = y_of(tick)
        parts.append(el("line", x1=n(left), x2=n(left + plot_w), y1=n(y), y2=n(y), class_="grid-line"))
        parts.append(el("text", f"{tick:g}", x=n(left - 8), y=n(y + 4), class_="tick", text_anchor="end"))
    parts.append(el("text", "TFLOP/s", x=n(left - 8), y=n(top - 12), class_="axis-title", text_anchor="end"))
    parts.append(
        el(
            "text",
            "FLOPs per byte moved (arithmetic intensity)",
            x=n(left + plot_w / 2),
            y=n(height - 6),
            class_="axis-title",
            text_anchor="middle",
        )
    )
    # the roofs: memory-bound up to the ridge, compute-bound after it
    start = max(xs[0], ys[0] * 1e12 / (memory_gbs * 1e9))
    roof = [(start, start * memory_gbs * 1e9 / 1e12), (ridge, peak), (xs[-1], peak)]
    points = " ".join(f"{n(x_of(i))},{n(y_of(t))}" for i, t in roof)
    parts.append(
        el(
            "polyline",
            el("title", f"roof: {memory_gbs:g} GB/s up to {ridge:.0f} FLOP/byte, then {peak:g} TFLOP/s"),
            points=points,
            class_="roof",
        )
    )
    parts.append(
        el(
            "text",
            f"{peak:g} TFLOP/s {roofline.dtype or ''} peak",
            x=n(x_of(xs[-1]) - 4),
            y=n(y_of(peak) - 6),
            class_="limit-label",
            text_anchor="end",
        )
    )
    parts.append(
        el(
            "text",
            f"{memory_gbs:g} GB/s",
            x=n(x_of(start) + 6),
            y=n(y_of(roof[0][1]) - 6),
            class_="limit-label",
        )
    )
    for dot in roofline.points:
        x, y = x_of(dot.intensity), y_of(max(dot.tflops, ys[0]))
        radius = 4 + 14 * math.sqrt(max(dot.time_share, 0.0))
        tip = (
            f"{dot.kind}: {count(dot.tflops)} TFLOP/s at {count(dot.intensity)} FLOP/byte, {dot.bound}-bound, "
            f"{percent(dot.tflops / dot.roof_tflops if dot.roof_tflops else 0, 0)} of its roof, {percent(dot.time_share, 0)} of kernel time"
        )
        parts.append(
            el(
                "circle",
                el("title", tip),
                cx=n(x),
                cy=n(y),
                r=n(radius),
                class_=f"dot k-{dot.kind}",
                data_class=dot.kind,
            )
        )
        parts.append(el("text", dot.kind, x=n(x + radius + 4), y=n(y + 4), class_="dot-label"))
    return svg(height, parts, "roofline", "roofline: kernel classes against this GPU's compute and memory roofs")
