"""benchmarks/dist_truth.py, the GPU check of the distributed rules, in its CPU smoke mode: it
writes its tables as it goes, goes on where an earlier call stopped, and keeps to its budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = str(REPO / "benchmarks" / "dist_truth.py")


def _truth(out: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, SCRIPT, "--out", str(out), "--cpu-smoke", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_no_case_starts_without_the_time_it_needs(tmp_path: Path) -> None:
    proc = _truth(tmp_path / "t", "--budget-s", "5", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "not started, " in proc.stdout and "of the budget left" in proc.stdout
    assert json.loads((tmp_path / "t" / "results.json").read_text())["rows"] == []


def test_an_unknown_case_is_refused(tmp_path: Path) -> None:
    proc = _truth(tmp_path / "t", "--only", "nonsense", timeout=60)
    assert proc.returncode != 0 and "unknown case" in proc.stderr


@pytest.mark.slow
def test_a_case_is_run_tabulated_and_not_run_again(tmp_path: Path) -> None:
    out = tmp_path / "t"
    proc = _truth(out, "--only", "fsdp2-fixed", "--budget-s", "380")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["case"] for r in rows] == ["fsdp2-fixed"] and rows[0]["status"] == "done", rows
    assert rows[0]["planted"]["world_size"] == 2 and "all_gather" in rows[0]["planted"]["collectives_worst_rank"]
    assert "| fsdp2-fixed |" in (out / "results.md").read_text()
    again = _truth(out, "--only", "fsdp2-fixed", timeout=60)
    assert "already in results.json, skipped" in again.stdout
