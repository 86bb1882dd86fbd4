"""What renderers show of a report, decided once: the presentation built on the typed report.

Contract: ``ReportView.from_report(report) -> ReportView``; pure. The report's own types
(``diagnose/report.py``: ``Finding``, ``Timing``, ``Step``, ``RankSummary``, ``ExperimentRow``
...) reach the renderers as they are; this module adds only what is presentation: the exposed
and phase tables, the labels (GPU or CPU wording), the median step's strips, which ranks a
large job's table lists, the straggler flag and the evidence rows' text. Numbers stay numbers;
how to print them is the renderer's choice, through ``diagnose.units``.

What the view decides for every renderer:

* which exposed categories to list (``listed``: at least ``MIN_SHARE_LISTED`` of the window) and
  which ones occur at all (``present``: time in some step);
* the straggler is shown when the rules said so: when the DIST003 finding fired;
* an evidence row's text is its symptom's value formatted by its unit.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from diagnose.analysis.measure.categories import (
    PHASE_LABELS,
    PHASES,
    STEP_MODE_LABELS,
    exposed_categories,
    exposed_labels,
)
from diagnose.renderers.limitsview import LimitsView, limits_view
from diagnose.renderers.wholeview import WholeView, whole_view
from diagnose.report import (
    ExperimentRow,
    Experiments,
    Finding,
    PerStep,
    RankSummary,
    Replay,
    Report,
    RunInfo,
    Step,
    StepStat,
    StepTimeline,
    Straggler,
    Throughput,
    Timing,
)
from diagnose.stats import quantile
from diagnose.units import count, format_value, unsure_words

#: An exposed category is listed in the tables when it holds at least this share of the window.
MIN_SHARE_LISTED = 0.0005
#: The rule whose finding says that one rank holds the others back.
STRAGGLER_RULE = "DIST003"
#: Run states in which the script did what it should (the others failed, or were cut short).
OK_STATES = ("completed", "stopped", "trace")
DATALOADER_SETTINGS = ("num_workers", "pin_memory", "batch_size", "prefetch_factor", "persistent_workers", "drop_last")

Record = tuple[tuple[str, Any], ...]


def _record(mapping: Mapping[str, Any] | None) -> Record:
    return tuple((mapping or {}).items())


# --- header, status, throughput, memory ----------------------------------------------------------


@dataclass(frozen=True)
class StatusView:
    state: str
    message: str
    ok: bool
    step_mode: str | None  # how steps were counted, in words
    error_type: str | None
    error_message: str | None
    traceback: str | None


@dataclass(frozen=True)
class MemoryView:
    peak_allocated_bytes: float | None
    peak_reserved_bytes: float | None
    capacity_bytes: float | None
    peak_allocated_share: float | None
    peak_reserved_share: float | None


# --- the breakdown --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExposedRow:
    category: str
    label: str
    mean_ms: float  # per step: share x the table's step (BreakdownView.exposed_step_ms)
    p10_ms: float | None  # the spread of the steps (None in a report from before it was kept)
    p90_ms: float | None
    share: float  # of the window
    listed: bool  # holds at least MIN_SHARE_LISTED of the window
    present: bool  # some step has time in it


@dataclass(frozen=True)
class PhaseRow:
    phase: str
    label: str
    mean_ms: float  # per step: share x the profiled step (BreakdownView.phase_step_ms)
    p10_ms: float | None
    p90_ms: float | None
    share: float
    hidden_share: float | None  # behind GPU work; None on a CPU-only run


@dataclass(frozen=True)
class GpuCounters:
    busy_share: float | None
    kernels_per_step: float | None
    median_kernel_us: float | None
    h2d_pageable_bytes: float | None
    h2d_pinned_bytes: float | None
    syncs_per_step: float | None


@dataclass(frozen=True)
class Segment:
    """A stretch of one strip chart: a category or phase, its words and its time."""

    kind: str  # "exposed" or "phase"
    name: str
    label: str
    ms: float


@dataclass(frozen=True)
class MedianStep:
    """The median step as two strips: what limited it, and what the host thread did. In time
    order when the trace gave a timeline, else one segment per category in a fixed order."""

    number: int
    duration_ms: float
    in_time_order: bool
    exposed: tuple[Segment, ...]
    phases: tuple[Segment, ...]
    bins: int | None = None
    slice_ms: float | None = None


@dataclass(frozen=True)
class BreakdownView:
    on_gpu: bool
    steps: tuple[Step, ...]
    median_step_ms: float
    #: the step the exposed shares are shares of: "steady" (profiler off, calibrated) or "profiled"
    exposed_basis: str
    exposed_step_ms: float
    phase_step_ms: float  # the profiled window's mean step: phases are not calibrated
    exposed: tuple[ExposedRow, ...]  # every category, display order
    phases: tuple[PhaseRow, ...]
    categories: tuple[str, ...]  # the exposed categories this kind of run can have
    gpu: GpuCounters | None  # None on a CPU-only run
    median_step: MedianStep

    @property
    def listed(self) -> tuple[ExposedRow, ...]:
        return tuple(row for row in self.exposed if row.listed)

    @property
    def present(self) -> tuple[ExposedRow, ...]:
        return tuple(row for row in self.exposed if row.present)

    def share(self, category: str) -> float:
        return next(row.share for row in self.exposed if row.category == category)


# --- ranks, findings, experiments, configuration ------------------------------------------------


#: More ranks than this are not listed one by one: the table shows the first rank and the
#: notable ones (the slowest, the straggler, the outliers), and one line sums up the rest.
MAX_RANK_ROWS = 16


@dataclass(frozen=True)
class OtherRanks:
    """The ranks a large job's table leaves out, in one line."""

    count: int
    step_ms_p10: float | None
    step_ms_median: float | None
    step_ms_p90: float | None

    def text(self) -> str:
        if self.step_ms_median is None:
            return f"{self.count} other ranks, not listed"
        return (
            f"{self.count} other ranks, not listed: step {self.step_ms_median:.1f} ms median "
            f"(p10-p90 {self.step_ms_p10:.1f}-{self.step_ms_p90:.1f})"
        )


