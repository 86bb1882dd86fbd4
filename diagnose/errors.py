"""Errors that reach the user as one clear line (plus a hint), each with its exit code.

Contract: ``Failure.of(exc)`` is the one place an error becomes what the user sees and the
exit code: a ``DiagnoseError`` is ``diagnose: error: <message>`` and ``hint: <hint>`` on stderr
with its ``exit_code``; memory running out is one line, exit 4 (``EXIT_TRACE``); Ctrl-C is
``diagnose: interrupted``, exit 130. Every command of the CLI ends through it (``cliparse.Command``);
docs/failures.md lists the codes.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

#: Exit codes of the ``diagnose`` command itself (a failing script's own code is passed through).
EXIT_OK = 0
EXIT_SCRIPT_FAILED = 1  # used only when the script's own code is unknown
EXIT_USAGE = 2  # bad command line, missing script, malformed rule file
EXIT_NO_STEPS = 3  # the run ended before a single step could be profiled
EXIT_TRACE = 4  # a trace that cannot be read or analysed
EXIT_OUTPUT = 5  # the run directory cannot be written
EXIT_GATE = 6  # a --fail-on condition held (docs/ci.md)
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as shells report it
EXIT_TERMINATED = 143  # SIGTERM


class DiagnoseError(Exception):
    """An error with a one-line message, an optional hint and the exit code to use."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(DiagnoseError):
    exit_code = EXIT_USAGE


class TraceError(DiagnoseError):
    exit_code = EXIT_TRACE


class OutputError(DiagnoseError):
    exit_code = EXIT_OUTPUT

    #: the report that could not be saved (a read-only or full run directory): still shown
    report: object = None


class RuleError(DiagnoseError):
    """A rule file that cannot be used: the message names the file, line and problem."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Failure:
    """What an error shows (lines for stderr) and the exit code it ends the command with."""

    lines: tuple[str, ...]
    exit_code: int

    @classmethod
    def of(cls, exc: BaseException) -> Failure | None:
        """The failure an error is, or None for one that is not the user's to read (a bug: its
        traceback is the report). A ``MemoryError`` gets lines made beforehand: where memory ran
        out, building a message could fail again."""
        if isinstance(exc, DiagnoseError):
            return cls.of_error(exc)
        if memory_ran_out(exc):
            return OUT_OF_MEMORY
        if isinstance(exc, KeyboardInterrupt):
            return INTERRUPTED
        return None

    @classmethod
    def of_error(cls, exc: DiagnoseError) -> Failure:
        return cls((f"diagnose: error: {exc.message}", *((f"hint: {exc.hint}",) if exc.hint else ())), exc.exit_code)


def memory_ran_out(exc: BaseException) -> bool:
    """Whether ``exc`` says memory ran out: a ``MemoryError``, an ``OSError`` ENOMEM (a fork, a
    mapping), an import whose library the dynamic loader could not map (under an
    address-space limit, ``ulimit -v``, a lazy import fails so, not with a MemoryError), or a
    ``SystemError`` "error return without exception set" while 32 MB cannot be allocated."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    text = str(exc) if isinstance(exc, ImportError) else ""
    if "failed to map segment" in text or "cannot allocate memory" in text.lower():
        return True
    # A C function whose allocation failed and that set no exception (seen in an import under
    # ``ulimit -v``): a bug in that code, unless memory is short right now, which a probe says.
    return isinstance(exc, SystemError) and "without exception set" in str(exc) and _allocation_fails()


def _allocation_fails(probe_bytes: int = 32 << 20) -> bool:
    try:
        probe = bytearray(probe_bytes)
    except MemoryError:
        return True
    del probe
    return False


#: memory ran out anywhere a command did not say more (docs/failures.md: one line, exit 4)
OUT_OF_MEMORY = Failure(
    (
        "diagnose: error: memory ran out",
        "hint: free some memory, or give less to read (diagnose trim TRACE keeps fewer steps)",
    ),
    EXIT_TRACE,
)
INTERRUPTED = Failure(("diagnose: interrupted",), EXIT_INTERRUPTED)
