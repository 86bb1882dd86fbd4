"""The report as typed values: the contract between the analysis and the renderers.

Contract: the analysis builds a ``Report`` (``diagnose.analysis.report.build_report``); every
renderer reads it, attribute by attribute, and nothing parses its JSON form back. As
``record.py`` is the contract between the runtime and the analysis, this module is the one
between the analysis and the output: it sits on the ground floor and imports nothing of
diagnose but the version and ``units``.

``Report.to_dict()`` is what ``report.json`` holds (schema ``diagnose.report/2``, field by field
in docs/report-schema.md); ``Report.from_dict``/``Report.load`` read it back, upgrading schema 1
files. The JSON Schema shipped in ``diagnose/schema/report.schema.json`` is generated from these
types (``python -m diagnose.report --schema``; tests/test_schema.py compares it with the file).

Each section is a ``Section`` (a msgspec ``Struct``): its fields are its JSON keys, in order.
A field listed in a section's ``_optional`` is left out of the JSON while it is None (the key
is absent in schema 2's files, not null). The records of what the runner saw, whose keys are
``run.json``'s and grow with it (``environment``, ``dataloader``, ``optimizers``, ``models``,
``flags``, ``memory``, the hot-spot samples), stay mappings.

Reading a section as a mapping (``report.findings[0]["rule"]``, ``report.status.get("state")``)
keeps working for code written against the dictionaries of earlier versions; attribute access
is the typed way.

Why one module: this is the report's one declaration (some forty section types, each
field commented where docs/report-schema.md needs it), read top to bottom in report.json's order;
split, its parts would only import each other.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal

import msgspec
from msgspec import Meta

from diagnose.jupyter import notebook_frame
from diagnose.units import gain_words, measured_words
from diagnose.version import __version__

REPORT_SCHEMA: Final = "diagnose.report/2"

#: a measured number: an integer where the analysis counted one, else a float
Number = int | float


class Section(msgspec.Struct, kw_only=True):
    """A part of the report. Readable as a mapping too (``section["key"]``, ``.get``, ``in``;
    ``section["key"] = value`` sets a field), for code written against the dictionaries of
    earlier versions; ``to_dict()`` is its JSON object."""

    #: fields left out of the JSON while None (absent in schema 2's files rather than null)
    _optional: ClassVar[frozenset[str]] = frozenset()
    #: fields the JSON Schema requires (a report without them is refused)
    _required: ClassVar[tuple[str, ...]] = ()
    #: fields written as an empty object while None (a bare trace's ``run`` is ``{}``)
    _empty_when_none: ClassVar[frozenset[str]] = frozenset()

    def _absent(self, name: str) -> bool:
        return name in self._optional and getattr(self, name) is None

    def _key_to_field(self, key: str) -> str | None:
        fields = self.__struct_fields__
        names = self.__struct_encode_fields__
        if key in names:
            name = fields[names.index(key)]
            return None if self._absent(name) else name
        return None

    def __getitem__(self, key: str) -> Any:
        name = self._key_to_field(key)
        if name is None:
            raise KeyError(key)
        return getattr(self, name)

    def __setitem__(self, key: str, value: Any) -> None:
        names = self.__struct_encode_fields__
        if key not in names:
            raise KeyError(f"{type(self).__name__} has no field {key!r}")
        name = self.__struct_fields__[names.index(key)]
        if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, dict) for v in value)):
            value = convert(value, _field_types(type(self))[name])  # the JSON's form into the field's type
        setattr(self, name, value)

    def get(self, key: str, default: Any = None) -> Any:
        name = self._key_to_field(key)
        return default if name is None else getattr(self, name)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._key_to_field(key) is not None

    def keys(self) -> Iterator[str]:
        return iter(to_builtins(self))

    def to_dict(self) -> dict[str, Any]:
        """The section as its JSON object (a copy)."""
        return to_builtins(self)


@functools.cache
def _field_types(section: type[Section]) -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(section)}


def to_builtins(value: Any) -> Any:
    """A report value as JSON-ready builtins: sections become dicts (their optional fields
    left out while None), tuples lists, paths strings, sets sorted lists; infinite and NaN
    numbers None (JSON has neither, and "inf ms/step" says nothing)."""
    if isinstance(value, Section):
        out = {}
        for name, key in zip(value.__struct_fields__, value.__struct_encode_fields__, strict=True):
            if value._absent(name):
                continue
            field_value = getattr(value, name)
            out[key] = {} if field_value is None and name in value._empty_when_none else to_builtins(field_value)
        return out
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: to_builtins(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_builtins(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return value


def convert(data: Any, kind: Any) -> Any:
    """``data`` (a JSON object, or a dict the analysis built) as the report type ``kind``;
    ``ValueError`` saying where a value is of the wrong kind."""
    try:
        return msgspec.convert(data, kind, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(f"report: {exc}") from None


# --- where the report came from, and how the run ended -----------------------------------------


class Source(Section):
    _optional = frozenset({"run_dir", "trace", "trace_events", "rank", "ranks"})
    _required = ("kind",)

    kind: Annotated[str, Meta(description="run, trace or sweep")] = "run"
    run_dir: str | None = None
    #: the rank whose breakdown and findings the report shows (a distributed run)
    rank: int | None = None
    trace: str | None = None
    #: the ranks whose records were found
    ranks: list[int] | None = None
    trace_events: int | None = None


class ErrorInfo(Section):
    type: str = ""
    message: str = ""
    traceback: str = ""


RunState = Literal[
    "completed",
    "stopped",
    "exited",
    "failed",
    "interrupted",
    "terminated",
    "oom",
    "no_steps",
    "not_run",
    "crashed",
    "trace",
    "sweep",
]


class Status(Section):
    _required = ("state",)

    state: RunState = "trace"
    exit_code: int | None = 0
    message: str = ""
    error: ErrorInfo | None = None


# --- the run ---------------------------------------------------------------------------------------


class Target(Section):
    _optional = frozenset({"args", "cwd"})

    kind: str = ""
    value: str = ""
    args: list[str] | None = None
    cwd: str | None = None


class WindowGrowth(Section):
    """How the profiled window grew while its steps varied widely."""

    _optional = frozenset({"planned_steps", "max_steps", "steps", "ended_by", "p90_over_median", "mean_uncertainty"})

    planned_steps: int | None = None
    max_steps: int | None = None
    steps: int | None = None
    ended_by: str | None = None
    p90_over_median: Number | None = None
    mean_uncertainty: Number | None = None


class ShortRun(Section):
    """What a script with fewer steps than the plan needs left out."""

    steps: int = 0
    needed: int = 0
    source: str | None = None
    profiled: int = 0
    planned_profiled: int = 0
    timed: int = 0
    planned_timed: int = 0
    #: the script's own setting that gives enough steps (``--max_iters 36``), None: none known
    more_steps: str | None = None


class RunInfo(Section):
    target: Target | None = None
    command: list[str] | None = None
    started_at: str | None = None
    ended_at: str | None = None
    wall_s: Number | None = None
    plan: dict[str, Any] = msgspec.field(default_factory=dict)
    step_mode: str | None = None
    steps_seen: int | None = None
    startup_s: Number | None = None
    profiled_steps: int | None = None
    window_growth: WindowGrowth | None = None
    short_run: ShortRun | None = None
    after_last_step_s: Number | None = None
    knobs: dict[str, Any] = msgspec.field(default_factory=dict)
    trace_files: Any = None


# --- throughput and the breakdown ---------------------------------------------------------------


class Timing(Section):
    """Step timing of one window (profiled, or steady with the profiler off)."""

    _required = ("steps",)

    steps: int = 0
    median_step_ms: Number | None = None
    p10_step_ms: Number | None = None
    p90_step_ms: Number | None = None
    mean_step_ms: Number | None = None
    #: the p90 step is over 1.5x the median (record.NOISY_P90_OVER_MEDIAN)
    noisy: bool | None = None
    #: half the range of the means of 3 consecutive blocks of the steps, over their mean
    mean_spread: Number | None = None
    steps_per_s: Number | None = None
    samples_per_s: Number | None = None
    #: timed steps left out of the figures above: an epoch's turn or another DataLoader's pass
    #: (an evaluation) began in them (``RunRecord.steady_steps``); absent where none was
    left_out: int | None = None

    def _absent(self, name: str) -> bool:
        if name == "left_out":
            return self.left_out is None
        return self.steps == 0 and name != "steps"  # a window of no step: ``{"steps": 0}``


class Throughput(Section):
    _optional = frozenset({"profiled", "note", "turn_free", "batch_from"})

    batch_size: Number | None = None
    #: where ``batch_size`` came from when no DataLoader fed the steps: the script's own option
    #: ("--batch_size"), each step counted at its value (absent: the DataLoaders' batches)
    batch_from: str | None = None
    profiled: Timing | None = None
    steady: Timing | None = None
    #: the steady figures with every timed step at an epoch's turn left out, where the steady ones
    #: kept some (epochs no longer than the timed steps: ``RunRecord.steady_steps``): what a run of
    #: another batch is compared by, whose epochs turn at another rate while a turn costs the same
    #: per sample (a ResNet-18 at twice its batch: 20 batches an epoch and one evaluation pass in
    #: 20 timed steps measured 0.51-0.55x in the run's check, 1.20-1.76x under verify, docs/zoo.md)
    turn_free: Timing | None = None
    note: str | None = None

    def _absent(self, name: str) -> bool:
        # steady is null (not absent) where the run made steps but timed none: the note says why
        if name == "steady":
            return self.steady is None and self.note is None
        return super()._absent(name)


class Step(Section):
    """One profiled step: its time per phase and per exposed category, its GPU counters."""

    _required = ("number", "duration_ms", "phases_ms", "exposed_ms")

    number: int = 0
    start_us: Number | None = None
    duration_ms: Number = 0.0
    phases_ms: dict[str, Number] = msgspec.field(default_factory=dict)
    exposed_ms: dict[str, Number] = msgspec.field(default_factory=dict)
    gpu_busy_ms: Number | None = None
    kernels: int | None = None
    median_kernel_us: Number | None = None
    h2d_pageable_bytes: Number | None = None
    h2d_pinned_bytes: Number | None = None
    h2d_copies: int | None = None
    d2h_bytes: Number | None = None
    syncs: int | None = None
    sync_blocked_ms: Number | None = None
    syncs_by_kind: dict[str, Any] | None = None
    matmul_ms: dict[str, Number] | None = None


class StepStat(Section):
    """One category's mean per step and the p10-p90 range of the steps (ms)."""

    mean_ms: Number | None = None
    p10_ms: Number | None = None
    p90_ms: Number | None = None


