"""Stage 1: run an unmodified training script in this process, as ``python SCRIPT ARGS`` would.

Contract: ``run_target(target, plan, run_dir, ...) -> RunRecord``. The script runs as
``__main__`` with its own ``sys.argv``, its folder first on ``sys.path`` and the current directory
unchanged. Hooks (``instrument``) find its steps; the capture session profiles a window and stops
the script. Whatever happens (the script fails, exits, is interrupted or runs out of GPU memory)
the record of what was measured is saved in the run directory before this returns.

Why one module (about 850 lines): running the script is one state machine (``_ScriptRun``:
prepare the process, run ``__main__``, catch how it ended, save the record whatever happens),
and the helpers after it each serve one of its steps: the exit code and the error, the
script's own traceback, the forked child's signals (``_ChildSignals``), and ``sys`` saved and
restored (``_SysState``). These last two are the seam to cut along if it grows.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.util
import os
import runpy
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

from diagnose import errors
from diagnose.errors import UsageError
from diagnose.progress import Progress
from diagnose.record import RunLength, RunRecord, WindowPlan, even_out_epoch_turns, run_length, step_samples
from diagnose.rundir import RunDir
from diagnose.runtime.capture import CaptureSession, StopScript
from diagnose.runtime.evalspans import EvalSpans
from diagnose.runtime.knobs import NOT_APPLIED
from diagnose.signals import SignalHold

#: the fewest timed steps a script that ended during the timing leaves as its steady figure
MIN_PARTIAL_TIMED = 3


class Terminated(BaseException):
    """SIGTERM (or SIGHUP) arrived: unwind the script like Ctrl-C does, so that the capture is
    saved."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class Target:
    kind: str  # "script" or "module"
    value: str  # an absolute path, or a module name
    args: list[str] = field(default_factory=list)

    @property
    def display_name(self) -> str:
        return Path(self.value).stem if self.kind == "script" else self.value.rsplit(".", 1)[-1]


def resolve_target(script: str | None, module: str | None, args: list[str]) -> Target:
    """Check the script or module before anything runs, with errors a user can act on."""
    if module:
        try:
            with _cwd_first_on_path():  # as ``python -m`` looks it up (the console script's sys.path lacks it)
                spec = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            spec = None
            reason = str(exc)
        else:
            reason = ""
        if spec is None:
            raise UsageError(
                f"no module named {module!r}{': ' + reason if reason else ''}",
                hint="run from the folder that holds the package, or install it (pip install -e .)",
            )
        return Target("module", module, list(args))
    if not script:
        raise UsageError("give a script to run, or -m MODULE", hint="diagnose run train.py -- --batch-size 64")
    path = Path(script).expanduser()
    if not path.exists():
        raise UsageError(f"no such script: {script}", hint="check the path (it is relative to the current folder)")
    if path.is_dir():
        main = path / "__main__.py"
        if not main.is_file():
            raise UsageError(f"{script} is a folder, not a Python script", hint="give the .py file to run")
        path = main
    if not path.is_file():
        raise UsageError(f"{script} is not a regular file")
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {script}: {exc.strerror}") from exc
    if b"\0" in source[:8192] or _not_text(source):  # a program, an image, an archive
        raise UsageError(
            f"{script} is not a Python source file (it holds binary data, not text)",
            hint="diagnose runs Python training scripts: give the .py file (a program runs as its own command)",
        )
    try:
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise UsageError(
            f"{script} is not valid Python (line {exc.lineno}: {exc.msg})",
            hint="diagnose runs Python training scripts; run it with python first to check it",
        ) from exc
    except ValueError as exc:  # e.g. null bytes: a binary file
        raise UsageError(f"{script} is not a Python source file ({exc})") from exc
    return Target("script", str(path.resolve()), list(args))


def _not_text(source: bytes) -> bool:
    """Whether the start of a file is not text Python could read: undecodable as UTF-8 (Python's
    default source encoding) where no coding line declares another."""
    head = source[:8192]
    if any(b"coding" in line for line in head.split(b"\n", 2)[:2]):
        return False  # a declared encoding (PEP 263): compile() decides
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(head) - 4  # a character cut at 8192 bytes is not binary
    return False


