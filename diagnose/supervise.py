"""A supervising parent for ``diagnose run``: whatever ends the script's process (a segfault in
an extension, SIGKILL, ``os.exec*``, a C library's ``exit``), a process that saw it happen is
left to write what was measured until then.

Contract: ``enable()`` allows supervision (the command line calls it; an in-process caller, a
test's CliRunner, never forks). ``supervise() -> Ending | None`` forks where it is allowed and
available (POSIX with ``sigwaitinfo``): the child gets None and runs the command on, to be ended
by ``end_process(code)`` as every command is (which tells the parent, through a pipe, that
diagnose itself ended it); the parent waits for the child and gets how it ended (``Ending``:
its code or signal, and whether diagnose ended it), having forwarded to it the SIGINT, SIGTERM and SIGHUP sent to the parent alone
(``kill PID``, a job scheduler, ``timeout``): those the terminal sends (Ctrl-C, a hangup) reach
the whole process group, the child included, and are not sent twice. Where it is not allowed or
available, ``supervise()`` returns None without forking. No torch import: the parent stays small.

``note_step(...)``: the child tells the parent, at each step boundary, in memory they share (no
file, about 1 µs: whatever kills the child, the last step noted stays), the steps' times and
where the profiled window stands; ``Ending.steps`` is what the parent read there (``Steps``).
A crash inside the window loses the window's trace, which torch.profiler holds in the child's
memory until the window ends (docs/failures.md); the steps' times and the step it died in are kept.

``run_bounded(cmd, timeout) -> Finished``: a child command (verify's and sweep's runs) in a
process group of its own, stopped politely then killed, with everything it started, when it
runs past its time.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import mmap
import os
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

#: the signals the parent passes on to the child
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP")
#: si_code of a signal sent by kill(): only those are the parent's alone
_SI_USER, _SI_QUEUE, _SI_TKILL = 0, -1, -6

_allowed = False
#: in the supervised child: the pipe's end that tells the parent the child ended through
#: ``end_process`` (diagnose's own exit, its code to be trusted), not by a signal, an exec or
#: a C library's exit
_told: int | None = None

#: the steps the shared block holds (a --no-stop run's later steps are not noted: the window,
#: where a crash loses the trace, comes within the first few dozen)
NOTED_STEPS = 4096
#: the block's head: boundaries noted, the window's first step and its end (the step that
#: writes the trace), whether the profiler was on, how steps were counted (``instrument.MODES``)
_HEAD = struct.Struct("<iiii16s")
#: the block shared with the supervised child, and that child's pid (its own forks note nothing)
_steps_block: mmap.mmap | None = None
_child_pid = 0


@dataclass
class Steps:
    """What the supervised child noted last: its step boundaries (``time.perf_counter``, which
    both processes share), the profiled window's steps ``[warmup, window_end)`` and whether the
    profiler was on (from its start until the trace is written)."""

    boundaries: list[float]
    warmup: int
    window_end: int
    profiling: bool
    mode: str | None

    @property
    def step(self) -> int:
        """The step the child was in (counted from 0, as the progress lines count)."""
        return len(self.boundaries) - 1

    @property
    def in_window(self) -> bool:
        """It died with the profiler recording: in the window or while its trace was written."""
        return self.profiling and self.warmup <= self.step <= self.window_end

    def window_before(self) -> tuple[int, int] | None:
        """The warm-up and the profiled steps of a window that ends before the step the child
        died in (a crash in the script comes again at that step), or None where none fits: no
        step between the warm-up and it, or a death outside the window."""
        if not self.in_window:
            return None
        k, first, last = self.step, self.warmup, self.window_end - 1
        steps = k - first - (k > last)  # died while the trace was written: a window as long would again
        return (first, steps) if steps >= 1 else None

    def window_lost(self) -> str:
        """What a death inside the window lost, why, and how to get a report all the same: a
        window that ends before the step it died in (a crash in the script comes again there).
        The warm-up to suggest is the one that ran (a change of how steps are counted can
        lengthen the one asked for)."""
        k, first, last = self.step, self.warmup, self.window_end - 1
        where = (
            f"while the trace of the profiled window (steps {first}-{last}) was being written"
            if k > last
            else f"inside the profiled window (steps {first}-{last})"
        )
        before = self.window_before()
        if before is not None:
            how = f"For a report, profile a window that ends before step {k}: diagnose run --warmup {first} --steps {before[1]} --max-steps {before[1]} ..."
        elif first > 1:
            how = f"For a report, profile a window before step {k} with fewer warm-up steps, where the script allows it: diagnose run --warmup {first - 1} --steps 1 --max-steps 1 ..."
        else:
            how = f"Step {k} comes too soon for a window before it: run the script alone (python -X faulthandler) to see where it dies."
        return (
            f"the script's process died during step {k}, {where}: torch.profiler holds the window's events in the process's "
            f"memory until the window ends, so they died with it and no trace was written; the times of the steps before are kept. {how}"
        )


def note_step(index: int, at: float, warmup: int, window_end: int, profiling: bool, mode: str | None) -> None:
    """In the supervised child, at boundary ``index`` (``at``): the parent can read it however
    the child ends. A no-op anywhere else (no supervision, a process the child forked)."""
    block = _steps_block
    if block is None or index >= NOTED_STEPS or os.getpid() != _child_pid:
        return
    struct.pack_into("<d", block, _HEAD.size + 8 * index, at)
    _HEAD.pack_into(block, 0, index + 1, warmup, window_end, profiling, (mode or "").encode())


def _read_steps(block: mmap.mmap) -> Steps | None:
    count, warmup, window_end, profiling, mode = _HEAD.unpack_from(block, 0)
    if count <= 0:
        return None
    boundaries = list(struct.unpack_from(f"<{count}d", block, _HEAD.size))
    return Steps(boundaries, warmup, window_end, bool(profiling), mode.rstrip(b"\0").decode(errors="replace") or None)


def supervised() -> bool:
    """This process is the supervised child: its parent is the process the user started (whose
    start is the run's start, its interpreter and imports included)."""
    return _told is not None


def enable() -> None:
    global _allowed
    _allowed = True


def available() -> bool:
    return _allowed and hasattr(signal, "sigwaitinfo") and hasattr(os, "fork") and threading.active_count() == 1


@dataclass
class Ending:
    """How the child ended: its exit code, or the signal that killed it."""

    exit_code: int | None
    signal: int | None
    #: the signals the parent received while the child ran (forwarded or not), in order
    received: list[int] = field(default_factory=list)
    #: the child ended through ``end_process``: diagnose said what happened, with its exit code
    through_diagnose: bool = False
    #: the steps the child noted (None before its first step)
    steps: Steps | None = None

    @property
    def code(self) -> int:
        """The exit code the command ends with: the child's, or 128 + the signal, as a shell says."""
        return self.exit_code if self.signal is None else 128 + self.signal  # type: ignore[return-value]

    def describe(self) -> str:
        if self.signal is not None:
            name = signal.Signals(self.signal).name
            what = signal.strsignal(self.signal) or name
            return f"the script's process died of {name} ({what.lower()})"
        return f"the script's process ended with code {self.exit_code} without returning to diagnose (a C library's exit, or an exec)"


def supervise() -> Ending | None:
    global _told, _steps_block, _child_pid
    if not available():
        return None
    block = mmap.mmap(-1, _HEAD.size + 8 * NOTED_STEPS)  # anonymous, shared with the child
    told_read, told_write = os.pipe()  # not inherited across an exec: only diagnose's own exit writes
    watched = {getattr(signal, name) for name in FORWARDED} | {signal.SIGCHLD}
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        os.close(told_read)
        os.close(told_write)
        block.close()
        return None
    if pid == 0:
        os.close(told_read)
        _told = told_write
        _steps_block, _child_pid = block, os.getpid()
        _die_with_parent()
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        return None
    os.close(told_write)
    try:
        ending = _wait(pid, watched)
        os.set_blocking(told_read, False)
        try:
            ending.through_diagnose = os.read(told_read, 1) == b"1"
        except BlockingIOError:
            pass
        ending.steps = _read_steps(block)
        return ending
    finally:
        block.close()
        os.close(told_read)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)


