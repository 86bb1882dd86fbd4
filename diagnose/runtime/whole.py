"""The whole run, recorded cheaply: ``diagnose watch``'s runner hook.

Contract: ``WholeRun(run_dir, rank, budget, live)`` is an extra runner hook (``install``,
``remove``, ``attach``, ``on_step``, ``window_opened``, ``window_closed``, ``finish``). The
script runs to its end; ``finish(record)`` writes ``record.whole`` (the layout is in
docs/watch.md), which ``analysis/measure/wholerun.py`` turns into the run's accounting. Times are
seconds from the script's start (``record.script_start_s``); the process's own start is negative.

What it records, and what each costs the script's training thread:

* every step boundary (``on_step``: one list append and a few comparisons: the clock is read by
  the runner's step clock, and nothing else runs there unless a window is open or due);
* the end of each optimizer step (``StepClock.last_optimizer_step_at``: one clock read), so that
  the last step of an epoch ends where its optimizer step did, not at the next epoch's first
  batch, and so that an optimizer step ends a ``model.eval()`` span that ``train()`` never did;
* spans of named work, each an outermost call only (nested calls of the same kind are one span):
  evaluation (``model.eval()`` until ``model.train()`` on that model, or the framework's own eval
  loop: Lightning's ``_EvaluationLoop.run``, the HF ``Trainer.evaluate``), checkpoints
  (``torch.save``, ``safetensors`` saves, Lightning's ``Trainer.save_checkpoint``, the HF
  ``Trainer._save_checkpoint``, ``Accelerator.save_state``/``save_model``) and diagnose's own
  profiled windows, and garbage collections of 5 ms or more (``gc.callbacks``); DataLoader start-ups (``iter(loader)`` to its first batch) come from the
  instrumentation's loader records, compilations from dynamo's own metrics, read at the end, and
  the compile work its callbacks announce that the metrics do not time (a backward compiled at its
  first backward, CUDA graphs recorded);
* twice a second, on a thread of its own (``Sampler``; nothing of it on the training thread):
  host RSS (``/proc/self/statm``), GPU memory allocated, the DataLoader wait so far, the training
  thread's wait for a CPU and all its threads' waits together (``RunDelays``: each thread's
  ``/proc/self/task/<tid>/schedstat``; the ``/proc`` files read with the GIL held, ``procfs``:
  one hand-off a sample, not three a thread), GPU utilisation where NVML
  answers (its handle opened once), the recent steps' median (the slow-step limit), whether a
  periodic window is due (a flag the next boundary reads: a profiler starts on the training
  thread), and the live line. On an H100 the sampling ran at the boundaries, on the training
  thread, and a host-bound loop paid 8.85% per step for it (docs/watch.md);
* short profiled windows (``WatchBudget``): every ``period_s`` of wall-clock, and when a step
  takes over ``SLOW_FACTOR`` times the recent median (a step that recurs every N steps is
  profiled where it is due next); at most ``max_windows`` and ``max_trace_bytes`` of traces.

Why one module: the hook, its sampler thread and the live line share the run's one state
(steps, spans, samples, windows) and its lock; split, each would reach into the others' fields.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, TextIO

from diagnose.rundir import RunDir
from diagnose.runtime.patching import wrap_attribute
from diagnose.runtime.procfs import ProcReader, RunDelays, host_rss_bytes

#: the layout version of ``record.whole``
WHOLE_VERSION = 1
#: memory, data wait and the live line are sampled at most this often (seconds)
SAMPLE_EVERY_S = 0.5
#: a step over this many times the median of the recent steps is slow: a window profiles it
SLOW_FACTOR = 2.0
#: how many recent steps the median is taken over
RECENT_STEPS = 64
#: at most this many boundaries are kept: past it, pairs of steps are merged (the accounting's
#: resolution halves, its sums stay exact)
MAX_BOUNDARIES = 200_000
#: at most this many memory samples: past it, every other one is dropped
MAX_SAMPLES = 20_000
#: a garbage collection at least this long (seconds) is a span; shorter ones are not kept
GC_MIN_S = 0.005
#: on a pipe or a log file, the live line is printed this often (seconds)
PIPE_LINE_EVERY_S = 30.0


@dataclass(frozen=True)
class WatchBudget:
    """What the later profiled windows may take (docs/watch.md)."""

    #: a window every this many seconds of wall-clock (0: none)
    period_s: float = 600.0
    #: profiled steps in a window
    window_steps: int = 3
    #: windows at most, periodic and slow-step ones together
    max_windows: int = 12
    #: traces written at most (bytes); once over, no more windows
    max_trace_bytes: int = 256 * 1024 * 1024
    #: slow-step windows at least this far apart (seconds)
    slow_gap_s: float = 300.0
    #: the later windows' time (profiled steps and export) stays under this share of the
    #: wall-clock so far: a window starts only if the one before's length would still fit
    max_cost_share: float = 0.01
    #: the sampler reads the GPU's memory (the allocator) and utilisation (NVML); off
    #: (``--no-gpu-samples``): neither, and memory creep is the host's alone
    gpu_samples: bool = True


def budget_argv(budget: WatchBudget) -> list[str]:
    """The budget as ``diagnose run`` options (a rank of ``diagnose watch --nproc-per-node``)."""
    return [
        "--whole",
        "--window-every",
        f"{budget.period_s:g}",
        "--window-steps",
        str(budget.window_steps),
        "--max-windows",
        str(budget.max_windows),
        "--window-budget",
        f"{budget.max_cost_share:g}",
        *([] if budget.gpu_samples else ["--no-gpu-samples"]),
    ]


#: a window's length is guessed at this (seconds) before one has been taken
FIRST_WINDOW_GUESS_S = 1.0


@dataclass(frozen=True)
class Hooked:
    """One framework method whose calls are a span of named work."""

    module: str
    cls: str | None  # None: a module-level function
    attr: str
    kind: str  # "eval" or "checkpoint"
    name: str  # in the framework's own terms


#: framework methods watched (patched now, or when the script imports their module)
HOOKED = (
    Hooked(
        "lightning.pytorch.loops.evaluation_loop",
        "_EvaluationLoop",
        "run",
        "eval",
        "Lightning validation loop (validation_step)",
    ),
    Hooked(
        "pytorch_lightning.loops.evaluation_loop",
        "_EvaluationLoop",
        "run",
        "eval",
        "Lightning validation loop (validation_step)",
    ),
    Hooked(
        "lightning.pytorch.trainer.trainer",
        "Trainer",
        "save_checkpoint",
        "checkpoint",
        "Lightning Trainer.save_checkpoint (ModelCheckpoint)",
    ),
    Hooked(
        "pytorch_lightning.trainer.trainer",
        "Trainer",
        "save_checkpoint",
        "checkpoint",
        "Lightning Trainer.save_checkpoint (ModelCheckpoint)",
    ),
    Hooked("lightning.fabric.fabric", "Fabric", "save", "checkpoint", "Fabric.save"),
    Hooked("transformers.trainer", "Trainer", "evaluate", "eval", "HF Trainer.evaluate (eval_strategy / eval_steps)"),
    Hooked(
        "transformers.trainer",
        "Trainer",
        "_save_checkpoint",
        "checkpoint",
        "HF Trainer._save_checkpoint (save_strategy / save_steps)",
    ),
    Hooked("accelerate.accelerator", "Accelerator", "save_state", "checkpoint", "Accelerator.save_state"),
    Hooked("accelerate.accelerator", "Accelerator", "save_model", "checkpoint", "Accelerator.save_model"),
    Hooked("safetensors.torch", None, "save_file", "checkpoint", "safetensors.torch.save_file"),
    Hooked("safetensors.torch", None, "save_model", "checkpoint", "safetensors.torch.save_model"),
    # an epoch's end: workers that are not persistent are joined before the next epoch starts more
    Hooked(
        "torch.utils.data.dataloader",
        "_MultiProcessingDataLoaderIter",
        "_shutdown_workers",
        "data_startup",
        "DataLoader workers shut down",
    ),
)


class _Spans:
    """Outermost spans by kind: a call inside another of the same kind adds nothing."""

    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []
        self._open: dict[str, tuple[float, str, int]] = {}  # kind -> (start, name, depth)

    def enter(self, kind: str, name: str, start: float | None = None) -> None:
        """Open a span of ``kind`` (nested entries of an open one deepen it); ``start``: when it
        began, where that was before the call (a profiler's start is the window's time)."""
        current = self._open.get(kind)
        if current is None:
            self._open[kind] = (time.perf_counter() if start is None else start, name, 1)
        else:
            self._open[kind] = (current[0], current[1], current[2] + 1)

    def leave(self, kind: str, end: float | None = None) -> None:
        current = self._open.get(kind)
        if current is None:
            return
        start, name, depth = current
        if depth > 1:
            self._open[kind] = (start, name, depth - 1)
            return
        del self._open[kind]
        self.done.append(
            {
                "kind": kind,
                "start": start,
                "end": max(start, end if end is not None else time.perf_counter()),
                "name": name,
            }
        )

    def is_open(self, kind: str) -> bool:
        return kind in self._open

    def started(self, kind: str) -> float | None:
        current = self._open.get(kind)
        return current[0] if current is not None else None

    def any_open(self) -> bool:
        return bool(self._open)

    def close_all(self, end: float) -> None:
        for kind in list(self._open):
            start, name, _ = self._open.pop(kind)
            self.done.append({"kind": kind, "start": start, "end": end, "name": name, "open_at_end": True})


def process_start_perf() -> float | None:
    """``time.perf_counter()`` of this process's start (Linux: ``/proc``; 10 ms resolution), so
    that the interpreter's own start-up is counted; None elsewhere. Under ``diagnose run``'s
    supervising parent (diagnose/supervise.py) the script runs in a forked child: the parent's
    start is the run's."""
    from diagnose import supervise

    pid = os.getppid() if supervise.supervised() else "self"
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5), counted after the command's ")"
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return time.perf_counter() - max(0.0, age)


