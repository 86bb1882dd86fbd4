"""Write a run directory's outputs from its trace and run.json: report.json, TensorBoard
events and, on request, report.html. ``diagnose run`` and ``diagnose analyze RUN_DIR`` share it."""

from __future__ import annotations

import sys
from pathlib import Path

from diagnose.analysis.pipeline import REPORT_JSON, AnalysisOptions, analyze_run_dir
from diagnose.errors import OutputError
from diagnose.analysis.report import Report
from diagnose.analysis.rules import Rule


def analyze_and_save(run_dir: Path, options: AnalysisOptions, rules: list[Rule] | None = None, html: bool = False) -> Report:
    report = analyze_run_dir(run_dir, options, rules)
    try:
        report.save(run_dir / REPORT_JSON)
    except OSError as exc:
        raise OutputError(f"cannot write {run_dir / REPORT_JSON}: {exc.strerror}") from exc
    write_tensorboard(report, run_dir)
    if html:
        write_html(report, run_dir / "report.html")
    return report


def write_html(report: Report, path: Path) -> Path:
    from diagnose.renderers.html import HTMLRenderer

    try:
        path.write_text(HTMLRenderer().render(report), encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from exc
    return path


def write_tensorboard(report: Report, run_dir: Path) -> None:
    """Scalars and text for TensorBoard, when the tensorboard package is installed."""
    try:
        from diagnose.renderers.tensorboard import write_events
    except ImportError:
        return
    try:
        write_events(report, run_dir)
    except ImportError:
        return
    except OSError as exc:
        print(f"diagnose: warning: could not write TensorBoard events: {exc}", file=sys.stderr)


def save_not_run(run_dir: Path, target: dict, message: str) -> None:
    """A run that never started still leaves run.json and report.json saying why."""
    from diagnose.analysis.pipeline import RUN_JSON
    from diagnose.record import RunRecord

    record = RunRecord(target=target, command=list(sys.argv), status="not_run", exit_code=2)
    record.error = {"type": "UsageError", "message": message, "traceback": ""}
    record.save(run_dir / RUN_JSON)
    analyze_and_save(run_dir, AnalysisOptions())
