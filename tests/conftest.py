"""Shared fixtures. The autouse guard fails a test that leaves global torch state behind (hooks,
patched DataLoader methods, a running profiler): the runner must always clean up after itself."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"


def _torch_state() -> tuple | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module
    from torch.utils.data import dataloader as dl_module

    return (
        dl_module.DataLoader.__dict__["__init__"],
        dl_module.DataLoader.__dict__["__iter__"],
        dl_module._BaseDataLoaderIter.__dict__["__next__"],
        dict(optim_module._global_optimizer_post_hooks),
        dict(nn_module._global_forward_pre_hooks),
        torch.Tensor.__dict__.get("to"),
        torch.autograd.backward,
        torch.autograd.profiler._is_profiler_enabled,
        # diagnose.runtime.marks and compilewatch
        dict(optim_module._global_optimizer_pre_hooks),
        _without_lightning(torch.compile),
        torch.nn.Module.__dict__.get("compile"),
        torch.nn.Module.__dict__.get("zero_grad"),
        torch.nn.utils.clip_grad_norm_,
        torch.amp.GradScaler.__dict__.get("step"),
        # diagnose.runtime.scriptargs
        __import__("argparse").ArgumentParser.__dict__["parse_known_args"],
    )


def _without_lightning(fn: object) -> object:
    """Lightning wraps torch.compile when it is first imported (lightning/fabric/wrappers.py);
    a test that imports it for the first time has not left a patch of ours behind."""

    def from_lightning(f: object) -> bool:  # functools.wraps copies __module__: ask the code object
        return "lightning" in getattr(getattr(f, "__code__", None), "co_filename", "")

    while from_lightning(fn) and hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__  # type: ignore[attr-defined]
    return fn


@pytest.fixture(autouse=True)
def no_global_state_left_behind() -> Iterator[None]:
    before = _torch_state()
    argv, path0 = list(sys.argv), sys.path[0]
    yield
    after = _torch_state()
    if before is not None and after is not None:
        assert after == before, "a test left torch hooks or patches installed"
    elif after is not None:
        assert not after[3] and not after[4] and after[5] is None and not after[7]
    assert sys.argv == argv and sys.path[0] == path0
    # the framework watch's import hook (a framework's own import may add finders of its own)
    assert not [f for f in sys.meta_path if type(f).__name__ == "_ImportHook"], (
        "a test left diagnose's import hook installed"
    )


@pytest.fixture
def write_script(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write a training script (dedented) into the test's temp folder."""

    def write(body: str, name: str = "train.py") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body).lstrip())
        return path

    return write


# --- every report.json a test writes validates against the shipped JSON Schema ------------------

SCHEMA_PATH = REPO / "diagnose" / "schema" / "report.schema.json"


def report_errors(report: dict) -> list[str]:
    """What is wrong with a report.json's content against the schema (empty: it validates)."""
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(report)]


@pytest.fixture(autouse=True)
def reports_written_validate(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used tmp_path: each report.json it left there (a run, an analysis, a
    verify or sweep, written in this process or by a child) validates against the schema."""
    folder = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if folder is None:
        return
    try:
        import jsonschema  # noqa: F401 - a test dependency
    except ImportError:
        return
    for path in folder.rglob("report.json"):
        try:  # tests of broken files leave folders and non-JSON under this name on purpose
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and str(data.get("schema", "")).endswith("/2"):
            assert report_errors(data) == [], f"{path} does not validate"


# --- no test can hang the suite ------------------------------------------------------------------
#
# pytest-timeout (the test extra) fails a test that runs past pyproject's ``timeout``. Where it is
# not installed, the same bound comes from SIGALRM here: a test blocked on a child (a wait, a
# pipe) is interrupted and fails, and the child is killed by subprocess's own cleanup.

try:
    import pytest_timeout  # noqa: F401 - the plugin registers itself
except ImportError:
    import signal

    def pytest_addoption(parser: pytest.Parser) -> None:
        parser.addini("timeout", "seconds a test may run (pytest-timeout's option)", default="300")
        parser.addini("timeout_method", "pytest-timeout's option (ignored here)", default="signal")

    @pytest.fixture(autouse=True)
    def _test_timeout(request: pytest.FixtureRequest) -> Iterator[None]:
        seconds = int(float(request.config.getini("timeout") or 0))
        if not seconds or not hasattr(signal, "SIGALRM"):
            yield
            return

        def expired(signum: int, frame: object) -> None:
            pytest.fail(f"Timeout: the test ran past {seconds} s", pytrace=True)

        previous = signal.signal(signal.SIGALRM, expired)
        signal.alarm(seconds)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