class PerStep(Section):
    statistic: str = "mean"
    spread: str = "p10-p90"
    exposed_step_ms: Number = 0.0
    #: the step the exposed shares are shares of: "steady" (calibrated) or "profiled"
    exposed_basis: Literal["steady", "profiled"] = "profiled"
    phase_step_ms: Number = 0.0
    exposed: dict[str, StepStat] = msgspec.field(default_factory=dict)
    phases: dict[str, StepStat] = msgspec.field(default_factory=dict)


class Window(Section):
    _optional = frozenset({"per_step", "median_ms"})
    _required = ("total_ms", "median_step_ms")

    total_ms: Number | None = None
    median_step_ms: Number | None = None
    trace_exposed_share: dict[str, Number] | None = None
    profiler_inflation: Number | None = None
    per_step: PerStep | None = None
    #: a report written before ``per_step``: the median per category
    median_ms: dict[str, Any] | None = None
    h2d_pinned_bytes_per_step: Number | None = None


class StepTimeline(Section):
    """The median step in time order: ``bins`` equal slices, runs of ``(name, slices)``."""

    step: int = 0
    duration_us: Number = 0.0
    bins: int = 1
    phases: list[tuple[str, int]] = msgspec.field(default_factory=list)
    exposed: list[tuple[str, int]] = msgspec.field(default_factory=list)


