"""Stage 3 of the pipeline: parse a torch.profiler (Kineto) Chrome trace into one ``Timeline``.

Contract: ``load_timeline(path) -> Timeline``. The JSON is read once and reduced, in one pass over
its events, to sorted sequences of ``(start_us, end_us, ...)`` tuples: exactly what the
breakdown needs and nothing else. Later stages never see the raw events. The long sequences
(kernels, launches, operators, event starts) are ``columns.Records``/``columns.Launches``: they
read as lists of tuples and a dict, and hold a fifth of the memory. A large trace's pieces are
decoded and folded by worker processes (``reader_workers``).

This module does not import torch: a trace can be analysed on a machine without it.

Why one module (about 1,300 lines): the reader is one pass, and its parts share one private
layout. The fold (``_Columns``: the loop over every event, by category), its hand-off to the
worker processes (``_fold_piece``, ``_folded``), the merge and the finish (sorting,
de-duplication, top-level operators) all read and write the same column lists, and the typed
readers of a malformed field (``_key``, ``_num``, ``_malformed``) are the fold's error paths.
Apart, each piece would import the others' private names; the byte-level reading that has a
contract of its own is ``tracefile.py`` already, the columns ``columns.py``, the array work
``vectorized.py``.
"""

from __future__ import annotations

import gc
import importlib
import json as _json
import math
import os
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import compress, islice
from operator import itemgetter
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple, cast

from diagnose.analysis.trace import columns as C
from diagnose.analysis.trace import forking
from diagnose.analysis.trace import patterns as P
from diagnose.analysis.trace import tracefile as memory
from diagnose.analysis.trace.forking import can_fork, threads_in_process  # noqa: F401 - threads_in_process: part of this module's interface
from diagnose.analysis.trace.tracefile import (
    UNSET,
    Event,
    EventArgs,
    Piece,
    SlotPiece,
    TraceStream,
    count_if_all_after,
    decode_events,
    decode_objects,
    event_from_object,
    json_size_estimate,
    read_span,
    step_marks,
)
from diagnose.errors import TraceError

_orjson: ModuleType | None
try:  # orjson parses Kineto's JSON 2-3x faster than the standard library; it is optional.
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only where orjson is missing
    _orjson = None

Interval = tuple[float, float]

#: No size limit by default: the trace is streamed, and what it needs is checked against the
#: memory the machine has (``tracefile.check_fits``, ``tracefile.MemoryGuard``). Kept for callers
#: that passed it; a number here still refuses larger JSON.
DEFAULT_MAX_TRACE_BYTES: int | None = None


class StepMark(NamedTuple):
    """One training step as the trace marks it (a ``ProfilerStep#N`` annotation)."""

    number: int
    start: float
    end: float


class GpuKernel(NamedTuple):
    start: float
    end: float
    correlation: int
    name: str
    stream: int


class GpuMemcpy(NamedTuple):
    start: float
    end: float
    correlation: int
    kind: str  # see patterns.memcpy_kind
    nbytes: int
    stream: int = 0


class GpuMemset(NamedTuple):
    start: float
    end: float
    correlation: int
    stream: int


class HostOp(NamedTuple):
    """A top-level operator on the main thread (not nested inside another operator)."""

    start: float
    end: float
    name: str


class SyncCall(NamedTuple):
    """A CUDA call on the main thread that blocks the host until the GPU caught up."""

    start: float
    end: float
    name: str


@dataclass
class TraceMeta:
    path: str = ""
    size_bytes: int = 0
    device_name: str | None = None
    device_memory_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    num_sms: int | None = None
    cuda_driver_version: int | None = None
    cuda_runtime_version: int | None = None
    unknown_categories: dict[str, int] = field(default_factory=dict)
    #: events of another accelerator (``patterns.OTHER_DEVICE_CATEGORIES``), by category:
    #: counted, not analysed
    other_device_events: dict[str, int] = field(default_factory=dict)
    event_count: int = 0
    # What the trace itself says about the loop (a bare trace has nothing else):
    #: optimizer classes the trace names (``Optimizer.step#Adam.step`` -> "Adam"), per step call
    optimizer_classes: dict[str, int] = field(default_factory=dict)
    #: per ``Optimizer.step`` call that recorded operators: the main thread's operators inside
    #: it (nested ones included), by name
    optimizer_step_ops: list[dict[str, int]] = field(default_factory=list)
    #: thread names the trace carries (``thread_name`` metadata), by thread id
    thread_names: dict[str, str] = field(default_factory=dict)
    #: events identical to another one (same category, name, thread and times), counted once
    duplicate_events: int = 0
    #: the process group the trace's ``distributedInfo`` names (torch.profiler writes it in a
    #: distributed run): this process's rank, the world's size and the backend; None elsewhere
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    #: a trace larger than one analysis takes (``DETAIL_MAX_JSON_BYTES``): its steps, the first
    #: ones analysed, and the events after them left out; None when the whole trace was read
    detail: DetailWindow | None = None
    #: ``diagnose trim`` wrote it (``TRIM_FORMAT_KEY``): 1 dropped the runtime calls that
    #: waited for the GPU, 2 keeps them; None for a trace as the profiler wrote it
    trim_format: int | None = None


@dataclass(frozen=True)
class DetailWindow:
    """The part of a large trace the analysis reads: its first ``steps_analysed`` of
    ``steps_in_trace`` steps, every event that starts before ``cut_us``."""

    steps_in_trace: int
    steps_analysed: int
    cut_us: float
    json_bytes: int
    events_left_out: int = 0

    def note(self) -> str:
        return (
            f"the trace holds {self.steps_in_trace} steps in {self.json_bytes / 1e9:.1f} GB of JSON, more than one analysis "
            f"reads ({DETAIL_MAX_JSON_BYTES / 1e9:.1f} GB): its first {self.steps_analysed} steps were analysed and "
            f"{self.events_left_out:,} later events left out (a trace of fewer steps is read whole: diagnose run --steps 3)"
        )


#: A CUDA runtime call (not a sync) longer than this waited for the GPU: an unblocked launch,
#: copy or memset call takes 3-15 µs profiled; one that finds the launch queue full takes as long
#: as the GPU needs to free a slot (50 µs to over a millisecond in a host-ahead window)
LONG_RUNTIME_CALL_US = 50.0


