"""Scripts as they come (issue 33): fewer steps than the plan needs, a last step followed by a
teardown, several epochs with a short last batch, ``--no-stop``. The plan's arithmetic and the
step marks are pure and tested exactly; the runner on short CPU scripts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from diagnose.analysis.pipeline import recorded_steps
from diagnose.analysis.report import more_steps, short_run, short_run_notes
from diagnose.analysis.trace.timeline import StepMark
from diagnose.record import FrameworkInfo, RunLength, RunRecord, WindowPlan, run_length

PLAN = WindowPlan(warmup=5, steps=10, timed=20, max_steps=30)


@dataclass
class FitCase:
    total: int
    warmup: int
    steps: int
    timed: int
    max_steps: int | None


@pytest.mark.parametrize(
    "case",
    [
        FitCase(100, 5, 10, 20, 30),  # room for the whole plan, the growth too
        FitCase(40, 5, 10, 20, 14),  # the whole plan, but the window may grow only by 4 steps
        FitCase(36, 5, 10, 20, None),  # exactly the plan: no growth
        FitCase(30, 5, 10, 14, None),  # timing cut first
        FitCase(16, 5, 10, 0, None),  # no room for the export step and a timed one
        FitCase(10, 5, 5, 0, None),  # the window cut
        FitCase(4, 3, 1, 0, None),  # the warm-up first, but one step is profiled
    ],
    ids=lambda c: f"{c.total} steps",
)
def test_the_plan_is_cut_to_the_scripts_steps_warm_up_first(case: FitCase) -> None:
    fitted = PLAN.fitted(case.total)
    assert (fitted.warmup, fitted.steps, fitted.timed, fitted.max_steps) == (
        case.warmup,
        case.steps,
        case.timed,
        case.max_steps,
    )
    assert fitted.timed == 0 or fitted.last_boundary <= case.total  # the timing ends by the script's last step
    assert PLAN.fitted(1) == PLAN  # nothing to cut to


def test_the_run_length_comes_from_the_scripts_options_its_loader_or_its_framework() -> None:
    steps = {"flag": "--max_iters", "dest": "max_iters", "kind": "steps", "value": 40}
    epochs = {"flag": "--epochs", "dest": "epochs", "kind": "epochs", "value": 3}
    assert run_length([epochs, steps], 7, []) == RunLength(40, "--max_iters 40")
    assert run_length([epochs], 7, []) == RunLength(21, "--epochs 3 x 7 batches")
    assert run_length([epochs], None, []) is None  # epochs of an unknown length say nothing
    hf = FrameworkInfo(
        "hf_trainer", "arguments", "TrainingArguments", None, None, settings={"max_steps": -1, "num_train_epochs": 2.0}
    )
    assert run_length([], 5, [hf]) == RunLength(10, "TrainingArguments(num_train_epochs=2) x 5 batches")
    # the loop's framework first: a script's --steps it never passed on says nothing
    assert run_length([{**steps, "flag": "--steps", "value": 60}], 5, [hf]) == RunLength(
        10, "TrainingArguments(num_train_epochs=2) x 5 batches"
    )
    hf.settings["max_steps"] = 12
    assert run_length([], 5, [hf]) == RunLength(12, "TrainingArguments(max_steps=12)")
    assert run_length([], None, []) is None


def test_the_flag_that_gives_more_steps_is_the_scripts_own() -> None:
    steps = {"flag": "--max-iters", "dest": "max_iters", "kind": "steps", "value": 40}
    epochs = {"flag": "--num_epochs", "dest": "num_epochs", "kind": "epochs", "value": 1}
    assert more_steps([epochs, steps], 36, 10, made=40) == "--max-iters 36"
    assert more_steps([epochs], 36, 10, made=10) == "--num_epochs 4"
    assert more_steps([epochs], 36, None, made=10) is None
    assert more_steps([], 36, 10, made=10) is None
    # a step count that did not limit the run: --max-iters 0 (run the epochs), or over the steps made
    assert more_steps([{**steps, "value": 0}, epochs], 36, 10, made=10) == "--num_epochs 4"
    assert more_steps([{**steps, "value": 60}, epochs], 36, 10, made=10) == "--num_epochs 4"
    # the HF Trainer's own settings, where the script has no option for them
    hf = FrameworkInfo(
        "hf_trainer", "arguments", "TrainingArguments", None, None, settings={"max_steps": -1, "num_train_epochs": 4}
    )
    assert (
        more_steps([{**steps, "value": 60}], 26, None, made=12, frameworks=[hf])
        == "TrainingArguments(num_train_epochs=9)"
    )
    hf.settings["max_steps"] = 12
    assert more_steps([], 26, None, made=12, frameworks=[hf]) == "TrainingArguments(max_steps=26)"


def _record(
    durations: list[float], profiled: int, plan: WindowPlan, status: str = "completed", **kw: object
) -> RunRecord:
    bounds = [100.0]
    for d in durations:
        bounds.append(bounds[-1] + d)
    return RunRecord(plan={**vars(plan)}, boundaries_s=bounds, profiled_steps=profiled, status=status, **kw)  # type: ignore[arg-type]


def test_a_trailing_mark_that_holds_the_teardown_is_cut_at_the_recorded_step() -> None:
    # warm-up 2, the script ended after step 4: steps 2-4 profiled. The trace marks steps 2-5:
    # step 4's mark ran on to the profiler's stop (a teardown of 2 s after its 0.5 s step), and
    # step 5's would be the teardown alone
    plan = WindowPlan(warmup=2, steps=10, timed=4)
    record = _record([0.5] * 5, profiled=3, plan=plan)
    marks = [StepMark(2, 0.0, 5e5), StepMark(3, 5e5, 1e6), StepMark(4, 1e6, 3e6), StepMark(5, 3e6, 3.1e6)]
    assert recorded_steps(marks, record) == [StepMark(2, 0.0, 5e5), StepMark(3, 5e5, 1e6), StepMark(4, 1e6, 1.5e6)]
    # a window the script did not end inside keeps its marks as they are
    full = _record([0.5] * 20, profiled=10, plan=plan, status="stopped")
    assert recorded_steps(marks, full) == marks


def test_a_short_script_says_what_was_left_out_and_how_to_give_it_more_steps() -> None:
    plan = WindowPlan(warmup=5, steps=10, timed=20, max_steps=30)
    fitted = plan.fitted(30)
    record = _record(
        [0.01] * 30,
        profiled=10,
        plan=fitted,
        status="stopped",
        timed_steps=14,
        plan_fit={"asked": vars(plan), "steps": 30, "source": "--max_iters 30"},
        length_options=[{"flag": "--max_iters", "dest": "max_iters", "kind": "steps", "value": 30}],
    )
    short = short_run(record)
    assert short == {
        "steps": 30,
        "needed": 36,
        "source": "--max_iters 30",
        "profiled": 10,
        "planned_profiled": 10,
        "timed": 14,
        "planned_timed": 20,
        "more_steps": "--max_iters 36",
    }
    first, second = short_run_notes(short)
    assert first == (
        "short script: it makes 30 steps (--max_iters 30), fewer than the 36 the plan needs (warm-up, profiled "
        "window, timed steps): profiled 10 of 10 steps, timed 14 of 20 with the profiler off"
    )
    assert second.endswith("For the whole plan, run it with --max_iters 36")
    # a script that ran out without saying its length: the steps it made, and a longer job
    ran_out = _record([0.01] * 12, profiled=7, plan=plan)
    short = short_run(ran_out)
    assert short is not None and (short["steps"], short["timed"], short["more_steps"]) == (12, 0, None)
    assert "run a longer job (at least 36 steps" in short_run_notes(short)[1]
    # a script that had the steps: nothing to say
    assert short_run(_record([0.01] * 36, profiled=10, plan=plan, status="stopped", timed_steps=20)) is None


# --- the runner on short scripts ---------------------------------------------------------------

pytest.importorskip("torch")

from diagnose.progress import Progress  # noqa: E402
from diagnose.rundir import RunDir  # noqa: E402
from diagnose.runtime.runner import resolve_target, run_target  # noqa: E402

#: ``--iters`` optimizer steps over a DataLoader of 10 samples in batches of 4 (the last one short),
#: as many epochs as it takes; a teardown of ``--teardown`` seconds after the last step
EPOCHS = """
import argparse, itertools, time, torch
from torch.utils.data import DataLoader, TensorDataset
p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--iters", type=int, default=0, help="stop after this many steps (0: run the epochs)")
p.add_argument("--teardown", type=float, default=0.0)
a = p.parse_args()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(torch.randn(10, 4)), batch_size=4)
done = 0
for epoch in range(a.epochs):
    for (x,) in loader:
        model(x).mean().backward()
        opt.step(); opt.zero_grad()
        done += 1
        if done == a.iters:
            break
    if done == a.iters:
        break
