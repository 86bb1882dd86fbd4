"""The command line: argument parsing and exit codes, over ``session`` (the one orchestration
of a run: profile, analyse, save, render).

Each command parses its options into a request, calls ``session`` with a ``Display`` (what it
shows on the terminal) and turns what comes back into an exit code. Errors are not handled
here: a ``DiagnoseError`` or memory running out ends the command through ``errors.Failure``
(``cliparse.Command``: one line, a hint, the exit code; docs/failures.md).

Why one module: every command's options are declared here, one Typer option per line (most of
its length); the commands share the gate, the request and the display, and hold no logic.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from diagnose import errors
from diagnose.cliparse import Command, ScriptCommand
from diagnose.display import Display
from diagnose.errors import Failure
from diagnose.progress import ExperimentProgress
from diagnose.version import __version__

if TYPE_CHECKING:
    from diagnose.report import Report

#: when this process began: ``diagnose run``'s check may take the run's own time again, counted from here
_PROCESS_STARTED = time.monotonic()

app = typer.Typer(
    name="diagnose",
    help="Why is this PyTorch training job slow? Profile it, break each step down, and say what to change.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion and --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

#: run, verify and sweep: ScriptCommand sorts the words (diagnose's options anywhere before --,
#: the script's after the script or after --); click then sees options, --, script and its words
RUN_CONTEXT = {"allow_interspersed_args": False, "ignore_unknown_options": True}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"diagnose {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """diagnose: a profiling-driven bottleneck doctor for PyTorch training."""


#: the CI gate's options, shared by run, analyze and compare (docs/ci.md)
_FAIL_ON_HELP = (
    "Exit 6 when this holds{which}: a rule id, category:NAME, any, throughput<N, throughput<baseline-5% (docs/ci.md)."
)
FAIL_ON_OPTION = typer.Option(None, "--fail-on", metavar="CONDITION", help=_FAIL_ON_HELP.format(which=""))
FAIL_ON_LATER_RUN_OPTION = typer.Option(
    None, "--fail-on", metavar="CONDITION", help=_FAIL_ON_HELP.format(which=" for a run after the first")
)
BASELINE_OPTION = typer.Option(
    None,
    "--baseline",
    metavar="RUN_DIR",
    help="The run directory (or report.json) that throughput<baseline compares with.",
)


@app.command(cls=ScriptCommand, context_settings=RUN_CONTEXT)
def run(
    script: str | None = typer.Argument(
        None, metavar="SCRIPT", help="The training script, run as `python SCRIPT ARGS` would."
    ),
    args: list[str] | None = typer.Argument(
        None,
        metavar="SCRIPT_ARGS",
        help="The script's own arguments: after --, or after SCRIPT when diagnose has no option of that name.",
    ),
    module: str | None = typer.Option(
        None, "-m", "--module", metavar="MODULE", help="Run a module as `python -m MODULE` would."
    ),
    warmup: int = typer.Option(
        5,
        "--warmup",
        min=1,
        metavar="N",
        help="Steps to skip before profiling (compilation, caches, cuDNN autotuning).",
    ),
    steps: int = typer.Option(10, "--steps", min=1, metavar="N", help="Steps to profile."),
    max_steps: int | None = typer.Option(
        None,
        "--max-steps",
        min=1,
        metavar="N",
        help="Profile up to N steps while step times vary widely (p90 over 1.5x the median); default 3x --steps, --max-steps equal to --steps keeps the window fixed.",
    ),
    timed_steps: int = typer.Option(
        20, "--timed-steps", min=1, metavar="N", help="Steps timed after the window with the profiler off."
    ),
    no_stop: bool = typer.Option(False, "--no-stop", help="Let the script run to its end after measuring."),
    out: Path | None = typer.Option(
        None, "--out", "-o", metavar="DIR", help="Run directory (default runs/<script>-<time>/)."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Reuse a non-empty --out directory."),
    json_out: bool = typer.Option(
        False, "--json", help="Print report.json to stdout (the script's output goes to stderr)."
    ),
    html: bool = typer.Option(False, "--html", help="Also write a self-contained report.html."),
    show_all: bool = typer.Option(False, "--all", help="Show every finding that fired, not only the top ones."),
    rules_dirs: list[Path] | None = typer.Option(
        None, "--rules", metavar="DIR", help="A folder (or file) of extra rule files."
    ),
    knob: list[str] | None = typer.Option(
        None,
        "--set",
        metavar="KNOB=VALUE",
        help="A what-if change, e.g. --set num_workers=4 (diagnose knobs lists them).",
    ),
    no_lines: bool = typer.Option(
        False, "--no-lines", help="No line attribution (sync sites, sampled hot lines, DataLoader workers)."
    ),
    nproc_per_node: int | None = typer.Option(
        None,
        "--nproc-per-node",
        min=1,
        metavar="N",
        help="Launch N ranks through torchrun (DDP); each profiles itself.",
    ),
    rank_aware: bool = typer.Option(
        False, "--rank-aware", help="Under torchrun or srun: profile this rank into a shared run directory."
    ),
    keep_traces: str = typer.Option(
        "notable",
        "--keep-traces",
        metavar="WHICH",
        help="Ranks whose traces stay: notable (the first, slowest, straggler, outliers) or all.",
    ),
    nnodes: str | None = typer.Option(
        None,
        "--nnodes",
        metavar="N|MIN:MAX",
        help="With --nproc-per-node: nodes of a multi-node torchrun (with --rdzv-*).",
    ),
    node_rank: int | None = typer.Option(
        None, "--node-rank", min=0, metavar="N", help="With --nproc-per-node: this node's rank (static rendezvous)."
    ),
    rdzv_backend: str | None = typer.Option(
        None, "--rdzv-backend", metavar="NAME", help="torchrun's rendezvous backend (c10d), multi-node."
    ),
    rdzv_endpoint: str | None = typer.Option(
        None, "--rdzv-endpoint", metavar="HOST:PORT", help="torchrun's rendezvous endpoint, multi-node."
    ),
    rdzv_id: str | None = typer.Option(
        None, "--rdzv-id", metavar="ID", help="torchrun's rendezvous (job) id, multi-node."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress line."),
    color: bool | None = typer.Option(
        None, "--color/--no-color", help="Colour the terminal report (default: when stdout is a terminal)."
    ),
    fail_on: list[str] | None = FAIL_ON_OPTION,
    baseline: Path | None = BASELINE_OPTION,
    whole: bool = typer.Option(
        False,
        "--whole",
        hidden=True,
        help="diagnose watch: record the whole run (the ranks of watch --nproc-per-node get it).",
    ),
    window_every: float = typer.Option(600.0, "--window-every", hidden=True, min=0.0),
    window_steps: int = typer.Option(3, "--window-steps", hidden=True, min=1),
    max_windows: int = typer.Option(12, "--max-windows", hidden=True, min=0),
    window_budget: float = typer.Option(0.01, "--window-budget", hidden=True, min=0.0, max=1.0),
    gpu_samples: bool = typer.Option(True, "--gpu-samples/--no-gpu-samples", hidden=True),
    check: int = typer.Option(
        2,
        "--check",
        min=0,
        metavar="N",
        help="Measure up to N unsure findings by a short A/B afterwards (fresh runs with their knobs), within the run's own time again.",
    ),
    no_check: bool = typer.Option(False, "--no-check", help="Never measure: rank on the predictions alone."),
    check_budget: float | None = typer.Option(
        None,
        "--check-budget",
        min=0,
        metavar="SECONDS",
        help="The time the check may take (default: the run's own time again).",
    ),
    no_rerun: bool = typer.Option(
        False,
        "--no-rerun",
        help="A process that dies inside the profiled window (a segfault) is not run again with a window before that step.",
    ),
) -> None:
    """Run a training script under the profiler, break each step down, and diagnose it.

    diagnose's options go before or after SCRIPT; everything after -- is the script's.
    """
    from diagnose import session
    from diagnose.analysis.pipeline import AnalysisOptions
    from diagnose.distributed import rank_info
    from diagnose.record import GROWTH_FACTOR, WindowPlan
    from diagnose.runtime.knobs import LAUNCH_KNOBS, Knobs

    script_args = list(args or [])
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    if module and script:
        script_args = [script, *script_args]
        script = None
    gate = _gate(fail_on, baseline, rules_dirs)  # a bad condition fails before the script runs
    rank = rank_info()
    if rank_aware and rank is None:
        raise errors.UsageError(
            "--rank-aware needs the variables torchrun or srun set (RANK, WORLD_SIZE)",
            hint="use --nproc-per-node N to launch through torchrun",
        )
    # a world of one is a plain run, unless --rank-aware says otherwise: a sweep's
    # nproc_per_node=1 is one torchrun rank whose launching parent holds the run directory
    rank = rank if rank is not None and (rank.world_size > 1 or rank_aware) else None
    torchrun_options = _torchrun_options(nnodes, node_rank, rdzv_backend, rdzv_endpoint, rdzv_id)
    knobs = Knobs.parse(knob or [])
    if knobs.nproc_per_node() is not None and rank is None:  # the launch's knob (a sweep of it): as --nproc-per-node
        nproc_per_node = knobs.nproc_per_node()
        if not nproc_per_node:
            raise errors.UsageError("nproc_per_node takes a positive number of ranks")
    if torchrun_options and not nproc_per_node:
        raise errors.UsageError(
            "--nnodes, --node-rank and --rdzv-* go with --nproc-per-node",
            hint="under your own torchrun, give them to torchrun",
        )
    if torchrun_options and out is None:
        raise errors.UsageError("a multi-node run needs --out DIR on a file system every node shares")
    if keep_traces not in session.KEEP_TRACES:
        raise errors.UsageError(f"--keep-traces takes {' or '.join(session.KEEP_TRACES)}, not {keep_traces}")
    request = session.RunRequest(
        script=script,
        module=module,
        script_args=script_args,
        knobs=knobs,
        options=AnalysisOptions.load(
            rules_dirs or (), show_all=show_all
        ),  # a bad rule file fails before the script runs
        plan=WindowPlan(
            warmup=warmup,
            steps=steps,
            timed=timed_steps,
            stop=not no_stop,
            max_steps=GROWTH_FACTOR * steps if max_steps is None else max_steps,
        ),
        out=out,
        overwrite=overwrite,
        html=html,
        lines=not no_lines,
        quiet=quiet,
        knob_assignments=[k for k in knob or [] if k.partition("=")[0].strip() not in LAUNCH_KNOBS],
        rules_dirs=tuple(rules_dirs or ()),
        keep_traces=keep_traces,
        torchrun_options=torchrun_options,
        check=0 if no_check else check,
        check_budget_s=check_budget,
        watch=_watch_budget(whole, window_every, window_steps, max_windows, window_budget, gpu_samples),
        rerun_on_crash=not no_rerun,
    )
    # the check's budget is the run's own time again, from this process's start
    end = session.run(request, Display(json_out=json_out, color=color), nproc_per_node, rank, started=_PROCESS_STARTED)
    if end.gated is not None:
        _apply_gate(gate, [end.gated])
    for line in end.closing:
        typer.echo(line, err=True)
    raise typer.Exit(end.exit_code)


def _torchrun_options(
    nnodes: str | None,
    node_rank: int | None,
    rdzv_backend: str | None,
    rdzv_endpoint: str | None,
    rdzv_id: str | None,
) -> list[str]:
    """run's, verify's and sweep's multi-node options, as torchrun takes them (``--nnodes=2``)."""
    given = (
        ("--nnodes", nnodes),
        ("--node-rank", node_rank),
        ("--rdzv-backend", rdzv_backend),
        ("--rdzv-endpoint", rdzv_endpoint),
        ("--rdzv-id", rdzv_id),
    )
    return [f"{name}={value}" for name, value in given if value is not None]


