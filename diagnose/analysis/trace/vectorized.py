"""The breakdown's per-kernel and per-instant loops as array operations (numpy).

Contract: pure functions of arrays, no Timeline, no torch. Each gives exactly what the Python loop
it replaces in ``breakdown`` gives (tests/test_breakdown.py compares both on every recorded
fixture, value for value): sums are taken in the same order (``np.bincount`` adds its weights in
input order, as the loop did), so even the floats' last bits agree.

- ``launch_times``: each kernel's launch start, through its correlation id (a binary search of
  the launches' sorted ids, vectorised).
- ``labels_at``: which of a set of disjoint spans holds each instant.
- ``sweep``: the step-by-step, segment-by-segment attribution of ``breakdown._sweep``, for steps
  that do not overlap: every boundary of every interval cuts the time line into elementary
  segments, the labels active in each come from counting starts and ends before it, and the
  segments' widths are summed per step and state.

Why: on a 1 GB trace (2 million kernels) the loops took about 3.5 s of the breakdown's 5 s.
"""

from __future__ import annotations

import os
import sys
from array import array
from collections.abc import Callable, Sequence
from itertools import pairwise
from types import ModuleType
from typing import TYPE_CHECKING, Any, overload

from diagnose.analysis.trace.forking import threads_in_process

#: the variables that size numpy's BLAS thread pool when numpy loads (OpenBLAS, MKL). The
#: analysis multiplies no matrices, but a pool of one thread per core busy-waits beside it: on a
#: 16-core H200 host the 0.2 GB trace's read took 3.97 s of the parent's CPU in 2.05 s with the
#: default pool, 2.13 s with one thread, and the spinning threads took cores from the reader's
#: workers and the forked analysis. Set to 1 for numpy's import only (a value the user set is
#: kept; the environment is restored after, so that nothing started later inherits it).
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _import_numpy() -> ModuleType:
    unset = [name for name in BLAS_THREAD_VARIABLES if name not in os.environ]
    os.environ.update(dict.fromkeys(unset, "1"))
    try:
        import numpy
    finally:
        for name in unset:
            os.environ.pop(name, None)
    return numpy


_before = threads_in_process() if "numpy" not in sys.modules else None
if TYPE_CHECKING:  # the same module, as the checker sees it (and as ``V.np`` where imported lazily)
    import numpy

    np = numpy
else:
    np = _import_numpy()

#: threads numpy's BLAS started when this module imported it (0 if numpy was loaded before):
#: they survive a fork (the BLAS pool is shut down and restarted around it, as every DataLoader
#: worker forked after ``import numpy`` relies on), so the trace reader does not count them
STARTED_THREADS = max(0, threads_in_process() - _before) if _before is not None else 0

Spans = tuple[np.ndarray, np.ndarray]
#: (phase, the GPU compute labels that share the segment, the exposed cause) of a state
State = tuple[str, tuple[str, ...], str]


def floats(values: Any) -> np.ndarray:
    """A float64 array of ``values`` (an ``array('d')`` is viewed, not copied)."""
    if isinstance(values, np.ndarray):
        return values.astype(np.float64, copy=False)
    if getattr(values, "make", False) is None:  # a columns.Records of one bare column (the host's event
        values = values.column(0)  # starts), known by its attribute: columns.py imports this module, not the reverse
    if getattr(values, "typecode", None) == "d":
        return np.frombuffer(values, dtype=np.float64) if len(values) else np.empty(0)
    return np.fromiter(values, dtype=np.float64)


@overload
def ints(values: array[int]) -> np.ndarray: ...
@overload
def ints(values: Any) -> np.ndarray | None: ...
def ints(values: Any) -> np.ndarray | None:
    """An int64 array of ``values``, or None where one is not a machine integer (a string id)."""
    if getattr(values, "typecode", None) == "q":
        return np.frombuffer(values, dtype=np.int64) if len(values) else np.empty(0, dtype=np.int64)
    values = list(values)
    if not all(type(v) is int for v in values):
        return None
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return None