def _wait(pid: int, watched: set[int]) -> Ending:
    received: list[int] = []
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            break
        info = signal.sigwaitinfo(watched)
        if info.si_signo == signal.SIGCHLD:
            continue
        received.append(info.si_signo)
        if info.si_code in (_SI_USER, _SI_QUEUE, _SI_TKILL) and info.si_pid != pid:
            try:  # sent to the parent alone: the child must hear it
                os.kill(pid, info.si_signo)
            except ProcessLookupError:
                pass
    if os.WIFSIGNALED(status):
        return Ending(None, os.WTERMSIG(status), received)
    return Ending(os.waitstatus_to_exitcode(status), None, received)


def _die_with_parent() -> None:
    """The child gets SIGTERM if the parent is killed (SIGKILL): never a run left orphaned."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the child outlives a killed parent
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def end_process(code: object) -> None:
    """End a command with ``code`` (a ``SystemExit`` code), its work done: the ``atexit``
    functions (the script's, torch's) run and the streams are flushed; threads the script left
    running are not waited for (a non-daemon thread would keep the process from exiting after
    its report); and a Ctrl-C, SIGTERM or SIGHUP from here on changes only the exit code
    (130, 143, 129), never kills the process by the signal itself (the interpreter's teardown
    puts the default handlers back: a Ctrl-C there ended ``diagnose`` with -2)."""
    if code is None:
        code = 0
    if not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    came: list[int] = []
    for name in FORWARDED:
        try:
            signal.signal(getattr(signal, name), lambda signum, frame: came.append(signum))
        except (ValueError, OSError, AttributeError):  # not the main thread; no such signal
            pass
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if left:
        names = ", ".join(sorted({t.name for t in left}))
        print(
            f"diagnose: note: the script left {len(left)} thread(s) running ({names}); diagnose exits without waiting for them",
            file=sys.stderr,
        )
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - an atexit function that fails must not keep the process
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if came and code < 128:
        code = 128 + came[0]
        words = "interrupted (Ctrl-C)" if came[0] == signal.SIGINT else f"terminated ({signal.Signals(came[0]).name})"
        try:
            print(f"diagnose: {words} as diagnose was exiting: its work was done", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
    if _told is not None:
        try:
            os.write(_told, b"1")
        except OSError:
            pass
    os._exit(code & 0xFF if code >= 0 else 1)


#: how long a child stopped politely (SIGTERM) has to save its report before SIGKILL
GRACE_S = 30.0


@dataclass
class Finished:
    """A bounded child's exit code (negative: the signal that ended it) and its output."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False


