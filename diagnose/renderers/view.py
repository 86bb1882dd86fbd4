"""The report as renderers read it: typed rows, built once from a ``Report``.

Contract: ``ReportView.from_report(report) -> ReportView``; pure. Every renderer (terminal, HTML,
TensorBoard scalars and text) reads this view and never the report's dictionaries: the exposed
and phase tables, the labels (GPU or CPU wording), the straggler flag and the evidence values are
decided here, once. Numbers stay numbers; how to print them is the renderer's choice, through
``diagnose.units``.

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

from diagnose.analysis.measure.categories import PHASE_LABELS, PHASES, STEP_MODE_LABELS, exposed_categories, exposed_labels
from diagnose.analysis.report import Report, sanitized
from diagnose.renderers.wholeview import WholeView, whole_view
from diagnose.renderers.limitsview import LimitsView, limits_view
from diagnose.stats import quantile
from diagnose.units import format_value, gain_words

#: An exposed category is listed in the tables when it holds at least this share of the window.
MIN_SHARE_LISTED = 0.0005
#: The rule whose finding says that one rank holds the others back.
STRAGGLER_RULE = "DIST003"
#: Run states in which the script did what it should (the others failed, or were cut short).
OK_STATES = ("completed", "stopped", "trace")
#: Experiment rows with no measurement to draw.
FAILED_STATES = ("oom", "failed")
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
class Timing:
    """Step timing of one window (profiled, or steady with the profiler off)."""

    steps: int
    median_step_ms: float
    p90_step_ms: float
    mean_step_ms: float | None
    steps_per_s: float
    samples_per_s: float | None
    p10_step_ms: float | None = None
    #: the p90 step is over 1.5x the median (report.NOISY_P90_OVER_MEDIAN)
    noisy: bool = False


@dataclass(frozen=True)
class ThroughputView:
    steady: Timing | None
    profiled: Timing | None
    batch_size: float | None
    note: str | None


@dataclass(frozen=True)
class MemoryView:
    peak_allocated_bytes: float | None
    peak_reserved_bytes: float | None
    capacity_bytes: float | None
    peak_allocated_share: float | None
    peak_reserved_share: float | None


# --- the breakdown --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepRow:
    """One profiled step: its time per exposed category and per phase, and its GPU counters."""

    number: int
    duration_ms: float
    exposed_ms: Mapping[str, float]
    phases_ms: Mapping[str, float]
    gpu_busy_ms: float | None
    kernels: int | None
    median_kernel_us: float | None
    h2d_pageable_bytes: float | None
    h2d_pinned_bytes: float | None
    h2d_copies: int | None
    d2h_bytes: float | None
    syncs: int | None
    sync_blocked_ms: float | None


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
    steps: tuple[StepRow, ...]
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


@dataclass(frozen=True)
class RankRow:
    rank: int
    status: str
    median_step_ms: float | None
    data_wait_ms: float | None
    data_wait_share: float | None
    communication_ms: float | None
    exposed_communication_share: float | None
    gpu_busy: float | None
    samples_per_step: float | None
    top_exposed: str | None
    backend: str | None
    steady_samples_per_s: float | None
    steady_step_ms: float | None = None
    step_ms: tuple[float, ...] | list[float] | None = None

    @property
    def exposed_communication_ms(self) -> float | None:
        """Exposed communication per step as the breakdown writes it: the exposed share of the
        steady step (of the profiled mean step where the rank timed none), so that the lead
        rank's row and the report's breakdown give one figure."""
        step = self.steady_step_ms
        if step is None:
            step = sum(self.step_ms) / len(self.step_ms) if self.step_ms else self.median_step_ms
        return None if self.exposed_communication_share is None or step is None else self.exposed_communication_share * step


@dataclass(frozen=True)
class Straggler:
    rank: int
    data_wait_ms: float
    others_data_wait_ms: float


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
    rows: tuple[RankRow, ...]
    job_samples_per_s: float | None
    straggler: Straggler | None  # only when the straggler rule fired
    #: the rows the table lists: all of them up to MAX_RANK_ROWS, else the first and notable ranks
    shown: tuple[RankRow, ...] = ()
    #: rank -> why it is listed (report.json distributed.notable_ranks)
    why: Mapping[int, str] = field(default_factory=dict)
    others: OtherRanks | None = None
    #: the rank whose breakdown and findings the report shows (the lead: the one the others wait
    #: for, else the first; report.json source.rank)
    lead_rank: int = 0


@dataclass(frozen=True)
class EvidenceRow:
    symptom: str
    value: float | None
    unit: str
    text: str  # the value in its unit
    description: str


@dataclass(frozen=True)
class FindingRow:
    rule: str
    title: str
    says: str
    do: str
    why: str
    gain_bound: float | None
    predicted_speedup: float | None  # the fix replayed on the step's model (analysis/prediction/predict.py)
    prediction_note: str | None
    gain_formula: str | None
    evidence: tuple[EvidenceRow, ...]
    lines: str | None
    references: tuple[str, ...]
    knobs: Mapping[str, str]
    #: symptoms whose step-to-step spread reaches the rule's threshold (a rerun may not fire it)
    borderline: tuple[str, ...] = ()
    #: what the rank stands on: "measured", "predicted" or "bound"
    basis: str = "bound"
    #: the prediction's 90% interval
    predicted_interval: tuple[float, float] | None = None
    #: what diagnose run's short A/B measured: speedup, spread, verdict, change
    measured: Mapping[str, Any] | None = None
    #: why the gain is unsure enough to measure
    check: tuple[str, ...] = ()

    @property
    def gain_text(self) -> str:
        """The gain as every renderer words it: measured (with its spread), else predicted with
        its interval, else the bound."""
        if self.measured:
            m = self.measured
            return f"measured {m['speedup']:.2f}x by a short A/B (±{m['spread']:.1%}; {m.get('change') or 'its knobs'})"
        words = gain_words(self.predicted_speedup, self.gain_bound)
        if self.predicted_interval is not None:
            low, high = self.predicted_interval
            words += f" (90% interval {low:.2f}x–{high:.2f}x)"
        return words


@dataclass(frozen=True)
class ExperimentRow:
    label: str
    status: str
    verdict: str | None
    failed: bool  # out of memory or failed: nothing measured
    steps_per_s: float | None
    samples_per_s: float | None
    #: the timed steps' mean step and its p10-p90 (what the rates are means of)
    mean_step_ms: float | None
    p10_step_ms: float | None
    p90_step_ms: float | None
    gpu_busy: float | None
    peak_reserved_bytes: float | None
    speedup: float | None
    predicted_speedup: float | None
    gain_bound: float | None
    top_category: str | None
    top_label: str | None
    top_share: float | None
    compiled: bool
    compile_s: float | None
    break_even_steps: int | None
    #: how the row's knobs reached the script's loop (``via_text``); "" for a baseline
    via: str = ""
    #: "baseline" (the reference the speedups are measured against), "recommendation", "combined", "point"
    role: str | None = None
    #: why a failed run measured nothing
    error: str | None = None

    def step_text(self, dash: str = "-") -> str | None:
        """The mean step with its p10-p90, ``"101.2 (95.0-110.3)"`` in ms; None when not measured."""
        if self.mean_step_ms is None:
            return None
        if self.p10_step_ms is None or self.p90_step_ms is None:
            return f"{self.mean_step_ms:.1f}"
        return f"{self.mean_step_ms:.1f} ({self.p10_step_ms:.1f}{dash}{self.p90_step_ms:.1f})"

    @property
    def reference(self) -> bool:
        """A verify baseline: the reference itself, shown as such rather than as a speedup."""
        return self.role == "baseline"

    def figure(self, name: str) -> float | None:
        """A measured figure by its report name (``samples_per_s`` ...), for charts that pick one."""
        value = getattr(self, name)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def spread_words(source: str | None) -> str:
    """Where a verify baseline's spread comes from, in words for the tables."""
    return {
        "repeats": "half the range of the baseline runs' means",
        "blocks": "one baseline run: half the range of the means of 3 blocks of its timed steps",
        "steps": "one baseline run: half the p10-p90 range of its timed steps",
    }.get(source or "", "")


