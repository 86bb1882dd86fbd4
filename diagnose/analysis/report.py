"""Stage 8: the report built from the analysis, the typed value every renderer reads.

Contract: ``build_report(...) -> Report``. The types are ``diagnose/report.py``'s (the ground
floor: the contract between the analysis and the renderers); this module fills them.
``Report.to_dict()`` is what ``report.json`` holds (schema ``diagnose.report/2``, documented
field by field in docs/report-schema.md; ``Report.load`` also reads schema 1 files, upgrading
them). A report can be re-rendered from ``report.json`` alone (``diagnose report RUN_DIR``).

``experiments`` is filled by ``diagnose verify`` and ``diagnose sweep``::

    {"kind": "sweep" | "verify",
     "parameters": ["num_workers"],           # the knobs varied, in order
     "rows": [{"label": "num_workers=4", "knobs": {"num_workers": 4},
               "status": "ok" | "oom" | "failed" | "no effect",
               "steps_per_s": 12.1, "samples_per_s": 774.0, "median_step_ms": 82.6,
               "gpu_busy": 0.91, "peak_reserved_bytes": 1.2e10, "speedup": 1.8,
               "top_exposed": {"category": "gpu_backward", "share": 0.41},
               "run_dir": "runs/.../num_workers=4"}],
     "plot": "sweep.png"}                      # when matplotlib made one
"""

from __future__ import annotations

import datetime as _dt
import itertools
import math
import statistics
from collections.abc import Sequence
from typing import Any

from diagnose.analysis.bare import not_seen_line, trace_only
from diagnose.analysis.measure.breakdown import Breakdown, per_step_stats, reference_step_us
from diagnose.analysis.measure.categories import EXPOSED, HOST_EXPOSED, exposed_labels
from diagnose.analysis.measure.hardware_limits import distance_to_limits, limits_to_dict
from diagnose.analysis.symptoms import Symptoms
from diagnose.analysis.trace.timeline import TraceMeta
from diagnose.analysis.verdict.findings import Diagnosis
from diagnose.jupyter import html_frame
from diagnose.record import NOISY_P90_OVER_MEDIAN, FrameworkInfo, RunRecord, WindowPlan, option_words
from diagnose.report import (
    REPORT_SCHEMA,
    WINDOW_FIGURES_AS_SYMPTOMS,
    Distributed,
    ErrorInfo,
    Finding,
    Limits,
    PerStep,
    Ranking,
    Replay,
    Report,
    RunInfo,
    ShortRun,
    Source,
    Status,
    Step,
    StepStat,
    StepTimeline,
    Symptom,
    Target,
    Throughput,
    Timing,
    TraceOnly,
    Whole,
    Window,
    WindowGrowth,
    convert,
    sanitized,
    upgrade_from_v1,
)
from diagnose.report import (
    Breakdown as BreakdownSection,
)
from diagnose.stats import quantile
from diagnose.units import gain_words, percent

#: the report's types moved to the ground floor (diagnose/report.py); these names stay
#: importable from here for code written against earlier versions
__all__ = [
    "REPORT_SCHEMA",
    "WINDOW_FIGURES_AS_SYMPTOMS",
    "Distributed",
    "Report",
    "build_report",
    "html_frame",
    "sanitized",
    "upgrade_from_v1",
]


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


# a window whose p90 step exceeds its median by NOISY_P90_OVER_MEDIAN is reported as noisy; the
# profiled window grows while its steps are that noisy (record.py holds the one definition)


#: the steps are cut into this many consecutive blocks to tell how much their mean wanders
MEAN_BLOCKS = 3


def mean_spread(durations_s: list[float], blocks: int = MEAN_BLOCKS) -> float | None:
    """Half the range of the means of ``blocks`` consecutive blocks of the steps, over the mean
    of all: how far the mean of a window of such steps moves (batch means). The steps' own
    p10-p90 says how steps differ, not how their mean does: a GPU-bound loop whose host runs
    ahead times bimodal steps (a few ms, then a hundred) whose mean hardly moves. None with fewer
    than two steps a block."""
    n = len(durations_s)
    if n < 2 * blocks:
        return None
    bounds = [round(i * n / blocks) for i in range(blocks + 1)]
    means = [sum(durations_s[a:b]) / (b - a) for a, b in itertools.pairwise(bounds)]
    total = sum(durations_s) / n
    return (max(means) - min(means)) / 2 / total if total > 0 else None