@contextlib.contextmanager
def _cwd_first_on_path() -> Iterator[None]:
    """The current folder first on ``sys.path`` for the block, as ``python -m`` puts it there
    before it looks the module up; the previous ``sys.path`` is put back after."""
    saved = list(sys.path)
    sys.path.insert(0, os.getcwd())
    try:
        yield
    finally:
        sys.path[:] = saved


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def run_target(
    target: Target,
    plan: WindowPlan,
    run_dir: RunDir,
    *,
    rank: int | None = None,
    knobs: Any | None = None,
    progress: Progress | None = None,
    extra_hooks: list[Any] | None = None,
    on_hard_exit: Callable[[RunRecord], None] | None = None,
    signal_hold: SignalHold | None = None,
) -> RunRecord:
    """Run the target under the profiler. Never raises for the script's own failures. With
    ``rank`` (a distributed run) the record and trace carry the rank's names. SIGINT and SIGTERM
    are held from the moment the script ends: with ``signal_hold`` the caller releases them
    (once it has saved the report), else they are released when the record is saved."""
    hold = signal_hold if signal_hold is not None else SignalHold()
    try:
        return _ScriptRun(
            target, plan, run_dir, rank, knobs, progress or Progress(), list(extra_hooks or []), on_hard_exit, hold
        ).execute()
    finally:
        if signal_hold is None:
            hold.release()