def rows_of(keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The row of each of ``keys`` in ``ids`` (sorted ascending, unique), -1 where it is not there."""
    if not len(ids) or not len(keys):
        return np.full(len(keys), -1, dtype=np.int64)
    at = np.minimum(np.searchsorted(ids, keys), len(ids) - 1)
    return np.where(ids[at] == keys, at, -1)


def launch_times(kernel_ids: np.ndarray, launch_ids: np.ndarray, launch_starts: np.ndarray) -> np.ndarray:
    """The start of the launch of each kernel (``launch_ids`` sorted ascending, unique), NaN
    where no launch has the kernel's id."""
    out = np.full(len(kernel_ids), np.nan)
    rows = rows_of(kernel_ids, launch_ids)
    found = rows >= 0
    out[found] = launch_starts[rows[found]]
    return out


def labels_at(times: np.ndarray, starts: np.ndarray, ends: np.ndarray, codes: np.ndarray, default: int) -> np.ndarray:
    """The code of the span that holds each instant (``starts`` sorted, spans disjoint, a span
    holding its start and not its end); ``default`` where none does, or the instant is NaN."""
    out = np.full(len(times), default, dtype=np.int64)
    if not len(starts) or not len(times):
        return out
    at = np.searchsorted(starts, times, side="right") - 1
    at_clipped = np.maximum(at, 0)
    inside = (at >= 0) & (times < ends[at_clipped])  # NaN compares false: no span
    out[inside] = codes[at_clipped[inside]]
    return out


def steps_disjoint(step_bounds: Sequence[tuple[float, float]]) -> bool:
    """The steps are in order and none starts before the previous one ended."""
    return all(a[1] <= b[0] for a, b in pairwise(step_bounds)) and all(s <= e for s, e in step_bounds)


def sweep(
    step_bounds: Sequence[tuple[float, float]],
    host: Sequence[Spans],
    gpu: Sequence[Spans],
    state_of: Callable[[int, int], State],
    phases: Sequence[str],
    exposed: Sequence[str],
    traced_step: int | None = None,
    marks: Any = None,
) -> tuple[
    list[dict[str, float]],
    list[dict[str, float]],
    list[float],
    list[tuple[float, float, str, str]],
    list[dict[str, int]],
]:
    """``breakdown._sweep`` for disjoint steps (``steps_disjoint``): per step the time of each
    phase and exposed category, the GPU's busy time, the traced step's segments in time order,
    and how many of ``marks`` (sorted instants) fell in each phase. ``host[i]``/``gpu[i]``: the
    intervals of host label i / GPU label i (GPU intervals of no width are left out, as there)."""
    n_steps = len(step_bounds)
    phase_dicts = [dict.fromkeys(phases, 0.0) for _ in range(n_steps)]
    exposed_dicts = [dict.fromkeys(exposed, 0.0) for _ in range(n_steps)]
    counted = [dict.fromkeys(phases, 0) for _ in range(n_steps)]
    if not n_steps:
        return phase_dicts, exposed_dicts, [], [], counted
    step_starts = np.array([s for s, _ in step_bounds], dtype=np.float64)
    step_ends = np.array([e for _, e in step_bounds], dtype=np.float64)
    gpu = [(s[e > s], e[e > s]) for s, e in gpu]
    times = np.unique(np.concatenate([step_starts, step_ends, *(a for spans in (*host, *gpu) for a in spans)]))
    seg_start, seg_end = times[:-1], times[1:]

    # the segments inside a step, and their step
    step_of = np.searchsorted(step_starts, seg_start, side="right") - 1
    in_step = (step_of >= 0) & (seg_start < step_ends[np.maximum(step_of, 0)])
    keep = np.flatnonzero(in_step)
    step_of, seg_start, seg_end = step_of[keep], seg_start[keep], seg_end[keep]
    width = seg_end - seg_start

    def mask(spans: Sequence[Spans]) -> np.ndarray:
        """Per segment, a bit per label: whether one of its spans is active at the segment's
        start (more starts than ends at or before it). Every start and end is one of ``times``:
        each is counted at its own boundary, and a running sum over the boundaries gives the
        counts at every segment at once."""
        bits = np.zeros(len(seg_start), dtype=np.int64)
        for i, (starts, ends) in enumerate(spans):
            if len(starts):
                at_or_before = np.cumsum(
                    np.bincount(np.searchsorted(times, starts), minlength=len(times))
                    - np.bincount(np.searchsorted(times, ends), minlength=len(times))
                )
                bits |= (at_or_before[:-1][keep] > 0).astype(np.int64) << i
        return bits

    host_mask, gpu_mask = mask(host), mask(gpu)
    shift = max(len(gpu), 1)  # every GPU label's bit below it
    combined = host_mask << shift | gpu_mask
    if len(host) + shift <= 20:  # the states present, numbered in order, through a table of every key
        present = np.bincount(combined, minlength=1 << (len(host) + shift)) > 0
        keys = np.flatnonzero(present)
        state_index = (np.cumsum(present) - 1)[combined]
    else:
        keys, state_index = np.unique(combined, return_inverse=True)
        state_index = state_index.reshape(-1)
    states = [state_of(int(k) >> shift, int(k) & ((1 << shift) - 1)) for k in keys]
    phase_code = {p: i for i, p in enumerate(phases)}
    phase_of_state = np.array([phase_code[s[0]] for s in states], dtype=np.int64)
    seg_phase = phase_of_state[state_index]

    n_phases = len(phases)
    by_phase = np.bincount(step_of * n_phases + seg_phase, weights=width, minlength=n_steps * n_phases).reshape(
        n_steps, n_phases
    )
    for label in exposed:
        # each state's share of a segment for this category: 1/n of it for each of n GPU labels
        # active, all of it for the cause where none is; 0 where it is neither
        divisor = np.array(
            [
                len(active) if label in active else (1 if not active and cause == label else 0)
                for _, active, cause in states
            ],
            dtype=np.int64,
        )
        if not divisor.any():
            continue
        seg_divisor = divisor[state_index]
        weights = np.zeros(len(width))
        has = seg_divisor > 0
        weights[has] = width[has] / seg_divisor[has]
        totals = np.bincount(step_of, weights=weights, minlength=n_steps).tolist()
        for step, total in zip(exposed_dicts, totals, strict=True):
            step[label] = total
    busy = np.bincount(step_of, weights=np.where(gpu_mask != 0, width, 0.0), minlength=n_steps).tolist()
    for step, row in zip(phase_dicts, by_phase.tolist(), strict=True):
        for p, total in zip(phases, row, strict=True):
            step[p] = total

    if marks is not None and len(marks) and len(seg_start):
        instants = floats(marks)
        at = np.searchsorted(seg_start, instants, side="right") - 1
        at_clipped = np.maximum(at, 0)
        inside = (at >= 0) & (instants < seg_end[at_clipped])
        hits = at_clipped[inside]
        per = np.bincount(step_of[hits] * n_phases + seg_phase[hits], minlength=n_steps * n_phases).reshape(
            n_steps, n_phases
        )
        for counts, row in zip(counted, per.tolist(), strict=True):
            for p, count in zip(phases, row, strict=True):
                counts[p] = count

    segments: list[tuple[float, float, str, str]] = []
    if traced_step is not None and 0 <= traced_step < n_steps:
        mine = np.flatnonzero(step_of == traced_step)
        segments = [
            (start, end, states[s][0], states[s][2])
            for start, end, s in zip(
                seg_start[mine].tolist(), seg_end[mine].tolist(), state_index[mine].tolist(), strict=True
            )
        ]
    return phase_dicts, exposed_dicts, busy, segments, counted


def sort_order(keys: Sequence[Any], descending: Sequence[bool]) -> np.ndarray | None:
    """The stable order of rows sorted by ``keys`` (float columns, the first the primary key;
    ``descending[k]``: key k from largest to smallest), or None where the rows are in that order
    already (a trace mostly is)."""
    arrays = [-floats(k) if down else floats(k) for k, down in zip(keys, descending, strict=True)]
    if len(arrays[0]) < 2:
        return None
    in_order = np.ones(len(arrays[0]) - 1, dtype=bool)  # row i+1 not before row i by the later keys
    for a in reversed(arrays):
        step = np.diff(a)
        in_order = (step > 0) | ((step == 0) & in_order)
    if in_order.all():
        return None
    return np.lexsort(arrays[::-1])  # lexsort: last key primary; stable


def members(values: Any, pool: Any) -> list[bool]:
    """For each of ``values``, whether it equals one of ``pool`` (floats, compared exactly)."""
    a, candidates = floats(values), np.sort(floats(pool))
    if not len(a) or not len(candidates):
        return [False] * len(a)
    # each value against the candidate it would sit before, in the sorted pool (3x np.isin's speed)
    at = np.minimum(np.searchsorted(candidates, a), len(candidates) - 1)
    found: list[bool] = (candidates[at] == a).tolist()
    return found


def repeats(values: Any) -> list[int]:
    """The indices i where ``values[i] == values[i - 1]``."""
    a = floats(values)
    at: list[int] = (np.flatnonzero(a[1:] == a[:-1]) + 1).tolist()
    return at


def outermost(starts: Any, ends: Any) -> np.ndarray | None:
    """The indices of the operators (sorted by start, outermost first) that are not nested in an
    earlier one: as the reader's loop keeps them, each that starts at or after the end of the last
    one kept. Vectorised, "the last one kept" becomes the latest end so far; the two agree
    wherever no operator left out ends after the one kept before it, which is checked: None
    where they may differ (an operator that outlives its parent), for the loop to decide."""
    s, e = floats(starts), floats(ends)
    if not len(s):
        return np.empty(0, dtype=np.int64)
    reach = np.empty(len(e))
    reach[0] = -np.inf
    np.maximum.accumulate(e[:-1], out=reach[1:])
    kept = np.flatnonzero(s >= reach)
    # the end of the last operator kept before each one, as the loop has it
    last = np.searchsorted(kept, np.arange(len(s)), side="left") - 1
    last_end = np.where(last >= 0, e[kept[np.maximum(last, 0)]], -np.inf)
    if not np.array_equal(last_end, reach):
        return None
    return kept


def backward_calls(starts: Any, ends: Any, forward_starts: Any) -> list[tuple[float, float]] | None:
    """``breakdown.backward_spans`` as array operations: the backward events (by start) grouped
    into one span per ``backward()`` call, a new call wherever a forward operator starts after
    the current span's end and before the event. The loop's "current span's end" is the running
    maximum of the ends so far, which holds while no event ends before it starts: None where
    one does (a malformed trace), for the loop to decide."""
    s, e, f = floats(starts), floats(ends), floats(forward_starts)
    if not len(s):
        return []
    if (e < s).any():
        return None
    reach = np.maximum.accumulate(e)
    new = np.zeros(len(s), dtype=bool)
    new[0] = True
    if len(f) and len(s) > 1:
        k = np.searchsorted(f, reach[:-1], side="right")  # the first forward start after the span's end
        new[1:] = (k < len(f)) & (f[np.minimum(k, len(f) - 1)] < s[1:])
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return list(zip(s[first].tolist(), reach[last].tolist(), strict=True))


def merged(spans: Sequence[Spans]) -> list[tuple[float, float]]:
    """``breakdown.merge`` of every interval of ``spans``: their union as sorted disjoint
    intervals (intervals of no width left out, touching ones joined)."""
    starts = np.concatenate([np.asarray(s, dtype=np.float64) for s, _ in spans]) if spans else np.empty(0)
    ends = np.concatenate([np.asarray(e, dtype=np.float64) for _, e in spans]) if spans else np.empty(0)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if not len(starts):
        return []
    order = np.lexsort((ends, starts))
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    first = np.concatenate([[True], starts[1:] > reach[:-1]])
    group_starts = starts[first]
    last = np.concatenate([np.flatnonzero(first)[1:] - 1, [len(starts) - 1]])
    return list(zip(group_starts.tolist(), reach[last].tolist(), strict=True))