@dataclass(frozen=True)
class RanksView:
    world_size: int
    first_rank: int
    rows: tuple[RankSummary, ...]
    job_samples_per_s: float | None
    straggler: Straggler | None  # only when the straggler rule fired
    #: the rows the table lists: all of them up to MAX_RANK_ROWS, else the first and notable ranks
    shown: tuple[RankSummary, ...] = ()
    #: rank -> why it is listed (report.json distributed.notable_ranks)
    why: Mapping[int, str] = field(default_factory=dict)
    others: OtherRanks | None = None
    #: the rank whose breakdown and findings the report shows (the lead: the one the others wait
    #: for, else the first; report.json source.rank)
    lead_rank: int = 0


def spread_words(source: str | None) -> str:
    """Where a verify baseline's spread comes from, in words for the tables."""
    return {
        "repeats": "half the range of the baseline runs' means",
        "blocks": "one baseline run: half the range of the means of 3 blocks of its timed steps",
        "steps": "one baseline run: half the p10-p90 range of its timed steps",
        "rerun": "one baseline run: how far a rerun of the script may move its step (the diagnosis's estimate)",
    }.get(source or "", "")


@dataclass(frozen=True)
class DataLoaderView:
    settings: Record  # the settings that matter most, in DATALOADER_SETTINGS order
    created_at: str | None
    record: Record  # everything recorded


@dataclass(frozen=True)
class OptimizerRow:
    name: str
    param_tensors: int | None
    implementation: str | None


@dataclass(frozen=True)
class RunView:
    steps_seen: int | None
    profiled_steps: int | None
    trace_files: Any
    analysed_trace: str | None
    settings: Record  # the run as a settings table: target, command, plan ... (empty for a bare trace)


@dataclass(frozen=True)
class ConfigView:
    run: RunView
    source: Record
    environment: Record
    cpu_count: int | None
    dataloader: DataLoaderView | None
    dataloaders: tuple[Record, ...]
    optimizers: tuple[OptimizerRow, ...]
    optimizer_records: tuple[Record, ...]
    models: tuple[Record, ...]
    flags: Record


@dataclass(frozen=True)
class EvidenceRow:
    """A finding's evidence as shown: its symptom's value in its unit, with the steps' spread."""

    symptom: str
    value: float | None
    unit: str
    text: str  # the value in its unit
    description: str


