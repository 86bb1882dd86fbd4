"""The Python API as a notebook uses it: profile a block or a function in-process, analyse a
path, compare reports, and show a report as HTML. The notebook is a subprocess (a fresh kernel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.rundir import RunDir
from tests.conftest import DATA, REPO

TRAIN = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

def train(epochs=50):
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(256, 16), torch.randn(256, 1)), batch_size=16)
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(epochs):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
"""

NOTEBOOK = (
    TRAIN
    + """
import sys, json
import diagnose
after_block = []
with diagnose.profile(warmup=1, steps=3, timed_steps=4, out=OUT + "/block") as run:
    train()
after_block.append("ran")  # the block was stopped once measured; the cell goes on
report = run.report
page = report._repr_html_()
try:
    from IPython.display import HTML, display  # as a notebook shows it
    display(HTML(page))
except ImportError:
    pass
fn_run = diagnose.profile(train, warmup=1, steps=2, timed_steps=3, out=OUT + "/fn")
again = diagnose.analyze(OUT + "/block")
comparison = diagnose.compare(run.report, ("fn", fn_run.report), labels=["block", "fn"])
print(json.dumps({
    "after_block": after_block,
    "state": report.status["state"],
    "steps": len(report.breakdown["steps"]),
    "target": report.run["target"]["kind"],
    "iframe": page.startswith("<iframe srcdoc="),
    "fn_state": fn_run.report.status["state"],
    "fn_steps": len(fn_run.report.breakdown["steps"]),
    "again": again.verdict == report.verdict,
    "labels": list(comparison.labels),
    "shift": comparison.runs[1].shift,
    "comparison_html": "steps-chart" in comparison._repr_html_(),
    "argv": sys.argv,
}))
"""
)


def _kernel(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", f"OUT = {str(tmp_path)!r}\n" + code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_importing_diagnose_loads_neither_torch_nor_the_analysis(tmp_path: Path) -> None:
    proc = _kernel(
        "import sys, diagnose\nprint(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'rich', 'typer', 'diagnose')))",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    # version.py: __version__, nothing else; jupyter.py: the notebook display registry, which imports nothing
    assert proc.stdout.strip() == "['diagnose', 'diagnose.api', 'diagnose.jupyter', 'diagnose.version']"


@pytest.mark.slow
def test_a_notebook_profiles_a_block_and_a_function_and_shows_the_report(tmp_path: Path) -> None:
    proc = _kernel(NOTEBOOK, tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["after_block"] == ["ran"] and out["state"] == "stopped" and out["steps"] == 3
    assert out["target"] == "block" and out["iframe"]
    assert out["fn_state"] == "stopped" and out["fn_steps"] == 2
    assert out["again"] and out["labels"] == ["block", "fn"] and out["shift"]
    assert out["comparison_html"]
    assert out["argv"] == ["-c"]  # a block leaves the kernel's argv alone
    for name in ("block", "fn"):
        run = RunDir(tmp_path / name)
        assert run.report_path.is_file() and run.record_path().is_file()


@pytest.mark.slow
def test_a_block_that_raises_is_recorded_and_the_error_reaches_the_caller(tmp_path: Path) -> None:
    import diagnose

    exec(compile(TRAIN, "train", "exec"), scope := {})
    holder = {}
    with (
        pytest.raises(RuntimeError, match="boom"),
        diagnose.profile(warmup=1, steps=2, timed_steps=2, stop=False, out=tmp_path / "failed") as run,
    ):
        holder["run"] = run
        scope["train"](epochs=1)  # 16 steps: the window closes, then the block fails
        raise RuntimeError("boom")
    report = holder["run"].report
    assert report.status["state"] == "failed" and report.status["error"]["message"] == "boom"
    assert report.breakdown is not None  # what was measured before the failure is analysed


def test_analyze_reads_a_saved_report_and_a_bare_trace() -> None:
    import diagnose

    saved = diagnose.analyze(DATA / "data_bound")
    assert saved.schema == "diagnose.report/2" and saved.findings[0]["rule"] == "DATA001"
    assert diagnose.analyze(DATA / "data_bound" / "report.json").verdict == saved.verdict
    bare = diagnose.analyze(DATA / "bare" / "data_bound.pt.trace.json.gz")
    assert bare.status["state"] == "trace" and bare.findings[0]["rule"] == "DATA001"
    assert "steps-chart" in bare._repr_html_()