def _timing(durations_s: list[float], samples: list[int] | None, total_s: float | None = None) -> Timing:
    """Mean with its p10-p90 spread, median, steps/s and samples/s of a run of steps; ``noisy``
    when the p90 step is over ``NOISY_P90_OVER_MEDIAN`` times the median; ``mean_spread``: how
    far the mean moves (``mean_spread``)."""
    if not durations_s:
        return Timing(steps=0)
    total = total_s if total_s is not None else sum(durations_s)
    median = statistics.median(durations_s)
    p90 = quantile(durations_s, 0.9)
    out = Timing(
        steps=len(durations_s),
        median_step_ms=_round(median * 1000, 3),
        p10_step_ms=_round(quantile(durations_s, 0.1) * 1000, 3),
        p90_step_ms=_round(p90 * 1000, 3),
        mean_step_ms=_round(total / len(durations_s) * 1000, 3),
        noisy=bool(median > 0 and p90 > NOISY_P90_OVER_MEDIAN * median),
        mean_spread=_round(mean_spread(durations_s)),
        steps_per_s=_round(len(durations_s) / total if total > 0 else None, 3),
    )
    if samples and len(samples) >= len(durations_s) and all(samples[: len(durations_s)]) and total > 0:
        out.samples_per_s = _round(sum(samples[: len(durations_s)]) / total, 2)
    return out


STATUS_MESSAGES = {
    "completed": "the script ran to its end",
    "stopped": "diagnose stopped the script after measuring (--no-stop lets it finish)",
    "exited": "the script exited with code {code}",
    "failed": "the script raised {error}",
    "interrupted": "interrupted (Ctrl-C); what was captured is analysed",
    "terminated": "terminated ({signal}); what was captured is analysed",
    "crashed": "{error}; what was saved until then is analysed",
    "oom": "the script ran out of GPU memory: {error}",
    "no_steps": "no training step was found",
    "not_run": "the script was not run: {error}",
    "trace": "a trace file analysed on its own",
}


def build_report(
    *,
    record: RunRecord | None,
    meta: TraceMeta | None,
    breakdown: Breakdown | None,
    symptoms: Symptoms,
    diagnosis: Diagnosis | None,
    source: dict[str, Any],
    limit: int | None,
    warnings: list[str] | None = None,
) -> Report:
    report = Report(
        created_at=_dt.datetime.now().astimezone().isoformat(timespec="seconds"), source=convert(source, Source)
    )
    report.warnings = list(warnings or [])
    _status(report, record)
    if record is not None:
        _from_record(report, record)
    if meta is not None:
        _from_meta(report, meta)
        if record is None and breakdown is not None and breakdown.steps:
            bare = trace_only(meta, symptoms)
            report.trace_only = convert(bare, TraceOnly)
            report.warnings.append(not_seen_line(bare))
    _throughput(report, record, breakdown)
    if breakdown is not None and breakdown.steps:
        report.breakdown = breakdown_section(breakdown)
        report.warnings.extend(breakdown.notes)
    report.symptoms = {name: _symptom(s) for name, s in symptoms.items()}
    limits = limits_to_dict(distance_to_limits(breakdown, record, meta), record)
    report.limits = None if limits is None else convert(limits, Limits)
    report.whole = whole_run_section(record)
    report.warnings.extend(_steadiness_notes(report))
    if diagnosis is not None:
        findings = [convert(f.to_dict(), Finding) for f in diagnosis.findings]
        shown = findings if limit is None else findings[:limit]
        report.findings = shown
        report.findings_not_shown = len(findings) - len(shown)
        report.next_steps = [convert(f.to_dict(), Finding) for f in diagnosis.next_steps]
        report.considered = list(diagnosis.considered)
        report.warnings.extend(diagnosis.skipped)
        report.borderline = list(diagnosis.borderline)
        report.replay = None if diagnosis.replay is None else convert(diagnosis.replay, Replay)
        report.ranking = None if diagnosis.ranking is None else convert(diagnosis.ranking, Ranking)
        # not healthy while the GPU idles a large share of the step, whatever could be predicted
        report.healthy = diagnosis.healthy and report.breakdown is not None and dominant_idle(breakdown) is None
        report.verdict = _verdict(report, diagnosis, breakdown)
    return report