@dataclass(frozen=True)
class ExperimentsView:
    kind: str  # "sweep" or "verify"
    parameters: tuple[str, ...]
    compared_by: str  # the figure speedups are computed on
    rate_key: str  # samples_per_s when any row has it, else steps_per_s
    baseline_spread: float
    #: "repeats" (half the range of the baseline runs' means), "blocks" (one run: half the range
    #: of its timed steps' means over 3 blocks), "steps" (one run: half its timed steps'
    #: p10-p90), None (not known; also a report written before this was recorded)
    baseline_spread_from: str | None
    #: what the rates, speedups and spreads are computed on (experiments.STATISTIC; None in a
    #: report written before it was recorded)
    statistic: str | None
    rows: tuple[ExperimentRow, ...]
    conclusions: tuple[str, ...]
    plot: str | None

    @property
    def shows_gpu_busy(self) -> bool:
        """Some run used a GPU (a CPU-only sweep has no GPU busy figure worth a column)."""
        return any(row.gpu_busy for row in self.rows)

    @property
    def shows_memory(self) -> bool:
        """Some run measured its device memory (none does on a CPU)."""
        return any(row.peak_reserved_bytes for row in self.rows)


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
class ReplayView:
    """The check that the step's replay reproduces the measured window (predictions need it)."""

    replayed_ms: float
    measured_ms: float
    steps: int
    error: float
    within_tolerance: bool


