"""A run, orchestrated in one place: run the script into its run directory, analyse what it left
there, write the outputs. The CLI's commands are a few calls into this module.

Contract:

* ``analyze_run(run_dir, options) -> Report``: a run directory's record(s) and trace(s), found by
  ``RunDir``, analysed by ``analysis.pipeline`` (every rank side by side in a distributed run);
* ``analyze_and_save(run_dir, options, html) -> Report``: the same, then ``save_outputs``
  (report.json, TensorBoard events and, on request, report.html);
* ``RunRequest``: what ``diagnose run`` was asked; ``open_run_dir``, ``run_script``,
  ``launch_ranks`` and ``merges_here`` run it, in one process or one per rank;
* ``finish_rank(run_dir, rank, options, exchange) -> Report | None``: in each rank's process,
  right after its run: its own analysis, report and summary; on the merging rank, the job's
  report from every rank's summary (``merge_ranks`` does the same from the run directory).

The runtime side (torch) is imported only when a script is run: analysing needs no torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.analysis.pipeline import AnalysisOptions, RankAnalysis, analyse_rank, analyze, combine_ranks, lead_of, rank_report
from diagnose.analysis.measure.ranks import RankSummary
from diagnose.analysis.report import Report
from diagnose.distributed import PARENT_MERGES, RankInfo, SummaryExchange
from diagnose.errors import OutputError, TraceError, UsageError
from diagnose.record import RunRecord, WindowPlan
from diagnose.rundir import RunDir, shared_location
from diagnose.signals import SignalHold

if TYPE_CHECKING:
    from diagnose.runtime.knobs import Knobs
    from diagnose.runtime.whole import WatchBudget
    from diagnose.supervise import Ending

# --- analysing a run directory ----------------------------------------------------------------


def analyze_run(run_dir: RunDir, options: AnalysisOptions) -> Report:
    """Analyse what a run left: the ranks' summaries and the first rank's trace, or the one
    record and its trace."""
    source = {"kind": "run", "run_dir": str(run_dir.path)}
    ranks = run_dir.load_ranks()
    if ranks:
        return _combine_from_dir(run_dir, ranks, options, source)
    if not run_dir.path.is_dir():
        raise UsageError(f"no such run directory or trace: {run_dir.path}", hint="give a runs/<name>/ folder or a .pt.trace.json(.gz) file")
    record = run_dir.load_record()
    trace, warnings = run_dir.trace_for(record)
    if record is None and trace is None:
        raise UsageError(f"{run_dir.path} holds neither run.json nor a trace", hint="is it a diagnose run directory?")
    checked = None if options.measured else _kept_check(run_dir)
    if checked is None:
        return analyze(record, trace, options, source, warnings)
    from diagnose.experiments import measurements  # the runtime's knobs: imported only here

    report = analyze(record, trace, replace(options, measured=measurements(checked)), source, warnings)
    report.ranking = {**(report.ranking or {}), "check": checked}
    return report


def _kept_check(run_dir: RunDir) -> dict[str, Any] | None:
    """The check ``diagnose run`` saved in the run's report (``ranking.check``), if any: a
    re-analysis ranks on what it measured too."""
    if not run_dir.report_path.is_file():
        return None
    try:
        checked = (run_dir.load_report().ranking or {}).get("check")
    except (OSError, ValueError, TypeError, UsageError):
        return None
    return checked if isinstance(checked, dict) and checked.get("experiments") else None


def _combine_from_dir(run_dir: RunDir, ranks: dict[int, RunRecord], options: AnalysisOptions, source: dict[str, Any]) -> Report:
    """The job's report from the run directory: the first rank's trace, every other rank's
    summary. A rank that left no summary (an older diagnose, or one killed before its own
    analysis) is summarised from its trace, one at a time."""
    saved = run_dir.load_rank_summaries()
    first_rank = min(ranks)
    first = _analyse_from_dir(run_dir, first_rank, ranks[first_rank], options)
    summaries = [first.summary]
    analysed = {first_rank: first}
    for rank, record in sorted(ranks.items()):
        if rank == first_rank:
            continue
        if rank in saved:
            summaries.append(RankSummary.from_dict(saved[rank]))
        else:
            analysed[rank] = _analyse_from_dir(run_dir, rank, record, options)
            summaries.append(analysed[rank].summary)

    def load(rank: int) -> RankAnalysis | None:
        if rank not in analysed:
            analysed[rank] = _analyse_from_dir(run_dir, rank, ranks[rank], options)
        return analysed[rank] if analysed[rank].trace is not None else None

    return combine_ranks(lead_of(first, summaries, load), summaries, options, source)


def _analyse_from_dir(run_dir: RunDir, rank: int, record: RunRecord, options: AnalysisOptions) -> RankAnalysis:
    trace, warnings = run_dir.trace_for(record, rank)
    analysis = analyse_rank(rank, record, trace, options, warnings)
    if run_dir.rank_report_path(rank).is_file():
        analysis.summary.report = run_dir.rank_report_path(rank).name
    return analysis


def save_outputs(run_dir: RunDir, report: Report, html: bool = False, events: bool = True) -> Report:
    """report.json, then the TensorBoard events (with ``events``, for a run that measured steps
    and ended well) and report.html (with ``html``)."""
    if report.distributed is not None:  # a watched job: each rank's accounting, the job's goodput
        from diagnose.analysis.measure.wholerun import job_section

        report.whole = job_section(report.whole, run_dir.load_ranks()) or report.whole
    run_dir.save_report(report)
    # a run that failed or measured no step writes no events: TensorBoard would list it as a run
    if events and report.breakdown and report.status.get("state") in ("completed", "stopped", "trace"):
        run_dir.save_events(report)
    if html:
        run_dir.save_html(report)
    return report


def analyze_and_save(run_dir: RunDir, options: AnalysisOptions, html: bool = False) -> Report:
    """``analyze_run`` then ``save_outputs``. When the trace cannot be analysed (unreadable, or
    memory runs out), a run's report.json still says what the run measured without the trace
    (it is small), then the error is raised: the run's record is never left without a report."""
    try:
        report = analyze_run(run_dir, options)
        try:
            return save_outputs(run_dir, report, html=html)
        except OutputError as exc:  # a read-only or full run directory: the report is still shown
            exc.report = report
            raise
    except MemoryError:  # the traceback, and what the analysis held, are released on leaving
        error = TraceError(
            f"memory ran out while analysing the trace in {run_dir.path}",
            hint="diagnose trim TRACE keeps fewer steps; or analyse it where more memory is free",
        )
    except TraceError as exc:
        error = exc.with_traceback(None)
    _save_without_trace(run_dir, options, error)
    raise error


