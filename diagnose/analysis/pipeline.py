"""The analysis, end to end: trace and run record in, report out. No torch import, no files
but the trace it reads (``session`` finds a run directory's inputs and writes its outputs).

Contract: ``analyze(record, trace, options, source) -> Report`` for one process;
``analyse_rank(rank, record, trace, options) -> RankAnalysis`` in each rank's own process, then
``rank_report`` (its own report) and ``combine_ranks(lead, summaries, ...)`` (the job's report
from one rank's analysis and the others' summaries: ``lead_of`` picks the rank the others wait
for, whose trace alone the merging process reads; every other rank's only as its summary);
``analyze_ranks(ranks, options, source) -> Report`` for a run directory without summaries, and
``combine_from_traces`` where some left one (``traced(analyse)`` is how another rank's trace is
read, once for every caller);
``analyze_trace(trace, options) -> Report`` for a trace on its own. Every stage is a pure
function of the previous stage's value: timeline -> breakdown -> symptoms -> findings -> report.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from diagnose.analysis.measure.breakdown import Breakdown, calibrate_to_steady_state, compute_breakdown
from diagnose.analysis.measure.categories import EXPOSED
from diagnose.analysis.measure.collectives import CollectiveTime, collective_times
from diagnose.analysis.measure.profcost import correct_profiler_cost, estimate_cost_per_event
from diagnose.analysis.measure.ranks import RankSet, job_view, lead_rank, notable_ranks, summarize_rank
from diagnose.analysis.prediction.predict import Predictor, step_spread
from diagnose.analysis.prediction.replay import ReplayCheck, StepModel, build_model, host_code_scale, replay_check
from diagnose.analysis.prediction.uncertainty import StepSample, mean_uncertainty
from diagnose.analysis.report import build_report
from diagnose.analysis.symptoms import compute_symptoms
from diagnose.analysis.trace.forking import Beside
from diagnose.analysis.trace.timeline import (
    DEFAULT_MAX_TRACE_BYTES,
    StepMark,
    Timeline,
    TraceMeta,
    load_timeline,
    paused_gc,
)
from diagnose.analysis.verdict.findings import DEFAULT_LIMIT, Measurement, diagnose_symptoms
from diagnose.analysis.verdict.rules import Rule, load_rules
from diagnose.errors import TraceError, UsageError
from diagnose.record import RunRecord
from diagnose.report import Distributed, RankSummary, Report, convert


@dataclass(frozen=True)
class AnalysisOptions:
    """How one analysis runs, made once per command: the rules (loaded once, when made), how
    many findings the report shows, the largest trace to parse."""

    rules: tuple[Rule, ...]
    limit: int | None = DEFAULT_LIMIT
    #: refuse larger JSON (None: no cap; the trace is streamed and checked against the memory available)
    max_trace_bytes: int | None = DEFAULT_MAX_TRACE_BYTES
    #: what ``diagnose run``'s check measured, by rule id: it ranks above what is predicted
    measured: Mapping[str, Measurement] = field(default_factory=dict)

    @classmethod
    def load(
        cls,
        rules_dirs: Sequence[Path] = (),
        show_all: bool = False,
        max_trace_bytes: int | None = DEFAULT_MAX_TRACE_BYTES,
    ) -> AnalysisOptions:
        """Built-in rules plus those of ``rules_dirs``; a bad rule file fails here, before anything runs."""
        return cls(tuple(load_rules(list(rules_dirs))), None if show_all else DEFAULT_LIMIT, max_trace_bytes)


#: One rank's inputs: its run record and its trace (None when it wrote none).
RankInput = tuple[RunRecord, Path | None]


def analyze_trace(trace: Path, options: AnalysisOptions) -> Report:
    """A trace on its own (one a user's own torch.profiler code wrote, say), without a record."""
    if not Path(trace).exists():
        raise UsageError(
            f"no such run directory or trace: {trace}", hint="give a runs/<name>/ folder or a .pt.trace.json(.gz) file"
        )
    return analyze(None, Path(trace), options, {"kind": "trace"})


def analyze(
    record: RunRecord | None,
    trace: Path | None,
    options: AnalysisOptions,
    source: dict[str, Any],
    warnings: Sequence[str] = (),
) -> Report:
    """One process's run: what its record says and its trace shows."""
    window = _window(record, trace, options)
    record = window.record
    source = dict(source)
    if trace is not None:
        source["trace"] = str(trace)
        if window.breakdown is None and record is None:
            raise TraceError(
                f"{trace} holds no profiled events to analyse", hint="was the profiler running while the script worked?"
            )
    symptoms = compute_symptoms(window.breakdown, record, window.meta)
    # Rules run even with no profiled step: what the run record shows (an OOM, memory at
    # capacity, DataParallel) is still worth saying; rules about the trace cannot fire.
    return build_report(
        record=record,
        meta=window.meta,
        breakdown=window.breakdown,
        symptoms=symptoms,
        diagnosis=diagnose_symptoms(list(options.rules), symptoms, window.predictor, options.measured),
        source=source,
        limit=options.limit,
        warnings=[*warnings, *window.warnings],
    )


@dataclass
class RankAnalysis:
    """One rank's own analysis, made in its own process right after its window: what its report
    and its summary are built from (the breakdown stays in memory, never the timeline)."""

    rank: int
    #: None: a trace of the user's own, no run record (``analyze`` of a folder of rank traces)
    record: RunRecord | None
    trace: Path | None
    breakdown: Breakdown | None
    meta: TraceMeta | None
    warnings: list[str]
    #: the window's predictor (none without a replay model)
    predictors: list[Predictor]
    summary: RankSummary


def analyse_rank(
    rank: int, record: RunRecord | None, trace: Path | None, options: AnalysisOptions, warnings: Sequence[str] = ()
) -> RankAnalysis:
    """One rank's trace, analysed on its own: its breakdown and its summary (with no record, a
    trace of the user's own: what it shows alone)."""
    window = _window(record, trace, options, collectives=True)
    rank_record = window.record  # the record given, its sync time attributed (None: none given)
    backend = window.meta.backend if window.meta is not None else None
    summary = summarize_rank(rank, rank_record, window.breakdown, dict(window.collectives), backend)
    summary.trace = trace.name if trace is not None else None
    predictors = [window.predictor] if window.predictor is not None else []
    return RankAnalysis(
        rank, rank_record, trace, window.breakdown, window.meta, [*warnings, *window.warnings], predictors, summary
    )


def rank_report(
    analysis: RankAnalysis, options: AnalysisOptions, source: dict[str, Any], rank_set: RankSet | None = None
) -> Report:
    """A rank's report: its own diagnosis; with ``rank_set`` (every rank's summary), the job's
    report, with what only the ranks together show (a straggler, unequal data, the backend)."""
    a = analysis
    warnings = list(a.warnings)
    source = {**source, "rank": a.rank}
    if a.trace is not None:
        source["trace"] = str(a.trace)
    if rank_set is not None:
        present = sorted(s.rank for s in rank_set.summaries)
        missing = sorted(set(range(max(present) + 1)) - set(present))
        if missing:
            warnings.append(f"no record from rank(s) {missing}: did they fail, or not finish?")
        source["ranks"] = present
    symptoms = compute_symptoms(a.breakdown, a.record, a.meta, rank_set)
    predictor = a.predictors[0] if a.predictors else None
    report = build_report(
        record=a.record,
        meta=a.meta,
        breakdown=a.breakdown,
        symptoms=symptoms,
        diagnosis=diagnose_symptoms(list(options.rules), symptoms, predictor, options.measured),
        source=source,
        limit=options.limit,
        warnings=warnings,
    )
    if rank_set is not None:
        report.distributed = convert(
            {
                "world_size": len(rank_set.summaries),
                **job_view(rank_set.summaries),
                "ranks": [s.to_dict() for s in rank_set.summaries],
                "straggler": rank_set.straggler,
                "notable_ranks": {str(rank): why for rank, why in notable_ranks(rank_set.summaries, a.rank).items()},
            },
            Distributed,
        )
    return report


def combine_ranks(
    first: RankAnalysis, summaries: Sequence[RankSummary], options: AnalysisOptions, source: dict[str, Any]
) -> Report:
    """The job's report from one rank's analysis (the lead's: ``lead_of``) and every rank's
    summary (that rank's own included or not): no other rank's trace is read."""
    by_rank = {s.rank: s for s in summaries}
    by_rank[first.rank] = first.summary
    return rank_report(first, options, source, RankSet.of([by_rank[r] for r in sorted(by_rank)]))


def lead_of(
    analysis: RankAnalysis, summaries: Sequence[RankSummary], load: Callable[[int], RankAnalysis | None]
) -> RankAnalysis:
    """The analysis the job's report is built on: ``analysis`` (the merging rank's own), or the
    lead rank's (``ranks.lead_rank``: the one the others wait for), analysed by ``load`` from its
    trace, with a warning saying whose view the report is. ``load`` returns None where that
    trace is gone: the merging rank's own analysis then stands."""
    by_rank = {s.rank: s for s in summaries}
    by_rank[analysis.rank] = analysis.summary
    lead = lead_rank(list(by_rank.values()), analysis.rank)
    if lead == analysis.rank:
        return analysis
    other = load(lead)
    if other is None or other.breakdown is None:
        return analysis
    mine, theirs = by_rank[analysis.rank], by_rank[lead]
    other.warnings.append(
        f"the job's breakdown and findings are rank {lead}'s, the rank the others wait for: rank {analysis.rank} waited at "
        f"collectives {mine.communication_exposed_ms or 0:.1f} ms a step, rank {lead} {theirs.communication_exposed_ms or 0:.1f} ms"
    )
    return other


def analyze_ranks(ranks: dict[int, RankInput], options: AnalysisOptions, source: dict[str, Any]) -> Report:
    """A distributed run whose ranks left no summaries (a run directory of an older diagnose):
    each rank's trace analysed in turn, one at a time, and only its summary kept."""
    return combine_from_traces(
        sorted(ranks), lambda rank: analyse_rank(rank, *ranks[rank], options), {}, options, source
    )


def combine_from_traces(
    ranks: Sequence[int],
    analyse: Callable[[int], RankAnalysis | None],
    saved: Mapping[int, RankSummary],
    options: AnalysisOptions,
    source: dict[str, Any],
) -> Report:
    """The job's report where this process reads the traces itself: the first rank's analysed
    (``analyse``), every other rank's saved summary (``saved``) or, where it left none, its
    trace analysed in turn and only its summary kept; then the lead rank's trace where it is
    not the first (``lead_of``)."""
    first = analyse(min(ranks))
    if first is None:
        raise UsageError(f"rank {min(ranks)} left no record to analyse")
    summaries = [first.summary]
    for rank in sorted(ranks):
        if rank == first.rank:
            continue
        other = saved[rank] if rank in saved else _summary_of(analyse(rank))
        if other is not None:
            summaries.append(other)
    return combine_ranks(lead_of(first, summaries, traced(analyse)), summaries, options, source)


def _summary_of(analysis: RankAnalysis | None) -> RankSummary | None:
    return analysis.summary if analysis is not None else None


def traced(analyse: Callable[[int], RankAnalysis | None]) -> Callable[[int], RankAnalysis | None]:
    """``lead_of``'s ``load``: another rank's analysis from its own trace, None where it left no
    record or no trace (its summary then stands for it)."""

    def load(rank: int) -> RankAnalysis | None:
        analysis = analyse(rank)
        return analysis if analysis is not None and analysis.trace is not None else None

    return load


@dataclass(frozen=True)
class Window:
    """What the analysis reads off one process's profiled window: its breakdown corrected to
    the steady state (None without a profiled step), the trace's metadata, the notes the reading
    left, the predictor of its fixes (None without a replay model), the communication by
    collective kind, and the run record with the trace's sync time attributed to its sites."""

    breakdown: Breakdown | None
    meta: TraceMeta | None
    record: RunRecord | None
    warnings: tuple[str, ...] = ()
    predictor: Predictor | None = None
    collectives: Mapping[str, CollectiveTime] = field(default_factory=dict)


def _window(
    record: RunRecord | None, trace: Path | None, options: AnalysisOptions, collectives: bool = False
) -> Window:
    """The trace's window, analysed: a new value (nothing passed in is changed), with the
    predictor of the window's fixes (``make_predictor``) where it has a replay model; with
    ``collectives``, the communication by collective kind."""
    if trace is None:
        # the runner's own note says why when the script did reach the window (its own profiler, ...)
        if (
            record is not None
            and record.status not in ("no_steps",)
            and record.completed_steps() <= record.plan.get("warmup", 0)
        ):
            return Window(None, None, record, ("no trace was written: the script ended before the profiled window",))
        return Window(None, None, record)
    with paused_gc():
        timeline = load_timeline(trace, max_bytes=options.max_trace_bytes)
        if not timeline.steps:
            return Window(
                None, timeline.meta, record, (f"the trace {trace.name} holds no events on a training thread",)
            )
        if record is not None and timeline.has_step_marks:
            timeline = replace(timeline, steps=recorded_steps(timeline.steps, record))
        # a large trace's breakdown is computed in a forked child while this process builds the
        # replay model, checks it and replays it unchanged for the predictions (the breakdown
        # comes back in kilobytes; the model would not)
        side = Beside(partial(compute_breakdown, timeline), fork=timeline.meta.event_count >= PARALLEL_MIN_EVENTS)
        predictor = None
        try:
            breakdown = None if side.forked else side.result()
            model = build_model(timeline)
            predictor = make_predictor(model, record, timeline.dataloader_kinds) if model is not None else None
            if predictor is not None and side.forked and predictor.check.reproduces:
                predictor.baseline  # noqa: B018 - replayed now, beside the breakdown
            if breakdown is None:
                breakdown = side.result()
        finally:
            side.cancel()
        if predictor is not None:  # the bootstrap resamples the profiled steps' own breakdown
            predictor = predictor.with_sample(step_sample(breakdown))
        steady = _steady_step_us(record)
        if steady is not None:
            steady_wait = record.steady_data_wait_share() if record is not None else None
            breakdown = calibrate_to_steady_state(breakdown, steady, steady_data_wait=steady_wait)
        elif breakdown.has_gpu:  # no step timed with the profiler off: estimate what profiling cost
            breakdown = correct_profiler_cost(breakdown, estimate_cost_per_event(timeline).per_event_us)
        if record is not None and record.sync_sites:
            record = replace(record, sync_sites=attribute_sync_time(record, timeline))
        return Window(
            breakdown,
            timeline.meta,
            record,
            no_training_note(breakdown),
            predictor,
            collective_times(timeline) if collectives else {},
        )


#: what a window with no backward pass and no optimizer step is said to be
NO_TRAINING = (
    "the profiled window holds no backward pass and no optimizer step: an inference, evaluation or benchmark loop, "
    "not a training step; the findings speak of a training loop and apply to the loop that was profiled"
)


def no_training_note(breakdown: Breakdown) -> tuple[str, ...]:
    """``NO_TRAINING`` where neither a backward nor an optimizer step ran in the window (public
    inference and benchmark traces read as training loops), else nothing."""
    phases = breakdown.phase_share
    trained = phases.get("backward", 0.0) > 0 or phases.get("optimizer", 0.0) > 0
    return () if trained or not breakdown.steps else (NO_TRAINING,)


def recorded_steps(marks: Sequence[StepMark], record: RunRecord) -> list[StepMark]:
    """The trace's step marks as the run record counted the steps. A script that ends inside
    the profiled window leaves a last mark that runs on to the profiler's stop: whatever the
    script did after its last step (teardown, a checkpoint's gather, ``destroy_process_group()``)
    is in it. Only the record's profiled steps are steps, and the last of them ends where the
    record's step ended (its optimizer step), so that no training-loop figure holds the
    teardown. A window the script did not end inside keeps its marks as they are."""
    plan = record.window_plan() if record.plan else None
    if plan is None or not marks or record.completed_steps() >= plan.window_end:
        return list(marks)
    last = plan.warmup + record.profiled_steps  # the first step the record did not complete
    kept = [m for m in marks if m.number < last]
    if not kept:
        return list(marks)
    durations = record.step_durations()
    tail = kept[-1]
    if tail.number < len(durations):
        end = min(tail.end, tail.start + durations[tail.number] * 1e6)
        kept[-1] = tail._replace(end=end)
    return kept


#: a timeline of at least this many events has its breakdown computed in a forked child beside
#: its replay model (``forking.Beside``; the predictions' own threshold is
#: ``predict.PARALLEL_MIN_MODEL``): below it a fork costs more than it saves
PARALLEL_MIN_EVENTS = 200_000


def make_predictor(model: StepModel, record: RunRecord | None, loader_kinds: Mapping[str, int]) -> Predictor:
    """The predictor of a run's fixes: its replay model, checked against the measured window,
    with the host scaled to the steady step, the step-to-step spread and the uncertainty of the
    mean step (``uncertainty.mean_uncertainty``: the floor a change must beat), of the steady
    steps where timed, else of the profiled ones. ``loader_kinds``: the DataLoader iterators the trace names
    (``Timeline.dataloader_kinds``), which say, for a trace alone, whether the data waits are
    the main thread's own loading."""
    if _loads_in_main_thread(record, loader_kinds):
        model = replace(model, traced_fetches=True)  # its data waits are traced loading code
    check = replay_check(model)
    steady_durations: list[float] = []
    if record is not None and record.timed_steps and record.plan:
        steady_durations = record.steady_durations()
    durations = steady_durations if len(steady_durations) >= 2 else list(model.step_durations_us)
    steady = _steady_step_us(record)
    return Predictor(
        model,
        check,
        host_code_scale(model, check, steady),
        step_spread(durations),
        gpu_stretch(model, check, steady),
        mean_uncertainty=mean_uncertainty(durations),
    )


def step_sample(breakdown: Breakdown) -> StepSample:
    """The profiled steps as the bootstrap resamples them: each one's length and exposed time
    per category (the breakdown's, as profiled)."""
    steps = breakdown.steps
    return StepSample(
        tuple(s.duration_us for s in steps), {cat: tuple(s.exposed.get(cat, 0.0) for s in steps) for cat in EXPOSED}
    )


#: the most a host-ahead window's replayed step is stretched: beyond it the steps hold more than
#: the GPU work the window missed (a slower phase the window did not see)
MAX_GPU_STRETCH = 1.5


def gpu_stretch(model: StepModel, check: ReplayCheck, steady_step_us: float | None) -> float:
    """A host-ahead window's GPU-paced step over its replayed step (1 otherwise): the GPU work a
    step holds that the window did not. Once the launch queue is full the GPU paces every step,
    and only the window's first steps, which found it drained, are shorter: the window's median
    step is the paced one (fp32_transformer on an H100: 32.7, 78.8, 127.5, 127.5 and 127.8 ms,
    against 127.4 ms steady). Never more than the steady step, where one was timed; not the
    steady step itself, whose mean also holds what is not GPU work (a loader's periodic stalls:
    pageable_copies with pinned copies, 10.3 ms a profiled step against a 22.3 ms steady mean)."""
    if check.mode != "host ahead" or not model.steps or check.replayed_us <= 0:
        return 1.0
    paced = statistics.median(model.step_durations_us)
    if steady_step_us:
        paced = min(paced, steady_step_us)
    return min(MAX_GPU_STRETCH, max(1.0, paced * model.steps / check.replayed_us))


def _loads_in_main_thread(record: RunRecord | None, kinds: Mapping[str, int]) -> bool:
    """The window's batches came from a DataLoader without workers: the run record says so, or,
    for a trace alone, the only DataLoader iterator the trace names is the single-process one."""
    if record is not None:
        loader = record.train_loader()
        return loader is not None and loader.num_workers == 0 and loader.fetches_in_window > 0
    return bool(kinds) and "multi" not in kinds


def _steady_step_us(record: RunRecord | None) -> float | None:
    """Mean step time with the profiler off, from the timed steps of the run (``steady_mean_s``)."""
    steady = record.steady_mean_s() if record is not None else None
    return steady * 1e6 if steady else None


def attribute_sync_time(record: RunRecord, timeline: Timeline) -> list[dict[str, Any]]:
    """Blocked time per sync site, per profiled step. The sync debug warnings came in the same
    order as the trace's synchronising calls on the main thread: when their counts agree, each
    call's duration goes to its site; otherwise (a trimmed trace) the total is shared by count."""
    in_steps = [s for s in timeline.syncs if any(m.start <= s.start < m.end for m in timeline.steps)]
    steps = record.profiled_steps or len(timeline.steps) or 1
    sites = [dict(s) for s in record.sync_sites]
    by_index = {s.get("index"): s for s in sites}
    if record.sync_sequence and len(record.sync_sequence) == len(in_steps):
        totals: dict[int, float] = {}
        for index, call in zip(record.sync_sequence, in_steps, strict=True):
            totals[index] = totals.get(index, 0.0) + (call.end - call.start)
        for index, us in totals.items():
            if index in by_index:
                by_index[index]["blocked_ms_per_step"] = round(us / 1000 / steps, 4)
                by_index[index]["blocked_from"] = "matched"
    else:
        per_step_us = sum(c.end - c.start for c in in_steps) / max(len(timeline.steps), 1)
        for site in sites:
            site["blocked_ms_per_step"] = round(per_step_us * site["share_of_syncs"] / 1000, 4)
            site["blocked_from"] = "shared by count"
    return sites[:8]
