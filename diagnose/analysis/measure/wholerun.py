"""Where a whole run's wall-clock went (``diagnose watch``), and the shifts that cost it time.

Contract: ``account(record) -> Accounting | None``: pure, no torch. It reads ``record.whole``
(written by ``runtime/whole.py``; None when the run was not watched) and the record's plan,
and splits the wall-clock from the process's start to the script's end into named buckets
that sum to it exactly:

* ``startup``: before the first step (interpreter, imports, model build), and what the first
  ``plan.warmup`` steps took above the run's typical step (lazy initialisation, caches);
* ``compile``: dynamo's compilations, each with the frame and, for a recompilation, dynamo's
  reason;
* ``data_startup``: from ``iter(loader)`` until each of its workers delivered a first batch, each
  epoch of each loader, and
  the shutdown of workers that are not persistent at each epoch's end;
* ``eval``: evaluation (a framework's eval loop, or ``model.eval()`` until training resumes);
* ``checkpoint``: checkpoint saves;
* ``gc``: Python's garbage collections of 5 ms or more;
* ``profiling``: diagnose's own profiled windows (the main one with its trace export, and the
  later short ones);
* ``train``: the training steps' remaining time: goodput is its share;
* ``contention``: of those stalls (below), the time the main thread waited on a run queue for a
  CPU in the same half-second (``threads_run_delay_s`` samples: the waits of all its threads,
  for a step waits on its intra-op threads too): other processes held the cores;
* ``stalls``: within a step, what no span explains and exceeds ``STALL_FACTOR`` times the
  typical step of its neighbourhood, by ``STALL_MIN_S`` at least (the excess over that typical
  step; unexplained), unless the step holds a checkpoint save, a compilation or an evaluation:
  then the excess is that span's bucket's (``TIED_BUCKETS``: the work around it that its own
  span does not cover);
* ``teardown``: after the last step ends (its optimizer step), the script's own end.

Where spans overlap, the first kind in ``SPAN_PRIORITY`` takes the time (a checkpoint saved
inside an evaluation loop is checkpointing). Then the shifts: what evaluation, checkpoints,
epoch starts, recompilations and a slowing step cost over the run, and whether memory creeps
(``Shifts``); ``symptoms/wholerun.py`` turns them into the ``whole.*`` symptoms the WHOLE rules
read.
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

from diagnose.record import RunRecord

BUCKETS = (
    "startup",
    "compile",
    "data_startup",
    "train",
    "eval",
    "checkpoint",
    "gc",
    "profiling",
    "contention",
    "stalls",
    "teardown",
)
LABELS = {
    "startup": "start-up (interpreter, imports, model build, first steps)",
    "compile": "compilation (torch.compile)",
    "data_startup": "data start-up (iter(loader) to the workers' first batches; their shutdown)",
    "train": "training steps",
    "eval": "evaluation",
    "checkpoint": "checkpointing",
    "gc": "garbage collection (Python's gc)",
    "profiling": "diagnose's profiled windows",
    "contention": "stalls waiting for a CPU (other processes or threads held the cores)",
    "stalls": "unexplained stalls inside steps",
    "teardown": "teardown (after the last step)",
}
#: the buckets that count as named (``stalls`` is the unexplained rest)
NAMED = tuple(b for b in BUCKETS if b != "stalls")
#: span kind -> bucket, in priority order: where spans overlap, the first listed takes the time
SPAN_PRIORITY = (
    ("checkpoint", "checkpoint"),
    ("compile", "compile"),
    ("gc", "gc"),
    ("profiling", "profiling"),
    ("data_startup", "data_startup"),
    ("eval", "eval"),
    ("eval_model", "eval"),
)
#: a step's unexplained time over this many times its neighbourhood's typical step is a stall
STALL_FACTOR = 3.0
#: ... when it also exceeds that typical step by this much (seconds): a host's millisecond
#: jitter on a millisecond step is noise, not a stall worth naming
STALL_MIN_S = 0.02
#: a stall in a step that also holds one of these spans is that span's (in this order): the work
#: around a save that ``torch.save`` does not cover (building the state dict, deleting the last
#: checkpoint's file), and around a compilation what dynamo's own timing leaves out (the backward
#: graph compiled at the first backward, kernels loaded, CUDA graphs recorded); an evaluation
#: step's the same way
TIED_BUCKETS = ("checkpoint", "compile", "eval")
#: steps per neighbourhood (the typical step is their median)
BLOCK_STEPS = 64
#: the timeline's slices and the step series' points at most
TIMELINE_SLICES = 200
STEP_POINTS = 1000


@dataclass
class Accounting:
    """The whole run's wall-clock by bucket, its shifts, and the series the renderers draw."""

    wall_s: float
    seconds: dict[str, float]
    steps: int
    #: per epoch / per save / per compile, what each span was (name, start, seconds)
    events: dict[str, list[dict[str, Any]]]
    shifts: dict[str, Any]
    #: ``{"t0", "t1", "shares": {bucket: share}}`` over equal slices of the wall-clock
    timeline: list[dict[str, Any]]
    #: ``[t, median_ms, max_ms, first_step]`` of the steps, in order (grouped when there are many)
    step_series: list[list[float]]
    #: ``[t, steps, host_gb, gpu_gb | None, data_wait_share | None]`` samples (twice a second at most)
    memory_series: list[list[float | None]]
    windows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def share(self, bucket: str) -> float:
        return self.seconds.get(bucket, 0.0) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def goodput(self) -> float:
        return self.share("train")

    @property
    def named_share(self) -> float:
        return sum(self.share(b) for b in NAMED)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shares"] = {b: round(self.share(b), 6) for b in BUCKETS}
        out["labels"] = dict(LABELS)
        out["goodput"] = round(self.goodput, 6)
        out["named_share"] = round(self.named_share, 6)
        return out


