"""Several reports side by side: how a change moved the bottleneck.

Contract: ``compare_reports([(label, report), ...]) -> Comparison``; pure, no files, no torch.
The first report is the baseline: every later one is compared with it (throughput speedup, the
change of each exposed category's and each phase's share, the findings that appeared and
disappeared) and, in one sentence, with the run just before it (the shift: "data wait 64% ->
3%; the step is now GPU backward, 51%"), because a list of runs is usually a list of fixes made
one after another. ``Comparison.to_dict()`` is what ``diagnose compare --json`` prints. The value
knows no renderer: ``renderers/comparison.py`` renders it, ``renderers/notebook.py`` shows it in
Jupyter.

Throughput is compared in samples per second when every run knows it (a batch-size change
alters the work per step), else in steps per second; the steady figure (profiler off) when
every run has it, else the profiled one of every run (``window_for``: never one run's steady
figure against another's profiled one).

Noise: each run carries its spread (half the p10-p90 range of its steps over its mean step, as
verify's single-run spread) and its notes on the timing (noisy windows, a profiler-off window
slower than the profiled one, ...). A speedup inside the larger spread of the two runs is said
to be inside it ("no measurable change"), never read as a shift. The comparison warns when the
runs are of different scripts, window plans or devices (``Comparison.warnings``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from diagnose.analysis.measure.categories import EXPOSED, PHASE_LABELS, PHASES, exposed_categories
from diagnose.report import Report
from diagnose.units import percent

COMPARISON_SCHEMA = "diagnose.comparison/1"

#: Short words for an exposed category, as a sentence names it ("the step is now GPU backward").
SHIFT_WORDS = {
    "data_wait": "data wait",
    "h2d_copy": "host-to-device copies",
    "sync": "host-GPU syncs",
    "host_forward": "host forward (GPU idle)",
    "host_backward": "host backward (GPU idle)",
    "host_optimizer": "host optimizer (GPU idle)",
    "host_other": "other host work (GPU idle)",
    "communication": "exposed communication",
    "gpu_forward": "GPU forward",
    "gpu_backward": "GPU backward",
    "gpu_optimizer": "GPU optimizer",
    "gpu_other": "other GPU work",
}
#: On a CPU-only run the host is the device: its model code is compute, not a GPU left idle.
SHIFT_WORDS_CPU = {
    **SHIFT_WORDS,
    "host_forward": "forward",
    "host_backward": "backward",
    "host_optimizer": "optimizer",
    "host_other": "other Python",
}
#: A share change smaller than this (of the step) is not called a shift.
MIN_SHIFT = 0.05


#: the report's timing windows, the preferred first
WINDOWS = ("steady", "profiled")
#: the report notes that bear on how far its timing can be trusted (report.py writes them)
TIMING_NOTE_STARTS = ("noisy ", "bursty ", "profiling made", "the profiler-off window", "too few steps")


def throughput_of(report: Report, rate_key: str, window: str | None = None) -> float | None:
    """The run's ``rate_key`` figure (``samples_per_s`` or ``steps_per_s``) in ``window``; with
    none given, steady when measured, else profiled; None when the run measured neither."""
    for name in (window,) if window else WINDOWS:
        timing = getattr(report.throughput, name)
        value = getattr(timing, rate_key) if timing is not None else None
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None


def rate_key_for(reports: Sequence[Report]) -> str:
    """``samples_per_s`` when every report has it, else ``steps_per_s``."""
    return "samples_per_s" if all(throughput_of(r, "samples_per_s") is not None for r in reports) else "steps_per_s"


def window_for(reports: Sequence[Report], rate_key: str) -> str | None:
    """The window every report has the figure in (steady first): the one to compare them in;
    None when no window is common to all (each then gives what it has)."""
    for window in WINDOWS:
        if all(throughput_of(r, rate_key, window) is not None for r in reports):
            return window
    return None


def spread_of(mean: float | None, low: float | None, high: float | None) -> float | None:
    """Half the p10-p90 range over the mean: how far one run's figure can move by chance."""
    if mean is None or low is None or high is None or mean <= 0:
        return None
    return round((high - low) / 2 / mean, 4)


def step_ms(report: Report, window: str | None = None) -> tuple[float | None, float | None, float | None]:
    """The mean step with its p10 and p90 (the report's statistic, as verify and sweep show it),
    from ``window``, or with none given the steady window where it was timed, else the profiled one."""
    for name in (window,) if window else WINDOWS:
        timing = getattr(report.throughput, name)
        mean = timing.mean_step_ms if timing is not None else None
        if timing is not None and isinstance(mean, (int, float)):
            low, high = timing.p10_step_ms, timing.p90_step_ms
            return (
                float(mean),
                float(low) if isinstance(low, (int, float)) else None,
                float(high) if isinstance(high, (int, float)) else None,
            )
    return None, None, None


