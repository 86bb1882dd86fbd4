"""What-if experiments: ``diagnose verify`` and ``diagnose sweep``.

Contract: ``run_experiment(spec, ...) -> Outcome`` runs the script once, in a fresh process,
under ``diagnose run --set ...``; ``verify(...)`` and ``sweep(...)`` compose such runs, and
``summarize_verify`` / ``summarize_sweep`` turn outcomes into the ``experiments`` section of a
report (schema in diagnose/report.py). The bookkeeping (spread, "no effect", speedups, OOM,
compile break-even) is pure and tested without running anything.

The statistic is the report's steady figure: the mean over the timed steps (profiler off), as
samples per second where every run knows it (a batch-size change alters the work per step), else
steps per second, with the p10-p90 of those steps (``mean_step_ms``, ``p10_step_ms``,
``p90_step_ms``). A run of a script too short for the timed steps is no failure: it has its
profiled window's figures, and where any run has only those, every run is compared by its
profiled window (``align_basis``: like with like, each row saying which it is); a run without
the figures of that basis is shown, never compared, and never the best. A change whose speedup lies inside the baseline's own spread of that statistic
is called "no effect": half the range of the baseline repeats' means, or, with one repeat, half
the p10-p90 range of its timed steps over its mean step (``Baseline.spread``, ``spread_from``).

Each outcome says how its knobs reached the script (``via``, from the run's ``run.json``): the
framework's own switch (``TrainingArguments(bf16=True)``, ``Trainer(precision="bf16-mixed")``)
or the global way (``global torch.autocast``, a ``DataLoader`` default).

Distributed (``Launch``: ``--nproc-per-node`` and torchrun's multi-node options): each experiment
is a whole torchrun job, and the compared figure is the job's samples/s (its ranks' steady
samples/s added up, ``distributed.job_samples_per_s``), not one rank's. Across nodes every node
runs the same verify or sweep into a shared ``--out``; each experiment gets its own rendezvous
id (``<id>-<label>``), and a node whose ranks do not merge waits for the job's report.

Why one module (about 900 lines): the experiments' running (child processes, launches,
timeouts) and their bookkeeping (spread, basis, verdicts) share one value, ``Outcome``, and one
vocabulary of statistics; the bookkeeping half is pure and tested without running anything.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from diagnose.analysis.measure.categories import STEP_MODE_LABELS
from diagnose.analysis.verdict.findings import Measurement
from diagnose.errors import UsageError
from diagnose.progress import PREFIX as PROGRESS_PREFIX
from diagnose.record import WindowPlan, is_accumulation_dest, is_batch_dest
from diagnose.report import Report
from diagnose.rundir import RunDir
from diagnose.runtime.knobs import NOT_APPLIED, Knobs, option_key, split_assignment
from diagnose.supervise import Finished, run_bounded

#: A change smaller than this is "no effect" even when the baseline's spread is smaller still.
MIN_EFFECT = 0.02


@dataclass
class Spec:
    """One experiment: a label and the knobs (``name=value``) it sets."""

    label: str
    knobs: dict[str, str] = field(default_factory=dict)
    rule: str | None = None


#: an outcome's figures of one basis: its rates and step times
FIGURES = ("steps_per_s", "samples_per_s", "mean_step_ms", "p10_step_ms", "p90_step_ms", "mean_spread")


@dataclass
class Outcome:
    label: str
    knobs: dict[str, str]
    status: str  # ok, oom, failed, no_steps
    run_dir: str
    #: the figures the run measured: ``steady`` (the timed steps, profiler off) and ``profiled``
    #: (the profiled window), each as the report's throughput keeps them (None: not measured)
    figures: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    #: which of them the rates below are: "steady" or "profiled" (None: neither is there)
    basis: str | None = None
    rule: str | None = None
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    #: the timed steps' mean step and its p10-p90 (the report's steady figure)
    mean_step_ms: float | None = None
    p10_step_ms: float | None = None
    p90_step_ms: float | None = None
    #: how far the mean of the timed steps moves between blocks of them (report.mean_spread)
    mean_spread: float | None = None
    gpu_busy: float | None = None
    peak_reserved_bytes: int | None = None
    top_exposed: dict[str, Any] | None = None
    top_finding: str | None = None
    startup_s: float | None = None
    exit_code: int = 0
    error: str | None = None
    speedup: float | None = None
    verdict: str | None = None  # "helped", "no effect", "slower", "failed", "oom"
    #: knob -> how it reached the script (run.json's ``knobs_via``)
    via: dict[str, str] = field(default_factory=dict)
    #: its speedup compares both sides' steady steps without those at an epoch's turn (it changes
    #: the batch, and the steady figures of one side or the other kept turns: ``judge``)
    without_turns: bool = False
    #: what its steps were counted by (run.json's ``step_mode``: optimizer steps, DataLoader
    #: batches or model calls): a run whose steps are another kind than the baseline's is not compared
    step_mode: str | None = None

    def rate(self, by_samples: bool) -> float | None:
        return self.samples_per_s if by_samples else self.steps_per_s

    def turn_free_rate(self, by_samples: bool) -> float | None:
        """The steady rate without the timed steps at an epoch's turn (the report's
        ``throughput.turn_free``, else its steady figures, which then kept none); None where the
        rates compared are not the steady ones."""
        if self.basis != "steady":
            return None
        figures = self.figures.get("turn_free") or self.figures.get("steady") or {}
        value = figures.get("samples_per_s" if by_samples else "steps_per_s")
        return float(value) if value else None

    def __post_init__(self) -> None:
        if not self.figures and (self.steps_per_s or self.samples_per_s):  # built from its rates alone: steady ones
            self.figures = {"steady": {name: getattr(self, name) for name in FIGURES}, "profiled": None}

    def use(self, basis: str) -> None:
        """Take the rates and step times of ``basis`` ("steady" or "profiled"); without its
        figures the run has no rate: it is shown, not compared."""
        figures = self.figures.get(basis) or {}
        self.basis = basis if figures.get("steps_per_s") or figures.get("samples_per_s") else None
        for name in FIGURES:
            setattr(self, name, figures.get(name) if self.basis else None)


# --- running ----------------------------------------------------------------------------------


#: options passed to every ``diagnose run`` of an experiment (e.g. ``--rules DIR``)
RunOptions = list[str]

#: how long a node whose ranks do not merge waits for the job's report (the merging rank waits
#: up to two minutes for the summaries, then analyses)
REPORT_WAIT_S = 300.0


@dataclass(frozen=True)
class Launch:
    """How each experiment's ``diagnose run`` launches its ranks: ``nproc_per_node`` through
    torchrun, and torchrun's multi-node options (``--nnodes=2``, ``--rdzv-endpoint=...``)."""

    nproc_per_node: int | None = None
    torchrun_options: tuple[str, ...] = ()

    @property
    def multi_node(self) -> bool:
        return bool(self.torchrun_options)

    def argv(self, name: str) -> list[str]:
        """The ``diagnose run`` options of the experiment ``name``: each gets its own rendezvous
        id, so that the nodes meet in the same experiment and never in an earlier one's."""
        if not self.nproc_per_node:
            return []
        out = ["--nproc-per-node", str(self.nproc_per_node)]
        options = dict(option.split("=", 1) for option in self.torchrun_options)
        if self.multi_node and options.get("--rdzv-backend", "static") != "static":
            options["--rdzv-id"] = f"{options.get('--rdzv-id', 'diagnose')}-{_slug(name)}"
        for name, value in options.items():
            out += [name, value]
        return out


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in ".-_" else "_" for c in label)[:60]