def account(record: RunRecord) -> Accounting | None:
    whole = record.whole
    if not whole or not whole.get("boundaries_s"):
        return None
    b = [float(t) for t in whole["boundaries_s"]]
    start = whole.get("process_start_s")
    start = min(float(start), b[0], 0.0) if start is not None else min(0.0, b[0])
    end = max(float(whole.get("script_end_s") or b[-1]), b[-1])
    last_opt = whole.get("last_optimizer_step_s")
    steps_end = max(b[-1], float(last_opt)) if last_opt is not None and last_opt <= end else b[-1]
    spans = _spans(record, whole, start, end)
    segments = _cover(spans)
    seconds = dict.fromkeys(BUCKETS, 0.0)
    for s, e, bucket in segments:
        seconds[bucket] += e - s
    # step k runs from b[k] to b[k+1]; the last one to the last optimizer step
    edges = [*b, steps_end] if steps_end > b[-1] else b
    residual = _uncovered(edges, segments)
    warmup = int(record.plan.get("warmup", 0)) if record.plan else 0
    typical = _block_medians(residual)
    stall_s = 0.0
    warmup_excess = 0.0
    waits = _CpuWaits(whole.get("samples", []))
    train_by_step: list[float] = []
    tied: list[tuple[str, float, float, float]] = []  # (bucket, step start, step end, seconds)
    segment_ends = [e for _, e, _ in segments]
    for k, r in enumerate(residual):
        excess = r - typical[k] if r > STALL_FACTOR * typical[k] and r - typical[k] >= STALL_MIN_S else 0.0
        if k < warmup:
            warmup_excess += excess
        elif excess > 0:
            waited = waits.take(edges[k], edges[k + 1], excess)
            seconds["contention"] += waited
            owner = _tied_bucket(edges[k], edges[k + 1], segments, segment_ends)
            if owner is not None:
                seconds[owner] += excess - waited
                tied.append((owner, edges[k], edges[k + 1], excess - waited))
            else:
                stall_s += excess - waited
        train_by_step.append(r - excess)
    seconds["stalls"] = stall_s
    seconds["train"] = sum(train_by_step)
    seconds["startup"] += _uncovered([start, b[0]], segments)[0] + warmup_excess if b[0] > start else warmup_excess
    seconds["teardown"] += _uncovered([steps_end, end], segments)[0] if end > steps_end else 0.0
    wall = end - start
    events = _events(spans)
    _add_tied(events, tied)
    durations = [edges[i + 1] - edges[i] for i in range(len(edges) - 1)]
    shifts = _shifts(record, whole, events, train_by_step, durations, edges, warmup, wall)
    return Accounting(
        wall_s=wall,
        seconds=seconds,
        steps=len(durations),
        events=events,
        shifts=shifts,
        timeline=_timeline(start, end, b[0], steps_end, segments),
        step_series=_step_series(edges, durations),
        memory_series=_memory_series(whole),
        windows=list(whole.get("windows", [])),
        notes=list(whole.get("notes", [])),
    )