time.sleep(a.teardown)
print("steps", done)
"""


def run(script: Path, args: list[str], plan: WindowPlan) -> RunRecord:
    run_dir = script.parent / "run"
    run_dir.mkdir(exist_ok=True)
    return run_target(resolve_target(str(script), None, args), plan, RunDir(run_dir), progress=Progress(enabled=False))


def test_several_epochs_with_a_short_last_batch_count_every_step_and_its_samples(write_script) -> None:
    # 3 epochs of batches 4, 4, 2: nine steps; the plan is cut to them (3 epochs x 3 batches)
    record = run(write_script(EPOCHS), ["--epochs", "3"], WindowPlan(warmup=2, steps=3, timed=20))
    assert record.status == "stopped"  # at the end of its last step: the timing was done
    assert record.completed_steps() == 9
    assert record.samples_per_step == [4, 4, 2] * 3
    assert record.plan_fit["steps"] == 9 and record.plan_fit["source"] == "--epochs 3 x 3 batches"
    assert (record.plan["warmup"], record.plan["steps"], record.plan["timed"]) == (2, 3, 3)
    assert record.timed_steps == 3 and record.timed_samples == 2 + 4 + 4 + 2 - 2  # steps 6-8: 4, 4, 2


def test_under_no_stop_every_step_counts(write_script) -> None:
    # 60 steps (issue 37 item 10: 56 counted, the plan's last boundary, where the script made 60)
    plan = WindowPlan(warmup=2, steps=3, timed=4, stop=False)
    record = run(write_script(EPOCHS), ["--epochs", "20"], plan)
    assert record.status == "completed"
    assert record.completed_steps() == 60
    assert record.timed_steps == 4  # timed as planned; the steps after it still count
    assert sum(record.samples_per_step) == 200


def test_the_last_step_ends_at_its_optimizer_step_not_at_the_teardown(write_script) -> None:
    # the loop breaks after 5 steps: no fetch commits the last step's boundary; the script then
    # sleeps 0.4 s. The last step is a step like the others, the teardown in none.
    plan = WindowPlan(warmup=2, steps=10, timed=4)
    record = run(write_script(EPOCHS), ["--epochs", "5", "--iters", "5", "--teardown", "0.4"], plan)
    assert record.status == "completed"
    assert record.completed_steps() == 5
    assert record.profiled_steps == 3
    assert max(record.step_durations()) < 0.2
    tail = record.after_last_step_seconds()
    assert tail is not None and tail >= 0.4
    assert record.samples_per_step == [4, 4, 2, 4, 4]


def test_a_script_that_ends_during_the_timing_keeps_the_timed_steps_it_had(write_script) -> None:
    # no option says how long it runs (a bare loop of 14 steps): the plan is not cut, and the
    # script ends during the timing after 8 of the 12 timed steps
    script = write_script(
        """
        import torch
        m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(14):
            m(torch.randn(8, 4)).mean().backward(); opt.step(); opt.zero_grad()
        """
    )
    record = run(script, [], WindowPlan(warmup=2, steps=3, timed=12))
    assert record.status == "completed" and not record.plan_fit
    assert record.completed_steps() == 14
    assert record.timed_steps == 14 - (2 + 3 + 1) and record.timed_seconds and record.timed_seconds > 0
    assert len(record.steady_durations()) == 8


def test_a_short_script_under_diagnose_run_is_diagnosed_and_told_how_to_run_longer(
    write_script, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    script = write_script(EPOCHS)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--quiet",
            "--json",
            "--out",
            str(out),
            str(script),
            "--",
            "--epochs",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    short = report["run"]["short_run"]
    # 12 steps: warm-up 5, profiled 7, none timed; --epochs 12 gives the 36 the default plan needs
    assert (short["steps"], short["profiled"], short["timed"], short["more_steps"]) == (12, 7, 0, "--epochs 12")
    assert report["throughput"]["profiled"]["steps"] == 7
    assert any("run it with --epochs 12" in w for w in report["warnings"])


def test_an_epoch_turn_under_a_one_ahead_prefetch_is_evened_out() -> None:
    from diagnose.record import even_out_epoch_turns

    # batches of 8, 8, 4 an epoch, each drawn a step early: the turn's step drew nothing, the
    # next the new epoch's first two
    samples = [8, 4, 0, 16, 4, 0, 16, 4, 0]
    batches = [(1, 8), (1, 4), (0, 0), (2, 8), (1, 4), (0, 0), (2, 8), (1, 4), (0, 0)]
    assert even_out_epoch_turns(samples, batches) == [8, 4, 8, 8, 4, 8, 8, 4, 0]
    # a plain loop's steps stay as they are, a step that drew one batch of 0 samples too
    assert even_out_epoch_turns([4, 4, 2, 4], [(1, 4), (1, 4), (1, 2), (1, 4)]) == [4, 4, 2, 4]


#: the HF Trainer's way (accelerate's DataLoaderShard): each batch drawn from the DataLoader one
#: step before the loop gets it
ONE_AHEAD = """
import torch
from torch.utils.data import DataLoader, TensorDataset
def one_ahead(loader):
    it = iter(loader)
    current = next(it)
    for following in it:
        yield current
        current = following
    yield current
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(torch.randn(20, 4)), batch_size=8)
for epoch in range(4):
    for (x,) in one_ahead(loader):
        model(x).mean().backward()
        opt.step(); opt.zero_grad()
