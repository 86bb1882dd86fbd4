"""The report as typed values (diagnose/report.py): report.json's every key is a field, so a
report read back writes the same JSON; the dictionaries of earlier versions still read and
write; the types import no renderer, and a notebook still shows a report as its page."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.report import Finding, Report, Status, Symptom, Timing
from tests.conftest import DATA

GOLDEN = sorted((Path(__file__).parent / "golden").glob("*.json"))


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_a_report_read_back_writes_the_same_json(path: Path) -> None:
    data = json.loads(path.read_text())
    assert Report.from_dict(data).to_dict() == {"created_at": "", "source": {"kind": "run"}, **data}


def test_sections_are_typed_and_read_as_the_old_dictionaries_too() -> None:
    report = Report.load(DATA / "data_bound" / "report.json")
    finding = report.findings[0]
    assert isinstance(finding, Finding) and isinstance(report.status, Status)
    assert finding["rule"] == finding.rule == "DATA001" and finding.get("framework") is None
    assert "evidence" in finding and "no_such_key" not in finding and finding.get("no_such_key", 1) == 1
    with pytest.raises(KeyError):
        finding["no_such_key"]
    assert isinstance(report.symptoms["exposed.data_wait"], Symptom)
    assert report.symptoms["exposed.data_wait"]["value"] == report.symptom_value("exposed.data_wait")
    finding["title"] = "renamed"  # code that edited the dictionaries edits the fields
    assert finding.title == "renamed" and report.to_dict()["findings"][0]["title"] == "renamed"
    with pytest.raises(KeyError):
        finding["no_such_key"] = 1


def test_a_report_built_from_dictionaries_holds_its_types() -> None:
    report = Report(
        status={"state": "failed", "message": "boom"},
        findings=[{"rule": "X001", "evidence": ["a"]}],
        throughput={"profiled": {"steps": 2, "mean_step_ms": 3.0}},
        run={},
    )
    assert report.status.state == "failed" and report.findings[0].rule == "X001"
    assert report.throughput.profiled == Timing(steps=2, mean_step_ms=3.0) and report.run is None
    assert report.to_dict()["run"] == {}  # a bare trace's run is an empty object, as before


def test_a_value_of_the_wrong_kind_is_refused_naming_where() -> None:
    data = json.loads((DATA / "data_bound" / "report.json").read_text())
    data["findings"] = [{"rule": 5}]
    with pytest.raises(ValueError, match=r"findings\[0\]\.rule"):
        Report.from_dict(data)
    with pytest.raises(ValueError):
        Report.from_dict([])  # type: ignore[arg-type]


def test_the_types_import_no_renderer_and_a_notebook_still_shows_the_page() -> None:
    code = (
        "import sys\n"
        "from diagnose.report import Report\n"
        "assert not [m for m in sys.modules if m.startswith(('diagnose.renderers', 'diagnose.analysis'))], sorted(sys.modules)\n"
        "page = Report(verdict='fine')._repr_html_()\n"
        "assert page.startswith('<iframe srcdoc=') and 'fine' in page, page[:200]\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_a_section_set_as_a_dictionary_becomes_its_type() -> None:
    report = Report.load(DATA / "data_bound" / "report.json")
    assert report.run is not None and report.run.target is not None
    report.run["target"] = {**report.run["target"].to_dict(), "value": "/w/other.py"}
    assert report.run.target.value == "/w/other.py"
    report.findings[0]["measured"] = {"speedup": 1.5, "spread": 0.02, "verdict": "helped"}
    assert report.findings[0].measured is not None and report.findings[0].measured.speedup == 1.5
