"""The source lines to quote with a finding (``text`` symptoms), from line attribution
(``diagnose.runtime.line_attribution``): where the syncs, copies, model, optimizer and data loading are."""

from __future__ import annotations

import re
from typing import Any

from diagnose.analysis.measure.breakdown import Breakdown
from diagnose.analysis.symptoms.registry import Known, symptom
from diagnose.record import RunRecord


def _short(site: str) -> str:
    path, _, line = site.rpartition(":")
    return f"{path.rsplit('/', 1)[-1]}:{line}"


def _quote(lines: list[dict[str, Any]], n: int = 2, where: bool = False) -> str:
    return "; ".join(
        f"{_short(x['site'])} `{x['code']}`"
        + (
            f" ({x['where']}, {x['share'] * 100:.0f}% of the step)"
            if where
            else f" ({x['share'] * 100:.0f}% of the step)"
        )
        for x in lines[:n]
    )


def _profiled_steps(record: RunRecord, steps: Breakdown | None) -> int:
    # the sync counts cover the whole profiled window (a trimmed trace may hold fewer steps)
    return record.profiled_steps or (len(steps.steps) if steps is not None else 1)


def _sampled(record: RunRecord, where: str | None = None) -> list[dict[str, Any]]:
    lines = (record.host_samples or {}).get("lines", [])
    return lines if where is None else [x for x in lines if x["where"] == where]


@symptom("lines.sync", "text", "the source lines that synchronise, with their counts per step")
def sync_lines(record: RunRecord, steps: Breakdown | None = None) -> str:
    n = _profiled_steps(record, steps)

    def site_text(site: dict[str, Any]) -> str:
        blocked = site.get("blocked_ms_per_step")
        time = f", {blocked:.3g} ms/step blocked" if blocked is not None else ""
        return f"{_short(site['site'])} `{site['code']}` ({site['kind']}, {site['count'] / n:.3g}/step{time})"

    return "; ".join(site_text(s) for s in record.sync_sites[:3])


#: at most this many sync sites go into the ``unsync`` what-if (the ones that sync most)
UNSYNC_SITES = 8


@symptom(
    "lines.sync_sites",
    "text",
    "the script's sync sites as FILE:LINE joined by + (most frequent first; not blocking copies): the unsync knob's value",
)
def sync_sites(record: RunRecord) -> str:
    sites = [s for s in record.sync_sites if s["kind"] != "blocking copy"]
    return "+".join(_short(s["site"]) for s in sites[:UNSYNC_SITES])


@symptom("lines.h2d", "text", "the lines that copy to the GPU from pageable memory")
def h2d_lines(record: RunRecord, steps: Breakdown | None = None) -> str:
    copies = [s for s in record.sync_sites if s["kind"] == "blocking copy"]
    if copies:
        n = _profiled_steps(record, steps)
        return "; ".join(f"{_short(s['site'])} `{s['code']}` ({s['count'] / n:.3g}/step)" for s in copies[:2])
    return _quote([x for x in _sampled(record) if ".to(" in x["code"] or ".cuda(" in x["code"]])


@symptom("lines.model", "text", "the lines that run the model (forward and backward)")
def model_lines(record: RunRecord) -> str:
    return _quote([x for x in _sampled(record) if x["where"] in ("model", "backward")], where=True)


@symptom("lines.optimizer", "text", "where the optimizer is built and stepped")
def optimizer_lines(record: RunRecord) -> str:
    built = [
        f"{_short(o.created_at)} ({o.name}, {o.implementation}, {o.param_tensors} tensors)"
        for o in record.optimizers
        if o.created_at
    ]
    stepped = _sampled(record, "optimizer")
    return "; ".join(built + ([_quote(stepped, 1)] if stepped else []))


@symptom(
    "lines.host_other",
    "text",
    "the user's lines where the main thread spends the time outside DataLoader, model and optimizer",
)
def host_other_lines(record: RunRecord) -> str:
    return "; ".join(
        f"{_short(x['site'])} `{x['code']}` ({x['share'] * 100:.0f}% of the step)"
        for x in _sampled(record, "other")[:3]
    )