"""


def test_a_one_ahead_loader_keeps_its_samples_per_second_at_epoch_turns(write_script) -> None:
    # issue 33: an HF Trainer run recorded 0 samples in the step at each epoch's turn and lost
    # its steady samples/s
    record = run(write_script(ONE_AHEAD), [], WindowPlan(warmup=2, steps=3, timed=4, stop=False))
    assert record.completed_steps() == 12
    # each step reads the batch drawn during it (the next one's): the last step drew none
    assert record.samples_per_step == [8, 4, 8] * 3 + [8, 4, 0]
    assert record.timed_samples == 8 + 8 + 4 + 8  # steps 6-9


def test_a_script_that_raises_inside_the_window_reports_one_count_of_profiled_steps(write_script) -> None:
    # issue 38 item 13: "Profiled window (4 steps)" beside "3 of the 10 planned steps"; the
    # trace's last mark ran on from the last step to the failure
    from diagnose.analysis.pipeline import AnalysisOptions
    from diagnose.session import analyze_run

    script = write_script(
        """
        import time, torch
        from torch.utils.data import DataLoader, TensorDataset
        m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for i, (x,) in enumerate(DataLoader(TensorDataset(torch.randn(400, 8)), batch_size=4)):
            m(x).mean().backward(); opt.step(); opt.zero_grad()
            if i == 7:
                time.sleep(0.3)  # e.g. a checkpoint, then the failure
                raise RuntimeError("boom after step 7")
        """
    )
    record = run(script, [], WindowPlan(warmup=5, steps=10, timed=4))
    assert record.status == "failed" and record.completed_steps() == 8 and record.profiled_steps == 3
    report = analyze_run(RunDir(script.parent / "run"), AnalysisOptions.load(()))
    assert report.throughput["profiled"]["steps"] == 3
    assert "3 of the 10 planned steps were profiled" in report.status["message"]
    assert report.throughput["profiled"]["p90_step_ms"] < 200  # the 0.3 s is in no step
    assert report.run["after_last_step_s"] >= 0.3


#: a loop that builds its batches by hand (no DataLoader), their size from its own option
BY_HAND = """
import argparse, torch
p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--eval_batch_size", type=int, default=100)
p.add_argument("--max_iters", type=int, default=14)
a = p.parse_args()
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(64, 4)
for i in range(a.max_iters):
    m(x[: a.batch_size]).mean().backward(); opt.step(); opt.zero_grad()