class _ScriptRun:
    """One run of a script: install the hooks, run it, say how it ended, save the record, undo.

    It is the capture session's window listener: the window's edges start and stop what the
    extra hooks sample and what the instrumentation counts as "in the window"."""

    def __init__(
        self,
        target: Target,
        plan: WindowPlan,
        run_dir: RunDir,
        rank: int | None,
        knobs: Any | None,
        progress: Progress,
        hooks: list[Any],
        on_hard_exit: Callable[[RunRecord], None] | None,
        hold: SignalHold,
    ) -> None:
        from diagnose.runtime.flops import StepCounter
        from diagnose.runtime.instrument import Instrumentation, StepClock
        from diagnose.runtime.memory_probe import MemoryProbe

        self.hold = hold
        self.target, self.plan, self.run_dir, self.rank = target, plan, run_dir, rank
        self.knobs, self.progress, self.hooks, self.on_hard_exit = knobs, progress, hooks, on_hard_exit
        self.record = RunRecord(
            target={"kind": target.kind, "value": target.value, "args": target.args, "cwd": os.getcwd()},
            command=list(sys.argv),
            started_at=_now(),
            plan=asdict(plan),
            knobs=knobs.as_dict() if knobs is not None else {},
        )
        self.t0 = time.perf_counter()
        from diagnose.runtime.scriptargs import ScriptArgs

        #: the script's options that set how long it trains (the window is sized to them)
        self.script_args = ScriptArgs()
        self.session = CaptureSession(
            plan,
            run_dir,
            progress,
            window=self,
            rank=rank,
            prefetched=self._prefetched_batches,
            length=self._run_length,
            data_wait=lambda: self.clock.data_wait_s,
        )
        self.clock = StepClock(on_boundary=self._on_boundary, on_reset=self.session.on_reset)
        self.session.in_reset_call = lambda: self.clock.in_reset_call
        self.instrumentation = Instrumentation(self.clock, knobs=knobs)
        self.instrumentation.on_oom = self._on_oom
        #: the evaluation passes inside the profiled window (``model.eval()`` ... ``.train()``)
        self.eval_spans = EvalSpans(lambda: self.instrumentation.trained)
        #: the FLOPs and memory owners of the step after the window (the one never timed)
        self.step_count = StepCounter()
        self.memory_probe = MemoryProbe()
        self.saved = _SysState.save()
        self.child_signals = _ChildSignals()
        self.real_exit = os._exit
        self.real_execs = {name: getattr(os, name) for name in _EXECS}
        self.owner_pid = os.getpid()
        self.finalized = False
        #: hooks told of every step boundary, the whole run long (``diagnose watch``)
        self.step_listeners = [hook.on_step for hook in hooks if hasattr(hook, "on_step")]
        for hook in hooks:
            if hasattr(hook, "attach"):  # a whole-run hook reads the session, clock and record
                hook.attach(self)

    # --- the window's edges (called by the capture session) -----------------------------------

    def window_opened(self) -> None:
        self.instrumentation.in_window = True
        _safely(self.eval_spans.start)
        watch = self.instrumentation.compile_watch
        if watch is not None:  # compilations from here on are after the warm-up
            watch.window_opened()
        cuda_graphs = watch is not None and any(call.get("cudagraphs") for call in watch.calls)
        for hook in self.hooks:
            if cuda_graphs and hasattr(hook, "model_in_cuda_graphs"):
                hook.model_in_cuda_graphs()
            hook.window_opened()

    def window_closing(self) -> None:
        self.instrumentation.in_window = False
        spans = _safely(self.eval_spans.stop, [])
        if spans:
            self.record.eval_spans_s = [[start, end] for start, end in spans]
        for hook in self.hooks:  # stop sampling before the trace export
            hook.window_closed(self.record)

    def window_closed(self) -> None:
        from diagnose.runtime.environment import describe_distributed, describe_flags, describe_memory
        from diagnose.runtime.instrument import describe_models

        record = self.record
        record.memory = describe_memory()
        record.flags = describe_flags()
        record.distributed = _safely(describe_distributed, {})
        record.models = _safely(describe_models, [])
        if self.instrumentation.compile_watch is not None:
            record.compile = _safely(self.instrumentation.compile_watch.summary, {})
        self.window_closing()  # no-op for hooks already closed at the boundary
        self._journal()  # the trace is saved: a crash from here on keeps it

    # --- the counted step and the OOM snapshot -------------------------------------------------

    def _on_boundary(self, now: float) -> None:
        """The capture session's boundary, with the counted step around it: the step that absorbs
        the trace export (boundary ``window_end`` to ``first_timed``) is never timed, so counting
        its FLOPs and memory owners there costs the measurement nothing."""
        session = self.session  # its plan, as it runs: the window may have grown
        k_next = len(session.boundaries)
        if k_next == session.plan.first_timed and not session.finished:
            self._finish_counted_step()  # before the timed steps start their clocks
        session.on_boundary(now)
        for listener in self.step_listeners:
            listener(now)
        if k_next == session.plan.window_end and session.window_closed and not session.finished:
            if _cuda_in_use():
                self.step_count.device_type = "cuda"
                _safely(self.memory_probe.start)
            _safely(lambda: self.step_count.start(k_next))

    def _finish_counted_step(self) -> None:
        samples = self.clock.samples_per_step[-1] if self.clock.samples_per_step else None
        held = samples  # what one forward pass held (the memory's samples)
        if not samples and (held := self._option_batch()):
            # no DataLoader counted the step: the script's batch option, where the input shows it
            samples = step_samples(self.script_args.batch_option() or {"value": held})
        self.record.flops = _safely(lambda: self.step_count.stop(samples), None)
        self.record.memory_split = _safely(lambda: self.memory_probe.stop(held), None)

    def _on_oom(self, message: str) -> None:
        """The first CUDA out-of-memory error is being made: what filled the memory, now."""
        from diagnose.runtime.memory_probe import snapshot_at_oom

        if self.record.memory_at_oom is None and _cuda_in_use():
            clock = self.clock
            samples = clock.samples_this_step or (clock.samples_per_step[-1] if clock.samples_per_step else None)
            self.record.memory_at_oom = snapshot_at_oom(message, samples or self._option_batch(unmeasured=True))

    # --- the run ------------------------------------------------------------------------------

    def execute(self) -> RunRecord:
        ended: BaseException | None = None
        ending: tuple[str, int, dict[str, Any] | None] | None = None
        try:
            self._install()
            self._run_script()
        except BaseException as exc:  # noqa: BLE001 - every way a script ends is recorded
            # First, plain stores (no Python call, so no signal handler can run before them): how
            # the script ended, and that from here on torch's SIGCHLD handler is the script's no
            # more (_ChildSignals). A second signal may still cut this block short before the
            # ending is worked out (a SIGTERM to the process group reaches this process twice:
            # directly and forwarded by the supervising parent, which cannot tell it from one sent
            # to it alone): the ``finally`` then works it out from ``ended``.
            ended = exc
            self.child_signals.script_over = True
            if os.getpid() != self.owner_pid:  # a child the script forked ends here: as without diagnose
                _end_forked_child(exc, self.real_exit)
            self._script_ended()
            self.hold.hold(self.saved.underneath())  # a second Ctrl-C or SIGTERM must not cut the saving short
            ending = self._ending(exc)
        finally:
            if os.getpid() != self.owner_pid:  # a forked child whose script returned: it ends here
                _end_forked_child(SystemExit(0), self.real_exit)
            self.child_signals.script_over = True
            self._script_ended()
            self.hold.hold(self.saved.underneath())
            if ending is None:
                ending = self._ending(ended) if ended is not None else ("completed", errors.EXIT_OK, None)
            status, exit_code, error = ending
            os._exit = self.real_exit
            for name, real in self.real_execs.items():
                setattr(os, name, real)
            try:
                self._finalize(status, exit_code, error)
            finally:
                self._uninstall()
        record = self.record
        if record.completed_steps() == 0 and record.status in ("completed", "stopped"):
            record.status = "no_steps"  # the script ran, but no step could be found
            self.run_dir.save_record(record, self.rank)
        return record

    def _script_ended(self) -> None:
        """When the script's own code ended (the first call only): what it did after its last
        step (teardown, a checkpoint, evaluation) runs up to here."""
        if self.record.script_end_s is None:
            self.record.script_end_s = time.perf_counter()

    def _install_hooks(self) -> None:
        """What every run installs: the instrumentation, the foreign-profiler guard, the knobs
        and the extra hooks (a script run adds its process-wide changes; a block does not)."""
        self.instrumentation.install()
        self.session.guard_foreign_profilers()
        if self.knobs is not None:
            self.knobs.install()
        # after the knobs: it wraps their respelling of the arg. options (a parse they pass on
        # is a list, not the script's command line) and reads the values the script parsed
        self.script_args.install()
        for hook in self.hooks:
            hook.install()

    def _install(self) -> None:
        self._install_hooks()
        self.child_signals.install()
        os._exit = self._hard_exit  # type: ignore[assignment]
        for name in _EXECS:  # os.execl*, execvp* and spawn's exec go through these two
            setattr(os, name, self._exec_wrapper(name, self.real_execs[name]))
        _ACTIVE.append(self)
        _install_sigterm()
        _prepare_sys(self.target)

    def _uninstall(self) -> None:
        """Undo in the reverse order of installation: later patches wrap earlier ones."""
        _safely(self.step_count.close)
        for hook in reversed(self.hooks):
            _safely(hook.remove)
        self.script_args.remove()
        if self.knobs is not None:
            _safely(self.knobs.remove)
        _safely(self.eval_spans.stop)
        self.instrumentation.remove()
        self.child_signals.remove()
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        self.saved.restore(keep_held=self.hold.holding)

    def _journal(self) -> None:
        """run.json as the run stands, saying "crashed": if the process dies without a word (a
        segfault, SIGKILL, an exec), this is what the supervising parent finds, and what was
        measured until then (the steps' boundaries, the trace once saved) is analysed. The
        record that ``_finalize`` saves replaces it. Only a single-process run keeps one: a
        rank's record tells the others it has finished."""
        if self.rank is not None or self.finalized:
            return
        record = RunRecord.from_dict(self.record.to_dict())
        record.status, record.exit_code = "crashed", errors.EXIT_SCRIPT_FAILED
        record.error = {
            "type": "Crash",
            "message": "the run's process ended before diagnose could record how",
            "traceback": "",
        }
        record.step_mode = self.clock.mode
        record.boundaries_s = list(self.session.boundaries)
        record.data_wait_s = list(self.session.data_waits)
        record.samples_per_step = self.clock.samples_per_step[1:]
        record.profiled_steps = self.session.profiled_steps()
        record.trace_files = list(self.session.trace_files)
        record.warnings = [*record.warnings, *self.session.notes]
        if record.trace_files and not record.environment:
            # the device and the CPUs, for a report of a process that dies from here on
            record.environment = _safely(_environment_if_ready, {})
        try:
            self.run_dir.save_record(record, self.rank)
        except errors.DiagnoseError:  # a full disk: the final record says so, if it can
            pass

    def _run_script(self) -> None:
        target = self.target
        self.progress.phase(f"running {Path(target.value).name if target.kind == 'script' else '-m ' + target.value}")
        self._journal()
        self.record.script_start_s = time.perf_counter()
        if target.kind == "script":
            runpy.run_path(target.value, run_name="__main__")
        else:
            runpy.run_module(target.value, run_name="__main__", alter_sys=True)

    def _ending(self, exc: BaseException) -> tuple[str, int, dict[str, Any] | None]:
        """How the script ended (status, exit code, error), from what it raised."""
        if isinstance(exc, StopScript):
            return "stopped", errors.EXIT_OK, None
        if isinstance(exc, SystemExit):
            exit_code = _exit_code(exc)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
            return ("completed" if exit_code == 0 else "exited"), exit_code, None
        if isinstance(exc, KeyboardInterrupt):
            _print_script_traceback(exc)
            return "interrupted", errors.EXIT_INTERRUPTED, _describe_error(exc)
        if isinstance(exc, Terminated):  # 143 for SIGTERM, 129 for SIGHUP: as a shell says it
            return "terminated", 128 + exc.signum, _describe_error(exc)
        # the script's own failure: report it as Python would
        if self.session.finished and self.plan.stop and _caused_by_stop(exc):
            return "stopped", errors.EXIT_OK, None
        _print_script_traceback(exc)
        return ("oom" if _is_oom(exc) else "failed"), errors.EXIT_SCRIPT_FAILED, _describe_error(exc)

    def _finalize(self, status: str, exit_code: int, error: dict[str, Any] | None = None) -> None:
        """Save the record of what was measured, once, however the script ended."""
        from diagnose.runtime.environment import (
            describe_environment,
            describe_flags,
            describe_memory,
            loader_receive_ms_per_mb,
        )

        if self.finalized:
            return
        self.finalized = True
        record, session = self.record, self.session
        plan = session.planned  # the plan cut to the script's steps, where it was
        if self.step_count.active:  # the script ended inside the counted step: what it ran is partial
            self._finish_counted_step()
            if record.flops is not None:
                record.flops.notes.append("the script ended during the counted step: its FLOPs are partial")
        last = self.clock.last_step_end()
        if last is not None:  # the last step ends at its optimizer step, not at the script's end
            session.on_last_boundary(last)
        _safely(session.finish)
        if not record.flags:
            record.flags = _safely(describe_flags, {})
        if record.flags:  # counted to the script's end, not to the window's
            record.flags["create_graph_calls"] = self.instrumentation.create_graph_calls
        if not record.memory:
            record.memory = _safely(describe_memory, {})
        record.boundaries_s = list(session.boundaries)  # the hooks cut what came after the last step
        record.data_wait_s = list(session.data_waits)
        for hook in self.hooks:
            _safely(partial(hook.finish, record))
        record.environment = _safely(describe_environment, {})
        # what more workers would cost the main process: measured where a DataLoader ran and the
        # run ended as planned (a run that failed or ran out of memory keeps what it has for saving)
        if self.instrumentation.dataloaders and record.environment and status in ("stopped", "completed"):
            record.environment["loader_receive_ms_per_mb"] = _safely(loader_receive_ms_per_mb, None)
        if self.instrumentation.oom_message and status in ("exited", "failed"):
            status = "oom"  # the script caught the OOM and exited: still an OOM
            error = error or {"type": "OutOfMemoryError", "message": self.instrumentation.oom_message, "traceback": ""}
        record.status, record.exit_code, record.error = status, exit_code, error
        record.step_mode = self.clock.mode
        record.plan = asdict(plan)
        record.plan_fit = dict(session.fit)
        record.length_options = self.script_args.found()
        record.samples_per_step = even_out_epoch_turns(self.clock.samples_per_step[1:], self.clock.batches_per_step[1:])
        record.batch_option = self.script_args.batch_option()
        self._samples_from_batch_option(record)
        record.profiled_steps = session.profiled_steps()
        # the warm-up as it ran: longer than planned where a reset restarted the profiler
        record.plan["warmup"] = session.plan.warmup
        record.window_growth = dict(session.growth)
        record.trace_files = list(session.trace_files)
        if session.timed_start is not None and session.timed_end is not None:
            record.timed_steps = plan.timed
            record.timed_skipped = session.timed_skip
            record.timed_seconds = session.timed_end - session.timed_start
            timed = record.samples_per_step[record.first_timed_step() : record.first_timed_step() + plan.timed]
            record.timed_samples = sum(timed) if timed and all(timed) else None
        elif (so_far := session.timed_so_far()) is not None and so_far[0] >= MIN_PARTIAL_TIMED:
            # the script ended during the timing: its timed steps so far are the steady figure
            record.timed_steps, record.timed_seconds = so_far
            record.timed_skipped = session.timed_skip
            timed = record.samples_per_step[record.first_timed_step() : record.first_timed_step() + so_far[0]]
            record.timed_samples = sum(timed) if timed and all(timed) else None
        record.warnings.extend(session.notes)
        if self.child_signals.late and not (error and "DataLoader worker" in error.get("message", "")):
            record.warnings.append(f"after the script ended, torch reported: {self.child_signals.late[0]}")
        record.dataloaders = list(self.instrumentation.dataloaders.values())
        record.optimizers = list(self.instrumentation.optimizers.values())
        record.frameworks = self.instrumentation.frameworks_seen()
        if self.knobs is not None:
            # a DataLoader knob that reached no loader feeding the profiled steps says so (once
            # a window ran: before one, no loader could have fed it)
            record.knobs_via = self.knobs.via(record.dataloaders if record.profiled_steps else None)
            record.warnings.extend(
                f"--set {knob}={self.knobs.values[knob]}: {way}"
                for knob, way in record.knobs_via.items()
                if way.startswith(NOT_APPLIED)
            )
        if not record.compile and self.instrumentation.compile_watch is not None:
            record.compile = _safely(self.instrumentation.compile_watch.summary, {})
        record.ended_at = _now()
        record.wall_s = time.perf_counter() - self.t0
        try:
            self.run_dir.save_record(record, self.rank)
        except errors.DiagnoseError:  # a full disk: the journal's "crashed" would say what did not happen
            if self.rank is None:
                self.run_dir.record_path().unlink(missing_ok=True)
            raise

    def _option_batch(self, unmeasured: bool = False) -> int | None:
        """The script's batch option's value where the model's input in the counted step holds
        it in its first or second dimension (batch-first, or sequence-first as an RNN's input);
        with ``unmeasured``, also where no input was measured yet (an out-of-memory error before
        the counted step: a batch too large fails at its first step, verify's larger batch among
        them)."""
        option = self.script_args.batch_option()
        dims = self.memory_probe.input_dims
        if option is None or (option["value"] not in dims and not (unmeasured and not dims)):
            return None
        return int(option["value"])

    def _samples_from_batch_option(self, record: RunRecord) -> None:
        """A script that builds its batches by hand (no DataLoader batch reached a step) is
        counted at its batch option's value a step, so that its samples/s (and a change of its
        batch) can be measured; not where the step's model input, measured on the GPU, held
        another number of samples (``_option_batch``: a global batch split by hand)."""
        option = record.batch_option
        loaders = self.instrumentation.dataloaders.values()
        if option is None or any(record.samples_per_step) or any(d.fetches_in_window for d in loaders):
            return
        split = record.memory_split
        if split is not None and split.samples and split.samples != option["value"]:
            return
        steps = len(record.samples_per_step) or max(len(record.boundaries_s) - 1, 0)
        record.samples_per_step = [step_samples(option)] * steps
        record.samples_from = option["flag"]

    def _run_length(self) -> RunLength | None:
        """How many steps the script will make, as its options, its DataLoader and its
        framework say (at the first step: all three are known by then)."""
        loaders = list(self.instrumentation.dataloaders.values())
        self.record.dataloaders = loaders
        loader = self.record.train_loader()
        return run_length(
            self.script_args.found(),
            loader.batches() if loader is not None else None,
            self.instrumentation.frameworks_seen(),
        )

    def _prefetched_batches(self) -> int:
        """Batches the training DataLoader's workers can hold queued: its workers times its
        prefetch factor (torch's default 2), 0 without workers."""
        loaders = list(self.instrumentation.dataloaders.values())
        self.record.dataloaders = loaders
        loader = self.record.train_loader()
        if loader is None or not loader.num_workers or not loader.fetches_in_window:
            return 0
        return loader.num_workers * (loader.prefetch_factor or 2)

    def _exec_wrapper(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        """``os.execv``/``os.execve`` replace the process: save the capture and the report
        first, as for ``os._exit``. A forked child (a DataLoader worker, ``subprocess``'s
        child) simply execs."""

        def exec_(*args: Any) -> Any:
            if os.getpid() == self.owner_pid:
                self.child_signals.script_over = True
                program = os.fsdecode(args[0]) if args and isinstance(args[0], (str, bytes, os.PathLike)) else "?"
                self.record.warnings.append(
                    f"the script replaced its process (os.{name} {program}): what ran after that was not measured"
                )
                _safely(lambda: self._finalize("completed", errors.EXIT_OK))
                _safely(lambda: self.saved.restore(keep_held=self.hold.holding))
                if self.on_hard_exit is not None:
                    _safely(lambda: self.on_hard_exit(self.record))  # type: ignore[misc]
                _flush_std()
            return real(*args)

        return exec_

    def _hard_exit(self, code: int = 0) -> None:
        """``os._exit`` skips every ``finally``: save the capture first, then really exit. Forked
        children (DataLoader workers) inherit this function and must simply exit."""
        if os.getpid() != self.owner_pid:
            self.real_exit(code)
        self.child_signals.script_over = True
        self.record.warnings.append(f"the script called os._exit({code})")
        _safely(lambda: self._finalize("exited" if code else "completed", code))
        _safely(lambda: self.saved.restore(keep_held=self.hold.holding))
        if self.on_hard_exit is not None:
            _safely(lambda: self.on_hard_exit(self.record))  # type: ignore[misc]
        self.real_exit(code)


def _end_forked_child(exc: BaseException, real_exit: Callable[[int], None]) -> None:
    """A process the script forked (``os.fork``) ran the script's code back out into diagnose's:
    only the process that started the run records it. The child ends as it would under plain
    Python (its exit code, its traceback, the signal that stopped it), saving nothing, and
    without the interpreter's teardown (the parent's state it copied is not its own to undo)."""
    if isinstance(exc, (KeyboardInterrupt, Terminated)):
        signum = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else exc.signum
        _flush_std()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    if isinstance(exc, SystemExit):
        code = _exit_code(exc)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    elif isinstance(exc, StopScript):
        code = errors.EXIT_OK
    else:
        _print_script_traceback(exc)
        code = errors.EXIT_SCRIPT_FAILED
    _flush_std()
    real_exit(code)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def _safely(fn: Callable[[], Any], default: Any = None) -> Any:
    """Collect a fact without ever letting the collection break the run."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a fact we cannot read is reported, not fatal
        print(f"diagnose: warning: {getattr(fn, '__name__', 'a step')} failed: {exc}", file=sys.stderr)
        return default


def _environment_if_ready() -> dict[str, Any]:
    """``describe_environment`` where it has no side effect: CUDA is initialised already, or
    there is none (it would initialise CUDA, which the script may not have done yet); else {}."""
    import torch

    from diagnose.runtime.environment import describe_environment

    return describe_environment() if torch.cuda.is_initialized() or not torch.cuda.is_available() else {}


def _cuda_in_use() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    return 1


def _is_oom(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name == "OutOfMemoryError" or "CUDA out of memory" in str(exc)


def _caused_by_stop(exc: BaseException) -> bool:
    """A script's cleanup code failed while diagnose was stopping it."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, StopScript):
            return True
        seen = seen.__context__
    return False


def _describe_error(exc: BaseException) -> dict[str, Any]:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": _script_traceback(exc),
    }


