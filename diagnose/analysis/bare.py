"""What a trace on its own shows, and what it could not: the report's ``trace_only`` section.

Contract: ``trace_only(meta, symptoms) -> dict``; pure. Called for a trace analysed without its
run record (``diagnose analyze my_trace.json``). ``read_off`` lists what the analysis took from
the trace itself (the device, the DataLoader's iterator class, the optimizer's operators, the
threads, the profiler's own cost); ``not_seen`` names, in words, each thing a live run would
have measured that this trace does not carry, so that a reader knows which rules could not
speak.
"""

from __future__ import annotations

from typing import Any

from diagnose.analysis.symptoms import Symptoms
from diagnose.analysis.trace.timeline import TraceMeta


def trace_only(meta: TraceMeta, symptoms: Symptoms) -> dict[str, Any]:
    values = symptoms.values_by_name()
    read_off: dict[str, Any] = {}
    if meta.device_name:
        read_off["device"] = meta.device_name
    if values.get("dataloader.present"):
        workers = values.get("dataloader.num_workers")
        read_off["dataloader"] = (
            "num_workers=0 (single-process iterator)" if workers == 0 else "worker processes (multi-process iterator)"
        )
    if values.get("optimizer.present"):
        forloop = values.get("optimizer.forloop")
        impl = "unknown" if forloop is None else ("for-loop" if forloop else "foreach/fused")
        read_off["optimizer"] = {"class": symptoms.texts.get("optimizer.name"), "implementation": impl}
        if values.get("optimizer.param_tensors") is not None:
            read_off["optimizer"]["param_tensors"] = int(values["optimizer.param_tensors"])
    if meta.thread_names:
        read_off["threads"] = sorted(set(meta.thread_names.values()))
    not_seen = []
    if values.get("dataloader.present") and values.get("dataloader.num_workers") is None:
        not_seen.append("how many DataLoader workers, and how busy they are")
    if values.get("optimizer.present") and values.get("optimizer.param_tensors") is None:
        not_seen.append("how many parameter tensors the optimizer updates")
    not_seen += [
        "the step timed with the profiler off (the profiler's own cost is estimated instead)",
        "the CPU count",
        "the batch size and memory peaks",
        "the source lines behind syncs and host time",
        "the script's settings (TF32, cudnn.benchmark, channels_last, torch.compile)",
    ]
    return {"read_off": read_off, "not_seen": not_seen}


def not_seen_line(section: dict[str, Any]) -> str:
    return "the trace alone could not show: " + "; ".join(section["not_seen"]) + " (diagnose run measures them)"