class GpuProbe:
    """GPU memory allocated and utilisation, read from any thread: the device is the training
    thread's (``attach_device``, called there; another thread's current device is device 0), and
    NVML's handle is opened once (``torch.cuda.utilization`` initialises NVML and parses
    ``CUDA_VISIBLE_DEVICES`` on every call)."""

    def __init__(self) -> None:
        self.device: int | None = None
        self.used = False  # CUDA was in use at a sample: the record gets the device's capacity
        self._nvml: Any = None  # (pynvml, handle); False once NVML failed
        self._nvml_failed = False

    def attach_device(self) -> None:
        """On the training thread: its CUDA device, if CUDA is in use."""
        torch = sys.modules.get("torch")
        if self.device is None and torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            self.device = torch.cuda.current_device()

    def read(self) -> tuple[int | None, float | None]:
        torch = sys.modules.get("torch")
        if self.device is None or torch is None or not torch.cuda.is_initialized():
            return None, None
        self.used = True
        allocated = int(torch.cuda.memory_allocated(self.device))
        return allocated, self._utilization(torch)

    def _utilization(self, torch: Any) -> float | None:
        if self._nvml_failed:
            return None
        try:
            if self._nvml is None:
                import pynvml

                pynvml.nvmlInit()
                index = torch.cuda._get_nvml_device_index(self.device)
                self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
            pynvml, handle = self._nvml
            return pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
        except Exception:  # noqa: BLE001 - no pynvml / NVML here: GPU busy is left out
            self._nvml_failed = True
            return None