@dataclass
class Timeline:
    """Everything the breakdown reads from one trace, times in microseconds (trace clock)."""

    meta: TraceMeta
    main_tid: Any
    steps: list[StepMark]
    data_waits: list[Interval]
    optimizer_spans: list[Interval]
    backward_ops: Sequence[Interval]
    forward_ops: Sequence[Interval]
    host_ops: Sequence[HostOp]
    syncs: list[SyncCall]
    #: correlation id -> host interval of the runtime call that launched the GPU work
    launches: Mapping[Any, Interval]
    kernels: Sequence[GpuKernel]
    memcpys: list[GpuMemcpy]
    memsets: Sequence[Interval]
    #: CPU-side collectives in flight (gloo/MPI all-reduce ... annotations, any thread)
    collectives: list[Interval] = field(default_factory=list)
    #: the same collectives with their names (``gloo:all_gather`` ...), for the per-kind split
    #: of communication (``analysis.measure.collectives``)
    collective_ops: list[HostOp] = field(default_factory=list)
    #: the training threads' ``c10d::`` calls that issue collectives (FSDP issues its
    #: reduce-scatters from the autograd thread): they name a gloo collective's kind
    collective_calls: list[HostOp] = field(default_factory=list)
    #: DistributedDataParallel.forward ... on the main thread
    data_parallel_spans: list[Interval] = field(default_factory=list)
    #: closures that ``optimizer.step(closure)`` called (diagnose's own annotation), main thread
    closure_spans: list[Interval] = field(default_factory=list)
    #: host times of CUDA graph launches (torch.compile mode="reduce-overhead", CUDA graphs)
    graph_launches: list[float] = field(default_factory=list)
    #: user_annotation names other than the ones the analysis interprets (for display)
    annotations: Counter[str] = field(default_factory=Counter)
    #: ``ProfilerStep#N`` marks were found (otherwise ``steps`` holds one window over the trace)
    has_step_marks: bool = True
    #: DataLoader iterator kinds seen on the main thread ("single" process, "multi" process)
    dataloader_kinds: Counter[str] = field(default_factory=Counter)
    #: memsets with their launch's correlation id and stream (``memsets`` keeps the intervals)
    memset_ops: Sequence[GpuMemset] = field(default_factory=list)
    #: start times of every event the profiler recorded on the training threads (the main thread
    #: and the autograd engine's): operators and CUDA runtime calls. Each one cost the host the
    #: profiler's own bookkeeping (see analysis/measure/profcost.py).
    host_event_starts: Sequence[float] = field(default_factory=list)
    #: recorded lengths of the training threads' no-work operators (``patterns.NO_WORK_OPS``)
    no_work_op_us: list[float] = field(default_factory=list)
    #: the autograd engine's AccumulateGrad nodes on the training threads (start, end), in time
    #: order: host work of backward that stays outside a compiled graph
    accumulate_grad_ops: list[Interval] = field(default_factory=list)
    #: the training threads' CUDA runtime calls, syncs aside, that took over
    #: ``LONG_RUNTIME_CALL_US`` (start, end), in time order: a launch that waited for room in a
    #: full launch queue, a pinned allocation while pinned blocks are still in use by the GPU
    #: (back-pressure in a window whose host runs ahead; ``replay.host_ahead_scale`` reads them)
    long_runtime_calls: list[Interval] = field(default_factory=list)

    @property
    def has_gpu(self) -> bool:
        return bool(self.kernels or self.memcpys)

    def span(self) -> Interval:
        return (self.steps[0].start, self.steps[-1].end) if self.steps else (0.0, 0.0)


def read_trace_json(path: str | os.PathLike[str], max_bytes: int | None = None) -> dict[str, Any]:
    """Read a whole Chrome trace (``.json`` or ``.json.gz``) into a dict, with clear errors.
    It holds every event as a dict (6-8x the JSON's size): for small traces, tools and tests;
    the analysis streams with ``load_timeline``."""
    stream = _open(path, max_bytes)
    events: list[Any] = []
    with paused_gc():
        for objects in stream.decoded(decode_objects):
            events.extend(objects)
    data = dict(stream.metadata)
    data["traceEvents"] = events
    return data


def parse_trace_bytes(raw: bytes, origin: str = "<trace>") -> dict[str, Any]:
    """Parse a whole trace held in memory (tests, small traces)."""
    try:
        with paused_gc():
            data = _orjson.loads(raw) if _orjson is not None else _json.loads(raw)
    except ValueError as exc:
        raise TraceError(
            f"{origin} is not valid JSON ({str(exc).splitlines()[0]})",
            hint="the trace may be truncated: was the profiled process killed while writing it?",
        ) from exc
    if isinstance(data, list):  # a bare Chrome trace array
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{origin} is JSON but not a Chrome trace (no traceEvents list)")
    return data


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector. A parsed trace is millions of small objects, none of
    them garbage; with the collector on, every allocation burst re-scans all of them (this alone
    made the analysis 2-3x slower)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


#: below this many bytes of JSON one process reads the trace: the workers (forked: they start in
#: milliseconds) and the merge of their columns cost more than they save (on 2 cores: one
#: process read 10 MB in 0.18 s, two workers in 0.29 s; 60 MB in 0.55 vs 0.50 s; 200 MB in
#: 1.89 vs 1.47 s)
PARALLEL_MIN_JSON_BYTES = 64 * 1024 * 1024
#: most worker processes: each holds a piece or two and their decoded events (30-60 MiB). On a
#: 16-core host the 0.2 GB trace's read took 0.37-0.39 s with 8 workers, 0.26-0.31 with 12 and
#: 0.23-0.26 with 15: the parent, which cuts the pieces and merges the columns in order, keeps up
#: (multiprocessing.Pool's spinning thread had made 8 the most worth having)
MAX_READER_WORKERS = 16
#: pieces per worker under way while the reading process loads numpy (0.05-0.1 s with its
#: bytecode, 0.25-0.5 s without): a worker decodes and folds a 2 MB piece in 15-25 ms, so that 8
#: keep it busy; each piece folded and not yet merged holds its columns (about 0.3 MB). With two
#: pieces per worker, 8 workers on a 16-core host sat idle through the import (0.2-0.3 s there,
#: numpy without bytecode); with 8, the whole analysis of the 0.2 GB trace took 1.23-1.41 s
#: against 1.36-1.49 s (3 runs each, same host, numpy compiled, before forking.Workers)
IDLE_PIECES_PER_WORKER = 8
#: most pieces of a gzipped trace under way at once, each in a slot of shared memory
#: (``SLOT_BYTES``): 32 slots take at most 80 MiB, however many workers
MAX_GZIP_PIECES_UNDER_WAY = 32
#: a slot holds a piece: one block, and the end of an event cut off from the block before
SLOT_BYTES = memory.BLOCK_BYTES + 512 * 1024
#: environment variable that sets the number of worker processes (1: read in this process)
WORKERS_ENV = "DIAGNOSE_READER_WORKERS"


#: The most JSON one analysis reads in detail. A larger trace is analysed over its first steps
#: (as many as this share of the file holds, at least one; ``step_marks`` finds them by a scan
#: of the text): what the analysis holds stays bounded (about 0.7 GiB) however large the trace.
DETAIL_MAX_JSON_BYTES = 1_000_000_000


def detail_window(path: str | os.PathLike[str], json_bytes: int) -> DetailWindow | None:
    """The steps of a trace over ``DETAIL_MAX_JSON_BYTES`` (by ``json_bytes``, then by the exact
    length the scan for the step marks counts) that one analysis reads: as many of the first
    steps as the budget's share of the window's time holds (events spread over the steps about
    evenly), at least one. None for a smaller trace, or one without step marks."""
    if json_bytes <= DETAIL_MAX_JSON_BYTES:
        return None
    marks, json_bytes = step_marks(path)
    if len(marks) < 2 or json_bytes <= DETAIL_MAX_JSON_BYTES:
        return None
    first, last = marks[0][0], max(end for _, end in marks)
    target = first + (last - first) * DETAIL_MAX_JSON_BYTES / json_bytes
    kept = max(1, sum(1 for _, end in marks if end <= target))
    if kept >= len(marks):
        return None
    return DetailWindow(len(marks), kept, marks[kept - 1][1], json_bytes)


def reader_workers(json_bytes: int, cpus: int | None = None) -> int:
    """How many processes decode the pieces of a trace of ``json_bytes``: 1 (this process does
    everything) for a small trace or a machine of one core; else one per core but one (two on
    two cores: the parent, which cuts and merges, is idle half the time), at most
    ``MAX_READER_WORKERS``. ``DIAGNOSE_READER_WORKERS`` overrides it."""
    forced = os.environ.get(WORKERS_ENV, "").strip()
    if forced:
        try:
            return max(1, int(forced))
        except ValueError:
            raise TraceError(f"{WORKERS_ENV}={forced!r} is not a number of processes") from None
    if cpus is None:
        cpus = forking.cpus()
    if json_bytes < PARALLEL_MIN_JSON_BYTES or cpus <= 1:
        return 1
    return min(max(2, cpus - 1), MAX_READER_WORKERS)


