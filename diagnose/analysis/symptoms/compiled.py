"""torch.compile as the runtime saw it (``RunRecord.compile``, diagnose.runtime.compilewatch):
whether it is on and in which mode, its graph breaks and its recompilations after the warm-up.

A bare trace has no record: rules read the trace's side (``gpu.triton_share``,
``gpu.graph_launches_per_step``) themselves.
"""

from __future__ import annotations

from typing import Any

from diagnose.analysis.symptoms.registry import symptom
from diagnose.record import RunRecord


def _short(site: str) -> str:
    path, _, line = site.rpartition(":")
    return f"{path.rsplit('/', 1)[-1]}:{line}"


def _recompiles(seen: dict[str, Any]) -> list[dict[str, Any]]:
    return [x for x in seen.get("recompile_reasons") or [] if x.get("reason") != "first compilation of this frame"]


@symptom(
    "compile.enabled",
    "bool",
    "the script runs its model through torch.compile (a torch.compile or Module.compile call, or a model wrapped by one)",
)
def enabled(record: RunRecord) -> bool:
    return bool(record.compile.get("enabled")) or any(m.compiled for m in record.models)


@symptom(
    "compile.mode_reduce_overhead",
    "bool",
    "the compiled graphs run as CUDA graphs (mode reduce-overhead or max-autotune, or triton.cudagraphs)",
)
def mode_reduce_overhead(record: RunRecord) -> bool:
    return bool(record.compile.get("cudagraphs"))


@symptom(
    "compile.graph_breaks", "count", "graph breaks dynamo made (its counters, read at the end of the profiled window)"
)
def graph_breaks(record: RunRecord) -> int | None:
    return int(record.compile.get("graph_break_count", 0)) if record.compile else None


@symptom(
    "compile.recompiles",
    "count",
    "compilations after the warm-up, up to the end of the profiled window (recompilations)",
)
def recompiles(record: RunRecord) -> int | None:
    seen = record.compile
    return int(seen.get("compiles_after_warmup", 0)) if seen and seen.get("window_seen") else None


@symptom("compile.issues", "text", "the graph-break reasons and the recompilation reasons, counted")
def issues(record: RunRecord) -> str | None:
    seen = record.compile or {}
    parts: list[str] = []
    breaks = seen.get("graph_breaks") or []
    if breaks:
        parts.append("dynamo broke the graph: " + "; ".join(f"`{x['reason']}` ({x['count']}x)" for x in breaks[:3]))
    again = _recompiles(seen)
    if again:
        parts.append(
            "it recompiled after the warm-up: " + "; ".join(f"`{x['reason']}` ({x['count']}x)" for x in again[:3])
        )
    return "; ".join(parts) or None


@symptom("compile.sites", "text", "the user's lines where the graph breaks, and the functions that recompile")
def sites(record: RunRecord) -> str | None:
    seen = record.compile or {}
    out = [
        _short(x["site"]) + (f" `{x['code']}`" if x.get("code") else "") + " (graph break)"
        for x in (seen.get("graph_break_sites") or [])[:3]
    ]
    out += [
        f"{_short(x['site'])} in {x.get('function') or '?'} (recompiles)"
        for x in _recompiles(seen)[:2]
        if x.get("site")
    ]
    return "; ".join(out) or None