_OWN_FILES = (str(Path(__file__).parent.parent), runpy.__file__.rsplit(".", 1)[0], "<frozen runpy>")


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """Drop diagnose's and runpy's frames from the top, so the traceback starts in the script."""
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OWN_FILES):
        tb = tb.tb_next
    return tb


def _script_traceback(exc: BaseException) -> str:
    """The script's failure as Python would print it without diagnose in between.

    Frames of diagnose's own wrappers (a DataLoader iterator, a step hook) that the error
    only passed through are left out wherever they are, in chained exceptions too; an error
    raised inside diagnose itself keeps its frames, so a bug of ours still shows where it is.
    """
    shown = traceback.TracebackException(type(exc), exc, _user_traceback(exc.__traceback__), compact=True)
    signalled = shown if isinstance(exc, (KeyboardInterrupt, Terminated)) else None
    seen: set[int] = set()
    pending = [shown]
    while pending:
        part = pending.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        frames = list(part.stack)
        # a signal's exception (Ctrl-C, SIGTERM) raised in diagnose's code is no error of ours
        last_foreign = (
            len(frames)
            if part is signalled
            else max((i for i, f in enumerate(frames) if not f.filename.startswith(_OWN_FILES)), default=-1)
        )
        kept = [f for i, f in enumerate(frames) if i > last_foreign or not f.filename.startswith(_OWN_FILES)]
        if len(kept) != len(frames):
            part.stack = traceback.StackSummary.from_list(kept)
        pending.extend(
            p for p in (part.__cause__, part.__context__, *(getattr(part, "exceptions", None) or ())) if p is not None
        )
    return "".join(shown.format())