def _command(
    script: list[str],
    spec: Spec,
    run_dir: RunDir,
    plan: WindowPlan,
    base_knobs: list[str],
    options: RunOptions,
    launch: Launch | None = None,
    quiet: bool = True,
) -> list[str]:
    # --no-check: an experiment is one measurement; it measures nothing of its own (--no-rerun:
    # nor a second run of a process that died in its window: its timed steps are what it is for)
    cmd = [
        sys.executable,
        "-m",
        "diagnose",
        "run",
        *(["--quiet"] if quiet else []),
        "--json",
        "--overwrite",
        "--no-check",
        "--no-rerun",
        "--out",
        str(run_dir.path),
        *options,
    ]
    cmd += (launch or Launch()).argv(run_dir.path.name)  # the experiment's folder: unique in its verify or sweep
    cmd += plan.to_argv()
    for assignment in [*base_knobs, *(f"{k}={v}" for k, v in spec.knobs.items())]:
        cmd += ["--set", assignment]
    return cmd + script


def run_experiment(
    script: list[str],
    spec: Spec,
    run_dir: RunDir,
    plan: WindowPlan,
    base_knobs: list[str] | None = None,
    timeout: float | None = None,
    options: RunOptions | None = None,
    launch: Launch | None = None,
    on_child_line: Callable[[str], None] | None = None,
) -> Outcome:
    """Run once under ``diagnose run`` (a whole torchrun job with ``launch``) in a fresh process
    and read its report. With ``on_child_line``, the run's progress lines are passed to it as
    they come."""
    cmd = _command(script, spec, run_dir, plan, base_knobs or [], options or [], launch, quiet=on_child_line is None)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    started = time.time()
    # stopped politely past its time (its report is saved), with the processes its script started;
    # its progress lines drawn as they come where the caller draws them
    finished = _run_in_session(cmd, env, timeout, on_child_line)
    stdout, stderr, returncode = finished.stdout, finished.stderr, finished.returncode
    report: dict[str, Any] = {}
    if stdout.strip():
        try:
            report = json.loads(stdout)
        except ValueError:
            report = {}
    if not report and launch is not None and launch.multi_node:
        report = wait_for_report(run_dir, started, REPORT_WAIT_S)  # another node's rank 0 merges
    outcome = outcome_from_report(spec, report, run_dir.path, returncode, stderr)
    if finished.timed_out:
        timed_out(outcome, timeout or 0.0, bool(report))
    return outcome


#: a run stopped at its time limit is still judged on its timed steps when it measured this many
MIN_PARTIAL_STEPS = 3


def timed_out(outcome: Outcome, timeout: float, reported: bool) -> Outcome:
    """An experiment stopped at its time limit, in place: judged on the timed steps (profiler
    off) it measured before it was stopped where there are ``MIN_PARTIAL_STEPS`` of them, and
    said so; failed otherwise. On the outside corpus a batch 64x larger was stopped at the check's
    20 s budget after 4 timed steps of 457 ms, and the finding was left unmeasured."""
    steady = outcome.figures.get("steady") or {}
    steps = int(steady.get("steps") or 0)
    if outcome.status == "ok" and outcome.basis == "steady" and steps >= MIN_PARTIAL_STEPS:
        outcome.error = f"timed out after {timeout:.0f} s: judged on the {steps} timed steps it measured before"
        return outcome
    outcome.status = "failed"
    outcome.error = f"timed out after {timeout:.0f} s" + (" (what it measured is in its report)" if reported else "")
    return outcome