class Breakdown(Section):
    _required = ("device", "steps", "window")

    device: Literal["cuda", "cpu"] = "cpu"
    median_step_timeline: StepTimeline | None = None
    steps: list[Step] = msgspec.field(default_factory=list)
    window: Window = msgspec.field(default_factory=Window)


class Symptom(Section):
    _optional = frozenset({"low", "high"})
    _required = ("value", "unit")

    value: Number | None = None
    unit: str = ""
    description: str = ""
    #: the per-step p10 and p90, centred on the value, where it varies from step to step
    low: Number | None = None
    high: Number | None = None


# --- findings -------------------------------------------------------------------------------------


class Measured(Section):
    """What ``diagnose run``'s short A/B measured for a finding's knobs."""

    _required = ("speedup", "spread", "verdict")

    speedup: Number = 1.0
    spread: Number = 0.0
    verdict: Literal["helped", "no effect", "slower"] = "helped"
    change: str = ""
    interval: Annotated[
        list[Number] | None,
        Meta(
            description="what a rerun of the A/B reads, 90% (low, high): its baseline's spread and the run-to-run term of its two runs"
        ),
    ] = None


Basis = Literal["measured", "predicted", "bound"]


class Finding(Section):
    _required = ("rule", "title", "category", "kind", "says", "do", "evidence")

    rule: str = ""
    title: str = ""
    category: str = ""
    kind: str = ""
    says: str = ""
    do: str = ""
    why: str = ""
    gain_bound: Number | None = None
    predicted_speedup: Number | None = None
    predicted_interval: Annotated[
        list[Number] | None,
        Meta(
            description="the prediction's 90% interval (low, high): block bootstrap over the profiled steps times the transformation's model error and the run-to-run term"
        ),
    ] = None
    prediction_note: str | None = None
    model_weakness: Annotated[
        str | None, Meta(description="why the model is known to predict this change badly on this run")
    ] = None
    basis: Annotated[Basis | None, Meta(description="what the finding's rank stands on")] = None
    measured: Annotated[
        Measured | None, Meta(description="what diagnose run's short A/B measured for this finding's knobs")
    ] = None
    first_share: Annotated[
        Number | None, Meta(description="share of the resamples in which this finding ranks first")
    ] = None
    check: Annotated[list[str], Meta(description="why the finding's gain is unsure enough to measure")] = msgspec.field(
        default_factory=list
    )
    dominant: Annotated[
        str | None, Meta(description="the exposed category over half the step that this fix relieves")
    ] = None
    gain_formula: str | None = None
    #: names of symptoms: their values, units and descriptions are the report's ``symptoms``
    evidence: list[str] = msgspec.field(default_factory=list)
    references: list[str] = msgspec.field(default_factory=list)
    knobs: dict[str, Any] | None = msgspec.field(default_factory=dict)
    lines: str | list[str] | None = None
    framework: str | None = None
    #: symptoms whose step-to-step spread reaches the rule's threshold (a rerun may not fire it)
    borderline: list[str] = msgspec.field(default_factory=list)

    @property
    def ranked_by(self) -> Basis:
        """What the rank stands on (a report from before ``basis`` was kept: read off the gains)."""
        return self.basis or ("predicted" if self.predicted_speedup is not None else "bound")

    @property
    def gain_text(self) -> str:
        """The gain as every renderer words it: measured (with its spread), else predicted with
        its interval, else the bound."""
        if self.measured is not None:
            m = self.measured
            return measured_words(m.speedup, m.spread, m.interval, m.change or "its knobs")
        words = gain_words(self.predicted_speedup, self.gain_bound)
        if self.predicted_interval:
            low, high = self.predicted_interval
            words += f" (90% interval {low:.2f}x–{high:.2f}x)"
        return words


class ToCheck(Section):
    _required = ("rule", "why")

    rule: str = ""
    why: list[str] = msgspec.field(default_factory=list)
    knobs: dict[str, Any] | None = None


