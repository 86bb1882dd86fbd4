"""report.json, exactly as saved in the run directory (``--json`` prints it to stdout)."""

from __future__ import annotations

from diagnose.renderers.base import Renderer
from diagnose.report import Report


class JSONRenderer(Renderer):
    output_name = "report.json"

    def render(self, report: Report) -> str:
        return report.to_json()
