"""report.html: the whole report as one self-contained page, charts included.

Contract: ``HTMLRenderer().render(report) -> str`` is a complete HTML document with inline CSS and
inline SVG charts drawn here, in Python. It holds no script and loads nothing: a
Content-Security-Policy forbids scripts and every external resource, so the page opens offline,
can be attached to a ticket, and cannot run anything that a trace smuggled in. Every string from
a trace, a script or a rule file goes through ``el()``, which escapes all text and attribute
values; only ``Markup`` built by this module is inserted as is.

It renders every report: a GPU or CPU-only run, one that failed before the profiled window
(``breakdown`` is None: the status, the error and what was recorded), and one with a sweep.
Colours are the terminal renderer's ``STYLES``, as rich prints them when it exports a terminal.
"""

from __future__ import annotations

import html
import math
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rich.color import Color
from rich.terminal_theme import SVG_EXPORT_THEME

from diagnose.analysis.breakdown import EXPOSED, PHASES
from diagnose.renderers.base import Renderer
from diagnose.renderers.terminal import STEP_MODES, STYLES
from diagnose.analysis.report import PHASE_LABELS, Report
from diagnose.analysis.rules import human_bytes

#: The colour of each exposed category: the terminal's, as rich renders it in its SVG export.
CATEGORY_COLOURS = {cat: Color.parse(style).get_truecolor(SVG_EXPORT_THEME).hex for cat, (style, _) in STYLES.items()}
#: Host phases take the colour of the exposed category the host is in during that phase.
PHASE_COLOURS = {
    "data_wait": CATEGORY_COLOURS["data_wait"],
    "h2d_copy": CATEGORY_COLOURS["h2d_copy"],
    "forward": CATEGORY_COLOURS["host_forward"],
    "backward": CATEGORY_COLOURS["host_backward"],
    "optimizer": CATEGORY_COLOURS["host_optimizer"],
    "other": CATEGORY_COLOURS["host_other"],
}
CSP = "default-src 'none'; style-src 'unsafe-inline'"
CHART_WIDTH = 960
#: Width of one character of an 11 px chart label, to decide whether a label fits.
LABEL_CHAR_PX = 6.6
FAILED_STATES = ("oom", "failed")
VOID_ELEMENTS = frozenset({"meta"})
Formatter = Callable[[float], str]


class HTMLRenderer(Renderer):
    output_name = "report.html"

    def render(self, report: Report) -> str:
        sections = [
            _verdict(report),
            _status(report),
            _throughput_and_memory(report),
            *(_breakdown_sections(report) if report.breakdown else [_nothing_profiled(report)]),
            _ranks(report),
            _findings(report),
            _experiments(report),
            _configuration(report),
            _warnings(report),
        ]
        body = el("main", _header(report), *sections, _footer(report))
        head = el(
            "head",
            el("meta", charset="utf-8"),
            el("meta", http_equiv="Content-Security-Policy", content=CSP),
            el("meta", name="viewport", content="width=device-width, initial-scale=1"),
            el("title", f"diagnose · {_run_name(report)}"),
            el("style", Markup(_stylesheet())),
        )
        return "<!DOCTYPE html>\n" + el("html", head, el("body", body), lang="en") + "\n"


# --- safe HTML building ---------------------------------------------------------------------------


class Markup(str):
    """HTML built by this module: inserted as is. Anything else is escaped."""


def el(tag: str, *children: Any, **attrs: Any) -> Markup:
    """One element. Text children and every attribute value are escaped; ``Markup`` children and
    lists of them are kept. ``class_`` is ``class``; other underscores become dashes."""
    attr_text = "".join(_attribute(name, value) for name, value in attrs.items() if value is not None and value is not False)
    if tag in VOID_ELEMENTS:
        return Markup(f"<{tag}{attr_text}>")
    return Markup(f"<{tag}{attr_text}>{_content(children)}</{tag}>")


def _attribute(name: str, value: Any) -> str:
    name = name.rstrip("_").replace("_", "-")
    return f" {name}" if value is True else f' {name}="{html.escape(str(value), quote=True)}"'


def _content(children: Iterable[Any]) -> str:
    parts = []
    for child in children:
        if child is None:
            continue
        if isinstance(child, Markup):
            parts.append(child)
        elif isinstance(child, (list, tuple)):
            parts.append(_content(child))
        else:
            parts.append(html.escape(str(child), quote=True))
    return "".join(parts)


def _section(title: str, *children: Any, anchor: str) -> Markup:
    return el("section", el("h2", title), *children, id=anchor)


def _kv_table(rows: Iterable[tuple[str, Any]]) -> Markup:
    """A two-column table of settings; values shown as ``_value`` prints them."""
    return el("table", el("tbody", [el("tr", el("th", key), el("td", _value(value))) for key, value in rows]), class_="kv")


def _records_table(records: list[dict[str, Any]]) -> Markup:
    """One row per record, one column per key any record has."""
    keys = list(dict.fromkeys(key for record in records for key in record))
    header = el("tr", [el("th", key) for key in keys])
    rows = [el("tr", [el("td", _value(record.get(key))) for key in keys]) for record in records]
    return el("table", el("thead", header), el("tbody", rows), class_="grid")