def load_timeline(path: str | os.PathLike[str], max_bytes: int | None = None) -> Timeline:
    """Stream the trace into a Timeline: memory holds a few pieces of JSON (a few MB each) and
    what the Timeline keeps, never the parsed trace. ``max_bytes`` (None: no cap) refuses larger
    JSON; whatever the size, the read stops with a clear error if the machine's memory runs
    short. A large trace's pieces are decoded and folded into columns by worker processes
    (``reader_workers``); this process cuts the pieces and merges the columns, in file order."""
    json_bytes = json_size_estimate(Path(path)) if Path(path).is_file() else 0
    if json_bytes:  # (before the scan for a detail window, which reads the whole file)
        memory.check_size(Path(path), json_bytes, max_bytes)
    window = detail_window(path, json_bytes)
    stream = _open(path, max_bytes, DETAIL_MAX_JSON_BYTES if window else None, window.json_bytes if window else None)
    cut = window.cut_us if window else math.inf
    columns = _Columns(cut)
    guard = memory.MemoryGuard(str(path))
    workers = reader_workers(json_bytes)
    decode = decode_events if window is None else partial(_decode_before, cut=cut)
    # A gzipped trace's text goes to the workers through memory shared before they are forked
    # (a plain file's pieces they read themselves): slots for every piece that may be under way
    most = MAX_GZIP_PIECES_UNDER_WAY if stream.gzipped else math.inf
    slots = (
        forking.SharedSlots(int(min(IDLE_PIECES_PER_WORKER * workers, most)) + 1, SLOT_BYTES)
        if stream.gzipped and workers > 1 and can_fork()
        else None
    )
    with (
        paused_gc(),
        closing(slots) if slots is not None else nullcontext(),
        _worker_pool(workers, partial(_fold_piece, slots=slots)) as pool,
    ):
        if pool is None:
            results = stream.decoded(decode)
        else:

            def submit(piece: Piece) -> Callable[[], Any]:
                # the worker reads the piece itself: only its place crosses the pipe
                if type(piece) is SlotPiece:
                    return partial(
                        _folded, partial(_from_slot, piece, pool.submit((piece.slot, piece.length), cut)), piece
                    )
                if not stream.gzipped:
                    return partial(_folded, pool.submit((str(stream.path), piece.offset, piece.length), cut), piece)
                return partial(
                    _folded, forking.nothing, piece
                )  # no slot was free, or an event of megabytes: folded here

            # numpy (for the finish) loads while the workers decode the first pieces: 0.1-0.3 s
            # that the finish would otherwise wait for, once the workers are forked without it.
            # The workers get enough pieces meanwhile to stay busy
            results = stream.decoded(
                decode,
                submit,
                in_flight=int(min(2 * len(pool), most)),
                idle=partial(importlib.import_module, "diagnose.analysis.trace.vectorized"),
                idle_in_flight=int(min(IDLE_PIECES_PER_WORKER * len(pool), most)),
                slots=slots,
            )
        with closing(results):  # whatever ends the loop ends the read (a gzipped trace's thread with it)
            for result in results:
                if type(result) is _Columns:
                    columns.merge(result)
                elif type(result) is int:  # a piece wholly after the detail window
                    columns.skipped(result)
                else:
                    columns.add(result)
                guard.check(stream.bytes_read)
    with paused_gc():
        timeline = columns.finish(_read_meta(stream.metadata))
    timeline.meta.path = str(path)
    timeline.meta.size_bytes = Path(path).stat().st_size
    if window is not None:
        timeline.meta.detail = replace(window, events_left_out=columns.left_out)
    return timeline


def _from_slot(piece: SlotPiece, result: Callable[[], Any]) -> Any:
    """A worker's result for a piece in a slot, which is free again once the answer is in; the
    text is kept where this process needs it (no answer, or text that did not parse)."""
    answered = False
    try:
        value = result()
        answered = value is not None
        return value
    finally:
        piece.done(keep=not answered)


@contextmanager
def _worker_pool(workers: int, call: Callable[..., Any]) -> Iterator[forking.Workers | None]:
    """``workers`` forked processes that fold pieces (None for one, where ``fork`` does not exist,
    or where this process may not fork: ``forking.can_fork``).
    Forked, not spawned: a spawned worker imports the caller's ``__main__`` again, which in a
    script without a ``__main__`` guard starts the analysis again, forever; and it starts in a
    fraction of the time. The workers run only the decoder and ``_Columns.add``, which take no
    lock that another thread of the parent could hold."""
    if workers <= 1 or not can_fork():
        yield None
        return
    pool = forking.Workers(call, workers)
    try:
        yield pool if len(pool) else None
    finally:
        pool.close()


def _decode_before(piece: Piece, cut: float) -> list[Event] | int:
    """The piece's events, or how many there are when all start after ``cut`` (then skipped)."""
    count = count_if_all_after(piece, cut)
    return decode_events(piece) if count is None else count


def _fold_piece(
    text: bytes | tuple[str, int, int] | tuple[int, int],
    cut: float = math.inf,
    slots: forking.SharedSlots | None = None,
) -> _Columns | None:
    """In a worker: one piece decoded and folded into columns. ``text`` is the piece's JSON, or
    where it lies: in a plain file (path, offset, length), or in a slot of ``slots`` (slot,
    length). Read here, it need not be sent through the pool's pipe (at 1 GB that copy took a
    third of the parent's time). None when an event's
    field is malformed: the parent then folds the piece itself, to name the event by its index in
    the whole trace. Text that does not parse raises the decoder's error, as ``decode_events`` does."""
    if isinstance(text, tuple) and len(text) == 2:
        assert slots is not None
        text = slots.read_once(*text)
    elif isinstance(text, tuple):
        path, offset, length = text
        text = read_span(path, offset, length)
        if len(text) != length:  # the file changed under the reader: the parent reads what it holds
            return None
    with paused_gc():
        piece = Piece(text, b"", 0)
        columns = _Columns(cut)
        count = count_if_all_after(piece, cut) if cut != math.inf else None
        if count is not None:
            columns.skipped(count)
            return columns
        events = decode_events(piece)
        try:
            columns.add(events)
        except TraceError:
            return None
        columns.names = {}  # interned again by the parent: no need to send them twice
        return columns


def _folded(result: Callable[[], _Columns | None], piece: Piece) -> _Columns | list[Event]:
    """The result of ``_fold_piece``: its columns, or the piece's events to fold here (a
    malformed field, or a worker that did not deliver)."""
    columns = result()
    return columns if columns is not None else decode_events(piece)


def _open(
    path: str | os.PathLike[str], max_bytes: int | None, read_bytes: int | None = None, json_bytes: int | None = None
) -> TraceStream:
    """The trace's stream, once its size (``json_bytes`` where known, else estimated) passed
    ``max_bytes`` and the memory check (on the JSON the analysis holds: ``read_bytes`` of it when
    a detail window cuts it short)."""
    stream = TraceStream(path, max_bytes)
    if json_bytes is None:
        json_bytes = json_size_estimate(stream.path)
    memory.check_size(stream.path, json_bytes, max_bytes)
    memory.check_fits(stream.path, min(json_bytes, read_bytes) if read_bytes else json_bytes)
    return stream


def build_timeline(data: dict[str, Any]) -> Timeline:
    """Reduce a parsed trace (a dict, as ``read_trace_json`` returns) to a Timeline, exactly as
    ``load_timeline`` reduces the file."""
    events = data["traceEvents"]
    columns = _Columns()
    columns.add([e for e in map(event_from_object, events) if e is not None])
    columns.event_count = len(events)
    return columns.finish(_read_meta(data))


