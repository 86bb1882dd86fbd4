"""A third pass as a new user (issue 37): each fault found, as a user meets it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def diagnose(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None, python_flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, *python_flags, "-m", "diagnose", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, check=False)


# --- 1: -m looks the module up with the current folder on sys.path, as python -m does ----------


def test_module_is_looked_up_from_the_current_folder(tmp_path: Path, monkeypatch) -> None:
    from diagnose.runtime.runner import resolve_target

    (tmp_path / "mypkg37").mkdir()
    (tmp_path / "mypkg37" / "__init__.py").write_text("")
    (tmp_path / "mypkg37" / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    # the console script's sys.path: its own folder first, never the current one
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    before = list(sys.path)
    target = resolve_target(None, "mypkg37.train", [])
    assert (target.kind, target.value) == ("module", "mypkg37.train")
    assert sys.path == before
    sys.modules.pop("mypkg37", None)