def check_and_save(run_dir: RunDir, request: RunRequest, report: Report, budget_s: float, on_progress: Callable[[str], None]) -> Report:
    """``diagnose run``'s check (``experiments.check``: a short A/B of the findings the report
    says to measure, in fresh runs, within ``budget_s``), then the report again with what it
    measured ranked above what is predicted, and the check's own section (``ranking.check``).
    The report saved before it stays where no experiment ran."""
    from diagnose import experiments

    options = [*rules_argv(request.rules_dirs), *([] if request.lines else ["--no-lines"])]
    measured, summary = experiments.check(
        request.target_argv(), run_dir, request.plan, report.to_dict(), request.check, budget_s, request.knob_assignments, options, on_progress
    )
    if not summary["experiments"]:  # nothing it could measure (no knob) or time for
        return report
    checked = analyze_run(run_dir, replace(request.options, measured=measured))
    checked.ranking = {**(checked.ranking or {}), "check": summary}
    return save_outputs(run_dir, checked, html=request.html)


#: why a distributed run measures nothing in-run: its A/B would have to launch each experiment as
#: the same torchrun job on every node, in step; ``diagnose verify --nproc-per-node`` does that
DISTRIBUTED_CHECK_SKIPPED = (
    "a distributed run measures no unsure finding in-run (each A/B would be a whole torchrun job on every node): "
    "measure them with diagnose verify --nproc-per-node N --rule RULE"
)


def check_skipped(run_dir: RunDir, report: Report, reason: str, html: bool = False) -> Report:
    """The report of a run whose check could not run (``reason``): ``ranking.check`` and a
    warning say so, each finding it would have measured named, so that an unsure ranking is
    never taken for a checked one."""
    to_check = [item["rule"] for item in (report.ranking or {}).get("to_check") or [] if item.get("knobs")]
    if not to_check:
        return report
    report.ranking = {**(report.ranking or {}), "check": {"skipped": reason, "experiments": [], "not_measured": [f"{rule}: {reason}" for rule in to_check]}}
    report.warnings = [*report.warnings, f"not measured ({', '.join(to_check)}): {reason}"]
    return save_outputs(run_dir, report, html=html)


