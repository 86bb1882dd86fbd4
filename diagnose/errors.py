"""Errors that reach the user as one clear line (plus a hint), each with its exit code.

The CLI turns a ``DiagnoseError`` into ``diagnose: error: <message>`` and ``hint: <hint>`` on
stderr and exits with ``exit_code``; docs/failures.md lists the codes.
"""

from __future__ import annotations

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
