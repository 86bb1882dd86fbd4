"""The Python API, for notebooks and scripts: profile in-process, analyse a path, compare runs.

Contract (docs/api.md):

* ``profile(fn=None, **options)``: with a function, call it under the profiler and return the
  finished ``ProfiledRun``; without, a context manager (``with diagnose.profile() as run:
  train()``) whose ``run.report`` is set on leaving the block. Steps come from optimizer steps,
  as in ``diagnose run``; with ``stop=True`` (the default) the block is stopped once the window
  and the timed steps are measured, and the ``with`` ends quietly.
* ``analyze(path) -> Report``: a run directory (its report.json, else re-analysed from its
  record and trace), or a bare trace.
* ``load_runs(path) -> [(label, Report)]``: the runs a path holds: a verify or sweep directory
  holds one per child run, anything else one.
* ``compare(*runs) -> Comparison``: paths, reports or ``(label, report)`` pairs; the first
  run is the baseline.

A ``Report`` and a ``Comparison`` show themselves as HTML in Jupyter (``_repr_html_``).
Importing this module imports neither torch nor the analysis: each function imports what it
needs when it is called.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from diagnose.analysis.compare import Comparison
    from diagnose.record import RunRecord
    from diagnose.report import Report

PathLike = str | Path
RunLike = Union[PathLike, "Report", "tuple[str, Report]"]


# --- analysing and comparing --------------------------------------------------------------------


def analyze(
    path: PathLike, *, rules: Sequence[PathLike] = (), show_all: bool = False, reanalyze: bool = False
) -> Report:
    """The report of a run directory or a trace. A run directory's saved report.json is read
    as is, unless ``reanalyze`` (or extra ``rules``, or ``show_all``) asks for a fresh analysis."""
    from diagnose import session

    return session.report_of(path, rules=rules, show_all=show_all, reanalyze=reanalyze)


def load_runs(path: PathLike, *, rules: Sequence[PathLike] = (), show_all: bool = False) -> list[tuple[str, Report]]:
    """The labelled runs a path holds: a verify or sweep directory's child runs in its own order
    (labelled as the experiment labelled them), else the one run or trace."""
    from diagnose import session

    return session.labelled_runs(path, rules=rules, show_all=show_all)


def compare(*runs: RunLike, labels: Sequence[str] | None = None, rules: Sequence[PathLike] = ()) -> Comparison:
    """Compare runs, the first being the baseline. Each run is a path (a verify or sweep
    directory gives all its runs), a ``Report``, or a ``(label, Report)`` pair."""
    from diagnose import session

    return session.compare_runs(*runs, labels=labels, rules=rules)


# --- profiling in-process -----------------------------------------------------------------------


@dataclass
class ProfiledRun:
    """A run profiled in this process. ``report`` is set once the block has ended."""

    run_dir: Path
    record: RunRecord | None = None
    report: Report | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def _repr_html_(self) -> str | None:
        return self.report._repr_html_() if self.report is not None else None


def profile(
    fn: Callable[[], Any] | None = None,
    *,
    name: str | None = None,
    warmup: int = 5,
    steps: int = 10,
    timed_steps: int = 20,
    stop: bool = True,
    out: PathLike | None = None,
    overwrite: bool = False,
    knobs: Sequence[str] = (),
    lines: bool = False,
    rules: Sequence[PathLike] = (),
    show_all: bool = False,
    html: bool = False,
    quiet: bool = True,
    rank_aware: bool = False,
    keep_traces: str = "notable",
) -> Any:
    """Profile ``fn()`` and return its ``ProfiledRun``; without ``fn``, a context manager that
    profiles its block. The run directory is ``out``, else ``runs/<name>-<time>/``.

    With ``rank_aware`` (a worker of a distributed job whose launcher set RANK and WORLD_SIZE,
    or SLURM's variables: Ray Train, a notebook cluster), each rank profiles itself into the
    shared ``out``, analyses its own trace, and rank 0's ``report`` is the job's (the other
    ranks' is their own)."""
    context = _profiling(
        name or (getattr(fn, "__name__", None) if fn is not None else None) or "block",
        warmup=warmup,
        steps=steps,
        timed_steps=timed_steps,
        stop=stop,
        out=out,
        overwrite=overwrite,
        knobs=knobs,
        lines=lines,
        rules=rules,
        show_all=show_all,
        html=html,
        quiet=quiet,
        rank_aware=rank_aware,
        keep_traces=keep_traces,
    )
    if fn is None:
        return context
    with context as run:
        fn()
    return run


@contextlib.contextmanager
def _profiling(
    name: str,
    *,
    warmup: int,
    steps: int,
    timed_steps: int,
    stop: bool,
    out: PathLike | None,
    overwrite: bool,
    knobs: Sequence[str],
    lines: bool,
    rules: Sequence[PathLike],
    show_all: bool,
    html: bool,
    quiet: bool,
    rank_aware: bool = False,
    keep_traces: str = "notable",
) -> Iterator[ProfiledRun]:
    """The block's run, orchestrated by ``session.profiled_block`` as a script's run is; here
    only what a notebook needs: a block inside a run diagnose already profiles runs unprofiled."""
    from diagnose import session
    from diagnose.distributed import rank_info
    from diagnose.errors import UsageError
    from diagnose.record import WindowPlan
    from diagnose.runtime.runner import profiling_now

    options = session.analysis_options(rules, show_all)  # a bad rule file fails before the block runs
    plan = WindowPlan(warmup=warmup, steps=steps, timed=timed_steps, stop=stop)
    outer = profiling_now()
    if outer is not None:  # torch.profiler runs one session: the outer run measures this block too
        import warnings

        warnings.warn(
            f"diagnose.profile inside a run diagnose is already profiling (into {outer}): this block runs unprofiled "
            "and is measured as part of the outer run",
            RuntimeWarning,
            stacklevel=3,
        )
        yield ProfiledRun(outer, options={"plan": plan, "knobs": list(knobs), "nested_in": str(outer)})
        return
    rank = rank_info() if rank_aware else None
    if rank_aware and rank is None:
        raise UsageError("rank_aware needs the launcher's RANK and WORLD_SIZE (or SLURM's) in the environment")
    rank = rank if rank is not None and rank.world_size > 1 else None
    run: ProfiledRun | None = None
    block = session.profiled_block(
        name,
        plan,
        options,
        knobs=knobs,
        lines=lines,
        html=html,
        quiet=quiet,
        out=Path(out) if out is not None else None,
        overwrite=overwrite,
        rank=rank,
        keep_traces=keep_traces,
    )
    try:
        with block as outcome:
            run = ProfiledRun(outcome.run_dir.path, options={"plan": plan, "knobs": list(knobs)})
            yield run
    finally:
        if run is not None:
            run.record, run.report = outcome.record, outcome.report
