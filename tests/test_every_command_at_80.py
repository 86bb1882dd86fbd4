"""Every command at COLUMNS=80 (issue 37): no line of its output is longer, and none is cut
mid-word or mid-number. A cut leaves a piece that the same output at full width does not have
(``num_wo``, ``(389.9-2``, ``samples/s…``): every word and number of the narrow output must be
one of the wide output's. Dropped columns are fine (they are said); cut ones are not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.scripts import MLP_TRAIN

DATA = REPO / "tests" / "data"
TRACE = DATA / "bare" / "data_bound.pt.trace.json.gz"
FAST = ["--warmup", "2", "--steps", "2", "--timed-steps", "3", "--no-color"]
WORD = re.compile(r"[^\s│┃|,;:()\[\]]+")
NOTE = re.compile(r"\(not shown at \d+ columns: .*?shows\s+them\)", re.DOTALL)
COMMANDS = ("run", "analyze", "report", "compare", "verify", "sweep", "trim", "knobs", "rules")


def diagnose(*args: str, cwd: Path, columns: int, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(PYTHONPATH=str(REPO), COLUMNS=str(columns))
    return subprocess.run(
        [sys.executable, "-m", "diagnose", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def words(text: str) -> set[str]:
    return set(WORD.findall(text))


def assert_uncut(narrow: str, wide: str, what: str) -> None:
    assert narrow.strip(), what
    for line in narrow.splitlines():
        # a finding's code is kept whole, to be copied (the terminal soft-wraps it)
        assert len(line) <= 80 or line.startswith("    | "), f"{what}: {line!r}"
    cut = words(narrow) - words("\n".join(NOTE.findall(narrow))) - words(wide)
    assert not cut, f"{what}: pieces not in the full-width output: {sorted(cut)}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("at80")
    (folder / "train.py").write_text(MLP_TRAIN.lstrip())
    return folder


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_at_80(command: str, folder: Path) -> None:
    args = [command, "--help"] if command else ["--help"]
    narrow = diagnose(*args, cwd=folder, columns=80)
    wide = diagnose(*args, cwd=folder, columns=1000)
    assert narrow.returncode == 0, narrow.stderr
    assert_uncut(narrow.stdout, wide.stdout, f"diagnose {command} --help")


@pytest.mark.slow
def test_every_command_at_80(folder: Path) -> None:
    outputs: dict[str, tuple[subprocess.CompletedProcess[str], list[str]]] = {}
    # the commands that run the script: their full-width rendering is `report` of what they saved
    outputs["run"] = (
        diagnose("run", *FAST, "--out", "r1", "train.py", "--", "--batch-size", "8", cwd=folder, columns=80),
        ["report", "r1", "--no-color"],
    )
    diagnose("run", *FAST, "--out", "r2", "train.py", "--", "--batch-size", "16", cwd=folder, columns=80)
    outputs["verify"] = (
        diagnose("verify", *FAST, "--top", "1", "--repeats", "1", "--out", "v", "train.py", cwd=folder, columns=80),
        ["report", "v", "--no-color"],
    )
    outputs["sweep"] = (
        diagnose("sweep", *FAST, "--set", "arg.batch_size=8,16", "--out", "s", "train.py", cwd=folder, columns=80),
        ["report", "s", "--no-color"],
    )
    # the others: the same command at full width
    for name, args in {
        "analyze": ["analyze", str(TRACE), "--all", "--per-step", "--no-color"],
        "report": ["report", "r1", "--per-step", "--no-color"],
        "compare": ["compare", "r1", "r2", "--no-color"],
        "compare a sweep": ["compare", "s", "--no-color"],
        "knobs": ["knobs"],
        "rules": ["rules"],
        "rules --symptoms": ["rules", "--symptoms"],
    }.items():
        outputs[name] = (diagnose(*args, cwd=folder, columns=80), args)
    for name, (narrow, wide_args) in outputs.items():
        assert narrow.returncode == 0, (name, narrow.stderr)
        wide = diagnose(*wide_args, cwd=folder, columns=1000)
        assert wide.returncode == 0, (name, wide.stderr)
        assert_uncut(narrow.stdout, wide.stdout, name)
    trim = diagnose("trim", str(TRACE), "t.json", cwd=folder, columns=80)  # a line on stderr, no table
    assert trim.returncode == 0 and max(map(len, trim.stderr.splitlines())) <= 80