class Ranking(Section):
    """How sure the ranking is (findings.ranking_summary)."""

    _optional = frozenset({"check"})

    steps: int | None = None
    resamples: int | None = None
    seed: int | None = None
    block: int | None = None
    interval: Number | None = None
    host_share: Annotated[
        Number | None, Meta(description="share of the profiled steps' time the GPU idles (host-side exposed)")
    ] = None
    floor: Number | None = None
    mean_uncertainty: Number | None = None
    run_to_run: Annotated[
        Number | None, Meta(description="the run-to-run term of the floor: whether a change moved the mean step")
    ] = None
    rerun_spread: Annotated[
        Number | None,
        Meta(description="what the intervals take a rerun to move the steady step by, from host_share"),
    ] = None
    top: str | None = None
    basis: str | None = None
    first_share: Number | None = None
    settled: bool | None = None
    to_check: list[ToCheck] = msgspec.field(default_factory=list)
    check: Annotated[
        dict[str, Any] | None,
        Meta(description="what diagnose run's short A/B did: budget, time spent, each experiment"),
    ] = None


class Replay(Section):
    """The replay of the unchanged step against the measured one, and the prediction settings."""

    _optional = frozenset(
        {
            "host_code_scale",
            "gpu_stretch",
            "mean_uncertainty",
            "profiler_event_source",
            "profiler_event_us",
            "step_spread",
        }
    )

    steps: int | None = None
    measured_ms: Number | None = None
    replayed_ms: Number | None = None
    error: Number | None = None
    within_tolerance: bool | None = None
    tolerance: Number | None = None
    mode: str | None = None
    host_free_ms: Number | None = None
    host_code_scale: Number | None = None
    step_spread: Number | None = None
    mean_uncertainty: Number | None = None
    profiler_event_us: Number | None = None
    profiler_event_source: str | None = None
    gpu_stretch: Number | None = None

    @property
    def checked(self) -> bool:
        """The replay ran and measured a window (an older or partial report may lack both)."""
        return self.replayed_ms is not None and self.measured_ms is not None


# --- ranks -----------------------------------------------------------------------------------------


class RankSummary(Section, kw_only=False):
    """One rank of a distributed job: its row of the side-by-side table, and what the job's view
    is built from (``analysis/ranks.py``'s ``summarize_rank``): a few hundred bytes, round-tripped
    through JSON or ``all_gather_object`` by ``to_dict``/``from_dict``."""

    _required = ("rank",)

    rank: int = 0
    status: str = ""
    median_step_ms: Number | None = None
    data_wait_ms: Number | None = None  # exposed, per step (median)
    data_wait_share: Number | None = None
    #: in flight per step: the collectives' (every kind's), else the kernels' (median)
    communication_ms: Number | None = None
    exposed_communication_share: Number | None = None
    gpu_busy: Number | None = None
    samples_per_step: Number | None = None
    top_exposed: str | None = None
    backend: str | None = None
    #: measured with the profiler off, after the window (None when too few steps ran)
    steady_samples_per_s: Number | None = None
    #: mean step with the profiler off (the timed steps)
    steady_step_ms: Number | None = None
    #: every profiled step's time, in order
    step_ms: list[Number] | None = msgspec.field(default_factory=list)
    #: shares of the window's time per host phase and per exposed category
    phase_share: dict[str, Number] = msgspec.field(default_factory=dict)
    exposed_share: dict[str, Number] = msgspec.field(default_factory=dict)
    #: communication per step: exposed (nothing else beside it) and overlapped with compute
    communication_exposed_ms: Number | None = None
    communication_overlapped_ms: Number | None = None
    #: per collective kind ("all_gather", "reduce_scatter", "all_reduce", ...): calls_per_step,
    #: ms, exposed_ms, overlapped_ms (``analysis.collectives``)
    collectives: dict[str, Any] = msgspec.field(default_factory=dict)
    #: the rank's own files in the run directory: its trace (None once removed) and report
    trace: str | None = None
    report: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankSummary:
        """A summary read back (a file, another rank's ``all_gather_object``); unknown keys (a
        newer diagnose's) are left out, missing ones take their defaults."""
        summary: RankSummary = convert(data, cls)
        return summary

    @property
    def exposed_communication_ms(self) -> float | None:
        """Exposed communication per step as the breakdown writes it: the exposed share of the
        steady step (of the profiled mean step where the rank timed none), so that the lead
        rank's row and the report's breakdown give one figure."""
        step = self.steady_step_ms
        if step is None:
            step = sum(self.step_ms) / len(self.step_ms) if self.step_ms else self.median_step_ms
        return (
            None
            if self.exposed_communication_share is None or step is None
            else self.exposed_communication_share * step
        )


class Straggler(Section):
    rank: int = 0
    data_wait_ms: Number = 0.0
    others_data_wait_ms: Number = 0.0
    excess_ms: Number | None = None
    excess_share: Number | None = None
    median_step_ms: Number | None = None


class Distributed(Section):
    _optional = frozenset({"gathered", "traces_removed"})
    _required = ("world_size", "ranks")

    world_size: int = 0
    job_samples_per_s: Number | None = None
    step_ms: dict[str, Number] | None = None
    step_imbalance: Number | None = None
    communication_exposed_ms: dict[str, Number] | None = None
    collectives_worst_rank: dict[str, Any] | None = None
    ranks: list[RankSummary] = msgspec.field(default_factory=list)
    straggler: Straggler | None = None
    #: rank -> why its trace is kept
    notable_ranks: dict[str, str] = msgspec.field(default_factory=dict)
    gathered: str | None = None
    traces_removed: list[int] | None = None


