"""Stage 8: renderers turn a Report into text for people or machines (``render(report) -> str``).

Every renderer but JSON reads the report through its typed view, ``ReportView``."""

from diagnose.renderers.base import Renderer
from diagnose.renderers.json import JSONRenderer
from diagnose.renderers.markdown import MarkdownRenderer
from diagnose.renderers.terminal import TerminalRenderer
from diagnose.renderers.view import ReportView

__all__ = ["Renderer", "JSONRenderer", "MarkdownRenderer", "ReportView", "TerminalRenderer"]
