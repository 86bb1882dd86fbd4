"""How verify and sweep show their runs (issue 18, item 5): the device in the header, no columns a
CPU run cannot fill, baselines as the reference, a reason for every failed point, a sweep page
without the sections of a single run."""

from __future__ import annotations

import re
from pathlib import Path

from diagnose.analysis.report import Report
from diagnose.experiments import (
    Baseline,
    Outcome,
    Spec,
    VerifyResult,
    judge,
    outcome_from_report,
    summarize_sweep,
    summarize_verify,
)
from diagnose.renderers.html import HTMLRenderer
from diagnose.renderers.terminal import TerminalRenderer

CPU_ENVIRONMENT = {"device": "cpu", "cpu_count": 2, "torch": "2.13.0+cpu", "python": "3.11.7"}


def cpu_point(label: str, samples_per_s: float) -> Outcome:
    """A point measured on a CPU: GPU busy 0, no device memory."""
    return Outcome(
        label,
        {"num_workers": label[-1]},
        "ok",
        f"runs/s/{label}",
        steps_per_s=samples_per_s / 8,
        samples_per_s=samples_per_s,
        mean_step_ms=8000 / samples_per_s,
        gpu_busy=0.0,
        top_exposed={"category": "host_backward", "share": 0.5},
    )


def too_short_report() -> dict:
    """What ``diagnose run --json`` says of a script that ends before the timed window."""
    return {
        "status": {
            "state": "completed",
            "exit_code": 0,
            "message": "the script ran to its end after 8 steps",
            "error": None,
        },
        "throughput": {
            "batch_size": 8.0,
            "profiled": {"steps": 3, "median_step_ms": 400.0, "steps_per_s": 2.5, "samples_per_s": 20.0},
            "steady": None,
            "note": "too few steps for the steady-state timing (profiler off); figures are from the profiled window",
        },
    }


def sweep_report(outcomes: list[Outcome]) -> Report:
    summary = summarize_sweep(["num_workers"], outcomes)
    return Report(
        source={"kind": "sweep", "run_dir": "runs/sweep-x"},
        status={"state": "sweep", "exit_code": 0, "message": f"{len(outcomes)} runs of data_bound.py", "error": None},
        run={"target": {"kind": "script", "value": "/w/data_bound.py", "args": []}},
        environment=CPU_ENVIRONMENT,
        verdict=summary["conclusions"][0],
        experiments=summary,
    )


def terminal(report: Report) -> str:
    return TerminalRenderer(color=False).render(report)


def measured_point(label: str, steady: float | None, profiled: float | None) -> Outcome:
    """A point as ``outcome_from_report`` reads it: steady and profiled samples/s (None: not measured)."""
    figures = {
        name: (
            {"steps": 10, "steps_per_s": rate / 8, "samples_per_s": rate, "mean_step_ms": 8000 / rate} if rate else None
        )
        for name, rate in (("steady", steady), ("profiled", profiled))
    }
    point = Outcome(label, {"num_workers": label.split("=")[-1]}, "ok", f"runs/s/{label}", figures=figures)
    point.use("steady" if steady else "profiled")
    return point


def test_a_point_that_ends_before_the_timed_window_is_measured_by_its_profiled_window() -> None:
    # issue 33: 6 and 15 "failed" for ending before the timed window, and the slowest point,
    # the one that did not, was called best
    outcome = outcome_from_report(
        Spec("num_workers=6", {"num_workers": "6"}), too_short_report(), Path("/nonexistent"), 0
    )
    assert (outcome.status, outcome.basis, outcome.samples_per_s, outcome.error) == ("ok", "profiled", 20.0, None)
    points = [
        measured_point("num_workers=2", steady=12.0, profiled=10.0),
        outcome,
        measured_point("num_workers=15", steady=None, profiled=30.0),
    ]
    summary = summarize_sweep(["num_workers"], points)
    # like with like: every row by its profiled window, and the best among them
    assert summary["basis"] == "profiled" and summary["statistic"].startswith("mean of the profiled steps")
    assert [r["samples_per_s"] for r in summary["rows"]] == [10.0, 20.0, 30.0]
    assert [r["speedup"] for r in summary["rows"]] == [1.0, 2.0, 3.0]
    assert summary["conclusions"][0] == "best: num_workers=15 at 30.0 samples/s (profiled window)"
    assert not any("failed" in line for line in summary["conclusions"])
    text = terminal(sweep_report(points))
    assert "failed" not in text and "profiled" in text


