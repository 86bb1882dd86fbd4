"""The terminal report (rich): headline throughput, a step-time bar, the breakdown tables and
the ranked findings with their evidence. Reads the report's view only."""

from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from diagnose.renderers.base import Renderer
from diagnose.renderers.fit import Column, FittedTable, fit_table
from diagnose.renderers.view import ReportView, batch_words, exposed_caption, phase_caption, spread_words
from diagnose.report import Finding, RankSummary, Timing
from diagnose.units import bound_text, count, human_bytes, percent, spread_ms

#: colour and plain-text glyph per exposed category: idle causes warm, GPU work green/blue
STYLES: dict[str, tuple[str, str]] = {
    "data_wait": ("red", "D"),
    "h2d_copy": ("dark_orange", "H"),
    "sync": ("magenta", "S"),
    "host_forward": ("yellow", "f"),
    "host_backward": ("gold3", "b"),
    "host_optimizer": ("khaki3", "o"),
    "host_other": ("grey62", "."),
    "communication": ("blue", "C"),
    "gpu_forward": ("green", "F"),
    "gpu_backward": ("green4", "B"),
    "gpu_optimizer": ("dark_sea_green4", "O"),
    "gpu_other": ("cyan", "G"),
}
BAR_WIDTH = 60
DATALOADER_LINE = ("num_workers", "pin_memory", "batch_size", "prefetch_factor", "persistent_workers")


#: the layout width when nothing wraps (piped output): wide enough that no table is squeezed
UNWRAPPED_WIDTH = 1000
_TRAILING_SPACE = re.compile(r"[ \t]+((?:\x1b\[[0-9;]*m)*)$", re.MULTILINE)


@dataclass(frozen=True)
class ConsoleSettings:
    """How the report is printed: in colour or not, and wrapped at ``width`` or not at all (None)."""

    color: bool
    width: int | None

    @classmethod
    def detect(
        cls, color: bool | None = None, stream: TextIO | None = None, environ: Mapping[str, str] = os.environ
    ) -> ConsoleSettings:
        """``--color/--no-color`` first, then NO_COLOR (any value: no colour, no-color.org), then
        FORCE_COLOR, then whether ``stream`` is a terminal that takes colour (not TERM=dumb). The width is COLUMNS when set, else the
        terminal's; piped output is not wrapped (a reader or a pager wraps it)."""
        stream = sys.stdout if stream is None else stream
        is_tty = bool(getattr(stream, "isatty", lambda: False)())
        if color is None:
            if environ.get("NO_COLOR"):
                color = False
            elif environ.get("FORCE_COLOR", "") not in ("", "0"):
                color = True
            else:
                color = is_tty and not dumb_terminal(environ)
        width: int | None = None
        columns = environ.get("COLUMNS", "")
        if columns.isdigit() and int(columns) > 0:
            width = int(columns)
        elif is_tty:
            try:
                width = os.get_terminal_size(stream.fileno()).columns
            except (OSError, ValueError, AttributeError):
                width = None
        return cls(color=color, width=width)


def without_trailing_spaces(text: str) -> str:
    """No line ends in spaces (rich pads wrapped lines and table cells to the width); colour
    codes at a line's end stay."""
    return _TRAILING_SPACE.sub(r"\1", text)


def dumb_terminal(environ: Mapping[str, str] = os.environ) -> bool:
    """TERM=dumb: a terminal (Emacs' shell, some CI consoles) that takes no escape codes."""
    return environ.get("TERM", "") == "dumb"