# --- experiments (diagnose verify, diagnose sweep) ---------------------------------------------------


class TopExposed(Section):
    category: str | None = None
    share: Number = 0.0


class CompileCost(Section):
    _optional = frozenset({"break_even_steps"})

    compile_s: Number | None = None
    break_even_steps: int | None = None


#: experiment rows with no measurement to draw
FAILED_STATES = ("oom", "failed")


class ExperimentRow(Section):
    _optional = frozenset({"role", "compile", "predicted_speedup", "gain_bound", "knobs_applied"})
    _required = ("label", "status")

    label: str = ""
    knobs: dict[str, Any] = msgspec.field(default_factory=dict)
    status: str = "ok"
    run_dir: str | None = None
    basis: Literal["steady", "profiled"] | None = None
    rule: str | None = None
    steps_per_s: Number | None = None
    samples_per_s: Number | None = None
    #: the timed steps' mean step and its p10-p90 (what the rates are means of)
    mean_step_ms: Number | None = None
    p10_step_ms: Number | None = None
    p90_step_ms: Number | None = None
    mean_spread: Number | None = None
    gpu_busy: Number | None = None
    peak_reserved_bytes: Number | None = None
    top_exposed: TopExposed | None = None
    top_finding: str | None = None
    startup_s: Number | None = None
    error: str | None = None
    speedup: Number | None = None
    verdict: str | None = None
    #: knob -> how it reached the script (run.json's ``knobs_via``)
    via: dict[str, str] = msgspec.field(default_factory=dict)
    #: "baseline" (the reference the speedups are measured against), "recommendation", "combined", "point", "check"
    role: str | None = None
    predicted_speedup: Number | None = None
    gain_bound: Number | None = None
    compile: CompileCost | None = None
    knobs_applied: Any = None

    @property
    def failed(self) -> bool:
        """Out of memory or failed: nothing measured."""
        return self.status in FAILED_STATES

    @property
    def reference(self) -> bool:
        """A verify baseline: the reference itself, shown as such rather than as a speedup."""
        return self.role == "baseline"

    def step_text(self, dash: str = "-") -> str | None:
        """The mean step with its p10-p90, ``"101.2 (95.0-110.3)"`` in ms; None when not measured."""
        if self.mean_step_ms is None:
            return None
        if self.p10_step_ms is None or self.p90_step_ms is None:
            return f"{self.mean_step_ms:.1f}"
        return f"{self.mean_step_ms:.1f} ({self.p10_step_ms:.1f}{dash}{self.p90_step_ms:.1f})"

    def figure(self, name: str) -> float | None:
        """A measured figure by its report name (``samples_per_s`` ...), for charts that pick one."""
        value = getattr(self, name)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def via_text(self) -> str:
        """How the knobs reached the loop, for a table cell: the way alone for one knob
        (``Trainer(precision="bf16-mixed")``), ``knob: way`` joined by ``; `` for several."""
        ways = [(str(k), str(self.via[k])) for k in self.knobs if self.via.get(k)]
        if len(ways) == 1 and len(self.knobs) == 1:
            return ways[0][1]
        return "; ".join(f"{k}: {way}" for k, way in ways)


class Experiments(Section):
    _optional = frozenset({"basis", "statistic", "baseline_rate", "baseline_spread", "baseline_spread_from", "plot"})
    _required = ("kind", "rows")

    kind: Literal["verify", "sweep"] = "sweep"
    parameters: list[str] = msgspec.field(default_factory=list)
    compared_by: str = "steps_per_s"
    basis: Literal["steady", "profiled"] | None = None
    statistic: str | None = None
    baseline_rate: Number | None = None
    baseline_spread: Number | None = None
    #: "repeats", "blocks", "steps" or "rerun": where a verify baseline's spread comes from
    baseline_spread_from: Literal["repeats", "blocks", "steps", "rerun"] | None = None
    rows: list[ExperimentRow] = msgspec.field(default_factory=list)
    conclusions: list[str] = msgspec.field(default_factory=list)
    plot: str | None = None

    @property
    def rate_key(self) -> str:
        """samples_per_s when any row has it, else steps_per_s."""
        return "samples_per_s" if any(r.samples_per_s for r in self.rows) else "steps_per_s"

    @property
    def shows_gpu_busy(self) -> bool:
        """Some run used a GPU (a CPU-only sweep has no GPU busy figure worth a column)."""
        return any(row.gpu_busy for row in self.rows)

    @property
    def shows_memory(self) -> bool:
        """Some run measured its device memory (none does on a CPU)."""
        return any(row.peak_reserved_bytes for row in self.rows)


# --- the distance to the hardware limit -------------------------------------------------------------


class GpuPeaks(Section):
    name: str | None = None
    peak_tflops: dict[str, Number] = msgspec.field(default_factory=dict)
    memory_gbs: Number | None = None
    measured_tflops: dict[str, Number] = msgspec.field(default_factory=dict)
    source: str | None = None