# what each category is to the reader (one dict lookup per event)
# (the last three, which the hot loop tests at once with ``kind >= _FLOW``, come last; the two
# kinds of operator first, tested at once with ``kind <= _LEGACY_OP``)
_CPU_OP, _LEGACY_OP, _ANNOTATION, _RUNTIME, _KERNEL, _MEMCPY, _MEMSET, _FLOW, _IGNORED, _UNKNOWN, _OTHER_DEVICE = range(
    11
)


def _category_kinds() -> dict[Any, int]:
    kinds: dict[Any, int] = {
        "cpu_op": _CPU_OP,
        "kernel": _KERNEL,
        "cuda_runtime": _RUNTIME,
        "cuda_driver": _RUNTIME,
        "user_annotation": _ANNOTATION,
        "gpu_memcpy": _MEMCPY,
        "gpu_memset": _MEMSET,
        "fwdbwd": _FLOW,
    }
    for cat in P.KNOWN_CATEGORIES:
        kinds.setdefault(cat, _IGNORED)
    kinds[None] = _IGNORED
    kinds[UNSET] = _IGNORED
    for cat, mapped in P.LEGACY_CATEGORIES.items():
        kinds.setdefault(cat, kinds.get(mapped, _IGNORED))
    for cat in P.LEGACY_HOST_CATEGORIES:
        kinds[cat] = _LEGACY_OP
    for cat in P.OTHER_DEVICE_CATEGORIES:
        kinds[cat] = _OTHER_DEVICE
    return kinds


_KINDS = _category_kinds()


class _ThreadOps:
    """One thread's operators as columns, in file order. The rare operator whose trace ``ts``
    is not a plain number (kept as written, to match the flow events that name it) or that is
    not a complete ("X") event is noted by index."""

    __slots__ = ("starts", "ends", "names", "raw_ts", "incomplete")

    def __init__(self) -> None:
        self.starts = C.float_column()
        self.ends = C.float_column()
        self.names: list[str] = []
        self.raw_ts: dict[int, Any] = {}
        self.incomplete: set[int] = set()

    def extend(self, ops: list[tuple[float, float, str]], raw_ts: list[tuple[int, Any]], incomplete: list[int]) -> None:
        base = len(self.names)
        starts, ends, names = zip(*ops, strict=True)
        self.starts.extend(starts)
        self.ends.extend(ends)
        self.names.extend(names)
        for index, raw in raw_ts:
            self.raw_ts[base + index] = raw
        self.incomplete.update(base + index for index in incomplete)

    def raw(self, index: int) -> Any:
        """The trace's own ``ts`` of an operator (None where it had none)."""
        return self.raw_ts.get(index, self.starts[index])


class _FlowStarts:
    """The trace ``ts`` of one thread's flow starts (``fwdbwd`` "s" events): numbers as a float
    column, anything else (a string, a missing ts) in a set."""

    __slots__ = ("numbers", "others")

    def __init__(self) -> None:
        self.numbers = C.float_column()
        self.others: set[Any] = set()

    def add(self, raw: Any) -> None:
        if type(raw) is float or (type(raw) is int and float(raw) == raw):
            self.numbers.append(raw)
        else:
            self.others.add(raw)