def _run_in_session(
    cmd: list[str], env: dict[str, str], timeout: float | None, on_line: Callable[[str], None] | None = None
) -> Finished:
    """``run_bounded``: ``cmd`` in its own session, its whole process group (a torchrun job's
    ranks with it, and whatever its script started) stopped politely past ``timeout``, on a
    Ctrl-C (which no longer reaches it) or a SIGTERM to verify or sweep, then killed. With
    ``on_line``, the child's progress lines go to it as they come, not into its stderr."""

    def keep(line: str) -> bool:
        if on_line is not None and line.startswith(PROGRESS_PREFIX):
            on_line(line[len(PROGRESS_PREFIX) :].strip())
            return False
        return True

    main = threading.current_thread() is threading.main_thread()
    # SIGTERM to verify or sweep would otherwise end it alone, its job running on in its session
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main else None
    try:
        return run_bounded(cmd, timeout, env, on_stderr_line=keep if on_line is not None else None)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def wait_for_report(run_dir: RunDir, since: float, timeout_s: float, poll_s: float = 1.0) -> dict[str, Any]:
    """The job's report once the merging rank (on another node) has written it: a report.json
    newer than ``since``; {} when none came within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        path = run_dir.report_path
        try:
            if path.is_file() and path.stat().st_mtime >= since:
                return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass  # being written: read again
        if time.monotonic() >= deadline:
            return {}
        time.sleep(poll_s)


def outcome_from_report(spec: Spec, report: dict[str, Any], run_dir: Path, exit_code: int, stderr: str = "") -> Outcome:
    state = (report.get("status") or {}).get("state")
    throughput = report.get("throughput") or {}
    figures = {
        basis: throughput.get(basis) if (throughput.get(basis) or {}).get("steps_per_s") else None for basis in BASES
    }
    job = (report.get("distributed") or {}).get("job_samples_per_s")
    if figures["steady"] and not job and (throughput.get("turn_free") or {}).get("steps_per_s"):
        # a run of another batch is compared by these (a torchrun job has no turn-free figure of
        # the whole job: its steady one, the job's samples/s, stands)
        figures["turn_free"] = throughput["turn_free"]
    if job and figures["steady"]:
        # a torchrun job: the job's samples/s (every rank's added up), not the lead rank's own
        figures["steady"] = {**figures["steady"], "samples_per_s": job}
    if not report:
        status = "failed"
    elif state == "oom":
        status = "oom"
    elif any(figures.values()):
        # measured: the timed steps, or the profiled window of a script too short for them (or
        # one that ended after its window): its figures, labelled, never "failed"
        status = "ok"
    elif state == "no_steps":
        status = "no_steps"
    else:
        status = "failed"
    out = Outcome(spec.label, spec.knobs, status, str(run_dir), rule=spec.rule, exit_code=exit_code, figures=figures)
    if status != "ok" or state not in ("stopped", "completed"):
        error = (report.get("status") or {}).get("message") or stderr.strip().splitlines()[-1:] or ["no report"]
        out.error = error if isinstance(error, str) else error[0]
        note = throughput.get("note")
        if status == "failed" and state in ("stopped", "completed") and note:
            # the script ran fine but ended before any measured step: say so, not just "failed"
            out.error = f"{out.error}, before the timed window ({note})"
    out.use("steady" if figures["steady"] else "profiled")
    parsed = Report.from_dict(report)  # schema 2 keeps the window's shares among the symptoms
    out.gpu_busy = parsed.gpu_busy_share()
    shares = parsed.exposed_shares()
    if shares:
        category, share = max(shares.items(), key=lambda kv: kv[1])
        out.top_exposed = {"category": category, "share": share}
    memory = report.get("memory") or {}
    out.peak_reserved_bytes = memory.get("peak_reserved_bytes")
    findings = report.get("findings") or []
    out.top_finding = findings[0]["rule"] if findings else None
    out.startup_s = (report.get("run") or {}).get("startup_s")
    out.step_mode = (report.get("run") or {}).get("step_mode")
    out.via = knobs_via(run_dir)
    return out


def knobs_via(run_dir: Path) -> dict[str, str]:
    """How each knob of a run reached the script, from its run.json (empty if unreadable)."""
    rd = RunDir(Path(run_dir))
    ranks = rd.ranks()  # a torchrun job: its first rank's record (every rank applies the same knobs)
    try:
        record = json.loads(rd.record_path(min(ranks) if ranks else None).read_text())  # RunDir knows the layouts
    except (OSError, ValueError):
        return {}
    via = record.get("knobs_via") if isinstance(record, dict) else None
    return {str(k): str(v) for k, v in via.items()} if isinstance(via, dict) else {}


def describe_change(knobs: dict[str, str], via: dict[str, str]) -> str:
    """``autocast=bf16 via Trainer(precision="bf16-mixed")``: each knob and the way it went."""
    return " ".join(f"{k}={v}" + (f" via {via[k]}" if via.get(k) else "") for k, v in knobs.items())


# --- bookkeeping ------------------------------------------------------------------------------

#: the figures a run may have: its timed steps (profiler off), its profiled window
BASES = ("steady", "profiled")

#: what every rate, speedup and spread of verify and sweep is computed on (their tables say it)
STATISTIC = "mean of the timed steps with the profiler off, and their p10-p90"
STATISTICS = {
    "steady": STATISTIC,
    "profiled": "mean of the profiled steps (profiler on: host-heavy steps read slower), and their p10-p90: "
    "a run too short for the timed steps has only these, so every run is compared by them",
}


def align_basis(outcomes: list[Outcome]) -> str:
    """Compare like with like: the timed steps where every measured run has them, else every
    run's profiled window. Sets each measured run's rates to that basis (a run without it has
    none: shown, not compared); returns the basis."""
    measured = [o for o in outcomes if o.status == "ok"]
    basis = "steady" if all(o.figures.get("steady") for o in measured) else "profiled"
    for o in measured:
        o.use(basis)
    return basis


@dataclass
class Baseline:
    runs: list[Outcome]
    by_samples: bool
    #: the least spread a change must beat where one run of the script measured the baseline but
    #: a rerun may move its step more than that run's own blocks say (the diagnosis's
    #: ``ranking.rerun_spread``: verify with one baseline run, the check without a second one);
    #: 0: the baseline's own spread alone
    rerun_floor: float = 0.0

    @property
    def ok(self) -> list[Outcome]:
        return [r for r in self.runs if r.status == "ok" and r.rate(self.by_samples)]

    @property
    def rate(self) -> float | None:
        rates = [rate for r in self.ok if (rate := r.rate(self.by_samples)) is not None]
        return statistics.mean(rates) if rates else None

    @property
    def step_modes(self) -> frozenset[str]:
        """What the measured runs counted their steps by (``Outcome.step_mode``)."""
        return frozenset(r.step_mode for r in self.ok if r.step_mode)

    @property
    def turn_free_rate(self) -> float | None:
        """The runs' mean rate without their steps at an epoch's turn (``Outcome.turn_free_rate``);
        None unless every run has one."""
        rates = [rate for r in self.ok if (rate := r.turn_free_rate(self.by_samples))]
        return statistics.mean(rates) if rates and len(rates) == len(self.ok) else None

    @property
    def spread_from(self) -> str | None:
        """Where the spread comes from: "repeats" (two or more baseline runs), "blocks" (one run:
        how far the mean of its timed steps moves between three blocks of them), "steps" (one run
        whose report did not say that: its timed steps' p10-p90), "rerun" (one run, judged by how
        far a rerun may move the step, ``rerun_floor``, where that is wider), None (neither known)."""
        ok = self.ok
        if len(ok) >= 2:
            return "repeats"
        own = self._one_run_spread()
        if len(ok) == 1 and self.rerun_floor > (own[1] if own else 0.0):
            return "rerun"
        return own[0] if own else None

    def _one_run_spread(self) -> tuple[str, float] | None:
        """One measured run's own spread and where it comes from: its blocks' ("blocks"), else
        its steps' p10-p90 ("steps"); None with another number of runs or neither known."""
        if len(self.ok) != 1:
            return None
        run = self.ok[0]
        if run.mean_spread is not None:
            return "blocks", run.mean_spread
        steps = _step_spread(run)
        return ("steps", steps) if steps is not None else None

    @property
    def spread(self) -> float:
        """The baseline's relative half-width in the compared statistic: half the range of the
        repeats' means over their mean; with one repeat, half the range of the means of three
        blocks of its timed steps over their mean (half its steps' p10-p90 over its mean step,
        from a report that does not carry that); 0 when neither is known."""
        source = self.spread_from
        if source == "rerun":
            return self.rerun_floor
        if source == "repeats":
            rates = [r.rate(self.by_samples) for r in self.ok]
            return (max(rates) - min(rates)) / 2 / self.rate if self.rate else 0.0  # type: ignore[type-var,operator]
        own = self._one_run_spread()
        return own[1] if own else 0.0

    def spread_words(self) -> str:
        """What the spread is, for the tables: "half the range of 3 baseline runs' means"."""
        if self.spread_from == "repeats":
            return f"half the range of {len(self.ok)} baseline runs' means"
        if self.spread_from == "blocks":
            return "half the range of the means of 3 blocks of the baseline's timed steps"
        if self.spread_from == "steps":
            return "half the p10-p90 range of the baseline's timed steps"
        if self.spread_from == "rerun":
            return "how far a rerun of the script may move its step (one baseline run)"
        return "no baseline spread measured"


def _step_spread(o: Outcome) -> float | None:
    """Half an outcome's p10-p90 step range over its mean step (None when it did not say)."""
    if o.mean_step_ms and o.p10_step_ms is not None and o.p90_step_ms is not None:
        return (o.p90_step_ms - o.p10_step_ms) / 2 / o.mean_step_ms
    return None