def _save_without_trace(run_dir: RunDir, options: AnalysisOptions, error: TraceError) -> None:
    """A single run's report without its trace, with a warning that says why; only where the
    run has no report of its own yet (a re-analysis that fails keeps the one it has)."""
    try:
        record = run_dir.load_record() if not run_dir.ranks() else None
    except UsageError:
        return
    report_path, record_path = run_dir.report_path, run_dir.record_path()
    if record is None or (report_path.is_file() and report_path.stat().st_mtime >= record_path.stat().st_mtime):
        return
    source = {"kind": "run", "run_dir": str(run_dir.path)}
    report = analyze(record, None, options, source, [f"the trace could not be analysed: {error.message}"])
    save_outputs(run_dir, report, events=False)


def save_not_run(run_dir: RunDir, target: dict[str, Any], message: str, options: AnalysisOptions) -> None:
    """A run that never started still leaves run.json and report.json saying why."""
    record = RunRecord(target=target, command=list(sys.argv), status="not_run", exit_code=2)
    record.error = {"type": "UsageError", "message": message, "traceback": ""}
    run_dir.save_record(record)
    analyze_and_save(run_dir, options)


# --- a run whose process ended without a word ---------------------------------------------------


def settle_supervised_run(run_dir: RunDir, request: RunRequest, ending: Ending) -> RunRecord | None:
    """After ``diagnose run``'s supervised child ended: the record to analyse where the child
    did not finish the run's files, else None. A child that never recorded how the run ended
    (a segfault, SIGKILL, an exec, a signal before the script started) left no run.json or the
    one it keeps as it goes (status "crashed"): it is completed here with how the process
    ended. A child that recorded the run but died before its report (or during it) leaves
    its record to analyse again."""
    import signal

    try:
        record = run_dir.load_record()
    except UsageError:
        record = None
    if record is not None and record.status != "crashed":
        report = run_dir.report_path
        done = report.is_file() and report.stat().st_mtime >= run_dir.record_path().stat().st_mtime
        return None if done else record
    if record is None:
        kind, value = ("module", request.module) if request.module else ("script", request.script)
        record = RunRecord(target={"kind": kind, "value": value, "args": request.script_args, "cwd": os.getcwd()}, command=list(sys.argv))
        record.plan = dataclasses.asdict(request.plan)
    sig = ending.signal if ending.signal is not None else (ending.code - 128 if ending.code in (130, 143, 129) else None)
    if sig is not None and sig in ending.received and sig == signal.SIGINT:
        record.status, record.exit_code = "interrupted", 130
        record.error = {"type": "KeyboardInterrupt", "message": "", "traceback": ""}
    elif sig is not None and sig in ending.received and sig in (signal.SIGTERM, getattr(signal, "SIGHUP", -1)):
        record.status, record.exit_code = "terminated", 128 + sig
        record.error = {"type": "Terminated", "message": signal.Signals(sig).name, "traceback": ""}
    else:
        record.status, record.exit_code = "crashed", ending.code
        record.error = {"type": "Crash", "message": ending.describe(), "traceback": ""}
    if not record.started_at:
        record.warnings.append("the run ended before the script started: nothing was measured")
    run_dir.save_record(record)
    return record


# --- running a script -------------------------------------------------------------------------


def rules_argv(rules_dirs: tuple[Path, ...] | list[Path]) -> list[str]:
    """``--rules DIR`` options for a child ``diagnose run`` (absolute: it may start elsewhere)."""
    return [item for d in rules_dirs for item in ("--rules", str(Path(d).resolve()))]


