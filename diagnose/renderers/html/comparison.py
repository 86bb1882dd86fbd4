"""compare.html: several runs side by side on one self-contained page.

Contract: ``comparison_html(comparison, views) -> str``, a complete HTML document under the same
rules as report.html (inline CSS and SVG, no script, the same Content-Security-Policy, every
string escaped by ``markup.el``). The parts: the shift sentences, throughput, the exposed and
phase shares with their change from the baseline, the findings that came and went, and each
run's per-step bars (``charts.steps_chart``) side by side on one time scale, so that a shorter
bar is a shorter step.
"""

from __future__ import annotations

from collections.abc import Sequence

from diagnose.analysis.compare import Comparison, ShareRow
from diagnose.renderers.comparison_text import findings_change, rate_words, signed_points, speedup_text, step_text
from diagnose.renderers.html.charts import steps_chart
from diagnose.renderers.html.markup import Markup, el, section, swatch
from diagnose.renderers.html.style import page
from diagnose.renderers.view import ReportView
from diagnose.units import ms, percent
from diagnose.version import __version__


def comparison_html(comparison: Comparison, views: Sequence[ReportView]) -> str:
    c = comparison
    body = el(
        "main",
        el("header", el("p", "diagnose comparison", class_="eyebrow"), el("h1", " vs ".join(c.labels))),
        _shifts(c),
        section("Throughput", _summary(c), anchor="throughput"),
        _steps(c, views),
        section("What limits the step", _shares(c, c.exposed, "c"), anchor="exposed"),
        section("What the host thread does", _shares(c, c.phases, "p"), anchor="phases"),
        _findings(c),
        el("footer", f"diagnose {__version__} · {c.to_dict()['schema']}"),
    )
    return page(f"diagnose · compare {' vs '.join(c.labels)}", body)


def _shifts(c: Comparison) -> Markup:
    items = [el("li", el("strong", run.label), ": ", run.shift) for run in c.runs[1:]]
    return el("div", el("p", "How the bottleneck moved"), el("ul", items), class_="verdict warn")


def _head_row(c: Comparison, first: str) -> Markup:
    return el("thead", el("tr", el("th", first), *[el("th", run.label, class_="num") for run in c.runs]))


def _summary(c: Comparison) -> Markup:
    def row(name: str, cells: list[str]) -> Markup:
        return el("tr", el("th", name), *[el("td", cell, class_="num") for cell in cells])

    rows = [
        row(
            rate_words(c.rate_key),
            [
                "—"
                if r.throughput is None
                else f"{r.throughput:,.1f}" + (f" ({speedup_text(r.speedup)})" if i and r.speedup else "")
                for i, r in enumerate(c.runs)
            ],
        ),
        row("mean step (p10–p90)", [step_text(r) for r in c.runs]),
        row("status", [r.state for r in c.runs]),
        row("verdict", [r.verdict for r in c.runs]),
    ]
    if c.on_gpu:
        rows.insert(2, row("GPU busy", [percent(r.gpu_busy, 0) if r.gpu_busy is not None else "—" for r in c.runs]))
    return el("table", _head_row(c, ""), el("tbody", rows), class_="grid")


def _shares(c: Comparison, rows: tuple[ShareRow, ...], colour_prefix: str) -> Markup:
    body = []
    for row in rows:
        cells = [el("td", swatch(f"{colour_prefix}-{row.name}"), " ", row.label)]
        for i, (share, delta) in enumerate(zip(row.shares, row.deltas, strict=True)):
            text = "—" if share is None else percent(share) + (f" ({signed_points(delta)})" if i else "")
            cells.append(el("td", text, class_="num"))
        body.append(el("tr", cells, data_category=row.name))
    return el(
        "table", _head_row(c, "share of the step (change from the baseline)"), el("tbody", body), class_="grid legend"
    )


def _steps(c: Comparison, views: Sequence[ReportView]) -> Markup | None:
    with_steps = [
        (run, view) for run, view in zip(c.runs, views, strict=True) if view.breakdown and view.breakdown.steps
    ]
    if not with_steps:
        return None
    categories = [row.name for row in c.exposed]
    longest = max(step.duration_ms for _, view in with_steps for step in view.breakdown.steps)  # type: ignore[union-attr]
    labels = views[0].labels if views else {}
    columns = []
    for run, view in with_steps:
        breakdown = view.breakdown
        assert breakdown is not None
        chart = steps_chart(
            breakdown.steps,
            [cat for cat in categories if cat in breakdown.categories],
            labels or view.labels,
            max_ms=longest,
        )
        caption = f"{len(breakdown.steps)} steps, median {ms(breakdown.median_step_ms)}"
        columns.append(el("figure", el("h3", run.label), chart, el("figcaption", caption, class_="muted")))
    grid = f"display:grid;grid-template-columns:repeat({len(columns)},minmax(0,1fr));gap:12px"
    return section(
        "Each profiled step, side by side",
        el(
            "p",
            "One bar per profiled step, split by what limited it; every chart has the same time scale.",
            class_="muted",
        ),
        el("div", columns, style=grid),
        anchor="steps",
    )


def _findings(c: Comparison) -> Markup:
    rows = []
    for i, run in enumerate(c.runs):
        text = (", ".join(run.findings) or "none") if i == 0 else findings_change(run, ":")
        rows.append(el("tr", el("th", run.label), el("td", text)))
    titles = el("ul", [el("li", el("code", rule), " ", title) for rule, title in sorted(c.titles.items())])
    return section(
        "Findings", el("table", el("tbody", rows), class_="kv"), titles if c.titles else None, anchor="findings"
    )