"""


def test_a_script_that_batches_by_hand_is_counted_by_its_batch_option(write_script) -> None:
    # no DataLoader: each step holds the script's --batch-size samples (the evaluation batch is
    # not the training one), so its samples/s exists and a larger batch can be compared by it
    plan = WindowPlan(warmup=2, steps=3, timed=4)
    record = run(write_script(BY_HAND), [], plan)
    assert record.batch_option == {"flag": "--batch-size", "dest": "batch_size", "value": 8}
    assert record.samples_from == "--batch-size"
    assert record.samples_per_step and set(record.samples_per_step) == {8}
    assert record.timed_samples == 8 * record.timed_steps
    assert [o["flag"] for o in record.length_options] == ["--max_iters"]


def test_an_arg_knob_is_read_as_the_script_parsed_it(write_script) -> None:
    # --set arg.batch_size=16 reaches the script's --batch-size (respelled by the knobs); the
    # script's options are still read after that respelling: its run length and its new batch
    from diagnose.runtime.knobs import Knobs

    script = write_script(BY_HAND)
    knobs = Knobs.parse(["arg.batch_size=16"])
    target = resolve_target(str(script), None, knobs.apply_to_args([]))
    run_dir = script.parent / "run"
    run_dir.mkdir(exist_ok=True)
    plan = WindowPlan(warmup=2, steps=3, timed=4)
    record = run_target(target, plan, RunDir(run_dir), knobs=knobs, progress=Progress(enabled=False))
    assert record.batch_option is not None and record.batch_option["value"] == 16
    assert set(record.samples_per_step) == {16}
    assert [o["flag"] for o in record.length_options] == ["--max_iters"]


def test_a_batch_is_not_counted_from_an_option_that_cannot_be_told_apart(write_script) -> None:
    # two options that could each be the step's batch (a micro and a global one): neither counts
    script = write_script(BY_HAND.replace('p.add_argument("--eval_batch_size"', 'p.add_argument("--global_batch_size"'))
    record = run(script, [], WindowPlan(warmup=2, steps=3, timed=4))
    assert record.batch_option is None and record.samples_from is None
    assert not any(record.samples_per_step)
    # a DataLoader fed the steps: its batches count, whatever options the script has
    loader = write_script(
        EPOCHS.replace(
            'p.add_argument("--teardown"',
            'p.add_argument("--batch_size", type=int, default=99)\np.add_argument("--teardown"',
        )
    )
    record = run(loader, ["--epochs", "1"], WindowPlan(warmup=1, steps=1, timed=1))
    assert record.samples_from is None and record.samples_per_step == [4, 4, 2]


def test_the_batch_option_counts_a_step_whose_input_holds_it_first_or_second(write_script) -> None:
    # on the GPU the counted step's model input is measured: the option's value counts the step
    # where it is the input's first dimension (batch-first) or second (sequence-first, as an
    # LSTM language model's (35, 20)), and not where neither holds it (a batch split by hand)
    from diagnose.runtime.runner import _ScriptRun
    from diagnose.signals import SignalHold

    script = write_script(BY_HAND)
    run_dir = script.parent / "run"
    run_dir.mkdir(exist_ok=True)
    plan = WindowPlan(warmup=2, steps=3, timed=4)
    target = resolve_target(str(script), None, [])
    runner = _ScriptRun(target, plan, RunDir(run_dir), None, None, Progress(enabled=False), [], None, SignalHold())
    runner.script_args.batches = {"batch_size": {"flag": "--batch_size", "dest": "batch_size", "value": 20}}
    for dims, counted in (((20, 35), 20), ((35, 20), 20), ((35, 10), None), ((), None)):
        runner.memory_probe.input_dims = dims
        assert runner._option_batch() == counted, dims
    # the counted step: its FLOPs per sample count every micro-batch of an accumulated step,
    # its memory the samples one forward pass held
    seen: dict[str, object] = {}
    runner.step_count.stop = lambda samples: seen.setdefault("flops", samples)  # type: ignore[method-assign]
    runner.memory_probe.stop = lambda samples: seen.setdefault("memory", samples)  # type: ignore[method-assign]
    runner.script_args.accumulations = {"gradient_accumulation_steps": 4}
    runner.memory_probe.input_dims = (20, 35)
    runner._finish_counted_step()
    assert seen == {"flops": 80, "memory": 20}
    runner.script_args.batches = {}
    assert runner._option_batch() is None


#: nanoGPT's way: no argparse; ``--key=value`` arguments set module globals (its configurator)
CONFIGURATOR = """
import sys, torch
batch_size = 8
gradient_accumulation_steps = 1
max_iters = 14
for arg in sys.argv[1:]:
    assert arg.startswith("--") and "=" in arg, arg
    key, value = arg[2:].split("=")
    globals()[key] = int(value)
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(256, 4)
for i in range(max_iters):
    for _ in range(gradient_accumulation_steps):
        m(x[:batch_size]).mean().backward()
    opt.step(); opt.zero_grad()
