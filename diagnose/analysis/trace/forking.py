"""Work done beside this process, in forked children: the analysis of a large trace on the
machine's other cores.

Contract: ``can_fork()`` says whether this process may fork (a fork exists, and no other thread
could hold a lock the child would inherit held); ``Beside(call)`` starts ``call()`` in a forked
child and ``result()`` returns its value; ``side_by_side(calls)`` runs calls at once, the first
here; ``Workers(call, n)`` keeps n forked children that apply ``call`` to what they are sent, in
order (the trace reader's pieces); ``SharedSlots`` hands those children large arguments through
memory shared before the fork (a gzipped trace's text), a slot's number through the pipe. Nothing here changes a result: a child's value comes back pickled (floats exactly), and
wherever a child cannot run or does not deliver (no fork, a failed fork, an exception, a child
killed) the call runs again in this process, so it returns what it would have returned here or
raises what it would have raised here.

Why fork: a child shares the parent's memory copy-on-write (a Timeline of a million events
costs it nothing to see) and starts in milliseconds; what it sends back must be small (a
breakdown: 21 KB for a 0.2 GB trace; a replay model would be 10 MB and take longer to pickle
than to build).
"""

from __future__ import annotations

import mmap
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def threads_in_process() -> int:
    """The threads of this process, native ones included (Linux: /proc/self/task), else the
    Python threads. A process with other threads is not forked: a lock another thread held at
    the fork (an import, a buffered stream, an allocator's) stays held in the child forever; the
    test suite hung that way in a worker process after earlier tests had left threads behind."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def can_fork() -> bool:
    """This process may fork: the platform forks, and no thread runs beside this one but the
    BLAS threads numpy started when ``diagnose.analysis.trace.vectorized`` imported it (they survive a
    fork: the BLAS pool is shut down and restarted around it, as every DataLoader worker forked
    after ``import numpy`` relies on)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    vectorized = sys.modules.get("diagnose.analysis.trace.vectorized")
    own_threads = 1 + (getattr(vectorized, "STARTED_THREADS", 0) if vectorized is not None else 0)
    return threads_in_process() <= own_threads


def cpus() -> int:
    """The CPUs this process may run on (the affinity mask, which containers and SLURM narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Beside(Generic[T]):
    """``call()`` computed in a forked child while this process goes on; ``result()`` waits for
    it. Where the child cannot be forked (``fork`` False, one CPU, a process that may not fork:
    ``can_fork``) or does not deliver, ``result()`` calls it here."""

    def __init__(self, call: Callable[[], T], fork: bool = True) -> None:
        self.call = call
        self.pid: int | None = None
        self._read = -1
        if not (fork and cpus() > 1 and can_fork()):
            return
        try:
            read, write = os.pipe()
        except OSError:
            return
        try:
            pid = os.fork()
        except OSError:  # no process left to fork
            os.close(read)
            os.close(write)
            return
        if pid == 0:  # pragma: no cover - the child (coverage does not follow a fork)
            os.close(read)
            _child(call, write)
        os.close(write)
        self.pid, self._read = pid, read

    @property
    def forked(self) -> bool:
        return self.pid is not None

    def result(self) -> T:
        if self.pid is None:
            return self.call()
        chunks = []
        try:
            with os.fdopen(self._read, "rb", closefd=True) as fh:
                self._read = -1
                while chunk := fh.read(1 << 20):
                    chunks.append(chunk)
        finally:
            status = self._reap(kill=False)
        if status == 0 and chunks:
            try:
                value: T = pickle.loads(b"".join(chunks))
                return value
            except Exception:  # noqa: BLE001 - a payload cut short: compute it here
                pass
        return self.call()

    def cancel(self) -> None:
        """Stop the child (this process no longer wants its result)."""
        if self._read >= 0:
            os.close(self._read)
            self._read = -1
        self._reap(kill=True)

    def _reap(self, kill: bool) -> int | None:
        pid, self.pid = self.pid, None
        return None if pid is None else _reap(pid, kill)


def _reap(pid: int, kill: bool) -> int | None:
    """Wait for the child ``pid`` to end (killed first with ``kill``): its exit code, None where
    someone else's SIGCHLD handler reaped it (its result is unknown)."""
    if kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            return None
        return os.waitstatus_to_exitcode(status)


