"""The analysis path, end to end: trace and run record in, report out. No torch import.

Contract: ``analyze_path(path, ...) -> Report`` for a run directory or a bare trace file.
Every stage is a pure function of the previous stage's value:
timeline -> breakdown -> symptoms -> findings -> report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from diagnose.analysis.breakdown import Breakdown, calibrate_to_steady_state, compute_breakdown
from diagnose.distributed import rank_records, rank_trace
from diagnose.errors import TraceError, UsageError
from diagnose.analysis.findings import DEFAULT_LIMIT, diagnose_symptoms
from diagnose.analysis.predict import Predictor, step_spread
from diagnose.analysis.replay import StepModel, build_model, host_code_scale, replay_check
from diagnose.record import RunRecord, WindowPlan
from diagnose.analysis.report import Report, build_report
from diagnose.analysis.rules import Rule, load_rules
from diagnose.analysis.ranks import RankSet, job_samples_per_s, summarize_rank
from diagnose.analysis.symptoms import compute_symptoms
from diagnose.analysis.timeline import DEFAULT_MAX_TRACE_BYTES, Timeline, TraceMeta, load_timeline, paused_gc

RUN_JSON = "run.json"
REPORT_JSON = "report.json"
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz", ".json", ".json.gz")


@dataclass
class AnalysisOptions:
    rules_dirs: tuple[Path, ...] = ()
    show_all: bool = False
    #: refuse larger JSON (None: no cap; the trace is streamed and checked against the memory available)
    max_trace_bytes: int | None = DEFAULT_MAX_TRACE_BYTES

    @property
    def limit(self) -> int | None:
        return None if self.show_all else DEFAULT_LIMIT


def find_traces(run_dir: Path) -> list[Path]:
    """Trace files of a run directory, oldest first (one per rank in a distributed run)."""
    traces = [p for p in run_dir.iterdir() if p.is_file() and p.name.endswith((".pt.trace.json", ".pt.trace.json.gz"))]
    return sorted(traces, key=lambda p: p.name)


def analyze_path(path: Path, options: AnalysisOptions, rules: list[Rule] | None = None) -> Report:
    path = Path(path)
    if not path.exists():
        raise UsageError(f"no such run directory or trace: {path}", hint="give a runs/<name>/ folder or a .pt.trace.json(.gz) file")
    if path.is_dir():
        return analyze_run_dir(path, options, rules)
    return analyze_trace(path, options, rules)


def analyze_run_dir(run_dir: Path, options: AnalysisOptions, rules: list[Rule] | None = None) -> Report:
    ranks = rank_records(run_dir)
    if ranks:
        return analyze_ranks(run_dir, ranks, options, rules)
    run_json = run_dir / RUN_JSON
    traces = find_traces(run_dir)
    if not run_json.exists() and not traces:
        raise UsageError(f"{run_dir} holds neither run.json nor a trace", hint="is it a diagnose run directory?")
    record = RunRecord.load(run_json) if run_json.exists() else None
    warnings: list[str] = []
    trace = traces[-1] if traces else None
    if len(traces) > 1:
        warnings.append(f"{len(traces)} traces in the run directory; analysed {trace.name if trace else ''}")
    return _analyze(record, trace, options, rules, {"kind": "run", "run_dir": str(run_dir)}, warnings)


def analyze_trace(trace: Path, options: AnalysisOptions, rules: list[Rule] | None = None) -> Report:
    return _analyze(None, trace, options, rules, {"kind": "trace"}, [])


def analyze_ranks(run_dir: Path, ranks: dict[int, Path], options: AnalysisOptions, rules: list[Rule] | None = None) -> Report:
    """A distributed run: every rank analysed, side by side; the report is rank 0's diagnosis
    plus what only the ranks together show (a straggler, unbalanced data, the backend)."""
    rules = rules if rules is not None else load_rules(list(options.rules_dirs))
    analysed = {}
    first_models: list[StepModel] = []
    for rank, path in sorted(ranks.items()):
        record = RunRecord.load(path)
        trace = rank_trace(run_dir, rank)
        warnings: list[str] = []
        models: list[StepModel] = []
        analysed[rank] = (record, trace, *_breakdown(record, trace, options, warnings, models), warnings)
        if rank == min(ranks):
            first_models = models
    rank_set = RankSet.of([summarize_rank(rank, record, bd) for rank, (record, _, bd, _, _) in analysed.items()])
    first = min(analysed)
    record, trace, breakdown, meta, warnings = analysed[first]
    missing = sorted(set(range(max(analysed) + 1)) - set(analysed))
    if missing:
        warnings.append(f"no record from rank(s) {missing}: did they fail, or not finish?")
    source = {"kind": "run", "run_dir": str(run_dir), "ranks": sorted(analysed)}
    if trace is not None:
        source["trace"] = str(trace)
    symptoms = compute_symptoms(breakdown, record, meta, rank_set)
    predictor = make_predictor(first_models, record, breakdown)
    report = build_report(
        record=record, meta=meta, breakdown=breakdown, symptoms=symptoms, diagnosis=diagnose_symptoms(rules, symptoms, predictor),
        source=source, limit=options.limit, warnings=warnings,
    )
    report.distributed = {
        "world_size": len(analysed),
        "job_samples_per_s": job_samples_per_s(rank_set.summaries),
        "ranks": [s.to_dict() for s in rank_set.summaries],
        "straggler": rank_set.straggler,
    }
    return report


def _breakdown(
    record: RunRecord | None, trace: Path | None, options: AnalysisOptions, warnings: list[str], models: list[StepModel] | None = None
) -> tuple[Breakdown | None, TraceMeta | None]:
    """The trace's breakdown, corrected to the run's steady state (None without a profiled step).
    ``models`` receives the window's replay model, when there is one."""
    if trace is None:
        if record is not None and record.status not in ("no_steps",):
            warnings.append("no trace was written: the script ended before the profiled window")
        return None, None
    with paused_gc():
        timeline = load_timeline(trace, max_bytes=options.max_trace_bytes)
        if not timeline.steps:
            warnings.append(f"the trace {trace.name} holds no events on a training thread")
            return None, timeline.meta
        breakdown = compute_breakdown(timeline)
        if models is not None:
            model = build_model(timeline)
            if model is not None:
                models.append(model)
        steady = _steady_step_us(record)
        if steady is not None:
            breakdown = calibrate_to_steady_state(breakdown, steady)
        if record is not None and record.sync_sites:
            record.sync_sites = attribute_sync_time(record, timeline)
    return breakdown, timeline.meta