def _swatch(colour_class: str) -> Markup:
    return el("span", "", class_=f"swatch {colour_class}")


# --- number formatting ------------------------------------------------------------------------------


def _value(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_value(v) for v in value) or "—"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_value(v)}" for k, v in value.items()) or "—"
    return str(value)


def _ms(value: float) -> str:
    digits = 0 if value >= 100 else 1 if value >= 10 else 2 if value >= 1 else 3
    return f"{value:.{digits}f} ms"


def _pct(share: float) -> str:
    return f"{share * 100:.1f}%"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 or value == 0 else f"{value:.2f}"


# --- header, verdict, status ---------------------------------------------------------------------


def _run_name(report: Report) -> str:
    target = (report.run or {}).get("target") or {}
    name = target.get("value") or report.source.get("trace") or report.source.get("run_dir") or "report"
    return str(name).rsplit("/", 1)[-1] if target.get("kind") != "module" else str(name)


def _device_line(report: Report) -> str:
    env = report.environment
    if (report.breakdown and not report.on_gpu) or env.get("device") == "cpu":
        device = f"CPU only, no GPU used ({env.get('cpu_count', '?')} cores)"
    else:
        device = str(env.get("device_name") or "device unknown")
    versions = [
        f"{name} {env[key]}" for key, name in (("torch", "torch"), ("python", "Python"), ("driver", "driver")) if env.get(key)
    ]
    return " · ".join([device, *versions])


def _header(report: Report) -> Markup:
    nav = [el("a", title, href=f"#{anchor}") for anchor, title in _nav_entries(report)]
    return el(
        "header",
        el("p", "diagnose report", class_="eyebrow"),
        el("h1", _run_name(report)),
        el("p", _device_line(report), class_="sub"),
        el("nav", nav),
    )


def _nav_entries(report: Report) -> list[tuple[str, str]]:
    entries = [("throughput", "Throughput")]
    if report.breakdown:
        entries += [("steps", "Step time"), ("median-step", "One step")]
    if report.distributed:
        entries.append(("ranks", "Ranks"))
    entries.append(("findings", "Findings"))
    if report.experiments:
        entries.append(("experiments", str(report.experiments.get("kind", "sweep")).capitalize()))
    entries.append(("configuration", "Configuration"))
    if report.warnings:
        entries.append(("warnings", "Notes"))
    return entries


def _verdict(report: Report) -> Markup:
    text = report.verdict or "Nothing to diagnose: no profiled step."
    tone = "good" if report.healthy else "bad" if report.breakdown else "warn"
    return el("div", el("p", text), class_=f"verdict {tone}")


def _status(report: Report) -> Markup:
    status = report.status or {}
    state = str(status.get("state", "unknown"))
    tone = "good" if state in ("completed", "stopped", "trace") else "bad"
    lines = [el("p", el("span", state, class_=f"pill {tone}"), " ", status.get("message", ""))]
    mode = (report.run or {}).get("step_mode")
    if mode:
        lines.append(el("p", f"Steps counted at each {STEP_MODES.get(mode, mode)}.", class_="muted"))
    error = status.get("error")
    if error:
        if str(error.get("message", "")) not in str(status.get("message", "")):
            lines.append(el("p", el("strong", f"{error.get('type', 'error')}: "), error.get("message", "")))
        if error.get("traceback"):
            lines.append(el("details", el("summary", "traceback"), el("pre", el("code", error["traceback"]))))
    return el("div", lines, class_="status")


# --- throughput and memory ------------------------------------------------------------------------


def _throughput_and_memory(report: Report) -> Markup:
    throughput = report.throughput or {}
    cards = [
        _timing_card("Steady state", "profiler off: the real speed", throughput.get("steady")),
        _timing_card("Profiled window", "profiler on: the steps analysed below", throughput.get("profiled")),
        _memory_card(report),
    ]
    cards = [card for card in cards if card]
    notes = [] if cards else [el("p", "No step was timed.", class_="muted")]
    if throughput.get("batch_size"):
        notes.append(el("p", f"Batch: {throughput['batch_size']:g} samples per step (found from the data).", class_="muted"))
    if throughput.get("note"):
        notes.append(el("p", throughput["note"], class_="note"))
    return _section("Throughput and memory", el("div", cards, class_="cards"), notes, anchor="throughput")


def _timing_card(title: str, subtitle: str, timing: dict[str, Any] | None) -> Markup | None:
    if not timing or not timing.get("steps"):
        return None
    samples = timing.get("samples_per_s")
    headline = f"{_rate(samples)} samples/s" if samples else f"{_rate(timing['steps_per_s'])} steps/s"
    details = [
        f"{_rate(timing['steps_per_s'])} steps/s" if samples else None,
        f"median {_ms(timing['median_step_ms'])} per step (p90 {_ms(timing['p90_step_ms'])})",
        f"{timing['steps']} steps",
    ]
    return el(
        "div",
        el("h3", title),
        el("p", subtitle, class_="muted"),
        el("p", headline, class_="big"),
        el("p", " · ".join(d for d in details if d)),
        class_="card",
    )


