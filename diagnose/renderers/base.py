"""The one small base every output format derives from (pyinstrument's renderer habit).

A renderer turns a report into one string. Most read the report through its typed view
(``ReportView``, built once per render): they implement ``render_view``. One that writes the
report itself (JSON) overrides ``render``.
"""

from __future__ import annotations

from diagnose.renderers.view import ReportView
from diagnose.report import Report


class Renderer:
    #: file name the renderer's output is saved under in a run directory, if any
    output_name: str | None = None

    def render(self, report: Report) -> str:
        """The whole output, as one string."""
        return self.render_view(ReportView.from_report(report))

    def render_view(self, view: ReportView) -> str:
        """The whole output, from a view already built (to render one report several ways)."""
        raise NotImplementedError(f"{type(self).__name__} renders the report itself")
