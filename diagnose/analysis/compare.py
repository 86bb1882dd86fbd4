"""Several reports side by side: how a change moved the bottleneck.

Contract: ``compare_reports([(label, report), ...]) -> Comparison``; pure, no files, no torch.
The first report is the baseline: every later one is compared with it (throughput speedup, the
change of each exposed category's and each phase's share, the findings that appeared and
disappeared) and, in one sentence, with the run just before it (the shift: "data wait 64% ->
3%; the step is now GPU backward, 51%"), because a list of runs is usually a list of fixes made
one after another. ``Comparison.to_dict()`` is what ``diagnose compare --json`` prints.

Throughput is compared in samples per second when every run knows it (a batch-size change
alters the work per step), else in steps per second; the steady figure (profiler off) when a
run has it, else the profiled one (``throughput_of``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from diagnose.analysis.categories import EXPOSED, PHASE_LABELS, PHASES, exposed_categories
from diagnose.analysis.report import Report, html_frame
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


def throughput_of(report: Report, rate_key: str) -> float | None:
    """The run's ``rate_key`` figure (``samples_per_s`` or ``steps_per_s``): steady when
    measured, else profiled; None when the run measured neither."""
    for window in ("steady", "profiled"):
        timing = (report.throughput or {}).get(window) or {}
        value = timing.get(rate_key)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None


def rate_key_for(reports: Sequence[Report]) -> str:
    """``samples_per_s`` when every report has it, else ``steps_per_s``."""
    return "samples_per_s" if all(throughput_of(r, "samples_per_s") is not None for r in reports) else "steps_per_s"


def step_ms(report: Report) -> tuple[float | None, float | None, float | None]:
    """The mean step with its p10 and p90 (the report's statistic, as verify and sweep show it),
    from the steady window where it was timed, else the profiled one."""
    for window in ("steady", "profiled"):
        timing = (report.throughput or {}).get(window) or {}
        mean = timing.get("mean_step_ms")
        if isinstance(mean, (int, float)):
            low, high = timing.get("p10_step_ms"), timing.get("p90_step_ms")
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


@dataclass(frozen=True)
class Comparison:
    runs: tuple[RunColumn, ...]
    rate_key: str  # samples_per_s or steps_per_s
    on_gpu: bool  # some run used a GPU: GPU wording for the categories
    exposed: tuple[ShareRow, ...]  # the categories with time in some run, display order
    phases: tuple[ShareRow, ...]
    titles: dict[str, str]  # rule id -> title, for every rule that fired in some run
    #: the reports compared, in order (the HTML page draws their steps); not part of to_dict()
    reports: tuple[Report, ...] = field(default=(), repr=False, compare=False)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(run.label for run in self.runs)

    @property
    def shifts(self) -> tuple[str, ...]:
        return tuple(run.shift for run in self.runs if run.shift)

    def _repr_html_(self) -> str:
        """Jupyter shows a comparison as its HTML page (renderers imported only when asked)."""
        from diagnose.renderers.comparison import render_comparison

        return html_frame(render_comparison(self, "html"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": COMPARISON_SCHEMA,
            "rate_key": self.rate_key,
            "on_gpu": self.on_gpu,
            "runs": [asdict(run) for run in self.runs],
            "exposed": [asdict(row) for row in self.exposed],
            "phases": [asdict(row) for row in self.phases],
            "titles": dict(self.titles),
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
    base_rate = throughput_of(reports[0], rate_key)
    base_rules = _fired(reports[0])
    columns: list[RunColumn] = []
    for i, (label, report) in enumerate(runs):
        rate = throughput_of(report, rate_key)
        fired = _fired(report)
        top = _top(exposed_shares[i])
        steps = step_ms(report)
        shift = None
        if i > 0:
            shift = shift_sentence(exposed_shares[i - 1], exposed_shares[i], words, _speedup(throughput_of(reports[i - 1], rate_key), rate), rate_key)
        columns.append(
            RunColumn(
                label=label,
                source=str(report.source.get("run_dir") or report.source.get("trace") or ""),
                state=str((report.status or {}).get("state", "unknown")),
                verdict=report.verdict,
                throughput=rate,
                speedup=_speedup(base_rate, rate),
                mean_step_ms=steps[0],
                p10_step_ms=steps[1],
                p90_step_ms=steps[2],
                gpu_busy=report.gpu_busy_share() if report.on_gpu else None,
                findings=fired,
                appeared=tuple(r for r in fired if r not in base_rules) if i else (),
                disappeared=tuple(r for r in base_rules if r not in fired) if i else (),
                top_category=top[0] if top else None,
                top_share=top[1] if top else None,
                shift=shift,
            )
        )
    titles = {f["rule"]: f.get("title", "") for r in reports for f in r.findings}
    return Comparison(tuple(columns), rate_key, on_gpu, exposed_rows, phase_rows, titles, tuple(reports))


def shift_sentence(
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    words: dict[str, str],
    speedup: float | None = None,
    rate_key: str = "samples_per_s",
) -> str:
    """One sentence naming how the bottleneck moved from ``before`` to ``after`` (exposed shares).

    "data wait 64% -> 3%; the step is now GPU backward, 51% (3.10x samples/s)" when the
    largest category changed; "data wait still limits the step: 64% -> 58%" when it did not."""
    rate = f" ({speedup:.2f}x {rate_key.replace('_per_s', '/s')})" if speedup is not None else ""
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
    return tuple(f["rule"] for f in report.findings)


def _speedup(base: float | None, rate: float | None) -> float | None:
    return None if base is None or rate is None or base <= 0 else round(rate / base, 4)