# --- the whole -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportView:
    name: str
    device: str | None  # GPU name or "CPU only ..."; None when unknown
    versions: tuple[str, ...]
    status: StatusView
    verdict: str
    healthy: bool
    #: a window of no step is None here
    throughput: Throughput
    memory: MemoryView
    breakdown: BreakdownView | None
    ranks: RanksView | None
    findings: tuple[Finding, ...]
    next_steps: tuple[Finding, ...]
    findings_not_shown: int
    #: fixes that fired but were left out, predicted under the step-to-step spread: one line each
    considered: tuple[str, ...]
    #: rules that did not fire but would within the steps' spread: one line each
    borderline: tuple[str, ...]
    #: None unless the replay ran and measured a window
    replay: Replay | None
    experiments: Experiments | None
    config: ConfigView
    warnings: tuple[str, ...]
    diagnose_version: str
    schema: str
    created_at: str
    #: finding -> its evidence rows (``evidence(finding)``)
    evidence_rows: Mapping[int, tuple[EvidenceRow, ...]] = field(default_factory=dict)
    #: rule -> why diagnose run's check could not measure it (it timed out, failed, ran out of memory)
    check_failures: Mapping[str, str] = field(default_factory=dict)
    #: MFU, top kernels, roofline, memory by owner, OOM explanation (renderers/limitsview.py)
    limits: LimitsView | None = None
    #: the whole run's accounting (``diagnose watch``; renderers/wholeview.py)
    whole: WholeView | None = None

    @property
    def on_gpu(self) -> bool:
        return bool(self.breakdown and self.breakdown.on_gpu)

    @property
    def sweep_summary(self) -> bool:
        """The parent report of a sweep: its runs are its content, it has no step of its own (no
        throughput, breakdown or findings to show, nor to say are missing)."""
        return self.experiments is not None and self.experiments.kind == "sweep" and self.breakdown is None

    @property
    def labels(self) -> dict[str, str]:
        """The exposed categories' words for this run (GPU or CPU wording)."""
        return exposed_labels(self.on_gpu)

    def evidence(self, finding: Finding) -> tuple[EvidenceRow, ...]:
        """A finding's evidence as shown: each symptom's value formatted by its unit."""
        return self.evidence_rows.get(id(finding), ())

    def unsure(self, finding: Finding, world_size: int | None = None) -> str:
        """A finding's unsure line (``units.unsure_words``), with what the run's check met if it
        tried the finding and could not measure it."""
        return unsure_words(
            finding.check, finding.rule, finding.knobs, world_size, self.check_failures.get(finding.rule)
        )

    def top_label(self, row: ExperimentRow) -> str | None:
        """The words of an experiment's largest exposed category (None: not measured)."""
        category = row.top_exposed.category if row.top_exposed else None
        return self.labels.get(category, category) if category else None

    @classmethod
    def from_report(cls, report: Report) -> ReportView:
        # every renderer reads this view: no infinite number and no control character past here
        report = report.sanitized()
        labels = exposed_labels(report.on_gpu)
        findings = tuple(report.findings)
        next_steps = tuple(report.next_steps)
        return cls(
            name=_run_name(report),
            device=_device(report),
            versions=_versions(report.environment),
            status=_status(report),
            verdict=report.verdict,
            healthy=report.healthy,
            throughput=_throughput(report.throughput),
            memory=_memory(report.memory or {}),
            breakdown=_breakdown(report, labels) if report.breakdown else None,
            ranks=_ranks(report, findings),
            findings=findings,
            next_steps=next_steps,
            findings_not_shown=report.findings_not_shown,
            considered=tuple(report.considered),
            borderline=tuple(report.borderline),
            replay=report.replay if report.replay is not None and report.replay.checked else None,
            experiments=report.experiments if report.experiments is not None and report.experiments.rows else None,
            config=_config(report),
            warnings=tuple(report.warnings),
            diagnose_version=report.diagnose_version,
            schema=report.schema,
            created_at=report.created_at,
            evidence_rows={id(f): _evidence(f, report) for f in (*findings, *next_steps)},
            check_failures=_check_failures(report),
            limits=limits_view(report),
            whole=whole_view(report),
        )