class _Columns:
    """What one pass over the events keeps, in file order, before the main thread and the main
    device are known: per thread, the operators (only the main thread's are kept in the end);
    kernels and copies with their device. A piece's events are folded into Python lists (the
    hot loop appends tuples), then moved into compact columns (``analysis/trace/columns.py``) before
    the next piece: what memory holds grows by about 40 bytes per kernel, launch or operator,
    not by the 150-200 of a tuple of Python numbers. Names are interned: a kernel name repeats
    thousands of times and is then held once."""

    def __init__(self, cut: float = math.inf) -> None:
        #: events that start at or after this time (µs) are left out (a detail window)
        self.cut = cut
        self.left_out = 0
        self.event_count = 0
        self.annotations: list[tuple[str, Any, float, float]] = []
        self.thread_ops: dict[Any, _ThreadOps] = {}
        self.busy: Counter[Any] = Counter()  # non-backward operators per thread
        self.backward: list[C.Column] = [C.float_column(), C.float_column()]
        self.flow_starts: dict[Any, _FlowStarts] = {}
        #: every CUDA runtime/driver call with a correlation id, in file order
        self.launch_columns: list[C.Column] = [C.int_column(), C.float_column(), C.float_column()]
        self.sync_calls: list[tuple[Any, float, float, str]] = []
        #: (tid, start, end) of runtime calls other than syncs that took over ``LONG_RUNTIME_CALL_US``
        self.long_calls: list[tuple[Any, float, float]] = []
        self.graph_launches: list[float] = []
        #: (start, end, correlation, name, stream) and device of each kernel
        self.kernels: list[C.Column] = [C.float_column(), C.float_column(), C.int_column(), [], C.int_column()]
        self.kernel_devices: list[Any] = []
        self.memcpys: list[GpuMemcpy] = []  # a few per step: kept as tuples
        self.memcpy_devices: list[Any] = []
        #: (start, end, correlation, stream) and device of each memset
        self.memsets: list[C.Column] = [C.float_column(), C.float_column(), C.int_column(), C.int_column()]
        self.memset_devices: list[Any] = []
        self.unknown: Counter[str] = Counter()
        self.other_device: Counter[str] = Counter()
        self.names: dict[str, str] = {}
        #: start of every CUDA runtime/driver call, per thread
        self.runtime_starts: dict[Any, array[float]] = {}
        self.thread_names: dict[Any, str] = {}

    def skipped(self, count: int) -> None:
        """A piece of ``count`` events, all after the detail window: counted, not read."""
        self.event_count += count
        self.left_out += count

    def add(self, events: list[Event]) -> None:
        """Fold a piece's events in. The hot loop: one lookup, a few type checks (the common
        case inline; anything else goes to the checking helpers) and an append per event."""
        kind_of = _KINDS.get
        names = self.names
        bw_prefix = P.BACKWARD_OP_PREFIX
        legacy_annotations = P.LEGACY_ANNOTATION_PREFIXES
        sync_names = P.SYNC_CALLS
        long_call = LONG_RUNTIME_CALL_US
        thread_ops: dict[Any, list[tuple[float, float, str]]] = {}
        raw_ts: dict[Any, list[tuple[int, Any]]] = {}  # tid -> (index in the piece, trace ts) where it is not a float
        incomplete: dict[Any, list[int]] = {}
        busy = self.busy
        backward: list[Interval] = []
        backward_append = backward.append
        launches: list[tuple[Any, float, float]] = []
        launches_append = launches.append
        runtime_starts: dict[Any, list[float]] = {}
        kernels: list[tuple[float, float, Any, str, Any]] = []  # rows of the kernel columns, as GpuKernel's fields
        kernels_append, kernel_devices_append = kernels.append, self.kernel_devices.append
        memsets: list[tuple[float, float, Any, Any]] = []  # as GpuMemset's fields
        first = self.event_count
        self.event_count += len(events)
        cut, left_out = self.cut, 0
        windowed = cut != math.inf
        for e in events:
            if windowed and type(e.ts) is float and e.ts >= cut:  # after a detail window: skipped before any work
                left_out += 1
                continue
            try:
                kind = kind_of(e.cat, _UNKNOWN)
            except TypeError:  # an unhashable category
                continue
            if kind >= _FLOW:  # flows, metadata and the categories not read: one test for the three
                if kind == _IGNORED:
                    if (
                        e.ph == "M"
                        and e.name == "thread_name"
                        and type(e.args) is EventArgs
                        and isinstance(e.args.name, str)
                    ):
                        self.thread_names[_key(e.tid, e, events, first, "tid")] = e.args.name
                elif kind == _UNKNOWN:
                    self.unknown[str(e.cat)] += 1
                elif kind == _OTHER_DEVICE:
                    self.other_device[e.cat] += 1
                elif e.ph == "s":  # a forward flow's start (one per forward operator): inline where plain
                    tid = e.tid
                    if type(tid) is not int:
                        tid = _key(tid, e, events, first, "tid")
                    flows = self.flow_starts.get(tid)
                    if flows is None:
                        flows = self.flow_starts[tid] = _FlowStarts()
                    if type(e.ts) is float:
                        flows.numbers.append(e.ts)
                    else:
                        flows.add(_raw(e.ts))
                continue
            name = e.name
            if type(name) is not str:
                name = _text(name, e, events, first)
            name = names.setdefault(name, name)
            ts = e.ts
            plain_ts = type(ts) is float and ts - ts == 0.0  # a finite float: inf - inf is nan
            if not plain_ts:
                ts = _num(ts, e, events, first, "ts")
            if ts >= cut:
                left_out += 1
                continue
            dur = e.dur
            if type(dur) is not float or dur - dur != 0.0 or dur < 0.0:
                dur = _num(dur, e, events, first, "dur", minimum=0.0)
            end = ts + dur
            if kind <= _LEGACY_OP:
                if kind and name.startswith(legacy_annotations):  # torch < 1.10 wrote annotations as operators
                    self.annotations.append((name, _key(e.tid, e, events, first, "tid"), ts, end))
                    continue
                tid = e.tid
                if type(tid) is not int:
                    tid = _key(tid, e, events, first, "tid")
                if name.startswith(bw_prefix):
                    backward_append((ts, end))
                else:
                    busy[tid] += 1
                ops = thread_ops.get(tid)
                if ops is None:
                    ops = thread_ops[tid] = []
                if not plain_ts:
                    raw = _raw(e.ts)
                    if not (type(raw) is int and float(raw) == raw):
                        raw_ts.setdefault(tid, []).append((len(ops), raw))
                ph = e.ph
                if not (ph is UNSET or ph == "X"):
                    incomplete.setdefault(tid, []).append(len(ops))
                ops.append((ts, end, name))
                continue
            if kind == _ANNOTATION:
                self.annotations.append((name, _key(e.tid, e, events, first, "tid"), ts, end))
                continue
            args = e.args
            if type(args) is not EventArgs:
                args = _args(args, e, events, first)
            corr = args.correlation
            if type(corr) is not int:
                corr = _key(corr, e, events, first, "args.correlation")
            if kind == _RUNTIME:
                tid = e.tid
                if type(tid) is not int and tid is not UNSET:
                    tid = _key(tid, e, events, first, "tid")
                starts = runtime_starts.get(tid)
                if starts is None:
                    starts = runtime_starts[tid] = []
                starts.append(ts)
                if corr is not None:
                    launches_append((corr, ts, end))
                if name in sync_names:
                    self.sync_calls.append((_key(e.tid, e, events, first, "tid"), ts, end, name))
                    continue
                if end - ts > long_call:
                    self.long_calls.append((tid, ts, end))
                if name == "cudaGraphLaunch" or name == "cuGraphLaunch":
                    self.graph_launches.append(ts)
                continue
            if args.correlation is UNSET:
                corr = -1
            device = args.device
            if type(device) is not int and device is not UNSET:
                device = _key(device, e, events, first, "args.device")
            stream = args.stream
            if type(stream) is not int:
                stream = 0 if stream is UNSET else _key(stream, e, events, first, "args.stream")
            if kind == _KERNEL:
                kernels_append((ts, end, corr, name, stream))
                kernel_devices_append(device)
            elif kind == _MEMCPY:
                nbytes = args.bytes
                nbytes = int(_num(None if nbytes is UNSET else nbytes, e, events, first, "args.bytes"))
                self.memcpys.append(GpuMemcpy(ts, end, corr, P.memcpy_kind(name), nbytes, stream))
                self.memcpy_devices.append(device)
            else:  # _MEMSET
                memsets.append((ts, end, corr, stream))
                self.memset_devices.append(device)
        self.left_out += left_out
        # into the columns
        for tid, ops in thread_ops.items():
            columns = self.thread_ops.get(tid)
            if columns is None:
                columns = self.thread_ops[tid] = _ThreadOps()
            columns.extend(ops, raw_ts.get(tid, []), incomplete.get(tid, []))
        _extend(self.backward, backward)
        _extend(self.launch_columns, launches)
        for tid, piece_starts in runtime_starts.items():
            self.runtime_starts.setdefault(tid, C.float_column()).extend(piece_starts)
        _extend(self.kernels, kernels)
        _extend(self.memsets, memsets)

    def merge(self, other: _Columns) -> None:
        """Fold in the columns of the next piece, folded by ``add`` in a worker process (as if
        ``add`` had been called here): names are interned again, thread-local indices shifted."""
        names = self.names
        intern = names.setdefault
        self.event_count += other.event_count
        self.left_out += other.left_out
        self.annotations.extend((intern(n, n), tid, ts, end) for n, tid, ts, end in other.annotations)
        for tid, ops in other.thread_ops.items():
            mine = self.thread_ops.get(tid)
            if mine is None:
                mine = self.thread_ops[tid] = _ThreadOps()
            base = len(mine.names)
            mine.starts.extend(ops.starts)
            mine.ends.extend(ops.ends)
            mine.names.extend(map(intern, ops.names, ops.names))
            for index, raw in ops.raw_ts.items():
                mine.raw_ts[base + index] = raw
            mine.incomplete.update(base + index for index in ops.incomplete)
        self.busy.update(other.busy)
        _extend_columns(self.backward, other.backward)
        for tid, flows in other.flow_starts.items():
            mine_flows = self.flow_starts.setdefault(tid, _FlowStarts())
            mine_flows.numbers.extend(flows.numbers)
            mine_flows.others.update(flows.others)
        _extend_columns(self.launch_columns, other.launch_columns)
        self.sync_calls.extend((tid, ts, end, intern(n, n)) for tid, ts, end, n in other.sync_calls)
        self.long_calls.extend(other.long_calls)
        self.graph_launches.extend(other.graph_launches)
        kernel_names = other.kernels[3]
        _extend_columns(
            self.kernels, [*other.kernels[:3], list(map(intern, kernel_names, kernel_names)), other.kernels[4]]
        )
        self.kernel_devices.extend(other.kernel_devices)
        self.memcpys.extend(other.memcpys)
        self.memcpy_devices.extend(other.memcpy_devices)
        _extend_columns(self.memsets, other.memsets)
        self.memset_devices.extend(other.memset_devices)
        self.unknown.update(other.unknown)
        self.other_device.update(other.other_device)
        for tid, starts in other.runtime_starts.items():
            self.runtime_starts.setdefault(tid, C.float_column()).extend(starts)
        self.thread_names.update(other.thread_names)

    def finish(self, meta: TraceMeta) -> Timeline:
        meta.event_count = self.event_count
        meta.unknown_categories = dict(self.unknown)
        meta.other_device_events = dict(self.other_device)
        duplicates = _Duplicates()
        self.annotations = duplicates.unique(sorted(self.annotations, key=itemgetter(2)), start=itemgetter(2))
        main_tid = self._main_thread()
        read = _read_annotations(self.annotations, main_tid)
        steps = read.steps

        main_ops = self._main_ops(main_tid, duplicates)
        starts, ends, names, forward = main_ops.columns
        # a framework's backward call (marked) is backward from end to end, around the engine's events
        _extend(self.backward, read.backward_marks)
        backward_ops = _sorted_unique(tuple, self.backward, duplicates, by=(0, 1))
        bw_prefix = P.BACKWARD_OP_PREFIX
        # each name is tested once per thread (a thread repeats a few thousand names many times)
        distinct = {tid: set(ops.names) for tid, ops in self.thread_ops.items()}
        training = {main_tid} | {
            tid for tid, names_of in distinct.items() if any(n.startswith(bw_prefix) for n in names_of)
        }
        event_starts = C.float_column()
        # a trace written or merged twice (duplicates found above) counts each event once: the
        # profiler's cost per event (profcost) is charged per event the profiler really recorded
        once = _unique_events if duplicates.dropped else lambda starts, ends=None: starts
        for tid in training:
            if tid in self.thread_ops:
                event_starts.extend(once(self.thread_ops[tid].starts, self.thread_ops[tid].ends))
            if tid in self.runtime_starts:
                event_starts.extend(once(self.runtime_starts[tid]))
        host_event_starts: C.Records[float] = C.Records(None, [_sorted_floats(event_starts)])
        del event_starts
        # a duplicated event would count its wait twice: each (start, end) once
        long_runtime_calls = sorted({(ts, end) for tid, ts, end in self.long_calls if tid in training})

        no_work_op_us, accumulate_grad_ops, collective_calls = self._training_ops(training, distinct)
        self.thread_ops.clear()
        self.runtime_starts.clear()
        meta.optimizer_classes = dict(read.optimizer_classes)
        meta.optimizer_step_ops = [dict(c) for c in _ops_inside(main_ops, read.optimizer_steps)]
        meta.thread_names = {str(tid): name for tid, name in self.thread_names.items()}

        outermost = _outermost(starts, ends)
        host_ops: C.Records[HostOp] = C.Records(HostOp, [C.take(c, outermost) for c in (starts, ends, names)])
        is_forward = list(compress(range(len(forward)), forward))
        forward_ops: C.Records[Interval] = C.Records(tuple, [C.take(starts, is_forward), C.take(ends, is_forward)])

        syncs = [SyncCall(ts, end, name) for tid, ts, end, name in self.sync_calls if tid == main_tid]
        syncs.sort(key=lambda s: s.start)
        syncs = duplicates.unique(syncs)

        device_counts: Counter[Any] = Counter()
        for d, n in Counter(self.kernel_devices).items():  # counted in C, then "no device" as None
            device_counts[None if d is UNSET else d] += n
        device = device_counts.most_common(1)[0][0] if device_counts else None
        kernels = _sorted_unique(GpuKernel, _on_device(self.kernels, self.kernel_devices, device), duplicates)
        memcpys = [m for m, d in zip(self.memcpys, self.memcpy_devices, strict=True) if d is UNSET or d == device]
        memcpys.sort(key=lambda m: m.start)
        memcpys = duplicates.unique(memcpys)
        # each memset is in memset_ops too: its duplicates are counted there
        memsets = _sorted_unique(tuple, self.memsets[:2], _Duplicates(), by=(0, 1))
        memset_ops = _sorted_unique(GpuMemset, _on_device(self.memsets, self.memset_devices, device), duplicates)
        meta.duplicate_events = duplicates.dropped
        launches = C.Launches.from_calls(*self.launch_columns)  # type: ignore[arg-type]  # (ids, starts, ends): an int column, two float ones

        has_marks = bool(steps)
        if not steps:
            steps = _whole_window(main_ops, kernels, memcpys)

        return Timeline(
            meta=meta,
            main_tid=main_tid,
            steps=steps,
            data_waits=read.data_waits,
            optimizer_spans=read.optimizer_spans,
            backward_ops=backward_ops,
            forward_ops=forward_ops,
            host_ops=host_ops,
            syncs=syncs,
            launches=launches,
            graph_launches=sorted(self.graph_launches),
            collectives=read.collectives,
            collective_ops=read.collective_ops,
            collective_calls=collective_calls,
            data_parallel_spans=read.data_parallel,
            closure_spans=read.closures,
            kernels=kernels,
            memcpys=memcpys,
            memsets=memsets,
            annotations=read.other,
            has_step_marks=has_marks,
            dataloader_kinds=read.loader_kinds,
            memset_ops=memset_ops,
            host_event_starts=host_event_starts,
            no_work_op_us=no_work_op_us,
            accumulate_grad_ops=accumulate_grad_ops,
            long_runtime_calls=long_runtime_calls,
        )

    def _training_ops(
        self, training: set[Any], distinct: dict[Any, set[str]]
    ) -> tuple[list[float], list[Interval], list[HostOp]]:
        """Of the training threads' operators: the durations of those that do no work (views),
        the spans of the AccumulateGrad nodes and the collective calls (both sorted, each once).
        One scan of each thread's names, in C (``compress``, ``map``: a few hundred thousand a
        thread), finds the three kinds; only their names are tested one by one."""
        from diagnose.analysis.trace.vectorized import floats, np

        no_work_op_us: list[float] = []
        accumulate_grad: set[Interval] = set()
        collectives: set[HostOp] = set()
        for tid in training:
            ops = self.thread_ops.get(tid)
            kinds = {n: _op_kind(n) for n in distinct.get(tid, ())}
            wanted = {n: kind for n, kind in kinds.items() if kind}
            if ops is None or not wanted:
                continue
            names = ops.names
            found = list(compress(range(len(names)), map(wanted.__contains__, names)))
            found_kinds = list(map(wanted.__getitem__, map(names.__getitem__, found)))
            starts, ends = floats(ops.starts), floats(ops.ends)
            for kind in set(found_kinds):
                at = np.fromiter(compress(found, map(kind.__eq__, found_kinds)), dtype=np.intp)
                if kind == _NO_WORK:
                    no_work_op_us.extend((ends[at] - starts[at]).tolist())
                elif kind == _ACCUMULATE_GRAD:
                    accumulate_grad.update(zip(starts[at].tolist(), ends[at].tolist(), strict=True))
                else:
                    collectives.update(
                        map(HostOp, starts[at].tolist(), ends[at].tolist(), map(names.__getitem__, at.tolist()))
                    )
        return no_work_op_us, sorted(accumulate_grad), sorted(collectives)

    def _main_ops(self, main_tid: Any, duplicates: _Duplicates) -> C.Records[tuple[float, float, str, bool]]:
        """The main thread's complete operators as (start, end, name, starts a forward flow),
        sorted by start and outermost first, duplicates dropped."""
        ops = self.thread_ops.get(main_tid)
        if ops is None:
            return C.Records(tuple, (C.float_column(), C.float_column(), [], []))
        flows = self.flow_starts.get(main_tid, _FlowStarts())
        from diagnose.analysis.trace import vectorized

        forward = vectorized.members(ops.starts, flows.numbers)
        for i, raw in ops.raw_ts.items():  # a ts written as something else matches a flow written the same
            forward[i] = raw in flows.others
        columns: tuple[C.Column, ...] = (ops.starts, ops.ends, ops.names, forward)
        if ops.incomplete:
            complete = [i for i in range(len(ops.names)) if i not in ops.incomplete]
            columns = tuple(C.take(c, complete) for c in columns)
        return _sorted_unique(tuple, columns, duplicates, by=(0, -1))

    def _main_thread(self) -> Any:
        """The thread that runs the training loop: the one with ProfilerStep marks, else the busiest."""
        step_threads = Counter(tid for name, tid, _, _ in self.annotations if name.startswith(P.PROFILER_STEP_PREFIX))
        if step_threads:
            return step_threads.most_common(1)[0][0]
        busy = Counter(self.busy)
        for _, tid, _, _ in self.annotations:
            busy[tid] += 1
        return busy.most_common(1)[0][0] if busy else None


