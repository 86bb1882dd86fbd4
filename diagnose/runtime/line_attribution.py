"""Point at the line: sync call sites, hot Python in the main thread and in DataLoader workers.

A runner hook (``install``, ``window_opened``, ``window_closed``, ``finish``, ``remove``):

* sync sites: during the profiled window ``torch.cuda.set_sync_debug_mode("warn")`` makes every
  synchronising CUDA call (``.item()``, ``.cpu()``, ``print`` of a CUDA tensor, ``nonzero``,
  blocking copies, ``torch.cuda.synchronize``) raise a warning at the Python line that caused
  it; we take the first frame of the user's own code, count per line, and swallow the warning;
* the main thread: a sampler thread reads the main thread's stack every few milliseconds during
  the window and charges each sample to the innermost user line, by what the thread was in
  (DataLoader, model, backward, optimizer, or other code);
* DataLoader workers: each worker runs the same sampler for its whole life (worker_init_fn) and
  times every batch it builds in CPU seconds; it writes its counts to ``workers/`` in the run
  directory, which the main process merges.

Costs: nothing outside the window in the main process; one wake-up every few milliseconds in
each sampler. ``diagnose run --no-lines`` switches all of it off.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from diagnose.atomic import write_atomically
from diagnose.runtime.usercode import first_user_frame, is_generated, source_line

SYNC_WARNING = "synchronizing CUDA operation"
MAIN_INTERVAL_S = 0.002
#: GIL switch interval while the main thread is sampled. At Python's default (5 ms) a sampler
#: thread mostly gets the GIL when the main thread releases it in a torch op, so pure-Python
#: lines were never sampled; 0.2 ms lets it in within a fraction of a sampling interval.
SAMPLING_SWITCH_INTERVAL_S = 0.0002
WORKER_INTERVAL_S = 0.005
FLUSH_S = 0.25
TOP = 8
#: syncs whose order is kept, to match them one by one with the trace's (256 a step for 10 steps fit)
MAX_SEQUENCE = 200_000

# Where in torch a stack is, by the files it passes through (innermost match wins).
_PLACES = (
    ("data", ("torch/utils/data/",)),
    ("optimizer", ("torch/optim/",)),
    ("backward", ("torch/autograd/__init__.py", "torch/_tensor.py:backward", "torch/autograd/graph.py")),
    ("model", ("torch/nn/modules/module.py",)),
)
# What a DataLoader worker is doing, by the functions on its stack.
_WORKER_ACTIVITIES = (
    ("collate", ("collate",)),
    ("decode", ("decode", "load", "open", "frombuffer", "imdecode", "imread", "read_image", "decode_jpeg", "convert")),
    ("resize", ("resize", "thumbnail", "interpolate")),
)


#: the standard library's files where a thread blocks until another thread or process hands it
#: something (a queue's get, a pipe's recv, a condition or event's wait)
_WAITS_FOR_ANOTHER = (
    "/multiprocessing/queues.py",
    "/multiprocessing/connection.py",
    "/multiprocessing/synchronize.py",
    "/queue.py",
    "/threading.py",
)


def waits_for_another(frame: FrameType, user: FrameType | None) -> bool:
    """Whether the stack between its innermost frame and the user's line passes through a wait
    for another thread or process (``_WAITS_FOR_ANOTHER``) to hand it something: a script's own
    producers' queue. A ``put`` into a full queue waits for a consumer instead: not counted."""
    at: FrameType | None = frame
    waits = False
    while at is not None and at is not user:
        if at.f_code.co_filename.replace(os.sep, "/").endswith(_WAITS_FOR_ANOTHER):
            if at.f_code.co_name in ("put", "put_nowait"):
                return False
            waits = True
        at = at.f_back
    return waits