def test_best_is_never_a_failed_run_nor_one_measured_another_way() -> None:
    failed = Outcome("num_workers=8", {"num_workers": "8"}, "failed", "", error="the script raised RuntimeError")
    steady_only = measured_point("num_workers=4", steady=50.0, profiled=None)  # its script's own profiler: no window
    short = measured_point("num_workers=0", steady=None, profiled=10.0)
    summary = summarize_sweep(["num_workers"], [short, steady_only, failed])
    assert summary["conclusions"][0].startswith("best: num_workers=0")
    assert (
        "num_workers=4: measured, but not as the others were (no profiled steps): not compared"
        in summary["conclusions"]
    )
    # all timed: the steady figures, as before
    summary = summarize_sweep(
        ["num_workers"], [measured_point("a=1", 12.0, 10.0), measured_point("a=2", 15.0, 9.0), failed]
    )
    assert summary["basis"] == "steady" and summary["conclusions"][0] == "best: a=2 at 15.0 samples/s"


def test_a_cpu_sweep_names_its_device_and_has_no_gpu_columns_nor_blank_runs() -> None:
    text = terminal(sweep_report([cpu_point("num_workers=0", 12.0), cpu_point("num_workers=1", 9.6)]))
    header = text.splitlines()[0]
    assert "CPU only" in header and "?" not in header
    assert "\n\n\n" not in text  # no empty sections
    assert "GPU busy" not in text and "peak mem" not in text


def test_a_cpu_sweep_page_shows_the_sweep_not_a_missing_run() -> None:
    page = HTMLRenderer().render(sweep_report([cpu_point("num_workers=0", 12.0), cpu_point("num_workers=1", 9.6)]))
    visible = re.sub(r"<(style|script)\b.*?</\1>|<[^>]+>", " ", page, flags=re.S)
    for absent in (
        "No step was timed",
        "No profiled step",
        "nothing was profiled",
        "device unknown",
        "GPU busy",
        "peak reserved",
    ):
        assert absent not in visible, absent
    assert "CPU only" in visible and "bar-chart" in page


def test_verify_baselines_are_shown_as_the_reference() -> None:
    baselines = [cpu_point("baseline", 16.2), cpu_point("baseline", 19.9)]
    baseline = Baseline(baselines, by_samples=True)
    for b in baselines:
        judge(b, baseline)
        b.verdict = "baseline"
    tried = cpu_point("num_workers=1", 30.0)
    tried.rule = "DATA001"
    judge(tried, baseline)
    report = Report(
        environment=CPU_ENVIRONMENT, status={"state": "stopped", "exit_code": 0, "message": "ok", "error": None}
    )
    report.experiments = summarize_verify(
        VerifyResult(baseline, [tried], None, []), {"findings": [{"rule": "DATA001", "gain_bound": 2.0}]}
    )
    text = terminal(report)
    rows = {
        line.split()[0]: line for line in text.splitlines() if line.strip().startswith(("baseline", "num_workers=1"))
    }
    assert "reference" in rows["baseline"] and not re.search(r"\d\.\d\dx", rows["baseline"].split("baseline", 2)[-1])
    assert f"{tried.speedup:.2f}x" in rows["num_workers=1"]
    page = HTMLRenderer().render(report)
    assert page.count(">reference<") == 2 and "0.90x" not in page and "1.10x" not in page
