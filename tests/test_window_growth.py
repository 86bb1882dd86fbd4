"""The profiled window grows (bounded) while the profiled steps vary widely (issue 17, item 3).

The scripts sleep a planned time in each step (a fast step 100 ms, a slow one 1 s), so that
whether the window's p90 step is over 1.5x its median is known for every window length: the
expected number of profiled steps is exact. Where the window stops growing its p90 is the slowest
fast step, so a fast step 50 ms late would grow it one step more (seen with 50 ms fast steps and
25 ms of jitter on the loaded 2-core development host).
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path

import pytest

from diagnose import record as record_module
from diagnose.analysis.report import growth_note
from diagnose.record import (
    WINDOW_MEAN_UNCERTAINTY,
    RunRecord,
    WindowPlan,
    mean_uncertainty_estimate,
    steps_vary_widely,
    window_unsettled,
)

FAST, SLOW = 0.1, 1.0


# --- the criterion and the plan's arithmetic ----------------------------------------------------


def test_steps_vary_widely_is_p90_over_one_and_a_half_medians() -> None:
    # one slow step among four: p90 = 0.1 + 0.7 x 0.9 = 0.73 s, median 0.1 s
    assert steps_vary_widely([FAST, SLOW, FAST, FAST])
    # among ten: p90 = 0.1 + 0.1 x 0.9 = 0.19 s > 0.15 s
    assert steps_vary_widely([FAST] * 9 + [SLOW])
    # among eleven: the p90 is the largest fast step
    assert not steps_vary_widely([FAST] * 10 + [SLOW])
    # exactly 1.5x is not over it
    assert not steps_vary_widely([1.0, 1.0, 1.0, 1.5, 1.5, 1.5])
    assert not steps_vary_widely([SLOW])
    assert not steps_vary_widely([])


def test_the_window_is_unsettled_while_its_steps_vary_widely_or_their_mean_is_uncertain() -> None:
    # 0.1 and 0.13 s alternating: never 1.5x the median, but the mean of four is uncertain by
    # 1.645 x 0.0173 / 2 / 0.115 = 12.4%, of six by 1.645 x 0.0164 / sqrt(6) / 0.115 = 9.6%
    assert not steps_vary_widely([0.1, 0.13] * 3)
    assert mean_uncertainty_estimate([0.1, 0.13] * 2) == pytest.approx(
        1.645 * statistics.stdev([0.1, 0.13] * 2) / 2 / 0.115
    )
    assert window_unsettled([0.1, 0.13] * 2) and not window_unsettled([0.1, 0.13] * 3)
    # one step ten times the others among eleven: the p90 is fast, the mean still uncertain
    assert not steps_vary_widely([FAST] * 10 + [SLOW]) and window_unsettled([FAST] * 10 + [SLOW])
    assert not window_unsettled([FAST] * 4)
    assert window_unsettled([FAST, SLOW, FAST, FAST])


def test_a_plan_grows_one_step_at_a_time_up_to_its_bound() -> None:
    plan = WindowPlan(warmup=2, steps=4, timed=3, max_steps=6)
    assert plan.grows() and plan.step_bound == 6
    grown = plan.grown()
    assert (grown.steps, grown.window_end, grown.first_timed, grown.last_boundary) == (5, 7, 8, 11)
    assert grown.grown().grown().steps == 6  # never past the bound
    assert not WindowPlan(steps=4).grows() and WindowPlan(steps=4, max_steps=3).step_bound == 4
    assert plan.to_argv() == ["--warmup", "2", "--steps", "4", "--max-steps", "6", "--timed-steps", "3"]


def test_a_record_times_the_steps_after_the_grown_window() -> None:
    record = RunRecord(plan={"warmup": 2, "steps": 4, "timed": 3, "stop": True, "max_steps": 12}, timed_steps=3)
    record.window_growth = {
        "planned_steps": 4,
        "max_steps": 12,
        "steps": 11,
        "ended_by": "steady",
        "p90_over_median": 7.3,
    }
    record.boundaries_s = [float(i) for i in range(20)]
    assert record.window_plan().window_end == 13
    assert record.first_timed_step() == 14
    assert record.steady_durations() == [1.0, 1.0, 1.0]
    assert RunRecord.from_dict(record.to_dict()).first_timed_step() == 14
    assert RunRecord(plan={"warmup": 2, "steps": 4, "timed": 3, "stop": True}).first_timed_step() == 7  # older run.json


def test_the_note_says_from_what_to_what_and_why() -> None:
    growth = {"planned_steps": 4, "max_steps": 12, "steps": 11, "ended_by": "steady", "p90_over_median": 7.3}
    assert growth_note(growth) == (
        "the profiled window grew from 4 to 11 steps (at most 12): the profiled steps varied widely "
        "(p90 7.3x the median); it ended once they no longer did"
    )
    assert growth_note({**growth, "steps": 4}) is None
    assert growth_note({}) is None


# --- real runs --------------------------------------------------------------------------------

pytest.importorskip("torch")

from diagnose.analysis.pipeline import AnalysisOptions  # noqa: E402
from diagnose.analysis.trace.timeline import load_timeline  # noqa: E402
from diagnose.progress import Progress  # noqa: E402
from diagnose.renderers import TerminalRenderer  # noqa: E402
from diagnose.rundir import RunDir  # noqa: E402
from diagnose.runtime.runner import resolve_target, run_target  # noqa: E402
from diagnose.session import analyze_run  # noqa: E402

#: step 0 runs from iteration 0's model call to its optimizer step, step k from the optimizer
#: step of iteration k-1 to that of k: step k sleeps in iteration k
SLEEPY = f"""
import sys, time, torch
slow = {{int(k) for k in sys.argv[1].split(",") if k}}
iterations = int(sys.argv[2])
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(iterations):
    time.sleep({SLOW} if i in slow else {FAST})
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
print("script finished", file=sys.stderr)
"""

PLAN = WindowPlan(warmup=2, steps=4, timed=2, max_steps=12)


def run(
    write_script, slow: list[int], iterations: int = 40, plan: WindowPlan = PLAN, rank: int | None = None
) -> tuple[RunRecord, Path]:
    script = write_script(SLEEPY)
    run_dir = script.parent / "run"
    run_dir.mkdir(exist_ok=True)
    args = [",".join(map(str, slow)), str(iterations)]
    record = run_target(
        resolve_target(str(script), None, args), plan, RunDir(run_dir), rank=rank, progress=Progress(enabled=False)
    )
    return record, run_dir


def traced_steps(run_dir: Path, record: RunRecord) -> int:
    (trace,) = record.trace_files
    return len(load_timeline(run_dir / trace).steps)


@pytest.mark.parametrize("stop", [True, False], ids=["stopped", "--no-stop"])
def test_the_window_grows_while_steps_vary_then_stops_at_its_bound(write_script, stop: bool) -> None:
    # profiled steps 2-5 hold one slow step (3): the window grows one fast step at a time; from
    # eleven steps the p90 is a fast step, but one step ten times the others leaves the mean
    # uncertain by far more than WINDOW_MEAN_UNCERTAINTY (see the criterion's test above): the
    # window grows to its bound
    plan = WindowPlan(warmup=2, steps=4, timed=2, max_steps=12, stop=stop)
    record, run_dir = run(write_script, slow=[3], iterations=24, plan=plan)
    assert record.status == ("stopped" if stop else "completed")
    assert record.profiled_steps == 12
    assert record.window_growth == {
        "planned_steps": 4,
        "max_steps": 12,
        "steps": 12,
        "ended_by": "bound",
        "p90_over_median": record.window_growth["p90_over_median"],
        "mean_uncertainty": record.window_growth["mean_uncertainty"],
    }
    assert (
        record.window_growth["p90_over_median"] > 5
        and record.window_growth["mean_uncertainty"] > WINDOW_MEAN_UNCERTAINTY
    )
    assert traced_steps(run_dir, record) == 12
    # the export step after the window, then the timed steps: all fast
    assert record.first_timed_step() == 2 + 12 + 1
    assert record.timed_steps == 2 and all(FAST * 0.9 < d < SLOW * 0.6 for d in record.steady_durations())
    assert record.plan["steps"] == 4  # the plan as asked; window_growth says how it ran
    # stopped after the timed steps; with --no-stop every one of the script's 24 steps counts
    assert record.completed_steps() == (2 + 12 + 1 + 2 if stop else 24)
    # the report says so: report.json's run and notes, the terminal
    report = analyze_run(RunDir(run_dir), AnalysisOptions.load(()))
    assert report.run["window_growth"]["steps"] == 12
    assert report.throughput["profiled"]["steps"] == 12
    note = growth_note(record.window_growth)
    assert (
        note is not None
        and note.startswith("the profiled window grew from 4 to 12 steps (at most 12)")
        and note in report.warnings
    )
    assert "the profiled window grew from 4 to 12 steps" in " ".join(TerminalRenderer().render(report).split())


def test_the_window_stops_growing_at_its_bound(write_script) -> None:
    # every third step slow: the steps vary widely however long the window
    record, run_dir = run(
        write_script, slow=list(range(3, 40, 3)), plan=WindowPlan(warmup=2, steps=4, timed=2, max_steps=7)
    )
    assert record.status == "stopped"
    assert record.profiled_steps == 7 and traced_steps(run_dir, record) == 7
    assert record.window_growth["steps"] == 7 and record.window_growth["ended_by"] == "bound"
    assert record.first_timed_step() == 2 + 7 + 1


def test_the_window_does_not_grow_when_the_steps_are_steady(write_script) -> None:
    # steps of 0.1 s each: steady, unless the machine is so loaded that they are not. A window
    # that grew must have seen its planned steps vary (what it grows on); then a second try
    for _attempt in range(3):
        record, run_dir = run(write_script, slow=[])
        if record.profiled_steps == 4:
            break
        warmup = record.plan["warmup"]
        planned = record.step_durations()[warmup : warmup + 4]
        assert window_unsettled(planned), (planned, record.window_growth)
        shutil.rmtree(run_dir)
    assert record.profiled_steps == 4 and traced_steps(run_dir, record) == 4
    assert record.window_growth["steps"] == 4 and record.window_growth["ended_by"] == "steady"
    assert record.first_timed_step() == 2 + 4 + 1


def test_the_window_stops_growing_at_the_time_budget(write_script, monkeypatch) -> None:
    monkeypatch.setattr(record_module, "GROWTH_BUDGET_S", 0.0)
    record, run_dir = run(write_script, slow=[3])
    assert record.profiled_steps == 4 and traced_steps(run_dir, record) == 4
    assert record.window_growth["ended_by"] == "budget" and record.window_growth["steps"] == 4


def test_a_script_that_ends_while_the_window_grows_keeps_what_was_profiled(write_script) -> None:
    # 10 iterations: boundaries 0-10, steps 0-9; the window (from step 2) grows until the script ends
    record, run_dir = run(write_script, slow=[3], iterations=10)
    assert record.status == "completed"
    assert record.profiled_steps == 8
    # the trace also holds the step the last optimizer step began, cut short by the script's end
    assert traced_steps(run_dir, record) == 9
    assert record.window_growth["ended_by"] == "script end"
    assert record.timed_steps == 0


def test_a_rank_of_a_distributed_run_never_grows_its_window(write_script) -> None:
    # the ranks must stop at the same step; a fixed plan (no max_steps) is the plans' test above
    record, _run_dir = run(write_script, slow=[3], rank=0)
    assert record.profiled_steps == 4 and record.window_growth == {}


#: SLEEPY with its length as an option diagnose reads (``--max_iters``): the plan is cut to it
SLEEPY_ITERS = f"""
import argparse, time, torch
p = argparse.ArgumentParser()
p.add_argument("--slow", default="")
p.add_argument("--max_iters", type=int, default=40)
a = p.parse_args()
slow = {{int(k) for k in a.slow.split(",") if k}}
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(a.max_iters):
    time.sleep({SLOW} if i in slow else {FAST})
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_the_window_grows_while_its_mean_is_uncertain_only_as_far_as_the_script_has_steps(write_script) -> None:
    # one step ten times the others: the mean stays uncertain by far more than
    # WINDOW_MEAN_UNCERTAINTY however long the window, so it grows to its bound; the script makes
    # 14 steps (--max_iters 14), so the bound is cut from 12 to the 9 that leave the export step
    # and the 2 timed steps room (WindowPlan.fitted): never past what the script has
    script = write_script(SLEEPY_ITERS)
    run_dir = script.parent / "run"
    run_dir.mkdir(exist_ok=True)
    target = resolve_target(str(script), None, ["--slow", "3", "--max_iters", "14"])
    record = run_target(target, PLAN, RunDir(run_dir), progress=Progress(enabled=False))
    assert record.plan_fit is not None and record.plan_fit["steps"] == 14
    assert record.window_growth is not None
    assert (record.window_growth["max_steps"], record.window_growth["steps"], record.window_growth["ended_by"]) == (
        9,
        9,
        "bound",
    )
    assert record.window_growth["mean_uncertainty"] > WINDOW_MEAN_UNCERTAINTY
    assert record.profiled_steps == 9 and traced_steps(run_dir, record) == 9
    assert record.first_timed_step() == 2 + 9 + 1 and record.timed_steps == 2
    assert record.completed_steps() == 14
