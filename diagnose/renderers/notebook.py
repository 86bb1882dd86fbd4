"""Jupyter's display of the values the API hands out: each shows itself as its HTML page.

Contract: ``for_notebook(comparison) -> NotebookComparison``, the same ``Comparison`` (equal field
by field) with ``_repr_html_``: its compare.html page in an ``iframe`` (``html_frame``), so that
the page's stylesheet and Content-Security-Policy stay inside the frame. The analysis' values
know no renderer (the analysis sits below the renderers); ``diagnose.compare`` (api.py) returns
this one, so that a notebook shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from diagnose.analysis.compare import Comparison
from diagnose.jupyter import html_frame
from diagnose.renderers.comparison import render_comparison


@dataclass(frozen=True)
class NotebookComparison(Comparison):
    def _repr_html_(self) -> str:
        """Jupyter shows a comparison as its HTML page (docs/api.md, "In Jupyter")."""
        return html_frame(render_comparison(self, "html"))


def for_notebook(comparison: Comparison) -> NotebookComparison:
    return NotebookComparison(**{f.name: getattr(comparison, f.name) for f in fields(comparison)})