def _site(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class Sampler:
    """Samples one thread's stack at a fixed interval, charging each sample to a user line."""

    def __init__(
        self,
        thread_id: int,
        interval: float,
        library: tuple[str, ...],
        classify: Callable[[FrameType], str],
        user_frame: Callable[[FrameType], FrameType | None] | None = None,
        count_waits: bool = False,
    ) -> None:
        self.thread_id = thread_id
        self.interval = interval
        self.library = library
        self.classify = classify
        self.user_frame = user_frame or (lambda f: first_user_frame(f, library))
        #: whether each sample's stack is walked for a wait on another thread or process: the
        #: main thread's only (a worker's counts are written without them)
        self.count_waits = count_waits
        self.counts: Counter[tuple[str, str, str]] = Counter()  # (where, site, function)
        #: of ``counts``, the samples whose stack waited for another thread or process there
        self.waits: Counter[tuple[str, str, str]] = Counter()
        self.where_counts: Counter[str] = Counter()
        self.samples = 0
        #: each sample's time and what it counted, so that the samples after a moment (the
        #: script's teardown after its last step) can be taken back (``drop_after``)
        self.taken: list[tuple[float, str, tuple[str, str, str] | None, bool]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="diagnose-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        """One sample. The frames are local to this call, so no reference to the sampled
        thread's frames outlives it: a frame held across the wait kept its function's locals
        (the script's tensors) alive after the function returned, and freed them later on this
        thread, at a moment the script does not control."""
        frame = sys._current_frames().get(self.thread_id)
        if frame is None:
            return
        self.samples += 1
        where = self.classify(frame)
        if where == "diagnose":
            self.taken.append((time.perf_counter(), where, None, False))
            return
        self.where_counts[where] += 1
        user = self.user_frame(frame)
        key = (where, _site(user), user.f_code.co_name) if user is not None else None
        waited = False
        if key is not None:
            self.counts[key] += 1
            waited = self.count_waits and waits_for_another(frame, user)
            if waited:
                self.waits[key] += 1
        self.taken.append((time.perf_counter(), where, key, waited))

    def drop_after(self, moment: float) -> None:
        """Take back the samples taken after ``moment``: they are no step's."""
        while self.taken and self.taken[-1][0] > moment:
            _, where, key, waited = self.taken.pop()
            self.samples -= 1
            if where != "diagnose":
                self.where_counts[where] -= 1
            if key is not None:
                self.counts[key] -= 1
                if waited:
                    self.waits[key] -= 1
        self.counts = +self.counts  # drop the zeros
        self.waits = +self.waits
        self.where_counts = +self.where_counts


_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace(os.sep, "/") + "/"  # the diagnose package


def classify_main(frame: FrameType | None, library: tuple[str, ...] = ()) -> str:
    """data / optimizer / backward / model / other, from the files on the main thread's stack
    (innermost first); "diagnose" for our own step-boundary work inside the user's loop. The
    frames below the script (runpy, our runner, the CLI) say nothing and end the walk."""
    seen_user = False
    while frame is not None:
        filename = frame.f_code.co_filename.replace(os.sep, "/")
        if filename.startswith(_OWN) or filename == "<frozen runpy>":
            if seen_user:
                return "other"  # reached the script's entry: nothing of torch's was on the way
            if not filename.endswith("/instrument.py"):
                return "diagnose"
        elif not filename.startswith(library) and not is_generated(filename):
            seen_user = True
        for where, markers in _PLACES:
            if any(m.split(":")[0] in filename for m in markers):
                return where
        frame = frame.f_back
    return "other"


def worker_frames(frame: FrameType | None) -> list[FrameType]:
    """A worker's frames inside its batch loop (innermost first). With fork, the stack below
    ``_worker_loop`` is the parent's, copied at the fork: it says nothing about the worker."""
    frames: list[FrameType] = []
    while frame is not None:
        if frame.f_code.co_name == "_worker_loop":
            return frames
        frames.append(frame)
        frame = frame.f_back
    return frames


def classify_worker(frames: list[FrameType]) -> str:
    """collate / decode / resize / user code, or idle (waiting for work), from a worker's frames."""
    names = [f.f_code.co_name.lower() for f in frames]
    if not names or (
        any(n in ("get", "poll", "wait", "_poll", "recv") for n in names[:3]) and not any("fetch" in n for n in names)
    ):
        return "idle"
    for activity, words in _WORKER_ACTIVITIES:
        if any(word == name or (len(word) > 4 and word in name) for name in names for word in words):
            return activity
    return "user code"


def sync_kind(code: str) -> str:
    """What kind of sync a line of source shows."""
    checks = (
        (".item(", "item"),
        (".tolist(", "copy to host"),
        (".cpu(", "copy to host"),
        (".numpy(", "copy to host"),
        ("synchronize(", "synchronize"),
        ("print(", "print of a CUDA tensor"),
        ("nonzero", "data-dependent shape"),
        (".to(", "blocking copy"),
    )
    for needle, kind in checks:
        if needle in code:
            return kind
    return "implicit (data-dependent shape or blocking copy)"


# --- DataLoader workers ---------------------------------------------------------------------------


class WorkerProbe:
    """Runs inside a DataLoader worker: samples its stack, times its batches, saves to a file."""

    def __init__(self, out_dir: str, library: tuple[str, ...]) -> None:
        self.path = Path(out_dir) / f"worker-{os.getpid()}.json"
        self.library = library
        self.cpu_s = 0.0
        self.batches = 0
        #: the CPU time of this worker's first batch (its lazy imports, cold caches): left out of
        #: the time per batch where the worker built more (``_worker_hotspots``)
        self.first_cpu_s: float | None = None
        self._last_flush = time.monotonic()
        self.sampler = Sampler(
            threading.get_ident(),
            WORKER_INTERVAL_S,
            library,
            lambda f: classify_worker(worker_frames(f)),
            lambda f: next((x for x in worker_frames(f) if first_user_frame(x, library) is x), None),
        )

    def flush(self) -> None:
        data = {
            "pid": os.getpid(),
            "batches": self.batches,
            "cpu_s": self.cpu_s,
            "first_cpu_s": self.first_cpu_s,
            "samples": self.sampler.samples,
            "interval_s": WORKER_INTERVAL_S,
            "counts": [[where, site, fn, n] for (where, site, fn), n in self.sampler.counts.items()],
            "where": dict(self.sampler.where_counts),
        }
        write_atomically(self.path, json.dumps(data))
        self._last_flush = time.monotonic()

    def timed_fetch(self, fetch: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return fetch(*args, **kwargs)
            finally:
                spent = time.thread_time() - start
                self.cpu_s += spent
                self.batches += 1
                if self.first_cpu_s is None:
                    self.first_cpu_s = spent
                if time.monotonic() - self._last_flush > FLUSH_S:
                    self.flush()  # workers end in os._exit: no atexit, so save as we go

        return wrapped


def _start_worker_probe(
    out_dir: str, library: tuple[str, ...], user_init: Callable[[int], None] | None, worker_id: int
) -> None:
    """worker_init_fn of every DataLoader while diagnose runs (a module-level function: picklable)."""
    try:
        import atexit

        from torch.utils.data import _utils

        probe = WorkerProbe(out_dir, library)
        info = _utils.worker.get_worker_info()
        fetcher_module = _utils.fetch
        for cls in (fetcher_module._MapDatasetFetcher, fetcher_module._IterableDatasetFetcher):
            cls.fetch = probe.timed_fetch(cls.fetch)  # type: ignore[method-assign]  # the worker's fetch, timed
        sys.setswitchinterval(SAMPLING_SWITCH_INTERVAL_S)  # this worker process only
        probe.sampler.start()
        atexit.register(probe.flush)
        if info is not None:
            probe.flush()
    except Exception as exc:  # noqa: BLE001 - never break the user's workers
        print(f"diagnose: worker probe disabled: {exc}", file=sys.stderr)
    if user_init is not None:
        user_init(worker_id)


class LineAttribution:
    """The runner hook that ties the three together and writes the record's sections."""

    def __init__(self, workers_dir: Path) -> None:
        #: where the DataLoader workers leave their samples (``RunDir.workers_path``)
        self.workers_dir = workers_dir
        self.library: tuple[str, ...] = ()
        self.sync_counts: Counter[tuple[str, str]] = Counter()
        #: the sites in the order their syncs happened (indices into ``_site_order``)
        self.sync_sequence: list[int] = []
        self._site_index: dict[tuple[str, str], int] = {}
        self.main_sampler: Sampler | None = None
        self.window_s = 0.0
        self._window_start = 0.0
        self._switch_interval = sys.getswitchinterval()
        self._sync_mode_before: Any = None
        self._showwarning: Any = None
        self._filters: Any = None
        self._undo: list[Callable[[], None]] = []
        #: why the main thread is not sampled in this window (None: it is)
        self.main_thread_off: str | None = None

    # --- runner hook interface ------------------------------------------------------------------

    def install(self) -> None:
        import functools

        from torch.utils.data import DataLoader

        from diagnose.runtime.usercode import library_prefixes

        self.library = library_prefixes()
        self.workers_dir.mkdir(exist_ok=True)
        for stale in self.workers_dir.glob("worker-*.json"):  # from an earlier run in this folder
            stale.unlink()
        original_init = DataLoader.__init__
        hook = self

        @functools.wraps(original_init)
        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            original_init(loader, *args, **kwargs)
            if loader.num_workers > 0:
                loader.worker_init_fn = functools.partial(
                    _start_worker_probe, str(hook.workers_dir), hook.library, loader.worker_init_fn
                )

        DataLoader.__init__ = __init__  # type: ignore[method-assign, assignment]
        self._undo.append(lambda: setattr(DataLoader, "__init__", original_init))

    def model_in_cuda_graphs(self) -> None:
        """The script's model runs in CUDA graphs (torch.compile mode="reduce-overhead"): the
        main thread is neither sampled nor put in sync debug mode. CUDA graph trees track the
        liveness of every output tensor and recycle their memory from the main thread; a
        sampler on another thread that holds frames can end a tensor's life on that thread, and
        a run of the compiled example with both on died inside torch's cudagraph_trees (a
        freed storage's pointer read as None, torch 2.11 on an H100). Nothing else is lost:
        steps, phases and the trace are as before."""
        self.main_thread_off = (
            "line attribution of the main thread and its sync sites was off: the model runs in CUDA graphs "
            '(torch.compile mode="reduce-overhead"), whose memory bookkeeping a sampler thread can disturb'
        )

    def window_opened(self) -> None:
        import torch

        self._window_start = time.perf_counter()
        if self.main_thread_off is not None:
            return
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(SAMPLING_SWITCH_INTERVAL_S)
        library = self.library
        self.main_sampler = Sampler(
            threading.main_thread().ident or 0,
            MAIN_INTERVAL_S,
            library,
            lambda f: classify_main(f, library),
            count_waits=True,
        )
        self.main_sampler.start()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self._sync_mode_before = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
            self._filters = warnings.filters[:]
            warnings.filterwarnings("always", message=f".*{SYNC_WARNING}.*")
            self._showwarning = warnings.showwarning
            warnings.showwarning = self._on_warning

    def window_closed(self, record: Any) -> None:
        self._stop_window()

    def finish(self, record: Any) -> None:
        self._stop_window()
        if self.main_sampler is not None and record.boundaries_s:
            # a script that ended inside the window was sampled on after its last step: what it
            # did then (teardown, a checkpoint, destroy_process_group()) is no step's, and no
            # line of the training loop's
            last = record.boundaries_s[-1]
            self.main_sampler.drop_after(last)
            self.window_s = max(0.0, min(self.window_s, last - self._window_start))
        if self.main_thread_off is not None and self.main_thread_off not in record.warnings:
            record.warnings.append(self.main_thread_off)
        record.sync_sites = self._sync_sites()
        record.sync_sequence = list(self.sync_sequence)
        record.host_samples = self._host_hotspots()
        record.worker_samples = self._worker_hotspots()

    def remove(self) -> None:
        self._stop_window()
        while self._undo:
            self._undo.pop()()

    # --- internals --------------------------------------------------------------------------------

    def _stop_window(self) -> None:
        if self.main_sampler is not None and self.main_sampler._thread is not None:
            self.main_sampler.stop()
            self.window_s = time.perf_counter() - self._window_start
            sys.setswitchinterval(self._switch_interval)
        if self._showwarning is not None:
            import torch

            torch.cuda.set_sync_debug_mode(self._sync_mode_before or 0)
            warnings.showwarning = self._showwarning
            warnings.filters[:] = self._filters  # type: ignore[index]  # a list, which typeshed calls a Sequence
            self._showwarning = None

    def _on_warning(
        self, message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        if SYNC_WARNING not in str(message):
            self._showwarning(message, category, filename, lineno, file, line)
            return
        frame = first_user_frame(sys._getframe(1), self.library)
        site = _site(frame) if frame is not None else f"{filename}:{lineno}"
        key = (site, frame.f_code.co_name if frame is not None else "?")
        self.sync_counts[key] += 1
        if len(self.sync_sequence) < MAX_SEQUENCE:
            self.sync_sequence.append(self._site_index.setdefault(key, len(self._site_index)))

    def _sync_sites(self) -> list[dict[str, Any]]:
        """Every site (the analysis matches them to the trace's syncs by ``index``)."""
        total = sum(self.sync_counts.values())
        out = []
        for key, n in self.sync_counts.most_common():
            site, function = key
            code = source_line(site)
            out.append(
                {
                    "site": site,
                    "function": function,
                    "code": code,
                    "kind": sync_kind(code),
                    "count": n,
                    "share_of_syncs": n / total,
                    "index": self._site_index[key],
                }
            )
        return out

    def _host_hotspots(self) -> dict[str, Any]:
        sampler = self.main_sampler
        if sampler is None or not sampler.samples:
            return {}
        per_sample = self.window_s / sampler.samples if sampler.samples else 0.0
        lines = []
        for key, n in sampler.counts.most_common(TOP * 3):
            where, site, function = key
            line = {
                "where": where,
                "site": site,
                "function": function,
                "code": source_line(site),
                "samples": n,
                "share": n / sampler.samples,
            }
            if sampler.waits.get(key):
                line["waits"] = sampler.waits[key]  # of its samples, those waiting for another thread or process
            lines.append(line)
        by_where = sampler.where_counts
        return {
            "samples": sampler.samples,
            "seconds_per_sample": per_sample,
            "window_s": self.window_s,
            "by_where": {k: v / sampler.samples for k, v in by_where.items()},
            "lines": lines,
        }

    def _worker_hotspots(self) -> dict[str, Any]:
        files = sorted(self.workers_dir.glob("worker-*.json")) if self.workers_dir.is_dir() else []
        counts: Counter[tuple[str, str, str]] = Counter()
        batches, cpu_s, samples = 0, 0.0, 0
        steady_batches, steady_cpu_s = 0, 0.0  # each worker's first batch left out where it built more
        activity: Counter[str] = Counter()
        for f in files:
            try:
                data = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            built, spent, first = data.get("batches", 0), data.get("cpu_s", 0.0), data.get("first_cpu_s")
            batches += built
            cpu_s += spent
            if built >= 2 and first is not None:
                steady_batches, steady_cpu_s = steady_batches + built - 1, steady_cpu_s + spent - first
            else:
                steady_batches, steady_cpu_s = steady_batches + built, steady_cpu_s + spent
            samples += data.get("samples", 0)
            for where, site, fn, n in data.get("counts", []):
                counts[(where, site, fn)] += n
            activity.update(data.get("where", {}))
        if not files or not (samples or batches):
            return {}
        total = sum(counts.values()) or 1
        sampled = sum(activity.values()) or 1
        return {
            "workers": len(files),
            "batches": batches,
            # past each worker's first batch (its imports and cold caches: a tiny batch's workers
            # took their first for the pace of every later one, docs/zoo.md "The fourth GPU run")
            "cpu_s_per_batch": steady_cpu_s / steady_batches if steady_batches else None,
            "cpu_s_per_batch_with_first": cpu_s / batches if batches else None,
            "by_activity": {k: v / sampled for k, v in activity.most_common()},
            "lines": [
                {"activity": where, "site": site, "function": fn, "code": source_line(site), "share": n / total}
                for (where, site, fn), n in counts.most_common(TOP)
            ],
        }
