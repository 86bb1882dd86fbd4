"""Stage 1: run an unmodified training script in this process, as ``python SCRIPT ARGS`` would.

Contract: ``run_target(target, plan, run_dir, ...) -> RunRecord``. The script runs as
``__main__`` with its own ``sys.argv``, its folder first on ``sys.path`` and the current directory
unchanged. Hooks (``instrument``) find its steps; the capture session profiles a window and stops
the script. Whatever happens (the script fails, exits, is interrupted or runs out of GPU memory)
the record of what was measured is saved to ``run.json`` before this returns.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import os
import runpy
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from diagnose import errors
from diagnose.runtime.capture import CaptureSession, StopScript
from diagnose.errors import UsageError
from diagnose.progress import Progress
from diagnose.record import RunRecord, WindowPlan

RUN_JSON = "run.json"


class Terminated(BaseException):
    """SIGTERM arrived: unwind the script like Ctrl-C does, so that the capture is saved."""


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


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def run_target(
    target: Target,
    plan: WindowPlan,
    run_dir: Path,
    *,
    knobs: Any | None = None,
    progress: Progress | None = None,
    worker: str | None = None,
    extra_hooks: list[Any] | None = None,
    on_hard_exit: Callable[[RunRecord], None] | None = None,
    record_file: str = RUN_JSON,
) -> RunRecord:
    """Run the target under the profiler. Never raises for the script's own failures."""
    from diagnose.runtime.environment import describe_distributed, describe_environment, describe_flags, describe_memory
    from diagnose.runtime.instrument import Instrumentation, StepClock, describe_models

    progress = progress or Progress()
    record = RunRecord(
        target={"kind": target.kind, "value": target.value, "args": target.args, "cwd": os.getcwd()},
        command=list(sys.argv),
        started_at=_now(),
        plan=asdict(plan),
        knobs=knobs.as_dict() if knobs is not None else {},
    )
    t0 = time.perf_counter()

    instrumentation: Instrumentation | None = None

    def window_end() -> None:
        record.memory = describe_memory()
        record.flags = describe_flags()
        record.distributed = _safely(describe_distributed, {})
        record.models = _safely(describe_models, [])
        for hook in extra_hooks or []:
            hook.window_closed(record)  # no-op when already closed at the boundary
        if instrumentation is not None:
            instrumentation.in_window = False

    session = CaptureSession(plan, run_dir, progress, on_window_end=window_end, worker=worker)

    def on_boundary(now: float) -> None:
        if len(session.boundaries) == plan.warmup + plan.steps and not session.finished:
            for hook in extra_hooks or []:  # the window ends here: stop sampling before the export
                hook.window_closed(record)
        session.on_boundary(now)
        if instrumentation is not None:
            k = len(session.boundaries) - 1
            was = instrumentation.in_window
            instrumentation.in_window = plan.warmup <= k < plan.warmup + plan.steps
            if instrumentation.in_window and not was:
                for hook in extra_hooks or []:
                    hook.window_opened()

    clock = StepClock(on_boundary=on_boundary, on_reset=session.on_reset)
    instrumentation = Instrumentation(clock, knobs=knobs)

    saved = _SysState.save()
    real_exit = os._exit
    finalized = False

    def finalize(status: str, exit_code: int, error: dict[str, Any] | None = None) -> None:
        nonlocal finalized
        if finalized:
            return
        finalized = True
        _safely(session.finish)
        if not record.flags:
            record.flags = _safely(describe_flags, {})
        if not record.memory:
            record.memory = _safely(describe_memory, {})
        for hook in extra_hooks or []:
            _safely(lambda h=hook: h.finish(record))
        record.environment = _safely(describe_environment, {})
        if instrumentation.oom_message and status in ("exited", "failed"):
            status = "oom"  # the script caught the OOM and exited: still an OOM
            error = error or {"type": "OutOfMemoryError", "message": instrumentation.oom_message, "traceback": ""}
        record.status = status
        record.exit_code = exit_code
        record.error = error
        record.step_mode = clock.mode
        record.boundaries_s = list(session.boundaries)
        record.samples_per_step = clock.samples_per_step[1:]
        record.profiled_steps = session.profiled_steps()
        record.trace_files = list(session.trace_files)
        if session.timed_start is not None and session.timed_end is not None:
            record.timed_steps = plan.timed
            record.timed_seconds = session.timed_end - session.timed_start
            timed = record.samples_per_step[plan.first_timed : plan.first_timed + plan.timed]
            record.timed_samples = sum(timed) if timed and all(timed) else None
        record.warnings.extend(session.notes)
        record.dataloaders = list(instrumentation.dataloaders.values())
        record.optimizers = list(instrumentation.optimizers.values())
        record.ended_at = _now()
        record.wall_s = time.perf_counter() - t0
        record.save(run_dir / record_file)

    owner_pid = os.getpid()

    def hard_exit(code: int = 0) -> None:
        """``os._exit`` skips every ``finally``: save the capture first, then really exit. Forked
        children (DataLoader workers) inherit this function and must simply exit."""
        if os.getpid() != owner_pid:
            real_exit(code)
        record.warnings.append(f"the script called os._exit({code})")
        _safely(lambda: finalize("exited" if code else "completed", code))
        _safely(saved.restore)
        if on_hard_exit is not None:
            _safely(lambda: on_hard_exit(record))
        real_exit(code)

    status, exit_code, error = "completed", errors.EXIT_OK, None
    try:
        instrumentation.install()
        session.guard_foreign_profilers()
        if knobs is not None:
            knobs.install()
        for hook in extra_hooks or []:
            hook.install()
        os._exit = hard_exit  # type: ignore[assignment]
        _install_sigterm()
        _prepare_sys(target)
        progress.phase(f"running {Path(target.value).name if target.kind == 'script' else '-m ' + target.value}")
        record.script_start_s = time.perf_counter()
        if target.kind == "script":
            runpy.run_path(target.value, run_name="__main__")
        else:
            runpy.run_module(target.value, run_name="__main__", alter_sys=True)
    except StopScript:
        status = "stopped"
    except SystemExit as exc:
        exit_code = _exit_code(exc)
        status = "completed" if exit_code == 0 else "exited"
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt as exc:
        status, exit_code = "interrupted", errors.EXIT_INTERRUPTED
        error = _describe_error(exc)
        _print_script_traceback(exc)
    except Terminated as exc:
        status, exit_code = "terminated", errors.EXIT_TERMINATED
        error = _describe_error(exc)
    except BaseException as exc:  # the script's own failure: report it as Python would
        status, exit_code = ("oom" if _is_oom(exc) else "failed"), errors.EXIT_SCRIPT_FAILED
        error = _describe_error(exc)
        if session.finished and plan.stop and _caused_by_stop(exc):
            status, exit_code, error = "stopped", errors.EXIT_OK, None
        else:
            _print_script_traceback(exc)
    finally:
        os._exit = real_exit
        try:
            finalize(status, exit_code, error)
        finally:  # undo in the reverse order of installation: later patches wrap earlier ones
            for hook in reversed(extra_hooks or []):
                _safely(hook.remove)
            if knobs is not None:
                _safely(knobs.remove)
            instrumentation.remove()
            saved.restore()
    if record.completed_steps() == 0 and record.status in ("completed", "stopped"):
        record.status = "no_steps"  # the script ran, but no step could be found
        record.save(run_dir / record_file)
    return record