_NO_WORK, _ACCUMULATE_GRAD, _COLLECTIVE = 1, 2, 3


def _op_kind(name: str) -> int:
    """What ``_training_ops`` keeps of an operator of this name (0: nothing); the three are disjoint."""
    if name in P.NO_WORK_OPS:
        return _NO_WORK
    if name == P.ACCUMULATE_GRAD_OP:
        return _ACCUMULATE_GRAD
    return _COLLECTIVE if name.startswith(P.COLLECTIVE_CALL_PREFIX) else 0


def _extend(columns: list[C.Column], rows: list[tuple[Any, ...]]) -> None:
    """Append a piece's rows (tuples of ``len(columns)`` fields) to the columns, in place; an
    int column that meets a value other than a machine integer is replaced by a list."""
    if not rows:
        return
    for k, values in enumerate(zip(*rows, strict=True)):
        column = columns[k]
        if isinstance(column, array) and column.typecode == "q":
            columns[k] = C.extend_ints(cast("array[int]", column), values)
        else:
            column.extend(values)


def _extend_columns(columns: list[C.Column], more: list[C.Column]) -> None:
    """Append ``more`` (columns of the same fields) to ``columns``, in place."""
    for k, values in enumerate(more):
        column = columns[k]
        if isinstance(column, array) and column.typecode == "q":
            columns[k] = C.extend_ints(cast("array[int]", column), values)
        else:
            column.extend(values)  # type: ignore[arg-type]  # more[k] holds columns[k]'s field: the same type