class FlopCount(Section):
    step: Number | None = None
    per_step: Number | None = None
    by_phase: dict[str, Number] = msgspec.field(default_factory=dict)
    by_dtype: dict[str, Number] = msgspec.field(default_factory=dict)
    dtype: str | None = None
    step_s: Number | None = None
    samples_scale: Number | None = None
    notes: list[str] = msgspec.field(default_factory=list)


class KernelLine(Section):
    name: str = ""
    kind: str = msgspec.field(default="", name="class")
    ms_per_step: Number = 0.0
    share: Number = 0.0
    calls_per_step: Number | None = None
    tflops: Number | None = None
    gbs: Number | None = None


class RooflinePoint(Section):
    kind: str = msgspec.field(default="", name="class")
    intensity: Number = 0.0
    tflops: Number = 0.0
    roof_tflops: Number = 0.0
    bound: str = ""
    time_share: Number = 0.0


class Roofline(Section):
    peak_tflops: Number | None = None
    memory_gbs: Number | None = None
    dtype: str | None = None
    points: list[RooflinePoint] = msgspec.field(default_factory=list)

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the memory roof meets the compute roof."""
        return float(self.peak_tflops or 0) * 1e12 / (float(self.memory_gbs or 1) * 1e9)


class Oom(Section):
    largest: str = ""
    parts_bytes: dict[str, Number] = msgspec.field(default_factory=dict)
    requested_bytes: Number | None = None
    capacity_bytes: Number | None = None
    changes: list[str] = msgspec.field(default_factory=list)


class Limits(Section):
    """The structure behind the ``flops.*``, ``kernels.*``, ``memory.*`` and ``oom.*`` symptoms."""

    _optional = frozenset({"gpu", "flops", "kernels", "classes", "roofline", "estimated", "memory_split", "oom"})

    gpu: GpuPeaks | None = None
    flops: FlopCount | None = None
    kernels: list[KernelLine] | None = None
    classes: dict[str, dict[str, Any]] | None = None
    roofline: Roofline | None = None
    estimated: list[str] | None = None
    memory_split: dict[str, Number | None] | None = None
    oom: Oom | None = None


# --- the whole run (diagnose watch) ------------------------------------------------------------------


class WholeWindow(Section):
    _required = ("reason", "first_step", "steps")

    reason: str = ""
    first_step: int = 0
    steps: int = 0
    trace: str | None = None
    bytes: Number | None = None


class RankGoodput(Section):
    _required = ("rank", "goodput", "wall_s")

    rank: int = 0
    goodput: Number = 0.0
    wall_s: Number = 0.0
    seconds: dict[str, Number] = msgspec.field(default_factory=dict)


class TimeSlice(Section):
    _required = ("t0", "t1", "shares")

    t0: Number = 0.0
    t1: Number = 0.0
    shares: dict[str, Number] = msgspec.field(default_factory=dict)


class Whole(Section):
    """The whole run's wall-clock by bucket (seconds and shares summing to wall_s), goodput,
    the shifts found, and the series the HTML timeline draws."""

    _optional = frozenset({"ranks", "job_goodput"})
    _required = ("wall_s", "seconds", "shares", "goodput", "named_share", "steps", "shifts", "timeline", "step_series")

    wall_s: Number = 0.0
    seconds: dict[str, Number] = msgspec.field(default_factory=dict)
    steps: int = 0
    events: dict[str, list[dict[str, Any]]] = msgspec.field(default_factory=dict)
    shifts: dict[str, Any] = msgspec.field(default_factory=dict)
    timeline: list[TimeSlice] = msgspec.field(default_factory=list)
    #: ``[t, median_ms, max_ms, first_step]`` of the steps
    step_series: list[Annotated[list[Number], Meta(min_length=4, max_length=4)]] = msgspec.field(default_factory=list)
    #: ``[t, steps, host_gb, gpu_gb, data_wait_share]`` twice a second at most
    memory_series: list[Annotated[list[Number | None], Meta(min_length=5, max_length=5)]] = msgspec.field(
        default_factory=list
    )
    windows: list[WholeWindow] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    shares: dict[str, Number] = msgspec.field(default_factory=dict)
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    goodput: Number = 0.0
    named_share: Number = 0.0
    ranks: list[RankGoodput] | None = None
    job_goodput: Number | None = None


class TraceOnly(Section):
    """What was read off a trace analysed without its run record, and what it could not show."""

    read_off: dict[str, Any] = msgspec.field(default_factory=dict)
    not_seen: list[str] = msgspec.field(default_factory=list)


# --- the report -------------------------------------------------------------------------------------


class Report(Section):
    """The report every diagnose run, analyze, verify and sweep writes; docs/report-schema.md
    describes each field. Fields may be added without a new schema number, so objects accept
    properties not listed here."""

    _empty_when_none = frozenset({"run"})
    _required = (
        "schema",
        "diagnose_version",
        "source",
        "status",
        "throughput",
        "breakdown",
        "symptoms",
        "verdict",
        "healthy",
        "findings",
        "warnings",
    )

    schema: Literal["diagnose.report/2"] = REPORT_SCHEMA
    diagnose_version: str = __version__
    created_at: str = ""
    source: Source = msgspec.field(default_factory=Source)
    status: Status = msgspec.field(default_factory=Status)
    #: None for a bare trace (written as ``{}``)
    run: RunInfo | None = None
    environment: dict[str, Any] = msgspec.field(default_factory=dict)
    dataloader: dict[str, Any] | None = None
    dataloaders: list[dict[str, Any]] = msgspec.field(default_factory=list)
    optimizers: list[dict[str, Any]] = msgspec.field(default_factory=list)
    models: list[dict[str, Any]] = msgspec.field(default_factory=list)
    flags: dict[str, Any] = msgspec.field(default_factory=dict)
    throughput: Throughput = msgspec.field(default_factory=Throughput)
    memory: dict[str, Any] = msgspec.field(default_factory=dict)
    breakdown: Breakdown | None = None
    symptoms: dict[str, Symptom] = msgspec.field(default_factory=dict)
    verdict: str = ""
    healthy: bool = False
    findings: list[Finding] = msgspec.field(default_factory=list)
    next_steps: list[Finding] = msgspec.field(default_factory=list)
    findings_not_shown: int = 0
    #: fixes that fired but were predicted to gain less than the spread, one line each
    considered: list[str] = msgspec.field(default_factory=list)
    #: rules that did not fire but would within their symptoms' step-to-step spread, one line each
    borderline: list[str] = msgspec.field(default_factory=list)
    replay: Replay | None = None
    ranking: Annotated[Ranking | None, Meta(description="how sure the ranking is (findings.ranking_summary)")] = None
    sync_sites: list[dict[str, Any]] = msgspec.field(default_factory=list)
    host_hotspots: dict[str, Any] = msgspec.field(default_factory=dict)
    worker_hotspots: dict[str, Any] = msgspec.field(default_factory=dict)
    experiments: Experiments | None = None
    #: a distributed run: ``world_size``, ``ranks`` (one summary each), ``straggler``
    distributed: Distributed | None = None
    trace_only: TraceOnly | None = None
    limits: Limits | None = None
    whole: Annotated[
        Whole | None,
        Meta(
            description="diagnose watch: the whole run's wall-clock by bucket (seconds and shares summing to wall_s), goodput, the shifts found, and the series the HTML timeline draws"
        ),
    ] = None
    warnings: list[str] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        # Report(findings=[{...}], status={...}): sections given as the JSON's dictionaries (code
        # written against earlier versions, hand-made reports) become their types
        if self.run == {}:  # type: ignore[comparison-overlap]  # a dict before conversion
            self.run = None
        for name, kind in _SECTION_FIELDS.items():
            value = getattr(self, name)
            if _holds_dicts(value, name):
                setattr(self, name, convert(value, kind))

    # --- JSON ------------------------------------------------------------------------------------

    def to_json(self) -> str:
        # allow_nan=False: NaN and Infinity are not JSON; to_builtins made them null
        return json.dumps(self.to_dict(), indent=1, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """A report from its JSON form; a schema 1 report is upgraded to schema 2. ``ValueError``
        (saying which field) for a value of the wrong kind (``[]``, an edited file)."""
        if not isinstance(data, dict):
            raise ValueError(f"report: expected an object, got {type(data).__name__}")
        if data.get("schema") == "diagnose.report/1":
            data = upgrade_from_v1(data)
        if data.get("run") == {}:  # a bare trace's
            data = dict(data, run=None)
        report: Report = convert(data, cls)
        return report

    def save(self, path: Path) -> None:
        from diagnose.atomic import write_atomically

        write_atomically(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> Report:
        return cls.from_dict(json.loads(path.read_text()))

    def sanitized(self) -> Report:
        """A copy fit for a terminal or a page: control characters in strings written out as
        ``\\xNN`` (escape sequences from a trace never reach a terminal raw), no infinite number."""
        return Report.from_dict(sanitized(self.to_dict(), text=True))

    def _repr_html_(self) -> str | None:
        """Jupyter shows a report as its HTML page, in a frame of its own (its stylesheet and
        Content-Security-Policy stay inside). The page comes from the display registered for
        reports (``diagnose.jupyter``; ``import diagnose`` registers the HTML renderer)."""
        return notebook_frame(self)

    # --- the figures kept once, read back ----------------------------------------------------

    @property
    def on_gpu(self) -> bool:
        return self.breakdown is not None and self.breakdown.device == "cuda"

    def symptom_value(self, name: str) -> float | None:
        """A symptom's value, None when the run could not measure it."""
        entry = self.symptoms.get(name)
        return None if entry is None else entry.value

    def exposed_shares(self) -> dict[str, float]:
        """Share of the window per exposed category (empty when nothing was profiled)."""
        if not self.breakdown or not self.breakdown.steps:
            return {}
        # the steps name every exposed category, in the analysis's order
        return {cat: self.symptom_value(f"exposed.{cat}") or 0.0 for cat in self.breakdown.steps[0].exposed_ms}

    def gpu_busy_share(self) -> float | None:
        """Share of the window the GPU ran anything: 0 on a CPU-only run, None with no breakdown."""
        if not self.breakdown:
            return None
        return self.symptom_value("gpu.busy") or 0.0