def _print_script_traceback(exc: BaseException) -> None:
    sys.stderr.flush()
    sys.stderr.write(_script_traceback(exc))
    sys.stderr.flush()


#: the os functions that replace the process (every other exec function calls one of them)
_EXECS = ("execv", "execve")

#: the script runs (and ``diagnose.profile`` blocks) under way in this process (one, or none)
_ACTIVE: list[_ScriptRun] = []


def profiling_now() -> Path | None:
    """The run directory of the run under way in this process, if any: a nested
    ``diagnose.profile`` would start a second profiler session and mutate the hooks the outer
    one is iterating over."""
    return _ACTIVE[-1].run_dir.path if _ACTIVE else None


def _forked() -> None:
    """In a child the script forks: the script's own SIGTERM and SIGHUP handlers, not diagnose's.
    A child stuck in C code (a lock copied held) never runs a Python handler: with diagnose's it
    survived SIGTERM, without diagnose it dies of it."""
    for run in _ACTIVE[-1:]:
        for signum, handler in (
            (signal.SIGTERM, run.saved.sigterm),
            (getattr(signal, "SIGHUP", None), run.saved.sighup),
        ):
            if signum is not None and handler is not None:
                try:
                    signal.signal(signum, handler)
                except (ValueError, OSError, TypeError):  # forked from another thread: nothing to undo
                    pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _install_sigterm() -> None:
    """SIGTERM, and SIGHUP (a closed terminal, an ssh session lost) unless it is ignored
    (``nohup``), stop the script as Ctrl-C does: what was measured is saved."""

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    for name in ("SIGTERM", "SIGHUP"):
        signum = getattr(signal, name, None)
        try:
            if signum is not None and (name == "SIGTERM" or signal.getsignal(signum) == signal.SIG_DFL):
                signal.signal(signum, handler)
        except (ValueError, OSError):  # not the main thread: leave signals alone
            pass