# --- the whole -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportView:
    name: str
    device: str | None  # GPU name or "CPU only ..."; None when unknown
    versions: tuple[str, ...]
    status: StatusView
    verdict: str
    healthy: bool
    throughput: ThroughputView
    memory: MemoryView
    breakdown: BreakdownView | None
    ranks: RanksView | None
    findings: tuple[FindingRow, ...]
    next_steps: tuple[FindingRow, ...]
    findings_not_shown: int
    #: fixes that fired but were left out, predicted under the step-to-step spread: one line each
    considered: tuple[str, ...]
    #: rules that did not fire but would within the steps' spread: one line each
    borderline: tuple[str, ...]
    replay: ReplayView | None
    experiments: ExperimentsView | None
    config: ConfigView
    warnings: tuple[str, ...]
    diagnose_version: str
    schema: str
    created_at: str
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

    @classmethod
    def from_report(cls, report: Report) -> ReportView:
        # every renderer reads this view: no infinite number and no control character past here
        report = Report.from_dict(sanitized(report.to_dict(), text=True))
        labels = exposed_labels(report.on_gpu)
        findings = tuple(_finding(f, report) for f in report.findings)
        return cls(
            name=_run_name(report),
            device=_device(report),
            versions=_versions(report.environment),
            status=_status(report),
            verdict=report.verdict,
            healthy=report.healthy,
            throughput=_throughput(report.throughput or {}),
            memory=_memory(report.memory or {}),
            breakdown=_breakdown(report, labels) if report.breakdown else None,
            ranks=_ranks(report.distributed, findings, (report.source or {}).get("rank")),
            findings=findings,
            next_steps=tuple(_finding(f, report) for f in report.next_steps),
            findings_not_shown=report.findings_not_shown,
            considered=tuple(report.considered),
            borderline=tuple(report.borderline),
            replay=_replay(report.replay),
            experiments=_experiments(report.experiments, labels),
            config=_config(report),
            warnings=tuple(report.warnings),
            diagnose_version=report.diagnose_version,
            schema=report.schema,
            created_at=report.created_at,
            limits=limits_view(report),
            whole=whole_view(report),
        )


