"""Timed steps at an epoch's turn are left out of the steady figures (RunRecord.steady_steps).

Fifteen timed steps of a 20-batch epoch hold the epoch's end and an evaluation pass where the
same steps at half the batch hold none: compared by their means, timm's ResNet-18 at twice its
batch measured 0.46x on an H100 (docs/zoo.md, the third run) while its training steps ran at the
old pace. Hand-built records, exact expectations."""

from __future__ import annotations

import pytest

from diagnose.record import DataLoaderInfo, RunRecord, WindowPlan
from diagnose.renderers.terminal import TerminalRenderer
from diagnose.report import Report
from tests.recordbuilder import record_from_steps, report_of_record

#: warm-up 1, profiled 2, the export step, then 8 timed steps (indices 4-11)
PLAN = WindowPlan(warmup=1, steps=2, timed=8)


def _loader(starts: list[float], dataset_len: int = 640) -> DataLoaderInfo:
    return DataLoaderInfo(
        loader_id=len(starts),
        created_at=None,
        dataset="ImageDataset",
        dataset_len=dataset_len,
        batch_size=64,
        num_workers=4,
        pin_memory=False,
        prefetch_factor=2,
        persistent_workers=True,
        drop_last=True,
        first_batch_at_s=starts,
    )


def _record(durations_ms: list[float], loaders: list[DataLoaderInfo]) -> RunRecord:
    return record_from_steps(durations_ms, PLAN, 64, dataloaders=loaders)


#: steps 0-3 (warm-up, window, export) then 8 timed steps of 20 ms, one of them (index 7, from
#: 0.23 s to 1.23 s) 1 s long: the evaluation pass and the new epoch's start
DURATIONS = [10, 30, 30, 100, 20, 20, 20, 1000, 20, 20, 20, 20]


def test_a_step_in_which_an_iterator_began_is_a_turn() -> None:
    # the training loader's first epoch began before step 0; the evaluation loader at 0.25 s (step
    # 7: 0.23-1.23 s) and the training loader's second epoch at 1.20 s (step 7 too)
    record = _record(DURATIONS, [_loader([-0.5, 1.20]), _loader([0.25], dataset_len=320)])
    assert record.turn_steps() == {7}
    assert record.steady_steps() == [4, 5, 6, 8, 9, 10, 11]
    assert record.steady_left_out() == 1
    assert record.steady_durations() == pytest.approx([0.02] * 7)
    assert record.steady_mean_s() == pytest.approx(0.02)


def test_without_a_turn_the_figures_are_the_timed_steps_sum() -> None:
    record = _record(DURATIONS, [_loader([-0.5])])
    assert record.turn_steps() == set()
    assert record.steady_left_out() == 0
    assert record.steady_mean_s() == pytest.approx(1.14 / 8)  # the synchronised sum over the count


def test_a_loop_that_makes_an_iterator_every_step_keeps_all_its_steps() -> None:
    # next(iter(loader)) each step: every timed step is a "turn"; fewer than half would remain
    starts = [sum(DURATIONS[:i]) / 1000 + 0.001 for i in range(len(DURATIONS))]
    record = _record(DURATIONS, [_loader(starts)])
    assert len(record.turn_steps()) == len(DURATIONS)
    assert record.steady_steps() == list(range(4, 12))
    assert record.steady_left_out() == 0


def test_the_report_says_what_was_left_out_and_measures_the_rest() -> None:
    record = _record(DURATIONS, [_loader([-0.5, 1.20]), _loader([0.25], dataset_len=320)])
    report = report_of_record(record)
    steady = report.throughput["steady"]
    assert steady["steps"] == 7 and steady["left_out"] == 1
    assert steady["mean_step_ms"] == pytest.approx(20.0)
    assert steady["samples_per_s"] == pytest.approx(3200.0)
    plain = report_of_record(_record(DURATIONS, [_loader([-0.5])]))
    assert "left_out" not in plain.throughput["steady"]
    assert plain.throughput["steady"]["mean_step_ms"] == pytest.approx(142.5)
    text = TerminalRenderer(color=False, width=200).render(Report.from_dict(report.to_dict()))
    assert "Steady state (profiler off, 7 steps)" in text
    assert "1 timed step(s) left out: an epoch's turn or an evaluation pass began in them" in text


