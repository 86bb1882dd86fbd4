"""Stage 2: the profiling window. Warm up, profile a few steps, time more without the profiler,
then stop the script.

Contract: a ``CaptureSession`` receives step boundaries (from ``instrument.StepClock``) and
drives ``torch.profiler`` with a schedule, so that the trace carries ``ProfilerStep#N`` marks
numbered like the script's steps (``N`` counts from the first step diagnose saw). The steps are
the ``WindowPlan``'s (record.py): warm-up, profiled, one that absorbs the trace export, timed with
plain clocks and the profiler off. The session alone opens and closes the window: it tells its
``WindowListener`` (the runner) when the first profiled step starts, when the last one ended
(before the trace is written) and when the profiler has stopped.

The window grows when the plan allows it (``WindowPlan.max_steps``): the profiler's schedule is
active for up to ``max_steps``, and at the planned window's end, then at each later boundary,
the session profiles one more step while the profiled steps are unsettled
(``record.window_unsettled``: p90 over 1.5x the median, or their mean uncertain by more than
``record.WINDOW_MEAN_UNCERTAINTY``, the proxy of an unsettled ranking), the bound is not reached and the window
has lasted under ``record.GROWTH_BUDGET_S``; otherwise it stops the profiler there (the trace
ends with the last completed step). ``self.plan`` is then the plan as it runs: every later
boundary (export, timed steps, stop) moves with it. A rank of a distributed run never grows its
window: the ranks must stop at the same step.

At the first step the plan is cut to the steps the script's settings promise (``length``, from
the runner: its ``--max_iters``, epochs times its DataLoader, its framework's ``max_steps``;
``WindowPlan.fitted``), warm-up first, so that a short script is profiled and timed as far as
its steps go; ``self.asked`` keeps the plan as asked and ``self.fit`` says why it was cut. A
script that ends with a step no fetch closed has it closed at its optimizer step
(``on_last_boundary``); one that ends during the timing keeps the timed steps it had
(``timed_so_far``); under ``--no-stop`` every later boundary still counts.

Only what the analysis needs is collected: no shapes, stacks, memory events or FLOPs, which
make traces 5-20x larger.
"""

from __future__ import annotations

import dataclasses
import errno
import gc
import gzip
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from diagnose import record as _record
from diagnose import supervise
from diagnose.progress import Progress
from diagnose.record import RunLength, WindowPlan, mean_uncertainty_estimate, window_unsettled
from diagnose.rundir import RunDir
from diagnose.runtime.foreign import ForeignProfilers
from diagnose.runtime.kinetolog import without_kineto_lines
from diagnose.signals import deferred


class StopScript(BaseException):
    """Raised inside the script's own call stack once diagnose has measured enough.

    A BaseException, so that a script's ``except Exception`` does not swallow it."""


class WindowListener(Protocol):
    def window_opened(self) -> None:
        """The first profiled step starts."""

    def window_closing(self) -> None:
        """The last profiled step ended (or the step count restarted): the trace is written next."""

    def window_closed(self) -> None:
        """The profiler has stopped, at the window's end or early; the trace is saved."""


