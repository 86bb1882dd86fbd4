"""The run directory: where a run's outputs go, and the only place diagnose writes.

Layout (``tensorboard --logdir runs`` finds every run)::

    runs/<script>-<YYYYmmdd-HHMMSS>/
        <host>_<pid>.<ms>.pt.trace.json.gz   the torch.profiler trace (one per rank)
        run.json                               what the runner saw
        report.json                            the analysis (schema diagnose.report/1)
        report.html                            with --html
        events.out.tfevents.*                  TensorBoard scalars and text
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

from diagnose.errors import OutputError


def default_run_dir(name: str, root: Path = Path("runs")) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = root / f"{name}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():  # two runs in the same second
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def prepare_run_dir(path: Path, explicit: bool, overwrite: bool = False) -> Path:
    """Create the run directory before the script starts, so that a bad path fails fast."""
    path = path.expanduser().absolute()
    if path.exists():
        if not path.is_dir():
            raise OutputError(f"the output path {path} exists and is not a folder")
        if any(path.iterdir()) and not overwrite:
            raise OutputError(
                f"the run directory {path} already exists and is not empty",
                hint="choose another --out, leave --out away for a fresh runs/<script>-<time>/, or pass --overwrite",
            )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the run directory {path}: {exc.strerror}", hint="choose a writable --out") from exc
    if not os.access(path, os.W_OK):
        raise OutputError(f"the run directory {path} is not writable", hint="choose a writable --out")
    probe = path / f".diagnose-write-test-{os.getpid()}"  # per process: ranks share the folder
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"cannot write into {path}: {exc.strerror}", hint="choose a writable --out") from exc
    return path