def test_a_persistent_workers_loader_records_each_epochs_first_batch(write_script, tmp_path) -> None:
    """With persistent workers ``iter(loader)`` hands back the same iterator each epoch: its count
    of first batches must restart, or the epochs after the first record no start (and no turn)."""
    from diagnose.progress import Progress
    from diagnose.rundir import RunDir
    from diagnose.runtime.runner import resolve_target, run_target
    from tests.scripts import MLP_TRAIN

    script = write_script(
        MLP_TRAIN.replace(
            "DataLoader(ds, batch_size=a.batch_size, shuffle=True)",
            "DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=2, persistent_workers=True)",
        )
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    plan = WindowPlan(warmup=2, steps=3, timed=6)  # 12 steps of 4-batch epochs: three epochs begin
    record = run_target(
        resolve_target(str(script), None, ["--batch-size", "128"]),
        plan,
        RunDir(run_dir),
        progress=Progress(enabled=False),
    )
    (loader,) = record.dataloaders
    assert loader.iterators_created == 1  # one iterator, its workers kept
    assert len(loader.first_batch_at_s) >= 3 and len(loader.workers_ready_s) == len(loader.first_batch_at_s)
    timed = range(record.first_timed_step(), record.first_timed_step() + record.timed_steps)
    assert record.turn_steps() & set(timed)  # an epoch began inside the timed steps


def test_where_epochs_are_no_longer_than_the_timed_steps_their_turns_stay() -> None:
    """Four batches an epoch, eight timed steps: turns recur in the window at their own rate, and
    what persistent workers save (DATA005) is in them; nothing is left out."""
    short = _loader([-0.5, 1.20], dataset_len=256)
    short.fetches_in_window = 2  # the loader that fed the profiled steps: its epoch is the run's
    record = _record(DURATIONS, [short])
    assert record.epoch_batches() == 4
    assert record.turn_steps() == {7}
    assert record.steady_steps() == list(range(4, 12)) and record.steady_left_out() == 0
    long = _loader([-0.5, 1.20], dataset_len=640)
    long.fetches_in_window = 2
    assert _record(DURATIONS, [long]).steady_left_out() == 1  # ten batches an epoch: left out


def test_a_short_epochs_turns_stay_in_the_steady_figures_and_leave_the_turn_free_ones() -> None:
    """Four batches an epoch: the steady figures keep the 1 s turn (142.5 ms a step); the report
    also gives them without it (20 ms a step), what a run of another batch is compared by."""
    short = _loader([-0.5, 1.20], dataset_len=256)
    short.fetches_in_window = 2
    record = _record(DURATIONS, [short])
    assert record.steady_steps(every_turn=True) == [4, 5, 6, 8, 9, 10, 11]
    assert record.steady_left_out(every_turn=True) == 1
    report = report_of_record(record)
    throughput = report.throughput
    assert "left_out" not in throughput["steady"]
    assert throughput["steady"]["mean_step_ms"] == pytest.approx(142.5)
    turn_free = throughput["turn_free"]
    assert turn_free["steps"] == 7 and turn_free["left_out"] == 1
    assert turn_free["mean_step_ms"] == pytest.approx(20.0)
    assert turn_free["samples_per_s"] == pytest.approx(3200.0)
    # where the steady figures left the turn out already, or no turn fell in them: no second set
    long = _loader([-0.5, 1.20], dataset_len=640)
    long.fetches_in_window = 2
    for loaders in ([long], [_loader([-0.5])]):
        built = report_of_record(_record(DURATIONS, loaders))
        assert "turn_free" not in built.throughput
