"""Kineto's own log lines kept off the user's terminal.

Contract: ``without_kineto_lines()`` is a context manager for the calls that start, step or
stop torch.profiler. Kineto (libkineto, in C++) writes lines such as
``USDT:2026-11-27 05:01:21 28288:28288 SyncActivityProfilerHandler.cpp:52] profiler_start``
straight to file descriptor 2, whatever its log level (``KINETO_LOG_LEVEL`` does not silence
them): they land inside diagnose's progress line, and say nothing to a user. For the block,
descriptor 2 is pointed at a scratch file; afterwards every line of it that is not Kineto's is
written to the real stderr, in order, so that nothing the script (or torch) said is lost. Where
the descriptors cannot be moved (no descriptor 2, an odd platform) the block runs as it is.
Inside the block, torch's own spurious profiler warnings (``SPURIOUS_WARNINGS``) are ignored.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator

#: ``USDT:`` / ``STAGE:`` / glog letters, a date, a time, pid:tid, a C++ file and line, then ``]``
KINETO_LINE = re.compile(
    rb"^(?:USDT|STAGE|[IWE]\d{4}|[IWE]):?\s*\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \d+:\d+ [\w./-]+\.(?:cpp|cc|h):\d+\] "
)


#: torch (2.11 and older) warns that the profiler "clears events at the end of each cycle" where
#: a schedule has one cycle only, as diagnose's has (pytorch/pytorch#180387, fixed since): a line
#: on every GPU run's terminal that says nothing of the script
SPURIOUS_WARNINGS = (r"Warning: Profiler clears events at the end of each cycle",)


def kept_lines(raw: bytes) -> bytes:
    """``raw`` without Kineto's log lines."""
    return b"".join(line for line in raw.splitlines(keepends=True) if not KINETO_LINE.match(line))


@contextlib.contextmanager
def without_kineto_lines() -> Iterator[None]:
    with warnings.catch_warnings():
        for message in SPURIOUS_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        with _fd2_filtered():
            yield


@contextlib.contextmanager
def _fd2_filtered() -> Iterator[None]:
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    scratch = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below, once stderr is back
    try:
        os.dup2(scratch.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            scratch.seek(0)
            rest = kept_lines(scratch.read())
            if rest:
                os.write(2, rest)
    finally:
        os.close(saved)
        scratch.close()
