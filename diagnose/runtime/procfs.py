"""Small ``/proc`` files read beside a training loop without handing its GIL back and forth.

Contract: ``ProcReader().read(path) -> bytes | None`` (the file's first bytes; None where it
cannot be read); ``host_rss_bytes(reader)``; ``RunDelays(tasks, reader).read(skip)`` and
``.waited(thread_id)``. Linux only where it matters (``/proc``); elsewhere every read is None.

Why not ``open()`` or ``os.open``: each of their system calls releases the GIL and takes it back.
On ``diagnose watch``'s sampler thread, beside a training thread that holds the GIL, a take-back
that wins the race for it makes the sampler wait for the training thread to drop it (at its next
release, or when the interpreter's switch interval forces it). Reading every thread's
``schedstat`` is three system calls a thread. ``ProcReader`` calls libc's ``open``/``read``/
``close`` through ``ctypes.PyDLL``, which keeps the GIL for the call: a whole sample then holds
the GIL for its fraction of a millisecond once, instead of handing it over at every call. Where
libc cannot be loaded so (not Linux, no ``ctypes``), it falls back to ``os.open``, which gives
the same bytes. Measured, the hand-offs were cheap (a step's torch ops release the GIL dozens of
times): on one H200 the two readers' cost per launch-bound step did not differ beyond the blocks'
spread (docs/watch.md, the seventeenth session).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Any

#: the most bytes read of a file (``statm`` and ``schedstat`` are a line of numbers)
READ_BYTES = 256


def _libc_holding_gil() -> Any | None:
    """libc's ``open``/``read``/``close`` called with the GIL held, or None where not loadable."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        libc.open.argtypes = [ctypes.c_char_p, ctypes.c_int]
        libc.open.restype = ctypes.c_int
        libc.read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        libc.read.restype = ctypes.c_ssize_t
        libc.close.argtypes = [ctypes.c_int]
        libc.close.restype = ctypes.c_int
    except (OSError, AttributeError, TypeError):
        return None
    return libc


class ProcReader:
    """Reads a small file whole in one ``read``, the GIL held throughout (``hold_gil``; the
    benchmarks compare against ``hold_gil=False``, the ``os.open`` path)."""

    def __init__(self, hold_gil: bool = True) -> None:
        self._libc = _libc_holding_gil() if hold_gil else None
        self._flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)

    @property
    def holds_gil(self) -> bool:
        return self._libc is not None

    def read(self, path: str) -> bytes | None:
        libc = self._libc
        if libc is None:
            try:
                fd = os.open(path, self._flags)
            except OSError:
                return None
            try:
                return os.read(fd, READ_BYTES)
            except OSError:
                return None
            finally:
                os.close(fd)
        # a buffer per call: two threads may sample (the training thread at the first boundary)
        buf = ctypes.create_string_buffer(READ_BYTES)
        fd = libc.open(path.encode(), self._flags)
        if fd < 0:
            return None
        try:
            n = libc.read(fd, buf, READ_BYTES)
        finally:
            libc.close(fd)
        return buf.raw[:n] if n >= 0 else None


def host_rss_bytes(reader: ProcReader | None = None) -> int | None:
    """The process's resident set (``/proc/self/statm``), None where it cannot be read."""
    data = (reader or ProcReader(hold_gil=False)).read("/proc/self/statm")
    try:
        return int(data.split()[1]) * os.sysconf("SC_PAGE_SIZE") if data else None
    except (ValueError, IndexError, OSError):
        return None


class RunDelays:
    """The process's threads' waits for a CPU, as one running sum over its threads
    (``schedstat``; the sampler's own thread left out). The training thread's own wait misses a
    stall where it waits on torch's intra-op threads (a matmul split across cores) while they
    wait for a CPU, and their waits alternate (one runs, reaches the barrier, and waits for the
    other): on two cores with bursts of other work, the training thread's wait alone left 1-4% of
    a watched run's wall-clock unexplained, the most any one thread waited 2-5%, the sum under
    1%. The sum can exceed what a step lost where threads wait at once; the accounting hands a
    stall no more than its excess."""

    def __init__(self, tasks: str = "/proc/self/task", reader: ProcReader | None = None) -> None:
        self.tasks = tasks
        self.reader = reader or ProcReader()
        self._last: dict[str, float] = {}
        self._read: dict[str, float] = {}  # this read's, by thread (empty where it failed)
        self.total = 0.0

    def waited(self, thread_id: int | None) -> float | None:
        """Seconds the thread of native id ``thread_id`` had waited for a CPU at the last read
        (None: not read): the training thread's own, from the same read as the sum."""
        return self._read.get(str(thread_id)) if thread_id is not None else None

    def read(self, skip: int | None = None) -> float | None:
        """The running sum (seconds) after this read; None where ``schedstat`` cannot be read.
        A thread seen for the first time adds nothing (its wait before is not in the interval)."""
        now: dict[str, float] = {}
        self._read = now
        try:
            tids = os.listdir(self.tasks)  # the one call of a read that releases the GIL
        except OSError:
            return None
        skipped = str(skip) if skip is not None else None
        read = self.reader.read
        for tid in tids:
            if tid == skipped:
                continue
            data = read(f"{self.tasks}/{tid}/schedstat")
            if data is None:
                continue  # a thread that ended between the listing and the read
            with contextlib.suppress(ValueError, IndexError):
                now[tid] = int(data.split()[1]) / 1e9
        if not now:
            return None
        if self._last:
            self.total += sum(v - self._last.get(t, v) for t, v in now.items())
        self._last = now
        return self.total
