"""One orchestration of a run (issue 35, 3): errors become exit codes in one place, the run
directory renders nothing, and the analysis changes none of its inputs."""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from pathlib import Path

import pytest

from diagnose import errors
from diagnose.errors import Failure, OutputError, RuleError, TraceError, UsageError

PACKAGE = Path(__file__).resolve().parent.parent / "diagnose"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_run_directory_imports_no_renderer() -> None:
    """rundir.py names files and writes bytes; report.html and the events are rendered by the
    orchestration (session) and handed to it: no arrow up to the renderers."""
    assert not {m for m in _imports(PACKAGE / "rundir.py") if m.startswith("diagnose.renderers")}


def test_the_command_line_handles_no_error_itself() -> None:
    """cli.py parses and maps exit codes: no command catches a DiagnoseError (or MemoryError) to
    print it; cliparse.Command ends every one through errors.Failure."""
    handlers = [
        node
        for node in ast.walk(ast.parse((PACKAGE / "cli.py").read_text()))
        if isinstance(node, ast.ExceptHandler)
        and node.type is not None
        and {"DiagnoseError", "MemoryError"} & {n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)}
    ]
    assert handlers == []


@dataclass(frozen=True)
class Case:
    error: BaseException
    lines: tuple[str, ...] | None
    exit_code: int | None


@pytest.mark.parametrize(
    "case",
    [
        Case(
            UsageError("no such script: t.py", hint="give a script"),
            ("diagnose: error: no such script: t.py", "hint: give a script"),
            2,
        ),
        Case(RuleError("r.toml:3: unknown symptom"), ("diagnose: error: r.toml:3: unknown symptom",), 2),
        Case(TraceError("t.json is not valid JSON"), ("diagnose: error: t.json is not valid JSON",), 4),
        Case(OutputError("cannot write x"), ("diagnose: error: cannot write x",), 5),
        Case(errors.DiagnoseError("the baseline failed", exit_code=1), ("diagnose: error: the baseline failed",), 1),
        Case(MemoryError(), errors.OUT_OF_MEMORY.lines, 4),
        Case(OSError(12, "Cannot allocate memory"), errors.OUT_OF_MEMORY.lines, 4),
        Case(ImportError("lib.so: failed to map segment from shared object"), errors.OUT_OF_MEMORY.lines, 4),
        Case(KeyboardInterrupt(), ("diagnose: interrupted",), 130),
        Case(ImportError("No module named 'tensorboard'"), None, None),
        Case(ValueError("a bug"), None, None),
        Case(SystemError("error return without exception set"), None, None),  # with memory to spare: a bug
    ],
    ids=lambda case: type(case.error).__name__ + (f"-{case.exit_code}" if case.exit_code else ""),
)
def test_each_error_class_has_its_lines_and_exit_code(case: Case) -> None:
    failure = Failure.of(case.error)
    if case.lines is None:
        assert failure is None  # a bug: its traceback is raised, not turned into a line
    else:
        assert failure == Failure(case.lines, case.exit_code)


def test_a_system_error_while_memory_is_short_is_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``ulimit -v`` an import's C code can fail an allocation without setting MemoryError:
    a SystemError "error return without exception set". It is memory when a probe allocation
    fails then too (tests/test_fault_injection.py runs it for real under an address-space limit)."""
    monkeypatch.setattr(errors, "_allocation_fails", lambda: True)
    assert Failure.of(SystemError("error return without exception set")) == errors.OUT_OF_MEMORY
    assert Failure.of(SystemError("some other internal error")) is None


def test_the_analysis_changes_no_record_it_is_given() -> None:
    """The window's analysis attributes the trace's sync time to the record's sync sites in a
    new record: the one passed in (a caller's, loaded once for several ranks) stays as it was."""
    from diagnose.analysis.pipeline import AnalysisOptions, analyze
    from diagnose.rundir import RunDir

    run = RunDir(Path(__file__).parent / "data" / "item_syncs")
    record = run.load_record()
    assert record is not None and record.sync_sites
    before = copy.deepcopy(record.sync_sites)
    trace, warnings = run.trace_for(record)
    report = analyze(record, trace, AnalysisOptions.load(), {"kind": "run"}, warnings)
    assert record.sync_sites == before
    assert report.sync_sites and "blocked_ms_per_step" in report.sync_sites[0]  # the report has them attributed