class Sampler:
    """A daemon thread that calls ``sample()`` every ``every_s`` until ``stop()``."""

    def __init__(self, sample: Callable[[], None], every_s: float) -> None:
        self._sample = sample
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="diagnose-watch-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self._sample()
            except Exception:  # noqa: BLE001 - a sample lost is never an error in the script
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)


def host_capacity_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return None


class LiveLine:
    """The live line on stderr: steps/s, data wait, GPU busy, memory, goodput so far. On a
    terminal it is redrawn in place (bold goodput unless ``NO_COLOR``); on a pipe or a log, one
    plain line every ``PIPE_LINE_EVERY_S``; with ``-q``, nothing."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.interactive = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.color = self.interactive and not os.environ.get("NO_COLOR")
        self._last_plain = 0.0
        self.drawn = False

    def show(self, now: float, fields: dict[str, str]) -> None:
        if not self.enabled:
            return
        if self.interactive:
            text = "  ".join(f"{k} {self._bold(v) if k == 'goodput' else v}" for k, v in fields.items())
            self.stream.write(f"\r\x1b[2Kdiagnose ▸ watch  {text}")
            self.drawn = True
        elif now - self._last_plain >= PIPE_LINE_EVERY_S:
            self._last_plain = now
            self.stream.write("diagnose ▸ watch  " + "  ".join(f"{k} {v}" for k, v in fields.items()) + "\n")
        else:
            return
        self.stream.flush()

    def _bold(self, text: str) -> str:
        return f"\x1b[1m{text}\x1b[0m" if self.color else text

    def done(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self.drawn = False


def live_fields(
    steps_per_s: float,
    data_wait: float | None,
    gpu_busy: float | None,
    rss: int | None,
    gpu_bytes: int | None,
    goodput: float | None,
) -> dict[str, str]:
    """The live line's fields, formatted (pure: tested on its own)."""
    out = {"steps/s": f"{steps_per_s:.1f}" if steps_per_s < 100 else f"{steps_per_s:.0f}"}
    if data_wait is not None:
        out["data wait"] = f"{data_wait:.0%}"
    if gpu_busy is not None:
        out["GPU busy"] = f"{gpu_busy:.0%}"
    if gpu_bytes is not None:
        out["GPU mem"] = f"{gpu_bytes / 1e9:.1f} GB"
    if rss is not None:
        out["host mem"] = f"{rss / 1e9:.2f} GB"
    if goodput is not None:
        out["goodput"] = f"{goodput:.0%}"
    return out