#: the report's fields of section types (the others hold the runner's records as they are)
_SECTION_FIELDS: dict[str, Any] = {
    f.name: f.type
    for f in msgspec.structs.fields(Report)
    if f.name
    in (
        "source",
        "status",
        "run",
        "throughput",
        "breakdown",
        "symptoms",
        "findings",
        "next_steps",
        "replay",
        "ranking",
        "experiments",
        "distributed",
        "trace_only",
        "limits",
        "whole",
    )
}


def _holds_dicts(value: Any, name: str) -> bool:
    if isinstance(value, dict):
        return name != "symptoms" or any(isinstance(v, dict) for v in value.values())
    return isinstance(value, list) and any(isinstance(v, dict) for v in value)


# --- schema 1 -----------------------------------------------------------------------------------------

#: Window figures of schema 1 that schema 2 keeps once, as the symptom named here.
#: (``exposed_share``, ``phase_share`` and ``hidden_share`` became ``exposed.<category>``,
#: ``phase.<phase>`` and ``hidden.<phase>``.)
WINDOW_FIGURES_AS_SYMPTOMS = {
    "gpu_busy_share": "gpu.busy",
    "kernels_per_step": "gpu.kernels_per_step",
    "median_kernel_us": "gpu.median_kernel_us",
    "syncs_per_step": "sync.per_step",
}