@dataclass
class RunRequest:
    """What ``diagnose run`` was asked to do."""

    script: str | None
    module: str | None
    script_args: list[str]
    knobs: Knobs
    options: AnalysisOptions
    plan: WindowPlan
    out: Path | None = None
    overwrite: bool = False
    html: bool = False
    lines: bool = True
    quiet: bool = False
    #: the ``--set`` and ``--rules`` options as given, passed on to the ranks
    knob_assignments: list[str] = field(default_factory=list)
    rules_dirs: tuple[Path, ...] = ()
    #: the ranks whose traces stay: "notable" (the first, slowest, straggler, outliers) or "all"
    keep_traces: str = "notable"
    #: torchrun's multi-node options (``--nnodes=2`` ...), passed on as they are
    torchrun_options: list[str] = field(default_factory=list)
    #: ``diagnose watch``: the whole run is recorded, with later windows under this budget
    watch: WatchBudget | None = None
    #: how many unsure findings the run measures by a short A/B afterwards (0: ``--no-check``)
    check: int = 0
    #: the time the check may take (None: the run's own time again, ``experiments.CHECK_BUDGET_FACTOR``)
    check_budget_s: float | None = None

    @property
    def name(self) -> str:
        return (Path(self.script).stem if self.script else (self.module or "run").rsplit(".", 1)[-1]) or "run"

    def target_argv(self) -> list[str]:
        if self.module:
            return ["-m", self.module, "--", *self.script_args]
        return [str(self.script), "--", *self.script_args]

    def rank_argv(self) -> list[str]:
        """The options every rank's ``diagnose run --rank-aware`` is started with."""
        argv = [*self.plan.to_argv(), "--quiet", *([] if self.lines else ["--no-lines"]), "--keep-traces", self.keep_traces]
        if self.watch is not None:
            from diagnose.runtime.whole import budget_argv

            argv += budget_argv(self.watch)
        return argv + [x for k in self.knob_assignments for x in ("--set", k)] + rules_argv(self.rules_dirs)


def open_run_dir(request: RunRequest, rank: RankInfo | None = None) -> RunDir:
    """The run directory, created before the script starts (once the script or module is
    found: a usage error leaves no folder behind); every rank shares one."""
    from diagnose.runtime.runner import resolve_target

    resolve_target(request.script, request.module, request.script_args)
    if rank is None:
        # the nodes of a multi-node job share one folder: none of them claims it alone
        return RunDir.create_for(request.name, request.out, overwrite=request.overwrite, shared=bool(request.torchrun_options))
    return RunDir.create(request.out or shared_location(request.name), overwrite=True)  # each rank writes its own names


def merges_here(rank: RankInfo | None) -> bool:
    """Whether this process analyses the run: a single process, or rank 0 when no parent
    ``diagnose run --nproc-per-node`` merges the ranks itself."""
    return rank is None or (rank.rank == 0 and not os.environ.get(PARENT_MERGES))


def run_script(
    request: RunRequest, run_dir: RunDir, rank: RankInfo | None = None, quiet_stdout: bool = False, signal_hold: SignalHold | None = None,
    exchange: SummaryExchange | None = None,
) -> RunRecord:
    """Run the script into ``run_dir``. A script that cannot start leaves a run directory that
    says why, then raises the usage error. With ``signal_hold``, SIGINT and SIGTERM stay held
    after the script ended, until the caller releases them (when the report is saved). With
    ``exchange`` (a rank), the job's process-group store is kept when the window closes."""
    from diagnose.errors import DiagnoseError
    from diagnose.progress import Progress
    from diagnose.runtime.line_attribution import LineAttribution
    from diagnose.runtime.runner import resolve_target, run_target

    try:
        target = resolve_target(request.script, request.module, request.script_args)
    except DiagnoseError as exc:
        kind = "module" if request.module else "script"
        save_not_run(run_dir, {"kind": kind, "value": request.module or request.script, "args": request.script_args}, exc.message, request.options)
        raise
    target.args = request.knobs.apply_to_args(target.args)
    rank_number = None if rank is None else rank.rank

    def before_hard_exit(record: RunRecord) -> None:  # os._exit or an exec ends the process: report now
        if rank is None:
            analyze_and_save(run_dir, request.options, html=request.html)
            how = record.warnings[-1] if record.warnings else "the script ended its process"
            print(f"diagnose: {how}; the report is in {run_dir.path}", file=sys.stderr)

    hooks: list[Any] = [LineAttribution(run_dir.workers_path(rank_number))] if request.lines else []
    if exchange is not None:
        hooks.append(exchange)
    if request.watch is not None:
        from diagnose.runtime.whole import LiveLine, WholeRun

        hooks.append(WholeRun(run_dir, rank_number, request.watch, LiveLine(enabled=not request.quiet)))
    with _stdout_to_stderr(quiet_stdout):
        return run_target(
            target, request.plan, run_dir, rank=rank_number, knobs=request.knobs if request.knobs else None,
            progress=Progress(enabled=not request.quiet), extra_hooks=hooks, on_hard_exit=before_hard_exit,
            signal_hold=signal_hold,
        )