def _memory_card(report: Report) -> Markup | None:
    memory = report.memory or {}
    capacity = memory.get("capacity_bytes")
    reserved, allocated = memory.get("peak_reserved_bytes"), memory.get("peak_allocated_bytes")
    if reserved is None or not capacity:
        if capacity:
            text = f"Device capacity {human_bytes(capacity)}; peak use not measured (a trace analysed on its own)."
        elif report.breakdown and not report.on_gpu:
            text = "No GPU memory figures: a CPU-only run."
        else:
            return None
        return el("div", el("h3", "GPU memory"), el("p", text, class_="muted"), class_="card")
    share = reserved / capacity
    meter = el(
        "svg",
        el("rect", width="100%", height="10", rx="5", class_="meter-track"),
        el("rect", width=_pct(min(share, 1.0)), height="10", rx="5", class_="meter-fill"),
        el("title", f"{_pct(share)} of {human_bytes(capacity)} reserved at peak"),
        class_="meter",
        width="100%",
        height="10",
    )
    return el(
        "div",
        el("h3", "GPU memory"),
        el("p", "peak over the run, reserved by the caching allocator", class_="muted"),
        el("p", f"{human_bytes(reserved)} of {human_bytes(capacity)}", class_="big"),
        meter,
        el("p", f"{_pct(share)} reserved · {human_bytes(allocated or 0)} allocated"),
        class_="card",
    )


# --- the breakdown: per-step chart, the median step, tables -----------------------------------------


def _breakdown_sections(report: Report) -> list[Markup]:
    breakdown = report.breakdown or {}
    steps = breakdown["steps"]
    present = [c for c in EXPOSED if any(step["exposed_ms"][c] > 0 for step in steps)]
    return [
        _section(
            "Where the step time goes",
            el(
                "p",
                f"{_steps_chart_intro(report)} {len(steps)} steps, median {_ms(breakdown['window']['median_step_ms'])}.",
                class_="muted",
            ),
            _steps_chart(steps, present, report.exposed_labels()),
            _exposed_table(report, present),
            _gpu_counters(report),
            anchor="steps",
        ),
        _median_step_section(report, present),
    ]


def _steps_chart_intro(report: Report) -> str:
    if report.on_gpu:
        return (
            "Each bar is one profiled step, split by what limited it: time the GPU sat idle waiting for the host "
            "in warm colours, GPU work in greens and blues."
        )
    return "Each bar is one profiled step, split by what the host was doing (a CPU-only run: the host is the device)."


def _steps_chart(steps: list[dict[str, Any]], categories: list[str], labels: dict[str, str]) -> Markup:
    """Stacked columns, one per step, one segment per exposed category with time in that step."""
    height, left, right, top, bottom = 310, 64, 16, 26, 40
    plot_w, plot_h = CHART_WIDTH - left - right, height - top - bottom
    ticks = nice_ticks(max(step["duration_ms"] for step in steps))
    scale = plot_h / ticks[-1]
    slot = plot_w / len(steps)
    bar_w = min(slot * 0.7, 56)
    label_every = math.ceil(len(steps) / 30)
    parts: list[Markup] = [_y_axis(ticks, scale, left, top, plot_w, plot_h, "ms")]
    for i, step in enumerate(steps):
        x = left + slot * i + (slot - bar_w) / 2
        y = top + plot_h
        for cat in categories:
            ms = step["exposed_ms"][cat]
            if ms <= 0:
                continue
            y -= ms * scale
            tip = f"step {step['number']} · {labels[cat]}: {_ms(ms)} ({_pct(ms / step['duration_ms'])})"
            parts.append(_rect(x, y, bar_w, ms * scale, f"seg c-{cat}", tip, category=cat))
        if i % label_every == 0:
            parts.append(
                el("text", step["number"], x=_n(x + bar_w / 2), y=_n(top + plot_h + 16), class_="tick", text_anchor="middle")
            )
    parts.append(
        el("text", "profiled step", x=_n(left + plot_w / 2), y=_n(height - 4), class_="axis-title", text_anchor="middle")
    )
    return _svg(height, parts, "steps-chart", "step time per profiled step, by exposed category")


def _exposed_table(report: Report, categories: list[str]) -> Markup:
    window = report.breakdown["window"]  # type: ignore[index]
    labels = report.exposed_labels()
    rows = [
        el(
            "tr",
            el("td", _swatch(f"c-{cat}")),
            el("td", labels[cat]),
            el("td", _ms(window["median_ms"]["exposed"][cat]), class_="num"),
            el("td", _pct(window["exposed_share"][cat]), class_="num"),
            class_="legend-row",
            data_category=cat,
        )
        for cat in categories
    ]
    header = el(
        "tr",
        el("th", ""),
        el("th", "exposed: what limits the step"),
        el("th", "median per step", class_="num"),
        el("th", "share of the window", class_="num"),
    )
    return el("table", el("thead", header), el("tbody", rows), class_="grid legend")


