"""Holding Ctrl-C, SIGTERM and SIGHUP while diagnose saves what a run measured.

Contract: ``SignalHold.hold()`` (idempotent, main thread only) makes SIGINT, SIGTERM and SIGHUP
(each unless ignored) set a flag and print one line instead of raising; ``release()`` puts the
previous handlers back, and ``received`` says which came (the command's exit code says so).
The runner holds them from the moment the script ends (however it ends); the command releases
them once report.json is written. The first signal stops the script (KeyboardInterrupt,
``Terminated``); a second one 20-100 ms later would otherwise raise inside diagnose's own
saving and lose the report. ``deferred()`` is the short form, around one call that a signal
must not cut in half (torch.profiler's ``step``, ``start`` and ``stop``): what arrives during it
is delivered when it returns. No torch import.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field
from typing import Any

HELD = ("SIGINT", "SIGTERM", "SIGHUP")


@dataclass
class SignalHold:
    #: signal name -> the handler before ``hold``; empty when not holding
    previous: dict[str, Any] = field(default_factory=dict)
    #: the signals that arrived while held, in order
    received: list[int] = field(default_factory=list)
    #: hold without the line that says the report comes first (``deferred``)
    quiet: bool = False

    @property
    def holding(self) -> bool:
        return bool(self.previous)

    def hold(self, underneath: dict[str, Any] | None = None) -> None:
        """Hold the signals; ``underneath`` names the handlers to put back on release where
        the current ones are temporary (the runner's own SIGTERM handler). A signal whose
        handler was installed from C is not held: it could not be put back."""
        if self.previous:
            return
        for name in HELD:
            signum = getattr(signal, name, None)
            try:
                # installed from C: it could not be put back; ignored (nohup): nothing to hold
                if signum is None or signal.getsignal(signum) in (None, signal.SIG_IGN):
                    continue
                current = signal.signal(signum, self._held)
            except (ValueError, OSError):  # not the main thread: nothing to hold
                continue
            # SIG_DFL is 0: "is there one underneath" is asked by name, never by truth value
            self.previous[name] = underneath[name] if underneath and underneath.get(name) is not None else current

    def release(self) -> None:
        previous, self.previous = self.previous, {}
        for name, handler in previous.items():
            try:
                signal.signal(getattr(signal, name), handler)
            except (ValueError, OSError, TypeError):
                pass

    def _held(self, signum: int, frame: Any) -> None:
        if not self.received and not self.quiet:
            print(
                "diagnose: saving what was measured first; the report will be written before exiting", file=sys.stderr
            )
        self.received.append(signum)


class deferred:  # used as a function: ``with deferred():``
    """SIGINT and SIGTERM wait until the block ends, then are delivered, in the order they came
    (each once; an exception the first one's handler raises ends the delivery): a quiet
    ``SignalHold`` for one call.

    torch.profiler's ``step`` enters its step mark with a C++ call and then stores the handle in
    Python: a KeyboardInterrupt between the two leaves a mark that was begun and never ended;
    ``stop`` then fails ("Expected record to be set"), the profiler keeps running and the
    interpreter crashes as it exits (seen on CI: exit -11 after a Ctrl-C). Outside the main
    thread, or where a handler installed from C could not be put back, nothing is deferred.
    A class, not a generator: the traceback of a delivered Ctrl-C ends in diagnose's own frame
    (which the script's traceback leaves out), not in contextlib's."""

    def __init__(self) -> None:
        self._hold = SignalHold(quiet=True)

    def __enter__(self) -> None:
        try:
            self._hold.hold()
        except BaseException:
            # a pending signal's handler runs inside signal.signal, before the swap: what it
            # raises must not leave a swapped handler behind
            self._hold.release()
            raise

    def __exit__(self, *exc: object) -> None:
        self._hold.release()
        for signum in dict.fromkeys(self._hold.received):
            signal.raise_signal(signum)