class WholeRun:
    """The runner hook of ``diagnose watch``."""

    def __init__(
        self, run_dir: RunDir, rank: int | None = None, budget: WatchBudget | None = None, live: LiveLine | None = None
    ) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.budget = budget or WatchBudget()
        self.live = live or LiveLine(enabled=False)
        self.process_start = process_start_perf()
        self.boundaries: list[float] = []
        self.merged_pairs = 0  # times the boundaries were halved (MAX_BOUNDARIES)
        self.spans = _Spans()
        self.samples: list[dict[str, Any]] = []
        self.windows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.run: Any = None
        self._undo: list[Callable[[], None]] = []
        self._finder: Any = None
        self._hooked: set[tuple[str, str | None, str]] = set()
        self._eval_model: Any = None
        self._slow_limit = float("inf")
        self._slow_steps: list[int] = []
        self._spans_seen = 0
        self._gc_started: float | None = None
        self._last_slow_window = -1e18
        self._next_periodic = 0.0
        self._profiler: Any = None
        self._window_ends_at = -1
        self._window_due = -1
        self._trace_bytes = 0
        self.gpu = GpuProbe()
        self._sampler: Sampler | None = None
        self._training_thread: int | None = None
        #: every thread's run-queue wait; its reader (the GIL held: procfs) reads RSS too
        self._delays = RunDelays(reader=ProcReader())
        #: set by the sampler thread, read at the next boundary: a periodic window is due
        self._periodic_due = False
        self._last_sample: tuple[float, int, float] | None = None  # (time, steps, data wait)
        #: compile work dynamo's callbacks announced (``_time_compiles``): its start, end, trigger
        self._compile_work: list[dict[str, Any]] = []

    # --- runner hook interface ------------------------------------------------------------------

    def attach(self, run: Any) -> None:
        """The script run (``runner._ScriptRun``): its session, clock and instrumentation."""
        self.run = run

    def install(self) -> None:
        import torch
        from torch import nn

        from diagnose.runtime.frameworkwatch import when_imported

        now = time.perf_counter()
        self._next_periodic = now + self.budget.period_s if self.budget.period_s > 0 else float("inf")
        self._patch_attr(torch, "save", self._span_wrapper("checkpoint", "torch.save"))
        import gc

        gc.callbacks.append(self._gc_callback)
        self._undo.append(lambda: gc.callbacks.remove(self._gc_callback) if self._gc_callback in gc.callbacks else None)
        self._patch_attr(nn.Module, "eval", self._wrap_eval)
        self._patch_attr(nn.Module, "train", self._wrap_train)
        by_module: dict[str, list[Hooked]] = {}
        for h in HOOKED:
            by_module.setdefault(h.module, []).append(h)
        on_loaded: dict[str, Callable[[Any], None]] = {
            n: partial(self._hook_module, hooked=hs) for n, hs in by_module.items()
        }
        on_loaded["torch._dynamo.callback"] = self._time_compiles
        self._finder = when_imported(on_loaded)

    def remove(self) -> None:
        from diagnose.runtime.frameworkwatch import stop_watching_imports

        stop_watching_imports(self._finder)
        self._finder = None
        self._stop_sampler()
        self._stop_window(time.perf_counter(), keep=False)
        while self._undo:
            self._undo.pop()()
        self.live.done()

    def window_opened(self) -> None:
        pass

    def window_closed(self, record: Any) -> None:
        pass

    # --- patches --------------------------------------------------------------------------------

    def _patch_attr(self, owner: Any, name: str, factory: Callable[[Any], Any]) -> None:
        self._undo.append(wrap_attribute(owner, name, factory))

    def _hook_module(self, module: Any, hooked: list[Hooked]) -> None:
        for h in hooked:
            key = (h.module, h.cls, h.attr)
            owner = getattr(module, h.cls, None) if h.cls else module
            if owner is None or key in self._hooked or h.attr not in vars(owner):
                continue
            self._patch_attr(owner, h.attr, self._span_wrapper(h.kind, h.name))
            self._hooked.add(key)

    def _time_compiles(self, module: Any) -> None:
        """Dynamo's compilation callbacks (``torch._dynamo.callback``), which announce the outermost
        start and end of each piece of compile work on the training thread: dynamo's frames, and
        what its metrics do not time, the backward graph compiled at its first backward
        (``LAZY_BACKWARD``) and CUDA graphs recorded (``CUDAGRAPH_RECORDING``). Registered when
        the script (or torch.compile) imports dynamo; nothing when this torch has no callbacks."""
        handler = getattr(module, "callback_handler", None)
        register_start = getattr(handler, "register_start_callback", None)
        register_end = getattr(handler, "register_end_callback", None)
        if register_start is None or register_end is None:
            return

        opened: dict[str, Any] = {}  # the piece of work under way (the callbacks are outermost only)

        def started(args: Any) -> None:
            trigger = getattr(getattr(args, "callback_trigger", None), "name", "dynamo")
            opened.update(
                start=time.perf_counter(), trigger=str(trigger).lower(), compile_id=str(getattr(args, "compile_id", ""))
            )

        def ended(args: Any) -> None:
            if opened:
                self._compile_work.append({**opened, "end": time.perf_counter()})
                opened.clear()

        register_start(started)
        register_end(ended)

        def unregister() -> None:
            for name, callback in (("remove_start_callback", started), ("remove_end_callback", ended)):
                remove = getattr(handler, name, None)
                if remove is not None:
                    with contextlib.suppress(ValueError):
                        remove(callback)

        self._undo.append(unregister)

    def _span_wrapper(self, kind: str, name: str) -> Callable[[Any], Any]:
        spans = self.spans
        watch = self

        def factory(original: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if kind == "eval":
                    watch._evaluation_begins()
                spans.enter(kind, name)
                try:
                    return original(*args, **kwargs)
                finally:
                    spans.leave(kind)
                    if kind == "eval" and not spans.is_open("eval"):
                        watch._end_model_eval()  # the framework's loop ended: so did its model.eval()

            wrapper.__wrapped__ = original  # type: ignore[attr-defined]
            wrapper.__name__ = getattr(original, "__name__", "wrapper")
            return wrapper

        return factory

    def _evaluation_begins(self) -> None:
        """A later window still open when an evaluation begins ends there, with the steps it
        profiled: it profiles training steps, and left open it took the whole evaluation (the
        window ends after its steps, and evaluation takes none), which the accounting then
        counted as profiling, not evaluation (a test's 1.5 s of 4.5 s, now and then)."""
        if self._profiler is not None:
            self._stop_window(time.perf_counter(), keep=True)
            window = self.windows[-1]
            window["steps"] = max(0, len(self.boundaries) - 1 - window["first_step"])
            window["ended_by"] = "evaluation"

    def _gc_callback(self, phase: str, info: dict[str, Any]) -> None:
        """Python's garbage collector: a collection of ``GC_MIN_S`` or more, once the steps have
        begun, is a span (those of the imports and the model build are start-up)."""
        now = time.perf_counter()
        if phase == "start":
            self._gc_started = now
        elif (
            self._gc_started is not None and now - self._gc_started >= GC_MIN_S and self.boundaries
        ):  # in the loop: imports' are start-up
            self.spans.done.append(
                {"kind": "gc", "start": self._gc_started, "end": now, "name": f"gc generation {info.get('generation')}"}
            )

    def _wrap_eval(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def eval(module: Any) -> Any:  # nn.Module's name
            if watch._eval_model is None and module.training and watch.boundaries:
                watch._eval_model = module
                watch._evaluation_begins()
                watch.spans.enter("eval_model", f"{type(module).__name__}.eval() ... .train()")
            return original(module)

        return eval

    def _wrap_train(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def train(module: Any, mode: bool = True) -> Any:
            if mode and module is watch._eval_model:
                watch._end_model_eval()
            return original(module, mode)

        return train

    def _training_again(self, b: list[float]) -> None:
        """An optimizer step since ``model.eval()``: training again (a framework restored the
        mode without ``train()``, or the script trains in eval mode on purpose). The evaluation
        ended by the step before this boundary at the latest."""
        clock = self.run.clock if self.run is not None else None
        stepped = getattr(clock, "last_optimizer_step_at", None)
        start = self.spans.started("eval_model")
        if stepped is None or start is None or stepped <= start:
            return
        self._end_model_eval(b[-2] if len(b) > 1 else None)

    def _end_model_eval(self, at: float | None = None) -> None:
        if self._eval_model is None:
            return
        self._eval_model = None
        self.spans.leave("eval_model", at)

    # --- per step -------------------------------------------------------------------------------

    def on_step(self, now: float) -> None:
        b = self.boundaries
        if b and now <= b[-1]:  # a stronger step signal restarted the count at an earlier boundary
            while b and b[-1] >= now:
                b.pop()
        b.append(now)
        k = len(b) - 1
        if k == 0:
            self._first_step(now)
        if self._eval_model is not None:
            self._training_again(b)
        if (
            k >= 1
            and now - b[-2] > self._slow_limit
            and len(self.spans.done) == self._spans_seen
            and not self.spans.any_open()
        ):
            self._slow_step(k, now)  # slow, and no named span (evaluation, a save) explains it
        self._spans_seen = len(self.spans.done)
        if self._profiler is not None:
            if k >= self._window_ends_at:
                self._stop_window(now, keep=True)
            else:
                self._profiler.step()
        elif k == self._window_due:
            self._start_window(k, "slow step due", now)
        elif self._periodic_due:  # the sampler found a periodic window due: it starts here
            self._periodic_due = False
            self._start_window(k, "periodic", now)
        if len(b) > MAX_BOUNDARIES:
            self._merge_pairs()

    def _first_step(self, now: float) -> None:
        """The first boundary, on the training thread: its id and CUDA device, memory where the
        steps start (what creeps is measured from here), then the sampler thread."""
        self._training_thread = threading.get_native_id()
        self.gpu.attach_device()
        self._sample(now)
        if self._sampler is None:
            self._sampler = Sampler(lambda: self._sample(time.perf_counter()), SAMPLE_EVERY_S)
            self._sampler.start()

    def _stop_sampler(self) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()

    def _merge_pairs(self) -> None:
        """Halve the boundaries (every other one kept): the sums stay exact, the resolution halves."""
        self.boundaries = (
            self.boundaries[::2] if len(self.boundaries) % 2 else [*self.boundaries[:-1:2], self.boundaries[-1]]
        )
        self.merged_pairs += 1
        self._window_due = -1  # step numbers changed: no window is due any more
        self._window_ends_at = min(self._window_ends_at, len(self.boundaries))

    def _slow_step(self, k: int, now: float) -> None:
        """Step ``k - 1`` was slow. A window now profiles the next steps; a slow step that recurs
        every N steps is profiled where it is due next (one step)."""
        slow = self._slow_steps
        slow.append(k - 1)
        if self._profiler is not None or self._window_due > k or not self._main_window_done():
            return
        if now - self._last_slow_window < self.budget.slow_gap_s:
            return
        if len(slow) >= 3 and slow[-1] - slow[-2] == slow[-2] - slow[-3] > 1:
            self._window_due = slow[-1] + (slow[-1] - slow[-2])  # the boundary that starts it
            self._last_slow_window = now
            return
        self._last_slow_window = now
        self._start_window(k, "slow step", now)

    def _sampler_thread(self) -> int | None:
        """This thread's native id when it is the sampler's (its own waits say nothing of a step),
        else None: a sample the training thread takes counts every thread's waits."""
        me = threading.get_native_id()
        return None if me == self._training_thread else me

    def _sample(self, now: float) -> None:
        """One sample: on the sampler thread twice a second, on the training thread at the
        first boundary and at the end. It reads what the training thread writes (the boundaries,
        the clock's data wait, the spans) without a lock: a list append and a float store are
        atomic under the GIL, and a sample a step behind is still a sample."""
        b = self.boundaries[-RECENT_STEPS - 1 :]  # one slice: the list may grow (or be halved) meanwhile
        steps = len(self.boundaries) - 1
        recent = [b[i + 1] - b[i] for i in range(len(b) - 1)]
        if len(recent) >= 8:
            self._slow_limit = SLOW_FACTOR * statistics.median(recent)
        if self._profiler is None and now >= self._next_periodic and self._main_window_done():
            self._next_periodic = now + self.budget.period_s
            self._periodic_due = True  # started by the training thread at its next boundary
        clock = self.run.clock if self.run is not None else None
        data_wait = clock.data_wait_s if clock is not None else 0.0
        rss = host_rss_bytes(self._delays.reader)
        gpu_bytes, gpu_busy = self.gpu.read() if self.budget.gpu_samples else (None, None)
        sample = {
            "t": now,
            "steps": steps,
            "data_wait_s": round(data_wait, 6),
            "rss_bytes": rss,
            "threads_run_delay_s": self._delays.read(skip=self._sampler_thread()),
            "run_delay_s": self._delays.waited(self._training_thread),
        }
        if gpu_bytes is not None:
            sample["gpu_allocated_bytes"] = gpu_bytes
        if gpu_busy is not None:
            sample["gpu_busy"] = gpu_busy
        self.samples.append(sample)
        if len(self.samples) > MAX_SAMPLES:
            self.samples = self.samples[::2]
        last, self._last_sample = self._last_sample, (now, steps, data_wait)
        if last is None or now <= last[0]:
            return
        elapsed = now - last[0]
        steps_per_s = (steps - last[1]) / elapsed
        start = self.process_start if self.process_start is not None else (self.run.t0 if self.run is not None else now)
        first = self.boundaries[0] if self.boundaries else None
        spans_s = (
            sum(s["end"] - s["start"] for s in list(self.spans.done) if s["start"] >= first)
            if first is not None
            else 0.0
        )
        goodput = (
            max(0.0, (b[-1] - first) - spans_s) / (now - start)
            if first is not None and steps > 0 and now > start
            else None
        )
        self.live.show(
            now, live_fields(steps_per_s, (data_wait - last[2]) / elapsed, gpu_busy, rss, gpu_bytes, goodput)
        )

    def _main_window_done(self) -> bool:
        session = self.run.session if self.run is not None else None
        return session is None or session.finished or session.profiler_blocked

    # --- later profiled windows ------------------------------------------------------------------

    def _affordable(self, now: float) -> bool:
        """Whether one more window (as long as the last one) keeps the windows' time under
        ``max_cost_share`` of the wall-clock so far."""
        start = self.process_start if self.process_start is not None else (self.run.t0 if self.run is not None else now)
        spent = sum(w["ended"] - w["started"] for w in self.windows if "ended" in w)
        guess = (
            (self.windows[-1]["ended"] - self.windows[-1]["started"])
            if self.windows and "ended" in self.windows[-1]
            else FIRST_WINDOW_GUESS_S
        )
        return spent + guess <= self.budget.max_cost_share * (now - start)

    def _start_window(self, k: int, reason: str, now: float) -> None:
        budget = self.budget
        if (
            self._profiler is not None
            or len(self.windows) >= budget.max_windows
            or self._trace_bytes >= budget.max_trace_bytes
        ):
            return
        if not self._affordable(now):
            return
        session = self.run.session if self.run is not None else None
        if session is not None and (session.profiler_blocked or session.foreign.active() is not None):
            return  # the script's own profiler holds Kineto
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile

            cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            prof = profile(activities=activities, record_shapes=False, profile_memory=False, with_stack=False)
            prof.step_num = k
            if session is not None:
                with session.foreign.ours():
                    prof.start()
            else:
                prof.start()
        except Exception as exc:  # noqa: BLE001 - a window that cannot start is noted, never raised
            self.notes.append(f"a profiled window could not start at step {k}: {exc}")
            self._next_periodic = float("inf")
            return
        self._profiler = prof
        self._window_ends_at = k + (1 if reason == "slow step due" else budget.window_steps)
        self._window_due = -1
        self._periodic_due = False  # this window serves a periodic one due meanwhile
        # from the boundary: the profiler's start (Kineto's set-up, 0.1 s and more) is the window's
        self.spans.enter("profiling", f"diagnose window ({reason})", start=now)
        self.windows.append({"reason": reason, "first_step": k, "steps": self._window_ends_at - k, "started": now})

    def _stop_window(self, now: float, keep: bool) -> None:
        prof, self._profiler = self._profiler, None
        if prof is None:
            return
        window = self.windows[-1]
        session = self.run.session if self.run is not None else None
        try:
            if session is not None:
                with session.foreign.ours():
                    prof.stop()
            else:
                prof.stop()
            if keep:
                path = self.run_dir.watch_trace_path(len(self.windows), window["first_step"], self.rank)
                window["trace"] = export_gzipped(prof, path)
                window["bytes"] = path.stat().st_size
                self._trace_bytes += window["bytes"]
        except Exception as exc:  # noqa: BLE001 - a window lost is noted, never raised into the script
            self.notes.append(f"the profiled window at step {window['first_step']} was not saved: {exc}")
        window["ended"] = time.perf_counter()
        self.spans.leave("profiling")

    # --- the end --------------------------------------------------------------------------------

    def finish(self, record: Any) -> None:
        """``record.whole``: everything above, in seconds from the script's start."""
        end = getattr(record, "script_end_s", None) or time.perf_counter()
        self._stop_sampler()
        self._stop_window(end, keep=True)
        if self.boundaries:
            self._next_periodic = float("inf")  # no window after the end
            self._sample(end)  # memory where the script ended
        self.live.done()
        self.spans.close_all(end)
        origin = (
            record.script_start_s
            if record.script_start_s is not None
            else (self.run.t0 if self.run is not None else end)
        )

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - origin, 6)

        loaders = []
        instrumentation = getattr(self.run, "instrumentation", None)
        # the instrumentation's loaders as they are now (the record's may be a copy from the window)
        for info in instrumentation.dataloaders.values() if instrumentation is not None else record.dataloaders:
            starts = getattr(info, "first_batch_at_s", [])
            # the start-up lasts until every worker has delivered (or the epoch ended before that)
            waits = info.workers_ready_s if len(info.workers_ready_s) == len(starts) else info.first_batch_wait_s
            loaders.append(
                {
                    "created_at": info.created_at,
                    "num_workers": info.num_workers,
                    "persistent_workers": info.persistent_workers,
                    "starts": [[rel(s), round(w, 6)] for s, w in zip(starts, waits, strict=True)],
                }
            )
        capacity = {"host_bytes": host_capacity_bytes()}
        torch = sys.modules.get("torch")
        if self.gpu.used and torch is not None:
            try:
                capacity["gpu_bytes"] = int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
            except Exception:  # noqa: BLE001
                pass
        record.whole = {
            "version": WHOLE_VERSION,
            "process_start_s": rel(self.process_start),
            "script_end_s": rel(end),
            "boundaries_s": [rel(t) for t in self.boundaries],
            "merged_pairs": self.merged_pairs,
            "last_optimizer_step_s": rel(
                getattr(self.run.clock, "last_optimizer_step_at", None) if self.run is not None else None
            ),
            "spans": [{**s, "start": rel(s["start"]), "end": rel(s["end"])} for s in self.spans.done],
            "loaders": loaders,
            "compiles": compile_spans(origin, self._compile_work),
            "samples": [{**s, "t": rel(s["t"])} for s in self.samples],
            "windows": [{**w, "started": rel(w.get("started")), "ended": rel(w.get("ended"))} for w in self.windows],
            "capacity": capacity,
            "budget": asdict(self.budget),
            "notes": self.notes,
        }


#: a frame's compilation seen by dynamo's callbacks alone (a torch without compilation metrics)
DYNAMO_FRAME = "a frame (dynamo)"
#: what each kind of compile work that dynamo's metrics do not time is called in a report
COMPILE_WORK = {
    "lazy_backward": "the backward graph, compiled at its first backward",
    "cudagraph_recording": "CUDA graphs recorded",
    "triton_autotuning": "Triton kernels autotuned",
}


def compile_spans(origin: float, work: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each compilation dynamo made (its own metrics: start, duration, the frame, the recompile
    reason), in seconds from ``origin`` (``time.perf_counter()``), then the compile work its
    callbacks announced that no metric covers (``work``, from ``WholeRun._time_compiles``).

    A metric or a callback's span after the first of its compile id is a part of that frame's
    compilation (``trigger``: its backward graph, compiled at the first backward; CUDA graphs
    recorded), and carries the frame's recompile reason: a recompilation costs its backward's
    compile too. Where this torch has no metrics, the callbacks' dynamo spans stand in for them."""
    out = _dynamo_metrics(origin)
    covered = [(c["start"], c["end"]) for c in out]
    for w in work or []:
        start, end = round(w["start"] - origin, 6), round(w["end"] - origin, 6)
        if any(min(end, b) - max(start, a) > 0.5 * (end - start) for a, b in covered):
            continue  # a metric times it already
        trigger = w.get("trigger", "dynamo")
        out.append(
            {
                "start": start,
                "end": end,
                "frame": COMPILE_WORK.get(trigger, DYNAMO_FRAME),
                "reason": None,
                "trigger": trigger,
                "compile_id": w.get("compile_id") or None,
            }
        )
    out.sort(key=lambda c: c["start"])
    frames: dict[str, dict[str, Any]] = {}
    for c in out:
        frame = frames.setdefault(c["compile_id"], c) if c.get("compile_id") else c
        if frame is c:
            continue
        # a part of the frame's compilation: a second span of one compile id is its backward
        part = c["trigger"] if c.get("trigger") not in (None, "dynamo") else "lazy_backward"
        c["trigger"], c["reason"] = part, frame.get("reason")
        if c["frame"] == DYNAMO_FRAME or not c["frame"].strip(" (:)"):  # no frame of its own
            c["frame"] = COMPILE_WORK.get(part, c["frame"])
    return out


def _dynamo_metrics(origin: float) -> list[dict[str, Any]]:
    utils = sys.modules.get("torch._dynamo.utils")
    get = getattr(utils, "get_compilation_metrics", None) if utils is not None else None
    try:
        metrics = list(get()) if get is not None else []
    except Exception:  # noqa: BLE001 - a private API: no compile spans if it changed
        return []
    from diagnose.runtime.compilewatch import first_line

    epoch_to_perf = time.perf_counter() - time.time()
    out = []
    for m in metrics:
        start_us, duration_us = getattr(m, "start_time_us", None), getattr(m, "duration_us", None)
        if start_us is None or duration_us is None:
            continue
        start = start_us / 1e6 + epoch_to_perf - origin
        reason = getattr(m, "recompile_reason", None)
        compile_id = getattr(m, "compile_id", None)
        out.append(
            {
                "start": round(start, 6),
                "end": round(start + duration_us / 1e6, 6),
                "frame": f"{getattr(m, 'co_name', '') or ''} ({os.path.basename(getattr(m, 'co_filename', '') or '')}:{getattr(m, 'co_firstlineno', '') or ''})",
                "reason": first_line(reason) if reason else None,
                "compile_id": str(compile_id) if compile_id is not None else None,
            }
        )
    return out


def export_gzipped(prof: Any, path: Any) -> str:
    """Export a stopped profiler's trace to ``path`` (gzip level 6); returns the name relative
    to the run directory's folder of windows."""
    path.parent.mkdir(exist_ok=True)
    raw = path.with_name(path.name[: -len(".gz")] + ".partial")
    try:
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(path, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 16 * 1024 * 1024)
    finally:
        raw.unlink(missing_ok=True)
    return f"{path.parent.name}/{path.name}"
