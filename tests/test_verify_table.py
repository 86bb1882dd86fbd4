"""verify's table says how each knob reached the loop (a "via" column) in the terminal, markdown and
HTML renderings: the framework's own switch, the script's own compile call, or the global way."""

from __future__ import annotations

from pathlib import Path

from diagnose.analysis.report import Report
from diagnose.experiments import Baseline, Outcome, VerifyResult, judge, summarize_verify
from diagnose.renderers.html import HTMLRenderer
from diagnose.renderers.markdown import MarkdownRenderer
from diagnose.renderers.terminal import TerminalRenderer
from diagnose.renderers.view import via_text
from tests.test_html import analysed, cpu_trace

VIA_COMPILE = "the script's torch.compile(...) call"
VIA_PRECISION = 'Trainer(precision="bf16-mixed")'


def _verified(tmp_path: Path) -> Report:
    """A report with verify's section: two baselines, LAUNCH002 through the script's compile call,
    and the combined run, whose two knobs went two ways."""
    baseline = Baseline(
        [Outcome("baseline", {}, "ok", "", steps_per_s=10.0), Outcome("baseline", {}, "ok", "", steps_per_s=10.1)],
        False,
    )
    compiled = Outcome(
        "LAUNCH002",
        {"compile": "reduce-overhead"},
        "ok",
        "",
        rule="LAUNCH002",
        steps_per_s=21.0,
        via={"compile": VIA_COMPILE},
    )
    both = Outcome(
        "combined",
        {"compile": "reduce-overhead", "autocast": "bf16"},
        "ok",
        "",
        steps_per_s=25.0,
        via={"compile": VIA_COMPILE, "autocast": VIA_PRECISION},
    )
    for o in (compiled, both):
        judge(o, baseline)
    for b in baseline.runs:
        b.verdict = "baseline"
    report = analysed(cpu_trace(4), tmp_path)
    report.experiments = summarize_verify(VerifyResult(baseline, [compiled], both, []), {})
    return report


def test_via_text_names_the_way_per_knob() -> None:
    assert via_text({"compile": "reduce-overhead"}, {"compile": VIA_COMPILE}) == VIA_COMPILE
    assert via_text({"compile": "x", "autocast": "bf16"}, {"compile": VIA_COMPILE, "autocast": VIA_PRECISION}) == (
        f"compile: {VIA_COMPILE}; autocast: {VIA_PRECISION}"
    )
    assert via_text({}, {}) == "" and via_text({"num_workers": 4}, {}) == ""


def test_the_verify_table_has_a_via_column_in_every_rendering(tmp_path: Path) -> None:
    report = _verified(tmp_path)
    terminal = TerminalRenderer(color=False, width=240).render(report)
    header = next(line for line in terminal.splitlines() if "speedup" in line and "run" in line)
    assert header.split()[:3] == ["run", "via", "result"]
    row = next(line for line in terminal.splitlines() if line.strip().startswith("LAUNCH002"))
    assert VIA_COMPILE in row and "2.09x" in row

    markdown = MarkdownRenderer().render(report)
    assert "| run | via | result | steps/s | speedup |" in markdown
    assert f"| LAUNCH002 | {VIA_COMPILE} | helped | 21.00 | 2.09x |" in markdown
    assert (
        f"| combined | compile: {VIA_COMPILE}; autocast: {VIA_PRECISION.replace('|', chr(92) + '|')} | helped |"
        in markdown
    )

    page = HTMLRenderer().render(report)
    assert "<th>via</th>" in page
    assert "<td>the script&#x27;s torch.compile(...) call</td>" in page
