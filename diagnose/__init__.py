"""diagnose: a profiling-driven bottleneck doctor for PyTorch training.

The pipeline, one stage per module (docs/architecture.md):
runner -> capture -> timeline -> breakdown -> symptoms -> rules -> findings -> renderers.
"""

__version__ = "0.1.0"
