"""What the benchmark scripts share: the repository, the planted examples' timer line, and
running a command the way a user would (the repository importable, output unbuffered)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: what examples/_common.PlainTimer prints for each window it times
PLAIN_RE = re.compile(r"plain timer: steps (\d+)-(\d+): ([\d.]+) steps/s")


def run_in_repo(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` from the repository root, its output captured; raises TimeoutExpired."""
    full = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    full.update(env or {})
    return subprocess.run(cmd, cwd=REPO, env=full, capture_output=True, text=True, timeout=timeout, check=False)
