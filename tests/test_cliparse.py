"""diagnose's options before or after the script, everything after -- the script's; -h
everywhere; help that shows the forms that work and no Python types."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from diagnose.cli import app
from diagnose.cliparse import OptionTable, split_command_line

COMMAND = typer.main.get_command(app)
RUN = COMMAND.commands["run"]  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Case:
    words: list[str]
    own: list[str]
    target: list[str]


TABLE = OptionTable(with_value=frozenset({"--set", "--out", "-o", "-m"}), flags=frozenset({"--html", "-h"}))
CASES = [
    Case(["--html", "t.py", "--", "--lr", "1"], ["--html"], ["t.py", "--lr", "1"]),
    Case(["t.py", "--html", "--", "--lr", "1"], ["--html"], ["t.py", "--lr", "1"]),  # the form
    Case(["t.py", "--set", "num_workers=0,2", "--", "--bs", "4"], ["--set", "num_workers=0,2"], ["t.py", "--bs", "4"]),
    Case(
        ["t.py", "--bs", "4", "--out=r"], ["--out=r"], ["t.py", "--bs", "4"]
    ),  # unknown after the script: the script's
    Case(["t.py", "-ox"], ["-ox"], ["t.py"]),
    Case(["t.py", "--", "--html"], [], ["t.py", "--html"]),  # after --: the script's, even a name we know
    Case(["-m", "pkg.train", "--", "-h"], ["-m", "pkg.train"], ["-h"]),
    Case(["t.py", "-h"], ["-h"], ["t.py"]),
]


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c.words) for c in CASES])
def test_words_are_sorted_into_diagnoses_and_the_scripts(case: Case) -> None:
    line = split_command_line(case.words, TABLE)
    assert (line.own, line.target, line.unknown_before_script) == (case.own, case.target, None)


def test_an_unknown_option_before_the_script_is_named() -> None:
    assert split_command_line(["--htm", "t.py"], TABLE).unknown_before_script == "--htm"


def parsed(command: str, *words: str) -> dict:
    cmd = COMMAND.commands[command]  # type: ignore[attr-defined]
    return cmd.make_context(command, list(words), parent=typer.Context(COMMAND, info_name="diagnose")).params


def test_run_takes_its_options_after_the_script() -> None:
    params = parsed("run", "train.py", "--html", "--out", "r", "--", "--html", "--lr", "1")
    assert params["script"] == "train.py" and params["html"] is True and str(params["out"]) == "r"
    assert params["args"] == ["--html", "--lr", "1"]


def test_sweep_takes_set_after_the_script_as_the_readme_writes_it() -> None:
    params = parsed("sweep", "train.py", "--set", "num_workers=0,2,4,8", "--", "--batch-size", "64")
    assert params["knob"] == ["num_workers=0,2,4,8"] and params["args"] == ["--batch-size", "64"]
    params = parsed("verify", "train.py", "--top", "1", "--", "--top", "9")
    assert params["top"] == 1 and params["args"] == ["--top", "9"]


def test_run_with_a_module_keeps_the_modules_words() -> None:
    params = parsed("run", "-m", "pkg.train", "--", "--lr", "1")
    assert params["module"] == "pkg.train" and [params["script"], *params["args"]] == ["--lr", "1"]


def test_an_unknown_option_before_the_script_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", "--htm", "train.py"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "no option --htm" in lines[0] and "after --" in lines[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "words", [["-h"], ["run", "-h"], ["run", "train.py", "-h"], ["sweep", "-h"], ["analyze", "-h"]]
)
def test_dash_h_is_help_and_creates_nothing(words: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, words)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage:") and list(tmp_path.iterdir()) == []


def test_help_shows_the_form_that_works_and_no_python_types() -> None:
    runner = CliRunner()
    for name in COMMAND.commands:  # type: ignore[attr-defined]
        text = runner.invoke(app, [name, "--help"], terminal_width=200).output
        assert not re.search(r"<(str|int|float|path|bool|list\[.*?\]|\w+ range)>", text), (name, text)
    usage = runner.invoke(app, ["sweep", "--help"]).output.splitlines()[0]
    assert usage.endswith("sweep [OPTIONS] SCRIPT [OPTIONS] [-- SCRIPT_ARGS...]")


def test_rules_and_knobs_print_json() -> None:
    import json

    runner = CliRunner()
    rules = json.loads(runner.invoke(app, ["rules", "--json"]).output)
    assert {"DATA001", "SYNC001"} <= {r["id"] for r in rules}
    data001 = next(r for r in rules if r["id"] == "DATA001")
    assert data001["kind"] == "problem" and "data.wait >= 0.10" in data001["when"]["all"]
    assert "num_workers" in data001["do"] and data001["says"] and data001["why"]
    # the words other kinds of run get: MEM001's for a script no DataLoader feeds
    mem001 = next(r for r in rules if r["id"] == "MEM001")
    case = next(w for w in mem001["words"] if w["name"] == "no DataLoader")
    assert case["when"] == ["dataloader.present == 0"] and case["texts"]
    assert next(r for r in rules if r["id"] == "DATA002")["already"]["when"]
    symptoms = json.loads(runner.invoke(app, ["rules", "--symptoms", "--json"]).output)
    assert {"name": "cpu.count", "unit": "count", "description": "CPUs this process may use"} in symptoms
    knobs = json.loads(runner.invoke(app, ["knobs", "--json"]).output)
    assert {"name": "num_workers", "kind": "int", "help": "DataLoader num_workers"} in knobs


def test_the_tensorboard_hint_only_where_tensorboard_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from diagnose.display import tensorboard_hint

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "events.out.tfevents.1.diagnose").write_bytes(b"")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert tensorboard_hint(tmp_path / "run") == ""
    monkeypatch.undo()
    if importlib.util.find_spec("tensorboard") is not None:
        assert tensorboard_hint(tmp_path / "run") == f"  (tensorboard --logdir {tmp_path})"
