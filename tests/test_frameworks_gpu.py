"""The framework examples as an H100 ran them (benchmarks/frameworks_gpu.sh, 2026-11-23; traces
trimmed to 3 steps): the phases follow what each framework really does, the top finding is the
planted one, written in the framework's own terms, and a compiled model is never told to compile."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from diagnose.analysis.pipeline import AnalysisOptions
from diagnose.rundir import RunDir
from diagnose.session import analyze_run

DATA = Path(__file__).parent / "data" / "frameworks_gpu"


@dataclass(frozen=True)
class Case:
    name: str
    top: str
    framework: str | None
    change: str  # a fragment of the finding's `do`, in the framework's terms


CASES = [
    Case("lightning", "PREC001", "lightning", 'precision="bf16-mixed"'),
    Case("hf", "DATA001", "hf_trainer", "TrainingArguments(..., dataloader_num_workers="),
    Case("accelerate", "PREC001", "accelerate", 'Accelerator(mixed_precision="bf16")'),
    Case("closure", "PREC001", None, "torch.autocast"),
    Case("compiled", "LAUNCH002", None, 'mode="reduce-overhead"'),
]


@pytest.fixture(scope="module")
def reports() -> dict:
    options = AnalysisOptions.load()
    return {case.name: analyze_run(RunDir(DATA / case.name), options) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_planted_finding_in_the_frameworks_terms(case: Case, reports: dict) -> None:
    report = reports[case.name]
    top = report.findings[0]
    assert top["rule"] == case.top
    assert top.get("framework") == case.framework
    assert case.change in top["do"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_and_backward_are_found_inside_the_framework(case: Case, reports: dict) -> None:
    share = {k: reports[case.name].symptoms[f"phase.{k}"]["value"] for k in ("forward", "backward", "optimizer")}
    # the optimizer phase holds the optimizer's own work, not the closure's forward and backward
    assert share["forward"] > 0.05 and share["backward"] > 0.1
    assert share["optimizer"] < share["backward"]


def test_a_compiled_model_is_not_told_to_compile(reports: dict) -> None:
    rules = {f["rule"] for f in reports["compiled"].findings}
    assert not rules & {"LAUNCH001", "NEXT001", "EXPO004"}
    assert all("torch.compile(model)" not in f["do"] for f in reports["compiled"].findings)
