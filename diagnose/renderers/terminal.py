"""The terminal report (rich): headline throughput, a step-time bar, the breakdown tables and
the ranked findings with their evidence."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from diagnose.analysis.breakdown import EXPOSED, PHASES
from diagnose.renderers.base import Renderer
from diagnose.analysis.report import PHASE_LABELS, Report
from diagnose.analysis.rules import human_bytes

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
STEP_MODES = {
    "optimizer": "optimizer step",
    "dataloader": "DataLoader batch (no optimizer seen)",
    "forward": "call of the model (no optimizer, no DataLoader seen)",
}


class TerminalRenderer(Renderer):
    def __init__(self, color: bool = True, width: int = 100, show_steps: bool = False) -> None:
        self.color = color
        self.width = width
        self.show_steps = show_steps

    def render(self, report: Report) -> str:
        buffer = io.StringIO()
        console = Console(
            file=buffer,
            force_terminal=self.color,
            no_color=not self.color,
            width=self.width,
            highlight=False,
            color_system="truecolor" if self.color else None,
        )
        self._header(console, report)
        self._throughput(console, report)
        if report.breakdown:
            self._bar(console, report)
            self._exposed_table(console, report)
            self._phase_table(console, report)
            self._gpu_line(console, report)
            if self.show_steps:
                self._steps_table(console, report)
        if report.distributed:
            self._ranks(console, report)
        self._config(console, report)
        if report.experiments and report.experiments.get("kind") == "sweep":
            self._experiments(console, report)
            return buffer.getvalue()
        self._findings(console, report)
        if report.experiments:
            self._experiments(console, report)
        for warning in report.warnings:
            console.print(f"[yellow]note:[/] {escape(warning)}")
        return buffer.getvalue()

    # --- sections -------------------------------------------------------------------------------

    def _header(self, c: Console, r: Report) -> None:
        env = r.environment
        target = r.run.get("target", {}) if r.run else {}
        name = target.get("value") or r.source.get("trace") or r.source.get("run_dir", "")
        if target.get("kind") == "script":
            name = name.rsplit("/", 1)[-1]
        device = env.get("device_name") or "?"
        if r.breakdown and r.breakdown["device"] == "cpu":
            device = f"CPU only, no GPU used ({env.get('cpu_count', '?')} cores)"
        versions = " · ".join(
            x
            for x in (
                f"torch {env['torch']}" if env.get("torch") else "",
                f"Python {env['python']}" if env.get("python") else "",
                f"driver {env['driver']}" if env.get("driver") else "",
            )
            if x
        )
        c.print(Text.assemble(("diagnose ", "bold"), (f"{name}", "bold cyan"), f"  ·  {device}"))
        if versions:
            c.print(Text(versions, style="dim"))
        status = r.status
        style = "green" if status.get("state") in ("completed", "stopped", "trace") else "red"
        c.print(Text(f"status: {status.get('message', '')}", style=style))
        mode = (r.run or {}).get("step_mode")
        if mode:
            c.print(Text(f"steps: counted at each {STEP_MODES.get(mode, mode)}", style="dim"))
        c.print()

    def _throughput(self, c: Console, r: Report) -> None:
        t = r.throughput or {}
        steady, profiled = t.get("steady"), t.get("profiled")
        if steady:
            c.print(Text.assemble(("Steady state ", "bold"), f"(profiler off, {steady['steps']} steps): ", _timing_text(steady)))
        if profiled and profiled.get("steps"):
            c.print(Text.assemble(("Profiled window ", "bold"), f"({profiled['steps']} steps): ", _timing_text(profiled)))
        if t.get("batch_size"):
            c.print(Text(f"batch: {t['batch_size']:g} samples per step (found from the data)", style="dim"))
        if t.get("note"):
            c.print(Text(t["note"], style="yellow"))
        c.print()

    def _bar(self, c: Console, r: Report) -> None:
        shares = r.breakdown["window"]["exposed_share"]  # type: ignore[index]
        cells = _apportion(shares, BAR_WIDTH)
        bar = Text()
        for cat in EXPOSED:
            n = cells.get(cat, 0)
            if not n:
                continue
            style, glyph = STYLES[cat]
            bar.append(("█" if self.color else glyph) * n, style=style if self.color else None)
        title = "Where a step goes" + (" (GPU idle: warm colours; GPU busy: green)" if r.on_gpu else "")
        c.print(Text(title, style="bold"))
        c.print(Text("[", style="dim") + bar + Text("]", style="dim"))

    def _exposed_table(self, c: Console, r: Report) -> None:
        window = r.breakdown["window"]  # type: ignore[index]
        labels = r.exposed_labels()
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        table.add_column("", no_wrap=True)
        table.add_column("exposed: what limits the step", no_wrap=True)
        table.add_column("ms/step", justify="right")
        table.add_column("share", justify="right")
        for cat in EXPOSED:
            share = window["exposed_share"][cat]
            if share < 0.0005:
                continue
            style, glyph = STYLES[cat]
            table.add_row(
                Text("■" if self.color else glyph, style=style if self.color else ""),
                labels[cat],
                f"{window['median_ms']['exposed'][cat]:.2f}",
                f"{share * 100:.1f}%",
            )
        c.print(table)
        c.print()

    def _phase_table(self, c: Console, r: Report) -> None:
        window = r.breakdown["window"]  # type: ignore[index]
        table = Table(box=None, pad_edge=False, header_style="bold")
        table.add_column("host thread phases", no_wrap=True)
        table.add_column("ms/step", justify="right")
        table.add_column("share", justify="right")
        if r.on_gpu:
            table.add_column("hidden behind GPU", justify="right")
        for phase in PHASES:
            share = window["phase_share"][phase]
            row = [PHASE_LABELS[phase], f"{window['median_ms']['phases'][phase]:.2f}", f"{share * 100:.1f}%"]
            if r.on_gpu:
                row.append(f"{window['hidden_share'][phase] * 100:.1f}%")
            table.add_row(*row)
        c.print(table)
        c.print()

    def _gpu_line(self, c: Console, r: Report) -> None:
        w = r.breakdown["window"]  # type: ignore[index]
        if not r.on_gpu:
            return
        parts = [
            f"GPU busy {w['gpu_busy_share'] * 100:.0f}%",
            f"{w['kernels_per_step']:g} kernels/step",
        ]
        if w.get("median_kernel_us") is not None:
            parts.append(f"median kernel {w['median_kernel_us']:.1f} µs")
        h2d = w.get("h2d_bytes_per_step", {})
        if h2d.get("pageable"):
            parts.append(f"H2D {human_bytes(h2d['pageable'])}/step pageable")
        if h2d.get("pinned"):
            parts.append(f"H2D {human_bytes(h2d['pinned'])}/step pinned")
        if w.get("syncs_per_step"):
            parts.append(f"{w['syncs_per_step']:g} syncs/step")
        c.print(" · ".join(parts))
        mem = r.memory
        if mem.get("capacity_bytes") and mem.get("peak_allocated_bytes") is not None:
            c.print(
                f"memory: peak {human_bytes(mem['peak_allocated_bytes'])} allocated, "
                f"{human_bytes(mem.get('peak_reserved_bytes', 0))} reserved, of {human_bytes(mem['capacity_bytes'])}"
                f" ({mem.get('peak_reserved_share', 0) * 100:.0f}%)"
            )

    def _steps_table(self, c: Console, r: Report) -> None:
        table = Table(title="per step (ms)", box=None, header_style="bold")
        table.add_column("step")
        table.add_column("total", justify="right")
        for cat in EXPOSED:
            table.add_column(STYLES[cat][1], justify="right")
        for s in r.breakdown["steps"]:  # type: ignore[index]
            table.add_row(str(s["number"]), f"{s['duration_ms']:.2f}", *(f"{s['exposed_ms'][k]:.2f}" for k in EXPOSED))
        c.print(table)

    def _config(self, c: Console, r: Report) -> None:
        d = r.dataloader
        if d:
            c.print(
                "DataLoader: "
                + ", ".join(
                    f"{k}={d.get(k)}"
                    for k in ("num_workers", "pin_memory", "batch_size", "prefetch_factor", "persistent_workers")
                )
                + (f"  ({escape(str(d.get('created_at')))})" if d.get("created_at") else "")
            )
        for o in r.optimizers:
            c.print(f"optimizer: {o['name']} over {o['param_tensors']} tensors ({o['implementation']})")
        env = r.environment
        if env.get("cpu_count"):
            c.print(Text(f"CPUs: {env['cpu_count']}", style="dim"))
        c.print()

    def _findings(self, c: Console, r: Report) -> None:
        if not r.breakdown:
            c.print(Text(r.verdict or "No profiled step to diagnose.", style="bold yellow"))
            for i, f in enumerate(r.findings, 1):
                self._finding(c, i, f)
            return
        c.print(Text(r.verdict, style="bold green" if r.healthy else "bold red"))
        if r.findings:
            c.print(Text("Findings, ranked by the predicted gain (else the most each fix can gain):", style="bold"))
        for i, f in enumerate(r.findings, 1):
            self._finding(c, i, f)
        if r.findings_not_shown:
            c.print(Text(f"... and {r.findings_not_shown} more (--all shows every finding)", style="dim"))
        for line in r.considered:
            c.print(Text(line, style="dim"))
        if r.replay:
            rp = r.replay
            c.print(Text(
                f"replay: {rp['replayed_ms']:.2f} ms replayed vs {rp['measured_ms']:.2f} ms measured over {rp['steps']} steps "
                f"({rp['error']:+.1%}{'' if rp['within_tolerance'] else ', off: no predictions'})",
                style="dim",
            ))
        if r.next_steps:
            c.print(Text("What would be next:", style="bold"))
            for i, f in enumerate(r.next_steps, 1):
                self._finding(c, i, f)

    def _finding(self, c: Console, i: int, f: dict[str, Any]) -> None:
        gain = f" — up to {f['gain_bound']:.2f}x" if f.get("gain_bound") else ""
        if f.get("predicted_speedup") is not None:
            bound = f", at most {f['gain_bound']:.2f}x" if f.get("gain_bound") else ""
            gain = f" — predicted {f['predicted_speedup']:.2f}x{bound}"
        c.print(Text.assemble(f"{i:>2}. ", (f["rule"], "bold"), " ", (f["title"], "bold"), (gain, "green")))
        c.print(Text(f"    {f['says']}"))
        if f["evidence"]:
            c.print(Text("    evidence: " + " · ".join(f"{e['symptom']} {e['text']}" for e in f["evidence"]), style="dim"))
        if f.get("lines"):
            c.print(Text(f"    where: {f['lines']}", style="yellow"))
        for line in f["do"].splitlines():
            c.print(Text(f"    | {line}", style="cyan"))
        c.print()


    def _ranks(self, c: Console, r: Report) -> None:
        d = r.distributed or {}
        table = Table(title=f"{d.get('world_size')} ranks side by side (the report above is rank {min(x['rank'] for x in d['ranks'])}'s)",
                      title_justify="left", box=None, header_style="bold")
        for column in ("rank", "status", "step ms", "data wait ms", "comm ms", "comm exposed", "GPU busy", "samples/step", "samples/s", "top exposed"):
            table.add_column(column, justify="left" if column in ("status", "top exposed") else "right")
        for row in d.get("ranks", []):
            table.add_row(
                str(row["rank"]),
                row["status"],
                _num(row.get("median_step_ms"), "{:.1f}"),
                _num(row.get("data_wait_ms"), "{:.2f}"),
                _num(row.get("communication_ms"), "{:.2f}"),
                _num(row.get("exposed_communication_share"), "{:.0%}"),
                _num(row.get("gpu_busy"), "{:.0%}"),
                _num(row.get("samples_per_step"), "{:g}"),
                _num(row.get("steady_samples_per_s"), "{:,.1f}"),
                str(row.get("top_exposed") or "-"),
            )
        c.print(table)
        if d.get("job_samples_per_s"):
            c.print(Text(f"the whole job: {d['job_samples_per_s']:,.1f} samples/s (steady, all ranks)", style="bold"))
        s = d.get("straggler")
        if s and s.get("excess_share") and s["excess_share"] >= 0.1:
            c.print(Text(f"straggler: rank {s['rank']} waits {s['data_wait_ms']:.2f} ms/step for data, the others {s['others_data_wait_ms']:.2f}", style="bold red"))
        c.print()

    def _experiments(self, c: Console, r: Report) -> None:
        e = r.experiments or {}
        key = e.get("compared_by", "steps_per_s")
        title = "What each recommendation really buys" if e.get("kind") == "verify" else "Sweep"
        table = Table(title=title, title_justify="left", box=None, header_style="bold")
        for column, justify in (
            ("run", "left"),
            ("result", "left"),
            (key.replace("_per_s", "/s"), "right"),
            ("speedup", "right"),
            ("predicted", "right"),
            ("bound", "right"),
            ("GPU busy", "right"),
            ("peak mem", "right"),
            ("top exposed after", "left"),
        ):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for row in e.get("rows", []):
            top = row.get("top_exposed") or {}
            compile_info = row.get("compile") or {}
            verdict = row.get("verdict") or row.get("status", "")
            if compile_info:
                verdict += f" (compile {compile_info.get('compile_s')} s"
                verdict += f", pays off after {compile_info['break_even_steps']} steps)" if "break_even_steps" in compile_info else ")"
            table.add_row(
                escape(str(row.get("label", ""))),
                verdict,
                f"{row[key]:.2f}" if row.get(key) else "-",
                f"{row['speedup']:.2f}x" if row.get("speedup") else "-",
                f"{row['predicted_speedup']:.2f}x" if row.get("predicted_speedup") else "",
                f"{row['gain_bound']:.2f}x" if row.get("gain_bound") else "",
                f"{row['gpu_busy'] * 100:.0f}%" if row.get("gpu_busy") is not None else "-",
                human_bytes(row["peak_reserved_bytes"]) if row.get("peak_reserved_bytes") else "-",
                f"{top.get('category')} {top.get('share', 0) * 100:.0f}%" if top else "-",
            )
        c.print(table)
        if e.get("kind") == "verify":
            c.print(Text(f"baseline spread: ±{e.get('baseline_spread', 0) * 100:.1f}% (changes inside it count as no effect)", style="dim"))
        for line in e.get("conclusions", []):
            c.print(Text(line))
        if e.get("plot"):
            c.print(Text(f"plot: {e['plot']}", style="dim"))
        c.print()


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _timing_text(t: dict[str, Any]) -> Text:
    parts = [f"{t['median_step_ms']:.1f} ms/step median (p90 {t['p90_step_ms']:.1f})", f"{t['steps_per_s']:.2f} steps/s"]
    if t.get("samples_per_s"):
        parts.append(f"{t['samples_per_s']:.0f} samples/s")
    return Text(" · ".join(parts))


def _apportion(shares: dict[str, float], width: int) -> dict[str, int]:
    """Cells per category that add up to ``width`` (largest remainders)."""
    raw = {k: v * width for k, v in shares.items() if v > 0}
    cells = {k: int(v) for k, v in raw.items()}
    left = width - sum(cells.values())
    for k in sorted(raw, key=lambda k: raw[k] - cells[k], reverse=True)[: max(left, 0)]:
        cells[k] += 1
    return cells