# --- spans and their cover ---------------------------------------------------------------------


def _spans(
    record: RunRecord, whole: dict[str, Any], start: float, end: float
) -> list[tuple[float, float, str, dict[str, Any]]]:
    """(start, end, kind, detail) of every span, clipped to the run."""
    out: list[tuple[float, float, str, dict[str, Any]]] = []

    def add(s: float, e: float, kind: str, detail: dict[str, Any]) -> None:
        s, e = max(s, start), min(e, end)
        if e > s:
            out.append((s, e, kind, detail))

    for span in whole.get("spans", []):
        add(float(span["start"]), float(span["end"]), span["kind"], {"name": span.get("name", "")})
    for loader in whole.get("loaders", []):
        for s, wait in loader.get("starts", []):
            if s is not None:
                add(
                    float(s),
                    float(s) + float(wait),
                    "data_startup",
                    {
                        "name": loader.get("created_at") or "DataLoader",
                        "num_workers": loader.get("num_workers", 0),
                        "persistent_workers": loader.get("persistent_workers", False),
                    },
                )
    for c in whole.get("compiles", []):
        detail = {"name": c.get("frame", ""), "reason": c.get("reason")}
        if c.get("trigger") and c["trigger"] != "dynamo":
            detail["part"] = c["trigger"]  # compile work beside a frame's (a lazily compiled backward)
        add(float(c["start"]), float(c["end"]), "compile", detail)
    window = _main_window(record)
    if window is not None:
        add(window[0], window[1], "profiling", {"name": "diagnose's profiled window and its trace export"})
    return out


def _main_window(record: RunRecord) -> tuple[float, float] | None:
    """The main window, profiled steps and the step that absorbed the export, in seconds from
    the script's start."""
    if not record.plan or record.script_start_s is None or not record.trace_files:
        return None
    plan = record.window_plan()
    b = record.boundaries_s
    if len(b) <= plan.warmup:
        return None
    last = min(plan.first_timed, len(b) - 1)
    return b[plan.warmup] - record.script_start_s, b[last] - record.script_start_s


def _cover(spans: list[tuple[float, float, str, dict[str, Any]]]) -> list[tuple[float, float, str]]:
    """Disjoint, sorted segments, each given the bucket of the highest-priority span over it."""
    rank = {kind: i for i, (kind, _) in enumerate(SPAN_PRIORITY)}
    bucket_of = dict(SPAN_PRIORITY)
    edges = sorted({t for s, e, _, _ in spans for t in (s, e)})
    if not edges:
        return []
    starts = sorted(((s, e, rank.get(kind, len(rank)), kind) for s, e, kind, _ in spans), key=lambda x: x[0])
    active: list[tuple[float, int, str]] = []
    out: list[tuple[float, float, str]] = []
    i = 0
    for left, right in pairwise(edges):
        while i < len(starts) and starts[i][0] <= left:
            active.append((starts[i][1], starts[i][2], starts[i][3]))
            i += 1
        active = [a for a in active if a[0] > left]
        if not active:
            continue
        kind = min(active, key=lambda a: a[1])[2]
        bucket = bucket_of.get(kind, "eval")
        if out and out[-1][1] == left and out[-1][2] == bucket:
            out[-1] = (out[-1][0], right, bucket)
        else:
            out.append((left, right, bucket))
    return out


def _tied_bucket(left: float, right: float, segments: list[tuple[float, float, str]], ends: list[float]) -> str | None:
    """The bucket a step's stall belongs to when the step holds a span of ``TIED_BUCKETS``: the
    first of them in that order, else None (the stall stays unexplained). ``segments`` are
    disjoint and sorted (``_cover``); ``ends`` their ends, for a binary search."""
    inside = set()
    j = bisect.bisect_right(ends, left)
    while j < len(segments) and segments[j][0] < right:
        inside.add(segments[j][2])
        j += 1
    return next((b for b in TIED_BUCKETS if b in inside), None)


