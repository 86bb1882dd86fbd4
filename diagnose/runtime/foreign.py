"""The script's own torch.profiler, seen from diagnose: one Kineto session at a time.

Why: Kineto holds one profiling session per process, and torch (2.13 at least) does not refuse
a second one. A second profiler's ``_prepare_trace`` silently takes the first one's session over;
when the first then stops, ``disableProfiler`` finds no session and hands back empty results,
and reading them (``key_averages()``, ``export_chrome_trace``, an ``on_trace_ready`` handler)
crashes the process with SIGSEGV. Whichever of the two starts second, one of them dies. The only
safe course is never to have two sessions: diagnose's profiler must not start (or go on) while
the script's is on, and must stop, saving what it has, before the script's takes Kineto.

Contract: ``ForeignProfilers.install(on_session)`` patches four methods for the script's run
(``remove`` puts them back):

* ``torch.profiler.profile.start``/``stop``: a script's profiler between the two is *on*, even
  while its schedule waits (it will take Kineto at a later ``step()``);
* ``torch.autograd.profiler.profile._prepare_trace``/``__exit__``: the Kineto session itself,
  which every torch profiler goes through (``torch.profiler.profile``, ``_KinetoProfile``,
  ``torch.autograd.profiler.profile``). Before a foreign one prepares, ``on_session`` is called:
  diagnose's profiler stops there, so that the script's starts alone.

Calls made while ``ours()`` is active (diagnose driving its own profiler) are diagnose's.
``active()`` says whether (and how) the script's profiler is on: the tracked objects, or, for a
profiler started before the patches (a block inside the user's own ``with profile()``),
torch's flag that a profiler is enabled while diagnose holds no session.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


class ForeignProfilers:
    def __init__(self) -> None:
        #: the script's torch.profiler.profile objects between start() and stop()
        self._started: list[Any] = []
        #: the script's Kineto sessions (autograd profile objects) between prepare and exit
        self._sessions: list[Any] = []
        #: diagnose's own Kineto sessions (one at most)
        self._own_sessions: list[Any] = []
        self._ours = 0
        self._restore: list[Callable[[], None]] = []

    @contextlib.contextmanager
    def ours(self) -> Iterator[None]:
        """Around diagnose's own calls into its profiler: what they start is not the script's."""
        self._ours += 1
        try:
            yield
        finally:
            self._ours -= 1

    def active(self) -> str | None:
        """What of the script's profiling is on now, in words, or None."""
        if self._sessions:
            return "recording"
        if self._started:
            return "started, its schedule not yet recording"
        if not self._own_sessions and _torch_profiler_enabled():
            return "already recording when diagnose started"
        return None

    def install(self, on_session: Callable[[], None]) -> None:
        """Patch the profilers' entry points; ``on_session`` runs before a foreign Kineto
        session is prepared (diagnose stops its own there)."""
        import torch.autograd.profiler as autograd_profiler
        from torch.profiler import profile

        tracker = self

        def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
            original = owner.__dict__[name]
            setattr(owner, name, make(original))
            self._restore.append(lambda: setattr(owner, name, original))

        def start(original: Any) -> Any:
            def start(prof: Any) -> None:
                if not tracker._ours:
                    tracker._started.append(prof)
                return original(prof)

            return start

        def stop(original: Any) -> Any:
            def stop(prof: Any) -> None:
                try:
                    return original(prof)
                finally:
                    _discard(tracker._started, prof)

            return stop

        def prepare(original: Any) -> Any:
            def _prepare_trace(prof: Any) -> None:
                if tracker._ours:
                    tracker._own_sessions.append(prof)
                else:
                    on_session()  # diagnose's session ends before the script's begins
                    tracker._sessions.append(prof)
                return original(prof)

            return _prepare_trace

        def exit_(original: Any) -> Any:
            def __exit__(prof: Any, *exc: Any) -> Any:
                try:
                    return original(prof, *exc)
                finally:
                    _discard(tracker._sessions, prof)
                    _discard(tracker._own_sessions, prof)

            return __exit__

        patch(profile, "start", start)
        patch(profile, "stop", stop)
        patch(autograd_profiler.profile, "_prepare_trace", prepare)
        patch(autograd_profiler.profile, "__exit__", exit_)

    def remove(self) -> None:
        for restore in reversed(self._restore):
            restore()
        self._restore.clear()


def _discard(items: list[Any], item: Any) -> None:
    """Remove by identity (profilers may define ``__eq__``; a list keeps them unhashed)."""
    items[:] = [x for x in items if x is not item]


def _torch_profiler_enabled() -> bool:
    import torch

    try:
        return bool(torch.autograd._profiler_enabled())
    except (AttributeError, RuntimeError):
        return False