def upgrade_from_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A schema 1 report in schema 2's form: evidence names its symptoms, and the window keeps
    no figure that the symptoms already hold (the numbers are the same, rounded differently)."""
    out = dict(data, schema=REPORT_SCHEMA)
    out["findings"] = [_evidence_as_names(f) for f in data.get("findings") or []]
    out["next_steps"] = [_evidence_as_names(f) for f in data.get("next_steps") or []]
    breakdown = data.get("breakdown")
    if isinstance(breakdown, dict) and isinstance(breakdown.get("window"), dict):
        window = dict(breakdown["window"])
        for key in ("steps", "exposed_share", "phase_share", "hidden_share", *WINDOW_FIGURES_AS_SYMPTOMS):
            window.pop(key, None)
        h2d = window.pop("h2d_bytes_per_step", None) or {}
        window["h2d_pinned_bytes_per_step"] = h2d.get("pinned")
        out["breakdown"] = dict(breakdown, window=window)
    return out


def _evidence_as_names(finding: Any) -> Any:
    if not isinstance(finding, dict):
        return finding
    evidence = [e["symptom"] if isinstance(e, dict) else e for e in finding.get("evidence") or []]
    return dict(finding, evidence=evidence)


# --- text fit for output ------------------------------------------------------------------------------

#: control characters (C0 but newline and tab, DEL, C1): in a kernel or file name from a trace
#: they would reach the terminal as escape sequences; and the characters that reorder or break
#: the lines around them (bidirectional overrides and isolates, U+2028/U+2029): a name could
#: show text other than what it holds
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _written_out(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def sanitized(value: Any, text: bool = False) -> Any:
    """A copy of a report's data fit for output: infinite and NaN numbers become None (JSON has
    neither, and "inf ms/step" says nothing); with ``text``, control characters in strings are
    written out as ``\\xNN`` (escape sequences from a trace never reach a terminal raw)."""
    if isinstance(value, Section):
        value = value.to_dict()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return _CONTROL.sub(_written_out, value) if text else value
    if isinstance(value, dict):
        return {sanitized(k, text) if isinstance(k, str) else k: sanitized(v, text) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitized(v, text) for v in value]
    return value


# --- the JSON Schema, generated -------------------------------------------------------------------------

SCHEMA_ID = "https://example.invalid/diagnose/report.schema.json"


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``report.json``, generated from the types above: each
    section a definition (its docstring and its fields' ``Meta`` descriptions kept), the fields a
    section's ``_required`` names required, a one-value ``Literal`` a ``const``. Objects accept
    properties not listed (fields may be added without a new schema number).
    ``diagnose/schema/report.schema.json`` is this, written by ``python -m diagnose.report``."""
    (_, components) = msgspec.json.schema_components([Report], ref_template="#/$defs/{name}")
    sections = {cls.__name__: cls for cls in _sections(Section)}
    for name, definition in components.items():
        definition.pop("title", None)
        cls = sections[name]
        names = dict(zip(cls.__struct_fields__, cls.__struct_encode_fields__, strict=True))
        definition.pop("required", None)
        if cls._required:
            definition["required"] = [names[field] for field in cls._required]
    components = _consts(components)
    top = components.pop("Report")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": f"diagnose report.json (schema {REPORT_SCHEMA})",
        **top,
        "$defs": dict(sorted(components.items())),
    }


def _sections(base: type[Section]) -> list[type[Section]]:
    found = []
    for cls in base.__subclasses__():
        found += [cls, *_sections(cls)]
    return found


def _consts(node: Any) -> Any:
    """``{"enum": [x]}`` as ``{"const": x}`` (a field with one allowed value); descriptions on one
    line; no defaults (the reader's business, and the version's would change the file each release)."""
    if isinstance(node, dict):
        out = {k: _consts(v) for k, v in node.items() if k != "default"}
        if isinstance(out.get("enum"), list) and len(out["enum"]) == 1:
            out["const"] = out.pop("enum")[0]
        if isinstance(out.get("description"), str):
            out["description"] = " ".join(out["description"].split())
        return out
    if isinstance(node, list):
        return [_consts(v) for v in node]
    return node


def schema_text() -> str:
    """The schema as ``diagnose/schema/report.schema.json`` holds it."""
    return json.dumps(json_schema(), indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # python -m diagnose.report > diagnose/schema/report.schema.json
    import sys

    from diagnose.report import schema_text as _text  # the package's own classes, not __main__'s

    sys.stdout.write(_text())