#: the input pipeline is called bursty when data waits hold at least this share of the window
#: while at most ``BURSTY_WAITING_STEPS`` of the steps waited
BURSTY_DATA_WAIT = 0.05
BURSTY_WAITING_STEPS = 0.5


def _steadiness_notes(report: Report) -> list[str]:
    """Say when the numbers vary too much from step to step to be read as one figure."""
    notes = []
    for window, timing in (("steady state", report.throughput.steady), ("profiled window", report.throughput.profiled)):
        if timing and timing.noisy:
            notes.append(
                f"noisy {window}: the p90 step ({timing.p90_step_ms:.1f} ms) is over {NOISY_P90_OVER_MEDIAN}x the median "
                f"({timing.median_step_ms:.1f} ms); the mean, its spread and the verdict may differ on a rerun"
            )
    waiting, wait = report.symptom_value("data.waiting_steps"), report.symptom_value("exposed.data_wait")
    if waiting is not None and wait is not None and wait >= BURSTY_DATA_WAIT and waiting <= BURSTY_WAITING_STEPS:
        notes.append(
            f"bursty input pipeline: {percent(waiting, 0)} of the steps waited for data, for {percent(wait, 0)} of the "
            "window's time; the others found their batch ready (periodic long waits: a slow worker, a slow shard, "
            "or workers that fall behind and catch up)"
        )
    return notes


def _symptom(symptom: Any) -> Symptom:
    out = Symptom(value=_round(symptom.value, 6), unit=symptom.unit, description=symptom.description)
    if symptom.spread is not None:  # the p10-p90 of the steps, centred on the value
        out.low, out.high = _round(symptom.low, 6), _round(symptom.high, 6)
    return out


def _status(report: Report, record: RunRecord | None) -> None:
    state = record.status if record is not None else "trace"
    code = record.exit_code if record is not None else 0
    err = (record.error or {}) if record is not None else {}
    error_text = f"{err.get('type', '')}: {err.get('message', '')}".strip(": ") if err else ""
    signal_name = str(err.get("message") or "") if str(err.get("message") or "").startswith("SIG") else "SIGTERM"
    message = STATUS_MESSAGES.get(state, state).format(
        code=code,
        error=(err.get("message") if state == "crashed" else error_text) or "an exception",
        signal=signal_name,
    )
    if record is not None:
        steps = record.completed_steps()
        if record.whole.get("boundaries_s"):  # diagnose watch counted every step, not the window's only
            steps = max(steps, (len(record.whole["boundaries_s"]) - 1) * 2 ** int(record.whole.get("merged_pairs", 0)))
        plan = record.plan
        if state in ("completed", "exited", "failed", "interrupted", "terminated", "oom", "crashed") and steps:
            message += f" after {steps} steps"
            if record.profiled_steps < plan.get("steps", 0):
                message += f"; {record.profiled_steps} of the {plan.get('steps')} planned steps were profiled"
    report.status = Status(
        state=state,  # type: ignore[arg-type]  # the runner's states are the Literal's (tests/test_schema.py)
        exit_code=code,
        message=message,
        error=convert(err, ErrorInfo) if err else None,
    )


def whole_run_section(record: RunRecord | None) -> Whole | None:
    """The whole run's accounting (``diagnose watch``), or None for a run not watched."""
    from diagnose.analysis.symptoms.wholerun import accounting_of

    accounting = accounting_of(record) if record is not None else None
    return convert(accounting.to_dict(), Whole) if accounting is not None else None


