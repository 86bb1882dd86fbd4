"""The promise that the analysis never imports torch, kept on disk: the analysis side, the
renderers and the run-directory types import in a process where torch cannot be imported."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import diagnose.analysis
import diagnose.renderers

TORCH_FREE_PACKAGES = ("diagnose.analysis", "diagnose.renderers")
TORCH_FREE_MODULES = ("diagnose.units", "diagnose.record", "diagnose.rundir", "diagnose.errors", "diagnose.session", "diagnose.distributed")


def _modules() -> list[str]:
    names = list(TORCH_FREE_MODULES)
    for package in (diagnose.analysis, diagnose.renderers):
        # the prefix makes walk_packages import subpackages by their full name (renderers.html,
        # not the standard library's html)
        names += [m.name for m in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.")]
    return names


def test_analysis_side_imports_without_torch() -> None:
    modules = _modules()
    assert any(m.endswith(".timeline") for m in modules) and any(m.endswith(".terminal") for m in modules)
    code = (
        "import sys, importlib\n"
        "sys.modules['torch'] = None  # any 'import torch' now raises ImportError\n"
        f"for name in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as exc:\n"
        "        if 'tensorboard' in str(exc):\n"
        "            continue  # optional renderer dependency, not torch\n"
        "        raise SystemExit(f'{name}: {exc}')\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "ok"


def test_runtime_side_is_the_only_torch_importer() -> None:
    """No module outside diagnose/runtime/ names torch at import time."""
    import pathlib

    root = pathlib.Path(diagnose.analysis.__file__).parent.parent
    offenders = []
    for path in root.rglob("*.py"):
        if "runtime" in path.relative_to(root).parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith(("import torch", "from torch")):
                offenders.append(f"{path.relative_to(root)}:{number}")
    assert offenders == []