class CaptureSession:
    def __init__(
        self,
        plan: WindowPlan,
        run_dir: RunDir,
        progress: Progress,
        window: WindowListener,
        rank: int | None = None,
        prefetched: Callable[[], int] | None = None,
        length: Callable[[], RunLength | None] | None = None,
        data_wait: Callable[[], float] | None = None,
    ) -> None:
        #: the plan as asked; ``planned`` is it cut to the steps the script has (``fitted``)
        self.asked = plan
        #: the plan as it runs: the window may grow past the planned steps
        self.plan = plan
        self.planned = plan
        self.may_grow = plan.grows() and rank is None
        #: how many steps the script will make, as its settings say (None: they do not)
        self.length = length or (lambda: None)
        #: the plan was cut to the script's steps: ``asked`` (the plan as asked), ``steps`` and
        #: ``source`` (what said so); empty when it was not
        self.fit: dict[str, Any] = {}
        #: how the window grew (``RunRecord.window_growth``); empty while it did not try
        self.growth: dict[str, Any] = {}
        self.run_dir = run_dir
        self.progress = progress
        self.window = window
        self.rank = rank
        self.boundaries: list[float] = []
        #: seconds the training thread had waited inside DataLoader ``__next__`` at each boundary
        #: (``data_wait``: the step clock's running sum), aligned with ``boundaries``
        self.data_waits: list[float] = []
        self.data_wait = data_wait
        self.trace_files: list[str] = []
        self.timed_start: float | None = None
        self.timed_end: float | None = None
        #: how many batches the DataLoader workers can hold queued (num_workers x prefetch_factor)
        self.prefetched = prefetched or (lambda: 0)
        #: steps after the window that are not timed: they drew batches the workers queued
        #: while the slower profiled steps ran, which would overstate the steady state
        self.timed_skip = 0
        self.window_closed = False
        #: whether the current step is a profiled one (the listener was told it opened)
        self.in_window = False
        self.finished = False
        self.mode: str | None = None
        self.profiler_blocked = False
        self._profiler: Any = None
        self._discard_trace = False
        self._cuda = False
        #: why profiling stopped short or never ran (the script's own profiler, ...), if it did
        self.notes: list[str] = []
        #: the script's own profilers (diagnose steps aside for them)
        self.foreign = ForeignProfilers()
        #: profiled steps kept when diagnose stepped aside for the script's profiler
        self._profiled_cut: int | None = None
        #: whether a reset dropped a running profiler and the new one waits for a boundary outside
        #: the resetting call (``on_reset``); ``in_reset_call`` says whether a boundary is inside it
        self._restart_pending = False
        self.in_reset_call: Callable[[], bool] = lambda: False
        #: the boundary that started the profiler (its schedule counts from there)
        self._start_at = 0
        #: the boundaries before this one, from the first timed step on, only count
        #: (``on_boundary``'s short path); 0 until the timing starts
        self._quiet_until = 0

    # --- the script's own torch.profiler ----------------------------------------------------------

    def guard_foreign_profilers(self) -> None:
        """Kineto holds one session, and a second profiler's would crash whichever stops first
        (``foreign.py``): from here on, diagnose's profiler steps aside for the script's."""
        self.foreign.install(on_session=self._foreign_session_starting)

    def _foreign_session_starting(self) -> None:
        """The script's profiler is about to take Kineto: diagnose's stops first."""
        if self._profiler is not None:
            self._step_aside(
                f"the script started its own torch.profiler during step {max(0, len(self.boundaries) - 1)}"
            )

    def _step_aside(self, why: str) -> None:
        """Stop (or never start) diagnose's profiler for good, saving the profiled steps it has."""
        profiled = self.plan.profiled(max(0, len(self.boundaries) - 1)) if self._profiler is not None else 0
        if self._profiler is not None:
            self._end_window_early()
        self.profiler_blocked = True
        self._profiled_cut = profiled
        kept = f"kept the {profiled} profiled step(s) it had" if profiled else "did not profile"
        self.notes.append(
            f"{why}: Kineto holds one profiling session, so diagnose {kept} and left the profiler to the script; "
            "step times and throughput are still measured"
        )

    def _end_window_early(self) -> None:
        """Stop the profiler before the window's end: keep the trace if any profiled step ran."""
        in_window = len(self.boundaries) > self.plan.warmup
        self._discard_trace = not in_window
        self._stop_profiler()
        self._discard_trace = False
        if in_window and not self.window_closed:
            self.window_closed = True
            self.window.window_closed()

    # --- called by the StepClock ----------------------------------------------------------------

    def on_reset(self, mode: str) -> None:
        """A stronger step signal appeared: start counting again in that mode."""
        self.mode = mode
        self._leave_window()
        # The reset comes from inside a step (the optimizer's post hook: within torch's
        # ``Optimizer.step#...`` record_function and diagnose's phase marks, all begun under the
        # profiler dropped here), and the new count's first boundaries may come from that same
        # call. Those record_functions end afterwards; ended while a newer profiler session runs,
        # torch (2.13.0 at least) writes their end time into the dropped session's freed event
        # storage: heap corruption, an abort at a later ``gc.collect()``. So the new profiler
        # starts at the first boundary of a later call (``on_boundary``). A reset before that
        # keeps it pending: the first dropped session's record_functions may still be open.
        self._restart_pending = self._restart_pending or self._profiler is not None
        self._drop_profiler()
        self.boundaries = []
        self.data_waits = []
        self.timed_start = self.timed_end = None
        self.timed_skip = 0
        self._quiet_until = 0
        self.window_closed = False
        self.plan = self.planned = self.asked
        self.may_grow = self.asked.grows() and self.rank is None
        self.fit = {}
        self.growth = {}

    def on_boundary(self, now: float) -> None:
        if self.finished:
            if not self.plan.stop:  # --no-stop: the script runs on, and its steps still count
                self._add_boundary(now)
            return
        k = len(self.boundaries)
        if k < self._quiet_until:  # inside the timed steps: counted, noted, drawn; nothing starts or ends
            self._add_boundary(now)
            plan = self.plan
            supervise.note_step(k, now, plan.warmup, plan.window_end, False, self.mode)
            if self.progress.interactive:
                self._report(k)
            return
        self._add_boundary(now)
        if k == 0:
            self._fit_to_script()
        starts = self._starts_profiler(k)
        if k == self.plan.window_end and self.may_grow and self._profiler is not None:
            self._grow_or_end(k, now)
        plan = self.plan
        # for the supervising parent, in memory it shares: what a crash from here on leaves
        supervise.note_step(
            k,
            now,
            plan.warmup,
            plan.window_end,
            (starts or self._profiler is not None) and not self.profiler_blocked,
            self.mode,
        )
        if not plan.in_window(k):
            self._leave_window()  # before the export: samplers stop first
        if (starts or self._profiler is not None) and not self.profiler_blocked and k <= plan.window_end:
            foreign = self.foreign.active()
            if foreign is not None:  # never a second Kineto session over the script's
                self._step_aside(f"the script's own torch.profiler was on at step {k} ({foreign})")
        if starts and not self.profiler_blocked:
            self._start_at = k
            self._start_profiler()
        elif self._profiler is not None and k == plan.window_end:
            # stop() ends the last step's mark and saves the trace, wherever the schedule is
            # (a grown window ends before the schedule's last active step)
            self._close_window()
        elif self._profiler is not None and k < plan.window_end:
            try:
                with self.foreign.ours(), deferred(), without_kineto_lines():
                    self._profiler.step()
            except RuntimeError as exc:  # e.g. the script's own profiler holds Kineto
                self._profiler_failed(exc)
        if plan.in_window(k) and not self.in_window and not self.window_closed:
            self.in_window = True
            self.window.window_opened()
        if k == plan.window_end + 1 and not self.timed_skip:
            self.timed_skip = max(0, int(self.prefetched()))
        if plan.timed and k == plan.first_timed + self.timed_skip:
            self._synchronize()
            self.timed_start = time.perf_counter()
            if self._profiler is None:
                # until the last timed boundary only the count goes on: the hooks' cost is in
                # every timed step, and the timed steps are the steady state reported
                self._quiet_until = plan.last_boundary + self.timed_skip
        if plan.timed and k == plan.last_boundary + self.timed_skip:
            self._synchronize()
            self.timed_end = time.perf_counter()
            self.finished = True
            self.progress.phase(f"measured {plan.timed} steps without the profiler")
            if plan.stop:
                raise StopScript()
            self.progress.phase("--no-stop: the script runs on to its end")
            return
        self._report(k)

    def _add_boundary(self, now: float) -> None:
        self.boundaries.append(now)
        if self.data_wait is not None:
            self.data_waits.append(self.data_wait())

    def _fit_to_script(self) -> None:
        """At the first step, once the script has parsed its options and built its loader:
        cut the plan to the steps it will make (``WindowPlan.fitted``), so that a short script
        is profiled and timed as far as its steps go instead of ending before the timing."""
        try:
            length = self.length()
        except Exception:  # noqa: BLE001 - an estimate that fails leaves the plan as asked
            length = None
        if length is None:
            return
        fitted = self.asked.fitted(length.steps)
        if fitted != self.asked:
            self.plan = self.planned = fitted
            self.may_grow = fitted.grows() and self.rank is None
            self.fit = {"asked": dataclasses.asdict(self.asked), "steps": length.steps, "source": length.source}

    def on_last_boundary(self, at: float) -> None:
        """The script ended with a step whose boundary no fetch committed: it ends at ``at``
        (its optimizer step). Only counted (the profiler, if still on, is stopped by
        ``finish``); it completes the timing when it is the last timed step's end."""
        k = len(self.boundaries)
        self._add_boundary(at)
        if self.finished or self.timed_start is None:
            return
        if k == self.plan.last_boundary + self.timed_skip:
            self.timed_end = at
            self.finished = True

    def timed_so_far(self) -> tuple[int, float] | None:
        """The script ended during the timed steps: how many completed and how long they took
        (boundary to boundary; the last one is not synchronised with the GPU), None otherwise."""
        if self.timed_start is None or self.timed_end is not None:
            return None
        first = self.plan.first_timed + self.timed_skip
        done = len(self.boundaries) - 1 - first
        return (done, self.boundaries[-1] - self.boundaries[first]) if done > 0 else None

    def _starts_profiler(self, k: int) -> bool:
        """Whether boundary ``k`` starts the profiler: the one before the window (its schedule's
        warm-up step), or after a reset that dropped a running one, the first outside the
        resetting call. Started that late, it may have no warm-up step of its own (it records at
        once) and the warm-up grows where the window would have begun before it. Not earlier:
        a profiler waiting through its schedule costs every step a ``step()`` and a record
        function (``diagnose watch --warmup 400`` on a launch-bound loop: steps 10-15% slower
        before its window)."""
        if not self._restart_pending:
            return k == max(self.plan.warmup - 1, 0)
        if self.in_reset_call():
            return False
        self._restart_pending = False
        if k > self.plan.warmup:
            self.plan = dataclasses.replace(self.plan, warmup=k)
        return True

    def _grow_or_end(self, k: int, now: float) -> None:
        """At the window's current end: one more profiled step while the profiled steps vary
        widely, under the bound and the time budget; else say why the window ends here."""
        plan = self.plan
        durations = [self.boundaries[i + 1] - self.boundaries[i] for i in range(plan.warmup, k)]
        if not self.growth:
            self.growth = {
                "planned_steps": self.planned.steps,
                "max_steps": plan.step_bound,
                "steps": plan.steps,
                "ended_by": None,
                "p90_over_median": _p90_over_median(durations),
            }
        self.growth["mean_uncertainty"] = round(mean_uncertainty_estimate(durations), 4)
        if not window_unsettled(durations):
            ended_by = "steady"
        elif plan.steps >= plan.step_bound:
            ended_by = "bound"
        elif now - self.boundaries[plan.warmup] >= _record.GROWTH_BUDGET_S:
            ended_by = "budget"
        else:
            if plan.steps == self.planned.steps:
                self.progress.phase(
                    f"the profiled steps vary widely (p90 {self.growth['p90_over_median']:.1f}x the median, their mean "
                    f"±{self.growth['mean_uncertainty']:.0%}): profiling up to {plan.step_bound} steps while they do"
                )
            self.plan = plan.grown()
            self.growth["steps"] = self.plan.steps
            return
        self.growth["ended_by"] = ended_by

    def _leave_window(self) -> None:
        if self.in_window:
            self.in_window = False
            self.window.window_closing()

    # --- profiler -------------------------------------------------------------------------------

    def _start_profiler(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        # Kineto leaves CUPTI attached after a trace unless told to tear it down; every later
        # kernel launch then pays for its callbacks (measured on an H200: steps of launch-bound
        # loops 20-70% slower after the window). torch sets "0" itself where CUDA graphs need it.
        os.environ.setdefault("TEARDOWN_CUPTI", "1")
        self._cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
        self._discard_trace = False
        try:
            self._profiler = self._new_profiler(profile, schedule, activities)
            with self.foreign.ours(), deferred(), without_kineto_lines():
                self._profiler.start()
        except RuntimeError as exc:
            self._profiler_failed(exc)

    def _profiler_failed(self, exc: Exception) -> None:
        self.notes.append(
            f"torch.profiler could not run ({str(exc).splitlines()[0]}); is the script profiling itself? "
            "diagnose measured step times only"
        )
        self._profiler = None
        self.profiler_blocked = True

    def _new_profiler(self, profile: Any, schedule: Any, activities: list[Any]) -> Any:
        # the steps it steps through before the window: fewer when it starts late (``_start_at``)
        before = max(self.plan.warmup - self._start_at, 0)
        with warnings.catch_warnings():
            # started at the window's first step (after a reset, ``_starts_profiler``): no warm-up step
            warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
            return self._profile(profile, schedule, activities, before)

    def _profile(self, profile: Any, schedule: Any, activities: list[Any], before: int) -> Any:
        return profile(
            activities=activities,
            # active for the most steps the window may grow to: the session stops it at the window's end
            schedule=schedule(
                wait=max(before - 1, 0), warmup=1 if before else 0, active=self._active_steps(), repeat=1
            ),
            on_trace_ready=self._save_trace,
            record_shapes=False,
            profile_memory=False,
            with_stack=False,
            with_flops=False,
            with_modules=False,
        )

    def _active_steps(self) -> int:
        return self.plan.step_bound if self.may_grow else self.plan.steps

    def _save_trace(self, prof: Any) -> None:
        if self._discard_trace:
            return
        path = self.run_dir.new_trace_path(self.rank)
        self.progress.phase("writing the trace")
        raw = path.with_name(path.name[: -len(".gz")])
        # Written under a name no reader looks for and renamed when complete: an export that
        # fails (out of memory, disk full) leaves no cut-short trace for ``analyze`` to pick,
        # and never raises into the script. Kineto writes the path into the trace unescaped
        # ("traceName"): a quote, a backslash or a control character (a newline) in the run
        # directory's path would make the JSON invalid, so such a run exports under a plain
        # temporary folder.
        plain = not any(c in str(raw) for c in '"\\') and str(raw).isprintable()
        exported = (
            raw.with_name(raw.name + ".partial")
            if plain
            else Path(tempfile.mkdtemp(prefix="diagnose-trace-")) / "trace.json"
        )
        # Kineto writes its own temporary file (the name plus ".tmp") and renames it; a write
        # that fails there (a full disk, a file-size limit) is not raised: it leaves its
        # temporary file and no trace
        kineto_tmp = exported.with_name(exported.name + ".tmp")
        try:
            prof.export_chrome_trace(str(exported))
            if not exported.is_file():
                raise OSError(
                    errno.EIO, "torch.profiler wrote no trace: is the disk full, or a file-size limit (ulimit -f) set?"
                )
            shutil.move(str(exported), str(raw))
        except (OSError, MemoryError, RuntimeError) as exc:  # RuntimeError: Kineto's own failures
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
            self.notes.append(f"the trace could not be written ({why}); the report holds what was measured without it")
            for leftover in (kineto_tmp, exported, raw):
                leftover.unlink(missing_ok=True)
            return
        finally:
            if not plain:
                shutil.rmtree(exported.parent, ignore_errors=True)
        # torch would gzip at level 9 (seconds for a large trace); level 6 is 3x faster and
        # within a few percent of the size. Written under a name no reader looks for, renamed
        # when complete: a compression that fails (out of memory, disk full) leaves the raw
        # trace, which is then the one recorded, and no cut-short .gz beside it.
        partial = path.with_name(path.name + ".partial")
        try:
            with raw.open("rb") as src, gzip.open(partial, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 16 * 1024 * 1024)
            partial.replace(path)
        except (OSError, MemoryError) as exc:
            partial.unlink(missing_ok=True)
            self.notes.append(
                f"the trace could not be compressed ({type(exc).__name__}: {exc}); kept uncompressed as {raw.name}"
            )
            self.trace_files.append(raw.name)
            return
        raw.unlink()
        self.trace_files.append(path.name)

    def _close_window(self) -> None:
        """The last profiled step just ended (the trace is saved): stop the profiler for good."""
        self._stop_profiler()
        self._note_cupti_attached()
        self.window_closed = True
        self.window.window_closed()
        # The profiler's results may sit in reference cycles; collect them now, inside the
        # step that is not timed, rather than in a pause during the timed steps.
        gc.collect()

    def _note_cupti_attached(self) -> None:
        """Where CUPTI stays attached after a window with CUDA activity (``TEARDOWN_CUPTI`` other
        than "1": torch sets "0" while its CUDA graphs need CUPTI, or the environment did), every
        later kernel launch pays for CUPTI's callbacks: the steps timed after the window, and the
        rest of a watched run, are slower than without diagnose. Said, not hidden."""
        value = os.environ.get("TEARDOWN_CUPTI")
        if self._cuda and value != "1":
            self.notes.append(
                f"CUPTI stayed attached after the profiled window (TEARDOWN_CUPTI={value or 'unset'}"
                "; torch sets 0 where its CUDA graphs need it): every later kernel launch pays for its "
                "callbacks, so the steps after the window run slower than without diagnose (a launch-bound "
                "loop 25-40% on an H100)"
            )

    def _stop_profiler(self) -> None:
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        with self.foreign.ours(), deferred():
            stop_profiler(profiler)

    def _drop_profiler(self) -> None:
        self._discard_trace = True
        self._stop_profiler()
        self._discard_trace = False

    def finish(self) -> None:
        """The script ended (or failed) early: save what the window captured so far."""
        if self._profiler is not None:
            if self.growth and self.growth["ended_by"] is None:
                self.growth["ended_by"] = "script end"
            self._end_window_early()
        self.foreign.remove()
        self.progress.done()

    def _synchronize(self) -> None:
        if self._cuda:
            import torch

            torch.cuda.synchronize()

    # --- progress -------------------------------------------------------------------------------

    def _report(self, k: int) -> None:
        plan = self.plan
        if k < plan.warmup:
            if k == 0:
                # no mode in the text: a stronger signal restarts the count, and the line once is enough
                self.progress.phase(f"warm-up: {plan.warmup} steps")
            self.progress.step(f"warm-up step {k + 1}/{plan.warmup}")
        elif plan.in_window(k):
            if k == plan.warmup:
                self.progress.phase(f"profiling steps {plan.warmup}-{plan.window_end - 1}")
            self.progress.step(
                f"profiling step {k - plan.warmup + 1}/{plan.steps if plan.steps == self.planned.steps else plan.step_bound}"
            )
        elif plan.first_timed <= k < plan.first_timed + self.timed_skip:
            if k == plan.first_timed:
                self.progress.phase(
                    f"drawing the {self.timed_skip} batches the DataLoader workers queued during the window"
                )
            self.progress.step(f"untimed step {k - plan.first_timed + 1}/{self.timed_skip}")
        elif k >= plan.first_timed:
            first = plan.first_timed + self.timed_skip
            if k == first:
                self.progress.phase(f"timing {plan.timed} steps with the profiler off")
            self.progress.step(f"timed step {k - first + 1}/{plan.timed}")

    # --- results --------------------------------------------------------------------------------

    def profiled_steps(self) -> int:
        """Steps inside the profiled window that completed."""
        completed = self.plan.profiled(max(0, len(self.boundaries) - 1))
        return completed if self._profiled_cut is None else min(completed, self._profiled_cut)


def _p90_over_median(durations: list[float]) -> float | None:
    """The window's p90 step over its median step (None for fewer than two steps)."""
    if len(durations) < 2 or statistics.median(durations) <= 0:
        return None
    return round(statistics.quantiles(durations, n=10, method="inclusive")[8] / statistics.median(durations), 3)


def stop_profiler(profiler: Any) -> None:
    """``profiler.stop()``, also after its step mark was begun but never stored (an exception
    raised inside torch's ``step``, between its C++ call and the Python store: a signal's
    handler, say). ``stop`` would fail on that mark before stopping anything, and a profiler left
    running crashes the interpreter as it exits; without the mark, the trace is saved and the
    last step's end is the trace's."""
    mark = getattr(profiler, "step_rec_fn", None)
    if mark is not None and getattr(mark, "record", True) is None:
        profiler.step_rec_fn = None
    with without_kineto_lines():
        profiler.stop()