def _launch(nproc_per_node: int | None, torchrun_options: list[str], out: Path | None):
    """verify's and sweep's launch: every experiment a torchrun job of ``nproc_per_node`` ranks
    (on each node, with the multi-node options)."""
    from diagnose.experiments import Launch

    if torchrun_options and not nproc_per_node:
        raise errors.UsageError("--nnodes, --node-rank and --rdzv-* go with --nproc-per-node")
    if torchrun_options and out is None:
        raise errors.UsageError(
            "a multi-node verify or sweep needs --out DIR on a file system every node shares",
            hint="run the same command on every node",
        )
    return Launch(nproc_per_node, tuple(torchrun_options))


#: verify's and sweep's launch options (run's own are declared on run)
def _nproc_option() -> int | None:
    return typer.Option(
        None,
        "--nproc-per-node",
        min=1,
        metavar="N",
        help="Each experiment launches N ranks through torchrun and is compared by the job's samples/s.",
    )


def _nnodes_option() -> str | None:
    return typer.Option(
        None,
        "--nnodes",
        metavar="N|MIN:MAX",
        help="With --nproc-per-node: nodes of a multi-node torchrun; run the same command on every node.",
    )


def _node_rank_option() -> int | None:
    return typer.Option(
        None, "--node-rank", min=0, metavar="N", help="With --nproc-per-node: this node's rank (static rendezvous)."
    )