def _knob_key(name: str) -> str:
    """A knob's name without its ``arg.``/``env.`` prefix, as ``option_key`` spells options."""
    return option_key(name.split(".", 1)[1] if name.startswith(("arg.", "env.")) else name)


def is_batch_knob(name: str) -> bool:
    """Whether the knob ``name`` sets the batch: ``batch_size``, or a script flag or variable
    named for it (``arg.batch-size``, ``arg.bs``, ``arg.per_device_train_batch_size``)."""
    return is_batch_dest(_knob_key(name))


def changes_batch(knobs: dict[str, str]) -> bool:
    """Whether ``knobs`` change the samples of a step: the batch (``is_batch_knob``), or the
    gradient accumulation (``arg.gradient_accumulation_steps``, ``arg.accumulate_grad_batches``:
    a step is an optimizer step, and more micro-batches put more samples in it); an evaluation's
    setting (``eval_accumulation_steps``, ``eval_batch_size``) changes no training step."""
    return any(is_batch_knob(name) or is_accumulation_dest(_knob_key(name)) for name in knobs)


def compare_by_samples(outcomes: list[Outcome]) -> bool:
    """Samples/s when every successful run measured it, or when one of them changes the batch
    (``changes_batch``): its steps carry other work, so steps/s would compare unlike with like
    (timm at batch 2048 against 64 read 0.01x by steps/s), and a run without samples/s is then
    not compared (``not_compared_reason``); a run that leaves the batch alone is still judged by
    steps/s where samples/s is unknown (``judge``). Steps/s otherwise."""
    ok = [o for o in outcomes if o.status == "ok"]
    return bool(ok) and (any(changes_batch(o.knobs) for o in ok) or all(o.samples_per_s for o in ok))


def not_compared_reason(outcome: Outcome, by_samples: bool, baseline_modes: frozenset[str] = frozenset()) -> str:
    """Why a measured run has no rate to compare (its verdict "not compared"), in words."""
    if outcome.step_mode and other_steps(outcome, baseline_modes):
        theirs = " and ".join(STEP_MODE_LABELS.get(m, m) for m in sorted(baseline_modes))
        return (
            f"its steps were counted at each {STEP_MODE_LABELS.get(outcome.step_mode, outcome.step_mode)}, "
            f"the baseline's at each {theirs}: its steps/s measure other steps"
        )
    if by_samples and outcome.steps_per_s and not outcome.samples_per_s:  # measured, by steps alone
        return (
            "it measured no samples/s (the samples of its steps are unknown), and a run changes the batch: "
            "steps/s would compare steps of unlike size"
        )
    return (
        f"measured, but not as the others were (no {'timed' if outcome.figures.get('profiled') else 'profiled'} steps)"
    )


def other_steps(outcome: Outcome, baseline_modes: frozenset[str]) -> bool:
    """The run counted its steps by another signal than the baseline did (a compiled variant
    whose first optimizer step came after its model calls were taken for steps: a torchdiffeq
    flow's check measured 11.7x on "steps" of one ODE evaluation against the baseline's
    optimizer steps): its rate and the baseline's measure different things."""
    return bool(outcome.step_mode and baseline_modes and outcome.step_mode not in baseline_modes)


def not_applied(outcome: Outcome) -> dict[str, str]:
    """The outcome's own knobs that reached nothing in the script, each with why (its ``via``
    says ``not applied: ...``: a DataLoader knob set on a loader that fed no profiled step, a
    DDP knob where the script built no DistributedDataParallel)."""
    return {
        k: outcome.via[k].removeprefix(NOT_APPLIED).lstrip(": ")
        for k in outcome.knobs
        if outcome.via.get(k, "").startswith(NOT_APPLIED)
    }


def unchanged(outcome: Outcome) -> bool:
    """None of the outcome's knobs reached the script: the run measured the unchanged script,
    so its rate says nothing of the change (its verdict "not applied", never a speedup)."""
    return bool(outcome.knobs) and len(not_applied(outcome)) == len(outcome.knobs)


def judge(outcome: Outcome, baseline: Baseline) -> Outcome:
    """Speedup against the baseline and the verdict: helped, no effect, slower, oom, failed;
    "not applied" (no knob reached the script), "not compared" (no rate of the compared kind),
    "no baseline" (the baseline has none)."""
    if outcome.status != "ok":
        outcome.verdict = outcome.status if outcome.status in ("oom", "failed") else "failed"
        return outcome
    if unchanged(outcome):
        outcome.verdict = "not applied"  # the unchanged script: any difference is the run-to-run spread
        return outcome
    if baseline.by_samples and not changes_batch(outcome.knobs) and not (outcome.samples_per_s and baseline.rate):
        # the batch left alone: steps/s compares like with like (the same ratio as samples/s),
        # where samples/s is unknown on either side because another run changes the batch
        baseline = Baseline(baseline.runs, by_samples=False)
    if other_steps(outcome, baseline.step_modes):
        outcome.verdict = "not compared"
        return outcome
    base = baseline.rate
    rate = outcome.rate(baseline.by_samples)
    if rate and base and changes_batch(outcome.knobs):
        # another batch turns its epochs at another rate, and a turn (the workers' start, an
        # evaluation pass) costs the same per sample: both sides without their turns' steps
        turn_rate, turn_base = outcome.turn_free_rate(baseline.by_samples), baseline.turn_free_rate
        if turn_rate and turn_base and (turn_rate, turn_base) != (rate, base):
            rate, base = turn_rate, turn_base
            outcome.without_turns = True
    if not rate:
        outcome.verdict = "not compared"  # measured, but not the way the others were
        return outcome
    if not base:
        outcome.verdict = "no baseline"
        return outcome
    outcome.speedup = rate / base
    noise = max(baseline.spread, MIN_EFFECT)
    if abs(outcome.speedup - 1) <= noise:
        outcome.verdict = "no effect"
    else:
        outcome.verdict = "helped" if outcome.speedup > 1 else "slower"
    return outcome


def compile_cost(outcome: Outcome, baseline: Baseline) -> dict[str, float] | None:
    """Extra start-up time of a compiled run over the baseline, and the steps after which the
    faster steps have paid it back."""
    base_startup = [b.startup_s for b in baseline.ok if b.startup_s is not None]
    if outcome.startup_s is None or not base_startup or not outcome.mean_step_ms:
        return None
    extra = outcome.startup_s - statistics.mean(base_startup)
    base_steps = [b.mean_step_ms for b in baseline.ok if b.mean_step_ms]
    if not base_steps:
        return None
    saved_ms = statistics.mean(base_steps) - outcome.mean_step_ms
    result = {"compile_s": round(max(extra, 0.0), 2)}
    if saved_ms > 0:
        result["break_even_steps"] = round(max(extra, 0.0) * 1000 / saved_ms)
    return result


