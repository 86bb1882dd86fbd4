"""The steady steps' data wait, measured: the running sum of the training thread's waits inside
DataLoader ``__next__`` at each step boundary (``RunRecord.data_wait_s``), its share over the
steady steps (``RunRecord.steady_data_wait_share``, symptom ``data.steady_wait``), and the data
wait the rules read (``data.wait``): the window's, or the steady steps' where larger.

A profiled window right after the warm-up can draw the batches the workers queued before it:
timm's ResNet-18 waited 9% of its window and half of its steady steps (docs/zoo.md, the fifth
run). The steady steps are timed with the profiler off after the untimed ones that drew what
the workers queued during the window."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest

from diagnose.analysis.prediction.predict import (
    LOADER_PACED_WAIT,
    loader_paced_now,
    loader_paced_steady,
    predict,
    steady_wait_gain,
    worker_cpu_per_batch_ms,
)
from diagnose.analysis.prediction.replay import replay_check
from diagnose.analysis.symptoms.dataloader import balance as BALANCE
from diagnose.analysis.symptoms.dataloader import data_wait as DATA_WAIT
from diagnose.analysis.symptoms.registry import Known
from diagnose.record import RunRecord, WindowPlan
from tests.conftest import REPO
from tests.recordbuilder import record_from_steps
from tests.test_cli import diagnose
from tests.test_replay import model_of, worker_steps

SHORT = ["--warmup", "3", "--steps", "4", "--max-steps", "4", "--timed-steps", "12", "--no-check", "--json"]
SLOW_WORKERS = ["--", "--small", "--batch-ms", "600"]
#: warm-up 1, profiled 2 (boundaries 1-3), the export's step 3, timed 4: steps 4-7
PLAN = WindowPlan(warmup=1, steps=2, timed=4)


def waits_of(per_step_ms: list[float]) -> list[float]:
    """The running sum at each boundary of steps that waited ``per_step_ms`` each."""
    sums = [0.0]
    for w in per_step_ms:
        sums.append(sums[-1] + w / 1000)
    return sums


def test_the_steady_wait_is_the_timed_steps_waits_over_their_time() -> None:
    """Eight 20 ms steps: the profiled ones waited 1 ms each, the timed ones (4-7) 12, 0, 10 and
    8 ms: 30 ms of their 80 ms."""
    waits = [0, 1, 1, 5, 12, 0, 10, 8]
    record = record_from_steps([20.0] * 8, PLAN, 32, data_wait_s=waits_of(waits))
    assert record.steady_data_wait_share() == pytest.approx(30 / 80)
    # steps after the window that drew the workers' queue are not steady: one untimed step moves the timing
    skipped = record_from_steps([20.0] * 9, PLAN, 32, timed_skipped=1, data_wait_s=waits_of([*waits, 20]))
    assert skipped.steady_data_wait_share() == pytest.approx(38 / 80)


def test_no_steady_wait_is_made_up_where_the_record_holds_none_or_holds_it_misaligned() -> None:
    assert record_from_steps([20.0] * 8, PLAN, 32).steady_data_wait_share() is None
    short = record_from_steps([20.0] * 8, PLAN, 32, data_wait_s=[0.0, 0.001])
    assert short.steady_data_wait_share() is None
    assert RunRecord.from_dict(RunRecord(data_wait_s=[0.0, 0.5]).to_dict()).data_wait_s == [0.0, 0.5]


def data_wait(values: dict[str, float]) -> object:
    return DATA_WAIT.compute(known=Known(values, DATA_WAIT))


def test_the_rules_read_the_measured_steady_wait_before_what_the_cpu_time_implies() -> None:
    # measured: it stands, larger or smaller than what the CPU time implies
    assert data_wait({"exposed.data_wait": 0.09, "data.steady_wait": 0.5, "workers.steady_wait": 0.3}) == 0.5
    assert data_wait({"exposed.data_wait": 0.09, "data.steady_wait": 0.02, "workers.steady_wait": 0.56}) == 0.09
    # not recorded (an older run): the CPU time's; the window's where larger; nothing without a window
    assert data_wait({"exposed.data_wait": 0.09, "workers.steady_wait": 0.56}) == 0.56
    assert data_wait({"exposed.data_wait": 0.4, "data.steady_wait": 0.1}) == 0.4
    assert data_wait({"data.steady_wait": 0.5}) is None


def test_a_run_records_each_steps_wait_and_a_loader_that_cannot_keep_up_shows_in_its_steady_steps(
    tmp_path: Path,
) -> None:
    """examples/prefetch_loader.py: two workers that sleep 600 ms a batch (no CPU time to measure)
    behind a tiny model: one batch every 300 ms, which the steady steps wait for most of (on a
    busy 2-core machine the tiny model's CPU step took 40-100 ms)."""
    out = tmp_path / "run"
    done = diagnose("run", "--out", str(out), *SHORT, "prefetch_loader.py", *SLOW_WORKERS, cwd=REPO / "examples")
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((out / "diagnose" / "run.json").read_text())
    waits, boundaries = record["data_wait_s"], record["boundaries_s"]
    assert len(waits) == len(boundaries) > 20
    assert all(b >= a for a, b in pairwise(waits))  # a running sum
    symptoms = json.loads(done.stdout)["symptoms"]
    assert symptoms["data.steady_wait"]["value"] > 0.3
    assert symptoms["data.wait"]["value"] >= symptoms["data.steady_wait"]["value"]


def test_where_the_steady_steps_waited_the_loaders_pace_is_their_mean_step() -> None:
    """Two 100 µs steps whose fetches took batches at hand (tests/test_replay.py); one worker, no
    CPU time measured (it sleeps), steady steps of 300 µs that waited 40% of the time: the loader
    hands over a batch every 300 µs. Paced so, the window replays 598 µs (the first batch ready
    at 200 µs), and six workers (one every 50 µs) keep up: 200 µs, 2.99x. A steady wait under
    ``LOADER_PACED_WAIT`` says nothing of the loader's pace."""
    model = model_of(worker_steps())
    facts = {"dataloader.num_workers": 1, "cpu.count": 16, "step.steady_mean_ms": 0.3, "data.steady_wait": 0.4}
    assert worker_cpu_per_batch_ms(facts) == pytest.approx(0.3)
    assert loader_paced_steady(facts)
    now = loader_paced_now(model, facts)
    assert now is not None and now.window_us == pytest.approx(598.0)
    more = predict(model, replay_check(model), "more_workers", facts, {"num_workers": 6})
    assert more.speedup == pytest.approx(598 / 200)
    calm = {**facts, "data.steady_wait": LOADER_PACED_WAIT / 2}
    assert worker_cpu_per_batch_ms(calm) is None and not loader_paced_steady(calm)
    # measured, it stands over the CPU time's figure either way
    assert not loader_paced_steady({**calm, "workers.steady_wait": 0.5})
    assert loader_paced_steady({"workers.steady_wait": 0.5})


def test_more_workers_whose_replay_and_steady_wait_disagree_are_weak_and_their_interval_reaches_the_other() -> None:
    """The paced replay above says 2.99x (the window's own step without its wait: 200 µs). The
    steady steps' measured wait says what removing it gains: 40% -> 1.67x (their own work 180 µs
    of 300), 90% -> 10x. Either disagrees beyond more workers' 29% error: the prediction is weak,
    says both, and its interval reaches down (a floor) or up (a reach) to the other figure. A
    steady wait the replay agrees with leaves it sure; one under ``LOADER_PACED_WAIT`` says nothing."""
    model = model_of(worker_steps())
    facts = {"dataloader.num_workers": 1, "cpu.count": 16, "step.steady_mean_ms": 0.3, "data.steady_wait": 0.4}
    check = replay_check(model)
    low = predict(model, check, "more_workers", facts, {"num_workers": 6})
    assert low.speedup == pytest.approx(598 / 200)
    assert low.floor == pytest.approx(1 / 0.6) and low.reach is None
    assert low.weak is not None and "2.99x" in low.weak and "(40%) 1.67x" in low.weak
    high = predict(model, check, "more_workers", {**facts, "data.steady_wait": 0.9}, {"num_workers": 6})
    assert high.speedup == pytest.approx(598 / 200)
    assert high.reach == pytest.approx(10.0) and high.floor is None and high.weak is not None
    agree = predict(model, check, "more_workers", {**facts, "data.steady_wait": 0.65}, {"num_workers": 6})
    assert steady_wait_gain({**facts, "data.steady_wait": 0.65}) == pytest.approx(
        1 / 0.35
    )  # 2.86x: within 29% of 2.99x
    assert agree.weak is None and agree.floor is None and agree.reach is None
    assert steady_wait_gain({**facts, "data.steady_wait": LOADER_PACED_WAIT / 2}) is None
    assert steady_wait_gain({}) is None


def test_the_workers_balance_reads_the_steady_pace_of_workers_that_spend_little_cpu() -> None:
    """Two workers that sleep 40 ms a batch (1 ms of CPU), 2 ms steps whose steady mean is 20 ms,
    90% of it waiting: a worker takes 20 x 2 = 40 ms a batch, and 20 of them keep up with 2 ms
    steps. By the CPU time alone one would."""
    values = {
        "workers.cpu_per_batch_ms": 1.0,
        "dataloader.num_workers": 2,
        "cpu.count": 16,
        "step.median_ms": 2.0,
        "exposed.data_wait": 0.0,
        "step.steady_mean_ms": 20.0,
        "data.steady_wait": 0.9,
    }
    assert BALANCE.compute(known=Known(values, BALANCE)) == 20
    assert BALANCE.compute(known=Known({**values, "data.steady_wait": None}, BALANCE)) == 1