def _run_name(report: Report) -> str:
    """The script's file name, the module's name, or the trace's or run directory's name."""
    target = (report.run or {}).get("target") or {}
    name = target.get("value") or report.source.get("trace") or report.source.get("run_dir") or "report"
    return str(name) if target.get("kind") == "module" else str(name).rstrip("/").rsplit("/", 1)[-1]


def _device(report: Report) -> str | None:
    env = report.environment
    if (report.breakdown and not report.on_gpu) or env.get("device") == "cpu":
        cores = f"{env['cpu_count']} cores" if env.get("cpu_count") else "CPU count unknown: a bare trace does not record it"
        return f"CPU only, no GPU used ({cores})"
    return env.get("device_name") or None


def _versions(env: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(f"{name} {env[key]}" for key, name in (("torch", "torch"), ("python", "Python"), ("driver", "driver")) if env.get(key))


def _status(report: Report) -> StatusView:
    status = report.status or {}
    state = str(status.get("state", "unknown"))
    mode = (report.run or {}).get("step_mode")
    error = status.get("error") or {}
    return StatusView(
        state=state,
        message=str(status.get("message", "")),
        # a sweep is fine when at least one of its points ran (its exit code says so)
        ok=state in OK_STATES or (state == "sweep" and status.get("exit_code") == 0),
        step_mode=STEP_MODE_LABELS.get(mode, mode) if mode else None,
        error_type=error.get("type") if error else None,
        error_message=str(error.get("message", "")) if error else None,
        traceback=error.get("traceback") or None if error else None,
    )


def _timing(timing: Mapping[str, Any] | None) -> Timing | None:
    if not timing or not timing.get("steps"):
        return None
    return Timing(
        steps=timing["steps"],
        median_step_ms=timing["median_step_ms"],
        p90_step_ms=timing["p90_step_ms"],
        mean_step_ms=timing.get("mean_step_ms"),
        steps_per_s=timing["steps_per_s"],
        samples_per_s=timing.get("samples_per_s"),
        p10_step_ms=timing.get("p10_step_ms"),
        noisy=bool(timing.get("noisy")),
    )


def _throughput(throughput: Mapping[str, Any]) -> ThroughputView:
    return ThroughputView(
        steady=_timing(throughput.get("steady")),
        profiled=_timing(throughput.get("profiled")),
        batch_size=throughput.get("batch_size"),
        note=throughput.get("note"),
    )


def _memory(memory: Mapping[str, Any]) -> MemoryView:
    return MemoryView(
        peak_allocated_bytes=memory.get("peak_allocated_bytes"),
        peak_reserved_bytes=memory.get("peak_reserved_bytes"),
        capacity_bytes=memory.get("capacity_bytes"),
        peak_allocated_share=memory.get("peak_allocated_share"),
        peak_reserved_share=memory.get("peak_reserved_share"),
    )


def _step(step: Mapping[str, Any]) -> StepRow:
    return StepRow(
        number=step["number"],
        duration_ms=step["duration_ms"],
        exposed_ms=dict(step["exposed_ms"]),
        phases_ms=dict(step["phases_ms"]),
        gpu_busy_ms=step.get("gpu_busy_ms"),
        kernels=step.get("kernels"),
        median_kernel_us=step.get("median_kernel_us"),
        h2d_pageable_bytes=step.get("h2d_pageable_bytes"),
        h2d_pinned_bytes=step.get("h2d_pinned_bytes"),
        h2d_copies=step.get("h2d_copies"),
        d2h_bytes=step.get("d2h_bytes"),
        syncs=step.get("syncs"),
        sync_blocked_ms=step.get("sync_blocked_ms"),
    )


def _breakdown(report: Report, labels: Mapping[str, str]) -> BreakdownView:
    data = report.breakdown or {}
    window = data["window"]
    on_gpu = report.on_gpu
    steps = tuple(_step(s) for s in data["steps"])
    shares = report.exposed_shares()
    per_step = _per_step(window, steps, (report.throughput or {}).get("steady") or {})
    exposed_stats = per_step["exposed"]
    phase_stats = per_step["phases"]
    exposed = tuple(
        ExposedRow(
            category=cat,
            label=labels[cat],
            mean_ms=exposed_stats[cat]["mean_ms"] if cat in exposed_stats else shares[cat] * per_step["exposed_step_ms"],
            p10_ms=exposed_stats.get(cat, {}).get("p10_ms"),
            p90_ms=exposed_stats.get(cat, {}).get("p90_ms"),
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
            mean_ms=(
                phase_stats[phase]["mean_ms"]
                if phase in phase_stats
                else (report.symptom_value(f"phase.{phase}") or 0.0) * per_step["phase_step_ms"]
            ),
            p10_ms=phase_stats.get(phase, {}).get("p10_ms"),
            p90_ms=phase_stats.get(phase, {}).get("p90_ms"),
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
            h2d_pinned_bytes=window.get("h2d_pinned_bytes_per_step"),
            syncs_per_step=report.symptom_value("sync.per_step"),
        )
    return BreakdownView(
        on_gpu=on_gpu,
        steps=steps,
        median_step_ms=window["median_step_ms"],
        exposed_basis=per_step["exposed_basis"],
        exposed_step_ms=per_step["exposed_step_ms"],
        phase_step_ms=per_step["phase_step_ms"],
        exposed=exposed,
        phases=phases,
        categories=exposed_categories(on_gpu),
        gpu=gpu,
        median_step=_median_step(steps, exposed, data.get("median_step_timeline"), labels),
    )


def _per_step(window: Mapping[str, Any], steps: tuple[StepRow, ...], steady: Mapping[str, Any]) -> Mapping[str, Any]:
    """The window's per-step statistics; a report written before they were kept (its tables
    held medians) gets means from its shares, with no spread: over the steady step where its
    exposed shares were calibrated to it, else over the profiled mean step."""
    if window.get("per_step"):
        return window["per_step"]
    mean_step = sum(step.duration_ms for step in steps) / len(steps) if steps else 0.0
    calibrated = bool(window.get("trace_exposed_share")) and bool(steady.get("mean_step_ms"))
    return {
        "exposed_basis": "steady" if calibrated else "profiled",
        "exposed_step_ms": steady["mean_step_ms"] if calibrated else mean_step,
        "phase_step_ms": mean_step,
        "exposed": {},
        "phases": {},
    }


def exposed_caption(basis: str, step_ms: float) -> str:
    """What the exposed table's numbers are, in words every renderer prints above it."""
    step = f"the {step_ms:.2f} ms steady step (profiler off)" if basis == "steady" else f"the {step_ms:.2f} ms profiled step"
    return f"mean per step = share x {step}; p10–p90 over the profiled steps"


def phase_caption(step_ms: float) -> str:
    """What the phase table's numbers are (phases are not calibrated: shares of the profiled step)."""
    return f"mean per step = share x the {step_ms:.2f} ms profiled step; p10–p90 over the profiled steps"


def median_of(steps: tuple[StepRow, ...]) -> StepRow:
    """The step whose duration is the median (the lower one of two for an even count)."""
    ordered = sorted(steps, key=lambda step: step.duration_ms)
    return ordered[(len(ordered) - 1) // 2]


def _median_step(
    steps: tuple[StepRow, ...], exposed: tuple[ExposedRow, ...], timeline: Mapping[str, Any] | None, labels: Mapping[str, str]
) -> MedianStep:
    if timeline:
        duration_ms = timeline["duration_us"] / 1000
        slice_ms = duration_ms / timeline["bins"]
        return MedianStep(
            number=timeline["step"],
            duration_ms=duration_ms,
            in_time_order=True,
            exposed=tuple(Segment("exposed", cat, labels.get(cat, cat), n * slice_ms) for cat, n in timeline["exposed"]),
            phases=tuple(Segment("phase", p, PHASE_LABELS.get(p, p), n * slice_ms) for p, n in timeline["phases"]),
            bins=timeline["bins"],
            slice_ms=slice_ms,
        )
    step = median_of(steps)
    return MedianStep(
        number=step.number,
        duration_ms=step.duration_ms,
        in_time_order=False,
        exposed=tuple(Segment("exposed", row.category, row.label, step.exposed_ms[row.category]) for row in exposed if row.present),
        phases=tuple(Segment("phase", p, PHASE_LABELS[p], step.phases_ms[p]) for p in PHASES),
    )


def _ranks(distributed: Mapping[str, Any] | None, findings: tuple[FindingRow, ...], lead: int | None = None) -> RanksView | None:
    if not distributed:
        return None
    rows = tuple(
        RankRow(**{name: row.get(name) for name in RankRow.__dataclass_fields__}) for row in distributed.get("ranks") or []
    )
    lagging = distributed.get("straggler")
    straggler = None
    if lagging and any(f.rule == STRAGGLER_RULE for f in findings):
        straggler = Straggler(lagging["rank"], lagging["data_wait_ms"], lagging["others_data_wait_ms"])
    first_rank = min((row.rank for row in rows), default=0)
    why = {int(rank): str(reason) for rank, reason in (distributed.get("notable_ranks") or {}).items()}
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
        world_size=distributed.get("world_size") or len(rows),
        first_rank=first_rank,
        rows=rows,
        job_samples_per_s=distributed.get("job_samples_per_s"),
        straggler=straggler,
        shown=shown,
        why=why,
        others=others,
        lead_rank=first_rank if lead is None else int(lead),
    )


def _finding(finding: Mapping[str, Any], report: Report) -> FindingRow:
    evidence = []
    for name in finding.get("evidence") or []:
        symptom = report.symptoms.get(name) or {}
        value, unit = symptom.get("value"), symptom.get("unit", "")
        text = format_value(value, None, unit)
        if symptom.get("low") is not None and symptom.get("high") is not None:
            text += f" (p10–p90 {format_value(symptom['low'], None, unit)}–{format_value(symptom['high'], None, unit)})"
        evidence.append(EvidenceRow(name, value, unit, text, symptom.get("description", "")))
    return FindingRow(
        rule=finding["rule"],
        title=finding["title"],
        says=finding["says"],
        do=finding.get("do") or "",
        why=finding.get("why") or "",
        gain_bound=finding.get("gain_bound"),
        predicted_speedup=finding.get("predicted_speedup"),
        prediction_note=finding.get("prediction_note"),
        gain_formula=finding.get("gain_formula"),
        evidence=tuple(evidence),
        lines=finding.get("lines"),
        references=tuple(finding.get("references") or ()),
        knobs=dict(finding.get("knobs") or {}),
        borderline=tuple(finding.get("borderline") or ()),
        basis=finding.get("basis") or ("predicted" if finding.get("predicted_speedup") is not None else "bound"),
        predicted_interval=tuple(finding["predicted_interval"]) if finding.get("predicted_interval") else None,  # type: ignore[arg-type]
        measured=finding.get("measured"),
        check=tuple(finding.get("check") or ()),
    )


def _replay(replay: Mapping[str, Any] | None) -> ReplayView | None:
    if not replay or replay.get("replayed_ms") is None or replay.get("measured_ms") is None:
        return None
    return ReplayView(
        replayed_ms=replay["replayed_ms"],
        measured_ms=replay["measured_ms"],
        steps=int(replay.get("steps") or 0),
        error=float(replay.get("error") or 0.0),
        within_tolerance=bool(replay.get("within_tolerance")),
    )


def via_text(knobs: Mapping[str, Any], via: Mapping[str, Any]) -> str:
    """How an experiment's knobs reached the loop, for a table cell: the way alone for one knob
    (``Trainer(precision="bf16-mixed")``), ``knob: way`` joined by ``; `` for several."""
    ways = [(str(k), str(via[k])) for k in knobs if via.get(k)]
    if len(ways) == 1 and len(knobs) == 1:
        return ways[0][1]
    return "; ".join(f"{k}: {way}" for k, way in ways)


def _experiments(experiments: Mapping[str, Any] | None, labels: Mapping[str, str]) -> ExperimentsView | None:
    if not experiments or not experiments.get("rows"):
        return None
    rows = []
    for row in experiments["rows"]:
        top = row.get("top_exposed") or {}
        category = top.get("category")
        compile_info = row.get("compile") or {}
        rows.append(
            ExperimentRow(
                label=str(row.get("label", "")),
                status=str(row.get("status", "ok")),
                verdict=row.get("verdict"),
                failed=row.get("status") in FAILED_STATES,
                steps_per_s=row.get("steps_per_s"),
                samples_per_s=row.get("samples_per_s"),
                mean_step_ms=row.get("mean_step_ms"),
                p10_step_ms=row.get("p10_step_ms"),
                p90_step_ms=row.get("p90_step_ms"),
                gpu_busy=row.get("gpu_busy"),
                peak_reserved_bytes=row.get("peak_reserved_bytes"),
                speedup=row.get("speedup"),
                predicted_speedup=row.get("predicted_speedup"),
                gain_bound=row.get("gain_bound"),
                top_category=category,
                top_label=labels.get(category, category) if category else None,
                top_share=top.get("share", 0) if top else None,
                compiled=bool(compile_info),
                compile_s=compile_info.get("compile_s"),
                break_even_steps=compile_info.get("break_even_steps"),
                via=via_text(row.get("knobs") or {}, row.get("via") or {}),
                role=row.get("role"),
                error=row.get("error"),
            )
        )
    return ExperimentsView(
        kind=str(experiments.get("kind", "sweep")),
        parameters=tuple(experiments.get("parameters") or ()),
        compared_by=str(experiments.get("compared_by", "steps_per_s")),
        rate_key="samples_per_s" if any(r.samples_per_s for r in rows) else "steps_per_s",
        baseline_spread=experiments.get("baseline_spread", 0),
        baseline_spread_from=experiments.get("baseline_spread_from"),
        statistic=experiments.get("statistic"),
        rows=tuple(rows),
        conclusions=tuple(experiments.get("conclusions") or ()),
        plot=experiments.get("plot"),
    )


def _config(report: Report) -> ConfigView:
    loader = report.dataloader
    return ConfigView(
        run=_run(report),
        source=_record(report.source),
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
        optimizers=tuple(OptimizerRow(o.get("name", "?"), o.get("param_tensors"), o.get("implementation")) for o in report.optimizers),
        optimizer_records=tuple(_record(o) for o in report.optimizers),
        models=tuple(_record(m) for m in report.models),
        flags=_record(report.flags),
    )


def _run(report: Report) -> RunView:
    run = report.run or {}
    target = run.get("target") or {}
    settings = () if not run else (
        ("target", f"{target.get('kind', '')} {target.get('value', '')}".strip()),
        ("script arguments", shlex.join(target["args"]) if target.get("args") else None),
        ("working directory", target.get("cwd")),
        ("command", shlex.join(run["command"]) if run.get("command") else None),
        ("started", run.get("started_at")),
        ("ended", run.get("ended_at")),
        ("wall time", f"{run['wall_s']:.1f} s" if run.get("wall_s") is not None else None),
        ("plan", run.get("plan")),
        ("steps seen", run.get("steps_seen")),
        ("knobs", run.get("knobs")),
        ("trace files", run.get("trace_files")),
    )
    return RunView(
        steps_seen=run.get("steps_seen"),
        profiled_steps=run.get("profiled_steps"),
        trace_files=run.get("trace_files"),
        analysed_trace=report.source.get("trace"),
        settings=settings,
    )