def _check_failures(report: Report) -> dict[str, str]:
    """Rule -> why the run's check did not measure it: each of its experiments that ended with no
    speedup (failed, timed out, out of memory, not compared)."""
    check = report.ranking.check if report.ranking is not None else None
    out: dict[str, str] = {}
    for row in (check or {}).get("experiments") or []:
        if isinstance(row, dict) and row.get("rule") and row.get("speedup") is None:
            out[str(row["rule"])] = str(row.get("error") or row.get("verdict") or row.get("status") or "not measured")
    return out


def _run_name(report: Report) -> str:
    """The script's file name, the module's name, or the trace's or run directory's name."""
    target = report.run.target if report.run is not None else None
    name = (target.value if target else None) or report.source.trace or report.source.run_dir or "report"
    return str(name) if target is not None and target.kind == "module" else str(name).rstrip("/").rsplit("/", 1)[-1]


def _device(report: Report) -> str | None:
    env = report.environment
    if (report.breakdown and not report.on_gpu) or env.get("device") == "cpu":
        cores = (
            f"{env['cpu_count']} cores"
            if env.get("cpu_count")
            else "CPU count unknown: a bare trace does not record it"
        )
        return f"CPU only, no GPU used ({cores})"
    return env.get("device_name") or None


def _versions(env: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(
        f"{name} {env[key]}"
        for key, name in (("torch", "torch"), ("python", "Python"), ("driver", "driver"))
        if env.get(key)
    )


def _status(report: Report) -> StatusView:
    status = report.status
    mode = report.run.step_mode if report.run is not None else None
    error = status.error
    return StatusView(
        state=status.state,
        message=status.message,
        # a sweep is fine when at least one of its points ran (its exit code says so)
        ok=status.state in OK_STATES or (status.state == "sweep" and status.exit_code == 0),
        step_mode=STEP_MODE_LABELS.get(mode, mode) if mode else None,
        error_type=error.type if error else None,
        error_message=error.message if error else None,
        traceback=(error.traceback or None) if error else None,
    )


def batch_words(t: Throughput) -> str:
    """The batch as both renderers say it: its samples per step, and where they were counted."""
    source = f"the script's {t.batch_from}, no DataLoader" if t.batch_from else "found from the data"
    return f"{count(t.batch_size or 0)} samples per step ({source})"


def _throughput(throughput: Throughput) -> Throughput:
    """The report's throughput, a window of no step as None."""

    def measured(timing: Timing | None) -> Timing | None:
        return timing if timing is not None and timing.steps else None

    return Throughput(
        batch_size=throughput.batch_size,
        batch_from=throughput.batch_from,
        profiled=measured(throughput.profiled),
        steady=measured(throughput.steady),
        note=throughput.note,
    )


def _memory(memory: Mapping[str, Any]) -> MemoryView:
    return MemoryView(
        peak_allocated_bytes=memory.get("peak_allocated_bytes"),
        peak_reserved_bytes=memory.get("peak_reserved_bytes"),
        capacity_bytes=memory.get("capacity_bytes"),
        peak_allocated_share=memory.get("peak_allocated_share"),
        peak_reserved_share=memory.get("peak_reserved_share"),
    )


def _breakdown(report: Report, labels: Mapping[str, str]) -> BreakdownView:
    assert report.breakdown is not None
    data = report.breakdown
    window = data.window
    on_gpu = report.on_gpu
    steps = tuple(data.steps)
    shares = report.exposed_shares()
    per_step = _per_step(report)
    exposed = tuple(
        ExposedRow(
            category=cat,
            label=labels[cat],
            mean_ms=_mean(per_step.exposed.get(cat), shares[cat] * per_step.exposed_step_ms),
            p10_ms=per_step.exposed[cat].p10_ms if cat in per_step.exposed else None,
            p90_ms=per_step.exposed[cat].p90_ms if cat in per_step.exposed else None,
            share=shares[cat],
            listed=shares[cat] >= MIN_SHARE_LISTED,
            present=any(step.exposed_ms[cat] > 0 for step in steps),
        )
        for cat in shares
    )
    phases = tuple(
        PhaseRow(
            phase=phase,
            label=PHASE_LABELS[phase],
            mean_ms=_mean(
                per_step.phases.get(phase), (report.symptom_value(f"phase.{phase}") or 0.0) * per_step.phase_step_ms
            ),
            p10_ms=per_step.phases[phase].p10_ms if phase in per_step.phases else None,
            p90_ms=per_step.phases[phase].p90_ms if phase in per_step.phases else None,
            share=report.symptom_value(f"phase.{phase}") or 0.0,
            hidden_share=(report.symptom_value(f"hidden.{phase}") or 0.0) if on_gpu else None,
        )
        for phase in PHASES
    )
    gpu = None
    if on_gpu:
        gpu = GpuCounters(
            busy_share=report.gpu_busy_share(),
            kernels_per_step=report.symptom_value("gpu.kernels_per_step"),
            median_kernel_us=report.symptom_value("gpu.median_kernel_us"),
            h2d_pageable_bytes=report.symptom_value("h2d.pageable_bytes_per_step"),
            h2d_pinned_bytes=window.h2d_pinned_bytes_per_step,
            syncs_per_step=report.symptom_value("sync.per_step"),
        )
    return BreakdownView(
        on_gpu=on_gpu,
        steps=steps,
        median_step_ms=window.median_step_ms or 0.0,
        exposed_basis=per_step.exposed_basis,
        exposed_step_ms=per_step.exposed_step_ms,
        phase_step_ms=per_step.phase_step_ms,
        exposed=exposed,
        phases=phases,
        categories=exposed_categories(on_gpu),
        gpu=gpu,
        median_step=_median_step(steps, exposed, data.median_step_timeline, labels),
    )


def _mean(stat: StepStat | None, otherwise: float) -> float:
    return stat.mean_ms if stat is not None and stat.mean_ms is not None else otherwise


def _per_step(report: Report) -> PerStep:
    """The window's per-step statistics; a report written before they were kept (its tables
    held medians) gets means from its shares, with no spread: over the steady step where its
    exposed shares were calibrated to it, else over the profiled mean step."""
    assert report.breakdown is not None
    window = report.breakdown.window
    if window.per_step is not None:
        return window.per_step
    steps = report.breakdown.steps
    mean_step = sum(step.duration_ms for step in steps) / len(steps) if steps else 0.0
    steady = report.throughput.steady
    calibrated = bool(window.trace_exposed_share) and steady is not None and bool(steady.mean_step_ms)
    return PerStep(
        exposed_basis="steady" if calibrated else "profiled",
        exposed_step_ms=steady.mean_step_ms if calibrated and steady is not None and steady.mean_step_ms else mean_step,
        phase_step_ms=mean_step,
    )


def exposed_caption(basis: str, step_ms: float) -> str:
    """What the exposed table's numbers are, in words every renderer prints above it."""
    step = (
        f"the {step_ms:.2f} ms steady step (profiler off)"
        if basis == "steady"
        else f"the {step_ms:.2f} ms profiled step"
    )
    return f"mean per step = share x {step}; p10–p90 over the profiled steps"


def phase_caption(step_ms: float) -> str:
    """What the phase table's numbers are (phases are not calibrated: shares of the profiled step)."""
    return f"mean per step = share x the {step_ms:.2f} ms profiled step; p10–p90 over the profiled steps"


def median_of(steps: tuple[Step, ...]) -> Step:
    """The step whose duration is the median (the lower one of two for an even count)."""
    ordered = sorted(steps, key=lambda step: step.duration_ms)
    return ordered[(len(ordered) - 1) // 2]


def _median_step(
    steps: tuple[Step, ...], exposed: tuple[ExposedRow, ...], timeline: StepTimeline | None, labels: Mapping[str, str]
) -> MedianStep:
    if timeline:
        duration_ms = timeline.duration_us / 1000
        slice_ms = duration_ms / timeline.bins
        return MedianStep(
            number=timeline.step,
            duration_ms=duration_ms,
            in_time_order=True,
            exposed=tuple(Segment("exposed", cat, labels.get(cat, cat), n * slice_ms) for cat, n in timeline.exposed),
            phases=tuple(Segment("phase", p, PHASE_LABELS.get(p, p), n * slice_ms) for p, n in timeline.phases),
            bins=timeline.bins,
            slice_ms=slice_ms,
        )
    step = median_of(steps)
    return MedianStep(
        number=step.number,
        duration_ms=step.duration_ms,
        in_time_order=False,
        exposed=tuple(
            Segment("exposed", row.category, row.label, step.exposed_ms[row.category]) for row in exposed if row.present
        ),
        phases=tuple(Segment("phase", p, PHASE_LABELS[p], step.phases_ms[p]) for p in PHASES),
    )


def _ranks(report: Report, findings: tuple[Finding, ...]) -> RanksView | None:
    distributed = report.distributed
    if not distributed:
        return None
    lead = report.source.rank
    rows = tuple(distributed.ranks)
    straggler = distributed.straggler if any(f.rule == STRAGGLER_RULE for f in findings) else None
    first_rank = min((row.rank for row in rows), default=0)
    why = {int(rank): str(reason) for rank, reason in distributed.notable_ranks.items()}
    shown, others = rows, None
    if len(rows) > MAX_RANK_ROWS:
        keep = {first_rank, *why, *([straggler.rank] if straggler else []), *([] if lead is None else [int(lead)])}
        shown = tuple(row for row in rows if row.rank in keep)
        rest = sorted(row.median_step_ms for row in rows if row.rank not in keep and row.median_step_ms is not None)
        others = OtherRanks(
            count=len(rows) - len(shown),
            step_ms_p10=quantile(rest, 0.1) if rest else None,
            step_ms_median=quantile(rest, 0.5) if rest else None,
            step_ms_p90=quantile(rest, 0.9) if rest else None,
        )
    return RanksView(
        world_size=distributed.world_size or len(rows),
        first_rank=first_rank,
        rows=rows,
        job_samples_per_s=distributed.job_samples_per_s,
        straggler=straggler,
        shown=shown,
        why=why,
        others=others,
        lead_rank=first_rank if lead is None else int(lead),
    )


def _evidence(finding: Finding, report: Report) -> tuple[EvidenceRow, ...]:
    rows = []
    for name in finding.evidence:
        symptom = report.symptoms.get(name)
        value, unit = (symptom.value, symptom.unit) if symptom else (None, "")
        text = format_value(value, None, unit)
        if symptom is not None and symptom.low is not None and symptom.high is not None:
            text += f" (p10–p90 {format_value(symptom.low, None, unit)}–{format_value(symptom.high, None, unit)})"
        rows.append(EvidenceRow(name, value, unit, text, symptom.description if symptom else ""))
    return tuple(rows)


def via_text(knobs: Mapping[str, Any], via: Mapping[str, Any]) -> str:
    """How an experiment's knobs reached the loop (``ExperimentRow.via_text``), for rows not in a report."""
    return ExperimentRow(knobs=dict(knobs), via={str(k): str(v) for k, v in via.items()}).via_text


def _config(report: Report) -> ConfigView:
    loader = report.dataloader
    return ConfigView(
        run=_run(report),
        source=_record(report.source.to_dict()),
        environment=_record(report.environment),
        cpu_count=report.environment.get("cpu_count"),
        dataloader=(
            DataLoaderView(
                settings=tuple((key, loader.get(key)) for key in DATALOADER_SETTINGS if key in loader),
                created_at=loader.get("created_at"),
                record=_record(loader),
            )
            if loader
            else None
        ),
        dataloaders=tuple(_record(d) for d in report.dataloaders),
        optimizers=tuple(
            OptimizerRow(o.get("name", "?"), o.get("param_tensors"), o.get("implementation")) for o in report.optimizers
        ),
        optimizer_records=tuple(_record(o) for o in report.optimizers),
        models=tuple(_record(m) for m in report.models),
        flags=_record(report.flags),
    )


def _run(report: Report) -> RunView:
    run: RunInfo | None = report.run
    target = run.target if run is not None else None
    settings: Record = (
        ()
        if run is None
        else (
            ("target", f"{target.kind} {target.value}".strip() if target else ""),
            ("script arguments", shlex.join(target.args) if target and target.args else None),
            ("working directory", target.cwd if target else None),
            ("command", shlex.join(run.command) if run.command else None),
            ("started", run.started_at),
            ("ended", run.ended_at),
            ("wall time", f"{run.wall_s:.1f} s" if run.wall_s is not None else None),
            ("plan", run.plan),
            ("steps seen", run.steps_seen),
            ("knobs", run.knobs),
            ("trace files", run.trace_files),
        )
    )
    return RunView(
        steps_seen=run.steps_seen if run else None,
        profiled_steps=run.profiled_steps if run else None,
        trace_files=run.trace_files if run else None,
        analysed_trace=report.source.trace,
        settings=settings,
    )
