"""report.html: charts, sections and escaping on reports built from hand-written traces, and the
page as headless Chromium renders it (``-m browser``)."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest

from diagnose.analysis.measure.categories import EXPOSED, exposed_labels
from diagnose.analysis.pipeline import AnalysisOptions, analyze_trace
from diagnose.analysis.report import Report
from diagnose.renderers.html import CATEGORY_COLOURS, CSP, HTMLRenderer, nice_ticks
from diagnose.renderers.view import ReportView, median_of
from tests.browser import elements, find_chromium, load_page, with_class
from tests.tracebuilder import AUTOGRAD, ELEMENTWISE, FP32_GEMM, MULTI_TENSOR, TraceBuilder

SCRIPT_TAG = "<script>alert(1)</script>"
IMG_ATTACK = '"><img src=x onerror=alert(1)>'


def gpu_trace(data_waits_us: list[int]) -> TraceBuilder:
    """Steps 5, 6, ...: a data wait of the given length, then forward, backward and optimizer kernels."""
    b = TraceBuilder()
    t = 0
    for i, wait in enumerate(data_waits_us):
        b.step(5 + i, t, wait + 700)
        b.data_wait(t, wait)
        w = t + wait
        b.op("aten::linear", w, 10, forward=True)
        b.kernel(FP32_GEMM, w + 20, 200, launch_ts=w + 5)
        b.backward_op(w + 250, 50)
        b.kernel(ELEMENTWISE, w + 260, 200, launch_ts=w + 260, tid=AUTOGRAD)
        b.optimizer(w + 500, 150)
        b.kernel(MULTI_TENSOR, w + 520, 100, launch_ts=w + 510)
        t += wait + 700
    return b


def cpu_trace(steps: int) -> TraceBuilder:
    b = TraceBuilder(device=False)
    for i in range(steps):
        t = i * 1000
        b.step(3 + i, t, 1000)
        b.data_wait(t, 200 + 50 * i)
        b.op("aten::linear", t + 300, 200, forward=True)
        b.backward_op(t + 550, 250)
        b.optimizer(t + 850, 100)
    return b


def analysed(builder: TraceBuilder, tmp_path: Path) -> Report:
    trace = builder.write(tmp_path / "worker_1.1700000000000.pt.trace.json.gz", gz=True)
    return analyze_trace(trace, AnalysisOptions.load())


def sweep(rows: list[tuple[str, str, float | None, float | None]]) -> dict[str, Any]:
    """``report.experiments`` for (label, status, samples/s, peak reserved bytes) rows."""
    return {
        "kind": "sweep",
        "parameters": ["num_workers"],
        "statistic": "mean of the timed steps with the profiler off, and their p10-p90",
        "rows": [
            {
                "label": label,
                "knobs": {},
                "status": status,
                "steps_per_s": None if rate is None else rate / 64,
                "samples_per_s": rate,
                "mean_step_ms": None if rate is None else 64_000 / rate,
                "p10_step_ms": None if rate is None else 0.9 * 64_000 / rate,
                "p90_step_ms": None if rate is None else 1.1 * 64_000 / rate,
                "gpu_busy": None,
                "peak_reserved_bytes": peak,
                "speedup": None if rate is None else rate / 1000,
                "top_exposed": {"category": "data_wait", "share": 0.3} if rate else None,
                "run_dir": f"runs/x/{label}",
            }
            for label, status, rate, peak in rows
        ],
    }


SWEEP_ROWS = [
    ("num_workers=0", "ok", 1000.0, 4e9),
    ("num_workers=2", "ok", 1800.0, 4.1e9),
    ("num_workers=4", "oom", None, None),
    ("num_workers=8", "failed", None, None),
]


@pytest.fixture
def gpu_report(tmp_path: Path) -> Report:
    report = analysed(gpu_trace([600, 300, 450, 200]), tmp_path)
    report.memory.update(peak_reserved_bytes=6e9, peak_allocated_bytes=5e9)
    return report


def nonzero_segments(report: Report) -> int:
    return sum(1 for step in report.breakdown["steps"] for cat in EXPOSED if step["exposed_ms"][cat] > 0)  # type: ignore[index]


def hostile(report: Report) -> Report:
    """The report with attack strings wherever a script, a trace or a rule file puts text."""
    data = report.to_dict()
    attack = f"{SCRIPT_TAG} {IMG_ATTACK}"
    data["run"] = {
        "target": {"kind": "script", "value": f"/tmp/{SCRIPT_TAG}.py", "args": [IMG_ATTACK]},
        "command": ["diagnose", "run", attack],
    }
    data["warnings"] = [attack]
    data["dataloader"] = {"created_at": f"train.py:12 {attack}", "num_workers": 0}
    data["environment"] = {**data["environment"], "hostname": attack}
    finding = data["findings"][0]
    finding.update(title=attack, says=attack, do=attack, why=attack, references=["javascript:alert(1)", attack])
    data["symptoms"][finding["evidence"][0]] = {"value": 1.0, "unit": attack, "description": attack}
    finding["evidence"].append(attack)  # a symptom name from a hostile report.json
    data["experiments"] = sweep([(attack, "ok", 1000.0, 4e9), (IMG_ATTACK, "oom", None, None)])
    return Report.from_dict(data)


# --- the markup, without a browser ---------------------------------------------------------------


def test_gpu_report_has_one_bar_per_step_and_a_legend_entry_per_category(gpu_report: Report) -> None:
    page = HTMLRenderer().render(gpu_report)
    found = elements(page)
    steps = gpu_report.breakdown["steps"]  # type: ignore[index]
    assert len(with_class(found, "svg", "steps-chart")) == 1
    assert len(with_class(found, "rect", "seg")) == nonzero_segments(gpu_report)
    drawn = {e.attrs["data-category"] for e in with_class(found, "rect", "seg")}
    legend = {e.attrs["data-category"] for e in with_class(found, "tr", "legend-row")}
    assert drawn == legend
    assert {"data_wait", "gpu_forward", "gpu_backward", "gpu_optimizer"} <= drawn
    for step in steps:
        assert re.search(rf">{step['number']}</text>", page)
    for cat in drawn:
        assert exposed_labels(on_gpu=True)[cat] in page
        assert f".c-{cat}{{fill:{CATEGORY_COLOURS[cat]}" in page


def test_median_step_strips_are_in_time_order_and_span_the_step(gpu_report: Report) -> None:
    page = HTMLRenderer().render(gpu_report)
    timeline = gpu_report.breakdown["median_step_timeline"]  # type: ignore[index]
    assert timeline["step"] == 6  # durations 1300, 1000, 1150, 900 us: the lower median is 1000
    strips = [e for e in with_class(elements(page), "svg", "strip")]
    assert len(strips) == 2
    widths = [float(e.attrs["width"]) for e in with_class(elements(page), "rect", "strip-seg")]
    runs = len(timeline["exposed"])
    assert len(widths) == runs + len(timeline["phases"])
    assert sum(widths[:runs]) == pytest.approx(960, abs=1)
    assert sum(widths[runs:]) == pytest.approx(960, abs=1)
    assert "from its start (left) to its end (right)" in page
    assert "hidden behind GPU work" in page


def test_reports_without_a_timeline_fall_back_to_totals(gpu_report: Report) -> None:
    assert gpu_report.breakdown is not None
    gpu_report.breakdown.median_step_timeline = None
    page = HTMLRenderer().render(gpu_report)
    step = median_of(ReportView.from_report(gpu_report).breakdown.steps)  # type: ignore[union-attr]
    widths = [float(e.attrs["width"]) for e in with_class(elements(page), "rect", "strip-seg")]
    exposed_count = sum(1 for v in step.exposed_ms.values() if v > 0)
    assert sum(widths[:exposed_count]) == pytest.approx(960, abs=1)
    assert "not a time-ordered trace" in page


def test_page_is_self_contained(gpu_report: Report) -> None:
    gpu_report.experiments = sweep(SWEEP_ROWS)
    page = HTMLRenderer().render(gpu_report)
    assert f'http-equiv="Content-Security-Policy" content="{html.escape(CSP)}"' in page
    for needle in ("<script", "<link", "<img", "@import", "url(", " src="):
        assert needle not in page
    external = re.findall(r'href="(?!#)([^"]*)"', page)
    assert all(link.startswith("https://") for link in external)  # rule references, followed only on a click
    assert len(page.encode()) < 200_000


def test_cpu_report_has_no_gpu_categories(tmp_path: Path) -> None:
    report = analysed(cpu_trace(3), tmp_path)
    page = HTMLRenderer().render(report)
    found = elements(page)
    assert len(with_class(found, "rect", "seg")) == nonzero_segments(report)
    assert not any(e.attrs["data-category"].startswith("gpu_") for e in with_class(found, "rect", "seg"))
    assert "CPU only" in page
    assert "forward (CPU compute)" in page
    assert "hidden behind GPU work" not in page
    # the words fit the device: the header says no GPU was used, and nothing else speaks of one
    visible = re.sub(r"<(style|script)\b.*?</\1>|<[^>]+>", " ", page, flags=re.S)
    assert re.findall(r"[^.]{0,30}\bGPU\b[^.]{0,30}", visible.replace("no GPU used", "")) == []


def test_report_of_a_run_that_failed_before_profiling() -> None:
    report = Report.from_dict(
        {
            "status": {
                "state": "failed",
                "exit_code": 1,
                "message": "the script raised RuntimeError: no <data>",
                "error": {
                    "type": "RuntimeError",
                    "message": "no <data>",
                    "traceback": 'File "train.py", line 3\nRuntimeError: no <data>\n',
                },
            },
            "run": {
                "target": {"kind": "script", "value": "/w/train.py", "args": []},
                "steps_seen": 0,
                "profiled_steps": 0,
                "trace_files": [],
            },
            "environment": {"device": "cpu", "cpu_count": 2},
            "throughput": {"batch_size": None},
            "warnings": ["no trace was written: the script ended before the profiled window"],
        }
    )
    page = HTMLRenderer().render(report)
    assert "No profiled step" in page
    assert "the script raised RuntimeError: no &lt;data&gt;" in page
    assert "line 3\nRuntimeError: no &lt;data&gt;" in page  # the traceback, escaped
    assert "no trace was written" in page
    assert "<svg" not in page.replace('class="meter"', "")


def test_sweep_draws_both_charts_and_marks_failed_rows(gpu_report: Report) -> None:
    gpu_report.experiments = sweep(SWEEP_ROWS)
    found = elements(HTMLRenderer().render(gpu_report))
    charts = with_class(found, "svg", "bar-chart")
    assert [c.attrs["class"].split()[-1] for c in charts] == ["chart-samples_per_s", "chart-peak_reserved_bytes"]
    assert len(with_class(found, "rect", "bar-ok")) == 2 * 2
    assert len(with_class(found, "rect", "bar-failed")) == 2 * 2
    assert len(with_class(found, "rect", "status-oom")) == 2
    assert len(with_class(found, "tr", "failed")) == 2


def test_sweep_table_says_which_statistic_it_shows(gpu_report: Report) -> None:
    gpu_report.experiments = sweep(SWEEP_ROWS)
    page = HTMLRenderer().render(gpu_report)
    assert "Rates and steps: mean of the timed steps with the profiler off, and their p10-p90." in page
    assert "<th>mean samples/s</th>" in page and "<th>mean step ms (p10–p90)</th>" in page
    assert "<td>64.0 (57.6–70.4)</td>" in page  # 1,000 samples/s of 64: a 64 ms mean step


def test_sweep_without_memory_figures_draws_throughput_only(gpu_report: Report) -> None:
    gpu_report.experiments = sweep([("num_workers=0", "ok", 1000.0, None), ("num_workers=2", "ok", 1500.0, None)])
    charts = with_class(elements(HTMLRenderer().render(gpu_report)), "svg", "bar-chart")
    assert [c.attrs["class"].split()[-1] for c in charts] == ["chart-samples_per_s"]


def test_hostile_strings_are_escaped_in_the_source(tmp_path: Path) -> None:
    builder = gpu_trace([400, 300])
    builder.kernel(SCRIPT_TAG, 100, 10, launch_ts=90)
    report = hostile(analysed(builder, tmp_path))
    page = HTMLRenderer().render(report)
    assert SCRIPT_TAG not in page
    assert "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert 'href="javascript:' not in page


def test_nice_ticks() -> None:
    assert nice_ticks(9.19) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0.58) == pytest.approx([0, 0.2, 0.4, 0.6])
    assert nice_ticks(0) == [0, 1]


# --- the page in a real browser ------------------------------------------------------------------


@pytest.fixture
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install -y chromium)")
    return path


@pytest.mark.browser
def test_charts_render_in_chromium(gpu_report: Report, chromium: str, tmp_path: Path) -> None:
    from PIL import Image

    gpu_report.experiments = sweep(SWEEP_ROWS)
    page = tmp_path / "report.html"
    page.write_text(HTMLRenderer().render(gpu_report), encoding="utf-8")
    loaded = load_page(chromium, page, tmp_path)

    assert loaded.console == []  # no script error, no blocked load
    found = elements(loaded.dom)
    assert not [e for e in found if e.tag == "script"]
    assert len(with_class(found, "svg", "chart")) == 1 + 2 + 2  # steps, two strips, two sweep charts
    assert len(with_class(found, "rect", "seg")) == nonzero_segments(gpu_report)
    assert len(with_class(found, "rect", "bar-failed")) == 4

    assert loaded.screenshot.stat().st_size > 20_000
    width, height = Image.open(loaded.screenshot).size
    pixels_by_colour = {rgb: n for n, rgb in Image.open(loaded.screenshot).convert("RGB").getcolors(width * height)}
    painted = {cat: pixels_by_colour.get(_rgb(CATEGORY_COLOURS[cat]), 0) for cat in ("data_wait", "gpu_backward")}
    assert all(count > 1000 for count in painted.values()), painted  # the bars were painted, not only parsed


@pytest.mark.browser
def test_hostile_strings_are_text_in_chromium(chromium: str, tmp_path: Path) -> None:
    report = hostile(analysed(gpu_trace([400, 300]), tmp_path))
    page = tmp_path / "report.html"
    page.write_text(HTMLRenderer().render(report), encoding="utf-8")
    loaded = load_page(chromium, page, tmp_path)

    assert loaded.console == []
    tags = [e.tag for e in elements(loaded.dom)]
    assert "script" not in tags and "img" not in tags
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in loaded.dom  # shown as text
    assert loaded.screenshot.stat().st_size > 10_000


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]