class TerminalRenderer(Renderer):
    def __init__(self, color: bool = True, width: int | None = 100, show_steps: bool = False) -> None:
        self.color = color
        self.width = width
        self.show_steps = show_steps

    @classmethod
    def with_settings(cls, settings: ConsoleSettings, show_steps: bool = False) -> TerminalRenderer:
        return cls(color=settings.color, width=settings.width, show_steps=show_steps)

    def render_view(self, view: ReportView) -> str:
        return without_trailing_spaces(self._render_view(view))

    def _render_view(self, view: ReportView) -> str:
        buffer = io.StringIO()
        console = Console(
            file=buffer,
            force_terminal=self.color,
            no_color=not self.color,
            width=self.width or UNWRAPPED_WIDTH,
            soft_wrap=self.width is None,
            highlight=False,
            color_system="truecolor" if self.color else None,
        )
        self._header(console, view)
        if view.whole:
            self._whole(console, view)
        self._throughput(console, view)
        if view.breakdown:
            self._bar(console, view)
            self._exposed_table(console, view)
            self._phase_table(console, view)
            self._gpu_line(console, view)
            if self.show_steps:
                self._steps_table(console, view)
        if view.limits:
            self._limits(console, view)
        if view.ranks:
            self._ranks(console, view)
        self._config(console, view)
        if view.experiments and view.experiments.kind == "sweep":
            self._experiments(console, view)
            return buffer.getvalue()
        self._findings(console, view)
        if view.experiments:
            self._experiments(console, view)
        for warning in view.warnings:
            console.print(f"[yellow]note:[/] {escape(warning)}")
        return buffer.getvalue()

    # --- sections -------------------------------------------------------------------------------

    def _header(self, c: Console, v: ReportView) -> None:
        c.print(Text.assemble(("diagnose ", "bold"), (v.name, "bold cyan"), f"  ·  {v.device or '?'}"))
        if v.versions:
            c.print(Text(" · ".join(v.versions), style="dim"))
        c.print(Text(f"status: {v.status.message}", style="green" if v.status.ok else "red"))
        if v.status.step_mode:
            c.print(Text(f"steps: counted at each {v.status.step_mode}", style="dim"))
        c.print()

    def _whole(self, c: Console, v: ReportView) -> None:
        w = v.whole
        assert w is not None
        c.print(
            Text.assemble(
                ("The whole run ", "bold"),
                f"({w.wall_s:.1f} s, {w.steps} steps): goodput ",
                (percent(w.goodput), "bold green" if w.goodput >= 0.8 else "bold yellow"),
            )
        )
        table = Table(box=None, pad_edge=False, header_style="bold")
        table.add_column("where the wall-clock went", no_wrap=True)
        table.add_column("seconds", justify="right")
        table.add_column("share", justify="right")
        for row in w.rows:
            table.add_row(row.label, f"{row.seconds:.2f}", percent(row.share))
        c.print(table)
        if w.job_goodput is not None:
            per_rank = ", ".join(f"rank {r.rank} {percent(r.goodput)}" for r in w.ranks)
            c.print(Text(f"the job's goodput: {percent(w.job_goodput)} ({per_rank})"))
        if w.windows:
            c.print(
                Text(
                    f"later profiled windows: {len(w.windows)} ("
                    + ", ".join(f"{reason} at step {k}" for reason, k, _, _ in w.windows[:4])
                    + (", ..." if len(w.windows) > 4 else "")
                    + ")",
                    style="dim",
                )
            )
        c.print()

    def _throughput(self, c: Console, v: ReportView) -> None:
        t = v.throughput
        if t.steady:
            c.print(
                Text.assemble(
                    ("Steady state ", "bold"), f"(profiler off, {t.steady.steps} steps): ", _timing_text(t.steady)
                )
            )
            if t.steady.left_out:
                c.print(
                    Text(
                        f"  {t.steady.left_out} timed step(s) left out: an epoch's turn or an evaluation pass began in them",
                        style="dim",
                    )
                )
        if t.profiled:
            c.print(
                Text.assemble(("Profiled window ", "bold"), f"({t.profiled.steps} steps): ", _timing_text(t.profiled))
            )
        if t.batch_size:
            c.print(Text(f"batch: {batch_words(t)}", style="dim"))
        if t.note:
            c.print(Text(t.note, style="yellow"))
        if t.steady or t.profiled or t.batch_size or t.note:
            c.print()

    def _bar(self, c: Console, v: ReportView) -> None:
        rows = v.breakdown.exposed  # type: ignore[union-attr]
        cells = _apportion({row.category: row.share for row in rows}, BAR_WIDTH)
        bar = Text()
        for row in rows:
            n = cells.get(row.category, 0)
            if not n:
                continue
            style, glyph = STYLES[row.category]
            bar.append(("█" if self.color else glyph) * n, style=style if self.color else None)
        title = "Where a step goes" + (" (GPU idle: warm colours; GPU busy: green)" if v.on_gpu else "")
        c.print(Text(title, style="bold"))
        c.print(Text("[", style="dim") + bar + Text("]", style="dim"))

    def _exposed_table(self, c: Console, v: ReportView) -> None:
        bd = v.breakdown
        assert bd is not None
        c.print(Text(exposed_caption(bd.exposed_basis, bd.exposed_step_ms), style="dim"))
        rows: list[list[str | Text]] = []
        for row in bd.listed:
            style, glyph = STYLES[row.category]
            rows.append(
                [
                    Text("■" if self.color else glyph, style=style if self.color else ""),
                    row.label,
                    f"{row.mean_ms:.2f}",
                    spread_ms(row.p10_ms, row.p90_ms),
                    percent(row.share),
                ]
            )
        columns = [
            Column(""),
            Column("exposed: what limits the step"),
            Column("mean ms/step", "right"),
            Column("p10–p90 ms", "right", drop=0),
            Column("share", "right"),
        ]
        self._fitted(c, fit_table(columns, rows, self.width, header_style="bold"))
        c.print()

    def _phase_table(self, c: Console, v: ReportView) -> None:
        bd = v.breakdown
        assert bd is not None
        c.print(Text(phase_caption(bd.phase_step_ms), style="dim"))
        columns = [
            Column("host thread phases"),
            Column("mean ms/step", "right"),
            Column("p10–p90 ms", "right", drop=1),
            Column("share", "right"),
        ]
        if v.on_gpu:
            columns.append(Column("hidden behind GPU", "right", drop=0))
        rows = []
        for row in bd.phases:
            cells = [row.label, f"{row.mean_ms:.2f}", spread_ms(row.p10_ms, row.p90_ms), percent(row.share)]
            if v.on_gpu:
                cells.append(percent(row.hidden_share) if row.hidden_share is not None else "")
            rows.append(cells)
        self._fitted(c, fit_table(columns, rows, self.width, header_style="bold"))
        c.print()

    def _gpu_line(self, c: Console, v: ReportView) -> None:
        gpu = v.breakdown.gpu  # type: ignore[union-attr]
        if gpu is None:
            return
        parts = [f"GPU busy {percent(gpu.busy_share or 0, 0)}", f"{count(gpu.kernels_per_step or 0)} kernels/step"]
        if gpu.median_kernel_us is not None:
            parts.append(f"median kernel {gpu.median_kernel_us:.1f} µs")
        if gpu.h2d_pageable_bytes:
            parts.append(f"H2D {human_bytes(gpu.h2d_pageable_bytes)}/step pageable")
        if gpu.h2d_pinned_bytes:
            parts.append(f"H2D {human_bytes(gpu.h2d_pinned_bytes)}/step pinned")
        if gpu.syncs_per_step:
            parts.append(f"{count(gpu.syncs_per_step)} syncs/step")
        c.print(" · ".join(parts))
        mem = v.memory
        if mem.capacity_bytes and mem.peak_allocated_bytes is not None:
            c.print(
                f"memory: peak {human_bytes(mem.peak_allocated_bytes)} allocated, "
                f"{human_bytes(mem.peak_reserved_bytes or 0)} reserved, of {human_bytes(mem.capacity_bytes)}"
                f" ({percent(mem.peak_reserved_share or 0, 0)})"
            )

    def _limits(self, c: Console, v: ReportView) -> None:
        """The distance to the hardware limit: MFU, memory by owner, the top kernels."""
        lim = v.limits
        assert lim is not None
        if lim.achieved_tflops is not None:
            parts = []
            if lim.mfu is not None:
                parts.append(f"MFU {percent(lim.mfu, 0)}")
            elif v.on_gpu:
                parts.append("MFU n/a (this GPU is not in the peak table)")
            peak = f" of {lim.peak_tflops:.0f} peak" if lim.peak_tflops else ""
            where = ", ".join(x for x in (lim.dtype, lim.gpu) if x)
            parts.append(f"{lim.achieved_tflops:.1f} TFLOP/s{peak}" + (f" ({where})" if where else ""))
            if lim.tflop_per_step is not None:
                parts.append(f"{lim.tflop_per_step:.3g} TFLOP/step")
            c.print(Text.assemble(("compute: ", "bold"), " · ".join(parts)))
        if lim.memory:
            owners = " · ".join(f"{m.owner} {human_bytes(m.bytes)}" for m in lim.memory if m.bytes)
            tail = ""
            if lim.headroom_gb is not None:
                tail += f" · free {lim.headroom_gb:.1f} GB"
            if lim.largest_batch:
                tail += f" · about {count(lim.largest_batch)} samples/step fit (estimate)"
            c.print(Text.assemble(("memory at the step's peak: ", "bold"), owners + tail))
        if lim.kernels:
            columns = [
                Column("top kernels"),
                Column("class", drop=0),
                Column("ms/step", "right"),
                Column("share", "right"),
                Column("TFLOP/s", "right", drop=1),
            ]
            rows = [
                [
                    short_kernel_name(k.name),
                    k.kind,
                    f"{k.ms_per_step:.3f}",
                    percent(k.share, 0),
                    f"{k.tflops:.1f}" if k.tflops is not None else "",
                ]
                for k in lim.kernels[:5]
            ]
            self._fitted(c, fit_table(columns, rows, self.width, header_style="bold"))
        c.print()

    def _steps_table(self, c: Console, v: ReportView) -> None:
        categories = v.breakdown.exposed  # type: ignore[union-attr]
        # too narrow a terminal leaves out the categories with the least time first
        order = {row.category: rank for rank, row in enumerate(sorted(categories, key=lambda row: row.mean_ms))}
        columns = [
            Column("step", "right"),
            Column("total", "right"),
            *(Column(STYLES[row.category][1], "right", drop=order[row.category]) for row in categories),
        ]
        rows = [
            [
                str(step.number),
                f"{step.duration_ms:.2f}",
                *(f"{step.exposed_ms[row.category]:.2f}" for row in categories),
            ]
            for step in v.breakdown.steps  # type: ignore[union-attr]
        ]
        self._fitted(c, fit_table(columns, rows, self.width, title="per step (ms)", header_style="bold"))

    def _config(self, c: Console, v: ReportView) -> None:
        loader = v.config.dataloader
        if loader:
            settings = dict(loader.settings)
            c.print(
                "DataLoader: "
                + ", ".join(f"{k}={settings.get(k)}" for k in DATALOADER_LINE)
                + (f"  ({escape(str(loader.created_at))})" if loader.created_at else "")
            )
        for o in v.config.optimizers:
            c.print(f"optimizer: {o.name} over {o.param_tensors} tensors ({o.implementation})")
        if v.config.cpu_count:
            c.print(Text(f"CPUs: {v.config.cpu_count}", style="dim"))
        if loader or v.config.optimizers or v.config.cpu_count:
            c.print()

    def _findings(self, c: Console, v: ReportView) -> None:
        if not v.breakdown:
            c.print(Text(v.verdict or "No profiled step to diagnose.", style="bold yellow"))
            for i, f in enumerate(v.findings, 1):
                self._finding(c, i, f, v)
            return
        c.print(Text(v.verdict, style="bold green" if v.healthy else "bold red"))
        if v.findings:
            c.print(
                Text(
                    "Findings, ranked: measured first, then by the predicted gain, then by the most each fix can gain:",
                    style="bold",
                )
            )
        world_size = v.ranks.world_size if v.ranks else None
        for i, f in enumerate(v.findings, 1):
            self._finding(c, i, f, v, world_size)
        if v.findings_not_shown:
            c.print(Text(f"... and {v.findings_not_shown} more (--all shows every finding)", style="dim"))
        for line in v.considered:
            c.print(Text(line, style="dim"))
        for line in v.borderline:
            c.print(Text(line, style="yellow"))
        if v.replay:
            rp = v.replay
            c.print(
                Text(
                    f"replay: {rp.replayed_ms:.2f} ms replayed vs {rp.measured_ms:.2f} ms measured over {rp.steps} steps "
                    f"({rp.error:+.1%}{'' if rp.within_tolerance else ', off: no predictions'})",
                    style="dim",
                )
            )
        if v.next_steps:
            c.print(Text("What would be next:", style="bold"))
            for i, f in enumerate(v.next_steps, 1):
                self._finding(c, i, f, v, world_size)

    def _finding(self, c: Console, i: int, f: Finding, v: ReportView, world_size: int | None = None) -> None:
        words = f.gain_text
        gain = f" — {words}" if words else ""
        heading = Table.grid()  # the title wraps beside its number, not under it
        heading.add_column(no_wrap=True)
        heading.add_column()
        heading.add_row(f"{i:>2}. ", Text.assemble((f.rule, "bold"), " ", (f.title, "bold"), (gain, "green")))
        c.print(heading)
        _indented(c, Text(f.says))
        if f.check:
            _indented(c, Text(v.unsure(f, world_size), style="yellow"))
        evidence = v.evidence(f)
        if evidence:
            _indented(c, Text("evidence: " + " · ".join(f"{e.symptom} {e.text}" for e in evidence), style="dim"))
        if f.borderline:
            _indented(
                c,
                Text(
                    f"borderline: {', '.join(f.borderline)} within the steps' spread of the threshold; a rerun may not show it",
                    style="yellow",
                ),
            )
        if f.lines:
            _indented(c, Text(f"where: {f.lines}", style="yellow"))
        for line in f.do.splitlines():
            # code to copy is never wrapped: a piece on the next line, outside the gutter, reads as
            # another line of code; the terminal soft-wraps a long line and a copy keeps it whole
            c.print(Text(f"    | {line}", style="cyan"), no_wrap=True, overflow="ignore", crop=False)
        c.print()

    def _fitted(self, c: Console, fitted: FittedTable) -> None:
        """A table fitted to the width, and the line that says which columns it left out."""
        c.print(fitted.renderable)
        note = fitted.note(self.width)
        if note:
            c.print(Text(note, style="dim"))

    def _ranks(self, c: Console, v: ReportView) -> None:
        ranks = v.ranks
        assert ranks is not None
        # too narrow a terminal loses the columns with a drop order first (lowest first)
        columns = [
            Column("rank", "right"),
            Column("status"),
            Column("step ms", "right"),
            Column("data wait ms", "right", drop=5),
            Column("comm ms", "right", drop=3),
            Column("comm exposed ms", "right", drop=4),
            Column("GPU busy", "right", drop=2),
            Column("samples/step", "right", drop=0),
            Column("samples/s", "right", drop=6),
            Column("top exposed", drop=1),
        ]
        if ranks.others:
            columns.append(Column("listed because", drop=7))
        rows = []
        for row in ranks.shown:
            why = (
                [ranks.why.get(row.rank, "the first rank" if row.rank == ranks.first_rank else "")]
                if ranks.others
                else []
            )
            rows.append(
                [
                    str(row.rank),
                    row.status,
                    _num(row.median_step_ms, "{:.1f}"),
                    _num(row.data_wait_ms, "{:.2f}"),
                    _num(row.communication_ms, "{:.2f}"),
                    _exposed_comm(row),
                    _num(row.gpu_busy, "{:.0%}"),
                    (count(row.samples_per_step) if row.samples_per_step is not None else "-"),
                    _num(row.steady_samples_per_s, "{:,.1f}"),
                    str(row.top_exposed or "-"),
                    *why,
                ]
            )
        self._fitted(
            c,
            fit_table(
                columns,
                rows,
                self.width,
                title=f"{ranks.world_size} ranks side by side (the report above is rank {ranks.lead_rank}'s)",
                header_style="bold",
            ),
        )
        if ranks.others:
            c.print(Text(ranks.others.text() + " (report.json lists every rank)", style="dim"))
        if ranks.job_samples_per_s:
            c.print(Text(f"the whole job: {ranks.job_samples_per_s:,.1f} samples/s (steady, all ranks)", style="bold"))
        s = ranks.straggler
        if s:
            c.print(
                Text(
                    f"straggler: rank {s.rank} waits {s.data_wait_ms:.2f} ms/step for data, the others {s.others_data_wait_ms:.2f}",
                    style="bold red",
                )
            )
        c.print()

    def _experiments(self, c: Console, v: ReportView) -> None:
        e = v.experiments
        assert e is not None
        key = e.compared_by
        title = "What each recommendation really buys" if e.kind == "verify" else "Sweep"
        title += f": {e.statistic}" if e.statistic else ""
        with_via = any(row.via_text for row in e.rows)  # how each knob reached the loop
        # a CPU-only run has no GPU busy figure and no device memory: no columns of dashes for them;
        # too narrow a terminal loses the columns with a drop order first (lowest first)
        columns = [
            Column("run"),
            *((Column("via", drop=2),) if with_via else ()),
            Column("result"),
            Column("mean " + key.replace("_per_s", "/s"), "right"),
            Column("mean step ms (p10-p90)", "right", drop=6),
            Column("speedup", "right"),
            Column("predicted", "right", drop=5),
            Column("bound", "right", drop=0),
            *([Column("GPU busy", "right", drop=4)] if e.shows_gpu_busy else []),
            *([Column("peak mem", "right", drop=3)] if e.shows_memory else []),
            Column("top exposed after", drop=1),
        ]
        rows = []
        for row in e.rows:
            verdict = row.verdict or row.status
            if row.compile is not None:
                verdict += f" (compile {row.compile.compile_s} s"
                verdict += (
                    f", pays off after {row.compile.break_even_steps} steps)"
                    if row.compile.break_even_steps is not None
                    else ")"
                )
            compared = row.figure(key)
            rows.append(
                [
                    Text(row.label),
                    *((Text(row.via_text),) if with_via else ()),
                    verdict,
                    f"{compared:.2f}" if compared else "-",
                    row.step_text() or "-",
                    "reference" if row.reference else f"{row.speedup:.2f}x" if row.speedup else "-",
                    f"{row.predicted_speedup:.2f}x" if row.predicted_speedup else "",
                    bound_text(row.gain_bound) if row.gain_bound else "",
                    *([percent(row.gpu_busy, 0) if row.gpu_busy is not None else "-"] if e.shows_gpu_busy else []),
                    *(
                        [human_bytes(row.peak_reserved_bytes) if row.peak_reserved_bytes else "-"]
                        if e.shows_memory
                        else []
                    ),
                    f"{row.top_exposed.category} {percent(row.top_exposed.share or 0, 0)}"
                    if row.top_exposed and row.top_exposed.category
                    else "-",
                ]
            )
        self._fitted(c, fit_table(columns, rows, self.width, title=title, header_style="bold"))
        if e.kind == "verify":
            source = spread_words(e.baseline_spread_from)
            c.print(
                Text(
                    f"speedups are against the baselines' mean; baseline spread: ±{percent(e.baseline_spread or 0)} "
                    f"({source + '; ' if source else ''}changes inside it count as no effect)",
                    style="dim",
                )
            )
        for line in e.conclusions:
            c.print(Text(line))
        if e.plot:
            c.print(Text(f"plot: {e.plot}", style="dim"))
        c.print()


