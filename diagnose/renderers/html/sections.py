"""The page's sections, one function each, from the report's view to ``Markup``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from diagnose.renderers.html.charts import SweepMetric, bar_chart, roofline_chart, steps_chart, strip
from diagnose.renderers.html.markup import Markup, el, kv_table, records_table, reference, section, swatch
from diagnose.renderers.view import EvidenceRow, ReportView, batch_words, exposed_caption, phase_caption, spread_words
from diagnose.report import ExperimentRow, Experiments, Finding, Timing
from diagnose.units import count, human_bytes, ms, percent, plain, rate, spread_ms


def header(view: ReportView) -> Markup:
    nav = [el("a", title, href=f"#{anchor}") for anchor, title in _nav_entries(view)]
    device = " · ".join([view.device or "device unknown", *view.versions])
    return el(
        "header",
        el("p", "diagnose report", class_="eyebrow"),
        el("h1", view.name),
        el("p", device, class_="sub"),
        el("nav", nav),
    )


def _nav_entries(view: ReportView) -> list[tuple[str, str]]:
    entries = [("whole", "Whole run")] if view.whole else []
    entries.append(("throughput", "Throughput"))
    if view.breakdown:
        entries += [("steps", "Step time"), ("median-step", "One step")]
    if view.limits:
        entries.append(("limits", "Hardware limit"))
    if view.ranks:
        entries.append(("ranks", "Ranks"))
    entries.append(("findings", "Findings"))
    if view.experiments:
        entries.append(("experiments", view.experiments.kind.capitalize()))
    entries.append(("configuration", "Configuration"))
    if view.warnings:
        entries.append(("warnings", "Notes"))
    return entries


def verdict(view: ReportView) -> Markup:
    text = view.verdict or "Nothing to diagnose: no profiled step."
    tone = "good" if view.healthy else "bad" if view.breakdown else "warn"
    return el("div", el("p", text), class_=f"verdict {tone}")


def status(view: ReportView) -> Markup:
    s = view.status
    lines = [el("p", el("span", s.state, class_=f"pill {'good' if s.ok else 'bad'}"), " ", s.message)]
    if s.step_mode:
        lines.append(el("p", f"Steps counted at each {s.step_mode}.", class_="muted"))
    if s.error_type is not None or s.error_message is not None:
        if (s.error_message or "") not in s.message:
            lines.append(el("p", el("strong", f"{s.error_type or 'error'}: "), s.error_message or ""))
        if s.traceback:
            lines.append(el("details", el("summary", "traceback"), el("pre", el("code", s.traceback))))
    return el("div", lines, class_="status")


# --- throughput and memory ------------------------------------------------------------------------


def throughput_and_memory(view: ReportView) -> Markup:
    t = view.throughput
    cards = [
        _timing_card("Steady state", "profiler off: the real speed", t.steady),
        _timing_card("Profiled window", "profiler on: the steps analysed below", t.profiled),
        _memory_card(view),
    ]
    cards = [card for card in cards if card]
    notes = [] if cards else [el("p", "No step was timed.", class_="muted")]
    if t.batch_size:
        notes.append(el("p", f"Batch: {batch_words(t)}.", class_="muted"))
    if t.note:
        notes.append(el("p", t.note, class_="note"))
    return section("Throughput and memory", el("div", cards, class_="cards"), notes, anchor="throughput")


def _timing_card(title: str, subtitle: str, timing: Timing | None) -> Markup | None:
    if timing is None:
        return None
    samples = timing.samples_per_s
    headline = f"{rate(samples)} samples/s" if samples else f"{rate(timing.steps_per_s or 0.0)} steps/s"
    details = [
        f"{rate(timing.steps_per_s or 0.0)} steps/s" if samples else None,
        (
            f"mean {ms(timing.mean_step_ms)} per step (p10–p90 {spread_ms(timing.p10_step_ms, timing.p90_step_ms)} ms, median {ms(timing.median_step_ms or 0.0)})"
            if timing.mean_step_ms is not None
            else f"median {ms(timing.median_step_ms or 0.0)} per step (p90 {ms(timing.p90_step_ms or 0.0)})"
        ),
        f"{timing.steps} steps",
        "noisy: the p90 step is over 1.5x the median" if timing.noisy else None,
    ]
    return el(
        "div",
        el("h3", title),
        el("p", subtitle, class_="muted"),
        el("p", headline, class_="big"),
        el("p", " · ".join(d for d in details if d)),
        class_="card",
    )


def _memory_card(view: ReportView) -> Markup | None:
    memory = view.memory
    capacity, reserved, allocated = memory.capacity_bytes, memory.peak_reserved_bytes, memory.peak_allocated_bytes
    if reserved is None or not capacity:
        if capacity:
            text = f"Device capacity {human_bytes(capacity)}; peak use not measured (a trace analysed on its own)."
        else:
            return None  # a CPU-only run has no device memory to show; nor has a bare trace
        return el("div", el("h3", "GPU memory"), el("p", text, class_="muted"), class_="card")
    share = reserved / capacity
    meter = el(
        "svg",
        el("rect", width="100%", height="10", rx="5", class_="meter-track"),
        el("rect", width=percent(min(share, 1.0)), height="10", rx="5", class_="meter-fill"),
        el("title", f"{percent(share)} of {human_bytes(capacity)} reserved at peak"),
        class_="meter",
        width="100%",
        height="10",
    )
    return el(
        "div",
        el("h3", "GPU memory"),
        el("p", "peak over the run, reserved by the caching allocator", class_="muted"),
        el("p", f"{human_bytes(reserved)} of {human_bytes(capacity)}", class_="big"),
        meter,
        el("p", f"{percent(share)} reserved · {human_bytes(allocated or 0)} allocated"),
        class_="card",
    )


# --- the breakdown: per-step chart, the median step, tables -----------------------------------------


def breakdown_sections(view: ReportView) -> list[Markup]:
    breakdown = view.breakdown
    assert breakdown is not None
    present = [row.category for row in breakdown.present]
    intro = (
        "Each bar is one profiled step, split by what limited it: time the GPU sat idle waiting for the host "
        "in warm colours, GPU work in greens and blues."
        if view.on_gpu
        else "Each bar is one profiled step, split by what the host was doing (a CPU-only run: the host is the device)."
    )
    return [
        section(
            "Where the step time goes",
            el("p", f"{intro} {len(breakdown.steps)} steps, median {ms(breakdown.median_step_ms)}.", class_="muted"),
            steps_chart(breakdown.steps, present, view.labels),
            _exposed_table(view),
            _gpu_counters(view),
            anchor="steps",
        ),
        _median_step_section(view),
    ]


def _exposed_table(view: ReportView) -> Markup:
    rows = [
        el(
            "tr",
            el("td", swatch(f"c-{row.category}")),
            el("td", row.label),
            el("td", ms(row.mean_ms), class_="num"),
            el("td", spread_ms(row.p10_ms, row.p90_ms), class_="num"),
            el("td", percent(row.share), class_="num"),
            class_="legend-row",
            data_category=row.category,
        )
        for row in view.breakdown.present  # type: ignore[union-attr]
    ]
    header_row = el(
        "tr",
        el("th", ""),
        el("th", "exposed: what limits the step"),
        el("th", "mean per step", class_="num"),
        el("th", "p10–p90 ms", class_="num"),
        el("th", "share of the window", class_="num"),
    )
    bd = view.breakdown
    assert bd is not None
    caption = el("caption", exposed_caption(bd.exposed_basis, bd.exposed_step_ms))
    return el("table", caption, el("thead", header_row), el("tbody", rows), class_="grid legend")


def _gpu_counters(view: ReportView) -> Markup | None:
    gpu = view.breakdown.gpu  # type: ignore[union-attr]
    if gpu is None:
        return None
    chips = [
        f"GPU busy {percent(gpu.busy_share or 0)}",
        f"{count(gpu.kernels_per_step or 0)} kernels/step",
        f"median kernel {gpu.median_kernel_us:.1f} µs" if gpu.median_kernel_us is not None else None,
        f"H2D {human_bytes(gpu.h2d_pageable_bytes)}/step pageable" if gpu.h2d_pageable_bytes else None,
        f"H2D {human_bytes(gpu.h2d_pinned_bytes)}/step pinned" if gpu.h2d_pinned_bytes else None,
        f"{count(gpu.syncs_per_step)} syncs/step" if gpu.syncs_per_step else None,
    ]
    return el("p", [el("span", chip, class_="chip") for chip in chips if chip], class_="chips")


def _median_step_section(view: ReportView) -> Markup:
    step = view.breakdown.median_step  # type: ignore[union-attr]
    if step.in_time_order:
        title = "One step, in time order"
        caption = (
            f"Step {step.number}, the median step ({ms(step.duration_ms)}), from its start (left) to its end (right), in "
            f"{step.bins} slices of {ms(step.slice_ms or 0)}: each slice shows what filled most of it. "
            + (
                "Top: GPU busy (greens) or idle and why (warm colours). "
                if view.on_gpu
                else "Top: what limited the step. "
            )
            + "Bottom: what the host thread was doing."
        )
    else:
        title = "One step, by category"
        caption = (
            f"Step {step.number}, the median step ({ms(step.duration_ms)}). Each strip shows the total time per "
            "category within that step, laid side by side in a fixed order: it is not a time-ordered trace. "
            "For the order of events, open the trace in Perfetto (docs/html-report.md says how)."
        )
    return section(
        title,
        el(
            "figure",
            strip(step.exposed, step.duration_ms, "what limits the step"),
            strip(step.phases, step.duration_ms, "host thread phases"),
            el("figcaption", caption),
        ),
        _phase_table(view),
        anchor="median-step",
    )


def _phase_table(view: ReportView) -> Markup:
    header_cells = [
        el("th", ""),
        el("th", "host thread phase"),
        el("th", "mean per step", class_="num"),
        el("th", "p10–p90 ms", class_="num"),
        el("th", "share", class_="num"),
    ]
    if view.on_gpu:
        header_cells.append(el("th", "hidden behind GPU work", class_="num"))
    rows = []
    for row in view.breakdown.phases:  # type: ignore[union-attr]
        cells = [
            el("td", swatch(f"p-{row.phase}")),
            el("td", row.label),
            el("td", ms(row.mean_ms), class_="num"),
            el("td", spread_ms(row.p10_ms, row.p90_ms), class_="num"),
            el("td", percent(row.share), class_="num"),
        ]
        if row.hidden_share is not None:
            cells.append(el("td", percent(row.hidden_share), class_="num"))
        rows.append(el("tr", cells))
    caption = el("caption", phase_caption(view.breakdown.phase_step_ms))  # type: ignore[union-attr]
    return el("table", caption, el("thead", el("tr", header_cells)), el("tbody", rows), class_="grid legend")


def hardware_limit(view: ReportView) -> Markup | None:
    """MFU, memory by owner, the top kernels and the roofline (the distance to the hardware limit)."""
    lim = view.limits
    if lim is None:
        return None
    chips = []
    if lim.mfu is not None:
        chips.append(f"MFU {percent(lim.mfu)}")
    if lim.achieved_tflops is not None:
        chips.append(
            f"{lim.achieved_tflops:.1f} TFLOP/s achieved" + (f" of {lim.peak_tflops:g} peak" if lim.peak_tflops else "")
        )
    if lim.dtype or lim.gpu:
        chips.append(" on ".join(x for x in (lim.dtype, lim.gpu) if x))
    if lim.tflop_per_step is not None:
        chips.append(f"{lim.tflop_per_step:.3g} TFLOP per step")
    parts: list[Any] = [el("p", [el("span", chip, class_="chip") for chip in chips], class_="chips") if chips else None]
    if lim.flops_by_phase:
        parts.append(kv_table((phase, f"{flops / 1e12:.4g} TFLOP") for phase, flops in lim.flops_by_phase))
    if lim.roofline is not None and lim.roofline.points:
        parts.append(
            el(
                "figure",
                roofline_chart(lim.roofline),
                el(
                    "figcaption",
                    "Each dot is a class of kernels: its counted FLOPs and bytes "
                    "per step over its measured kernel time, against this GPU's roofs. " + " ".join(lim.estimated),
                ),
            )
        )
    if lim.kernels:
        parts.append(_kernel_table(lim.kernels))
    if lim.memory:
        free = f" · {lim.headroom_gb:.1f} GB free" if lim.headroom_gb is not None else ""
        batch = (
            f" · about {count(lim.largest_batch)} samples per step would fit (an estimate; diagnose sweep finds the real one)"
            if lim.largest_batch
            else ""
        )
        parts.append(
            el(
                "p",
                el("strong", "Memory at the step's peak: "),
                " · ".join(f"{m.owner} {human_bytes(m.bytes)}" for m in lim.memory) + free + batch,
            )
        )
    if lim.oom is not None:
        oom = lim.oom
        asked = f" asking for {human_bytes(oom.requested_bytes)}" if oom.requested_bytes else ""
        parts.append(
            el(
                "p",
                el("strong", f"Out of memory{asked}: "),
                " · ".join(f"{m.owner} {human_bytes(m.bytes)}" for m in oom.owners),
                f"; the largest: {oom.largest}.",
            )
        )
        parts.append(el("ol", [el("li", change) for change in oom.changes]))
    return section("Distance to the hardware limit", *[p for p in parts if p is not None], anchor="limits")


def _kernel_table(kernels: tuple[Any, ...]) -> Markup:
    header_row = el(
        "tr",
        el("th", "kernel"),
        el("th", "class"),
        el("th", "ms per step", class_="num"),
        el("th", "share", class_="num"),
        el("th", "TFLOP/s (class mean)", class_="num"),
        el("th", "GB/s (class mean)", class_="num"),
    )
    rows = [
        el(
            "tr",
            el("td", el("code", k.name[:120])),
            el("td", k.kind),
            el("td", f"{k.ms_per_step:.3f}", class_="num"),
            el("td", percent(k.share), class_="num"),
            el("td", f"{k.tflops:.2f}" if k.tflops is not None else "", class_="num"),
            el("td", f"{k.gbs:.0f}" if k.gbs is not None else "", class_="num"),
        )
        for k in kernels
    ]
    return el("table", el("thead", header_row), el("tbody", rows), class_="grid")


def nothing_profiled(view: ReportView) -> Markup:
    run = view.config.run
    recorded = [
        ("steps seen", run.steps_seen),
        ("steps profiled", run.profiled_steps),
        ("trace files", run.trace_files or "none written"),
        ("analysed trace", run.analysed_trace),
    ]
    return section(
        "No profiled step",
        el("p", "The run ended before diagnose could profile a step, so there is no breakdown. What was recorded:"),
        kv_table((key, value) for key, value in recorded if value is not None),
        anchor="steps",
    )


def _rank_cell(name: str, fmt: str, value: Any) -> str:
    return count(value) if name == "samples_per_step" else fmt.format(value)


def ranks(view: ReportView) -> Markup | str:
    """A distributed run: every rank side by side, and the straggler if the rules named one."""
    r = view.ranks
    if r is None:
        return ""
    columns = [
        ("rank", "rank", "{}"), ("status", "status", "{}"), ("median_step_ms", "step", "{:.2f} ms"),
        ("data_wait_ms", "data wait (exposed)", "{:.2f} ms"), ("communication_ms", "communication", "{:.2f} ms"),
        ("exposed_communication_ms", "communication exposed", "{:.2f} ms"), ("exposed_communication_share", "exposed share", "{:.0%}"),
        ("gpu_busy", "GPU busy", "{:.0%}"), ("samples_per_step", "samples per step", "{}"), ("top_exposed", "largest exposed share", "{}"),
    ]  # fmt: skip
    titles = [title for _, title, _ in columns] + (["listed because"] if r.others else [])
    header_row = el("tr", [el("th", title) for title in titles])

    def why(row: Any) -> list[Any]:
        if not r.others:
            return []
        return [el("td", r.why.get(row.rank, "the first rank" if row.rank == r.first_rank else ""))]

    rows = [
        el(
            "tr",
            [
                el("td", "-" if getattr(row, name) is None else _rank_cell(name, fmt, getattr(row, name)))
                for name, _, fmt in columns
            ]
            + why(row),
        )
        for row in r.shown
    ]
    parts: list[Any] = [
        el("p", f"{r.world_size} ranks; the breakdown above is rank {r.lead_rank}'s.", class_="muted"),
        el("table", el("thead", header_row), el("tbody", rows), class_="grid"),
    ]
    if r.others:
        parts.append(el("p", r.others.text() + " (report.json lists every rank).", class_="muted"))
    if r.straggler:
        s = r.straggler
        parts.append(
            el(
                "p",
                el("strong", f"Straggler: rank {s.rank}"),
                f" waits {s.data_wait_ms:.2f} ms per step for data, the other ranks {s.others_data_wait_ms:.2f} ms.",
            )
        )
    return section("Ranks", *parts, anchor="ranks")


# --- findings ---------------------------------------------------------------------------------------


def findings(view: ReportView) -> Markup:
    if not view.breakdown and not view.findings:
        return section("Findings", el("p", "None: nothing was profiled.", class_="muted"), anchor="findings")
    body: list[Any] = []
    world_size = view.ranks.world_size if view.ranks else None
    if view.findings:
        body.append(
            el(
                "p",
                "Ranked by the most each fix can gain (an upper bound; diagnose verify measures the real one).",
                class_="muted",
            )
        )
        body += [_finding(i, f, view.evidence(f), view.unsure(f, world_size)) for i, f in enumerate(view.findings, 1)]
    else:
        body.append(el("p", "No problem found.", class_="muted"))
    if view.findings_not_shown:
        body.append(el("p", f"... and {view.findings_not_shown} more (--all shows every finding).", class_="muted"))
    body += [el("p", line, class_="borderline") for line in view.borderline]
    if view.next_steps:
        body.append(el("h3", "What would be next"))
        body += [_finding(i, f, view.evidence(f), view.unsure(f, world_size)) for i, f in enumerate(view.next_steps, 1)]
    return section("Findings", body, anchor="findings")


def _finding(rank: int, finding: Finding, evidence: tuple[EvidenceRow, ...], unsure: str = "") -> Markup:
    gain = finding.gain_text
    heading = el(
        "div",
        el("span", f"{rank}.", class_="rank"),
        el("code", finding.rule, class_="rule"),
        el("h3", finding.title),
        el("span", gain, class_="gain", title=finding.gain_formula) if gain else None,
        class_="finding-head",
    )
    parts = [heading, el("p", finding.says)]
    if finding.check:
        parts.append(el("p", unsure, class_="borderline"))
    if finding.borderline:
        parts.append(
            el(
                "p",
                f"borderline: {', '.join(finding.borderline)} within the steps' spread of the threshold; a rerun may not show it",
                class_="borderline",
            )
        )
    if finding.lines:
        parts.append(el("p", el("strong", "where: "), el("code", finding.lines), class_="where"))
    if evidence:
        parts.append(_evidence_table(evidence))
    if finding.do:
        parts.append(el("pre", el("code", finding.do), class_="do"))
    if finding.knobs:
        parts.append(
            el("p", "what-if knobs (diagnose run --set): ", el("code", plain(dict(finding.knobs))), class_="muted")
        )
    if finding.why:
        parts.append(el("details", el("summary", "why"), el("p", finding.why)))
    links = [el("li", reference(url)) for url in finding.references]
    if links:
        parts.append(el("ul", links, class_="refs"))
    return el("article", parts, class_="finding", id=f"finding-{rank}-{finding.rule}")


def _evidence_table(evidence: tuple[EvidenceRow, ...]) -> Markup:
    rows = [
        el(
            "tr",
            el("td", el("code", e.symptom)),
            el("td", e.text, class_="num"),
            el("td", e.description, class_="muted"),
        )
        for e in evidence
    ]
    return el(
        "table",
        el("thead", el("tr", el("th", "evidence"), el("th", "value", class_="num"), el("th", ""))),
        el("tbody", rows),
        class_="grid evidence",
    )


# --- sweep and verify experiments -----------------------------------------------------------------


def experiments(view: ReportView) -> Markup | None:
    e = view.experiments
    if e is None:
        return None
    metrics = [
        SweepMetric(e.rate_key, f"throughput (mean {e.rate_key.replace('_per_s', '/s')})", rate, with_speedup=True),
        SweepMetric("peak_reserved_bytes", "peak GPU memory reserved", human_bytes, limit=view.memory.capacity_bytes),
    ]
    varied = ", ".join(e.parameters) or "—"
    measured = f" Rates and steps: {e.statistic}." if e.statistic else ""
    if e.kind == "verify":
        source = spread_words(e.baseline_spread_from)
        measured += f" Baseline spread ±{percent(e.baseline_spread or 0)}{f' ({source})' if source else ''}: changes inside it count as no effect."
    parts = [
        el(
            "p",
            f"{e.kind} over {varied}: one short run per row; failed and out-of-memory rows are marked in red.{measured}",
            class_="muted",
        ),
        *(bar_chart(e.rows, metric) for metric in metrics if any(row.figure(metric.key) is not None for row in e.rows)),
        _experiment_table(e, view),
    ]
    if e.plot:
        parts.append(el("p", f"matplotlib plot: {e.plot} in the run directory.", class_="muted"))
    return section(e.kind.capitalize(), parts, anchor="experiments")


def _experiment_table(e: Experiments, view: ReportView) -> Markup:
    rows = e.rows

    def figure(name: str, fmt: Callable[[Any], str]) -> Callable[[ExperimentRow], str | None]:
        return lambda row: None if getattr(row, name) is None else fmt(getattr(row, name))

    # a CPU-only run has no GPU busy figure and no device memory: no columns of dashes for them
    columns: list[tuple[str, Callable[[ExperimentRow], str | None]]] = [
        ("run", figure("label", str)),
        ("status", figure("status", str)),
        ("mean steps/s", figure("steps_per_s", rate)),
        ("mean samples/s", figure("samples_per_s", rate)),
        ("mean step ms (p10–p90)", lambda row: row.step_text("–")),
        *([("GPU busy", figure("gpu_busy", percent))] if e.shows_gpu_busy else []),
        *([("peak reserved", figure("peak_reserved_bytes", human_bytes))] if e.shows_memory else []),
        (
            "speedup",
            lambda row: "reference" if row.reference else None if row.speedup is None else f"{row.speedup:.2f}x",
        ),
    ]
    if any(row.via_text for row in rows):  # how each knob reached the loop: the framework's switch, the script's call
        columns.insert(1, ("via", lambda row: row.via_text or None))
    header_row = el("tr", [el("th", title) for title, _ in columns], el("th", "what limits the step most"))
    body = []
    for row in rows:
        cells = [el("td", cell(row) or "—") for _, cell in columns]
        top = view.top_label(row)
        cells.append(
            el("td", f"{top} ({percent(row.top_exposed.share or 0)})" if top and row.top_exposed else row.error or "—")
        )
        body.append(el("tr", cells, class_="failed" if row.failed else None))
    return el("table", el("thead", header_row), el("tbody", body), class_="grid")


# --- configuration, warnings, footer -------------------------------------------------------------


def configuration(view: ReportView) -> Markup:
    config = view.config
    blocks: list[Any] = []
    if config.run.settings:
        blocks += [el("h3", "Run"), kv_table(config.run.settings)]
    blocks += [el("h3", "Source"), kv_table(config.source)]
    if config.environment:
        blocks += [el("h3", "Environment"), kv_table(config.environment)]
    if config.dataloader:
        blocks += [el("h3", "DataLoader of the training loop"), kv_table(config.dataloader.record)]
    if len(config.dataloaders) > 1:
        blocks += [el("h3", "Every DataLoader created"), records_table(config.dataloaders)]
    for title, records in (("Optimizers", config.optimizer_records), ("Models", config.models)):
        if records:
            blocks += [el("h3", title), records_table(records)]
    if config.flags:
        blocks += [el("h3", "Global flags"), kv_table(config.flags)]
    return section("Configuration", blocks, anchor="configuration")


def warnings(view: ReportView) -> Markup | None:
    if not view.warnings:
        return None
    return section("Notes", el("ul", [el("li", w) for w in view.warnings], class_="warnings"), anchor="warnings")


def footer(view: ReportView) -> Markup:
    return el("footer", f"diagnose {view.diagnose_version} · {view.schema} · written {view.created_at}")
