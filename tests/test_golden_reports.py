"""Every recorded run's report.json, byte for byte as it was (issue 35, item 7).

The analysis is rebuilt without changing what it says: each recorded run under tests/data is
analysed and its report.json compared, key by key, with the one committed in tests/golden/.
Only the fields that name the moment or the place of the analysis are left out.

A change that is meant to change a report regenerates the files and shows them in its diff:

    DIAGNOSE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden_reports.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from diagnose.analysis.pipeline import AnalysisOptions
from diagnose.rundir import RunDir
from diagnose.session import analyze_run
from tests.conftest import DATA

GOLDEN = Path(__file__).parent / "golden"
VOLATILE = ("created_at", "source")  # when and from which folder: not what the analysis found


def _recorded_runs() -> list[Path]:
    records = {p.parent.parent if p.parent.name == "diagnose" else p.parent for p in DATA.rglob("*run.json")}
    return sorted(r for r in records if r != DATA)


RUNS = _recorded_runs()


def _comparable(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k not in VOLATILE}


@pytest.fixture(scope="module")
def options() -> AnalysisOptions:
    return AnalysisOptions.load()


def test_every_recorded_run_has_a_golden_report() -> None:
    assert len(RUNS) >= 20, RUNS
    names = {_golden_name(r) for r in RUNS}
    stale = sorted(p.name for p in GOLDEN.glob("*.json") if p.name not in names)
    assert not stale, f"golden reports of runs no longer recorded: {stale}"


def _golden_name(run: Path) -> str:
    return "__".join(run.relative_to(DATA).parts) + ".json"


@pytest.mark.parametrize("run", RUNS, ids=lambda r: "/".join(r.relative_to(DATA).parts))
def test_the_report_is_unchanged(run: Path, options: AnalysisOptions) -> None:
    got = _comparable(json.loads(analyze_run(RunDir(run), options).to_json()))
    path = GOLDEN / _golden_name(run)
    if os.environ.get("DIAGNOSE_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    for key in want:
        assert got[key] == want[key], key