def _safely(fn: Callable[[], Any], default: Any = None) -> Any:
    """Collect a fact without ever letting the collection break the run."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a fact we cannot read is reported, not fatal
        print(f"diagnose: warning: {getattr(fn, '__name__', 'a step')} failed: {exc}", file=sys.stderr)
        return default


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
        "traceback": "".join(traceback.format_exception(type(exc), exc, _user_traceback(exc.__traceback__))),
    }


_OWN_FILES = (str(Path(__file__).parent.parent), runpy.__file__.rsplit(".", 1)[0], "<frozen runpy>")


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """Drop diagnose's and runpy's frames from the top, so the traceback starts in the script."""
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OWN_FILES):
        tb = tb.tb_next
    return tb


def _print_script_traceback(exc: BaseException) -> None:
    sys.stderr.flush()
    traceback.print_exception(type(exc), exc, _user_traceback(exc.__traceback__), file=sys.stderr)
    sys.stderr.flush()


def _install_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    try:
        signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):  # not the main thread: leave signals alone
        pass


def _prepare_sys(target: Target) -> None:
    if target.kind == "script":
        sys.argv = [target.value, *target.args]
        sys.path[0] = str(Path(target.value).parent)
    else:
        sys.argv = [target.value, *target.args]  # runpy replaces argv[0] with the module's file
        sys.path[0] = os.getcwd()


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

    @classmethod
    def save(cls) -> _SysState:
        handlers = []
        for name in ("SIGTERM", "SIGCHLD"):
            try:
                handlers.append(signal.getsignal(getattr(signal, name)))
            except (AttributeError, ValueError, OSError):  # no SIGCHLD on Windows; not the main thread
                handlers.append(None)
        return cls(list(sys.argv), sys.path[0] if sys.path else "", sys.modules.get("__main__"), *handlers)

    def restore(self) -> None:
        sys.argv = self.argv
        if sys.path:
            sys.path[0] = self.path0
        if self.main_module is not None:
            sys.modules["__main__"] = self.main_module
        for name, handler in (("SIGTERM", self.sigterm), ("SIGCHLD", self.sigchld)):
            if handler is not None:
                try:
                    signal.signal(getattr(signal, name), handler)
                except (ValueError, OSError):
                    pass
