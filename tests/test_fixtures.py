"""The GPU analysis on CI without a GPU: traces recorded on an NVIDIA H200 (benchmarks/truth.py),
trimmed to a few steps (diagnose.analysis.trace.trim), with the breakdown the untrimmed trace gave.

Each planted example's report must name its planted cause as the top finding, quote the
planted line, and no other rule may fire (the well-tuned control gets no finding at all).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose.analysis.pipeline import AnalysisOptions
from diagnose.rundir import RunDir
from diagnose.session import analyze_run
from tests.conftest import DATA

FIXTURES = sorted(p.parent for p in DATA.glob("*/expected.json"))


def test_every_planted_example_has_a_fixture() -> None:
    assert {p.name for p in FIXTURES} == {
        "data_bound",
        "pageable_copies",
        "fp32_transformer",
        "launch_bound",
        "item_syncs",
        "forloop_optimizer",
        "cpu_preprocessing",
        "well_tuned",
    }


@pytest.fixture(params=FIXTURES, ids=lambda p: p.name)
def fixture(request) -> tuple[Path, dict, object]:
    folder = request.param
    return (
        folder,
        json.loads((folder / "expected.json").read_text()),
        analyze_run(RunDir(folder), AnalysisOptions.load(show_all=True)),
    )


def test_breakdown_matches_the_untrimmed_trace(fixture) -> None:
    _folder, expected, report = fixture
    steps = {str(s["number"]): s for s in report.breakdown["steps"]}
    assert set(steps) == set(expected["steps"])
    for number, want in expected["steps"].items():
        got = steps[number]
        assert got["duration_ms"] == pytest.approx(want["duration_us"] / 1000, abs=1e-3)
        for key, us in want["exposed_us"].items():
            assert got["exposed_ms"][key] == pytest.approx(us / 1000, abs=1e-3), key
        for key, us in want["phases_us"].items():
            assert got["phases_ms"][key] == pytest.approx(us / 1000, abs=1e-3), key
        assert got["kernels"] == want["kernels"] and got["syncs"] == want["syncs"]
        assert got["h2d_pageable_bytes"] == want["h2d_pageable_bytes"]
        assert sum(got["exposed_ms"].values()) == pytest.approx(got["duration_ms"], abs=1e-3)
    assert report.breakdown["device"] == "cuda"


def test_the_planted_cause_is_the_only_finding(fixture) -> None:
    _folder, expected, report = fixture
    rules = [f["rule"] for f in report.findings]
    if expected["planted_rule"] is None:
        assert rules == [] and report.healthy  # no false alarm on the well-tuned loop
        assert [f["rule"] for f in report.next_steps] == ["NEXT001"]
        assert report.verdict.startswith("No bottleneck found")
    else:
        assert rules == [expected["planted_rule"]], rules
    assert rules == expected["findings"]


def test_the_report_quotes_the_planted_line(fixture) -> None:
    _folder, expected, report = fixture
    if expected["line"] is None:
        pytest.skip("nothing to quote for this example")
    top = report.findings[0]
    assert expected["line"] in (top.get("lines") or ""), top.get("lines")


def test_each_rule_fires_on_its_own_example_only() -> None:
    fired: dict[str, list[str]] = {}
    for folder in FIXTURES:
        for rule in analyze_run(RunDir(folder), AnalysisOptions.load(show_all=True)).findings:
            fired.setdefault(rule["rule"], []).append(folder.name)
    assert all(len(examples) == 1 for examples in fired.values()), fired
