"""What a command shows on the terminal: the report on stdout, a few lines of information on
stderr. The orchestration (``session``) calls it for the CLI's commands; the Python API shows
nothing (it returns the report).

Contract: ``Display(json_out, color, quiet, show_steps)``: ``report(report)`` writes the report
(terminal text, or report.json with ``json_out``) to stdout; memory running out while rendering
it, or a stdout that cannot take it (closed by the script, ``> /dev/full``), is a
``DiagnoseError`` whose line says where the report is saved. ``say(text)`` is a line of
information on stderr (left out with ``quiet``), ``note(text)`` one that ``quiet`` keeps.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from diagnose import errors

if TYPE_CHECKING:
    from diagnose.analysis.compare import Comparison
    from diagnose.report import Report
    from diagnose.rundir import RunDir


@dataclass(frozen=True)
class Display:
    json_out: bool = False
    color: bool | None = None
    #: no "wrote ..." lines
    quiet: bool = False
    #: the breakdown of every step too (``--per-step``)
    show_steps: bool = False

    def report(self, report: Report) -> None:
        from diagnose.renderers import JSONRenderer, TerminalRenderer
        from diagnose.renderers.terminal import ConsoleSettings

        saved = report.source.run_dir if report.source.kind == "run" else None
        try:
            text = JSONRenderer().render(report) + "\n" if self.json_out else None
            if text is None:
                settings = ConsoleSettings.detect(self.color, sys.stdout)
                text = TerminalRenderer.with_settings(settings, show_steps=self.show_steps).render(report)
        except MemoryError:  # what rendering held is released on leaving; the report is saved where it could be
            text = None
        if text is None:
            raise errors.TraceError(
                "memory ran out while showing the report",
                hint=f"it is saved: diagnose report {saved} shows it again"
                if saved
                else "free some memory and run it again",
            )
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except (OSError, ValueError) as exc:  # stdout closed by the script, a full device (> /dev/full)
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - nothing more is written there, at exit neither
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise errors.OutputError(
                f"cannot write the report to stdout ({why})",
                hint=f"it is saved: diagnose report {saved} shows it again" if saved else None,
            ) from None

    def comparison(self, comparison: Comparison) -> None:
        """``diagnose compare``'s table (or its JSON): a wide table, the terminal's width
        (COLUMNS), or 140 columns when piped."""
        from diagnose.renderers.comparison import render_comparison
        from diagnose.renderers.terminal import ConsoleSettings

        if self.json_out:
            sys.stdout.write(render_comparison(comparison, "json"))
            return
        settings = ConsoleSettings.detect(self.color, sys.stdout)
        sys.stdout.write(render_comparison(comparison, "terminal", color=settings.color, width=settings.width or 140))

    def say(self, text: str) -> None:
        """A line of information on stderr (what was written where), left out with ``quiet``."""
        if not self.quiet:
            _echo(text)

    def note(self, text: str) -> None:
        """A line on stderr that ``quiet`` keeps (a warning, how a run ended)."""
        _echo(text)

    def wrote_html(self, run_dir: RunDir, html: bool) -> None:
        """Where --html wrote report.html: every command that writes one says so."""
        if html and run_dir.html_path.is_file():
            self.say(f"wrote {run_dir.html_path}")

    def run_directory(self, run_dir: RunDir) -> None:
        """The run directory's line after a report (not with ``--json``), and how to open its events."""
        if not self.json_out:
            self.note(f"run directory: {run_dir.path}{tensorboard_hint(run_dir.path)}")


def _echo(text: str) -> None:
    import typer

    typer.echo(text, err=True)


def tensorboard_hint(path: Path) -> str:
    """Where TensorBoard is installed and the run wrote its events: how to open it."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None or not any(path.glob("events.out.tfevents.*")):
        return ""
    return f"  (tensorboard --logdir {path.parent})"