def launch_ranks(request: RunRequest, nproc: int, run_dir: RunDir, quiet_stdout: bool = False) -> int:
    """``--nproc-per-node``: torchrun starts the ranks, each a rank-aware ``diagnose run`` into
    ``run_dir``; the caller then analyses them together. Returns torchrun's exit code."""
    from diagnose.distributed import launch

    return launch(nproc, run_dir.path, request.rank_argv(), request.target_argv(), quiet_stdout=quiet_stdout, torchrun_options=request.torchrun_options)


# --- each rank's own analysis, and the job's view -------------------------------------------------

#: how long the merging rank waits for the others' summaries (they stop at the same step)
SUMMARY_TIMEOUT_S = 120.0


def finish_rank(
    run_dir: RunDir, rank: RankInfo, options: AnalysisOptions, exchange: SummaryExchange | None = None, keep_traces: str = "notable",
    html: bool = False, timeout_s: float = SUMMARY_TIMEOUT_S,
) -> Report | None:
    """Right after a rank's run, in its own process: analyse its own trace, write its report
    (``rank<R>.report.json``) and its summary (``rank<R>.summary.json``, and over the job's
    store). The merging rank then builds the job's report from every rank's summary, never
    their traces, saves it and returns it; the other ranks return None."""
    source = {"kind": "run", "run_dir": str(run_dir.path)}
    record = run_dir.load_record(rank.rank)
    if record is None:
        return None
    trace, warnings = run_dir.trace_for(record, rank.rank)
    analysis = analyse_rank(rank.rank, record, trace, options, warnings)
    own = rank_report(analysis, options, source)
    run_dir.save_rank_report(rank.rank, own)
    analysis.summary.report = run_dir.rank_report_path(rank.rank).name
    summary = analysis.summary.to_dict()
    run_dir.save_rank_summary(rank.rank, summary)  # first: a merge from the directory finds it
    if exchange is not None:
        exchange.publish(summary)
    if not merges_here(rank):
        return None
    gathered = exchange.collect(timeout_s) if exchange is not None else None
    if gathered is None:  # no store reached, or a rank missed the deadline: what the directory holds
        run_dir.wait_for_ranks(rank.world_size, timeout_s, summaries=True)
        gathered = list(run_dir.load_rank_summaries().values())
    summaries = [RankSummary.from_dict(s) for s in gathered]

    def load(other: int) -> RankAnalysis | None:  # the lead rank's own trace, still in the run directory
        other_record = run_dir.load_record(other)
        if other_record is None:
            return None
        other_trace, other_warnings = run_dir.trace_for(other_record, other)
        return analyse_rank(other, other_record, other_trace, options, other_warnings) if other_trace is not None else None

    report = combine_ranks(lead_of(analysis, summaries, load), summaries, options, source)
    report.distributed["gathered"] = "process group store" if exchange is not None and exchange.store is not None and len(gathered) == rank.world_size else "run directory"
    keep_notable_traces(run_dir, report, keep_traces)
    return save_outputs(run_dir, report, html=html)


def merge_ranks(run_dir: RunDir, options: AnalysisOptions, html: bool = False, keep_traces: str = "notable") -> Report:
    """The job's report from a run directory whose ranks have all ended (``--nproc-per-node``:
    the launching process, once torchrun returned); then the traces not worth keeping go."""
    report = analyze_run(run_dir, options)
    if report.distributed is not None:
        report.distributed["gathered"] = "run directory"
        keep_notable_traces(run_dir, report, keep_traces)
    return save_outputs(run_dir, report, html=html)


KEEP_TRACES = ("notable", "all")


def keep_notable_traces(run_dir: RunDir, report: Report, keep: str) -> list[int]:
    """Remove the traces of the ranks not worth opening (``keep`` "notable"); the ranks whose
    traces went, also written into the report. Their summaries and own reports stay."""
    distributed = report.distributed or {}
    notable = {int(r) for r in distributed.get("notable_ranks", {})}
    rows = distributed.get("ranks", [])
    dropped = [] if keep == "all" else sorted(row["rank"] for row in rows if row["rank"] not in notable)
    removed = {int(p.name[4:].split("_", 1)[0]) for p in run_dir.remove_traces(dropped)}
    for row in rows:
        if row["rank"] in removed:
            row["trace"] = None
    distributed["traces_removed"] = sorted(removed)
    return sorted(removed)


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """With --json, stdout carries only the report: the script's own output goes to stderr."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
