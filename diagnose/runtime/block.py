"""Profile a block of code in this process (``with diagnose.profile() as run: train()``).

Contract: ``BlockRun(name, plan, run_dir, ...)`` is a context manager around the caller's own
code. It installs the same hooks and capture session as a script run (``runner._ScriptRun``):
steps come from optimizer steps (else DataLoader batches, else model calls), the window is the
``WindowPlan``'s, and with ``plan.stop`` the block is stopped once everything is measured (the
capture raises ``StopScript`` in the block, and leaving the ``with`` swallows it). On leaving,
the record is saved in the run directory; ``record`` holds it.

A block is not a script: ``sys.argv``, ``sys.path`` and ``__main__`` are left as they are, and no
SIGTERM handler or ``os._exit`` patch is installed (a notebook kernel owns those). An exception
of the block's own is recorded (status ``failed`` or ``oom``) and then raised again, as Python
would.
"""

from __future__ import annotations

import os
import time
from types import TracebackType
from typing import Any

from diagnose import errors
from diagnose.progress import Progress
from diagnose.record import WindowPlan
from diagnose.rundir import RunDir
from diagnose.runtime.capture import StopScript
from diagnose.runtime.runner import _ACTIVE, Target, _describe_error, _is_oom, _ScriptRun
from diagnose.signals import SignalHold


class BlockRun(_ScriptRun):
    def __init__(
        self,
        name: str,
        plan: WindowPlan,
        run_dir: RunDir,
        *,
        knobs: Any | None = None,
        progress: Progress | None = None,
        extra_hooks: list[Any] | None = None,
        rank: int | None = None,
    ) -> None:
        # a block never holds the caller's signals: the hold is released as soon as it is taken
        super().__init__(
            Target("block", name),
            plan,
            run_dir,
            rank,
            knobs,
            progress or Progress(),
            list(extra_hooks or []),
            None,
            SignalHold(),
        )
        self.record.target = {"kind": "block", "value": name, "args": [], "cwd": os.getcwd()}

    def __enter__(self) -> BlockRun:
        try:
            self._install()
        except BaseException:
            self._uninstall()
            raise
        self.progress.phase(f"profiling {self.target.value}")
        self.record.script_start_s = time.perf_counter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        status, exit_code, error = "completed", errors.EXIT_OK, None
        if exc is not None:
            status, exit_code, error = self._ending(exc)
        try:
            self._finalize(status, exit_code, error)
        finally:
            self._uninstall()
            self.hold.release()
        record = self.record
        if record.completed_steps() == 0 and record.status in ("completed", "stopped"):
            record.status = "no_steps"
            self.run_dir.save_record(record, self.rank)
        return isinstance(exc, StopScript)  # diagnose's own stop ends the block quietly

    def _install(self) -> None:
        """The script run's hooks without the process-wide changes a script run makes."""
        self._install_hooks()
        _ACTIVE.append(self)

    def _ending(self, exc: BaseException) -> tuple[str, int, dict[str, Any] | None]:
        """How the block ended. Its own exception is raised again on leaving the ``with``, so
        it is recorded without printing its traceback here."""
        if isinstance(exc, StopScript):
            return "stopped", errors.EXIT_OK, None
        if isinstance(exc, KeyboardInterrupt):
            return "interrupted", errors.EXIT_INTERRUPTED, _describe_error(exc)
        if isinstance(exc, SystemExit):
            return super()._ending(exc)
        return ("oom" if _is_oom(exc) else "failed"), errors.EXIT_SCRIPT_FAILED, _describe_error(exc)