def _from_record(report: Report, record: RunRecord) -> None:
    short = short_run(record)
    report.run = RunInfo(
        target=convert(record.target, Target) if record.target else None,
        command=record.command,
        started_at=record.started_at,
        ended_at=record.ended_at,
        wall_s=_round(record.wall_s, 3),
        plan=record.plan,
        step_mode=record.step_mode,
        steps_seen=record.completed_steps(),
        startup_s=_round(record.startup_seconds(record.plan.get("warmup", 0)), 3),
        profiled_steps=record.profiled_steps,
        window_growth=convert(record.window_growth, WindowGrowth) if record.window_growth else None,
        short_run=convert(short, ShortRun) if short else None,
        after_last_step_s=_round(record.after_last_step_seconds(), 3),
        knobs=record.knobs,
        trace_files=record.trace_files,
    )
    report.environment = dict(record.environment)
    loader = record.train_loader()
    report.dataloader = _loader_dict(loader) if loader is not None else None
    report.dataloaders = [_loader_dict(d) for d in record.dataloaders]
    report.optimizers = [vars(o) for o in record.optimizers]
    report.models = [vars(m) for m in record.models]
    report.flags = record.flags
    mem = dict(record.memory)
    cap = mem.get("capacity_bytes")
    if cap:
        mem["peak_allocated_share"] = _round(mem.get("peak_allocated_bytes", 0) / cap)
        mem["peak_reserved_share"] = _round(mem.get("peak_reserved_bytes", 0) / cap)
    report.memory = mem
    report.sync_sites = record.sync_sites
    report.host_hotspots = record.host_samples
    report.worker_hotspots = record.worker_samples
    report.warnings.extend(record.warnings)
    grown = growth_note(record.window_growth)
    if grown:
        report.warnings.append(grown)
    report.warnings.extend(short_run_notes(short))
    tail = after_last_step_note(record)
    if tail:
        report.warnings.append(tail)


def short_run(record: RunRecord) -> dict[str, Any] | None:
    """What a script with fewer steps than the plan needs left out (None when it had them, or
    diagnose stopped it before they ran out): ``steps`` (the script's, as its settings promised
    or as it ran), ``needed`` (the plan as asked: warm-up, window, export and timed steps),
    ``profiled``/``planned_profiled`` and ``timed``/``planned_timed``, ``source`` (what said how
    many steps it makes) and ``more_steps``: the option of the script that gives more, with
    the value that gives enough (None: it has none diagnose recognises)."""
    if not record.plan:
        return None
    fit = record.plan_fit or {}
    asked = WindowPlan(**fit["asked"]) if isinstance(fit.get("asked"), dict) else WindowPlan(**record.plan)
    ran_out = record.status in ("completed", "exited") and record.completed_steps() < asked.last_boundary
    cut = isinstance(fit.get("steps"), int) and fit["steps"] < asked.last_boundary  # not only the growth capped
    if not cut and not ran_out:
        return None
    steps = record.completed_steps() if ran_out or not isinstance(fit.get("steps"), int) else fit["steps"]
    loader = record.train_loader()
    return {
        "steps": steps,
        "needed": asked.last_boundary,
        "source": fit.get("source"),
        "profiled": record.profiled_steps,
        "planned_profiled": asked.steps,
        "timed": record.timed_steps,
        "planned_timed": asked.timed,
        "more_steps": more_steps(
            record.length_options,
            asked.last_boundary,
            loader.batches() if loader is not None else None,
            steps,
            record.frameworks,
        ),
    }