def _prepare_sys(target: Target) -> None:
    if target.kind == "script":
        sys.argv = [target.value, *target.args]
        sys.path[0] = str(Path(target.value).parent)
    else:
        sys.argv = [target.value, *target.args]  # runpy replaces argv[0] with the module's file
        sys.path[0] = os.getcwd()


class _ChildSignals:
    """torch's SIGCHLD handler, kept from raising inside diagnose.

    A DataLoader with workers installs a Python SIGCHLD handler that raises when one of its
    workers died. Python runs signal handlers between bytecodes, and ``signal.signal`` itself
    first runs any that are pending: a worker's death signalled while the script's failure
    unwinds made torch's handler raise inside diagnose's own handling (about 1 run in 22 for a
    worker calling ``os._exit``), losing report.json. While the script runs, the handler torch
    installs is wrapped: it raises in the script as torch intends; once ``script_over`` is set
    (a plain attribute store, the first thing diagnose does when the script ends), what it
    would raise is kept in ``late`` instead. The wrapper stays until the run's handlers are put
    back, so that no pending signal finds torch's handler bare."""

    def __init__(self) -> None:
        self.script_over = False
        #: what torch's handler raised after the script ended (first lines)
        self.late: list[str] = []
        self._restore: Callable[[], None] | None = None

    def install(self) -> None:
        try:
            from torch.utils.data._utils import signal_handling
        except ImportError:  # a torch without it: nothing to guard
            return
        original = signal_handling.__dict__.get("_set_SIGCHLD_handler")
        if original is None:
            return
        guard = self

        def _set_SIGCHLD_handler() -> None:  # torch's name
            original()
            guard.wrap_current()

        signal_handling._set_SIGCHLD_handler = _set_SIGCHLD_handler
        self._restore = lambda: setattr(signal_handling, "_set_SIGCHLD_handler", original)
        self.wrap_current()  # a DataLoader of this process installed torch's before the run

    def wrap_current(self) -> None:
        """Wrap the Python SIGCHLD handler in place now, unless it is ours already."""
        try:
            current = signal.getsignal(signal.SIGCHLD)
        except (AttributeError, ValueError, OSError):  # no SIGCHLD; not the main thread
            return
        if not callable(current) or getattr(current, "_diagnose_guard", False):
            return
        guard = self

        def handler(signum: int, frame: Any) -> None:
            if not guard.script_over:
                current(signum, frame)
                return
            try:
                current(signum, frame)
            except Exception as exc:  # noqa: BLE001 - the script is over: its worker's death is noted, not raised in diagnose
                guard.late.append(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

        handler._diagnose_guard = True  # type: ignore[attr-defined]
        _replace_handler(signal.SIGCHLD, handler)

    def remove(self) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None


def _open_again(stream: Any, fd: int) -> Any:
    """The standard stream as it was before the script, opened again on its file descriptor if
    the script closed it (``sys.stdout.close()`` leaves descriptor 1 open)."""
    if stream is None or not getattr(stream, "closed", False):
        return stream
    try:
        return open(
            fd,
            "w",
            encoding=getattr(stream, "encoding", None),
            errors=getattr(stream, "errors", None),
            closefd=False,
            buffering=1,
        )
    except (OSError, ValueError):  # the descriptor itself was closed: writes go nowhere, and say so
        return stream


def _replace_handler(signum: int, handler: Any) -> None:
    """``signal.signal``, which runs any pending handler before it replaces it: a SIGCHLD from a
    dead DataLoader worker still pending runs torch's handler there, and it raises the worker's
    death (told late: the script has seen it, or is past it). The handler is replaced on the
    retry; nothing is raised into diagnose."""
    for _ in range(3):
        try:
            signal.signal(signum, handler)
        except RuntimeError:  # a pending handler raised: the replacement did not happen yet
            continue
        except (ValueError, OSError):  # not the main thread; not a signal here
            return
        return


@dataclass
class _SysState:
    argv: list[str]
    path0: str
    main_module: Any
    sigterm: Any
    #: a DataLoader with workers installs torch's SIGCHLD handler, which raises when one of its
    #: workers has died; left in place, any later child exit raises that again inside diagnose's
    #: own analysis (a worker killed by a signal lost report.json once on CI)
    sigchld: Any = None
    sighup: Any = None
    #: the standard streams: a script that closes (or replaces) them leaves diagnose its own
    streams: tuple[Any, Any] = (None, None)

    @classmethod
    def save(cls) -> _SysState:
        handlers: list[Any] = []
        for name in ("SIGTERM", "SIGCHLD", "SIGHUP"):
            try:
                handlers.append(signal.getsignal(getattr(signal, name)))
            except (AttributeError, ValueError, OSError):  # no SIGCHLD on Windows; not the main thread
                handlers.append(None)
        sigterm, sigchld, sighup = handlers
        return cls(
            list(sys.argv),
            sys.path[0] if sys.path else "",
            sys.modules.get("__main__"),
            sigterm,
            sigchld,
            sighup,
            streams=(sys.stdout, sys.stderr),
        )

    def underneath(self) -> dict[str, Any]:
        """The handlers a ``SignalHold`` puts back for the ones the run installed."""
        return {"SIGTERM": self.sigterm, "SIGHUP": self.sighup}

    def restore(self, keep_held: bool = False) -> None:
        """Put back what the run changed; with ``keep_held``, SIGTERM and SIGHUP stay held
        (``SignalHold`` puts back the handlers saved here when it releases)."""
        sys.argv = self.argv
        sys.stdout, sys.stderr = (_open_again(saved, fd) for saved, fd in zip(self.streams, (1, 2), strict=True))
        if sys.path:
            sys.path[0] = self.path0
        if self.main_module is not None:
            sys.modules["__main__"] = self.main_module
        for name, handler in (("SIGTERM", self.sigterm), ("SIGCHLD", self.sigchld), ("SIGHUP", self.sighup)):
            if name in ("SIGTERM", "SIGHUP") and keep_held:
                continue
            if handler is not None:
                _replace_handler(getattr(signal, name), handler)