def run_bounded(
    cmd: list[str],
    timeout: float | None,
    env: dict[str, str] | None = None,
    grace_s: float = GRACE_S,
    on_stderr_line: Callable[[str], bool] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Finished:
    """Run ``cmd`` in a process group of its own, its output captured. Past ``timeout``, the
    whole group is stopped politely (SIGTERM: a ``diagnose run`` saves what it measured), then
    after ``grace_s`` killed; once the child ended, whatever it left in its group (the script's
    own children: a ``sleep 600``) is killed too. A Ctrl-C of the caller (the group no longer
    hears the terminal) is passed on the same way, as is whatever else ends the caller's wait
    (a SIGTERM its handler raises as ``SystemExit``), then raised. With ``on_stderr_line``, each
    line of the child's stderr is given to it as it comes (a progress line to draw), and kept in
    ``Finished.stderr`` only where it returns True."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, start_new_session=True
    )
    output = _Output(proc, on_stderr_line) if on_stderr_line is not None else None
    timed_out = False
    try:
        try:
            stdout, stderr = _communicate(proc, output, timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            stdout, stderr = _stop_group(proc, output, signal.SIGTERM, grace_s)
        except BaseException as exc:
            _stop_group(proc, output, signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM, grace_s)
            raise
    finally:
        _kill_group(proc.pid)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Finished(proc.returncode, stdout, stderr, timed_out)


class _Output:
    """A child's output read by two threads as it comes: stdout whole, stderr line by line."""

    def __init__(self, proc: subprocess.Popen[str], on_line: Callable[[str], bool]) -> None:
        self.out: list[str] = []
        self.err: list[str] = []
        self.threads = [
            threading.Thread(target=lambda: self.out.append(proc.stdout.read()), daemon=True),  # type: ignore[union-attr]
            threading.Thread(target=self._read_err, args=(proc, on_line), daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _read_err(self, proc: subprocess.Popen[str], on_line: Callable[[str], bool]) -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            if on_line(line):
                self.err.append(line)

    def wait(self, proc: subprocess.Popen[str], timeout: float | None) -> tuple[str, str]:
        proc.wait(timeout=timeout)
        for thread in self.threads:
            thread.join()
        return "".join(self.out), "".join(self.err)


def _communicate(proc: subprocess.Popen[str], output: _Output | None, timeout: float | None) -> tuple[str, str]:
    return output.wait(proc, timeout) if output is not None else proc.communicate(timeout=timeout)


def _stop_group(proc: subprocess.Popen[str], output: _Output | None, sig: int, grace_s: float) -> tuple[str, str]:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        return _communicate(proc, output, grace_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        return _communicate(proc, output, None)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
