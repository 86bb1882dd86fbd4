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


def test_a_sweep_of_accumulation_without_samples_is_compared_by_steps_times_their_work() -> None:
    """A script without a DataLoader has no samples/s; the sweep leaves points of unlike work
    uncompared, and the case, which knows each point's micro-batches (``work_knob``), compares
    optimizer steps/s times them (the 4-GPU run of 2026-11-28: 154.7 and 44.7 steps/s)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import dist_truth

    case = next(c for c in dist_truth.CASES if c.name == "ddp-comm-bound")
    rows = [
        {
            "label": f"arg.accumulate={n}",
            "knobs": {"arg.accumulate": str(n)},
            "status": "ok",
            "run_dir": None,
            "steps_per_s": rate,
            "samples_per_s": None,
        }
        for n, rate in ((1, 154.726), (4, 44.674))
    ]
    row: dict[str, object] = {}
    dist_truth.summarize(case, {"experiments": {"compared_by": "samples_per_s", "rows": rows}}, row)
    assert row["measured"] == pytest.approx(4 * 44.674 / 154.726, abs=1e-4)
    assert row["fix"] == "arg.accumulate=4"