def _own_signals() -> None:  # pragma: no cover - runs in the child
    """A forked child keeps no signal handler of the parent's: a SIGINT or SIGTERM ends it (not a
    second report), and a child of its own is not reaped by the parent's SIGCHLD handler."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    if hasattr(signal, "SIGCHLD"):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _child(call: Callable[[], object], write: int) -> None:  # pragma: no cover - runs in the child
    """Compute, send, and leave at once: no atexit handler, no buffered output of the parent's,
    no signal handler of the parent's (a SIGINT or SIGTERM ends the child, not a second report)."""
    code = 1
    try:
        _own_signals()
        data = pickle.dumps(call(), protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(write, "wb") as fh:
            fh.write(data)
        code = 0
    except BaseException:  # noqa: BLE001 - the parent computes it again and raises there
        pass
    finally:
        os._exit(code)


def side_by_side(calls: Sequence[Callable[[], T]], processes: int | None = None) -> list[T]:
    """Each call's result, in order: the first computed here, up to ``processes - 1`` others
    (default: this machine's CPUs) at a time in forked children; all here when this process
    may not fork or there is one call. An exception is raised as a call made here would raise
    it (a child's failure is computed again here)."""
    calls = list(calls)
    processes = cpus() if processes is None else processes
    if len(calls) <= 1 or processes <= 1 or not can_fork():
        return [call() for call in calls]
    results: list[T] = [None] * len(calls)  # type: ignore[list-item]
    rest = list(enumerate(calls))[1:]
    first = True
    while rest:
        batch, rest = rest[: processes - 1], rest[processes - 1 :]
        started: list[tuple[int, Beside[T]]] = []
        try:
            started = [(i, Beside(call)) for i, call in batch]
            if first:  # the first call here, while the first batch runs
                results[0], first = calls[0](), False
            for i, side in started:
                results[i] = side.result()
        finally:
            for _, side in started:
                side.cancel()
    return results


class Workers:
    """``processes`` forked children, each applying ``call`` to the arguments it is sent, in the
    order sent. ``submit(*args)`` sends a task to the next child (round robin) and returns what
    to call for its result; ``close()`` ends them. Results are read by this process, in order,
    when asked for: it starts no thread (``multiprocessing.Pool``'s worker-handler thread polls
    the result pipe in a busy loop whenever a result waits unread, and took 0.17 s of CPU and the
    GIL from a 0.2 GB trace's 1.3 s read on 2 cores), so that it may still fork afterwards.

    A result's getter raises what ``call`` raised; it returns None where the child died or its
    answer could not be sent (the caller computes it itself). Results of one child come back in
    the order sent: asking for one drops those sent to the same child before it and never asked
    for (abandoned). Sending large arguments to a child busy sending a large result would wait
    forever: the arguments are meant to be small (where to read, not what)."""

    def __init__(self, call: Callable[..., Any], processes: int) -> None:
        self.pids: list[int] = []
        self._conns: list[Connection] = []
        self._waiting: list[deque[object]] = []
        #: answers read ahead (``_drain``), pickled, in each child's order
        self._answers: list[deque[bytes]] = []
        self._next = 0
        for _ in range(processes):
            try:
                mine, theirs = multiprocessing.Pipe()
            except OSError:
                break
            try:
                pid = os.fork()
            except OSError:  # no process left to fork: fewer workers
                mine.close()
                theirs.close()
                break
            if pid == 0:  # pragma: no cover - the child (coverage does not follow a fork)
                mine.close()
                for other in self._conns:  # the parent's ends of the other children's pipes
                    other.close()
                _serve(call, theirs)
            theirs.close()
            self.pids.append(pid)
            self._conns.append(mine)
            self._waiting.append(deque())
            self._answers.append(deque())

    def __len__(self) -> int:
        return len(self.pids)

    def submit(self, *args: Any) -> Callable[[], Any]:
        child = self._next
        self._next = (child + 1) % len(self._conns)
        ticket = object()
        try:
            self._conns[child].send(args)
        except (OSError, ValueError):  # the child is gone (or its pipe closed)
            return nothing
        self._waiting[child].append(ticket)
        return partial(self._result, child, ticket)

    def _result(self, child: int, ticket: object) -> Any:
        waiting = self._waiting[child]
        if ticket not in waiting:
            return None
        self._drain()
        while waiting:
            current = waiting.popleft()
            answers = self._answers[child]
            try:
                ok, value = pickle.loads(answers.popleft() if answers else self._conns[child].recv_bytes())
            except Exception:  # noqa: BLE001 - a dead child (EOF), a cut or unreadable answer
                waiting.clear()
                answers.clear()
                return None
            if current is ticket:
                if ok:
                    return value
                raise value
        return None

    def _drain(self) -> None:
        """Read every answer already sent, whoever it is for: a child whose answer waits unread
        cannot send it (an answer is larger than a pipe holds) and so cannot start its next task
        (on a 16-core host the workers of the 0.2 GB trace sat idle 0.07-0.2 s each, waiting for
        the parent to come to their piece in order)."""
        ready = multiprocessing.connection.wait(
            [conn for conn, waiting in zip(self._conns, self._waiting, strict=True) if waiting], timeout=0
        )
        for conn in ready:
            child = self._conns.index(conn)  # type: ignore[arg-type]
            if len(self._answers[child]) < len(self._waiting[child]):
                try:
                    self._answers[child].append(conn.recv_bytes())  # type: ignore[union-attr]
                except Exception:  # noqa: BLE001 - a dead child: its getter finds out
                    pass

    def close(self) -> None:
        """End every child (at once: each holds nothing but the task it is on) and reap it."""
        for conn in self._conns:
            conn.close()
        for pid in self.pids:
            _reap(pid, kill=True)
        self.pids, self._conns, self._waiting, self._answers = [], [], [], []


def nothing() -> None:
    """A result's getter that delivers nothing: the caller computes the result itself."""
    return None


class SharedSlots:
    """``count`` slots of ``size`` bytes in anonymous memory shared with every process forked
    after it is made: this process ``take``s a free slot (None when none is free) and writes it
    through ``view``; a child reads it with ``read``; ``release`` frees the slot once the child's
    answer is in. A ``Workers`` child then receives a slot's number instead of the bytes: the
    pipe carries only small tasks, so that this process never waits to send one to a child that
    is itself waiting to send its answer, and several tasks per child can be under way. Pages are
    taken as slots are first written (``count * size`` is the most)."""

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self._memory = mmap.mmap(-1, max(1, count) * size)  # anonymous, MAP_SHARED
        self._free = list(range(count - 1, -1, -1))
        #: a slot released (or ``wake``): another thread may be waiting in ``take``
        self._freed = threading.Condition()

    def take(self, wait: threading.Event | None = None) -> int | None:
        """A free slot; None when none is free, or with ``wait``, once ``wait`` is set (until
        then it waits for a slot another thread releases)."""
        with self._freed:
            while not self._free:
                if wait is None or wait.is_set():
                    return None
                self._freed.wait()
            return self._free.pop()

    def wake(self) -> None:
        """Let a thread waiting in ``take`` look at its event again."""
        with self._freed:
            self._freed.notify_all()

    def view(self, slot: int) -> memoryview:
        """The slot's bytes, writable; release the view (``with``) before ``close``."""
        return memoryview(self._memory)[slot * self.size : (slot + 1) * self.size]

    def read(self, slot: int, length: int) -> bytes:
        start = slot * self.size
        return self._memory[start : start + length]

    def read_once(self, slot: int, length: int) -> bytes:
        """``read``, then the slot's pages unmapped from this process (a child: they stay in the
        shared memory for the others). Otherwise each worker kept every slot it had read in its
        resident set: 15 workers on a 1 GB trace counted 0.85 GiB more between them."""
        data = self.read(slot, length)
        if self.size % mmap.PAGESIZE == 0 and hasattr(self._memory, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            try:
                self._memory.madvise(mmap.MADV_DONTNEED, slot * self.size, self.size)
            except OSError:
                pass
        return data

    def release(self, slot: int) -> None:
        with self._freed:
            self._free.append(slot)
            self._freed.notify()

    def close(self) -> None:
        try:
            self._memory.close()
        except BufferError:  # a view still held: the memory goes with the last reference
            pass


def _serve(call: Callable[..., Any], conn: Connection) -> None:  # pragma: no cover - runs in the child
    """A worker's loop: each task's result, or the exception it raised, sent back in order; it
    ends when the parent's end closes. It leaves as ``_child`` does: no atexit handler, no signal
    handler of the parent's."""
    code = 1
    try:
        _own_signals()
        while True:
            try:
                args = conn.recv()
            except EOFError:
                break
            try:
                reply: tuple[bool, Any] = (True, call(*args))
            except Exception as exc:  # noqa: BLE001 - raised again by the result's getter
                reply = (False, exc)
            try:
                conn.send(reply)
            except Exception:  # noqa: BLE001 - a value that does not pickle: the parent computes it
                conn.send((True, None))
        code = 0
    except BaseException:  # noqa: BLE001 - the parent computes what it does not get
        pass
    finally:
        os._exit(code)
