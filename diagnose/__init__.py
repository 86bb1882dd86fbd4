"""diagnose: a profiling-driven bottleneck doctor for PyTorch training.

The pipeline, one stage per module (docs/architecture.md):
runner -> capture -> timeline -> breakdown -> symptoms -> rules -> findings -> renderers.

The Python API (docs/api.md): ``profile`` a function or a block in this process, ``analyze`` a
run directory or a trace, ``compare`` runs. Importing the package stays cheap and torch-free:
torch is imported when ``profile`` runs.
"""

__version__ = "0.1.0"

from diagnose.api import ProfiledRun, analyze, compare, load_runs, profile  # noqa: E402 - after __version__, which submodules read

__all__ = ["ProfiledRun", "__version__", "analyze", "compare", "load_runs", "profile"]
