"""A run, orchestrated in one place: run the script into its run directory, analyse what it
left there, save the outputs (report.json, rendered into TensorBoard events and report.html
here, and handed to ``RunDir`` to write), show the report. The CLI (``diagnose run``,
``analyze``, ``report``, ``verify``, ``sweep``), the Python API (``diagnose.profile``,
``diagnose.analyze``) and verify's and sweep's child runs (each a ``diagnose run``) all go
through this module.

Contract:

* ``run(request, display, nproc_per_node, rank, started) -> RunEnd``: ``diagnose run`` from its
  parsed request to how it ends (its exit code, the report its ``--fail-on`` conditions are held
  against, the lines said last): in a supervised child, through torchrun's ranks, or as one
  rank of a job; the report shown through ``display``;
* ``profiled_block(name, plan, options, ...)``: the same for a block of the caller's own code
  (``diagnose.profile``), in this process;
* ``analyze_path(path, options, display, html, out) -> Report``: ``diagnose analyze``;
  ``analyze_run(run_dir, options) -> Report``: a run directory's record(s) and trace(s), found
  by ``RunDir``, analysed by ``analysis.pipeline`` (every rank side by side in a distributed run);
* ``analyze_and_save(run_dir, options, html) -> Report``: the same, then ``save_outputs``
  (report.json, TensorBoard events and, on request, report.html: ``write_html``, ``write_events``);
* ``verify_report`` / ``sweep_report`` and ``save_experiments``: verify's and sweep's own report,
  saved and shown, with the comparison of their runs as TensorBoard events;
* ``RunRequest``: what ``diagnose run`` was asked; ``open_run_dir``, ``run_script``,
  ``launch_ranks`` and ``merges_here`` run it, in one process or one per rank;
* ``finish_rank(run_dir, rank, options, exchange) -> Report | None``: in each rank's process,
  right after its run: its own analysis, report and summary; on the merging rank, the job's
  report from every rank's summary (``merge_ranks`` does the same from the run directory).

Why one module: it is every command's one orchestration (about 900 lines); its sections
follow a run's life: analysing a run directory, saving, running the script, how ``diagnose
run`` ends, each rank's analysis, ``analyze``, verify's and sweep's reports, a profiled block.

Errors are raised as ``DiagnoseError`` (``errors.Failure`` turns them into a line and an exit
code, in one place); a report that was analysed but could not be saved is shown first.
The runtime side (torch) is imported only when a script is run: analysing needs no torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose import errors
from diagnose.analysis.pipeline import (
    AnalysisOptions,
    RankAnalysis,
    analyse_rank,
    analyze,
    analyze_trace,
    combine_from_traces,
    combine_ranks,
    lead_of,
    rank_report,
    traced,
)
from diagnose.display import Display
from diagnose.distributed import PARENT_MERGES, RankInfo, SummaryExchange
from diagnose.errors import DiagnoseError, OutputError, TraceError, UsageError
from diagnose.record import RunRecord, WindowPlan
from diagnose.report import Experiments, Ranking, RankSummary, Report, RunInfo, Source, Status, Whole, convert
from diagnose.rundir import RunDir, rank_of_trace, shared_location
from diagnose.signals import SignalHold

if TYPE_CHECKING:
    from diagnose.analysis.compare import Comparison
    from diagnose.experiments import Outcome, VerifyResult
    from diagnose.runtime.knobs import Knobs
    from diagnose.runtime.whole import WatchBudget
    from diagnose.supervise import Ending

    # as diagnose.api spells them for its users
    PathLike = str | Path
    RunLike = PathLike | Report | tuple[str, Report]

# --- analysing a run directory ----------------------------------------------------------------


def analyze_run(run_dir: RunDir, options: AnalysisOptions) -> Report:
    """Analyse what a run left: the ranks' summaries and the first rank's trace, or the one
    record and its trace."""
    source = {"kind": "run", "run_dir": str(run_dir.path)}
    ranks = run_dir.load_ranks()
    if ranks:
        return _combine_from_dir(run_dir, ranks, options, source)
    if not run_dir.path.is_dir():
        raise UsageError(
            f"no such run directory or trace: {run_dir.path}",
            hint="give a runs/<name>/ folder or a .pt.trace.json(.gz) file",
        )
    record = run_dir.load_record()
    by_rank = user_rank_traces(run_dir) if record is None else {}
    if by_rank:
        return _combine_user_ranks(run_dir, by_rank, options, source)
    trace, warnings = run_dir.trace_for(record)
    if record is None and trace is None:
        raise UsageError(f"{run_dir.path} holds neither run.json nor a trace", hint="is it a diagnose run directory?")
    checked = None if options.measured else _kept_check(run_dir)
    if checked is None:
        return analyze(record, trace, options, source, warnings)
    from diagnose.experiments import measurements  # the runtime's knobs: imported only here

    report = analyze(record, trace, replace(options, measured=measurements(checked)), source, warnings)
    _record_check(report, checked)
    return report


def user_rank_traces(run_dir: RunDir) -> dict[int, list[Path]]:
    """A folder of the user's own traces (no run record) that holds several ranks of one job
    (torch.profiler's ``tensorboard_trace_handler`` names them ``<host>_<pid>.<ms>.pt.trace.json``,
    the rank in each file's ``distributedInfo``; or ``rank<R>_...``): each rank's traces, by
    rank, oldest first. Empty where the folder is a run directory, holds one rank, or a trace
    whose rank cannot be told."""
    from diagnose.analysis.trace.tracefile import trace_rank

    if run_dir.holds_run():
        return {}
    by_rank: dict[int, list[Path]] = {}
    for path in run_dir.traces():
        rank = rank_of_trace(path.name)
        rank = rank if rank is not None else trace_rank(path)
        if rank is None:
            return {}
        by_rank.setdefault(rank, []).append(path)
    return by_rank if len(by_rank) > 1 else {}


def _combine_user_ranks(
    run_dir: RunDir, by_rank: dict[int, list[Path]], options: AnalysisOptions, source: dict[str, Any]
) -> Report:
    """The job's report from a folder of the user's own rank traces, each rank's latest trace
    analysed with no record (what the trace shows alone), as a run's ranks are combined."""
    from diagnose.analysis.pipeline import analyse_rank, combine_from_traces

    chosen = {rank: paths[-1] for rank, paths in by_rank.items()}
    earlier = sum(len(paths) - 1 for paths in by_rank.values())
    warnings = (
        [f"{earlier} earlier trace(s) of the same ranks not analysed: each rank's latest by name"] if earlier else []
    )
    report = combine_from_traces(
        sorted(chosen), lambda rank: analyse_rank(rank, None, chosen[rank], options, warnings), {}, options, source
    )
    if report.distributed is not None:
        report.distributed.gathered = "traces"
    return report


def _record_check(report: Report, check: dict[str, Any]) -> None:
    """``ranking.check``: what the short A/B did (or why it could not run)."""
    report.ranking = report.ranking or Ranking()
    report.ranking.check = check


def _kept_check(run_dir: RunDir) -> dict[str, Any] | None:
    """The check ``diagnose run`` saved in the run's report (``ranking.check``), if any: a
    re-analysis ranks on what it measured too."""
    if not run_dir.report_path.is_file():
        return None
    try:
        ranking = run_dir.load_report().ranking
        checked = ranking.check if ranking is not None else None
    except (OSError, ValueError, TypeError, UsageError):
        return None
    return checked if isinstance(checked, dict) and checked.get("experiments") else None


def _combine_from_dir(
    run_dir: RunDir, ranks: dict[int, RunRecord], options: AnalysisOptions, source: dict[str, Any]
) -> Report:
    """The job's report from the run directory: the first rank's trace, every other rank's
    summary. A rank that left no summary (an older diagnose, or one killed before its own
    analysis) is summarised from its trace, one at a time."""
    saved = {
        rank: RankSummary.from_dict(summary) for rank, summary in run_dir.load_rank_summaries().items() if rank in ranks
    }
    return combine_from_traces(
        sorted(ranks), lambda rank: _analyse_from_dir(run_dir, rank, options, ranks.get(rank)), saved, options, source
    )


def _analyse_from_dir(
    run_dir: RunDir, rank: int, options: AnalysisOptions, record: RunRecord | None = None
) -> RankAnalysis | None:
    """One rank's analysis from the run directory (its record loaded where not given; None
    where it left none), its own report's name in its summary."""
    record = record if record is not None else run_dir.load_record(rank)
    if record is None:
        return None
    trace, warnings = run_dir.trace_for(record, rank)
    analysis = analyse_rank(rank, record, trace, options, warnings)
    if run_dir.rank_report_path(rank).is_file():
        analysis.summary.report = run_dir.rank_report_path(rank).name
    return analysis


def save_outputs(run_dir: RunDir, report: Report, html: bool = False, events: bool = True) -> Report:
    """report.json, then the TensorBoard events (with ``events``, for a run that measured steps
    and ended well) and report.html (with ``html``), rendered here and written by ``RunDir``.
    Memory that runs out while rendering them leaves report.json saved, and says so."""
    if report.distributed is not None:  # a watched job: each rank's accounting, the job's goodput
        from diagnose.analysis.measure.wholerun import job_section

        job = job_section(report.whole.to_dict() if report.whole else None, run_dir.load_ranks())
        report.whole = convert(job, Whole) if job else report.whole
    run_dir.save_report(report)
    # a run that failed or measured no step writes no events: TensorBoard would list it as a run
    if events and report.breakdown and report.status.state in ("completed", "stopped", "trace"):
        write_events(run_dir, report)
    if html:
        write_html(run_dir, report)
    return report


def write_html(run_dir: RunDir, report: Report) -> Path:
    """report.html, rendered from the report; memory that runs out while rendering it is a
    ``TraceError`` (exit 4) that says report.json is kept."""
    from diagnose.renderers.html import HTMLRenderer

    try:
        page = HTMLRenderer().render(report)
    except MemoryError:  # left at once: what the renderer held goes with the traceback
        page = None
    if page is None:
        raise TraceError(
            f"memory ran out while writing {run_dir.html_path.name}; {run_dir.report_path} is saved",
            hint=f"diagnose report {run_dir.path} --html writes it again where more memory is free",
        )
    return run_dir.save_html(page)


def write_events(run_dir: RunDir, report: Report) -> Path | None:
    """TensorBoard scalars and text into the run directory, when the tensorboard package is
    installed (else None). A failure to write them, or memory running out, is a warning:
    report.json is what counts."""
    try:
        from diagnose.renderers.tensorboard import write_events as write_event_file

        return write_event_file(report, run_dir.events_folder)
    except ImportError:
        return None
    except OSError as exc:
        why = str(exc)
    except MemoryError:
        why = "memory ran out"
    print(f"diagnose: warning: could not write TensorBoard events: {why}", file=sys.stderr)
    return None


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


def check_and_save(
    run_dir: RunDir, request: RunRequest, report: Report, budget_s: float, on_progress: Callable[[str], None]
) -> Report:
    """``diagnose run``'s check (``experiments.check``: a short A/B of the findings the report
    says to measure, in fresh runs, within ``budget_s``), then the report again with what it
    measured ranked above what is predicted, and the check's own section (``ranking.check``).
    The report saved before it stays where no experiment ran."""
    from diagnose import experiments

    options = [*rules_argv(request.rules_dirs), *([] if request.lines else ["--no-lines"])]
    measured, summary = experiments.check(
        request.target_argv(),
        run_dir,
        request.plan,
        report.to_dict(),
        request.check,
        budget_s,
        request.knob_assignments,
        options,
        on_progress,
    )
    if not summary["experiments"]:  # nothing it could measure (no knob) or time for
        return report
    checked = analyze_run(run_dir, replace(request.options, measured=measured))
    _record_check(checked, summary)
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
    to_check = [item.rule for item in (report.ranking.to_check if report.ranking else []) if item.knobs]
    if not to_check:
        return report
    _record_check(
        report, {"skipped": reason, "experiments": [], "not_measured": [f"{rule}: {reason}" for rule in to_check]}
    )
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


# --- diagnose run, from its request to how it ends -----------------------------------------------


@dataclass(frozen=True)
class RunEnd:
    """How ``diagnose run`` ends: its exit code, the report its ``--fail-on`` conditions are held
    against (None: they are not, the run did not end well), and the lines said after them."""

    exit_code: int
    gated: Report | None = None
    closing: tuple[str, ...] = ()


def run(
    request: RunRequest,
    display: Display,
    nproc_per_node: int | None = None,
    rank: RankInfo | None = None,
    started: float | None = None,
) -> RunEnd:
    """``diagnose run``: the run directory, then the script run through torchrun's ranks
    (``nproc_per_node``), as one rank of a job (``rank``), or in a supervised child; its
    analysis, its outputs saved and its report shown. ``started``: when this process began
    (the check may take the run's own time again)."""
    run_dir = open_run_dir(request, None if nproc_per_node else rank)
    if nproc_per_node:
        return _launched(request, nproc_per_node, run_dir, display)
    if rank is None:  # a process of its own runs the script; this one writes what it could not
        from diagnose import supervise

        ending = supervise.supervise()
        if ending is not None:
            return _after_supervised(ending, run_dir, request, display)
    return _run_here(request, run_dir, rank, display, started)


def _launched(request: RunRequest, nproc: int, run_dir: RunDir, display: Display) -> RunEnd:
    """``--nproc-per-node``: torchrun's ranks, then the job's report merged here (on several
    nodes, the job's rank 0 merged it, on whichever node it ran)."""
    display.note(f"diagnose ▸ launching {nproc} ranks through torchrun into {run_dir.path}")
    code = launch_ranks(request, nproc, run_dir, quiet_stdout=display.json_out)
    if request.torchrun_options:
        if run_dir.report_path.is_file():
            display.report(run_dir.load_report())
        else:
            display.note(f"diagnose ▸ this node's ranks ended; the job's rank 0 writes the report into {run_dir.path}")
        return RunEnd(code)
    report = _analyse_and_show(run_dir, request, display, merge=True)
    return RunEnd(code, gated=report if code == errors.EXIT_OK else None)


def _run_here(
    request: RunRequest, run_dir: RunDir, rank: RankInfo | None, display: Display, started: float | None
) -> RunEnd:
    """The script in this process (the supervised child, or a rank), then its report; SIGINT and
    SIGTERM held from the script's end until report.json is saved."""
    hold = SignalHold()
    try:
        exchange = SummaryExchange(rank) if rank is not None else None
        try:
            record = run_script(
                request, run_dir, rank, quiet_stdout=display.json_out, signal_hold=hold, exchange=exchange
            )
        except DiagnoseError:
            display.note(f"run directory: {run_dir.path}")
            raise
        if rank is not None:  # every rank analyses its own trace; the merging one combines
            report = finish_rank(
                run_dir, rank, request.options, exchange, keep_traces=request.keep_traces, html=request.html
            )
            if report is not None and request.check:  # the merging rank: the job's report
                report = check_skipped(run_dir, report, DISTRIBUTED_CHECK_SKIPPED, html=request.html)
            if report is not None:
                _show(run_dir, report, request.html, display)
        else:
            report = _analyse_and_show(run_dir, request, display, started=started)
    finally:
        hold.release()
    if hold.received and record.status not in ("interrupted", "terminated"):  # held while the report was saved
        return RunEnd(
            128 + hold.received[0], closing=(f"diagnose: {signal_words(hold.received[0])}: the report was saved first",)
        )
    return _run_end(record, request.plan, report)


def _after_supervised(ending: Ending, run_dir: RunDir, request: RunRequest, display: Display) -> RunEnd:
    """The supervising parent, once the run's process ended: its exit code where it finished the
    run's files; else the record it left (or one made here) analysed, the report shown, and a
    line that says how the process ended."""
    import signal

    if ending.through_diagnose and ending.signal is None:  # the child said what happened itself
        late = ending.received[0] if ending.received and ending.code < 128 else None
        if late is not None:  # passed on too late for the child to hear it
            return RunEnd(
                128 + late, closing=(f"diagnose: {signal_words(late)} as diagnose was exiting: its work was done",)
            )
        return RunEnd(ending.code)
    record = settle_supervised_run(run_dir, request, ending)
    if record is not None and record.status == "crashed" and not record.trace_files:
        again = _rerun_before_crash(ending, run_dir, request, display)
        if again is not None:
            return again
    if record is None:  # the child wrote its report: its exit code, or the signal that came after it
        late = (
            ending.signal
            if ending.signal is not None
            else (ending.received[0] if ending.received and ending.code < 128 else None)
        )
        if late is not None and late in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            return RunEnd(128 + late, closing=(f"diagnose: {signal_words(late)}: the report was saved first",))
        return RunEnd(ending.code)
    unreported = record.status not in ("crashed", "interrupted", "terminated")
    if unreported:
        display.note(
            f"diagnose: {ending.describe().replace('script', 'run')} before its report was written; it is written now"
        )
    report = _analyse_and_show(run_dir, request, display)
    if unreported and ending.code:  # diagnose's own process failed: the exit says so
        return RunEnd(ending.code)
    if record.status == "crashed":
        return RunEnd(
            ending.code,
            closing=(f"diagnose: error: {ending.describe()}: what was measured until then is in the report",),
        )
    return _run_end(record, request.plan, report)


def _rerun_before_crash(ending: Ending, run_dir: RunDir, request: RunRequest, display: Display) -> RunEnd | None:
    """A process that died inside the profiled window (a segfault, SIGKILL, a C library's
    exit) took the window's trace with it: torch.profiler holds its events in the process's
    memory until the window ends. The script runs once more, supervised the same way, with a
    window that ends before the step it died in (a crash in the script comes again there), and
    that run's report says how the first ended. None: no second run (not a death inside the
    window, no step before it to profile, this is the second run already, ``--no-rerun``, or a
    whole-run watch); asked only where the window's trace was not written."""
    from diagnose import supervise

    steps = ending.steps
    before = steps.window_before() if steps is not None else None
    if before is None or steps is None or request.rerun_of is not None or not request.rerun_on_crash or request.watch:
        return None
    warmup, profiled = before
    first = (
        f"in a first run {ending.describe()} during step {steps.step}, inside its profiled window (steps "
        f"{steps.warmup}-{steps.window_end - 1}), and the window's trace with it: this report is of a second run, "
        f"which profiled steps {warmup}-{warmup + profiled - 1} (a window that ends before step {steps.step})"
    )
    display.note(
        f"diagnose ▸ {ending.describe()} during step {steps.step}, inside the profiled window: running it again, "
        f"profiling steps {warmup}-{warmup + profiled - 1} (--no-rerun: not again)"
    )
    plan = dataclasses.replace(request.plan, warmup=warmup, steps=profiled, max_steps=profiled, timed=0)
    rerun = dataclasses.replace(request, plan=plan, rerun_of=first, check=0)
    again = supervise.supervise()
    if again is None:  # the second run's process
        return _run_here(rerun, run_dir, None, display, None)
    return _after_supervised(again, run_dir, rerun, display)


def _analyse_and_show(
    run_dir: RunDir, request: RunRequest, display: Display, merge: bool = False, started: float | None = None
) -> Report:
    """Analyse, save and show; with ``merge`` (the ranks of --nproc-per-node have ended), the
    job's report from their summaries, the traces not worth keeping removed. A single run whose
    ranking names findings to measure measures them first (``--check``, ``check_and_save``),
    within the run's own time since ``started``; a distributed one says why it measures
    nothing (``check_skipped``)."""
    with shown_if_unsaved(display):
        if merge:
            report = merge_ranks(run_dir, request.options, html=request.html, keep_traces=request.keep_traces)
            if request.check:
                report = check_skipped(run_dir, report, DISTRIBUTED_CHECK_SKIPPED, html=request.html)
        else:
            report = analyze_and_save(run_dir, request.options, html=request.html)
            to_check = [item for item in (report.ranking.to_check if report.ranking else []) if item.knobs]
            if request.check and started is not None and to_check and report.status.state in ("stopped", "completed"):
                from diagnose.experiments import CHECK_BUDGET_FACTOR

                budget = (
                    request.check_budget_s
                    if request.check_budget_s is not None
                    else CHECK_BUDGET_FACTOR * (time.monotonic() - started)
                )
                say: Callable[[str], None] = (
                    (lambda _: None) if request.quiet else (lambda text: display.note(f"diagnose ▸ {text}"))
                )
                say(
                    f"{len(to_check)} finding(s) too unsure to rank on a prediction: measuring up to {request.check} (budget {budget:.0f} s; --no-check skips this)"
                )
                report = check_and_save(run_dir, request, report, budget, say)
    _show(run_dir, report, request.html, display)
    return report


def _show(run_dir: RunDir, report: Report, html: bool, display: Display) -> None:
    display.report(report)
    display.wrote_html(run_dir, html)
    display.run_directory(run_dir)


@contextlib.contextmanager
def shown_if_unsaved(display: Display) -> Iterator[None]:
    """A report analysed but not saved (a read-only or full run directory) is shown all the
    same; the error then says so: it is not lost."""
    try:
        yield
    except OutputError as exc:
        if exc.report is not None:
            display.report(exc.report)  # type: ignore[arg-type]  # a Report, kept by analyze_and_save
            exc.message = f"the report above could not be saved: {exc.message}"
        raise


def _run_end(record: RunRecord, plan: WindowPlan, report: Report | None) -> RunEnd:
    """The exit code a run's record says, with its last lines; the report is held against
    ``--fail-on`` only where the run ended well (the script's own failure keeps its own code)."""
    if record.status == "no_steps":
        return RunEnd(
            errors.EXIT_NO_STEPS,
            closing=(
                "diagnose: error: no training step was found: the script made no optimizer step, fetched no DataLoader batch and called no module",
            ),
        )
    if record.status in ("completed", "stopped"):
        closing: tuple[str, ...] = ()
        if (
            not record.profiled_steps and record.completed_steps() <= plan.warmup
        ):  # a plan cut to the script profiles a step
            closing = (
                f"diagnose: warning: the script ran only {record.completed_steps()} steps, "
                f"not more than --warmup {plan.warmup}: nothing was profiled (try --warmup 1 --steps 2)",
            )
        return RunEnd(errors.EXIT_OK, gated=report, closing=closing)
    closing = ()
    if record.status in ("interrupted", "terminated"):
        what = signal_words(record.exit_code - 128 if record.exit_code > 128 else 15)
        closing = (f"diagnose: {what}: what was measured until then is in the report",)
    return RunEnd(record.exit_code or errors.EXIT_SCRIPT_FAILED, closing=closing)


def signal_words(signum: int) -> str:
    """ "interrupted (Ctrl-C)", "terminated (SIGTERM)", "terminated (SIGHUP)"."""
    import signal

    return "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"


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
        record = RunRecord(
            target={"kind": kind, "value": value, "args": request.script_args, "cwd": os.getcwd()},
            command=list(sys.argv),
        )
        record.plan = dataclasses.asdict(request.plan)
    sig = (
        ending.signal if ending.signal is not None else (ending.code - 128 if ending.code in (130, 143, 129) else None)
    )
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
    _note_rerun(record, request)  # the second run died too
    steps = ending.steps  # what the child noted in memory shared with this process, to its last step
    if steps is not None and len(steps.boundaries) > len(record.boundaries_s):
        record.boundaries_s, record.step_mode = steps.boundaries, record.step_mode or steps.mode
        record.plan = {**record.plan, "warmup": steps.warmup, "steps": steps.window_end - steps.warmup}
        if steps.in_window and not record.trace_files:
            record.warnings.append(steps.window_lost())
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
    #: a second run after the first died inside its window: how the first ended (its record's note)
    rerun_of: str | None = None
    #: a process that dies inside the profiled window is run again, its window before that step
    rerun_on_crash: bool = True

    @property
    def name(self) -> str:
        return (Path(self.script).stem if self.script else (self.module or "run").rsplit(".", 1)[-1]) or "run"

    def target_argv(self) -> list[str]:
        if self.module:
            return ["-m", self.module, "--", *self.script_args]
        return [str(self.script), "--", *self.script_args]

    def rank_argv(self) -> list[str]:
        """The options every rank's ``diagnose run --rank-aware`` is started with."""
        argv = [
            *self.plan.to_argv(),
            "--quiet",
            *([] if self.lines else ["--no-lines"]),
            "--keep-traces",
            self.keep_traces,
        ]
        if self.watch is not None:
            from diagnose.runtime.whole import budget_argv

            argv += budget_argv(self.watch)
        return argv + [x for k in self.knob_assignments for x in ("--set", k)] + rules_argv(self.rules_dirs)


def open_run_dir(request: RunRequest, rank: RankInfo | None = None) -> RunDir:
    """The run directory, created before the script starts (once the script or module is
    found: a usage error leaves no folder behind); every rank shares one."""
    from diagnose.runtime.runner import resolve_target

    resolve_target(request.script, request.module, request.script_args)
    # the nodes of a multi-node job share one folder: none of them claims it alone
    return run_dir_for(request.name, request.out, request.overwrite, rank, shared=bool(request.torchrun_options))


def run_dir_for(name: str, out: Path | None, overwrite: bool, rank: RankInfo | None, shared: bool = False) -> RunDir:
    """A run's folder: ``out``, else ``runs/<name>-<time>/``, claimed by this process; a rank's
    is the job's one folder (``out``, else one every rank agrees on), where each rank writes its
    own names."""
    if rank is None:
        return RunDir.create_for(name, out, overwrite=overwrite, shared=shared)
    return RunDir.create(out or shared_location(name), overwrite=True)


def run_hooks(run_dir: RunDir, rank: int | None, lines: bool, exchange: SummaryExchange | None) -> list[Any]:
    """The runner hooks of every run, of a script or a block: line attribution (its workers'
    samples into the run directory) and, for a rank, the exchange of the ranks' summaries."""
    hooks: list[Any] = []
    if lines:
        from diagnose.runtime.line_attribution import LineAttribution

        hooks.append(LineAttribution(run_dir.workers_path(rank)))
    if exchange is not None:
        hooks.append(exchange)
    return hooks


def merges_here(rank: RankInfo | None) -> bool:
    """Whether this process analyses the run: a single process, or rank 0 when no parent
    ``diagnose run --nproc-per-node`` merges the ranks itself."""
    return rank is None or (rank.rank == 0 and not os.environ.get(PARENT_MERGES))


def run_script(
    request: RunRequest,
    run_dir: RunDir,
    rank: RankInfo | None = None,
    quiet_stdout: bool = False,
    signal_hold: SignalHold | None = None,
    exchange: SummaryExchange | None = None,
) -> RunRecord:
    """Run the script into ``run_dir``. A script that cannot start leaves a run directory that
    says why, then raises the usage error. With ``signal_hold``, SIGINT and SIGTERM stay held
    after the script ended, until the caller releases them (when the report is saved). With
    ``exchange`` (a rank), the job's process-group store is kept when the window closes."""
    from diagnose.progress import Progress
    from diagnose.runtime.runner import resolve_target, run_target

    try:
        target = resolve_target(request.script, request.module, request.script_args)
    except DiagnoseError as exc:
        kind = "module" if request.module else "script"
        save_not_run(
            run_dir,
            {"kind": kind, "value": request.module or request.script, "args": request.script_args},
            exc.message,
            request.options,
        )
        raise
    target.args = request.knobs.apply_to_args(target.args)
    rank_number = None if rank is None else rank.rank

    def before_hard_exit(record: RunRecord) -> None:  # os._exit or an exec ends the process: report now
        if rank is None:
            analyze_and_save(run_dir, request.options, html=request.html)
            how = record.warnings[-1] if record.warnings else "the script ended its process"
            print(f"diagnose: {how}; the report is in {run_dir.path}", file=sys.stderr)

    hooks = run_hooks(run_dir, rank_number, request.lines, exchange)
    if request.watch is not None:
        from diagnose.runtime.whole import LiveLine, WholeRun

        hooks.append(WholeRun(run_dir, rank_number, request.watch, LiveLine(enabled=not request.quiet)))
    with _stdout_to_stderr(quiet_stdout):
        record = run_target(
            target,
            request.plan,
            run_dir,
            rank=rank_number,
            knobs=request.knobs if request.knobs else None,
            progress=Progress(enabled=not request.quiet),
            extra_hooks=hooks,
            on_hard_exit=before_hard_exit,
            signal_hold=signal_hold,
        )
    if _note_rerun(record, request):
        run_dir.save_record(record, rank_number)
    return record


def _note_rerun(record: RunRecord, request: RunRequest) -> bool:
    """The second run after a death inside the window says first why it ran (``rerun_of``),
    whichever process finishes its record: the run's own, or the supervising parent's where it
    died too. Whether the note was added."""
    if request.rerun_of is None or request.rerun_of in record.warnings:
        return False
    record.warnings.insert(0, request.rerun_of)
    return True


def launch_ranks(request: RunRequest, nproc: int, run_dir: RunDir, quiet_stdout: bool = False) -> int:
    """``--nproc-per-node``: torchrun starts the ranks, each a rank-aware ``diagnose run`` into
    ``run_dir``; the caller then analyses them together. Returns torchrun's exit code."""
    from diagnose.distributed import launch

    return launch(
        nproc,
        run_dir.path,
        request.rank_argv(),
        request.target_argv(),
        quiet_stdout=quiet_stdout,
        torchrun_options=request.torchrun_options,
    )


# --- each rank's own analysis, and the job's view -------------------------------------------------

#: how long the merging rank waits for the others' summaries (they stop at the same step)
SUMMARY_TIMEOUT_S = 120.0


def finish_rank(
    run_dir: RunDir,
    rank: RankInfo,
    options: AnalysisOptions,
    exchange: SummaryExchange | None = None,
    keep_traces: str = "notable",
    html: bool = False,
    timeout_s: float = SUMMARY_TIMEOUT_S,
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
    # the lead rank's own trace, still in the run directory
    load = traced(lambda other: _analyse_from_dir(run_dir, other, options))
    report = combine_ranks(lead_of(analysis, summaries, load), summaries, options, source)
    assert report.distributed is not None  # a job's report always has its distributed section
    report.distributed.gathered = (
        "process group store"
        if exchange is not None and exchange.store is not None and len(gathered) == rank.world_size
        else "run directory"
    )
    keep_notable_traces(run_dir, report, keep_traces)
    return save_outputs(run_dir, report, html=html)


def merge_ranks(run_dir: RunDir, options: AnalysisOptions, html: bool = False, keep_traces: str = "notable") -> Report:
    """The job's report from a run directory whose ranks have all ended (``--nproc-per-node``:
    the launching process, once torchrun returned); then the traces not worth keeping go."""
    report = analyze_run(run_dir, options)
    if report.distributed is not None:
        report.distributed.gathered = "run directory"
        keep_notable_traces(run_dir, report, keep_traces)
    return save_outputs(run_dir, report, html=html)


KEEP_TRACES = ("notable", "all")


def keep_notable_traces(run_dir: RunDir, report: Report, keep: str) -> list[int]:
    """Remove the traces of the ranks not worth opening (``keep`` "notable"); the ranks whose
    traces went, also written into the report. Their summaries and own reports stay."""
    distributed = report.distributed
    notable = {int(r) for r in distributed.notable_ranks} if distributed else set()
    rows = distributed.ranks if distributed else []
    dropped = [] if keep == "all" else sorted(row.rank for row in rows if row.rank not in notable)
    # each removed trace is one of those ranks', named rank<R>_...: never None
    removed = {r for p in run_dir.remove_traces(dropped) if (r := rank_of_trace(p.name)) is not None}
    for row in rows:
        if row.rank in removed:
            row.trace = None
    if distributed is not None:
        distributed.traces_removed = sorted(removed)
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


# --- diagnose analyze ---------------------------------------------------------------------------


def analyze_path(
    path: Path, options: AnalysisOptions, display: Display, html: bool = False, out: Path | None = None
) -> Report:
    """``diagnose analyze``: a run directory re-analysed and its outputs saved into it; a folder
    of the user's own traces, or a bare trace, analysed and saved only into a new run directory
    (``out``, or one made with ``html``), never beside the user's files. Then shown."""
    path = RunDir.containing(path).path  # RUN/diagnose/report.json names its run directory
    saved_in = None
    with shown_if_unsaved(display):
        if path.is_dir() and RunDir(path).holds_run():
            saved_in = RunDir(path)
            report = analyze_and_save(saved_in, options, html=html)
        else:
            if path.is_dir():  # a folder of the user's own traces: never written into
                report, name = analyze_run(RunDir(path), options), path.resolve().name or "traces"
            else:
                report, name = analyze_trace(path, options), path.name.split(".")[0]
            if html or out is not None:
                saved_in = RunDir.create_for("analyze-" + name, out)
                save_outputs(saved_in, report, html=html, events=False)
                display.say(f"wrote {saved_in.report_path}")
        if saved_in is not None:
            display.wrote_html(saved_in, html)
    display.report(report)
    return report


# --- verify and sweep: their own report, over their runs -----------------------------------------


def experiment_dir(
    kind: str,
    script: str | None,
    module: str | None,
    out: Path | None,
    shared: bool,
    knobs: Sequence[str],
    rules_dirs: Sequence[Path],
) -> tuple[Any, RunDir]:
    """The checked target and verify's or sweep's folder (``shared``: a multi-node one, whose
    nodes all write into it), created only once the target, the knobs and the rule files are
    found good (a usage error leaves no folder behind)."""
    from diagnose.analysis.verdict.rules import load_rules
    from diagnose.runtime.knobs import Knobs
    from diagnose.runtime.runner import resolve_target

    target = resolve_target(script if not module else None, module, [])
    Knobs.parse(list(knobs))
    load_rules(list(rules_dirs))
    return target, RunDir.create_for(f"{kind}-{target.display_name}", out, overwrite=shared, shared=shared)


def verify_report(result: VerifyResult, base_report: dict[str, Any]) -> Report:
    """verify's report: the baseline's, with the experiments; a baseline that measured no
    steady state is the script's failure (exit 1)."""
    from diagnose.experiments import summarize_verify

    first = result.baseline.runs[0]
    if not base_report or first.status != "ok":
        raise DiagnoseError(
            f"the baseline run did not measure a steady state ({first.status}): {first.error}",
            hint=f"its run directory: {first.run_dir}; try diagnose run on the script first",
            exit_code=errors.EXIT_SCRIPT_FAILED,
        )
    report = Report.from_dict(base_report)
    report.experiments = convert(summarize_verify(result, base_report), Experiments)
    return report


def sweep_report(
    names: list[str], outcomes: list[Outcome], out_dir: RunDir, target: Any, target_args: list[str]
) -> Report:
    """sweep's report: its points side by side, their chart (``sweep.png``), the machine they
    ran on as their own reports recorded it."""
    from diagnose.experiments import plot_sweep, summarize_sweep

    summary = summarize_sweep(names, outcomes)
    plot = plot_sweep(summary, out_dir.plot_path)
    if plot is not None:
        summary["plot"] = plot.name
    return Report(
        source=convert({"kind": "sweep", "run_dir": str(out_dir.path)}, Source),
        status=convert(
            {
                "state": "sweep",
                "exit_code": errors.EXIT_OK if any(o.status == "ok" for o in outcomes) else errors.EXIT_SCRIPT_FAILED,
                "message": f"{len(outcomes)} runs of {target.value}",
                "error": None,
            },
            Status,
        ),
        run=convert({"target": {"kind": target.kind, "value": target.value, "args": target_args}}, RunInfo),
        # the machine the points ran on, as their own reports recorded it: the header names the device
        environment=_environment_of(outcomes),
        verdict=summary["conclusions"][0] if summary["conclusions"] else "no run of the sweep succeeded",
        experiments=convert(summary, Experiments),
    )


def _environment_of(outcomes: list[Outcome]) -> dict[str, Any]:
    """The environment recorded by the first of the sweep's runs that left a report."""
    for outcome in outcomes:
        if not outcome.run_dir:
            continue
        try:
            environment = RunDir(Path(outcome.run_dir)).load_report().environment
        except (DiagnoseError, OSError, ValueError):
            continue
        if environment:
            return dict(environment)
    return {}


def save_experiments(out_dir: RunDir, report: Report, html: bool, display: Display) -> Report:
    """verify's or sweep's report saved (no events of its own), shown, and its runs side by side
    in TensorBoard (``comparison_events``)."""
    save_outputs(out_dir, report, html=html, events=False)
    display.report(report)
    display.wrote_html(out_dir, html)
    _experiment_events(out_dir, display)
    display.note(f"run directory: {out_dir.path}")
    return report


def _experiment_events(out_dir: RunDir, display: Display) -> None:
    """A verify or sweep parent's runs side by side in TensorBoard: an event file of the
    comparison of its child runs (each child has its own). Skipped without tensorboard, or with
    fewer than two runs that left a report."""
    from diagnose.analysis.compare import compare_reports

    try:
        from diagnose.renderers.comparison_events import write_comparison_events

        runs = unique_labels(
            [(label, RunDir(child).load_report()) for label, child in experiment_children(out_dir.path)]
        )
        write_comparison_events(compare_reports(runs), out_dir.events_folder)
    except ImportError:
        return
    except (DiagnoseError, ValueError, OSError) as exc:
        display.note(f"diagnose: note: no comparison events in {out_dir.path}: {getattr(exc, 'message', exc)}")


# --- a block of the caller's own code (diagnose.profile) ------------------------------------------


@dataclass
class BlockOutcome:
    """A profiled block's run directory; its record and report once the block has ended."""

    run_dir: RunDir
    record: RunRecord | None = None
    report: Report | None = None


@contextlib.contextmanager
def profiled_block(
    name: str,
    plan: WindowPlan,
    options: AnalysisOptions,
    *,
    knobs: Sequence[str] = (),
    lines: bool = False,
    html: bool = False,
    quiet: bool = True,
    out: Path | None = None,
    overwrite: bool = False,
    rank: RankInfo | None = None,
    keep_traces: str = "notable",
) -> Iterator[BlockOutcome]:
    """``diagnose.profile``'s run: the block profiled in this process into its run directory (a
    rank's: the job's shared one), then analysed and saved as a script's run is (``rank``: its
    own report, and on the merging rank the job's; the other ranks' ``report`` is their own)."""
    from diagnose.progress import Progress
    from diagnose.runtime.block import BlockRun
    from diagnose.runtime.knobs import Knobs

    parsed = Knobs.parse(list(knobs))
    run_dir = run_dir_for(name, out, overwrite, rank)
    rank_number = rank.rank if rank is not None else None
    exchange = SummaryExchange(rank) if rank is not None else None
    block = BlockRun(
        name,
        plan,
        run_dir,
        knobs=parsed if parsed else None,
        progress=Progress(enabled=not quiet),
        extra_hooks=run_hooks(run_dir, rank_number, lines, exchange),
        rank=rank_number,
    )
    outcome = BlockOutcome(run_dir)
    try:
        with block:
            yield outcome
    finally:
        outcome.record = block.record
        if rank is None:
            outcome.report = analyze_and_save(run_dir, options, html=html)
        else:
            merged = finish_rank(run_dir, rank, options, exchange, keep_traces=keep_traces, html=html)
            own = run_dir.rank_report_path(rank.rank)
            outcome.report = merged if merged is not None else (Report.load(own) if own.is_file() else None)


# --- the runs a verify or sweep folder holds ---------------------------------------------------------


def experiment_children(path: Path) -> list[tuple[str, Path]]:
    """A verify or sweep directory's child runs (label, folder) that left a report; empty for
    anything else. Its report.json lists them in order; without one, the sub-folders by name."""
    import json

    if not path.is_dir():
        return []
    parent = RunDir(path)
    found: list[tuple[str, Path]] = []
    if parent.report_path.is_file():
        with contextlib.suppress(OSError, ValueError):
            experiments = json.loads(parent.report_path.read_text()).get("experiments") or {}
            for row in experiments.get("rows") or []:
                child = Path(str(row.get("run_dir") or ""))
                child = child if child.is_absolute() else path / child.name
                if not child.is_dir():
                    child = path / child.name  # the parent folder was moved since
                if RunDir(child).report_path.is_file():
                    found.append((str(row.get("label") or child.name), child))
        if found or parent.record_path().is_file() or parent.traces():
            return found
    if parent.record_path().is_file() or parent.ranks():
        return []
    return [
        (child.name, child)
        for child in sorted(path.iterdir())
        if child.is_dir() and RunDir(child).report_path.is_file()
    ]


def unique_labels(runs: list[tuple[str, Report]]) -> list[tuple[str, Report]]:
    """Labels made distinct ("baseline-1", "baseline-1 (2)"): the columns are told apart by them."""
    seen: dict[str, int] = {}
    out = []
    for label, report in runs:
        seen[label] = seen.get(label, 0) + 1
        out.append((label if seen[label] == 1 else f"{label} ({seen[label]})", report))
    return out


# --- analysing and comparing runs (diagnose.analyze, load_runs, compare; diagnose compare) -------


def analysis_options(rules: Sequence[PathLike] = (), show_all: bool = False) -> AnalysisOptions:
    from diagnose.analysis.pipeline import AnalysisOptions

    return AnalysisOptions.load([Path(r) for r in rules], show_all=show_all)


def report_of(
    path: PathLike, *, rules: Sequence[PathLike] = (), show_all: bool = False, reanalyze: bool = False
) -> Report:
    """The report of a run directory or a trace. A run directory's saved report.json is read
    as is, unless ``reanalyze`` (or extra ``rules``, or ``show_all``) asks for a fresh analysis."""
    from diagnose.errors import UsageError
    from diagnose.rundir import RunDir

    path = Path(path)
    if path.is_dir():
        run_dir = RunDir(path)
        if run_dir.report_path.is_file() and not (reanalyze or rules or show_all):
            return run_dir.load_report()
        return analyze_run(run_dir, analysis_options(rules, show_all))
    if not path.is_file():
        raise UsageError(f"no such run directory or trace: {path}")
    if path.name.endswith(".json") and not path.name.endswith(".trace.json") and _is_report_file(path):
        from diagnose.report import Report

        return Report.load(path)
    from diagnose.analysis.pipeline import analyze_trace

    return analyze_trace(path, analysis_options(rules, show_all))


def _is_report_file(path: Path) -> bool:
    """A saved report.json (its first bytes name the report schema), not a trace."""
    with path.open("rb") as stream:
        return b'"diagnose.report/' in stream.read(200)


def labelled_runs(
    path: PathLike, *, rules: Sequence[PathLike] = (), show_all: bool = False
) -> list[tuple[str, Report]]:
    """The labelled runs a path holds: a verify or sweep directory's child runs in its own order
    (labelled as the experiment labelled them), else the one run or trace."""
    path = Path(path)
    children = experiment_children(path)
    if children:
        return [(label, report_of(child, rules=rules, show_all=show_all)) for label, child in children]
    return [(_label(path), report_of(path, rules=rules, show_all=show_all))]


def _label(path: Path) -> str:
    from diagnose.rundir import RunDir

    if path.is_file() and RunDir.containing(path).path != path:  # RUN/diagnose/report.json is RUN
        return RunDir.containing(path).path.resolve().name
    name = path.name
    for suffix in (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def compare_runs(*runs: RunLike, labels: Sequence[str] | None = None, rules: Sequence[PathLike] = ()) -> Comparison:
    """Compare runs, the first being the baseline. Each run is a path (a verify or sweep
    directory gives all its runs), a ``Report``, or a ``(label, Report)`` pair."""
    from diagnose.analysis.compare import compare_reports
    from diagnose.report import Report

    labelled: list[tuple[str, Report]] = []
    for i, run in enumerate(runs):
        if isinstance(run, Report):
            labelled.append((f"run {i + 1}", run))
        elif isinstance(run, tuple):
            labelled.append(run)
        else:
            labelled.extend(labelled_runs(run, rules=rules))
    if labels is not None:
        if len(labels) != len(labelled):
            raise ValueError(f"{len(labels)} labels for {len(labelled)} runs")
        labelled = [(label, report) for label, (_, report) in zip(labels, labelled, strict=True)]
    from diagnose.renderers.notebook import for_notebook

    return for_notebook(compare_reports(unique_labels(labelled)))  # shown as HTML in Jupyter


def compare_paths(paths: Sequence[Path], rules_dirs: Sequence[Path], html: Path | None, display: Display) -> Any:
    """``diagnose compare``: the runs side by side, the page written whole to ``html`` when
    asked, the comparison shown; returns the comparison (its reports for the gate)."""
    try:
        comparison = compare_runs(*paths, rules=rules_dirs)
    except ValueError as exc:  # fewer than two runs
        raise UsageError(str(exc), hint="give two run directories or more, or one verify or sweep directory") from None
    if html is not None:
        from diagnose.renderers.comparison import render_comparison
        from diagnose.rundir import write_file_whole

        # whole or not at all: a full disk leaves no cut page
        write_file_whole(html, render_comparison(comparison, "html").encode("utf-8"))
        display.say(f"wrote {html}")
    display.comparison(comparison)
    return comparison
