"""A progress line on stderr while the script runs: which phase, which step.

On a terminal one line is rewritten in place; elsewhere (CI logs, pipes) only the phase changes
are printed, one line each, so logs stay readable. stdout belongs to the script.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

#: how every progress line begins (a parent picks its child runs' lines out by it)
PREFIX = "diagnose ▸ "


class Progress:
    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        # TERM=dumb takes no escape codes: the line cannot be rewritten in place there
        self.interactive = (
            enabled and hasattr(self.stream, "isatty") and self.stream.isatty() and os.environ.get("TERM", "") != "dumb"
        )
        self._phase: str | None = None
        self._last_draw = 0.0
        self._line_open = False

    def phase(self, text: str) -> None:
        """A new phase: always printed on a line of its own."""
        if not self.enabled or text == self._phase:
            return
        self._phase = text
        self._clear()
        self.stream.write(f"{PREFIX}{text}\n")
        self.stream.flush()

    def step(self, text: str, force: bool = False) -> None:
        """Where we are inside the phase: drawn in place on a terminal, at most 10 times a
        second (``force``: a change worth drawing at once)."""
        if not self.interactive:
            return
        now = time.monotonic()
        if now - self._last_draw < 0.1 and not force:
            return
        self._last_draw = now
        self.stream.write(f"\r\x1b[2K{PREFIX}{text}")
        self.stream.flush()
        self._line_open = True

    def done(self) -> None:
        self._clear()

    def _clear(self) -> None:
        if self._line_open:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._line_open = False


class ExperimentProgress:
    """verify's and sweep's progress: a line per experiment, and on a terminal the experiment's
    own progress (its child run's phases) drawn in place under it."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.progress = Progress(stream, enabled)
        self.label = ""

    def experiment(self, label: str) -> None:
        self.label = label
        self.progress.phase(f"experiment: {label}")

    def child(self, text: str) -> None:
        self.progress.step(f"{self.label}: {text}", force=True)

    @property
    def shows_children(self) -> bool:
        return self.progress.interactive

    def done(self) -> None:
        self.progress.done()