def _rdzv_backend_option() -> str | None:
    return typer.Option(
        None, "--rdzv-backend", metavar="NAME", help="torchrun's rendezvous backend (c10d), multi-node."
    )


def _rdzv_endpoint_option() -> str | None:
    return typer.Option(
        None, "--rdzv-endpoint", metavar="HOST:PORT", help="torchrun's rendezvous endpoint, multi-node."
    )


def _rdzv_id_option() -> str | None:
    return typer.Option(
        None, "--rdzv-id", metavar="ID", help="torchrun's rendezvous id, multi-node (each experiment appends its name)."
    )


def _watch_budget(whole: bool, every: float, steps: int, windows: int, cost_share: float, gpu_samples: bool = True):
    if not whole:
        return None
    from diagnose.runtime.whole import WatchBudget

    return WatchBudget(
        period_s=every, window_steps=steps, max_windows=windows, max_cost_share=cost_share, gpu_samples=gpu_samples
    )


@app.command(cls=ScriptCommand, context_settings=RUN_CONTEXT)
def watch(
    script: str | None = typer.Argument(
        None, metavar="SCRIPT", help="The training script, run as `python SCRIPT ARGS` would, to its end."
    ),
    args: list[str] | None = typer.Argument(
        None,
        metavar="SCRIPT_ARGS",
        help="The script's own arguments: after --, or after SCRIPT when diagnose has no option of that name.",
    ),
    module: str | None = typer.Option(
        None, "-m", "--module", metavar="MODULE", help="Run a module as `python -m MODULE` would."
    ),
    warmup: int = typer.Option(5, "--warmup", min=1, metavar="N", help="Steps before the main profiled window."),
    steps: int = typer.Option(10, "--steps", min=1, metavar="N", help="Steps to profile in the main window."),
    window_every: float = typer.Option(
        600.0,
        "--window-every",
        min=0.0,
        metavar="SECONDS",
        help="Profile a short window every SECONDS of wall-clock (0: none); slow steps get one too.",
    ),
    window_steps: int = typer.Option(3, "--window-steps", min=1, metavar="N", help="Steps in each later window."),
    max_windows: int = typer.Option(
        12, "--max-windows", min=0, metavar="N", help="Later windows at most (their traces: 256 MB at most)."
    ),
    window_budget: float = typer.Option(
        0.01,
        "--window-budget",
        min=0.0,
        max=1.0,
        metavar="SHARE",
        help="The later windows' time stays under this share of the wall-clock so far.",
    ),
    no_gpu_samples: bool = typer.Option(
        False,
        "--no-gpu-samples",
        help="Do not read the GPU's memory and utilisation (NVML) twice a second: the live line and the memory-creep finding go without them.",
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", metavar="DIR", help="Run directory (default runs/<script>-<time>/)."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Reuse a non-empty --out directory."),
    json_out: bool = typer.Option(
        False, "--json", help="Print report.json to stdout (the script's output goes to stderr)."
    ),
    html: bool = typer.Option(
        False, "--html", help="Also write a self-contained report.html (with the whole-run timeline)."
    ),
    show_all: bool = typer.Option(False, "--all", help="Show every finding that fired, not only the top ones."),
    rules_dirs: list[Path] | None = typer.Option(
        None, "--rules", metavar="DIR", help="A folder (or file) of extra rule files."
    ),
    no_lines: bool = typer.Option(False, "--no-lines", help="No line attribution in the main window."),
    nproc_per_node: int | None = typer.Option(
        None,
        "--nproc-per-node",
        min=1,
        metavar="N",
        help="Launch N ranks through torchrun; each watches itself, the report gives the job's goodput.",
    ),
    rank_aware: bool = typer.Option(
        False, "--rank-aware", help="Under torchrun or srun: watch this rank into a shared run directory."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress line and no live line."),
    color: bool | None = typer.Option(
        None, "--color/--no-color", help="Colour the terminal report (default: when stdout is a terminal)."
    ),
) -> None:
    """Run a training script to its end and account for its whole wall-clock.

    Start-up, compilation, data start-up per epoch, training steps, evaluation, checkpoints,
    teardown: each one's time and share (goodput is the training steps' share), the shifts that
    cost time (with their fix), ranked with the findings of a profiled window. docs/watch.md.
    """
    run(
        script=script,
        args=args,
        module=module,
        warmup=warmup,
        steps=steps,
        max_steps=None,
        timed_steps=20,
        no_stop=True,
        out=out,
        overwrite=overwrite,
        json_out=json_out,
        html=html,
        show_all=show_all,
        rules_dirs=rules_dirs,
        knob=None,
        no_lines=no_lines,
        nproc_per_node=nproc_per_node,
        rank_aware=rank_aware,
        keep_traces="notable",
        nnodes=None,
        node_rank=None,
        rdzv_backend=None,
        rdzv_endpoint=None,
        rdzv_id=None,
        quiet=quiet,
        color=color,
        fail_on=None,
        baseline=None,
        whole=True,
        window_every=window_every,
        window_steps=window_steps,
        max_windows=max_windows,
        window_budget=window_budget,
        gpu_samples=not no_gpu_samples,
        check=0,
        no_check=True,
        check_budget=None,  # a whole run is not run again for an A/B
    )


def _renamed(given: bool, old: str, new: str, why: str) -> bool:
    """An option's old name still works, with a warning that names the new one (and ``why``)."""
    if given:
        typer.echo(f"diagnose: warning: {old} is now {new} ({why}); the old name will go", err=True)
    return given


# --- the CI gate (docs/ci.md) -------------------------------------------------------------------


@dataclass
class _Gate:
    conditions: list  # of analysis.gate.Condition
    baseline: Report | None = None  # when --baseline was given


def _gate(
    fail_on: list[str] | None,
    baseline: Path | None,
    rules_dirs: list[Path] | None,
    first_run_is_baseline: bool = False,
) -> _Gate:
    """The parsed ``--fail-on`` conditions (rule ids and categories checked against the rules,
    built-in and ``--rules``) and the ``--baseline`` report, checked before any work (``compare``
    takes its first run as the baseline)."""
    from diagnose.analysis.gate import parse_condition, resolve_names

    conditions = [parse_condition(text) for text in fail_on or []]
    if any(c.kind in ("rule", "category") for c in conditions):
        from diagnose.analysis.verdict.rules import load_rules

        conditions = resolve_names(conditions, load_rules(list(rules_dirs or [])))
    base = None
    if baseline is not None:
        from diagnose.api import analyze as load_report

        base = load_report(baseline)
    elif any(c.needs_baseline for c in conditions) and not first_run_is_baseline:
        raise errors.UsageError("--fail-on throughput<baseline needs --baseline RUN_DIR")
    return _Gate(conditions, base)


def _apply_gate(gate: _Gate, reports: list, baseline=None) -> None:
    """Exit 6 (one line per condition that held) when a --fail-on condition holds for a report."""
    from diagnose.analysis.gate import check

    if not gate.conditions:
        return
    failures = []
    for report in reports:
        failures += check(report, gate.conditions, baseline if baseline is not None else gate.baseline)
    for line in failures:
        typer.echo(f"diagnose: fail-on: {line}", err=True)
    if failures:
        raise typer.Exit(errors.EXIT_GATE)


@app.command(cls=Command)
def analyze(
    path: Path = typer.Argument(
        ...,
        metavar="PATH",
        help="A run directory (or its report.json), or a trace written by torch.profiler (.json or .json.gz).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    html: bool = typer.Option(
        False,
        "--html",
        help="Also write report.html (into the run directory; for a bare trace or a folder of traces, into a new one).",
    ),
    show_all: bool = typer.Option(False, "--all", help="Show every finding that fired."),
    rules_dirs: list[Path] | None = typer.Option(
        None, "--rules", metavar="DIR", help="A folder (or file) of extra rule files."
    ),
    max_trace_gb: float | None = typer.Option(
        None,
        "--max-trace-gb",
        metavar="GB",
        help="Refuse traces whose JSON is larger than this (default: any size the memory available allows).",
    ),
    per_step: bool = typer.Option(False, "--per-step", help="Also print the breakdown of every step."),
    old_steps: bool = typer.Option(False, "--steps", hidden=True, help="The old name of --per-step."),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        metavar="DIR",
        help="For a bare trace or a folder of traces: save report.json (and --html) in this new folder.",
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="Nothing on stderr but errors and warnings (no 'wrote ...' lines)."
    ),
    color: bool | None = typer.Option(None, "--color/--no-color", help="Colour the terminal report."),
    fail_on: list[str] | None = FAIL_ON_OPTION,
    baseline: Path | None = BASELINE_OPTION,
) -> None:
    """Re-analyse a saved run directory, or analyse a bare trace, without running anything."""
    from diagnose import session
    from diagnose.analysis.pipeline import AnalysisOptions

    per_step = per_step or _renamed(
        old_steps, "analyze --steps", "--per-step", "--steps counts the profiled steps in run, verify and sweep"
    )
    gate = _gate(fail_on, baseline, rules_dirs)
    if max_trace_gb is not None and not (math.isfinite(max_trace_gb) and max_trace_gb > 0):
        raise errors.UsageError(
            f"--max-trace-gb takes a size in GB above 0, not {max_trace_gb}", hint="--max-trace-gb 2"
        )
    options = AnalysisOptions.load(
        rules_dirs or (), show_all=show_all, max_trace_bytes=None if max_trace_gb is None else int(max_trace_gb * 1e9)
    )
    display = Display(json_out=json_out, color=color, quiet=quiet, show_steps=per_step)
    report = session.analyze_path(path, options, display, html=html, out=out)
    _apply_gate(gate, [report])


