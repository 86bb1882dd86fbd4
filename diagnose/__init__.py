"""diagnose: a profiling-driven bottleneck doctor for PyTorch training.

The pipeline, one stage per module (docs/architecture.md):
runner -> capture -> timeline -> breakdown -> symptoms -> rules -> findings -> renderers.

The Python API (docs/api.md): ``profile`` a function or a block in this process, ``analyze`` a
run directory or a trace, ``compare`` runs. Importing the package stays cheap and torch-free:
torch is imported when ``profile`` runs.
"""

from diagnose.api import ProfiledRun, analyze, compare, load_runs, profile
from diagnose.jupyter import register_display
from diagnose.version import __version__


def _report_page(report: object) -> str:
    from diagnose.renderers.html import HTMLRenderer  # imported when a notebook shows a report

    return HTMLRenderer().render(report)  # type: ignore[arg-type]


# Jupyter's display of a Report is its HTML page. The report's type lives below the renderers
# (diagnose/report.py) and never imports one; this layer, which sees both, tells it which
# renderer draws it (a Comparison: renderers/notebook.py).
register_display("Report", _report_page)

__all__ = ["ProfiledRun", "__version__", "analyze", "compare", "load_runs", "profile"]