@symptom(
    "host.samples",
    "count",
    "samples the line sampler took of the main thread over the profiled window: what a share read off "
    "its lines rests on (a share p of n samples is uncertain by about sqrt(p (1 - p) / n))",
)
def host_samples(record: RunRecord) -> float | None:
    n = (record.host_samples or {}).get("samples")
    return float(n) if n else None


@symptom(
    "host.other_user_share",
    "share",
    "share of step time the main thread spends in the user's own code outside DataLoader, model and optimizer",
)
def other_user_share(record: RunRecord) -> float | None:
    other = _sampled(record, "other")
    return sum(x["share"] for x in other) if other else None


@symptom("lines.data", "text", "the lines where data loading spends its time (main thread or workers)")
def data_lines(record: RunRecord) -> str:
    if not _sampled(record):  # no main-thread samples: line attribution was off
        return ""
    worker_lines = (record.worker_samples or {}).get("lines")
    if worker_lines:
        return "; ".join(
            f"{_short(x['site'])} `{x['code']}` ({x['activity']}, {x['share'] * 100:.0f}% of worker time)"
            for x in worker_lines[:3]
        )
    return "; ".join(
        f"{_short(x['site'])} `{x['code']}` ({x['share'] * 100:.0f}% of the step)" for x in _sampled(record, "data")[:3]
    )


@symptom(
    "host.queue_wait_share",
    "share",
    "share of the main thread's samples spent on the script's own lines outside DataLoader, model and "
    "optimizer waiting on a queue, pipe or event of another thread or process: the script's own producers "
    "of batches not keeping up with the step",
)
def queue_wait_share(record: RunRecord) -> float | None:
    """The sampled lines in other code (where the script's loop, not torch, runs) whose samples
    waited in the standard library for another thread or process (``waits``, counted by the line
    sampler from the stack below the line: ``multiprocessing``'s queues and pipes, ``queue``,
    ``threading``'s conditions). SASRec's three sampler processes: ``return
    self.result_queue.get()``, 26% of the main thread's samples. None where nothing waited so."""
    samples = (record.host_samples or {}).get("samples")
    waited = sum(x.get("waits", 0) for x in _sampled(record, "other"))
    return waited / samples if samples and waited else None


#: a line that loops over something in Python: a comprehension or a ``for`` statement
_ITERATES = re.compile(r"\bfor\b.+\bin\b")


@symptom(
    "host.batch_build_share",
    "share",
    "share of the profiled steps the main thread spent on lines of the script's own functions (outside the "
    "training loop's, the model, backward and optimizer) that loop in Python, where it builds each batch "
    "by hand, a sample at a time, and copies it from the host: host work that a larger batch multiplies",
    uses=("batch.option", "h2d.bytes_per_step"),
)
def batch_build_share(record: RunRecord, known: Known) -> float | None:
    """Where no DataLoader fed the steps (``batch.option``: the samples were counted from the
    script's batch option) and each step copies its inputs from the host (``h2d.bytes_per_step``):
    the sampled lines of the main thread that loop (``_ITERATES``) in a function of the script
    other than the training loop's, outside the model, backward and optimizer. nanoGPT's
    ``get_batch`` builds its batch so: ``torch.stack([torch.from_numpy(data[i:i+block_size]
    .astype(np.int64)) for i in ix])``; its other lines (opening the memory map, the copy to the
    GPU) cost the same at any batch and are not counted. The loop's function is that of the line
    sampled most in backward and of the one sampled most in the optimizer (the sampler's innermost
    line of the script there: the calls of backward and step). None where nothing says which
    function is the loop's, or no such line was sampled."""
    if not known.get("batch.option") or not known.get("h2d.bytes_per_step"):
        return None
    lines = _sampled(record)
    loop = {
        max(at, key=lambda x: x.get("samples", x["share"])).get("function")
        for where in ("backward", "optimizer")
        if (at := [x for x in lines if x["where"] == where])
    }
    if not loop:
        return None
    share = sum(
        x["share"]
        for x in lines
        if x["where"] == "other" and x.get("function") not in loop and _ITERATES.search(x.get("code") or "")
    )
    return share or None