@app.command(cls=Command)
def report(
    run_dir: Path = typer.Argument(
        ..., metavar="RUN_DIR", help="A run directory with report.json (or that report.json itself)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print report.json."),
    html: bool = typer.Option(False, "--html", help="Write report.html into the run directory."),
    per_step: bool = typer.Option(False, "--per-step", help="Also print the breakdown of every step."),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="Nothing on stderr but errors and warnings (no 'wrote ...' lines)."
    ),
    color: bool | None = typer.Option(None, "--color/--no-color", help="Colour the terminal report."),
) -> None:
    """Show a saved report again (no re-analysis), or write its HTML."""
    from diagnose.rundir import RunDir
    from diagnose.session import write_html

    display = Display(json_out=json_out, color=color, quiet=quiet, show_steps=per_step)
    saved_run = RunDir.containing(run_dir)  # RUN/diagnose/report.json names its run directory
    saved = saved_run.load_report()
    if html:
        display.say(f"wrote {write_html(saved_run, saved)}")
        return
    display.report(saved)


@app.command(cls=Command)
def compare(
    paths: list[Path] = typer.Argument(
        ...,
        metavar="PATHS...",
        help="Run directories, verify or sweep directories (their runs), traces or report.json files; the first run is the baseline.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    html: Path | None = typer.Option(
        None, "--html", metavar="FILE", help="Also write the comparison as a self-contained HTML page to this file."
    ),
    rules_dirs: list[Path] | None = typer.Option(
        None, "--rules", metavar="DIR", help="Re-analyse every run with these extra rule files."
    ),
    fail_on: list[str] | None = FAIL_ON_LATER_RUN_OPTION,
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="Nothing on stderr but errors and warnings (no 'wrote ...' lines)."
    ),
    color: bool | None = typer.Option(None, "--color/--no-color", help="Colour the terminal output."),
) -> None:
    """Compare runs side by side: throughput, where the step time went, the findings that came and went, and how the bottleneck moved."""
    from diagnose import session

    gate = _gate(fail_on, None, rules_dirs, first_run_is_baseline=True)
    display = Display(json_out=json_out, color=color, quiet=quiet)
    comparison = session.compare_paths(paths, rules_dirs or [], html, display)
    _apply_gate(gate, list(comparison.reports[1:]), baseline=comparison.reports[0])