def _add_tied(events: dict[str, list[dict[str, Any]]], tied: list[tuple[str, float, float, float]]) -> None:
    """Each tied stall's seconds onto the event of its bucket that lies in the step (the save or
    compilation whose shift then costs what the step lost to it)."""
    for bucket, left, right, extra in tied:
        for e in events.get(bucket, []):
            if e["start"] < right and e["start"] + e["seconds"] > left:
                e["seconds"] = round(e["seconds"] + extra, 6)
                e["tied_s"] = round(e.get("tied_s", 0.0) + extra, 6)
                break


def _uncovered(edges: list[float], segments: list[tuple[float, float, str]]) -> list[float]:
    """For each interval ``edges[k]..edges[k+1]``, the time no segment covers (one pass)."""
    out = []
    j = 0
    for left, right in pairwise(edges):
        while j < len(segments) and segments[j][1] <= left:
            j += 1
        covered = 0.0
        m = j
        while m < len(segments) and segments[m][0] < right:
            covered += max(0.0, min(right, segments[m][1]) - max(left, segments[m][0]))
            m += 1
        out.append(max(0.0, (right - left) - covered))
    return out


class _CpuWaits:
    """The process's waits for a CPU between samples (``threads_run_delay_s``; a run recorded before
    it has the training thread's own, ``run_delay_s``), handed out once each
    to the stalls of the steps that overlap their interval."""

    def __init__(self, samples: list[dict[str, Any]]) -> None:
        # all the process's threads' waits (a step waits on its intra-op threads too), where the
        # run recorded them; else the training thread's own
        key = "threads_run_delay_s" if any(s.get("threads_run_delay_s") is not None for s in samples) else "run_delay_s"
        marked = [(float(s["t"]), float(s[key])) for s in samples if s.get(key) is not None]
        self.intervals = [[t0, t1, max(0.0, d1 - d0)] for (t0, d0), (t1, d1) in pairwise(marked) if t1 > t0]

    def take(self, start: float, end: float, most: float) -> float:
        taken = 0.0
        for interval in self.intervals:
            if interval[1] <= start or interval[0] >= end or taken >= most:
                continue
            share = min(interval[2], most - taken)
            interval[2] -= share
            taken += share
        return taken


def _block_medians(values: list[float]) -> list[float]:
    """Each value's neighbourhood's median (blocks of ``BLOCK_STEPS``; a short last block joins
    the one before it), over the values above zero: a step that a span covers whole (the main
    profiled window's) says nothing of the typical step."""
    n = len(values)
    out = [0.0] * n
    starts = list(range(0, n, BLOCK_STEPS))
    if len(starts) > 1 and n - starts[-1] < BLOCK_STEPS // 2:
        starts.pop()
    for idx, s in enumerate(starts):
        e = starts[idx + 1] if idx + 1 < len(starts) else n
        seen = [v for v in values[s:e] if v > 0]
        median = statistics.median(seen) if seen else 0.0
        for k in range(s, e):
            out[k] = median
    return out


