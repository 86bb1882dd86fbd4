"""The one small base every output format derives from (pyinstrument's renderer habit)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from diagnose.analysis.report import Report


class Renderer(ABC):
    #: file name the renderer's output is saved under in a run directory, if any
    output_name: str | None = None

    @abstractmethod
    def render(self, report: Report) -> str:
        """The whole output, as one string."""
