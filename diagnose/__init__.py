"""diagnose: a profiling-driven bottleneck doctor for PyTorch training.

The pipeline, one stage per module (docs/architecture.md):
runner -> capture -> timeline -> breakdown -> symptoms -> rules -> findings -> renderers.

The Python API (docs/api.md): ``profile`` a function or a block in this process, ``analyze`` a
run directory or a trace, ``compare`` runs. Importing the package stays cheap and torch-free:
torch is imported when ``profile`` runs.
"""

from diagnose.api import ProfiledRun, analyze, compare, load_runs, profile
from diagnose.version import __version__

__all__ = ["ProfiledRun", "__version__", "analyze", "compare", "load_runs", "profile"]
