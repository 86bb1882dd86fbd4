"""The whole run (``diagnose watch``): where its wall-clock went, and what each shift cost.

Every symptom here reads ``analysis.measure.wholerun.account(record)`` and is absent for a run that was
not watched (``diagnose run`` profiles a window and stops), so the WHOLE rules never fire there.
Shares are of the whole wall-clock, from the process's start to the script's end.
"""

from __future__ import annotations

from typing import Any

from diagnose.analysis.measure.wholerun import Accounting, account
from diagnose.analysis.symptoms.registry import symptom
from diagnose.record import RunRecord


def accounting_of(record: RunRecord) -> Accounting | None:
    """The record's accounting, computed once: the symptoms read it once per profiled step too."""
    cached = record.__dict__.get("_whole_accounting")
    if cached is None or cached[0] is not record.whole:
        cached = (record.whole, account(record))
        record.__dict__["_whole_accounting"] = cached
    return cached[1]


def _shift(record: RunRecord, name: str) -> dict[str, Any] | None:
    acc = accounting_of(record)
    return acc.shifts.get(name) if acc is not None else None


def _share(record: RunRecord, bucket: str) -> float | None:
    acc = accounting_of(record)
    return acc.share(bucket) if acc is not None else None


def _seconds(record: RunRecord, bucket: str) -> float | None:
    acc = accounting_of(record)
    return acc.seconds.get(bucket, 0.0) if acc is not None else None


@symptom("whole.watched", "bool", "the whole run was watched (diagnose watch)")
def watched(record: RunRecord) -> bool | None:
    return True if accounting_of(record) is not None else None


@symptom("whole.wall_s", "s", "the whole run's wall-clock, from the process's start to the script's end")
def wall_s(record: RunRecord) -> float | None:
    acc = accounting_of(record)
    return acc.wall_s if acc is not None else None


@symptom("whole.goodput", "share", "training steps' time over the whole wall-clock (goodput)")
def goodput(record: RunRecord) -> float | None:
    return _share(record, "train")


@symptom("whole.named_share", "share", "the wall-clock that lands in a named bucket (all but unexplained stalls)")
def named_share(record: RunRecord) -> float | None:
    acc = accounting_of(record)
    return acc.named_share if acc is not None else None


@symptom(
    "whole.startup_share",
    "share",
    "start-up before the first step (and the first steps' extra time), of the wall-clock",
)
def startup_share(record: RunRecord) -> float | None:
    return _share(record, "startup")


@symptom(
    "whole.stall_share",
    "share",
    "unexplained stalls inside steps (time over 3x the neighbouring steps' median that no span names), of the wall-clock",
)
def stall_share(record: RunRecord) -> float | None:
    return _share(record, "stalls")


@symptom(
    "whole.slow_windows",
    "count",
    "later profiled windows taken at a slow step (their traces in watch/ of the run directory)",
)
def slow_windows(record: RunRecord) -> int | None:
    acc = accounting_of(record)
    if acc is None:
        return None
    return sum(1 for w in acc.windows if str(w.get("reason", "")).startswith("slow step"))


@symptom(
    "whole.contention_share",
    "share",
    "stalls while the process's threads waited for a CPU that other processes held, of the whole wall-clock",
)
def contention_share(record: RunRecord) -> float | None:
    return _share(record, "contention")


@symptom("whole.gc_share", "share", "Python's garbage collections of 5 ms or more, of the whole wall-clock")
def gc_share(record: RunRecord) -> float | None:
    return _share(record, "gc")


@symptom("whole.eval_share", "share", "evaluation, of the whole wall-clock")
def eval_share(record: RunRecord) -> float | None:
    return _share(record, "eval")


@symptom("whole.eval_s", "s", "evaluation over the whole run")
def eval_s(record: RunRecord) -> float | None:
    return _seconds(record, "eval")