@dataclass(frozen=True)
class ShareRow:
    """One exposed category or phase across the runs: its share of the step in each, and the
    change from the baseline (a difference of shares, so 0.64 -> 0.03 is -0.61)."""

    name: str
    label: str
    shares: tuple[float | None, ...]
    deltas: tuple[float | None, ...]  # the first is 0 (the baseline), None where a run has no breakdown


@dataclass(frozen=True)
class RunColumn:
    """One run of the comparison."""

    label: str
    source: str  # the run directory or trace it came from
    state: str  # the report's status
    verdict: str
    throughput: float | None  # in the comparison's rate_key
    speedup: float | None  # throughput over the baseline's
    mean_step_ms: float | None  # the mean step, with its p10-p90 below
    p10_step_ms: float | None
    p90_step_ms: float | None
    gpu_busy: float | None
    findings: tuple[str, ...]  # rule ids that fired, in rank order
    appeared: tuple[str, ...]  # fired here, not in the baseline
    disappeared: tuple[str, ...]  # fired in the baseline, not here
    top_category: str | None  # what limits the step most
    top_share: float | None
    shift: str | None  # one sentence against the run before; None for the first
    spread: float | None = None  # half its p10-p90 step range over its mean step
    inside_spread: bool = False  # its speedup over the baseline is inside the larger of both spreads
    notes: tuple[str, ...] = ()  # its report's notes on its timing (noisy, slower unprofiled, ...)


@dataclass(frozen=True)
class Comparison:
    runs: tuple[RunColumn, ...]
    rate_key: str  # samples_per_s or steps_per_s
    on_gpu: bool  # some run used a GPU: GPU wording for the categories
    exposed: tuple[ShareRow, ...]  # the categories with time in some run, display order
    phases: tuple[ShareRow, ...]
    titles: dict[str, str]  # rule id -> title, for every rule that fired in some run
    window: str | None = None  # the timing window every run is compared in (steady, profiled)
    warnings: tuple[str, ...] = ()  # the runs differ in script, plan or device
    #: the reports compared, in order (the HTML page draws their steps); not part of to_dict()
    reports: tuple[Report, ...] = field(default=(), repr=False, compare=False)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(run.label for run in self.runs)

    @property
    def shifts(self) -> tuple[str, ...]:
        return tuple(run.shift for run in self.runs if run.shift)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": COMPARISON_SCHEMA,
            "rate_key": self.rate_key,
            "on_gpu": self.on_gpu,
            "runs": [asdict(run) for run in self.runs],
            "exposed": [asdict(row) for row in self.exposed],
            "phases": [asdict(row) for row in self.phases],
            "titles": dict(self.titles),
            "window": self.window,
            "warnings": list(self.warnings),
        }


def compare_reports(runs: Sequence[tuple[str, Report]]) -> Comparison:
    """Compare reports, the first being the baseline. Needs at least two."""
    if len(runs) < 2:
        raise ValueError("a comparison needs at least two reports")
    reports = [report for _, report in runs]
    rate_key = rate_key_for(reports)
    on_gpu = any(r.on_gpu for r in reports)
    words = SHIFT_WORDS if on_gpu else SHIFT_WORDS_CPU
    exposed_shares = [_shares(r, "exposed", EXPOSED) for r in reports]
    phase_shares = [_shares(r, "phase", PHASES) for r in reports]
    exposed_rows = tuple(
        _row(cat, words[cat], [s[cat] if s else None for s in exposed_shares])
        for cat in exposed_categories(on_gpu)
        if any(s and s[cat] > 0 for s in exposed_shares)
    )
    phase_rows = tuple(
        _row(phase, PHASE_LABELS[phase], [s[phase] if s else None for s in phase_shares])
        for phase in PHASES
        if any(s and s[phase] > 0 for s in phase_shares)
    )
    window = window_for(reports, rate_key)
    rates = [throughput_of(r, rate_key, window) for r in reports]
    steps = [step_ms(r, window) for r in reports]
    spreads = [spread_of(*s) for s in steps]
    base_rules = _fired(reports[0])
    columns: list[RunColumn] = []
    for i, (label, report) in enumerate(runs):
        fired = _fired(report)
        top = _top(exposed_shares[i])
        speedup = _speedup(rates[0], rates[i])
        inside = i > 0 and inside_spread(speedup, spreads[0], spreads[i])
        shift = None
        if i > 0:
            before = _speedup(rates[i - 1], rates[i])
            noise = _larger(spreads[i - 1], spreads[i]) if inside_spread(before, spreads[i - 1], spreads[i]) else None
            shift = shift_sentence(exposed_shares[i - 1], exposed_shares[i], words, before, rate_key, noise=noise)
        columns.append(
            RunColumn(
                label=label,
                source=str(report.source.run_dir or report.source.trace or ""),
                state=str(report.status.state),
                verdict=report.verdict,
                throughput=rates[i],
                speedup=speedup,
                mean_step_ms=steps[i][0],
                p10_step_ms=steps[i][1],
                p90_step_ms=steps[i][2],
                gpu_busy=report.gpu_busy_share() if report.on_gpu else None,
                findings=fired,
                appeared=tuple(r for r in fired if r not in base_rules) if i else (),
                disappeared=tuple(r for r in base_rules if r not in fired) if i else (),
                top_category=top[0] if top else None,
                top_share=top[1] if top else None,
                shift=shift,
                spread=spreads[i],
                inside_spread=inside,
                notes=timing_notes(report),
            )
        )
    titles = {f.rule: f.title for r in reports for f in r.findings}
    return Comparison(
        tuple(columns),
        rate_key,
        on_gpu,
        exposed_rows,
        phase_rows,
        titles,
        window,
        tuple(run_differences(runs)),
        tuple(reports),
    )