def _gpu_counters(report: Report) -> Markup | None:
    if not report.on_gpu:
        return None
    window = report.breakdown["window"]  # type: ignore[index]
    h2d = window.get("h2d_bytes_per_step") or {}
    chips = [
        f"GPU busy {_pct(window['gpu_busy_share'])}",
        f"{window['kernels_per_step']:g} kernels/step",
        f"median kernel {window['median_kernel_us']:.1f} µs" if window.get("median_kernel_us") is not None else None,
        f"H2D {human_bytes(h2d['pageable'])}/step pageable" if h2d.get("pageable") else None,
        f"H2D {human_bytes(h2d['pinned'])}/step pinned" if h2d.get("pinned") else None,
        f"{window['syncs_per_step']:g} syncs/step" if window.get("syncs_per_step") else None,
    ]
    return el("p", [el("span", chip, class_="chip") for chip in chips if chip], class_="chips")


def median_step(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The step whose duration is the median (the lower one of two for an even count)."""
    ordered = sorted(steps, key=lambda step: step["duration_ms"])
    return ordered[(len(ordered) - 1) // 2]


def _median_step_section(report: Report, categories: list[str]) -> Markup:
    timeline = report.breakdown.get("median_step_timeline")  # type: ignore[union-attr]
    if timeline:
        return _timeline_section(report, timeline)
    step = median_step(report.breakdown["steps"])  # type: ignore[index]
    labels = report.exposed_labels()
    exposed = [(f"c-{cat}", labels[cat], step["exposed_ms"][cat]) for cat in categories]
    phases = [(f"p-{phase}", PHASE_LABELS[phase], step["phases_ms"][phase]) for phase in PHASES]
    caption = (
        f"Step {step['number']}, the median step ({_ms(step['duration_ms'])}). Each strip shows the total time per "
        "category within that step, laid side by side in a fixed order: it is not a time-ordered trace. "
        "For the order of events, open the trace in Perfetto (docs/html-report.md says how)."
    )
    return _section(
        "One step, by category",
        el(
            "figure",
            _strip(exposed, step["duration_ms"], "what limits the step"),
            _strip(phases, step["duration_ms"], "host thread phases"),
            el("figcaption", caption),
        ),
        _phase_table(report),
        anchor="median-step",
    )


def _timeline_section(report: Report, timeline: dict[str, Any]) -> Markup:
    """The median step in time order: what limited it and what the host did, slice by slice."""
    total_ms = timeline["duration_us"] / 1000
    slice_ms = total_ms / timeline["bins"]
    labels = report.exposed_labels()
    exposed = [(f"c-{cat}", labels.get(cat, cat), n * slice_ms) for cat, n in timeline["exposed"]]
    phases = [(f"p-{phase}", PHASE_LABELS.get(phase, phase), n * slice_ms) for phase, n in timeline["phases"]]
    caption = (
        f"Step {timeline['step']}, the median step ({_ms(total_ms)}), from its start (left) to its end (right), in "
        f"{timeline['bins']} slices of {_ms(slice_ms)}: each slice shows what filled most of it. Top: GPU busy "
        "(greens) or idle and why (warm colours). Bottom: what the host thread was doing."
    )
    return _section(
        "One step, in time order",
        el(
            "figure",
            _strip(exposed, total_ms, "what limits the step"),
            _strip(phases, total_ms, "host thread phases"),
            el("figcaption", caption),
        ),
        _phase_table(report),
        anchor="median-step",
    )


def _strip(segments: list[tuple[str, str, float]], total_ms: float, title: str) -> Markup:
    """One horizontal bar: ``(colour class, label, ms)`` segments proportional to their time."""
    height, bar_top, bar_h = 58, 20, 30
    parts = [el("text", title, x="0", y="13", class_="strip-title")]
    x = 0.0
    for colour_class, label, ms in segments:
        if ms <= 0:
            continue
        width = ms / total_ms * CHART_WIDTH
        parts.append(_rect(x, bar_top, width, bar_h, f"strip-seg {colour_class}", f"{label}: {_ms(ms)} ({_pct(ms / total_ms)})"))
        text = _fit_label(f"{label} {_pct(ms / total_ms)}", _pct(ms / total_ms), width)
        if text:
            parts.append(el("text", text, x=_n(x + 6), y=_n(bar_top + bar_h / 2 + 4), class_=f"seg-label on-{colour_class}"))
        x += width
    return _svg(height, parts, "strip", title)


def _fit_label(long: str, short: str, width: float) -> str | None:
    """The longest of the two labels that fits in ``width`` pixels at the chart's font size."""
    for text in (long, short):
        if len(text) * LABEL_CHAR_PX + 12 <= width:
            return text
    return None


def _phase_table(report: Report) -> Markup:
    window = report.breakdown["window"]  # type: ignore[index]
    header = [
        el("th", ""),
        el("th", "host thread phase"),
        el("th", "median per step", class_="num"),
        el("th", "share", class_="num"),
    ]
    if report.on_gpu:
        header.append(el("th", "hidden behind GPU work", class_="num"))
    rows = []
    for phase in PHASES:
        cells = [
            el("td", _swatch(f"p-{phase}")),
            el("td", PHASE_LABELS[phase]),
            el("td", _ms(window["median_ms"]["phases"][phase]), class_="num"),
            el("td", _pct(window["phase_share"][phase]), class_="num"),
        ]
        if report.on_gpu:
            cells.append(el("td", _pct(window["hidden_share"][phase]), class_="num"))
        rows.append(el("tr", cells))
    return el("table", el("thead", el("tr", header)), el("tbody", rows), class_="grid legend")


def _ranks(report: Report) -> Markup | str:
    """A distributed run: every rank side by side, and the straggler if there is one."""
    d = report.distributed
    if not d:
        return ""
    columns = [
        ("rank", "rank", "{}"), ("status", "status", "{}"), ("median_step_ms", "step", "{:.2f} ms"),
        ("data_wait_ms", "data wait (exposed)", "{:.2f} ms"), ("communication_ms", "communication kernels", "{:.2f} ms"),
        ("exposed_communication_share", "communication exposed", "{:.0%}"), ("gpu_busy", "GPU busy", "{:.0%}"),
        ("samples_per_step", "samples per step", "{:g}"), ("top_exposed", "largest exposed share", "{}"),
    ]
    header = el("tr", [el("th", title) for _, title, _ in columns])
    rows = [
        el("tr", [el("td", "-" if row.get(key) is None else fmt.format(row[key])) for key, _, fmt in columns])
        for row in d.get("ranks", [])
    ]
    parts: list[Any] = [
        el("p", f"{d.get('world_size')} ranks; the breakdown above is the first rank's.", class_="muted"),
        el("table", el("thead", header), el("tbody", rows), class_="grid"),
    ]
    lagging = d.get("straggler")
    if lagging and (lagging.get("excess_share") or 0) >= 0.1:
        parts.append(
            el(
                "p",
                el("strong", f"Straggler: rank {lagging['rank']}"),
                f" waits {lagging['data_wait_ms']:.2f} ms per step for data, the other ranks {lagging['others_data_wait_ms']:.2f} ms.",
            )
        )
    return _section("Ranks", *parts, anchor="ranks")


def _nothing_profiled(report: Report) -> Markup:
    run = report.run or {}
    recorded = [
        ("steps seen", run.get("steps_seen")),
        ("steps profiled", run.get("profiled_steps")),
        ("trace files", run.get("trace_files") or "none written"),
        ("analysed trace", report.source.get("trace")),
    ]
    return _section(
        "No profiled step",
        el("p", "The run ended before diagnose could profile a step, so there is no breakdown. What was recorded:"),
        _kv_table((key, value) for key, value in recorded if value is not None),
        anchor="steps",
    )


# --- findings ---------------------------------------------------------------------------------------


def _findings(report: Report) -> Markup:
    if not report.breakdown and not report.findings:
        return _section("Findings", el("p", "None: nothing was profiled.", class_="muted"), anchor="findings")
    body: list[Any] = []
    if report.findings:
        body.append(
            el(
                "p",
                "Ranked by the most each fix can gain (an upper bound; diagnose verify measures the real one).",
                class_="muted",
            )
        )
        body += [_finding(i, f, report) for i, f in enumerate(report.findings, 1)]
    else:
        body.append(el("p", "No problem found.", class_="muted"))
    if report.findings_not_shown:
        body.append(el("p", f"... and {report.findings_not_shown} more (--all shows every finding).", class_="muted"))
    if report.next_steps:
        body.append(el("h3", "What would be next"))
        body += [_finding(i, f, report) for i, f in enumerate(report.next_steps, 1)]
    return _section("Findings", body, anchor="findings")


def _finding(rank: int, finding: dict[str, Any], report: Report) -> Markup:
    gain = finding.get("gain_bound")
    heading = el(
        "div",
        el("span", f"{rank}.", class_="rank"),
        el("code", finding["rule"], class_="rule"),
        el("h3", finding["title"]),
        el("span", f"up to {gain:.2f}x faster", class_="gain", title=finding.get("gain_formula")) if gain else None,
        class_="finding-head",
    )
    parts = [heading, el("p", finding["says"])]
    if finding.get("lines"):
        parts.append(el("p", el("strong", "where: "), el("code", finding["lines"]), class_="where"))
    if finding.get("evidence"):
        parts.append(_evidence_table(finding["evidence"], report))
    if finding.get("do"):
        parts.append(el("pre", el("code", finding["do"]), class_="do"))
    if finding.get("knobs"):
        parts.append(el("p", "what-if knobs (diagnose run --set): ", el("code", _value(finding["knobs"])), class_="muted"))
    if finding.get("why"):
        parts.append(el("details", el("summary", "why"), el("p", finding["why"])))
    links = [el("li", _reference(url)) for url in finding.get("references") or []]
    if links:
        parts.append(el("ul", links, class_="refs"))
    return el("article", parts, class_="finding", id=f"finding-{rank}-{finding['rule']}")


def _evidence_table(evidence: list[dict[str, Any]], report: Report) -> Markup:
    rows = [
        el(
            "tr",
            el("td", el("code", e["symptom"])),
            el("td", e["text"], class_="num"),
            el("td", report.symptoms.get(e["symptom"], {}).get("description", ""), class_="muted"),
        )
        for e in evidence
    ]
    return el(
        "table",
        el("thead", el("tr", el("th", "evidence"), el("th", "value", class_="num"), el("th", ""))),
        el("tbody", rows),
        class_="grid evidence",
    )


def _reference(url: str) -> Markup:
    """A link for a web address, plain text for anything else (no javascript: links)."""
    if url.startswith(("https://", "http://")):
        return el("a", url, href=url, rel="noreferrer")
    return el("span", url)


# --- sweep and verify experiments -----------------------------------------------------------------


@dataclass(frozen=True)
class SweepMetric:
    """One bar chart of a sweep: which row figure, how to print it, and what to draw with it."""

    key: str
    title: str
    fmt: Formatter
    limit: float | None = None  # drawn as a dashed line (the device's memory)
    with_speedup: bool = False


def _experiments(report: Report) -> Markup | None:
    experiments = report.experiments
    if not experiments or not experiments.get("rows"):
        return None
    rows = experiments["rows"]
    rate_key = "samples_per_s" if any(r.get("samples_per_s") for r in rows) else "steps_per_s"
    metrics = [
        SweepMetric(rate_key, f"throughput ({rate_key.replace('_per_s', '/s')})", _rate, with_speedup=True),
        SweepMetric(
            "peak_reserved_bytes", "peak GPU memory reserved", human_bytes, limit=(report.memory or {}).get("capacity_bytes")
        ),
    ]
    varied = ", ".join(experiments.get("parameters") or []) or "—"
    kind = experiments.get("kind", "sweep")
    parts = [
        el("p", f"{kind} over {varied}: one short run per row; failed and out-of-memory rows are marked in red.", class_="muted"),
        *(_bar_chart(rows, metric) for metric in metrics if any(row.get(metric.key) is not None for row in rows)),
        _experiment_table(rows, report.exposed_labels()),
    ]
    if experiments.get("plot"):
        parts.append(el("p", f"matplotlib plot: {experiments['plot']} in the run directory.", class_="muted"))
    return _section(kind.capitalize(), parts, anchor="experiments")


def _bar_chart(rows: list[dict[str, Any]], metric: SweepMetric) -> Markup:
    """One bar per experiment row; a row that failed or ran out of memory gets a red marker."""
    plot_h, left, right, top = 212, 72, 16, 28
    plot_w = CHART_WIDTH - left - right
    slot = plot_w / len(rows)
    longest = max(len(str(row.get("label", ""))) for row in rows)
    rotate = longest * LABEL_CHAR_PX > slot
    # rotated labels hang below the axis at -35 degrees: sin(35) of their length
    bottom = 24 + int(longest * LABEL_CHAR_PX * 0.57) if rotate else 40
    values = [row[metric.key] for row in rows if row.get(metric.key) is not None and row.get("status") not in FAILED_STATES]
    ticks = nice_ticks(max([*values, metric.limit or 0]))
    scale = plot_h / ticks[-1]
    bar_w = min(slot * 0.6, 72)
    parts = [
        el("text", metric.title, x="0", y="14", class_="strip-title"),
        _y_axis(ticks, scale, left, top, plot_w, plot_h, "", metric.fmt),
    ]
    for i, row in enumerate(rows):
        x = left + slot * i + (slot - bar_w) / 2
        parts.append(_bar(row, metric, x, bar_w, top + plot_h, plot_h, scale))
        label_x, label_y = _n(x + bar_w / 2), _n(top + plot_h + 16)
        turn = {"text_anchor": "end", "transform": f"rotate(-35 {label_x} {label_y})"} if rotate else {"text_anchor": "middle"}
        parts.append(el("text", row.get("label", ""), x=label_x, y=label_y, class_="tick", **turn))
    if metric.limit:
        y = top + plot_h - metric.limit * scale
        parts.append(el("line", x1=_n(left), x2=_n(left + plot_w), y1=_n(y), y2=_n(y), class_="limit"))
        parts.append(el("text", f"capacity {metric.fmt(metric.limit)}", x=_n(left + 4), y=_n(y - 5), class_="limit-label"))
    return _svg(top + plot_h + bottom, parts, f"bar-chart chart-{metric.key}", metric.title)


def _bar(row: dict[str, Any], metric: SweepMetric, x: float, width: float, base: float, plot_h: float, scale: float) -> Markup:
    status = row.get("status", "ok")
    value = row.get(metric.key)
    label = row.get("label", "")
    if status in FAILED_STATES:
        return el(
            "g",
            _rect(x, base - plot_h, width, plot_h, f"bar-failed status-{status}", f"{label}: {status}"),
            el(
                "text",
                "OOM" if status == "oom" else status,
                x=_n(x + width / 2),
                y=_n(base - 8),
                class_="failed-label",
                text_anchor="middle",
            ),
            class_="bar",
        )
    if value is None:
        return el("text", "not measured", x=_n(x + width / 2), y=_n(base - 8), class_="tick", text_anchor="middle")
    text = metric.fmt(value)
    if metric.with_speedup and row.get("speedup"):
        text += f" · {row['speedup']:.2f}x"
    return el(
        "g",
        _rect(x, base - value * scale, width, value * scale, "bar-ok", f"{label}: {text}"),
        el("text", text, x=_n(x + width / 2), y=_n(base - value * scale - 5), class_="bar-value", text_anchor="middle"),
        class_="bar",
    )


def _experiment_table(rows: list[dict[str, Any]], labels: dict[str, str]) -> Markup:
    columns: list[tuple[str, str, Callable[[Any], str]]] = [
        ("label", "run", str),
        ("status", "status", str),
        ("steps_per_s", "steps/s", _rate),
        ("samples_per_s", "samples/s", _rate),
        ("median_step_ms", "median step", _ms),
        ("gpu_busy", "GPU busy", _pct),
        ("peak_reserved_bytes", "peak reserved", human_bytes),
        ("speedup", "speedup", lambda v: f"{v:.2f}x"),
    ]
    header = el("tr", [el("th", title) for _, title, _ in columns], el("th", "what limits the step most"))
    body = []
    for row in rows:
        cells = [el("td", "—" if row.get(key) is None else fmt(row[key])) for key, _, fmt in columns]
        top = row.get("top_exposed") or {}
        category = top.get("category")
        cells.append(el("td", f"{labels.get(category, category)} ({_pct(top['share'])})" if category else "—"))
        body.append(el("tr", cells, class_="failed" if row.get("status") in FAILED_STATES else None))
    return el("table", el("thead", header), el("tbody", body), class_="grid")


# --- configuration, warnings, footer -------------------------------------------------------------


def _configuration(report: Report) -> Markup:
    run = report.run or {}
    target = run.get("target") or {}
    blocks: list[Any] = []
    if run:
        blocks += [
            el("h3", "Run"),
            _kv_table(
                [
                    ("target", f"{target.get('kind', '')} {target.get('value', '')}".strip()),
                    ("script arguments", shlex.join(target["args"]) if target.get("args") else None),
                    ("working directory", target.get("cwd")),
                    ("command", shlex.join(run["command"]) if run.get("command") else None),
                    ("started", run.get("started_at")),
                    ("ended", run.get("ended_at")),
                    ("wall time", f"{run['wall_s']:.1f} s" if run.get("wall_s") is not None else None),
                    ("plan", run.get("plan")),
                    ("steps seen", run.get("steps_seen")),
                    ("knobs", run.get("knobs")),
                    ("trace files", run.get("trace_files")),
                ]
            ),
        ]
    blocks += [el("h3", "Source"), _kv_table(report.source.items())]
    if report.environment:
        blocks += [el("h3", "Environment"), _kv_table(report.environment.items())]
    if report.dataloader:
        blocks += [el("h3", "DataLoader of the training loop"), _kv_table(report.dataloader.items())]
    if len(report.dataloaders) > 1:
        blocks += [el("h3", "Every DataLoader created"), _records_table(report.dataloaders)]
    for title, records in (("Optimizers", report.optimizers), ("Models", report.models)):
        if records:
            blocks += [el("h3", title), _records_table(records)]
    if report.flags:
        blocks += [el("h3", "Global flags"), _kv_table(report.flags.items())]
    return _section("Configuration", blocks, anchor="configuration")


def _warnings(report: Report) -> Markup | None:
    if not report.warnings:
        return None
    return _section("Notes", el("ul", [el("li", w) for w in report.warnings], class_="warnings"), anchor="warnings")


def _footer(report: Report) -> Markup:
    return el("footer", f"diagnose {report.diagnose_version} · {report.schema} · written {report.created_at}")


# --- SVG helpers ---------------------------------------------------------------------------------


def nice_ticks(maximum: float, count: int = 5) -> list[float]:
    """Round axis ticks from 0 to at least ``maximum`` (steps of 1, 2 or 5 times a power of ten)."""
    raw = maximum / count if maximum > 0 else 1.0
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [step * i for i in range(math.ceil(maximum / step - 1e-9) + 1 if maximum > 0 else 2)]


def _y_axis(
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
        parts.append(el("line", x1=_n(left), x2=_n(left + plot_w), y1=_n(y), y2=_n(y), class_="grid-line"))
        parts.append(el("text", text, x=_n(left - 8), y=_n(y + 4), class_="tick", text_anchor="end"))
    if unit:
        parts.append(el("text", unit, x=_n(left - 8), y=_n(top - 14), class_="axis-title", text_anchor="end"))
    return el("g", parts, class_="axis")


def _rect(x: float, y: float, width: float, height: float, css_class: str, tip: str, category: str | None = None) -> Markup:
    return el(
        "rect", el("title", tip), x=_n(x), y=_n(y), width=_n(width), height=_n(height), class_=css_class, data_category=category
    )


def _svg(height: float, parts: list[Markup], css_class: str, label: str) -> Markup:
    return el(
        "svg",
        parts,
        xmlns="http://www.w3.org/2000/svg",
        viewBox=f"0 0 {CHART_WIDTH} {_n(height)}",
        class_=f"chart {css_class}",
        role="img",
        aria_label=label,
    )


def _n(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _text_colour(hex_colour: str) -> str:
    """Dark text on light segments, white on dark ones (relative luminance)."""
    r, g, b = (int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return "#1f2328" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.55 else "#ffffff"


def _stylesheet() -> str:
    colour_rules = [
        f".c-{cat}{{fill:{hex_};background:{hex_}}}.on-c-{cat}{{fill:{_text_colour(hex_)}}}"
        for cat, hex_ in CATEGORY_COLOURS.items()
    ]
    colour_rules += [
        f".p-{phase}{{fill:{hex_};background:{hex_}}}.on-p-{phase}{{fill:{_text_colour(hex_)}}}"
        for phase, hex_ in PHASE_COLOURS.items()
    ]
    return STYLESHEET + "\n".join(colour_rules) + "\n"


STYLESHEET = """
:root{--ink:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#f6f8fa;--card:#fff;--good:#1a7f37;--bad:#cf222e;--warn:#9a6700;
--sans:-apple-system,BlinkMacSystemFont,"Segoe UI","Noto Sans",Helvetica,Arial,sans-serif;
--mono:ui-monospace,SFMono-Regular,"SF Mono",Menlo,Consolas,"Liberation Mono",monospace}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:15px/1.5 var(--sans)}
main{max-width:1040px;margin:0 auto;padding:24px 20px 48px}
header h1{margin:0;font-size:28px;word-break:break-all}
.eyebrow{margin:0;text-transform:uppercase;letter-spacing:.08em;font-size:12px;color:var(--muted)}
.sub{margin:4px 0 12px;color:var(--muted)}
nav a{margin-right:14px;color:#0969da;text-decoration:none;font-size:14px}
section,.verdict,.status{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:16px 20px;margin:16px 0}
h2{margin:0 0 8px;font-size:20px}
h3{margin:16px 0 6px;font-size:16px}
.verdict p{margin:0;font-size:18px;font-weight:600}
.verdict.good{border-left:6px solid var(--good)}.verdict.bad{border-left:6px solid var(--bad)}
.verdict.warn{border-left:6px solid var(--warn)}
.status p{margin:4px 0}
.pill{display:inline-block;padding:1px 10px;border-radius:999px;font-size:13px;font-weight:600;color:#fff}
.pill.good{background:var(--good)}.pill.bad{background:var(--bad)}
.muted{color:var(--muted)}.note{color:var(--warn)}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(260px,1fr));gap:12px}
.card{border:1px solid var(--line);border-radius:8px;padding:12px 16px}
.card h3{margin:0}.card p{margin:2px 0}
.big{font-size:24px;font-weight:600;font-variant-numeric:tabular-nums}
.meter{display:block;margin:6px 0}.meter-track{fill:#eaeef2}.meter-fill{fill:#8250df}
table{border-collapse:collapse;margin:8px 0;font-variant-numeric:tabular-nums;font-size:14px}
th,td{padding:4px 10px;text-align:left;vertical-align:top;border-bottom:1px solid #eaeef2}
thead th{border-bottom:1px solid var(--line);font-weight:600}
table.kv th{font-weight:500;color:var(--muted);white-space:nowrap}
table.kv td{word-break:break-word;font-family:var(--mono);font-size:13px}
.num{text-align:right}
tr.failed td{color:var(--bad)}
.swatch{display:inline-block;width:14px;height:14px;border-radius:3px;vertical-align:middle}
.chips{display:flex;flex-wrap:wrap;gap:6px}
.chip{background:#eaeef2;border-radius:999px;padding:2px 10px;font-size:13px}
svg.chart{display:block;width:100%;height:auto;margin:8px 0;font-family:var(--sans)}
.tick{font-size:11px;fill:var(--muted)}.axis-title{font-size:12px;fill:var(--muted)}
.strip-title{font-size:13px;font-weight:600;fill:var(--ink)}
.grid-line{stroke:#eaeef2;stroke-width:1}
.seg,.strip-seg{shape-rendering:crispEdges}.seg-label{font-size:11px;pointer-events:none}
.bar-ok{fill:#0969da}.bar-value{font-size:11px;fill:var(--ink)}
.bar-failed{fill:#ffebe9;stroke:var(--bad);stroke-dasharray:4 3}.failed-label{font-size:12px;font-weight:700;fill:var(--bad)}
.limit{stroke:var(--bad);stroke-dasharray:6 4}
.limit-label{font-size:11px;fill:var(--bad);paint-order:stroke;stroke:#fff;stroke-width:3px}
figure{margin:0}figcaption{color:var(--muted);font-size:13px;margin-top:4px}
.finding{border-top:1px solid var(--line);padding:12px 0}
.finding-head{display:flex;align-items:baseline;gap:10px;flex-wrap:wrap}
.finding-head h3{margin:0}.rank{color:var(--muted)}
.rule{background:#ddf4ff;color:#0550ae;border-radius:4px;padding:1px 6px;font-family:var(--mono);font-size:13px}
.gain{color:var(--good);font-weight:600}
pre{background:#f6f8fa;border:1px solid var(--line);border-radius:6px;padding:10px 12px;overflow:auto;font:13px/1.45 var(--mono)}
code{font-family:var(--mono)}
details summary{cursor:pointer;color:var(--muted)}
.refs{margin:4px 0;padding-left:18px;font-size:13px}.refs a{color:#0969da;word-break:break-all}
.warnings li{margin:2px 0}
footer{color:var(--muted);font-size:12px;margin-top:24px}
"""