@symptom("whole.eval_count", "count", "evaluation passes over the run")
def eval_count(record: RunRecord) -> int | None:
    shift = _shift(record, "eval")
    return shift["count"] if shift else None


@symptom("whole.eval_name", "text", "what ran the evaluation, in the framework's own terms")
def eval_name(record: RunRecord) -> str | None:
    shift = _shift(record, "eval")
    return shift["names"][0] if shift and shift["names"] else None


@symptom("whole.checkpoint_share", "share", "checkpoint saves, of the whole wall-clock")
def checkpoint_share(record: RunRecord) -> float | None:
    return _share(record, "checkpoint")


@symptom("whole.checkpoint_s", "s", "checkpoint saves over the whole run")
def checkpoint_s(record: RunRecord) -> float | None:
    return _seconds(record, "checkpoint")


@symptom("whole.checkpoint_count", "count", "checkpoint saves over the run")
def checkpoint_count(record: RunRecord) -> int | None:
    shift = _shift(record, "checkpoint")
    return shift["count"] if shift else None


@symptom("whole.checkpoint_mean_s", "s", "how long one checkpoint save blocks the loop")
def checkpoint_mean_s(record: RunRecord) -> float | None:
    shift = _shift(record, "checkpoint")
    return shift["mean_s"] if shift else None


@symptom("whole.checkpoint_every_steps", "count", "steps between checkpoint saves (median)")
def checkpoint_every_steps(record: RunRecord) -> float | None:
    shift = _shift(record, "checkpoint")
    return shift["every_steps"] if shift else None


@symptom("whole.checkpoint_name", "text", "what saved the checkpoints, in the framework's own terms")
def checkpoint_name(record: RunRecord) -> str | None:
    shift = _shift(record, "checkpoint")
    return shift["names"][0] if shift and shift["names"] else None


@symptom("whole.epoch_starts", "count", "DataLoader iterators started after the first (epoch starts)")
def epoch_starts(record: RunRecord) -> int | None:
    shift = _shift(record, "data_startup")
    return shift["count"] - 1 if shift else None


@symptom(
    "whole.epoch_start_share",
    "share",
    "time from iter(loader) to its first batch at every epoch start after the first, of the wall-clock",
)
def epoch_start_share(record: RunRecord) -> float | None:
    acc = accounting_of(record)
    shift = _shift(record, "data_startup")
    return shift["after_first_s"] / acc.wall_s if shift and acc is not None and acc.wall_s > 0 else None


@symptom("whole.epoch_start_mean_s", "s", "time from iter(loader) to its first batch, per epoch")
def epoch_start_mean_s(record: RunRecord) -> float | None:
    shift = _shift(record, "data_startup")
    return shift["mean_s"] if shift else None


@symptom(
    "whole.loader_persistent", "bool", "every epoch-starting DataLoader keeps its workers (persistent_workers=True)"
)
def loader_persistent(record: RunRecord) -> bool | None:
    shift = _shift(record, "data_startup")
    return shift["persistent_workers"] if shift else None


@symptom("whole.loader_workers", "count", "worker processes of the DataLoaders that started epochs (the most)")
def loader_workers(record: RunRecord) -> int | None:
    shift = _shift(record, "data_startup")
    return shift["num_workers"] if shift else None


@symptom("whole.compile_share", "share", "torch.compile's compilations, of the whole wall-clock")
def compile_share(record: RunRecord) -> float | None:
    return _share(record, "compile")


@symptom("whole.recompiles", "count", "recompilations over the whole run (dynamo gave a reason)")
def recompiles(record: RunRecord) -> int | None:
    shift = _shift(record, "compile")
    return shift["recompiles"] if shift else None


@symptom("whole.recompile_share", "share", "recompilations, of the whole wall-clock")
def recompile_share(record: RunRecord) -> float | None:
    acc = accounting_of(record)
    shift = _shift(record, "compile")
    return shift["recompile_s"] / acc.wall_s if shift and acc is not None and acc.wall_s > 0 else None