def _events(spans: list[tuple[float, float, str, dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s, e, kind, detail in sorted(spans, key=lambda x: x[0]):
        bucket = dict(SPAN_PRIORITY).get(kind, kind)
        out.setdefault(bucket, []).append({"start": round(s, 6), "seconds": round(e - s, 6), **detail})
    return out


# --- shifts ----------------------------------------------------------------------------------------


def _shifts(
    record: RunRecord,
    whole: dict[str, Any],
    events: dict[str, list[dict[str, Any]]],
    train: list[float],
    durations: list[float],
    edges: list[float],
    warmup: int,
    wall: float,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # checkpoints: how often, in steps, and how long each blocks
    saves = _outermost(events.get("checkpoint", []))
    if saves:
        at_steps = [_step_at(edges, e["start"]) for e in saves]
        gaps = [b - a for a, b in pairwise(at_steps) if b > a]
        out["checkpoint"] = {
            "count": len(saves),
            "mean_s": statistics.fmean(e["seconds"] for e in saves),
            "every_steps": statistics.median(gaps) if gaps else None,
            "names": _names(saves),
        }
    evals = _outermost(events.get("eval", []))
    if evals:
        out["eval"] = {
            "count": len(evals),
            "mean_s": statistics.fmean(e["seconds"] for e in evals),
            "names": _names(evals),
        }
    starts = [e for e in events.get("data_startup", []) if "num_workers" in e]  # iter() to the first batch
    if starts:
        out["data_startup"] = {
            "count": len(starts),
            "mean_s": statistics.fmean(e["seconds"] for e in starts),
            # every start after the first, and the workers' shutdowns at epoch ends
            "after_first_s": sum(e["seconds"] for e in starts[1:])
            + sum(e["seconds"] for e in events.get("data_startup", []) if "num_workers" not in e),
            "persistent_workers": all(e.get("persistent_workers") for e in starts),
            "num_workers": max(int(e.get("num_workers") or 0) for e in starts),
        }
    compiles = events.get("compile", [])
    if compiles:
        frames = [c for c in compiles if "part" not in c]  # a frame's compilation, not the work beside it
        recompiles = [c for c in frames if c.get("reason")]
        # reasons that differ only in numbers (sizes) are one kind: the first one's words stand for it
        kinds = Counter(re.sub(r"\d+", "N", c["reason"]) for c in recompiles)
        example: dict[str, str] = {}
        for c in recompiles:
            example.setdefault(re.sub(r"\d+", "N", c["reason"]), c["reason"])
        out["compile"] = {
            "count": len(frames),
            "recompiles": len(recompiles),
            # with the backward each recompilation compiled at its first backward (same reason)
            "recompile_s": sum(c["seconds"] for c in compiles if c.get("reason")),
            "reasons": [{"reason": example[k], "count": n} for k, n in kinds.most_common(3)],
        }
    out["slowdown"] = _slowdown(train, durations, warmup)
    out["memory"] = _memory_growth(whole)
    return out


def _outermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events not inside an earlier one (a model.eval() inside a framework's eval loop)."""
    out: list[dict[str, Any]] = []
    for e in events:
        if out and e["start"] < out[-1]["start"] + out[-1]["seconds"]:
            continue
        out.append(e)
    return out


def _names(events: list[dict[str, Any]]) -> list[str]:
    return [n for n, _ in Counter(e.get("name", "") for e in events).most_common(3)]


def _step_at(edges: list[float], t: float) -> int:
    lo, hi = 0, len(edges) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if edges[mid] <= t:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _slowdown(train: list[float], durations: list[float], warmup: int) -> dict[str, Any] | None:
    """The steps' training time late in the run against early (medians of the first and last
    fifths after warm-up), and the time lost to steps slower than the early pace."""
    steps = train[warmup:]
    if len(steps) < 20:
        return None
    fifth = max(1, len(steps) // 5)
    early = statistics.median(steps[:fifth])
    late = statistics.median(steps[-fifth:])
    if early <= 0:
        return None
    lost = sum(max(0.0, s - early) for s in steps[fifth:])
    return {"early_ms": early * 1e3, "late_ms": late * 1e3, "ratio": late / early, "lost_s": lost}


def _memory_growth(whole: dict[str, Any]) -> dict[str, Any] | None:
    """Host RSS (and GPU allocated) from the first sample after the first step to the last one
    taken while steps still ran: growth, the share of sample-to-sample changes that grew, and when
    the trend meets capacity. The sample at the script's end is left out: by then the script may
    have freed what its steps kept (a list of losses dies with its function), which hides a creep
    that would have run out of memory in a longer run."""
    boundaries = whole.get("boundaries_s") or []
    last_step = float(boundaries[-1]) if boundaries else float("inf")
    samples = [s for s in whole.get("samples", []) if s.get("steps", 0) >= 1 and s["t"] <= last_step]
    if len(samples) < 4:
        return None
    out: dict[str, Any] = {}
    capacity = whole.get("capacity", {})
    for key, cap_key, name in (("rss_bytes", "host_bytes", "host"), ("gpu_allocated_bytes", "gpu_bytes", "gpu")):
        values = [(s["t"], s[key]) for s in samples if s.get(key) is not None]
        if len(values) < 4:
            continue
        (t0, v0), (t1, v1) = values[0], values[-1]
        rises = sum(1 for (_, a), (_, b) in pairwise(values) if b > a)
        cap = capacity.get(cap_key)
        slope = (v1 - v0) / (t1 - t0) if t1 > t0 else 0.0
        entry = {
            "start_bytes": v0,
            "end_bytes": v1,
            "growth": (v1 - v0) / v0 if v0 else None,
            "rising_share": rises / (len(values) - 1),
            "per_hour_bytes": slope * 3600,
            "capacity_bytes": cap,
        }
        if cap and slope > 0 and v1 < cap:
            entry["hours_to_capacity"] = (cap - v1) / slope / 3600
        out[name] = entry
    return out or None


# --- series for the renderers ---------------------------------------------------------------------


def _timeline(
    start: float, end: float, first: float, steps_end: float, segments: list[tuple[float, float, str]]
) -> list[dict[str, Any]]:
    """Bucket shares over equal slices of the wall-clock: the spans exactly, the rest as start-up
    (before the first step), teardown (after the last) or training."""
    n = TIMELINE_SLICES
    width = (end - start) / n if end > start else 0.0
    if width <= 0:
        return []
    out = []
    j = 0
    for i in range(n):
        t0, t1 = start + i * width, start + (i + 1) * width
        seconds: dict[str, float] = {}
        while j < len(segments) and segments[j][1] <= t0:
            j += 1
        m = j
        while m < len(segments) and segments[m][0] < t1:
            overlap = min(t1, segments[m][1]) - max(t0, segments[m][0])
            if overlap > 0:
                seconds[segments[m][2]] = seconds.get(segments[m][2], 0.0) + overlap
            m += 1
        rest = max(0.0, width - sum(seconds.values()))
        regions = [
            (bucket, max(0.0, min(t1, z) - max(t0, a)))
            for bucket, a, z in (("startup", start, first), ("train", first, steps_end), ("teardown", steps_end, end))
        ]
        in_regions = sum(o for _, o in regions)
        for bucket, o in regions:
            if rest > 0 and o > 0:  # the uncovered rest, shared by where the slice lies
                seconds[bucket] = seconds.get(bucket, 0.0) + rest * o / in_regions
        total = sum(seconds.values()) or 1.0
        out.append(
            {"t0": round(t0, 4), "t1": round(t1, 4), "shares": {b: round(v / total, 4) for b, v in seconds.items()}}
        )
    return out


def _step_series(edges: list[float], durations: list[float]) -> list[list[float]]:
    """``[t, median_ms, max_ms, first_step]`` per step, or per group of steps when there are many."""
    n = len(durations)
    size = max(1, -(-n // STEP_POINTS))
    out = []
    for i in range(0, n, size):
        group = durations[i : i + size]
        out.append([round(edges[i], 4), round(statistics.median(group) * 1e3, 3), round(max(group) * 1e3, 3), i])
    return out


def _memory_series(whole: dict[str, Any]) -> list[list[float | None]]:
    """``[t, steps, host_gb, gpu_gb, data_wait_share]`` per sample (the wait's share of the time
    since the sample before)."""
    out: list[list[float | None]] = []
    last: dict[str, Any] | None = None
    for s in whole.get("samples", []):
        rss, gpu = s.get("rss_bytes"), s.get("gpu_allocated_bytes")
        wait = None
        if last is not None and s["t"] > last["t"]:
            wait = round(max(0.0, s.get("data_wait_s", 0.0) - last.get("data_wait_s", 0.0)) / (s["t"] - last["t"]), 4)
        out.append(
            [
                s["t"],
                s.get("steps", 0),
                None if rss is None else round(rss / 1e9, 4),
                None if gpu is None else round(gpu / 1e9, 4),
                wait,
            ]
        )
        last = s
    return out


# --- a distributed job ------------------------------------------------------------------------------


def job_section(lead: dict[str, Any] | None, records: dict[int, RunRecord]) -> dict[str, Any] | None:
    """A watched job's whole-run section: the lead rank's accounting (``lead``, or the first
    rank's) with each rank's goodput and buckets beside it, and the job's goodput: training time
    over wall-clock summed over the ranks (rank-seconds). None when no rank was watched."""
    rows = []
    train = wall = 0.0
    first: Accounting | None = None
    for rank, record in sorted(records.items()):
        acc = account(record)
        if acc is None:
            continue
        first = first or acc
        train += acc.seconds["train"]
        wall += acc.wall_s
        rows.append(
            {
                "rank": rank,
                "goodput": round(acc.goodput, 6),
                "wall_s": round(acc.wall_s, 6),
                "seconds": {b: round(v, 6) for b, v in acc.seconds.items()},
            }
        )
    if not rows or first is None:
        return None
    section = dict(lead) if lead else first.to_dict()
    section["ranks"] = rows
    section["job_goodput"] = round(train / wall, 6) if wall > 0 else None
    return section
