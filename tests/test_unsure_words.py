"""An unsure finding says what would measure it (issue 32, a leftover): ``diagnose run``'s check
only where one of its knobs applies the change in one process. The README's first command
printed "diagnose run measures it (--check N)" under DATA007, which no knob applies, and a
distributed run said it under DIST002 although a distributed run measures nothing in-run."""

from __future__ import annotations

import html
import json

import pytest

from diagnose.analysis.report import Report
from diagnose.renderers import TerminalRenderer
from diagnose.renderers.html import HTMLRenderer
from diagnose.units import unsure_words
from tests.conftest import REPO

WHY = ["no prediction: the model cannot replay this change here"]


@pytest.mark.parametrize(
    "knobs, world_size, tail",
    [
        ({"num_workers": "4"}, None, "diagnose run measures it (--check N)"),
        ({"num_workers": "4"}, 1, "diagnose run measures it (--check N)"),
        ({}, None, "no knob applies this change; make it and run diagnose again to measure it"),
        (
            {"compile": "n/a", "x": ""},
            None,
            "no knob applies this change; make it and run diagnose again to measure it",
        ),
        (
            {"bucket_cap_mb": "25"},
            2,
            "diagnose verify --nproc-per-node N --rule DIST008 measures it (a distributed run measures nothing in-run)",
        ),
        ({}, 4, "no knob applies this change; make it and run diagnose again to measure it"),
    ],
)
def test_the_unsure_line_names_what_would_measure_the_finding(
    knobs: dict[str, str], world_size: int | None, tail: str
) -> None:
    rule = "DIST008" if world_size and world_size > 1 else "DATA001"
    assert unsure_words(WHY, rule, knobs, world_size) == f"unsure ({WHY[0]}): {tail}"


def _report(name: str) -> Report:
    return Report.from_dict(json.loads((REPO / "tests" / "golden" / f"{name}.json").read_text()))


def test_a_distributed_report_never_promises_an_in_run_check() -> None:
    """tests/golden/ddp_mlp_nccl: DIST002 (no_sync accumulation: the script's own change, no
    knob) and DATA005 are unsure, on two ranks."""
    report = _report("ddp_mlp_nccl")
    unsure = {f["rule"]: f for f in report.to_dict()["findings"] if f["check"]}
    assert {"DIST002", "DATA005"} <= set(unsure) and unsure["DIST002"]["knobs"] == {}
    for text in (
        " ".join(TerminalRenderer(color=False, width=400).render(report).split()),
        HTMLRenderer().render(report),
    ):
        assert "(--check N)" not in text
        assert "no knob applies this change; make it and run diagnose again to measure it" in text


def test_a_knob_finding_of_one_process_says_the_check_measures_it() -> None:
    data = _report("data_bound").to_dict()
    finding = next(f for f in data["findings"] if f["knobs"])
    finding["check"] = WHY
    report = Report.from_dict(data)
    for text in (
        " ".join(TerminalRenderer(color=False, width=400).render(report).split()),
        HTMLRenderer().render(report),
    ):
        assert f"unsure ({WHY[0]}): diagnose run measures it (--check N)" in text


def test_a_finding_the_check_tried_and_could_not_measure_says_what_stopped_it() -> None:
    """pytorch/examples' word-language transformer on an H200 (the outside corpus): LAUNCH001's
    reduce-overhead compile was unsure (graph breaks), the run's check tried it within its 15 s
    budget and timed out compiling; the report still said "diagnose run measures it"."""
    data = _report("data_bound").to_dict()
    finding = next(f for f in data["findings"] if f["knobs"])
    finding["check"] = WHY
    data["ranking"]["check"] = {
        "budget_s": 14.89,
        "spent_s": 19.03,
        "experiments": [
            {
                "label": finding["rule"],
                "rule": finding["rule"],
                "knobs": finding["knobs"],
                "status": "failed",
                "speedup": None,
                "verdict": "failed",
                "error": "timed out after 19 s (what it measured is in its report)",
            }
        ],
    }
    report = Report.from_dict(data)
    want = (
        f"unsure ({WHY[0]}): diagnose run's check tried it and could not measure it (timed out after 19 s "
        f"(what it measured is in its report)); --check-budget SECONDS gives it longer, "
        f"diagnose verify --rule {finding['rule']} measures it apart"
    )
    terminal = " ".join(TerminalRenderer(color=False, width=400).render(report).split())
    page = HTMLRenderer().render(report)
    assert want in terminal and html.escape(want) in page
    assert "(--check N)" not in terminal + page