def more_steps(
    options: list[dict[str, Any]],
    needed: int,
    loader_batches: int | None,
    made: int,
    frameworks: Sequence[FrameworkInfo] = (),
) -> str | None:
    """The script's own setting that gives ``needed`` steps, spelled as the script spells it
    (``--max_iters 36``, ``--epochs 3``, ``TrainingArguments(num_train_epochs=9)``), for a
    script that made ``made`` steps; None when it has none diagnose recognises. A step count
    that did not limit the run (``--iters 0``: run the epochs; a value over the steps made) is
    not the one to raise."""
    for option in options:
        value = option.get("value")
        if option.get("kind") == "steps" and isinstance(value, (int, float)) and 0 < value <= made + 1:
            return option_words(option, needed)
    for option in options:
        if option.get("kind") == "epochs" and loader_batches:
            return option_words(option, -(-needed // loader_batches))
    for f in frameworks:
        steps, epochs = f.settings.get("max_steps"), f.settings.get("num_train_epochs", f.settings.get("max_epochs"))
        name = "num_train_epochs" if "num_train_epochs" in f.settings else "max_epochs"
        if isinstance(steps, int) and not isinstance(steps, bool) and 0 < steps <= made + 1:
            return f"{f.cls}(max_steps={needed})"
        if isinstance(epochs, (int, float)) and not isinstance(epochs, bool) and epochs > 0 and made > 0:
            per_epoch = loader_batches or made / epochs
            return f"{f.cls}({name}={math.ceil(needed / per_epoch)})"
    return None


def short_run_notes(short: dict[str, Any] | None) -> list[str]:
    """The lines that say what a short script left out, how sure the diagnosis is then, and
    how to give it more steps."""
    if not short:
        return []
    said = f" ({short['source']})" if short.get("source") else ""
    left = [f"profiled {short['profiled']} of {short['planned_profiled']} steps"]
    left.append(
        f"timed {short['timed']} of {short['planned_timed']} with the profiler off"
        if short["timed"]
        else f"timed none of {short['planned_timed']} with the profiler off (figures are the profiled window's)"
    )
    how = (
        f"run it with {short['more_steps']}"
        if short.get("more_steps")
        else (
            f"run a longer job (at least {short['needed']} steps; diagnose stops it once measured, --no-stop lets it finish)"
        )
    )
    return [
        f"short script: it makes {short['steps']} steps{said}, fewer than the {short['needed']} the plan needs "
        f"(warm-up, profiled window, timed steps): {', '.join(left)}",
        f"less sure: the diagnosis rests on {short['profiled']} profiled and {short['timed']} timed steps; a rerun may rank "
        f"the findings differently. For the whole plan, {how}",
    ]


#: the time after the last step is reported when it is over this many median steps
LONG_TAIL_STEPS = 2.0


def after_last_step_note(record: RunRecord) -> str | None:
    """One line when the script ran long after its last step (teardown, a checkpoint,
    evaluation): that time is in no step and feeds no finding."""
    tail = record.after_last_step_seconds()
    durations = record.step_durations()
    if tail is None or not durations or tail <= LONG_TAIL_STEPS * statistics.median(durations):
        return None
    return (
        f"after its last step the script ran {tail * 1000:.0f} ms more (teardown, checkpoint, evaluation): "
        "in no step and in no finding"
    )


#: why a grown window ended, as the note says it
_GROWTH_ENDS = {
    "steady": "it ended once they no longer did",
    "bound": "it ended at --max-steps",
    "budget": "it ended at the time budget",
    "script end": "the script ended first",
}


def growth_note(growth: dict[str, Any]) -> str | None:
    """One line saying that the profiled window grew, from what to what, and why (None when it
    did not grow)."""
    planned, steps = growth.get("planned_steps"), growth.get("steps")
    if not isinstance(planned, int) or not isinstance(steps, int) or steps <= planned:
        return None
    ratio, mean = growth.get("p90_over_median"), growth.get("mean_uncertainty")
    why = f" (p90 {ratio:.1f}x the median" if isinstance(ratio, (int, float)) else ""
    if why and isinstance(mean, (int, float)):
        why += f", their mean uncertain by ±{mean:.0%}"
    why += ")" if why else ""
    end = _GROWTH_ENDS.get(str(growth.get("ended_by")), "")
    return (
        f"the profiled window grew from {planned} to {steps} steps (at most {growth.get('max_steps')}): "
        f"the profiled steps varied widely{why}" + (f"; {end}" if end else "")
    )


def _loader_dict(loader: Any) -> dict[str, Any]:
    d = dict(vars(loader))
    d.pop("loader_id", None)
    return d


def _from_meta(report: Report, meta: TraceMeta) -> None:
    env = report.environment
    if meta.device_name and not env.get("device_name"):
        env["device_name"] = meta.device_name
    if meta.device_memory_bytes and not report.memory.get("capacity_bytes"):
        report.memory.setdefault("capacity_bytes", meta.device_memory_bytes)
    if meta.compute_capability and not env.get("compute_capability"):
        env["compute_capability"] = "{}.{}".format(*meta.compute_capability)
    if meta.cuda_driver_version and not env.get("cuda_driver_api"):
        env["cuda_driver_api"] = meta.cuda_driver_version
    if report.source.trace_events is None:
        report.source.trace_events = meta.event_count


def _throughput(report: Report, record: RunRecord | None, breakdown: Breakdown | None) -> None:
    out = Throughput(
        batch_size=record.batch_size() if record else None, batch_from=record.samples_from if record else None
    )
    plan_warmup = record.plan.get("warmup", 0) if record else 0
    if breakdown is not None and breakdown.steps and breakdown.has_step_marks:
        durations = [s.duration_us / 1e6 for s in breakdown.steps]
        samples = None
        if record is not None:
            samples = record.samples_per_step[plan_warmup : plan_warmup + len(durations)]
        out.profiled = _timing(durations, samples)
    elif record is not None and record.profiled_steps:
        durations = record.durations_between(plan_warmup, record.profiled_steps)
        out.profiled = _timing(durations, record.samples_per_step[plan_warmup:])
    if record is not None and record.timed_seconds:
        left_out = record.steady_left_out()
        durations, samples = record.steady_durations(), record.steady_samples()
        out.steady = _timing(durations, samples, total_s=None if left_out else record.timed_seconds)
        if left_out:
            out.steady.left_out = left_out
        every = record.steady_left_out(every_turn=True)
        if every > left_out:  # turns the steady figures kept (short epochs): the figures without them
            out.turn_free = _timing(record.steady_durations(every_turn=True), record.steady_samples(every_turn=True))
            out.turn_free.left_out = every
    elif record is not None and record.completed_steps():
        out.steady = None
        out.note = "too few steps for the steady-state timing (profiler off); figures are from the profiled window"
    report.throughput = out


def breakdown_section(bd: Breakdown) -> BreakdownSection:
    steps = [
        Step(
            number=s.number,
            start_us=s.start_us,
            duration_ms=round(s.duration_us / 1000, 4),
            phases_ms={k: round(v / 1000, 4) for k, v in s.phases.items()},
            exposed_ms={k: round(v / 1000, 4) for k, v in s.exposed.items()},
            gpu_busy_ms=_round(s.gpu_busy_us / 1000, 4),
            kernels=s.kernel_count,
            median_kernel_us=_round(s.median_kernel_us, 3),
            h2d_pageable_bytes=s.h2d_pageable_bytes,
            h2d_pinned_bytes=s.h2d_pinned_bytes,
            h2d_copies=s.h2d_copies,
            d2h_bytes=s.d2h_bytes,
            syncs=s.sync_count,
            sync_blocked_ms=_round(s.sync_blocked_us / 1000, 4),
            syncs_by_kind=s.syncs_by_kind,
            matmul_ms={k: round(v / 1000, 4) for k, v in s.matmul_us.items()},
        )
        for s in bd.steps
    ]
    median_step = statistics.median([s.duration_us for s in bd.steps]) / 1000
    # The window's shares, GPU busy, kernels and syncs per step are symptoms (``exposed.<category>``,
    # ``phase.<phase>``, ``hidden.<phase>``, ``gpu.busy`` ...): the report keeps them there, once.
    return BreakdownSection(
        device="cuda" if bd.has_gpu else "cpu",
        median_step_timeline=convert(bd.timeline_strip, StepTimeline) if bd.timeline_strip else None,
        steps=steps,
        window=Window(
            total_ms=_round(bd.total_us / 1000, 3),
            median_step_ms=_round(median_step, 3),
            trace_exposed_share=(
                {k: round(bd.trace_exposed_share[k], 5) for k in EXPOSED} if bd.trace_exposed_share else None
            ),
            profiler_inflation=_round(bd.profiler_inflation, 4),
            # one statistic per table: the mean per step (= share x the step below) and the
            # p10-p90 range of the steps
            per_step=PerStep(
                statistic="mean",
                spread="p10-p90",
                exposed_step_ms=round(reference_step_us(bd, "exposed") / 1000, 4),
                exposed_basis="steady" if bd.trace_exposed_share is not None else "profiled",
                phase_step_ms=round(reference_step_us(bd, "phases") / 1000, 4),
                exposed=_per_step_stats(bd, "exposed"),
                phases=_per_step_stats(bd, "phases"),
            ),
            h2d_pinned_bytes_per_step=bd.median("h2d_pinned_bytes"),
        ),
    )


def _per_step_stats(bd: Breakdown, view: str) -> dict[str, StepStat]:
    return {
        key: StepStat(
            mean_ms=_round(stat.mean_us / 1000, 4),
            p10_ms=_round(stat.low_us / 1000, 4),
            p90_ms=_round(stat.high_us / 1000, 4),
        )
        for key, stat in per_step_stats(bd, view).items()
    }


#: an exposed share where the GPU idles (data, copies, syncs, host code, communication) this
#: large is never left unnamed by the verdict (issue 16: a trace with 95% data wait got "No
#: bottleneck found")
DOMINANT_IDLE_SHARE = 0.25


def dominant_idle(breakdown: Breakdown | None) -> tuple[str, float] | None:
    """The exposed category where a GPU run's GPU idles most, when that is at least
    ``DOMINANT_IDLE_SHARE`` of the step: (category, share); else None."""
    if breakdown is None or not breakdown.has_gpu:
        return None
    idle = {cat: breakdown.exposed_share.get(cat, 0.0) for cat in (*HOST_EXPOSED, "communication")}
    worst = max(idle, key=lambda cat: idle[cat])
    return (worst, idle[worst]) if idle[worst] >= DOMINANT_IDLE_SHARE else None


def _verdict(report: Report, diagnosis: Diagnosis, breakdown: Breakdown | None) -> str:
    if report.breakdown is None:
        if diagnosis.findings:
            return f"{diagnosis.findings[0].title} (no profiled step: the rest of the diagnosis needs one)."
        return "Nothing to diagnose: no profiled step."
    if diagnosis.findings:
        top = diagnosis.findings[0]
        if top.measured is not None:
            words = top.measured.words
        else:
            words = gain_words(top.predicted, top.gain)
            if top.predicted_low is not None and top.predicted_high is not None:
                words += f"; {top.predicted_low:.2f}x-{top.predicted_high:.2f}x"
        if top.dominant and top.measured is None:
            words += "; shown first: what it fixes holds most of the step"
        elif len(diagnosis.findings) > 1 and top.first_share is not None:
            words += f"; first in {top.first_share:.0%} of resamples"
        bound = f" ({words})" if words else ""
        if top.borderline:
            bound += "; borderline: its evidence lies within the steps' spread of the threshold, a rerun may differ"
        return f"{top.title}{bound}."
    assert breakdown is not None  # a report has a breakdown exactly when the analysis had one
    if not breakdown.has_gpu:
        shares = breakdown.exposed_share
        largest = max(EXPOSED, key=lambda cat: shares[cat])
        label = exposed_labels(on_gpu=False)[largest]
        run = (
            "CPU-only run"
            if breakdown.untraced_device is None
            else f"trace without {breakdown.untraced_device}'s activity"
        )
        return f"No rule fired on this {run}; the largest part of a step: {label} ({percent(shares[largest], 0)})."
    dominant = dominant_idle(breakdown)
    if dominant is not None:
        # a share this large is named even when no change is predicted to relieve it
        listed = "; what was considered is listed below" if diagnosis.considered else "; no rule names it"
        return (
            f"No change predicted to help beyond the run-to-run spread, though the GPU idles "
            f"{percent(dominant[1], 0)} of the step: {exposed_labels(on_gpu=True)[dominant[0]]}{listed}."
        )
    what = f"GPU busy {percent(breakdown.gpu_busy_share(), 0)} of the step"
    precision = report.symptom_value("gpu.reduced_precision_share")
    if precision is not None and precision >= 0.5:
        what += f", {percent(precision, 0)} of matmul time in bf16/fp16"
    if diagnosis.borderline:
        what += (
            f"; borderline: {len(diagnosis.borderline)} rule(s) would fire within the steps' spread, a rerun may differ"
        )
    return f"No bottleneck found: {what}."