def inside_spread(speedup: float | None, spread_a: float | None, spread_b: float | None) -> bool:
    """Whether a speedup is inside the larger of two runs' spreads (a change chance can make)."""
    noise = _larger(spread_a, spread_b)
    return speedup is not None and noise is not None and abs(speedup - 1) <= noise


def _larger(a: float | None, b: float | None) -> float | None:
    known = [x for x in (a, b) if x is not None]
    return max(known) if known else None


def timing_notes(report: Report) -> tuple[str, ...]:
    """The report's notes that bear on how far its timing can be trusted."""
    notes = [report.throughput.note] if report.throughput.note else []
    return tuple(notes + [w for w in report.warnings if w.startswith(TIMING_NOTE_STARTS)])


def run_differences(runs: Sequence[tuple[str, Report]]) -> list[str]:
    """What makes the runs unlike each other beyond the change compared: another script, another
    window plan, another device (a comparison of those says little about a change)."""
    warnings = []
    for what, value_of in (
        ("scripts", lambda r: r.run.target.value if r.run is not None and r.run.target is not None else None),
        (
            "window plans (--warmup/--steps/--timed-steps)",
            lambda r: _plan_text(r.run.plan if r.run is not None else None),
        ),
        ("devices", lambda r: (r.environment or {}).get("device_name") or (r.environment or {}).get("device")),
    ):
        values = [(label, value_of(report)) for label, report in runs]
        known = [(label, v) for label, v in values if v]
        if len({v for _, v in known}) > 1:
            warnings.append(f"the runs are of different {what}: " + "; ".join(f"{label}: {v}" for label, v in known))
    return warnings


def _plan_text(plan: dict[str, Any] | None) -> str | None:
    if not plan:
        return None
    return f"warmup {plan.get('warmup')}, steps {plan.get('steps')}, timed {plan.get('timed')}"


def shift_sentence(
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    words: dict[str, str],
    speedup: float | None = None,
    rate_key: str = "samples_per_s",
    noise: float | None = None,
) -> str:
    """One sentence naming how the bottleneck moved from ``before`` to ``after`` (exposed shares).

    "data wait 64% -> 3%; the step is now GPU backward, 51% (3.10x samples/s)" when the
    largest category changed; "data wait still limits the step: 64% -> 58%" when it did not.
    With ``noise`` (the speedup is inside the runs' spread), the speedup is said to be inside it."""
    rate = f" ({speedup:.2f}x {rate_key.replace('_per_s', '/s')})" if speedup is not None else ""
    if noise is not None and speedup is not None:
        rate = f" ({speedup:.2f}x {rate_key.replace('_per_s', '/s')}, inside the runs' spread of ±{percent(noise, 0)}: no measurable change)"
    if not before or not after:
        return f"no breakdown to compare{rate}".strip()
    old_top, old_share = _top(before) or ("", 0.0)
    new_top, new_share = _top(after) or ("", 0.0)
    if old_top == new_top:
        change = f"{percent(old_share, 0)} -> {percent(new_share, 0)}"
        if abs(new_share - old_share) < MIN_SHIFT:
            return f"no shift: {words[new_top]} still limits the step ({change}){rate}"
        return f"{words[new_top]} still limits the step: {change}{rate}"
    return (
        f"{words[old_top]} {percent(old_share, 0)} -> {percent(after.get(old_top, 0.0), 0)}; "
        f"the step is now {words[new_top]}, {percent(new_share, 0)}{rate}"
    )


def _shares(report: Report, prefix: str, names: tuple[str, ...]) -> dict[str, float] | None:
    if not report.breakdown:
        return None
    return {name: report.symptom_value(f"{prefix}.{name}") or 0.0 for name in names}


def _row(name: str, label: str, shares: list[float | None]) -> ShareRow:
    base = shares[0]
    deltas = tuple(None if s is None or base is None else round(s - base, 6) for s in shares)
    return ShareRow(name, label, tuple(shares), deltas)


def _top(shares: dict[str, float] | None) -> tuple[str, float] | None:
    if not shares:
        return None
    name = max(shares, key=lambda k: shares[k])
    return name, shares[name]


def _fired(report: Report) -> tuple[str, ...]:
    return tuple(f.rule for f in report.findings)


def _speedup(base: float | None, rate: float | None) -> float | None:
    return None if base is None or rate is None or base <= 0 else round(rate / base, 4)