def _unique_events(starts: array[float], ends: array[float] | None = None) -> array[float]:
    """The starts of one thread's events, each (start, end) once: a duplicated event's copy
    left out."""
    from diagnose.analysis.trace import vectorized

    np = vectorized.np
    columns = [vectorized.floats(starts)] + ([vectorized.floats(ends)] if ends is not None else [])
    rows = np.unique(np.stack(columns, axis=1), axis=0)
    out = C.float_column()
    out.frombytes(np.ascontiguousarray(rows[:, 0]).tobytes())
    return out


def _sorted_floats(values: array[float]) -> array[float]:
    """The float column sorted, ascending (numpy's stable sort: the order ``sorted`` gives, in a
    tenth of the time on the half million event starts of a large trace)."""
    from diagnose.analysis.trace import vectorized

    out = C.float_column()
    if len(values):
        out.frombytes(vectorized.np.sort(vectorized.floats(values), kind="stable").tobytes())
    return out


def _outermost(starts: C.Column, ends: C.Column) -> Iterable[int]:
    """The indices of the operators (sorted by start, outermost first) that no earlier operator
    holds: each that starts at or after the end of the last one kept (nested operators stay
    inside their top-level parent). Vectorised where that gives the same (``vectorized.outermost``)."""
    from diagnose.analysis.trace import vectorized

    kept = vectorized.outermost(starts, ends)
    if kept is not None:
        return kept  # indices as an array, which C.take reorders by directly
    out: list[int] = []
    top_end = float("-inf")
    for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
        if start >= top_end:
            out.append(i)
            top_end = end
    return out


def _on_device(columns: list[C.Column], devices: list[Any], device: Any) -> list[C.Column]:
    """The rows on ``device``, and those that name none (they count for every device)."""
    if all(d is UNSET or d == device for d in set(devices)):
        return columns
    keep = [i for i, d in enumerate(devices) if d is UNSET or d == device]
    return [C.take(c, keep) for c in columns]


def _sorted_unique(
    make: Any, columns: list[C.Column] | tuple[C.Column, ...], duplicates: _Duplicates, by: tuple[int, ...] = (0,)
) -> C.Records[Any]:
    """The rows as ``Records`` of ``make``, sorted (stably) by ``by`` (column k ascending for each k of ``by``, column -k descending), rows
    identical to an earlier one with the same start dropped and counted. Traces are mostly in
    order already: checking that is one pass in C, and the sort is skipped."""
    from diagnose.analysis.trace import vectorized

    columns = list(columns)
    order = vectorized.sort_order([columns[abs(k)] for k in by], [k < 0 for k in by])
    if order is not None:
        columns = [C.take(c, order) for c in columns]
    keep = duplicates.unique_rows(columns)
    if keep is not None:
        columns = [C.take(c, keep) for c in columns]
    return C.Records(make, columns)


def _ops_inside(main_ops: C.Records[tuple[float, float, str, bool]], spans: list[Interval]) -> list[Counter[str]]:
    """Per span (sorted), the names of the operators (sorted by start) that start inside it;
    spans with none (cut off by the profiled window) are left out."""
    out: list[Counter[str]] = []
    starts, names_of = main_ops.column(0), cast("list[str]", main_ops.column(2))  # names: an object column
    for start, end in spans:
        first, last = bisect_left(starts, start), bisect_left(starts, end)
        if last > first:
            out.append(Counter(islice(names_of, first, last)))
    return out


class _Duplicates:
    """Drops events identical to another one (a trace merged or written twice would otherwise
    count every operator and kernel twice), and counts them. Items come sorted by start, so
    that copies sit in the same run of equal starts; within a run they are compared whole."""

    def __init__(self) -> None:
        self.dropped = 0

    def unique(self, items: list[Any], start: Callable[[Any], Any] = itemgetter(0)) -> list[Any]:
        out: list[Any] = []
        run: list[Any] = []  # the items kept so far with the current start
        run_start: Any = object()
        for item in items:
            item_start = start(item)
            if item_start != run_start:
                run_start, run = item_start, [item]
                out.append(item)
            elif item in run:
                self.dropped += 1
            else:
                run.append(item)
                out.append(item)
        return out

    def unique_rows(self, columns: list[C.Column]) -> list[int] | None:
        """``unique`` over rows held as columns (the first one the start): the indices of the rows
        kept, None when none is dropped. Only runs of equal starts are looked at row by row."""
        from diagnose.analysis.trace import vectorized

        equal = vectorized.repeats(columns[0])  # i: start i == start i-1
        if not equal:
            return None
        dropped: set[int] = set()
        run: list[tuple[Any, ...]] = []
        previous = -2
        for i in equal:
            if i != previous + 1:  # a new run, from i - 1
                run = [tuple(c[i - 1] for c in columns)]
            row = tuple(c[i] for c in columns)
            if row in run:
                dropped.add(i)
            else:
                run.append(row)
            previous = i
        if not dropped:
            return None
        self.dropped += len(dropped)
        return [i for i in range(len(columns[0])) if i not in dropped]


def _raw(value: Any) -> Any:
    """A trace value as a key (a missing one is None, as ``dict.get`` gave)."""
    return None if value is UNSET else value


# The checking helpers below take the event, its piece and the index of the piece's first event:
# the event's index in the trace is found only when there is an error to report.


def _key(value: Any, e: Event, events: list[Event], first: int, field_name: str) -> Any:
    """A value used as a key (thread, correlation, device): anything hashable."""
    if value is UNSET:
        return None
    try:
        hash(value)
    except TypeError:
        raise _malformed(e, events, first, field_name, value, "a number or a string") from None
    return value


def _text(value: Any, e: Event, events: list[Event], first: int) -> str:
    if value is UNSET:
        return ""
    raise _malformed(e, events, first, "name", value, "a string")


def _args(value: Any, e: Event, events: list[Event], first: int) -> EventArgs:
    if value is UNSET or value is None or (isinstance(value, (list, dict)) and not value):
        return _NO_ARGS
    raise _malformed(e, events, first, "args", value, "an object")


_NO_ARGS = EventArgs()


