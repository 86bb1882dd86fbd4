"""The commands as a user types them: run, analyze (a run directory, a bare trace), report,
rules, knobs, --json, python -m diagnose."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.analysis.measure.categories import EXPOSED
from tests.conftest import REPO
from tests.scripts import MLP_TRAIN
from tests.tracebuilder import one_gpu_step

FAST = ["--warmup", "2", "--steps", "4", "--max-steps", "4", "--timed-steps", "5"]


def diagnose(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "diagnose", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One real `diagnose run` on a tiny script written into a temp folder, shared by the tests."""
    folder = tmp_path_factory.mktemp("cli")
    (folder / "train.py").write_text(MLP_TRAIN.lstrip())
    # diagnose's options on both sides of the script (issue 18: --html after it went to the script)
    proc = diagnose(
        "run", *FAST, "train.py", "--no-color", "--html", "--out", "runs/first", "--", "--batch-size", "32", cwd=folder
    )
    return folder, proc


@pytest.mark.slow
def test_run_writes_the_run_directory_and_prints_the_report(finished_run) -> None:
    folder, proc = finished_run
    assert proc.returncode == 0, proc.stderr
    run_dir = folder / "runs" / "first"
    names = sorted(p.name for p in run_dir.iterdir())
    assert sorted(p.name for p in (run_dir / "diagnose").iterdir()) == ["report.json", "run.json"]
    assert [n for n in names if n.endswith((".json", ".gz"))] == [n for n in names if n.endswith(".pt.trace.json.gz")]
    (trace,) = [n for n in names if n.endswith(".pt.trace.json.gz")]
    assert re.fullmatch(r".+_\d+\.\d+\.pt\.trace\.json\.gz", trace)
    assert any(n.startswith("events.out.tfevents.") for n in names)
    assert "report.html" in names
    out = proc.stdout
    for text in (
        "Where a step goes",
        "Steady state (profiler off, 5 steps)",
        "host thread phases",
        "CPU only, no GPU used",
    ):
        assert text in out, text
    assert "samples/s" in out and "batch: 32 samples per step" in out
    report = json.loads((run_dir / "diagnose" / "report.json").read_text())
    assert report["schema"] == "diagnose.report/2"
    assert report["status"]["state"] == "stopped"
    assert report["throughput"]["steady"]["steps"] == 5
    assert report["throughput"]["profiled"]["steps"] == 4
    assert report["environment"]["torch"] and report["environment"]["python"] and report["environment"]["cpu_count"]
    assert report["dataloader"]["batch_size"] == 32 and report["dataloader"]["num_workers"] == 0
    shares = [report["symptoms"][f"exposed.{category}"]["value"] for category in EXPOSED]
    assert sum(shares) == pytest.approx(1.0, abs=1e-3)
    assert "diagnose ▸ profiling steps 2-5" in proc.stderr  # the progress line


@pytest.mark.slow
def test_analyze_a_saved_run_again(finished_run) -> None:
    folder, _ = finished_run
    before = json.loads((folder / "runs/first/diagnose/report.json").read_text())
    proc = diagnose("analyze", "--json", "runs/first", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout)
    assert again["breakdown"]["steps"] == before["breakdown"]["steps"]
    assert again["throughput"] == before["throughput"]


