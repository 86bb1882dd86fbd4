"""The report as markdown, for TensorBoard's Text tab (tables and fenced code render there).

Contract: ``MarkdownRenderer().render(report) -> str``. It reads the report's view only. The
text ends with a note on which numbers to trust: torch-tb-profiler 0.4.3 drops the DataLoader
annotations that diagnose's figures rest on, so its Overview disagrees with ours.
"""

from __future__ import annotations

from typing import Any

from diagnose.renderers.base import Renderer
from diagnose.renderers.view import ReportView, exposed_caption, phase_caption
from diagnose.units import bound_text, count, human_bytes, percent, spread_ms

TRUST_NOTE = """\
**Which numbers to trust.** The `exposed/*` and `phase/*` scalars and this text come from diagnose's
own attribution of every microsecond of every profiled step, which uses the DataLoader, optimizer
and step annotations of the trace. The PyTorch Profiler tab (torch-tb-profiler 0.4.3) drops every
user annotation except `ProfilerStep#N`: its Overview shows *DataLoader 0* and counts the data wait
as CPU Exec or Other. Use its Trace, Operator and Kernel views to drill into ops and kernels, and
these scalars for where the step time goes. `throughput/steady_*` is measured with the profiler
off and is the real speed; `throughput/profiled_*` includes the profiler's overhead."""


class MarkdownRenderer(Renderer):
    def render_view(self, view: ReportView) -> str:
        sections = [
            f"## {_cell(view.verdict or 'No verdict: nothing was profiled.')}",
            f"status: {_cell(view.status.message)}",
            _throughput(view),
            _findings(view),
            _breakdown(view),
            _dataloader(view),
            _experiments(view),
            _warnings(view),
            TRUST_NOTE,
        ]
        return "\n\n".join(section for section in sections if section) + "\n"


def _cell(value: Any) -> str:
    """Text made safe for one markdown table cell (TensorBoard sanitises the HTML itself)."""
    return " ".join(str(value).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _throughput(view: ReportView) -> str:
    rows = []
    for timing, label in (
        (view.throughput.steady, "steady state (profiler off)"),
        (view.throughput.profiled, "profiled window"),
    ):
        if timing is None:
            continue
        samples = timing.samples_per_s
        rows.append(
            [
                label,
                str(timing.steps),
                f"{timing.mean_step_ms if timing.mean_step_ms is not None else timing.median_step_ms:.2f}",
                spread_ms(timing.p10_step_ms, timing.p90_step_ms),
                f"{timing.steps_per_s:.2f}",
                f"{samples:.0f}" if samples else "-",
            ]
        )
    if not rows:
        return ""
    return "### Throughput\n\n" + _table(
        ["window", "steps", "mean ms/step", "p10–p90 ms", "steps/s", "samples/s"], rows
    )


def _findings(view: ReportView) -> str:
    if not view.findings:
        return ""
    rows = [
        [
            f"{i}",
            f"`{f.rule}`",
            f"**{f.title}**: {f.says}",
            " · ".join(f"{e.symptom} {e.text}" for e in view.evidence(f)),
            f"up to {bound_text(f.gain_bound)}" if f.gain_bound else "-",
        ]
        for i, f in enumerate(view.findings, 1)
    ]
    fixes = [f"**{i}. {f.rule}**\n\n```python\n{f.do}\n```" for i, f in enumerate(view.findings, 1) if f.do]
    return "\n\n".join(["### Findings", _table(["#", "rule", "finding", "evidence", "gain"], rows), *fixes])


def _breakdown(view: ReportView) -> str:
    breakdown = view.breakdown
    if breakdown is None:
        return ""
    exposed_rows = [
        [row.label, f"{row.mean_ms:.3f}", spread_ms(row.p10_ms, row.p90_ms, 3), percent(row.share)]
        for row in breakdown.listed
    ]
    phase_header = ["host thread phase", "mean ms/step", "p10–p90 ms", "share"] + (
        ["hidden behind GPU"] if view.on_gpu else []
    )
    phase_rows = []
    for phase in breakdown.phases:
        row = [phase.label, f"{phase.mean_ms:.3f}", spread_ms(phase.p10_ms, phase.p90_ms, 3), percent(phase.share)]
        if phase.hidden_share is not None:
            row.append(percent(phase.hidden_share))
        phase_rows.append(row)
    lines = [
        f"### Where a step goes ({len(breakdown.steps)} profiled steps, median {breakdown.median_step_ms:.2f} ms)",
        exposed_caption(breakdown.exposed_basis, breakdown.exposed_step_ms),
        _table(["exposed: what limits the step", "mean ms/step", "p10–p90 ms", "share"], exposed_rows),
        phase_caption(breakdown.phase_step_ms),
        _table(phase_header, phase_rows),
    ]
    gpu = breakdown.gpu
    if gpu is not None:
        lines.append(
            f"GPU busy {percent(gpu.busy_share or 0, 0)} · {count(gpu.kernels_per_step or 0)} kernels/step · "
            f"H2D {human_bytes(gpu.h2d_pageable_bytes or 0)} pageable, {human_bytes(gpu.h2d_pinned_bytes or 0)} pinned per step · "
            f"{count(gpu.syncs_per_step or 0)} syncs/step"
        )
    return "\n\n".join(lines)


def _dataloader(view: ReportView) -> str:
    loader = view.config.dataloader
    if loader is None:
        return ""
    rows = [[key, str(value)] for key, value in loader.settings]
    where = f" (created at `{_cell(loader.created_at)}`)" if loader.created_at else ""
    return f"### DataLoader{where}\n\n" + _table(["setting", "value"], rows)


def _experiments(view: ReportView) -> str:
    """verify's or sweep's rows: what each change measured, and how its knobs reached the loop."""
    e = view.experiments
    if e is None:
        return ""
    key = e.compared_by
    with_via = any(row.via_text for row in e.rows)
    header = [
        "run",
        *(["via"] if with_via else []),
        "result",
        key.replace("_per_s", "/s"),
        "speedup",
        "GPU busy",
        "top exposed after",
    ]
    rows = []
    for row in e.rows:
        compared = row.figure(key)
        rows.append(
            [
                row.label,
                *([row.via_text or "-"] if with_via else []),
                row.verdict or row.status,
                f"{compared:.2f}" if compared else "-",
                f"{row.speedup:.2f}x" if row.speedup else "-",
                percent(row.gpu_busy, 0) if row.gpu_busy is not None else "-",
                f"{view.top_label(row)} {percent(row.top_exposed.share or 0, 0)}"
                if row.top_exposed and row.top_exposed.category
                else "-",
            ]
        )
    title = "What each recommendation really buys" if e.kind == "verify" else "Sweep"
    conclusions = "\n".join(f"* {_cell(line)}" for line in e.conclusions)
    return "\n\n".join(x for x in (f"### {title}", _table(header, rows), conclusions) if x)


def _warnings(view: ReportView) -> str:
    if not view.warnings:
        return ""
    return "### Notes\n\n" + "\n".join(f"* {_cell(w)}" for w in view.warnings)
