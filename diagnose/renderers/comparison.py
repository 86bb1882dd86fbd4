"""A comparison of runs (``diagnose compare``) as text for people or machines.

Contract: ``render_comparison(comparison, format, views=...) -> str`` with format ``terminal``
(rich tables), ``json`` (``Comparison.to_dict()``) or ``html`` (``renderers/html/comparison.py``:
per-step bars side by side, drawn from each compared report's ``ReportView``). The renderers read
the ``Comparison`` value (and, for the charts, the views), never a report's dictionaries.
"""

from __future__ import annotations

import io
import json

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from diagnose.analysis.compare import Comparison, ShareRow
from diagnose.renderers.comparison_text import findings_change, rate_words, signed_points, speedup_text, step_text
from diagnose.renderers.fit import Column, FittedTable, fit_table
from diagnose.renderers.terminal import without_trailing_spaces
from diagnose.renderers.view import ReportView
from diagnose.units import percent

FORMATS = ("terminal", "json", "html")
WINDOW_WORDS = {
    "steady": "timed with the profiler off",
    "profiled": "the profiled steps, as not every run has a steady figure",
}


def render_comparison(comparison: Comparison, fmt: str = "terminal", color: bool = False, width: int = 100) -> str:
    if fmt == "json":
        return json.dumps(comparison.to_dict(), indent=1) + "\n"
    if fmt == "html":
        from diagnose.renderers.html.comparison import comparison_html

        return comparison_html(comparison, [ReportView.from_report(r) for r in comparison.reports])
    if fmt == "terminal":
        return ComparisonTerminalRenderer(color=color, width=width).render(comparison)
    raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")


class ComparisonTerminalRenderer:
    def __init__(self, color: bool = True, width: int = 100) -> None:
        self.color = color
        self.width = width

    def render(self, comparison: Comparison) -> str:
        buffer = io.StringIO()
        console = Console(
            file=buffer,
            force_terminal=self.color,
            no_color=not self.color,
            width=self.width,
            highlight=False,
            color_system="truecolor" if self.color else None,
        )
        c = comparison
        console.print(f"[bold]diagnose compare[/]  ·  {len(c.runs)} runs, the first is the baseline")
        for warning in c.warnings:
            console.print(Text(f"warning: {warning}", style="yellow"))
        for run in c.runs[1:]:
            console.print(f"[bold cyan]{escape(run.label)}[/]: {escape(run.shift or '')}")
        for run in c.runs:
            spread = f"its steps' spread ±{percent(run.spread, 0)}" if run.spread is not None else ""
            for line in ([spread] if spread and run.notes else []) + list(run.notes):
                console.print(Text(f"note ({run.label}): {line}", style="dim"))
        console.print()
        for fitted in (
            self._summary(c),
            self._shares("What limits the step (share of the step; change from the baseline)", c, c.exposed),
            self._shares("What the host thread does (phases)", c, c.phases),
        ):
            # a column per run, never cut: too many runs for the width stack each row instead
            console.print(fitted.renderable)
            console.print()
        self._findings(console, c)
        return without_trailing_spaces(buffer.getvalue())

    def _fit(self, title: str, c: Comparison, rows: list[list[str]]) -> FittedTable:
        columns = [Column(""), *(Column(run.label, "right") for run in c.runs)]
        return fit_table(columns, rows, self.width, title=title, header_style="bold")

    def _summary(self, c: Comparison) -> FittedTable:
        rows = [
            [
                rate_words(c.rate_key),
                *[
                    _cell(r.throughput, f"{r.throughput:,.1f}" if r.throughput else "", r.speedup, r.inside_spread)
                    for r in c.runs
                ],
            ],
            ["mean step (p10–p90)", *[step_text(r) for r in c.runs]],
        ]
        if c.on_gpu:
            rows.append(["GPU busy", *[percent(r.gpu_busy, 0) if r.gpu_busy is not None else "—" for r in c.runs]])
        rows.append(["status", *[r.state for r in c.runs]])
        return self._fit("Throughput" + (f" ({c.window}: {WINDOW_WORDS[c.window]})" if c.window else ""), c, rows)

    def _shares(self, title: str, c: Comparison, rows: tuple[ShareRow, ...]) -> FittedTable:
        lines = []
        for row in rows:
            cells = []
            for i, (share, delta) in enumerate(zip(row.shares, row.deltas, strict=True)):
                if share is None:
                    cells.append("—")
                else:
                    cells.append(percent(share, 1) + (f" ({signed_points(delta)})" if i else ""))
            lines.append([row.label, *cells])
        return self._fit(title, c, lines)

    def _findings(self, console: Console, c: Comparison) -> None:
        console.print("[bold]Findings[/]")
        base = c.runs[0]
        console.print(f"  {escape(base.label)}: {', '.join(base.findings) or 'none'}")
        for run in c.runs[1:]:
            console.print(f"  {escape(run.label)}: {escape(findings_change(run))}")
        for rule, title in sorted(c.titles.items()):
            console.print(f"  [dim]{rule}: {escape(title)}[/]")


def _cell(value: float | None, text: str, speedup: float | None, inside: bool = False) -> str:
    if value is None:
        return "—"
    if speedup is None or speedup == 1.0:
        return text
    return f"{text} ({speedup_text(speedup)}{', within spread' if inside else ''})"
