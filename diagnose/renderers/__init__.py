"""Stage 8: renderers turn a Report into text for people or machines (``render(report) -> str``)."""

from diagnose.renderers.base import Renderer
from diagnose.renderers.json import JSONRenderer
from diagnose.renderers.terminal import TerminalRenderer

__all__ = ["Renderer", "JSONRenderer", "TerminalRenderer"]