def merge_knobs(specs: list[Spec]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for spec in specs:
        merged.update(spec.knobs)
    return merged


# --- verify -----------------------------------------------------------------------------------


def candidates_from_report(report: dict[str, Any], top: int, rules: list[str] | None = None) -> list[Spec]:
    """The top findings that carry a knob (or, when nothing is wrong, the next steps); with
    ``rules``, only those rules' findings, wherever they rank."""
    findings = report.get("findings") or report.get("next_steps") or []
    if rules:
        findings = [f for f in findings if f.get("rule") in rules]
    specs = []
    for f in findings:
        knobs = {k: v for k, v in (f.get("knobs") or {}).items() if v not in ("", "n/a")}
        if knobs:
            specs.append(Spec(f["rule"], knobs, f["rule"]))
        if len(specs) == top:
            break
    return specs


@dataclass
class VerifyResult:
    baseline: Baseline
    tried: list[Outcome]
    combined: Outcome | None
    skipped: list[str]  # findings without a knob
    #: the rules asked for (``--rule``) whose finding the baseline did not have
    not_fired: list[str] = field(default_factory=list)


def verify(
    script: list[str],
    out_dir: RunDir,
    plan: WindowPlan,
    top: int = 3,
    repeats: int = 2,
    base_knobs: list[str] | None = None,
    on_progress: Callable[[str], None] = lambda _: None,
    timeout: float | None = None,
    options: RunOptions | None = None,
    launch: Launch | None = None,
    rules: list[str] | None = None,
    on_child_line: Callable[[str], None] | None = None,
) -> tuple[VerifyResult, dict[str, Any]]:
    """Diagnose, then try each top recommendation (or the findings of ``rules``) alone and all
    of them combined."""

    def experiment(spec: Spec, name: str) -> Outcome:
        on_progress(name)
        return run_experiment(
            script, spec, out_dir.child(name), plan, base_knobs, timeout, options, launch, on_child_line
        )

    baselines = [experiment(Spec("baseline"), f"baseline-{i}") for i in range(1, repeats + 1)]
    first = out_dir.child("baseline-1")
    report = first.load_report().to_dict() if first.report_path.is_file() else {}
    specs = candidates_from_report(report, top, rules)
    considered = [f for f in report.get("findings") or [] if not rules or f.get("rule") in rules][:top]
    skipped = [f["rule"] for f in considered if not f.get("knobs")]
    tried = [experiment(spec, spec.label) for spec in specs]
    combined = None
    if len(specs) > 1:
        combined = experiment(Spec("combined", merge_knobs(specs)), "combined")
    everything = baselines + tried + ([combined] if combined else [])
    align_basis(everything)
    baseline = Baseline(baselines, compare_by_samples(everything))
    if len(baseline.ok) == 1:  # one process of the script: a change must beat what a rerun moves
        baseline.rerun_floor = float((report.get("ranking") or {}).get("rerun_spread") or 0.0)
    for o in tried + ([combined] if combined else []):
        judge(o, baseline)
    for b in baselines:
        judge(b, baseline)
        b.verdict = "baseline" if b.status == "ok" else b.status
    fired = {f.get("rule") for f in report.get("findings") or []}
    return VerifyResult(baseline, tried, combined, skipped, [r for r in rules or [] if r not in fired]), report


def summarize_verify(result: VerifyResult, report: dict[str, Any]) -> dict[str, Any]:
    gains = {f["rule"]: f.get("gain_bound") for f in (report.get("findings") or []) + (report.get("next_steps") or [])}
    predicted = {
        f["rule"]: f.get("predicted_speedup") for f in (report.get("findings") or []) + (report.get("next_steps") or [])
    }
    ranked = sorted(result.tried, key=lambda o: -(o.speedup or 0))
    rows = [_row(b, role="baseline") for b in result.baseline.runs]
    lines = []
    for o in ranked:
        row = _row(o, role="recommendation")
        row["gain_bound"] = gains.get(o.rule or "")
        row["predicted_speedup"] = predicted.get(o.rule or "")
        if "compile" in o.knobs:
            row["compile"] = compile_cost(o, result.baseline)
        rows.append(row)
        lines.extend(_conclusion(o, gains.get(o.rule or ""), result.baseline, predicted.get(o.rule or "")))
    if result.combined is not None:
        rows.append(_row(result.combined, role="combined"))
        words = uncompared_words(result.combined, result.baseline)
        if result.combined.speedup:
            lines.append(f"all of them combined: {result.combined.speedup:.2f}x ({result.combined.verdict})")
        elif words is not None:
            lines.append(f"all of them combined: {words}")
    for rule in result.skipped:
        lines.append(f"{rule} has no knob: apply its change by hand and run diagnose again to measure it")
    for rule in result.not_fired:
        lines.append(f"{rule} did not fire on the baseline: nothing of it to try")
    if not result.tried and not result.skipped and not result.not_fired:
        lines.append("nothing to try: the diagnosis has no recommendation with a knob")
    basis = _basis_of(result.baseline.runs + result.tried + ([result.combined] if result.combined else []))
    if basis == "profiled":
        lines.insert(0, "compared by the profiled windows: a run was too short for the timed steps (profiler off)")
    if result.baseline.spread_from == "rerun":
        lines.append(
            f"one baseline run: a change must beat the ±{result.baseline.rerun_floor:.0%} a rerun may move the step "
            "(the diagnosis's estimate; --repeats 2 or more measures it)"
        )
    return {
        "kind": "verify",
        "parameters": [],
        "compared_by": "samples_per_s" if result.baseline.by_samples else "steps_per_s",
        "basis": basis,
        "statistic": STATISTICS[basis],
        "baseline_rate": result.baseline.rate,
        "baseline_spread": round(result.baseline.spread, 4),
        "baseline_spread_from": result.baseline.spread_from,
        "rows": rows,
        "conclusions": lines,
    }


def _conclusion(o: Outcome, bound: float | None, baseline: Baseline, predicted: float | None = None) -> list[str]:
    change = f"{o.rule} ({describe_change(o.knobs, o.via)})"
    if o.verdict == "helped":
        lines = [f"{change} helped: {o.speedup:.2f}x faster" + (f" (its bound: {bound:.2f}x)" if bound else "")]
    elif o.verdict == "no effect":
        noise = max(baseline.spread, MIN_EFFECT) * 100
        within = (
            f"the baseline's ±{noise:.1f}% spread ({baseline.spread_words()})"
            if baseline.spread >= MIN_EFFECT
            else f"±{noise:.1f}% (the smallest change counted)"
        )
        lines = [f"{change} had no effect: {o.speedup:.3f}x is inside {within}"]
    elif o.verdict == "slower":
        lines = [f"{change} made it slower: {o.speedup:.2f}x; do not apply it"]
    elif (words := uncompared_words(o, baseline)) is not None:
        lines = [f"{o.rule} ({describe_change(o.knobs, {} if o.verdict == 'not applied' else o.via)}): {words}"]
    else:
        lines = [f"{change} could not be measured: {o.error or o.verdict}"]
    if o.status == "ok" and o.error:
        lines.append(f"  note: {o.error}")
    if o.without_turns and o.speedup is not None:
        lines.append(
            "  compared without the timed steps at an epoch's turn on either side: the batch changes how often "
            "epochs turn, not what a turn costs per sample"
        )
    if predicted is not None and o.speedup is not None:
        lines.append(
            f"  predicted {predicted:.2f}x, measured {o.speedup:.2f}x ({(predicted - o.speedup) / o.speedup:+.0%})"
        )
    if o.top_exposed:
        lines.append(
            f"  after it, the top exposed share is {o.top_exposed['category']} ({o.top_exposed['share'] * 100:.0f}%)"
        )
    return lines


def _missed_words(o: Outcome) -> str:
    """``batch_size: the DataLoader it reached (train.py:12) delivered no batch ...``: each
    knob of ``o`` that reached nothing, and why."""
    return "; ".join(f"{k}: {why}" for k, why in not_applied(o).items())


def uncompared_words(o: Outcome, baseline: Baseline) -> str | None:
    """Why a measured run has no speedup, ending "not compared" (verify's conclusions, the
    combined run, the in-run check, sweep's points all say it so): its knobs reached nothing
    ("not applied"), it has no rate of the compared kind, or it changes the batch and the
    baseline measured no samples/s. None for a run that was compared, failed or ran out of memory."""
    if o.verdict == "not applied":
        return f"not applied ({_missed_words(o)}): not compared"
    if o.verdict == "not compared":
        return f"{not_compared_reason(o, baseline.by_samples, baseline.step_modes)}: not compared"
    if o.verdict == "no baseline" and changes_batch(o.knobs) and any(r.status == "ok" for r in baseline.runs):
        return "the baseline measured no samples/s, and the run changes the batch: not compared"
    return None


def _row(o: Outcome, role: str) -> dict[str, Any]:
    row = {k: v for k, v in asdict(o).items() if k not in ("exit_code", "figures")}
    row["role"] = role
    if row.get("speedup") is not None:
        row["speedup"] = round(row["speedup"], 4)
    return row


# --- diagnose run's check: measure the unsure findings ------------------------------------------

#: ``diagnose run`` measures up to this many unsure findings by default (``--check N``)
CHECK_DEFAULT = 2
#: the check's budget: this many times the run's own time (its start to its first report)
CHECK_BUDGET_FACTOR = 1.0
#: an experiment still running when the budget is spent gets this share of the budget left more
#: to finish (a fresh run costs about what the run did: on the 2-core development machine the
#: first A/B of a 6 s run took 5.5 s against a budget of 5.47 s)
CHECK_GRACE = 1.25
#: the profiled steps of each A/B run: what is compared is the timed steps (profiler off), and
#: every profiled step costs the trace's export and analysis
CHECK_PROFILED_STEPS = 1
#: where the ranking takes a rerun to move the steady step by at least this much (``rerun_spread``,
#: from the host's share of the step), the check runs the script once more as it is after the
#: changes, a process like each A/B run, where the budget holds it, and judges them against both
#: baselines; where it does not, against the run alone with the rerun's move as the least spread:
#: one A/B run against the run's own steps read PointNet++'s SYNC001 1.25x, 1.13x and 0.79x in
#: three runs (host share 0.93, rerun spread 17%), and the 0.79x run read its other change 0.79x
#: too (docs/zoo.md "The tenth GPU run"). Not first: at a budget of the run's own time, a second
#: baseline before the changes left none of them measured (PointNet and SASRec, the eleventh run)
CHECK_REBASE_SPREAD = 0.10


def check_plan(plan: WindowPlan, timed: bool = True, profiled: int | None = None) -> WindowPlan:
    """The plan of each A/B run: one profiled step, a fixed window, the run's timed steps, and
    warm-up enough that its timed steps are the same steps of the script as the run's own (its
    window ends where the run's ended, after ``profiled`` steps, the window as it grew: a loader
    whose queue drains over the first fifty steps, or a cache that warms, is compared at one point
    of the script, not at two; the outside corpus's calibration half read 1.5-1.9x apart between
    a run timed after 30 profiled steps and one timed after 5). Stopped after its timed steps. A
    run without timed steps (a script too short for them) is compared by its profiled window, as
    verify does (``align_basis``): each A/B run then gets the run's own plan, fixed, which the
    script's length cuts as it cut the run's."""
    if not timed:
        return replace(plan, max_steps=None, stop=True)
    steps = max(profiled or plan.steps, CHECK_PROFILED_STEPS)
    return WindowPlan(
        warmup=plan.warmup + steps - CHECK_PROFILED_STEPS, steps=CHECK_PROFILED_STEPS, timed=plan.timed, stop=True
    )


@dataclass
class CheckBudget:
    """The check's time: ``budget_s`` in all, ``spent_s`` so far, what the last experiment took."""

    budget_s: float
    spent_s: float = 0.0
    last_s: float | None = None

    def timeout(self) -> float | None:
        """What the next experiment may take (the budget left, ``CHECK_GRACE`` times), or None
        when it cannot fit: one starts only while the budget left holds at least half what the
        last one took."""
        left = self.budget_s - self.spent_s
        return left * CHECK_GRACE if left > 0 and left >= (self.last_s or 0.0) / 2 else None

    def spend(self, seconds: float) -> None:
        self.spent_s += seconds
        self.last_s = seconds


#: the fewest timed steps of a check's A/B run whose batch grows (``batch_plan``)
CHECK_MIN_TIMED = 5


def batch_growth(knobs: dict[str, str], report: dict[str, Any]) -> float | None:
    """How many times the run's batch (its ``batch.size`` symptom) a change's batch knob asks
    for; None where the knobs leave the batch alone or either number is unknown."""
    batch = ((report.get("symptoms") or {}).get("batch.size") or {}).get("value")
    for name, value in knobs.items():
        if is_batch_knob(name):
            try:
                asked = float(value)
            except (TypeError, ValueError):
                return None
            return asked / batch if batch and asked > 0 else None
    return None


def batch_plan(plan: WindowPlan, growth: float | None) -> WindowPlan:
    """A check's A/B plan for a batch ``growth`` times the run's: as many timed samples as the
    run timed, in ``growth`` times fewer steps (at least ``CHECK_MIN_TIMED``): each step takes
    longer, and a plan of the run's steps had SASRec's 8x batch time out of the check's budget
    before its timed steps ended (the eleventh GPU run). Compared by samples/s, as every batch
    change is."""
    if not growth or growth <= 1 or not plan.timed:
        return plan
    return replace(plan, timed=max(CHECK_MIN_TIMED, math.ceil(plan.timed / growth)))


def check_candidates(report: dict[str, Any], count: int) -> tuple[list[Spec], list[str]]:
    """The findings the report's ranking says to measure (``ranking.to_check``, in rank order)
    that carry a knob, the first ``count``; and one line for each of the others it names."""
    specs: list[Spec] = []
    left: list[str] = []
    for item in (report.get("ranking") or {}).get("to_check") or []:
        knobs = {k: v for k, v in (item.get("knobs") or {}).items() if v not in ("", "n/a")}
        if not knobs:
            left.append(f"{item['rule']}: no knob to apply it with; apply its change by hand and run diagnose again")
        elif len(specs) < count:
            specs.append(Spec(item["rule"], knobs, item["rule"]))
        else:
            left.append(f"{item['rule']}: past --check {count}")
    return specs, left


def check(
    script: list[str],
    run_dir: RunDir,
    plan: WindowPlan,
    report: dict[str, Any],
    count: int,
    budget_s: float,
    base_knobs: list[str] | None = None,
    options: RunOptions | None = None,
    on_progress: Callable[[str], None] = lambda _: None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[dict[str, Measurement], dict[str, Any]]:
    """``diagnose run``'s check: a short A/B of the findings its report says to measure, each
    one fresh ``diagnose run`` of the script with the finding's knobs (``run_experiment``, into
    ``RunDir.check_run``), against the run itself as the baseline, within ``budget_s``. Where a
    rerun moves the step by ``CHECK_REBASE_SPREAD`` or more, one more run of the script as it is
    follows the changes while the budget holds it (the baselines' spread then theirs); where it
    does not, a change must beat the rerun's move (``Baseline.rerun_floor``). Compared
    by the basis every run shares (``align_basis``: a short script's profiled window), in rank
    order but a compile last. Returns the measurements by rule and the ``ranking.check`` section
    of the report."""
    specs, left = check_candidates(report, count)
    # a compile last: its start-up alone outlasted a budget of the run's own time on every script
    # of the outside corpus (docs/zoo.md), so first the changes the budget can measure
    specs.sort(key=lambda spec: "compile" in spec.knobs)
    baseline = Baseline([outcome_from_report(Spec("baseline"), report, run_dir.path, 0)], False)
    budget = CheckBudget(budget_s)
    run = report.get("run") or {}
    grown = (run.get("window_growth") or {}).get("steps") or run.get("profiled_steps")
    short = check_plan(plan, timed=bool(baseline.runs[0].figures.get("steady")), profiled=grown)
    rerun = float((report.get("ranking") or {}).get("rerun_spread") or 0.0)
    outcomes: list[Outcome] = []
    for spec in specs:
        timeout = budget.timeout()
        if timeout is None:
            left.append(f"{spec.rule}: the budget ({budget_s:.0f} s) is spent")
            continue
        on_progress(f"checking {spec.rule} ({describe_change(spec.knobs, {})}) by a short A/B")
        started = clock()
        plan_of = batch_plan(short, batch_growth(spec.knobs, report))
        outcomes.append(
            run_experiment(
                script, spec, run_dir.check_run(spec.rule or spec.label), plan_of, base_knobs, timeout, options
            )
        )
        budget.spend(clock() - started)
    again: Outcome | None = None
    # after the changes (the budget measures them first), the script once more as it is
    if outcomes and rerun >= CHECK_REBASE_SPREAD and (timeout := budget.timeout()) is not None:
        on_progress(f"timing the script again as it is (a rerun may move its step by {rerun:.0%})")
        started = clock()
        again = run_experiment(
            script, Spec("baseline"), run_dir.check_run("baseline"), short, base_knobs, timeout, options
        )
        budget.spend(clock() - started)
        if again.status == "ok":
            baseline.runs.append(again)
    if len(baseline.ok) < 2:  # one process measured the baseline: a change must beat a rerun's move
        baseline.rerun_floor = rerun
        if outcomes and rerun >= CHECK_REBASE_SPREAD:
            left.append(
                f"a second baseline: the budget ({budget_s:.0f} s) is spent; the changes are judged against "
                f"the run alone, beyond the {rerun:.0%} a rerun may move its step"
            )
    basis = align_basis([*baseline.runs, *outcomes])
    baseline.by_samples = compare_by_samples([*baseline.runs, *outcomes])
    for o in outcomes:
        judge(o, baseline)
        if (words := uncompared_words(o, baseline)) is not None:
            left.append(f"{o.rule}: {words}")
    summary = {
        "budget_s": round(budget_s, 2),
        "spent_s": round(budget.spent_s, 2),
        "compared_by": "samples_per_s" if baseline.by_samples else "steps_per_s",
        "basis": basis,
        "statistic": STATISTICS[basis],
        "baseline_spread": round(baseline.spread, 4),
        "baseline_spread_from": baseline.spread_from,
        "plan": {"warmup": short.warmup, "steps": short.steps, "timed_steps": short.timed},
        "experiments": [
            *[_row(o, role="check") for o in outcomes],
            *([_row(again, role="baseline")] if again is not None else []),
        ],
        "not_measured": left,
    }
    return measurements(summary), summary


def measurements(summary: dict[str, Any]) -> dict[str, Measurement]:
    """What a check measured, by rule, from its summary (``ranking.check`` of a report): every
    experiment judged helped, no effect or slower. A later ``diagnose analyze`` of the run
    reads them back from there, so that re-analysing never loses them."""
    spread = max(float(summary.get("baseline_spread") or 0.0), MIN_EFFECT)
    out = {}
    for row in summary.get("experiments") or []:
        if (
            row.get("verdict") in ("helped", "no effect", "slower")
            and row.get("speedup") is not None
            and row.get("rule")
        ):
            out[row["rule"]] = Measurement(
                row["speedup"], spread, row["verdict"], describe_change(row.get("knobs") or {}, row.get("via") or {})
            )
    return out


# --- sweep ------------------------------------------------------------------------------------


def parse_sweep(assignments: list[str]) -> tuple[list[str], list[Spec]]:
    """``--set num_workers=0,2,4`` (one or two of them) -> the knob names and one Spec per point."""
    if not assignments:
        raise UsageError("diagnose sweep needs --set name=v1,v2,...", hint="e.g. --set num_workers=0,2,4,8")
    if len(assignments) > 2:
        raise UsageError("a sweep varies one or two knobs at a time")
    names, value_lists = [], []
    for text in assignments:
        name, raw = split_assignment(text)
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not values:
            raise UsageError(f"--set {name}= lists no values")
        if name in names:
            raise UsageError(f"--set {name} is given twice", hint=f"list every value once: --set {name}=v1,v2,...")
        # validate every value now, not mid-sweep; two spellings of one value (2 and 02, 1 and
        # true) are one point, which would run twice into one folder
        seen: dict[Any, str] = {}
        for value in values:
            parsed = Knobs.parse([f"{name}={value}"]).as_dict()[name]
            key = (type(parsed).__name__, parsed)
            if key in seen:
                raise UsageError(
                    f"--set {name}={raw} lists {seen[key]!r} twice"
                    + (f" (as {value!r})" if value != seen[key] else ""),
                    hint="list each value once (diagnose verify --repeats N measures the run-to-run spread)",
                )
            seen[key] = value
        names.append(name)
        value_lists.append(values)
    specs = []
    for combo in itertools.product(*value_lists):
        knobs = dict(zip(names, combo, strict=True))
        specs.append(Spec(" ".join(f"{k}={v}" for k, v in knobs.items()), knobs))
    return names, specs


def sweep(
    script: list[str],
    out_dir: RunDir,
    plan: WindowPlan,
    specs: list[Spec],
    base_knobs: list[str] | None = None,
    on_progress: Callable[[str], None] = lambda _: None,
    timeout: float | None = None,
    stop_after_oom: bool = True,
    options: RunOptions | None = None,
    launch: Launch | None = None,
    on_child_line: Callable[[str], None] | None = None,
) -> list[Outcome]:
    """Run each point; once a batch-size point runs out of memory, larger ones are skipped."""
    outcomes: list[Outcome] = []
    oom_at: dict[str, float] = {}
    folders = child_folders(out_dir, [spec.label for spec in specs])
    for spec, folder in zip(specs, folders, strict=True):
        size_knob = next((k for k in spec.knobs if is_batch_knob(k)), None)
        if (
            stop_after_oom
            and size_knob
            and size_knob in oom_at
            and _as_float(spec.knobs[size_knob]) > oom_at[size_knob]
        ):
            outcomes.append(
                Outcome(spec.label, spec.knobs, "oom", "", error="skipped: a smaller value already ran out of memory")
            )
            continue
        on_progress(spec.label)
        o = run_experiment(script, spec, folder, plan, base_knobs, timeout, options, launch, on_child_line)
        outcomes.append(o)
        if o.status == "oom" and size_knob:
            oom_at[size_knob] = min(oom_at.get(size_knob, float("inf")), _as_float(spec.knobs[size_knob]))
    return outcomes


def child_folders(out_dir: RunDir, labels: list[str]) -> list[RunDir]:
    """One folder per run, never two runs in one: labels whose folder names collide (``a/b`` and
    ``a_b`` are both ``a_b``) get ``-2``, ``-3`` ... after the first."""
    taken: set[Path] = set()
    folders = []
    for label in labels:
        folder, n = out_dir.child(label), 1
        while folder.path in taken:
            n += 1
            folder = out_dir.child(f"{label}-{n}")
        taken.add(folder.path)
        folders.append(folder)
    return folders


def summarize_sweep(names: list[str], outcomes: list[Outcome]) -> dict[str, Any]:
    basis = align_basis(outcomes)
    by_samples = compare_by_samples(outcomes)
    for o in outcomes:  # before the rows, which carry the verdicts
        if o.status == "ok" and unchanged(o):
            o.verdict = "not applied"
        elif o.status == "ok" and not o.rate(by_samples):
            o.verdict = "not compared"
    # "best" and the speedups only among runs measured the same way (never a failed one, nor one
    # whose knobs reached nothing: the unchanged script)
    ok = [o for o in outcomes if o.status == "ok" and o.verdict is None]
    best = max(ok, key=lambda o: o.rate(by_samples) or 0) if ok else None
    first_ok = ok[0] if ok else None
    eager = next((o for o in ok if not _compiles(o)), None)  # what a compiled point is compared with
    rows = []
    conclusions = []
    for o in outcomes:
        row = _row(o, role="point")
        if first_ok is not None and o in ok:
            row["speedup"] = round((o.rate(by_samples) or 0) / (first_ok.rate(by_samples) or 1), 4)
        if eager is not None and o in ok and _compiles(o):
            row["compile"] = cost = compile_cost(o, Baseline([eager], by_samples))
            if cost is not None:
                pays = (
                    f"pays for itself after {cost['break_even_steps']:,} steps"
                    if "break_even_steps" in cost
                    else "never pays for itself"
                )
                conclusions.append(
                    f"{o.label}: compiling took {cost['compile_s']:.1f} s more than {eager.label} and {pays}"
                )
        rows.append(row)
    if best is not None:
        how = " (profiled window)" if basis == "profiled" else ""
        conclusions.insert(
            0, f"best: {best.label} at {best.rate(by_samples):.1f} {'samples' if by_samples else 'steps'}/s{how}"
        )
    if basis == "profiled":
        conclusions.insert(
            1 if best is not None else 0,
            "compared by the profiled windows: a run was too short for the timed steps (profiler off)",
        )
    for o in outcomes:
        if (words := uncompared_words(o, Baseline([], by_samples))) is not None:
            conclusions.append(f"{o.label}: {words}")
        elif o.status == "ok" and o.error:
            conclusions.append(f"{o.label}: {o.error} (its figures are from before)")
    conclusions += [f"{o.label}: {o.status}: {o.error}" for o in outcomes if o.status != "ok" and o.error]
    for name in names:
        if is_batch_knob(name):
            fits = [_as_float(o.knobs[name]) for o in outcomes if o.status == "ok" and name in o.knobs]
            ooms = [_as_float(o.knobs[name]) for o in outcomes if o.status == "oom" and name in o.knobs]
            if ooms:
                largest = max((f for f in fits if f < min(ooms)), default=None)
                conclusions.append(
                    f"out of memory from {name}={_fmt(min(ooms))}; the largest that fits: "
                    + (f"{name}={_fmt(largest)}" if largest is not None else "none of those tried")
                )
    return {
        "kind": "sweep",
        "parameters": names,
        "compared_by": "samples_per_s" if by_samples else "steps_per_s",
        "basis": basis,
        "statistic": STATISTICS[basis],
        "rows": rows,
        "conclusions": conclusions,
    }


def _basis_of(outcomes: list[Outcome]) -> str:
    """The basis the measured runs were aligned to ("steady" when none was measured)."""
    return next((o.basis for o in outcomes if o.status == "ok" and o.basis), "steady")


def _compiles(o: Outcome) -> bool:
    return Knobs.parse([f"{name}={value}" for name, value in o.knobs.items()]).compiles()


def _as_float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return float("nan")


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def plot_sweep(summary: dict[str, Any], path: Path) -> Path | None:
    """A PNG of throughput and peak memory per point (needs matplotlib; None without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = summary["rows"]
    labels = [r["label"] for r in rows]
    key = summary["compared_by"]
    rates = [r.get(key) or 0 for r in rows]
    memory = [(r.get("peak_reserved_bytes") or 0) / 1e9 for r in rows]
    colours = ["#c94c4c" if r["status"] != "ok" else "#3b7dd8" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    axes[0].bar(range(len(rows)), rates, color=colours)
    axes[0].set_ylabel(key.replace("_", " "))
    axes[0].set_title("throughput (red: out of memory or failed)")
    axes[1].bar(range(len(rows)), memory, color="#7a7a7a")
    axes[1].set_ylabel("peak reserved GB")
    axes[1].set_title("GPU memory")
    for ax in axes:
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