def _indented(c: Console, text: Text, indent: int = 4) -> None:
    """A paragraph wrapped inside its indent (a hanging indent), never back to column 0."""
    c.print(Padding(text, (0, 0, 0, indent)))


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _timing_text(t: Timing) -> Text:
    mean = t.mean_step_ms if t.mean_step_ms is not None else t.median_step_ms
    spread = (
        f"p10–p90 {t.p10_step_ms:.1f}–{t.p90_step_ms:.1f}" if t.p10_step_ms is not None else f"p90 {t.p90_step_ms:.1f}"
    )
    parts = [f"{mean:.1f} ms/step mean ({spread})", f"{t.steps_per_s:.2f} steps/s"]
    if t.samples_per_s:
        parts.append(f"{t.samples_per_s:.0f} samples/s")
    text = Text(" · ".join(parts))
    if t.noisy:
        text.append("  noisy: p90 over 1.5x the median", style="yellow")
    return text


def _apportion(shares: dict[str, float], width: int) -> dict[str, int]:
    """Cells per category that add up to ``width`` (largest remainders)."""
    raw = {k: v * width for k, v in shares.items() if v > 0}
    cells = {k: int(v) for k, v in raw.items()}
    left = width - sum(cells.values())
    for k in sorted(raw, key=lambda k: raw[k] - cells[k], reverse=True)[: max(left, 0)]:
        cells[k] += 1
    return cells


#: kernel names longer than this are cut in the terminal (HTML and report.json keep them whole)
KERNEL_NAME_CHARS = 60


def short_kernel_name(name: str, limit: int = KERNEL_NAME_CHARS) -> str:
    """A kernel's name without ``void``, template arguments and parameters: C++ kernel names run
    to thousands of characters, which push the table's figures off any terminal."""
    name = name.removeprefix("void ").strip()
    for cut in ("<", "("):
        head = name.split(cut, 1)[0]
        if head:
            name = head + ("<…>" if cut == "<" and cut in name else "")
            break
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _exposed_comm(row: RankSummary) -> str:
    """Exposed communication per step, the figure the breakdown writes for it (ms, not a share:
    the lead rank's row and the breakdown read alike)."""
    exposed = row.exposed_communication_ms
    return "-" if exposed is None else f"{exposed:.2f}"