@symptom("whole.recompile_reason", "text", "dynamo's most frequent recompilation reason, with its count")
def recompile_reason(record: RunRecord) -> str | None:
    shift = _shift(record, "compile")
    if not shift or not shift["reasons"]:
        return None
    top = shift["reasons"][0]
    return f"{top['reason']} ({top['count']}x)"


@symptom(
    "whole.slowdown",
    "ratio",
    "the training step late in the run over early (medians of the last and first fifths after warm-up)",
)
def slowdown(record: RunRecord) -> float | None:
    shift = _shift(record, "slowdown")
    return shift["ratio"] if shift else None


@symptom("whole.slowdown_share", "share", "time the steps lost against the early pace, of the wall-clock")
def slowdown_share(record: RunRecord) -> float | None:
    acc = accounting_of(record)
    shift = _shift(record, "slowdown")
    return shift["lost_s"] / acc.wall_s if shift and acc is not None and acc.wall_s > 0 else None


#: the late step over the early one from which the steps count as slowed (WHOLE005's line)
SLOWED = 1.3


@symptom(
    "whole.creep_lost_share",
    "share",
    "time the steps lost as they slowed (late over 1.3x early), of the wall-clock; none where they kept their pace",
)
def creep_lost_share(record: RunRecord) -> float | None:
    """What creeping memory cost in time: only where the steps measurably slowed. Where they
    kept their pace the cost is unknown (the risk is an out-of-memory error later), not zero."""
    acc = accounting_of(record)
    shift = _shift(record, "slowdown")
    if not shift or shift["ratio"] < SLOWED or acc is None or acc.wall_s <= 0:
        return None
    return float(shift["lost_s"]) / acc.wall_s


@symptom("whole.step_early_ms", "ms", "the median training step early in the run (first fifth after warm-up)")
def step_early_ms(record: RunRecord) -> float | None:
    shift = _shift(record, "slowdown")
    return shift["early_ms"] if shift else None


@symptom("whole.step_late_ms", "ms", "the median training step late in the run (last fifth)")
def step_late_ms(record: RunRecord) -> float | None:
    shift = _shift(record, "slowdown")
    return shift["late_ms"] if shift else None


def _memory(record: RunRecord) -> dict[str, Any] | None:
    """GPU memory where the run used a GPU, else host memory."""
    memory = _shift(record, "memory") or {}
    return memory.get("gpu") or memory.get("host")


@symptom(
    "whole.memory_growth",
    "share",
    "memory growth over the run, of where it started (GPU allocated on a GPU run, else host RSS)",
)
def memory_growth(record: RunRecord) -> float | None:
    memory = _memory(record)
    return memory["growth"] if memory else None


@symptom("whole.memory_growth_gb", "GB", "memory growth over the run (GPU allocated on a GPU run, else host RSS)")
def memory_growth_gb(record: RunRecord) -> float | None:
    memory = _memory(record)
    return (memory["end_bytes"] - memory["start_bytes"]) / 1e9 if memory else None


@symptom("whole.memory_rising", "share", "the share of memory samples (twice a second) that rose over the one before")
def memory_rising(record: RunRecord) -> float | None:
    memory = _memory(record)
    return memory["rising_share"] if memory else None


@symptom("whole.memory_hours_to_capacity", "h", "when the memory trend reaches capacity, in hours from the run's end")
def memory_hours_to_capacity(record: RunRecord) -> float | None:
    memory = _memory(record)
    return memory.get("hours_to_capacity") if memory else None


@symptom("whole.memory_kind", "text", "which memory the memory symptoms read: GPU allocated or host RSS")
def memory_kind(record: RunRecord) -> str | None:
    memory = _shift(record, "memory") or {}
    return "GPU memory allocated" if memory.get("gpu") else "host memory (RSS)" if memory.get("host") else None
