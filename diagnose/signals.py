"""Holding Ctrl-C and SIGTERM while diagnose saves what a run measured.

Contract: ``SignalHold.hold()`` (idempotent, main thread only) makes SIGINT and SIGTERM set a
flag and print one line instead of raising; ``release()`` puts the previous handlers back.
The runner holds them from the moment the script ends (however it ends); the command releases
them once report.json is written. The first signal stops the script (KeyboardInterrupt,
``Terminated``); a second one 20-100 ms later would otherwise raise inside diagnose's own
saving and lose the report. No torch import.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field
from typing import Any

HELD = ("SIGINT", "SIGTERM")


@dataclass
class SignalHold:
    #: signal name -> the handler before ``hold``; empty when not holding
    previous: dict[str, Any] = field(default_factory=dict)
    #: the signals that arrived while held, in order
    received: list[int] = field(default_factory=list)

    @property
    def holding(self) -> bool:
        return bool(self.previous)

    def hold(self, underneath: dict[str, Any] | None = None) -> None:
        """Hold the signals; ``underneath`` names the handlers to put back on release where
        the current ones are temporary (the runner's own SIGTERM handler)."""
        if self.previous:
            return
        for name in HELD:
            try:
                current = signal.signal(getattr(signal, name), self._held)
                self.previous[name] = (underneath or {}).get(name) or current
            except (AttributeError, ValueError, OSError):  # not the main thread: nothing to hold
                continue

    def release(self) -> None:
        previous, self.previous = self.previous, {}
        for name, handler in previous.items():
            try:
                signal.signal(getattr(signal, name), handler)
            except (ValueError, OSError, TypeError):
                pass

    def _held(self, signum: int, frame: Any) -> None:
        if not self.received:
            print("diagnose: saving what was measured first; the report will be written before exiting", file=sys.stderr)
        self.received.append(signum)