def _analyze(
    record: RunRecord | None,
    trace: Path | None,
    options: AnalysisOptions,
    rules: list[Rule] | None,
    source: dict,
    warnings: list[str],
) -> Report:
    rules = rules if rules is not None else load_rules(list(options.rules_dirs))
    models: list[StepModel] = []
    breakdown, meta = _breakdown(record, trace, options, warnings, models)
    if trace is not None:
        source["trace"] = str(trace)
        if breakdown is None and record is None:
            raise TraceError(f"{trace} holds no profiled events to analyse", hint="was the profiler running while the script worked?")
    symptoms = compute_symptoms(breakdown, record, meta)
    # Rules run even with no profiled step: what the run record shows (an OOM, memory at
    # capacity, DataParallel) is still worth saying; rules about the trace cannot fire.
    diagnosis = diagnose_symptoms(rules, symptoms, make_predictor(models, record, breakdown))
    return build_report(
        record=record,
        meta=meta,
        breakdown=breakdown,
        symptoms=symptoms,
        diagnosis=diagnosis,
        source=source,
        limit=options.limit,
        warnings=warnings,
    )


def make_predictor(models: list[StepModel], record: RunRecord | None, breakdown: Breakdown | None) -> Predictor | None:
    """The predictor of a run's fixes: its replay model, checked against the measured window,
    with the host scaled to the steady step, and the step-to-step spread (steady steps where
    timed, else the profiled ones)."""
    if not models:
        return None
    model = models[0]
    check = replay_check(model)
    steady_durations: list[float] = []
    if record is not None and record.timed_steps and record.plan:
        steady_durations = record.durations_between(WindowPlan(**record.plan).first_timed, record.timed_steps)
    durations = steady_durations if len(steady_durations) >= 2 else list(model.step_durations_us)
    return Predictor(model, check, host_code_scale(model, check, _steady_step_us(record)), step_spread(durations))


def _steady_step_us(record: RunRecord | None) -> float | None:
    """Mean step time with the profiler off, from the timed steps of the run."""
    if record is None or not record.timed_seconds or not record.timed_steps:
        return None
    return record.timed_seconds / record.timed_steps * 1e6


def attribute_sync_time(record: RunRecord, timeline: Timeline) -> list[dict]:
    """Blocked time per sync site, per profiled step. The sync debug warnings came in the same
    order as the trace's synchronising calls on the main thread: when their counts agree, each
    call's duration goes to its site; otherwise (a trimmed trace) the total is shared by count."""
    in_steps = [s for s in timeline.syncs if any(m.start <= s.start < m.end for m in timeline.steps)]
    steps = record.profiled_steps or len(timeline.steps) or 1
    sites = [dict(s) for s in record.sync_sites]
    by_index = {s.get("index"): s for s in sites}
    if record.sync_sequence and len(record.sync_sequence) == len(in_steps):
        totals: dict[int, float] = {}
        for index, call in zip(record.sync_sequence, in_steps):
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
