"""The whole run's accounting (analysis/measure/wholerun.py) on a hand-built record (tests/wholebuilder.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.analysis.measure.wholerun import BUCKETS, account
from diagnose.record import RunRecord
from tests.wholebuilder import SECONDS, WALL_S, whole_record


def test_every_second_lands_in_exactly_one_bucket() -> None:
    acc = account(whole_record())
    assert acc is not None
    assert acc.wall_s == pytest.approx(WALL_S)
    for bucket in BUCKETS:
        assert acc.seconds[bucket] == pytest.approx(SECONDS[bucket], abs=1e-9), bucket
    assert sum(acc.seconds.values()) == pytest.approx(WALL_S)
    assert acc.goodput == pytest.approx(8.7 / 16)
    assert acc.named_share == pytest.approx(1 - 3.2 / 16)


def test_a_checkpoint_inside_an_evaluation_is_checkpointing() -> None:
    spans = [
        {"kind": "eval", "start": 5.0, "end": 5.5, "name": "eval"},
        {"kind": "checkpoint", "start": 5.1, "end": 5.3, "name": "torch.save"},
    ]
    acc = account(whole_record(spans=spans))
    assert acc is not None
    assert acc.seconds["eval"] == pytest.approx(0.3)
    assert acc.seconds["checkpoint"] == pytest.approx(0.2)
    assert sum(acc.seconds.values()) == pytest.approx(WALL_S)


def test_the_shifts() -> None:
    acc = account(whole_record())
    assert acc is not None
    shifts = acc.shifts
    assert shifts["checkpoint"] == {"count": 2, "mean_s": pytest.approx(0.2), "every_steps": 2, "names": ["torch.save"]}
    assert shifts["data_startup"] == {
        "count": 2,
        "mean_s": pytest.approx(0.25),
        "after_first_s": pytest.approx(0.3),
        "persistent_workers": False,
        "num_workers": 2,
    }
    assert shifts["compile"]["recompiles"] == 1 and shifts["compile"]["recompile_s"] == pytest.approx(0.1)
    assert shifts["slowdown"] is None  # under 20 steps
    host = shifts["memory"]["host"]
    assert host["growth"] == pytest.approx(0.4) and host["rising_share"] == 1.0
    assert host["hours_to_capacity"] == pytest.approx((1e9 - 140e6) / (40e6 / 8) / 3600)


def test_memory_freed_after_the_last_step_does_not_hide_the_creep() -> None:
    """Seen on an H200 (examples/watch_memory_creep.py under watch): GPU memory rose from 0.1 to
    1.75 GB over the steps, then the script's end freed the list of losses and the last sample,
    taken there, read 0.07 GB: the growth came out negative and WHOLE004 stayed silent. Only the
    samples taken while steps ran count."""
    samples = [
        {"t": float(t), "steps": t - 1, "data_wait_s": 0.0, "rss_bytes": int(rss * 1e6)}
        for t, rss in ((2, 100), (4, 110), (6, 120), (8, 130), (10, 140), (15, 20))
    ]
    acc = account(whole_record(samples=samples))  # the last step at 14 s, the script's end 15 s
    assert acc is not None
    host = acc.shifts["memory"]["host"]
    assert host["end_bytes"] == 140e6 and host["growth"] == pytest.approx(0.4) and host["rising_share"] == 1.0


def test_a_step_that_slows_down_is_measured_against_the_early_pace() -> None:
    # 100 steps: 10 ms each for the first fifth, then each 0.2 ms longer than the one before
    durations = [0.010] * 20 + [0.010 + 0.0002 * i for i in range(1, 81)]
    boundaries = [0.0]
    for d in durations:
        boundaries.append(boundaries[-1] + d)
    acc = account(
        whole_record(
            boundaries_s=boundaries,
            spans=[],
            loaders=[],
            compiles=[],
            last_optimizer_step_s=None,
            script_end_s=boundaries[-1],
            process_start_s=0.0,
        )
    )
    assert acc is not None
    slow = acc.shifts["slowdown"]
    assert slow["early_ms"] == pytest.approx(10.0)
    assert slow["late_ms"] == pytest.approx(10.0 + 0.2 * 70.5)  # median of steps 61..80 of the rise
    assert slow["lost_s"] == pytest.approx(sum(0.0002 * i for i in range(1, 81)))


def test_a_run_that_was_not_watched_has_no_accounting() -> None:
    assert account(RunRecord()) is None


def test_the_timeline_slices_sum_to_one() -> None:
    acc = account(whole_record())
    assert acc is not None and len(acc.timeline) == 200
    for piece in acc.timeline:
        assert sum(piece["shares"].values()) == pytest.approx(1.0, abs=1e-3)
    assert acc.timeline[0]["shares"] == {"startup": 1.0}  # the first 80 ms: before the first step


def test_a_jobs_goodput_is_training_time_over_wall_clock_summed_over_its_ranks() -> None:
    from diagnose.analysis.measure.wholerun import job_section

    slow = whole_record(script_end_s=31.0)  # the same steps, 16 s more teardown: 32 s of wall-clock
    section = job_section(None, {0: whole_record(), 1: slow, 2: RunRecord()})
    assert section is not None
    assert [row["rank"] for row in section["ranks"]] == [0, 1]
    assert section["ranks"][0]["goodput"] == pytest.approx(8.7 / 16, abs=1e-6)
    assert section["ranks"][1]["goodput"] == pytest.approx(8.7 / 32, abs=1e-6)
    assert section["job_goodput"] == pytest.approx(2 * 8.7 / 48, abs=1e-6)
    assert section["wall_s"] == pytest.approx(16.0)  # the first rank's accounting, the ranks beside it
    assert job_section(None, {0: RunRecord()}) is None


def test_a_stall_in_a_step_that_saved_is_the_saves() -> None:
    """The second save moved into step 9 (10 s to 14 s) as 12.0-12.5 s: the step's 3.5 s beyond
    the save's span exceed 3x the typical step (the median of the residuals, now 0.9 s), and the
    excess, 2.6 s, is the save's (deleting the last checkpoint's file, building the state dict:
    seen on an H100, 50 ms a save beyond torch.save), not an unexplained stall."""
    spans = [
        {"kind": "eval", "start": 5.0, "end": 5.5, "name": "eval"},
        {"kind": "checkpoint", "start": 7.2, "end": 7.4, "name": "torch.save"},
        {"kind": "checkpoint", "start": 12.0, "end": 12.5, "name": "torch.save"},
    ]
    acc = account(whole_record(spans=spans))
    assert acc is not None
    assert acc.seconds["stalls"] == 0.0
    assert acc.seconds["checkpoint"] == pytest.approx(0.2 + 0.5 + 2.6)
    assert sum(acc.seconds.values()) == pytest.approx(WALL_S)
    saves = acc.events["checkpoint"]
    assert [e["seconds"] for e in saves] == pytest.approx([0.2, 3.1]) and saves[1]["tied_s"] == pytest.approx(2.6)
    assert acc.shifts["checkpoint"]["mean_s"] == pytest.approx(1.65)


def test_a_stall_while_the_thread_waited_for_a_cpu_is_contention() -> None:
    # the samples say the main thread waited 1.0 s on a run queue between 9 s and 11 s: step 9's
    # 3.2 s stall (10 s to 14 s) overlaps that interval and takes the second
    samples = [
        {"t": float(t), "steps": t - 1, "rss_bytes": int(1e8), "run_delay_s": d}
        for t, d in ((2, 0.1), (9, 0.2), (11, 1.2), (15, 1.2))
    ]
    acc = account(whole_record(samples=samples))
    assert acc is not None
    assert acc.seconds["contention"] == pytest.approx(1.0)
    assert acc.seconds["stalls"] == pytest.approx(2.2)
    assert sum(acc.seconds.values()) == pytest.approx(WALL_S)


def test_the_waits_of_all_the_threads_explain_a_stall_the_main_threads_own_do_not() -> None:
    # the main thread waited 0.2 s between 9 s and 11 s, its intra-op threads 1.5 s more: the
    # threads' sum, where recorded, is the one read (1.7 s of step 9's 3.2 s stall)
    samples = [
        {"t": float(t), "steps": t - 1, "rss_bytes": int(1e8), "run_delay_s": d, "threads_run_delay_s": a}
        for t, d, a in ((2, 0.1, 0.1), (9, 0.2, 0.3), (11, 0.4, 2.0), (15, 0.4, 2.0))
    ]
    acc = account(whole_record(samples=samples))
    assert acc is not None
    assert acc.seconds["contention"] == pytest.approx(1.7)
    assert acc.seconds["stalls"] == pytest.approx(1.5)
    assert sum(acc.seconds.values()) == pytest.approx(WALL_S)


def test_run_delays_add_up_every_threads_wait_since_the_last_read(tmp_path: Path) -> None:
    from diagnose.runtime.procfs import RunDelays

    def threads(**waits_ns: int) -> None:
        for tid in [p.name for p in tmp_path.iterdir()]:
            (tmp_path / tid / "schedstat").unlink()
            (tmp_path / tid).rmdir()
        for tid, ns in waits_ns.items():
            (tmp_path / tid[1:]).mkdir()
            (tmp_path / tid[1:] / "schedstat").write_text(f"123 {ns} 7\n")

    delays = RunDelays(str(tmp_path))
    threads(t1=1_000_000_000, t2=500_000_000, t9=0)
    assert delays.read(skip=9) == 0.0  # the first read is the baseline
    threads(t1=1_200_000_000, t2=800_000_000, t9=5_000_000_000)
    assert delays.read(skip=9) == pytest.approx(0.5)  # 0.2 + 0.3; the sampler's own thread left out
    threads(t1=1_300_000_000, t3=2_000_000_000)  # t2 ended, t3 is new: it adds nothing yet
    assert delays.read(skip=9) == pytest.approx(0.6)
    threads(t1=1_300_000_000, t3=2_250_000_000)
    assert delays.read(skip=9) == pytest.approx(0.85)
    # one thread's own, from the same read: the training thread's wait
    assert delays.waited(3) == pytest.approx(2.25) and delays.waited(2) is None and delays.waited(None) is None
    absent = RunDelays(str(tmp_path / "absent"))
    assert absent.read() is None and absent.waited(1) is None


def _rising_steps(rise_s: float) -> RunRecord:
    """100 steps: 10 ms each for the first fifth, then each ``rise_s`` longer than the one before."""
    durations = [0.010] * 20 + [0.010 + rise_s * i for i in range(1, 81)]
    boundaries = [0.0]
    for d in durations:
        boundaries.append(boundaries[-1] + d)
    return whole_record(
        boundaries_s=boundaries,
        spans=[],
        loaders=[],
        compiles=[],
        last_optimizer_step_s=None,
        script_end_s=boundaries[-1],
        process_start_s=0.0,
    )


def test_creeping_memory_costs_time_only_where_the_steps_slowed() -> None:
    """WHOLE004's bound: the time the slower steps lost, where the late step is 1.3x the early
    one or more; where the steps kept their pace the cost is unknown (None), not a 1.0x bound
    that would drop the finding."""
    from diagnose.analysis.symptoms import wholerun as W

    slowed = _rising_steps(0.0002)  # late median 24.1 ms against 10 ms
    acc = account(slowed)
    assert acc is not None
    lost = sum(0.0002 * i for i in range(1, 81))
    assert W.creep_lost_share.compute(slowed) == pytest.approx(lost / acc.wall_s)
    steady = _rising_steps(0.000001)  # late median 10.07 ms: kept its pace
    assert account(steady).shifts["slowdown"]["ratio"] < W.SLOWED
    assert W.creep_lost_share.compute(steady) is None
