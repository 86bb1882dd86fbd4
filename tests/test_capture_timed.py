"""The capture session's timed steps (``CaptureSession.on_boundary`` past the window): every
boundary counted, the timing begun and ended where the plan says, the script stopped there, a
reset inside the timed steps starting the window again; only the count runs on each of them."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnose.progress import Progress
from diagnose.record import WindowPlan
from diagnose.rundir import RunDir
from diagnose.runtime.capture import CaptureSession, StopScript


class _Listener:
    def __init__(self) -> None:
        self.events: list[str] = []

    def window_opened(self) -> None:
        self.events.append("opened")

    def window_closing(self) -> None:
        self.events.append("closing")

    def window_closed(self) -> None:
        self.events.append("closed")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


PLAN = WindowPlan(warmup=1, steps=2, timed=4)  # window: boundaries 1-3; export step 3-4; timed 4-8


@pytest.fixture
def sessions() -> Iterator[list[CaptureSession]]:
    made: list[CaptureSession] = []
    yield made
    for session in made:
        session.finish()  # the profiler patches go


def _session(
    made: list[CaptureSession], tmp_path: Path, plan: WindowPlan = PLAN, progress: Progress | None = None
) -> CaptureSession:
    """A session as the runner makes one: diagnose's profiler tells its own sessions from the script's."""
    session = CaptureSession(plan, RunDir(tmp_path), progress or Progress(enabled=False), window=_Listener())
    session.guard_foreign_profilers()
    made.append(session)
    return session


def test_the_timed_steps_are_counted_and_the_script_stopped_at_their_end(
    tmp_path: Path, sessions: list[CaptureSession]
) -> None:
    session = _session(sessions, tmp_path)
    stopped_at = None
    for k in range(20):
        try:
            session.on_boundary(float(k))
        except StopScript:
            stopped_at = k
            break
    assert stopped_at == PLAN.last_boundary == 8
    assert session.boundaries == [float(k) for k in range(9)]
    assert session.window_closed and session.finished
    assert session.timed_start is not None and session.timed_end is not None
    assert session.timed_start <= session.timed_end
    assert len(session.trace_files) == 1


def test_no_stop_counts_on_past_the_timing(tmp_path: Path, sessions: list[CaptureSession]) -> None:
    session = _session(sessions, tmp_path, WindowPlan(warmup=1, steps=2, timed=4, stop=False))
    for k in range(30):
        session.on_boundary(float(k))
    assert session.finished and len(session.boundaries) == 30


def test_a_reset_inside_the_timed_steps_starts_the_window_again(tmp_path: Path, sessions: list[CaptureSession]) -> None:
    session = _session(sessions, tmp_path)
    for k in range(6):  # two timed steps done
        session.on_boundary(float(k))
    assert session.timed_start is not None and not session.finished
    session.on_reset("optimizer")  # a stronger signal: counting starts over, the window with it
    assert session.timed_start is None and session.boundaries == []
    session.on_boundary(100.0)  # the profiler restarts at the first boundary outside the resetting call
    stopped = False
    for k in range(1, 20):
        try:
            session.on_boundary(100.0 + k)
        except StopScript:
            stopped = True
            break
    assert stopped and len(session.boundaries) == PLAN.last_boundary + 1
    assert len(session.trace_files) == 2  # a second window, profiled after the reset
    assert session.window.events.count("opened") == 2  # type: ignore[attr-defined]


def test_a_terminal_still_sees_each_timed_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sessions: list[CaptureSession]
) -> None:
    monkeypatch.setenv("TERM", "xterm")
    stream = _Terminal()
    progress = Progress(stream=stream, enabled=True)
    monkeypatch.setattr(progress, "_last_draw", float("-inf"))
    session = _session(sessions, tmp_path, progress=progress)
    drawn: list[str] = []
    real_step = progress.step
    monkeypatch.setattr(progress, "step", lambda text, force=False: (drawn.append(text), real_step(text, force)))
    with pytest.raises(StopScript):
        for k in range(20):
            session.on_boundary(float(k))
    assert [t for t in drawn if t.startswith("timed step")] == [f"timed step {i}/4" for i in range(1, 5)]
    assert "timing 4 steps with the profiler off" in stream.getvalue()