@pytest.mark.slow
def test_report_rerenders_without_reanalysis_and_writes_html(finished_run) -> None:
    folder, _ = finished_run
    proc = diagnose("report", "--no-color", "runs/first", cwd=folder)
    assert proc.returncode == 0 and "Where a step goes" in proc.stdout
    proc = diagnose("report", "--html", "runs/first", cwd=folder)
    assert proc.returncode == 0
    html = (folder / "runs/first/report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html


def test_analyze_a_bare_trace_written_by_the_users_own_profiler(tmp_path: Path) -> None:
    one_gpu_step().write(tmp_path / "my_own_trace.pt.trace.json")
    proc = diagnose("analyze", "--json", "my_own_trace.pt.trace.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"]["state"] == "trace"
    assert report["breakdown"]["device"] == "cuda"
    assert report["breakdown"]["steps"][0]["exposed_ms"]["data_wait"] == pytest.approx(0.3)
    assert not (tmp_path / "runs").exists()  # a bare analysis writes nothing
    proc = diagnose("analyze", "--html", "--out", "out", "my_own_trace.pt.trace.json", cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "out/report.html").is_file()


@pytest.mark.slow
def test_json_keeps_stdout_for_the_report(write_script, tmp_path: Path) -> None:
    write_script(
        MLP_TRAIN.replace(
            "for epoch in range(a.epochs):", "print('the script talks on stdout')\nfor epoch in range(a.epochs):"
        )
    )
    proc = diagnose(
        "run", "--warmup", "2", "--steps", "4", "--timed-steps", "5", "--json", "--quiet", "train.py", cwd=tmp_path
    )
    assert proc.returncode == 0
    report = json.loads(proc.stdout)  # nothing but the report
    assert report["status"]["state"] == "stopped"
    assert report["run"]["plan"]["max_steps"] == 12  # without --max-steps the window may grow to 3x --steps
    assert "the script talks on stdout" in proc.stderr


@pytest.mark.slow
def test_run_a_module_with_dash_m(write_script, tmp_path: Path) -> None:
    write_script("", name="pkg/__init__.py")
    write_script(MLP_TRAIN, name="pkg/train.py")
    proc = diagnose("run", *FAST, "--json", "--quiet", "-m", "pkg.train", "--", "--batch-size", "8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["run"]["target"] == {
        "kind": "module",
        "value": "pkg.train",
        "args": ["--batch-size", "8"],
        "cwd": str(tmp_path),
    }
    assert report["throughput"]["batch_size"] == 8


def test_version_rules_knobs_and_python_dash_m(tmp_path: Path) -> None:
    proc = diagnose("--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("diagnose ")
    rules = diagnose("rules", cwd=tmp_path).stdout
    assert "DATA001" in rules and "NEXT001" in rules
    assert "gpu.busy" in diagnose("rules", "--symptoms", cwd=tmp_path).stdout
    assert "num_workers" in diagnose("knobs", cwd=tmp_path).stdout


def test_unknown_knob_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("pass\n")
    proc = diagnose("run", "--set", "warp_speed=9", "train.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown knob 'warp_speed'" in proc.stderr


def test_trim_keeps_the_breakdown_of_the_kept_steps(tmp_path: Path) -> None:
    from diagnose.analysis.measure.breakdown import compute_breakdown
    from diagnose.analysis.trace.timeline import load_timeline
    from tests.tracebuilder import FP32_GEMM, TraceBuilder

    b = TraceBuilder()
    for n in range(4):
        t = n * 1000
        b.step(n, t, 1000)
        b.data_wait(t, 300)
        b.op("aten::linear", t + 350, 10, forward=True)
        b.kernel(FP32_GEMM, t + 600, 700, launch_ts=t + 355)  # runs into the next step
    b.write(tmp_path / "t.json")
    proc = diagnose("trim", "--keep", "2", "--skip", "1", "t.json", "small.json.gz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    full = {s.number: s for s in compute_breakdown(load_timeline(tmp_path / "t.json")).steps}
    small = compute_breakdown(load_timeline(tmp_path / "small.json.gz")).steps
    assert [s.number for s in small] == [1, 2]
    for s in small:
        assert s.exposed == full[s.number].exposed and s.phases == full[s.number].phases


def test_readme_starts_with_the_two_commands_and_ci_runs_both_in_fresh_venvs() -> None:
    readme = (REPO / "README.md").read_text().splitlines()
    assert readme[2] == "```bash"
    assert readme[3].startswith("pip install torch==2.13.0") and "diagnose run" in readme[3]
    assert readme[4].split("&&")[-1].strip() == "python -m pytest -q"
    ci = (REPO / ".ci" / "run").read_text()
    # .ci/run takes both lines from the README itself and runs each in a fresh venv
    assert "awk '/^```bash$/" in ci and "python3 -m venv" in ci
    assert (
        'run_in_fresh_venv first "${README_COMMANDS[0]' in ci and 'run_in_fresh_venv test "${README_COMMANDS[1]}"' in ci
    )


def test_the_readmes_first_install_brings_what_the_workload_imports() -> None:
    """Issue 18: `pip install -e .` left numpy and Pillow out; the workload imports both at the top."""
    import ast

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    first = (REPO / "README.md").read_text().splitlines()[3]
    install = re.search(r'pip install -e "?\.(\[([a-z,]+)\])?"?', first)
    assert install, first
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in (install.group(2) or "").split(","):
        requirements += project["optional-dependencies"].get(extra, []) if extra else []
    installed = {re.split(r"[<>=;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}
    distribution = {"PIL": "pillow", "numpy": "numpy", "torch": "torch"}
    for path in (REPO / "workloads").glob("*.py"):
        for node in ast.parse(path.read_text()).body:  # top-level imports only (transformers is lazy)
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                top = name.split(".")[0]
                if top in distribution:
                    assert distribution[top] in installed, f"{path.name} imports {top}; {first!r} does not install it"


def test_a_module_called_in_a_dataloader_worker_is_no_step_of_the_training_loop(tmp_path: Path) -> None:
    """torchvision's transforms are nn.Modules; a Dataset calls them in its workers, forked before
    the first optimizer step, with diagnose's forward hook inherited. There the transform was
    taken for the model, its calls for steps, and the worker raised diagnose's stop: the script
    died (found on pytorch/examples' super_resolution and timm's train.py, docs/zoo.md)."""
    (tmp_path / "train.py").write_text(
        """
import torch
from torch.utils.data import DataLoader, Dataset

class Scaled(Dataset):
    def __init__(self):
        self.transform = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Flatten(0))
    def __len__(self):
        return 512
    def __getitem__(self, i):
        return self.transform(torch.randn(2, 4)), torch.randn(1)

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(3):
    for x, y in DataLoader(Scaled(), batch_size=8, num_workers=1):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
"""
    )
    proc = diagnose("run", *FAST, "--json", "--out", "runs/w", "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["run"]["profiled_steps"] == 4 and report["run"]["step_mode"] == "optimizer"