def _num(
    value: Any,
    e: Event | None = None,
    events: list[Event] | None = None,
    first: int = 0,
    field_name: str = "",
    minimum: float | None = None,
) -> float:
    """A time or size as a float: missing is 0, a numeric string is read; anything else, a value
    that is not finite ("Infinity", NaN) or one below ``minimum`` (a negative duration), is a
    malformed trace."""
    if (
        type(value) is float and value - value == 0.0 and (minimum is None or value >= minimum)
    ):  # finite: inf - inf is nan
        return value
    if value is None or value is UNSET:
        return 0.0
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not math.isfinite(number):
        raise _malformed(e, events, first, field_name, value, "a finite number")
    if minimum is not None and number < minimum:
        raise _malformed(e, events, first, field_name, value, f"a duration ({minimum:g} or more)")
    return number


def _malformed(
    e: Event | None, events: list[Event] | None, first: int, field_name: str, value: Any, expected: str
) -> TraceError:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    where = "an event"
    if e is not None and events is not None:
        index = first + next(i for i, other in enumerate(events) if other is e)
        where = f"event {index:,}"
        if isinstance(e.name, str):
            where += f" ({e.cat} {e.name[:60]!r})"
    return TraceError(
        f"malformed trace: {where} has {field_name} {shown}, not {expected}",
        hint="the trace was edited or written by another tool; torch.profiler writes well-formed fields",
    )


#: the metadata key ``diagnose trim`` writes into the trace it trims (``TraceMeta.trim_format``)
TRIM_FORMAT_KEY = "diagnoseTrimFormat"
#: what ``diagnose trim`` writes now: it keeps the long runtime calls (``LONG_RUNTIME_CALL_US``)
TRIM_FORMAT = 2


def _read_meta(data: dict[str, Any]) -> TraceMeta:
    meta = TraceMeta()
    trim_format = data.get(TRIM_FORMAT_KEY)
    meta.trim_format = trim_format if type(trim_format) is int else None
    props = data.get("deviceProperties") or []
    if props and isinstance(props, list) and isinstance(props[0], dict):
        first = props[0]
        name = first.get("name")
        meta.device_name = name if isinstance(name, str) else None
        mem = first.get("totalGlobalMem")
        meta.device_memory_bytes = _meta_int(mem, "deviceProperties.totalGlobalMem") or None
        if first.get("computeMajor") is not None:
            meta.compute_capability = (
                _meta_int(first.get("computeMajor", 0), "deviceProperties.computeMajor"),
                _meta_int(first.get("computeMinor", 0), "deviceProperties.computeMinor"),
            )
        sms = first.get("numSms")
        meta.num_sms = None if sms is None else _meta_int(sms, "deviceProperties.numSms")
    dist = data.get("distributedInfo")
    if isinstance(dist, dict):
        rank, world, backend = dist.get("rank"), dist.get("world_size"), dist.get("backend")
        meta.rank = rank if type(rank) is int and rank >= 0 else None
        meta.world_size = world if type(world) is int and world > 0 else None
        meta.backend = backend if isinstance(backend, str) else None
    driver, runtime = data.get("cuda_driver_version"), data.get("cuda_runtime_version")
    meta.cuda_driver_version = None if driver is None else _meta_int(driver, "cuda_driver_version")
    meta.cuda_runtime_version = None if runtime is None else _meta_int(runtime, "cuda_runtime_version")
    return meta


def _meta_int(value: Any, field_name: str) -> int:
    if value is None:
        return 0
    if type(value) is int:
        return value
    try:
        number = float(value)
        if math.isfinite(number) and not isinstance(value, bool):
            return int(number)
    except (TypeError, ValueError):
        pass
    shown = repr(value)
    raise TraceError(
        f"malformed trace: {field_name} is {shown if len(shown) <= 40 else shown[:37] + '...'}, not a number",
        hint="the trace was edited or written by another tool; torch.profiler writes well-formed fields",
    )


class _Annotations(NamedTuple):
    steps: list[StepMark]
    other: Counter[str]
    data_waits: list[Interval]
    optimizer_spans: list[Interval]
    loader_kinds: Counter[str]
    optimizer_steps: list[Interval]
    optimizer_classes: Counter[str]
    collectives: list[Interval]
    data_parallel: list[Interval]
    closures: list[Interval]
    collective_ops: list[HostOp]
    backward_marks: list[Interval]


def _read_annotations(annotations: list[tuple[str, Any, float, float]], main_tid: Any) -> _Annotations:
    steps: list[StepMark] = []
    collectives: list[Interval] = []
    collective_ops: list[HostOp] = []
    data_parallel: list[Interval] = []
    other: Counter[str] = Counter()
    loader_kinds: Counter[str] = Counter()
    data_waits: list[Interval] = []
    optimizer_spans: list[Interval] = []
    closure_spans: list[Interval] = []
    backward_marks: list[Interval] = []
    optimizer_steps: list[Interval] = []
    optimizer_classes: Counter[str] = Counter()
    for name, tid, ts, end in annotations:
        on_main = tid == main_tid
        if name.startswith(P.PROFILER_STEP_PREFIX):
            if on_main:
                try:
                    number = int(name[len(P.PROFILER_STEP_PREFIX) :])
                except ValueError:
                    number = len(steps)
                steps.append(StepMark(number, ts, end))
        elif name.startswith(P.DATALOADER_PREFIX):
            if on_main:
                data_waits.append((ts, end))
                loader_kinds["multi" if "MultiProcessing" in name else "single"] += 1
        elif name.startswith(P.OPTIMIZER_SIDE_PREFIXES):
            if on_main:
                optimizer_spans.append((ts, end))
                if name.startswith(P.OPTIMIZER_STEP_PREFIX):
                    optimizer_steps.append((ts, end))
                    # "Optimizer.step#Adam.step": the class is the last name before ".step"
                    optimizer_classes[name[len(P.OPTIMIZER_STEP_PREFIX) :].rsplit(".", 1)[0]] += 1
        elif name.startswith(P.OPTIMIZER_CLOSURE_PREFIX):
            if on_main:
                closure_spans.append((ts, end))
        elif name.startswith(P.BACKWARD_MARK_PREFIX):
            if on_main:
                backward_marks.append((ts, end))
        elif name.startswith(P.CPU_COLLECTIVE_PREFIXES):
            collectives.append((ts, end))
            collective_ops.append(HostOp(ts, end, name))
        elif name.startswith(P.DATA_PARALLEL_PREFIXES) and on_main:
            data_parallel.append((ts, end))
        else:
            other[name] += 1
    steps.sort(key=lambda s: s.start)
    # A step the profiler closed early (the last one of a window cut by an exception) can overlap
    # the next; clip so that steps tile the time line.
    for i in range(len(steps) - 1):
        if steps[i].end > steps[i + 1].start:
            steps[i] = StepMark(steps[i].number, steps[i].start, steps[i + 1].start)
    steps = [s for s in steps if s.end > s.start]
    return _Annotations(
        steps,
        other,
        sorted(data_waits),
        sorted(optimizer_spans),
        loader_kinds,
        sorted(optimizer_steps),
        optimizer_classes,
        sorted(collectives),
        sorted(data_parallel),
        sorted(closure_spans),
        sorted(collective_ops),
        sorted(backward_marks),
    )


def _whole_window(
    main_ops: Sequence[tuple[float, float, str, bool]], kernels: Sequence[GpuKernel], memcpys: list[GpuMemcpy]
) -> list[StepMark]:
    starts = [op[0] for op in main_ops[:1]] + [k.start for k in kernels[:1]] + [m.start for m in memcpys[:1]]
    ends = [max((op[1] for op in main_ops), default=float("-inf"))]
    ends += [max((k.end for k in kernels), default=float("-inf")), max((m.end for m in memcpys), default=float("-inf"))]
    if not starts:
        return []
    start, end = min(starts), max(ends)
    return [StepMark(0, start, end)] if end > start else []