def _script_args(script: str | None, args: list[str] | None, module: str | None) -> list[str]:
    """The script (or ``-m module``) and its arguments, as ``diagnose run`` takes them."""
    rest = list(args or [])
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if module:
        return ["-m", module, *([script] if script else []), *(["--"] if rest or script else []), *rest]
    if not script:
        raise errors.UsageError("give a script to run, or -m MODULE")
    return [script, "--", *rest]


@app.command(cls=ScriptCommand, context_settings=RUN_CONTEXT)
def verify(
    script: str | None = typer.Argument(None, metavar="SCRIPT", help="The training script."),
    args: list[str] | None = typer.Argument(None, metavar="SCRIPT_ARGS", help="The script's own arguments (after --)."),
    module: str | None = typer.Option(
        None, "-m", "--module", metavar="MODULE", help="Run a module as `python -m MODULE` would."
    ),
    top: int = typer.Option(3, "--top", min=1, metavar="N", help="How many of the top recommendations to try."),
    only_rules: list[str] | None = typer.Option(
        None,
        "--rule",
        metavar="RULE",
        help="Try only this rule's finding (repeatable), wherever it ranks: --rule DIST008.",
    ),
    repeats: int = typer.Option(
        2, "--repeats", min=1, metavar="N", help="Baseline runs, to measure the run-to-run spread."
    ),
    warmup: int = typer.Option(5, "--warmup", min=1, metavar="N", help="Warm-up steps of every run."),
    steps: int = typer.Option(5, "--steps", min=1, metavar="N", help="Steps to profile in every run."),
    timed_steps: int = typer.Option(20, "--timed-steps", min=1, metavar="N", help="Timed steps of every run."),
    knob: list[str] | None = typer.Option(
        None, "--set", metavar="KNOB=VALUE", help="A change applied to every run, baseline included."
    ),
    rules_dirs: list[Path] | None = typer.Option(
        None, "--rules", metavar="DIR", help="A folder (or file) of extra rule files."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", metavar="DIR", help="Folder for the runs (default runs/verify-<script>-<time>/)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report (with the experiments) as JSON."),
    html: bool = typer.Option(False, "--html", help="Also write report.html."),
    timeout: float = typer.Option(1800, "--timeout", metavar="SECONDS", help="Seconds one run may take."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines."),
    color: bool | None = typer.Option(None, "--color/--no-color", help="Colour the terminal report."),
    nproc_per_node: int | None = _nproc_option(),
    nnodes: str | None = _nnodes_option(),
    node_rank: int | None = _node_rank_option(),
    rdzv_backend: str | None = _rdzv_backend_option(),
    rdzv_endpoint: str | None = _rdzv_endpoint_option(),
    rdzv_id: str | None = _rdzv_id_option(),
) -> None:
    """Diagnose, then measure what each top recommendation really buys, one at a time and combined."""
    from diagnose import session
    from diagnose.experiments import verify as run_verify
    from diagnose.record import WindowPlan

    launch = _launch(nproc_per_node, _torchrun_options(nnodes, node_rank, rdzv_backend, rdzv_endpoint, rdzv_id), out)
    target_args = _script_args(script, args, module)
    _, out_dir = session.experiment_dir("verify", script, module, out, launch.multi_node, knob or [], rules_dirs or [])
    progress = ExperimentProgress(enabled=not (quiet or json_out))
    result, base_report = run_verify(
        target_args,
        out_dir,
        WindowPlan(warmup=warmup, steps=steps, timed=timed_steps),
        top=top,
        repeats=repeats,
        base_knobs=list(knob or []),
        timeout=timeout,
        options=session.rules_argv(rules_dirs or []),
        launch=launch,
        rules=[r.upper() for r in only_rules or []],
        **_progress_callbacks(progress),
    )
    progress.done()
    session.save_experiments(
        out_dir, session.verify_report(result, base_report), html, Display(json_out=json_out, color=color)
    )


@app.command(cls=ScriptCommand, context_settings=RUN_CONTEXT)
def sweep(
    script: str | None = typer.Argument(None, metavar="SCRIPT", help="The training script."),
    args: list[str] | None = typer.Argument(None, metavar="SCRIPT_ARGS", help="The script's own arguments (after --)."),
    module: str | None = typer.Option(
        None, "-m", "--module", metavar="MODULE", help="Run a module as `python -m MODULE` would."
    ),
    knob: list[str] = typer.Option(
        ...,
        "--set",
        metavar="KNOB=V1,V2,...",
        help="A knob and its values, e.g. --set num_workers=0,2,4,8 (one or two).",
    ),
    fixed: list[str] | None = typer.Option(
        None, "--with", metavar="KNOB=VALUE", help="A change applied to every point, e.g. --with autocast=bf16."
    ),
    warmup: int = typer.Option(5, "--warmup", min=1, metavar="N", help="Warm-up steps of every run."),
    steps: int = typer.Option(5, "--steps", min=1, metavar="N", help="Steps to profile in every run."),
    timed_steps: int = typer.Option(20, "--timed-steps", min=1, metavar="N", help="Timed steps of every run."),
    out: Path | None = typer.Option(
        None, "--out", "-o", metavar="DIR", help="Folder for the runs (default runs/sweep-<script>-<time>/)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report (with the sweep) as JSON."),
    html: bool = typer.Option(False, "--html", help="Also write report.html with the sweep charts."),
    timeout: float = typer.Option(1800, "--timeout", metavar="SECONDS", help="Seconds one run may take."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines."),
    color: bool | None = typer.Option(None, "--color/--no-color", help="Colour the terminal report."),
    nproc_per_node: int | None = _nproc_option(),
    nnodes: str | None = _nnodes_option(),
    node_rank: int | None = _node_rank_option(),
    rdzv_backend: str | None = _rdzv_backend_option(),
    rdzv_endpoint: str | None = _rdzv_endpoint_option(),
    rdzv_id: str | None = _rdzv_id_option(),
) -> None:
    """Run the script once per value of a knob (or a pair of knobs): throughput, GPU busy, memory."""
    from diagnose import session
    from diagnose.experiments import parse_sweep
    from diagnose.experiments import sweep as run_sweep
    from diagnose.record import WindowPlan

    names, specs = parse_sweep(knob)
    launch = _launch(nproc_per_node, _torchrun_options(nnodes, node_rank, rdzv_backend, rdzv_endpoint, rdzv_id), out)
    target_args = _script_args(script, args, module)
    target, out_dir = session.experiment_dir("sweep", script, module, out, launch.multi_node, fixed or [], [])
    plan = WindowPlan(warmup=warmup, steps=steps, timed=timed_steps)
    progress = ExperimentProgress(enabled=not (quiet or json_out))
    outcomes = run_sweep(
        target_args,
        out_dir,
        plan,
        specs,
        base_knobs=list(fixed or []),
        timeout=timeout,
        launch=launch,
        **_progress_callbacks(progress),
    )
    progress.done()
    session.save_experiments(
        out_dir,
        session.sweep_report(names, outcomes, out_dir, target, target_args),
        html,
        Display(json_out=json_out, color=color),
    )
    if not any(o.status == "ok" for o in outcomes):
        raise typer.Exit(errors.EXIT_SCRIPT_FAILED)


def _progress_callbacks(progress: ExperimentProgress) -> dict:
    """verify's and sweep's progress: a line per experiment; on a terminal, each child run's own
    progress drawn in place under it."""
    return {"on_progress": progress.experiment, "on_child_line": progress.child if progress.shows_children else None}


@app.command(cls=Command)
def trim(
    trace: Path = typer.Argument(
        ..., metavar="TRACE", help="A torch.profiler trace (.json or .json.gz), or a run directory with one trace."
    ),
    out: Path = typer.Argument(
        ..., metavar="OUT", help="Where to write the trimmed trace (.json, or .json.gz to compress it)."
    ),
    keep: int = typer.Option(3, "--keep", min=1, metavar="N", help="How many steps to keep."),
    skip: int = typer.Option(1, "--skip", min=0, metavar="N", help="How many steps to leave out before them."),
    old_steps: int | None = typer.Option(None, "--steps", min=1, hidden=True, help="The old name of --keep."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUT if it exists."),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="Nothing on stderr but errors and warnings (no 'wrote ...' lines)."
    ),
) -> None:
    """Cut a trace to a few steps and the events the analysis reads (to share it, or as a test fixture)."""
    from diagnose.analysis.trace.trim import trim_file

    if _renamed(
        old_steps is not None, "trim --steps", "--keep", "--steps counts the profiled steps in run, verify and sweep"
    ):
        keep = old_steps or keep
    source = _one_trace(trace)
    _check_output_file(out, source, overwrite)
    written = trim_file(source, out, steps=keep, skip=skip)
    Display(quiet=quiet).say(f"wrote {written} ({written.stat().st_size / 1e3:.0f} KB)")


def _one_trace(path: Path) -> Path:
    """A trace file as given, or the one trace of a run directory (or of a folder of traces)."""
    from diagnose.rundir import RunDir

    if not path.is_dir():
        return path
    found = RunDir(path).traces()
    if len(found) == 1:
        return found[0]
    if not found:
        raise errors.UsageError(
            f"{path} holds no trace (.pt.trace.json or .pt.trace.json.gz)", hint="give the trace file itself"
        )
    raise errors.UsageError(
        f"{path} holds {len(found)} traces: {', '.join(p.name for p in found)}", hint="give the one to trim"
    )


def _check_output_file(out: Path, source: Path, overwrite: bool) -> None:
    """Refuse, before any work, an output that would replace the input, an existing file
    without --overwrite, or a folder that cannot take it."""
    if out.exists() and source.exists() and out.resolve() == source.resolve():
        raise errors.UsageError(
            f"OUT is TRACE itself ({out}): trimming would replace the trace it reads",
            hint="write the trimmed trace to another file",
        )
    if out.is_dir():
        raise errors.OutputError(f"{out} is a folder", hint="give the file to write, e.g. trimmed.pt.trace.json.gz")
    if out.exists() and not overwrite:
        raise errors.OutputError(f"{out} already exists", hint="choose another name, or pass --overwrite to replace it")
    folder = out.parent
    if not folder.is_dir():
        raise errors.OutputError(
            f"cannot write {out}: the folder {folder} does not exist", hint="create it first, or choose another path"
        )
    if not os.access(folder, os.W_OK):
        raise errors.OutputError(
            f"cannot write {out}: the folder {folder} is not writable", hint="choose a writable folder"
        )


@app.command(name="knobs", cls=Command)
def knobs_command(
    json_out: bool = typer.Option(False, "--json", help="Print the knobs as JSON (name, kind, help)."),
) -> None:
    """List the knobs that --set, verify and sweep can change without editing the script."""
    from diagnose.runtime.knobs import KNOB_SPECS, KNOBS_HEADERS, knob_rows

    if json_out:
        import orjson

        knobs = [{"name": spec.name, "kind": spec.kind, "help": spec.help} for spec in KNOB_SPECS.values()]
        knobs.append(
            {"name": "arg.<flag>", "kind": "text", "help": "a flag of the script itself, e.g. arg.batch_size=64"}
        )
        knobs.append(
            {
                "name": "env.<NAME>",
                "kind": "text",
                "help": "an environment variable set before the script starts, e.g. env.DP_SHARD=2",
            }
        )
        sys.stdout.write(orjson.dumps(knobs, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    sys.stdout.write(_text_table(KNOBS_HEADERS, knob_rows(), wrap=("values",)))


@app.command(name="rules", cls=Command)
def rules_command(
    rules_dirs: list[Path] | None = typer.Option(
        None, "--rules", metavar="DIR", help="Also load the rule files of this folder."
    ),
    symptoms: bool = typer.Option(False, "--symptoms", help="List the symptoms rules can test, with units."),
    markdown: bool = typer.Option(False, "--markdown", help="Print docs/rules.md (generated from the rule files)."),
    json_out: bool = typer.Option(False, "--json", help="Print the rules (or with --symptoms, the symptoms) as JSON."),
) -> None:
    """List the rules (built-in and your own)."""
    from diagnose.analysis.symptoms import CATALOG
    from diagnose.analysis.verdict.rules import load_rules
    from diagnose.analysis.verdict.rulesdoc import (
        RULES_HEADERS,
        SYMPTOMS_HEADERS,
        rules_markdown,
        rules_rows,
        symptoms_rows,
    )

    loaded = load_rules(list(rules_dirs or []))
    if json_out:
        import orjson

        if symptoms:
            rows: list[dict] = [
                {"name": name, "unit": unit, "description": text} for name, (unit, text) in sorted(CATALOG.items())
            ]
        else:
            rows = [
                {
                    "id": r.id,
                    "kind": r.kind,
                    "category": r.category,
                    "title": r.title,
                    "builtin": r.builtin,
                    "source": str(r.source),
                    "when": {
                        "all": [c.text for c in r.all_of],
                        "any": [c.text for c in r.any_of],
                        "none": [c.text for c in r.none_of],
                    },
                    "gain": r.gain_text,
                    "evidence": list(r.evidence),
                    "knobs": r.knobs,
                    "supersedes": list(r.supersedes),
                    "predict": r.predict,
                    # the words, and the kinds of run that get other words (first match wins)
                    "says": r.says,
                    "do": r.do,
                    "why": r.why,
                    "do_by_framework": dict(r.do_by_framework),
                    "on_cpu": dict(r.on_cpu),
                    "already": {"when": [c.text for c in r.already_when], "texts": dict(r.already_texts)},
                    "words": [
                        {
                            "name": w.name,
                            "when": [c.text for c in w.when],
                            "texts": dict(w.texts),
                            "already": dict(w.already),
                        }
                        for w in r.words
                    ],
                }
                for r in loaded
            ]
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif markdown:
        sys.stdout.write(rules_markdown(loaded))
    elif symptoms:
        sys.stdout.write(_text_table(SYMPTOMS_HEADERS, symptoms_rows()))
    else:
        sys.stdout.write(_text_table(RULES_HEADERS, rules_rows(loaded)))


def _text_table(headers: tuple[str, ...], rows: list[list[str]], wrap: tuple[str, ...] = ()) -> str:
    """A listing at the terminal's width (COLUMNS): its last column (and those named in ``wrap``)
    is prose, wrapped between words; piped output is not wrapped."""
    from diagnose.renderers.fit import Column, text_table
    from diagnose.renderers.terminal import ConsoleSettings

    columns = [Column(h, wrap=h in wrap or h == headers[-1]) for h in headers]
    return text_table(columns, rows, ConsoleSettings.detect(False, sys.stdout).width)


def main() -> None:
    from diagnose import supervise

    supervise.enable()  # the command line (never an in-process caller) runs a script supervised
    try:
        failure = None
        try:
            app()
        except (Exception, KeyboardInterrupt) as exc:  # outside a command (parsing, an import): as errors.Failure says
            failure = Failure.of(exc)
            if failure is None:  # not the user's to read: a bug, its traceback is the report
                raise
        if failure is not None:  # out of the except clause: what the traceback held is released
            for line in failure.lines:
                typer.echo(line, err=True)
            sys.exit(failure.exit_code)
    except SystemExit as exc:
        # Typer turns Ctrl-C into a silent exit 130: say what happened
        if _raised_by_interrupt(exc):
            typer.echo("diagnose: interrupted", err=True)
        supervise.end_process(exc.code)  # whatever the script left running, and a late Ctrl-C: the exit code says it


def _raised_by_interrupt(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


if __name__ == "__main__":
    main()
