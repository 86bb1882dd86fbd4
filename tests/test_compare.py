"""diagnose compare and the CI gate: hand-made reports with exact expectations, the recorded
fixtures (the data-bound loop against the well-tuned one), the renderers and the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.analysis.compare import SHIFT_WORDS, compare_reports, shift_sentence
from diagnose.analysis.gate import check, parse_condition
from diagnose.analysis.measure.categories import EXPOSED, PHASES
from diagnose.analysis.report import Report
from diagnose.errors import UsageError
from diagnose.renderers.comparison import render_comparison
from diagnose.renderers.comparison_text import step_text
from tests.conftest import DATA, REPO


def made_report(
    exposed: dict[str, float],
    samples_per_s: float | None,
    steps_per_s: float,
    rules: tuple[str, ...] = (),
    category: str = "data",
) -> Report:
    """A GPU report with these exposed shares (the rest 0), phases all "other", throughput, and findings."""
    symptoms = {f"exposed.{c}": {"value": exposed.get(c, 0.0), "unit": "share"} for c in EXPOSED}
    symptoms |= {f"phase.{p}": {"value": 1.0 if p == "other" else 0.0, "unit": "share"} for p in PHASES}
    symptoms["gpu.busy"] = {"value": sum(v for c, v in exposed.items() if c.startswith("gpu_")), "unit": "share"}
    mean = 1000 / steps_per_s
    steady = {
        "steps": 20,
        "median_step_ms": mean,
        "mean_step_ms": mean,
        "p10_step_ms": 0.9 * mean,
        "p90_step_ms": 1.2 * mean,
        "steps_per_s": steps_per_s,
        "samples_per_s": samples_per_s,
    }
    return Report(
        source={"kind": "run", "run_dir": "runs/x"},
        status={"state": "stopped"},
        throughput={"steady": steady},
        breakdown={"device": "cuda", "steps": [], "window": {}},
        symptoms=symptoms,
        findings=[
            {"rule": r, "title": f"title of {r}", "category": category, "says": "", "do": "", "evidence": []}
            for r in rules
        ],
        verdict="v",
    )


BEFORE = made_report({"data_wait": 0.64, "gpu_backward": 0.2, "gpu_forward": 0.16}, 100.0, 10.0, ("DATA001",))
AFTER = made_report(
    {"data_wait": 0.03, "gpu_backward": 0.51, "gpu_forward": 0.46}, 310.0, 31.0, ("PREC001",), category="precision"
)


def test_the_shift_names_the_old_and_the_new_bottleneck() -> None:
    comparison = compare_reports([("before", BEFORE), ("after", AFTER)])
    assert comparison.runs[1].shift == "data wait 64% -> 3%; the step is now GPU backward, 51% (3.10x samples/s)"
    assert comparison.runs[0].shift is None
    assert comparison.rate_key == "samples_per_s"
    assert [r.speedup for r in comparison.runs] == [1.0, 3.1]
    assert comparison.runs[1].appeared == ("PREC001",) and comparison.runs[1].disappeared == ("DATA001",)
    rows = {row.name: row for row in comparison.exposed}
    assert set(rows) == {"data_wait", "gpu_forward", "gpu_backward"}  # categories with time in some run
    assert rows["data_wait"].shares == (0.64, 0.03) and rows["data_wait"].deltas == (0.0, -0.61)
    assert [row.name for row in comparison.phases] == ["other"]
    # one statistic, as in verify and sweep: the mean step with its p10-p90
    assert (comparison.runs[0].mean_step_ms, comparison.runs[0].p10_step_ms, comparison.runs[0].p90_step_ms) == (
        100.0,
        90.0,
        120.0,
    )
    assert step_text(comparison.runs[0]) == "100 ms (90.0–120.0)"


def test_an_unchanged_bottleneck_is_said_to_hold() -> None:
    words = SHIFT_WORDS
    assert (
        shift_sentence({"data_wait": 0.64}, {"data_wait": 0.58}, words) == "data wait still limits the step: 64% -> 58%"
    )
    assert (
        shift_sentence({"data_wait": 0.64}, {"data_wait": 0.62}, words, 1.02)
        == "no shift: data wait still limits the step (64% -> 62%) (1.02x samples/s)"
    )
    assert shift_sentence(None, {"data_wait": 0.6}, words) == "no breakdown to compare"


def test_steps_per_second_when_a_run_did_not_count_samples_and_the_shift_chains_runs() -> None:
    third = made_report({"host_other": 0.7, "gpu_backward": 0.3}, None, 40.0)
    comparison = compare_reports([("a", BEFORE), ("b", AFTER), ("c", third)])
    assert comparison.rate_key == "steps_per_s"
    assert comparison.runs[2].speedup == 4.0  # against the baseline
    assert comparison.runs[2].shift.startswith(
        "GPU backward 51% -> 30%; the step is now other host work (GPU idle), 70%"
    )  # against b
    assert comparison.runs[2].disappeared == ("DATA001",) and comparison.runs[2].appeared == ()
    with pytest.raises(ValueError):
        compare_reports([("a", BEFORE)])


def test_recorded_fixtures_compare_and_render() -> None:
    import diagnose

    comparison = diagnose.compare(DATA / "data_bound", DATA / "well_tuned")
    assert comparison.labels == ("data_bound", "well_tuned")
    assert comparison.shifts == ("data wait 97% -> 0%; the step is now GPU backward, 59% (1.18x samples/s)",)
    text = render_comparison(comparison, "terminal", color=False, width=120)
    assert "gone DATA001" in text and "-96.8 pt" in text
    assert "mean step (p10–p90)" in text and "median step" not in text
    data = json.loads(render_comparison(comparison, "json"))
    assert data["schema"] == "diagnose.comparison/1" and data["runs"][1]["disappeared"] == ["DATA001"]
    page = render_comparison(comparison, "html")
    assert page.count('class="chart steps-chart"') == 2  # the per-step bars, side by side
    assert "mean step (p10–p90)" in page
    assert "<script" not in page and "data wait 97% -&gt; 0%" in page


def test_gate_conditions_parse_and_fire() -> None:
    assert parse_condition("DATA001").value == "DATA001"
    assert parse_condition("rule:SYNC001").kind == "rule"
    assert parse_condition("throughput<baseline-5%").needs_baseline
    condition = parse_condition("throughput < 1200 - 2.5%")
    assert (condition.bound, condition.tolerance) == (1200.0, 0.025)
    for bad in ("thruput<3", "rule:lower1", "category:", "throughput>5"):
        with pytest.raises(UsageError):
            parse_condition(bad)
    conditions = [parse_condition(t) for t in ("DATA001", "category:precision", "any")]
    assert check(BEFORE, conditions) == ["DATA001: DATA001 fired", "any: DATA001 fired"]
    assert check(AFTER, conditions) == ["category:precision: PREC001 fired", "any: PREC001 fired"]


def test_gate_on_throughput_with_a_tolerance() -> None:
    slower = made_report({"data_wait": 0.5, "gpu_backward": 0.5}, 95.0, 9.5)
    within = [parse_condition("throughput<baseline-6%")]
    beyond = [parse_condition("throughput<baseline-4%")]
    assert check(slower, within, baseline=BEFORE) == []
    assert check(slower, beyond, baseline=BEFORE) == [
        "throughput<baseline-4%: 95.0 samples/s is 5.0% below the baseline's 100.0 (allowed: 4%)"
    ]
    assert check(slower, [parse_condition("throughput<96")]) == ["throughput<96: 95.0 samples/s is 1.0% below 96"]
    assert check(slower, [parse_condition("throughput<95")]) == []
    with pytest.raises(UsageError):
        check(slower, beyond)  # no baseline to compare with


def _diagnose(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "diagnose", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_compare_command_gate_and_exit_codes(tmp_path: Path) -> None:
    base, fixed = str(DATA / "data_bound"), str(DATA / "well_tuned")
    proc = _diagnose(
        "compare",
        base,
        fixed,
        "--no-color",
        "--html",
        str(tmp_path / "c.html"),
        "--fail-on",
        "throughput<baseline-5%",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "the step is now GPU backward" in proc.stdout and (tmp_path / "c.html").stat().st_size > 5000
    proc = _diagnose(
        "compare",
        fixed,
        base,
        "--json",
        "--fail-on",
        "throughput<baseline-5%",
        "--fail-on",
        "category:data",
        cwd=tmp_path,
    )
    assert proc.returncode == 6
    assert json.loads(proc.stdout)["runs"][1]["appeared"] == ["DATA001"]
    assert "fail-on: category:data: DATA001 fired" in proc.stderr and "15.0% below the baseline's 796.5" in proc.stderr
    proc = _diagnose(
        "analyze", str(DATA / "bare" / "data_bound.pt.trace.json.gz"), "--json", "--fail-on", "DATA001", cwd=tmp_path
    )
    assert proc.returncode == 6 and json.loads(proc.stdout)["findings"][0]["rule"] == "DATA001"
    proc = _diagnose(
        "analyze", str(DATA / "bare" / "well_tuned.pt.trace.json.gz"), "--json", "--fail-on", "DATA001", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert _diagnose("compare", base, "--fail-on", "nonsense", cwd=tmp_path).returncode == 2
    assert _diagnose("compare", base, cwd=tmp_path).returncode == 2  # one run is no comparison


def test_a_sweep_directory_compares_its_child_runs_and_gets_events(tmp_path: Path) -> None:
    import shutil

    from diagnose.renderers.comparison_events import comparison_markdown, comparison_scalars, write_comparison_events

    parent = tmp_path / "sweep"
    for label, fixture in (("num_workers=0", "data_bound"), ("num_workers=8", "well_tuned")):
        shutil.copytree(DATA / fixture, parent / label)
    rows = [
        {"label": label, "status": "ok", "run_dir": str(parent / label)} for label in ("num_workers=8", "num_workers=0")
    ]
    Report(
        source={"kind": "sweep", "run_dir": str(parent)},
        status={"state": "sweep"},
        experiments={"kind": "sweep", "rows": rows},
    ).save(parent / "report.json")
    import diagnose

    comparison = diagnose.compare(parent)
    assert comparison.labels == ("num_workers=8", "num_workers=0")  # the sweep's own order
    path = write_comparison_events(comparison, parent)
    assert path.name.endswith(".diagnose-compare")
    scalars = {(step, tag): value for step, tag, value in comparison_scalars(comparison)}
    assert scalars[(1, "compare/exposed_data_wait")] == pytest.approx(0.967823)
    assert scalars[(0, "compare/samples_per_s")] == pytest.approx(796.55)
    assert comparison_markdown(comparison).startswith("| step | run | mean samples/s | speedup | findings |")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(path)).Reload()
    assert [e.value for e in events.Scalars("compare/speedup")] == pytest.approx([1.0, 677.45 / 796.55], abs=1e-4)