"""


def test_a_script_that_reads_its_own_key_value_arguments_is_counted_by_them(write_script) -> None:
    # no parser: the --key=value arguments name the batch and the accumulation; a step of two
    # micro-batches of 16 holds 32 samples. The arg. knob goes in the script's own form
    # (--batch_size=32: the configurator asserts on a bare --batch_size)
    from diagnose.runtime.knobs import Knobs

    script = write_script(CONFIGURATOR)
    knobs = Knobs.parse(["arg.batch_size=16"])
    args = knobs.apply_to_args(["--gradient_accumulation_steps=2"])
    assert args == ["--gradient_accumulation_steps=2", "--batch_size=16"]
    record = run(script, args, WindowPlan(warmup=2, steps=3, timed=4))
    assert record.status in ("stopped", "completed"), record.error
    assert record.batch_option == {"flag": "--batch_size", "dest": "batch_size", "value": 16, "accumulation": 2}
    assert record.samples_from == "--batch_size" and set(record.samples_per_step) == {32}
    assert record.length_options == []  # its length is a global: max_iters not on the command line
    longer = run(script, [*args, "--max_iters=9"], WindowPlan(warmup=2, steps=3, timed=4))
    (option,) = longer.length_options
    assert option == {"flag": "--max_iters", "dest": "max_iters", "kind": "steps", "value": 9, "joined": True}
    # said as the script takes it: --max_iters=9, and the advice for more steps the same way
    assert longer.plan_fit["steps"] == 9 and longer.plan_fit["source"] == "--max_iters=9"
    assert more_steps([option], 36, None, 9) == "--max_iters=36"
    # without the option on its command line the script's batch is a global no one can read
    assert run(script, [], WindowPlan(warmup=2, steps=3, timed=4)).samples_from is None


def test_arg_knobs_follow_the_scripts_own_way_of_writing_options() -> None:
    from diagnose.runtime.knobs import Knobs

    knobs = Knobs.parse(["arg.batch_size=64", "arg.compile=flag", "arg.betas=0.9 0.95"])
    # --key value arguments: the knob's value follows its option, as before
    assert knobs.apply_to_args(["--epochs", "3", "--batch_size", "8"]) == [
        "--epochs", "3", "--batch_size", "64", "--compile", "--betas", "0.9", "0.95",
    ]  # fmt: skip
    # --key=value arguments, or none: joined (a list of values cannot be)
    assert knobs.apply_to_args(["--batch_size=8", "--eval_only=0"]) == [
        "--eval_only=0", "--batch_size=64", "--compile", "--betas", "0.9", "0.95",
    ]  # fmt: skip
    assert knobs.apply_to_args(["config.py"])[:2] == ["config.py", "--batch_size=64"]
