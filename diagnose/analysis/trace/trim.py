"""Cut a trace down to a few steps and to the events the analysis reads.

Contract: ``trim_trace(data, steps) -> dict`` (and ``trimmed_bytes(path, steps)``, its file
encoded; the command writes it, whole or not at all). Keeps the trace's metadata, the first ``steps``
``ProfilerStep`` windows of the main thread, and within them: user annotations, top-level
operators of the main thread, operators that start a forward->backward flow, autograd engine
operators, the runtime calls that launched kept GPU work, synchronised or waited for the GPU
(longer than ``LONG_RUNTIME_CALL_US``), GPU kernels, copies and memsets. Everything else
(nested operators, flow arrows, other runtime calls) goes.

``diagnose trim`` uses it to share a large trace or to record a test fixture: the breakdown of
the kept steps is unchanged (tests/test_fixtures.py checks it on every recorded fixture).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from diagnose.analysis.trace import patterns as P
from diagnose.analysis.trace.timeline import LONG_RUNTIME_CALL_US, TRIM_FORMAT, TRIM_FORMAT_KEY, read_trace_json
from diagnose.errors import TraceError

_GPU = ("kernel", "gpu_memcpy", "gpu_memset")
_RUNTIME = ("cuda_runtime", "cuda_driver")


def trim_trace(data: dict[str, Any], steps: int, skip: int = 1) -> dict[str, Any]:
    """The ``steps`` steps after the first ``skip`` ones. Earlier steps leave their phase marks
    (annotations, forward and backward operators, no ProfilerStep mark): a GPU that runs behind
    executes, in a kept step, kernels launched steps before, and their phase is read there."""
    events = [e for e in data["traceEvents"] if isinstance(e, dict)]
    marks = sorted(
        (
            e
            for e in events
            if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(P.PROFILER_STEP_PREFIX)
        ),
        key=lambda e: e["ts"],
    )
    if not marks:
        raise TraceError("the trace has no ProfilerStep marks to trim by")
    chosen = marks[skip : skip + steps]
    if not chosen:
        raise TraceError(f"the trace has {len(marks)} steps; cannot skip {skip}")
    main_tid = chosen[0]["tid"]
    start = marks[skip - 1]["ts"] if skip > 0 else chosen[0]["ts"]
    end: float = max(m["ts"] + m.get("dur", 0) for m in chosen)
    chosen_ids = {id(m) for m in chosen}

    def inside(e: dict[str, Any]) -> bool:
        ts = e.get("ts", -1)
        return start <= ts < end or (e.get("cat") in _GPU and ts < end and ts + e.get("dur", 0) > start)

    def before_end(e: dict[str, Any]) -> bool:
        ts: float = e.get("ts", end)
        return ts < end

    flows = {
        (e.get("tid"), e.get("ts")) for e in events if e.get("cat") == "fwdbwd" and e.get("ph") == "s" and before_end(e)
    }
    gpu_correlations = {(e.get("args") or {}).get("correlation") for e in events if e.get("cat") in _GPU and inside(e)}
    top_level = _top_level_ids(
        [e for e in events if e.get("cat") == "cpu_op" and e.get("tid") == main_tid and inside(e)]
    )

    def keep(e: dict[str, Any]) -> bool:
        cat = e.get("cat")
        if e.get("ph") == "M":
            return True
        if cat in _RUNTIME and (e.get("args") or {}).get("correlation") in gpu_correlations:
            return True  # the launch of kept GPU work, wherever it is
        name = str(e.get("name", ""))
        if before_end(e):  # phase marks, from the start of the trace
            if cat == "user_annotation" and not name.startswith(P.PROFILER_STEP_PREFIX):
                return True
            if cat == "cpu_op" and (name.startswith(P.BACKWARD_OP_PREFIX) or (e.get("tid"), e.get("ts")) in flows):
                return True
            if cat == "fwdbwd" and e.get("ph") == "s":
                return True
        if not inside(e):
            return False
        if cat == "user_annotation":
            return id(e) in chosen_ids
        if cat == "cpu_op":
            return id(e) in top_level
        if cat in _RUNTIME:  # syncs, graph launches, and calls that waited (back-pressure)
            return (
                name in P.SYNC_CALLS
                or name in ("cudaGraphLaunch", "cuGraphLaunch")
                or e.get("dur", 0) > LONG_RUNTIME_CALL_US
            )
        return cat in _GPU

    trimmed = {k: v for k, v in data.items() if k != "traceEvents"}
    trimmed[TRIM_FORMAT_KEY] = TRIM_FORMAT
    trimmed["traceEvents"] = [_slim(e) for e in events if keep(e)]
    return trimmed


#: the args the analysis reads; the rest (grid, registers, occupancy, ids) is dropped
_ARGS_READ = ("correlation", "device", "stream", "bytes", "name")


def _slim(e: dict[str, Any]) -> dict[str, Any]:
    args = e.get("args")
    if not args:
        return e
    out = dict(e)
    out["args"] = {k: v for k, v in args.items() if k in _ARGS_READ}
    return out


def _top_level_ids(ops: list[dict[str, Any]]) -> set[int]:
    top: set[int] = set()
    top_end = float("-inf")
    for e in sorted(ops, key=lambda e: (e["ts"], -e.get("dur", 0))):
        if e["ts"] >= top_end:
            top.add(id(e))
            top_end = e["ts"] + e.get("dur", 0)
    return top


def trimmed_bytes(source: Path, steps: int, skip: int = 1, gzipped: bool = False) -> bytes:
    """The trimmed trace of the file ``source``, encoded (gzipped for a ``.gz`` target)."""
    raw = json.dumps(trim_trace(read_trace_json(source), steps, skip), separators=(",", ":")).encode()
    return gzip.compress(raw, compresslevel=9) if gzipped else raw


def trim_file(source: Path, target: Path, steps: int, skip: int = 1) -> Path:
    """Trim ``source`` into ``target`` (gzipped when its name ends in .gz), whole or not at all."""
    from diagnose.rundir import write_file_whole

    return write_file_whole(target, trimmed_bytes(source, steps, skip, gzipped=target.name.endswith(".gz")))
