"""report.html: the whole report as one self-contained page, charts included.

Contract: ``HTMLRenderer().render(report) -> str`` is a complete HTML document with inline CSS and
inline SVG charts drawn here, in Python. It holds no script and loads nothing: a
Content-Security-Policy forbids scripts and every external resource, so the page opens offline,
can be attached to a ticket, and cannot run anything that a trace smuggled in. Every string from
a trace, a script or a rule file goes through ``markup.el()``, which escapes all text and
attribute values; only ``Markup`` built by this package is inserted as is.

It renders every report: a GPU or CPU-only run, one that failed before the profiled window
(no breakdown: the status, the error and what was recorded), and one with a sweep. The parts:
``markup`` (safe elements and tables), ``charts`` (SVG), ``sections`` (one function per section,
from the report's view), ``style`` and ``style.css`` (the stylesheet and the category colours).
"""

from __future__ import annotations

from diagnose.renderers.base import Renderer
from diagnose.renderers.html import sections
from diagnose.renderers.html.charts import nice_ticks
from diagnose.renderers.html.markup import Markup, el
from diagnose.renderers.html.style import CATEGORY_COLOURS, CSP, PHASE_COLOURS, page
from diagnose.renderers.html.whole import whole_run
from diagnose.renderers.view import ReportView

__all__ = ["CATEGORY_COLOURS", "CSP", "HTMLRenderer", "Markup", "PHASE_COLOURS", "el", "nice_ticks"]


class HTMLRenderer(Renderer):
    output_name = "report.html"

    def render_view(self, view: ReportView) -> str:
        body = el(
            "main",
            sections.header(view),
            sections.verdict(view),
            sections.status(view),
            *(
                [sections.experiments(view)]  # a sweep's parent: its runs are the whole content
                if view.sweep_summary
                else [
                    whole_run(view),
                    sections.throughput_and_memory(view),
                    *(sections.breakdown_sections(view) if view.breakdown else [sections.nothing_profiled(view)]),
                    sections.hardware_limit(view),
                    sections.ranks(view),
                    sections.findings(view),
                    sections.experiments(view),
                ]
            ),
            sections.configuration(view),
            sections.warnings(view),
            sections.footer(view),
        )
        return page(f"diagnose · {view.name}", body)
