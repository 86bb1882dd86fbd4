"""report.json against the JSON Schema CI users validate with (diagnose/schema/report.schema.json):
the schema is the one generated from the report's types (diagnose/report.py), every fixture
(schema 1 files as read, upgraded) and every fresh analysis of one validates, and the schema is
strict enough to refuse a broken report. The conftest also validates every report.json a test
leaves in its temp folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose.analysis.pipeline import AnalysisOptions, analyze_trace
from diagnose.report import Report, schema_text
from diagnose.rundir import RunDir
from diagnose.session import analyze_run
from tests.conftest import DATA, report_errors

FIXTURE_DIRS = sorted(
    p for p in DATA.iterdir() if (p.is_dir() and (p / "run.json").is_file()) or any(p.glob("rank*.run.json"))
)
BARE = sorted((DATA / "bare").glob("*.pt.trace.json.gz"))


def test_the_schema_is_a_valid_draft_2020_12_schema_and_ships_in_the_package() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from importlib.resources import files

    schema = json.loads((files("diagnose") / "schema" / "report.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["schema"]["const"] == "diagnose.report/2"


def test_the_committed_schema_is_the_one_generated_from_the_types() -> None:
    """A change to a report type shows in the schema file; regenerate it with
    ``python -m diagnose.report > diagnose/schema/report.schema.json``."""
    from importlib.resources import files

    from diagnose.report import schema_text

    committed = (files("diagnose") / "schema" / "report.schema.json").read_text()
    assert committed == schema_text(), "stale: python -m diagnose.report > diagnose/schema/report.schema.json"


def test_the_schema_keeps_the_descriptions_users_read() -> None:
    schema = json.loads(schema_text())
    finding = schema["$defs"]["Finding"]["properties"]
    assert "90% interval" in finding["predicted_interval"]["description"]
    assert schema["properties"]["whole"]["description"].startswith("diagnose watch")
    assert schema["required"][:3] == ["schema", "diagnose_version", "source"]
    assert schema["$defs"]["Finding"]["required"] == ["rule", "title", "category", "kind", "says", "do", "evidence"]


@pytest.mark.parametrize("path", sorted(DATA.glob("*/report.json")), ids=lambda p: p.parent.name)
def test_every_saved_fixture_report_validates(path: Path) -> None:
    assert report_errors(json.loads(Report.load(path).to_json())) == []


@pytest.mark.parametrize("folder", FIXTURE_DIRS, ids=lambda p: p.name)
def test_every_fresh_analysis_of_a_fixture_validates(folder: Path) -> None:
    report = analyze_run(RunDir(folder), AnalysisOptions.load(show_all=True))
    assert report_errors(json.loads(report.to_json())) == []


@pytest.mark.parametrize("trace", BARE, ids=lambda p: p.name.split(".")[0])
def test_every_bare_trace_report_validates(trace: Path) -> None:
    assert report_errors(json.loads(analyze_trace(trace, AnalysisOptions.load()).to_json())) == []


def test_a_broken_report_is_refused() -> None:
    good = json.loads(Report.load(DATA / "data_bound" / "report.json").to_json())
    cases = {
        "schema": lambda r: r.update(schema="diagnose.report/1"),
        "state": lambda r: r["status"].update(state="fine"),
        "duration": lambda r: r["breakdown"]["steps"][0].update(duration_ms="long"),
        "evidence": lambda r: r["findings"][0].update(evidence=[{"symptom": "x"}]),
        "missing": lambda r: r.pop("symptoms"),
    }
    for name, breaks in cases.items():
        broken = json.loads(json.dumps(good))
        breaks(broken)
        assert report_errors(broken), name
