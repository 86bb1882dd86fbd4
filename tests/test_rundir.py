"""The run directory and the window plan: the names of a run's files, what is loaded and saved,
which trace is analysed, and the window's step arithmetic and command-line form."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import typer

from diagnose.analysis.pipeline import AnalysisOptions
from diagnose.analysis.report import Report
from diagnose.cli import app
from diagnose.errors import OutputError, UsageError
from diagnose.record import RunRecord, WindowPlan
from diagnose.rundir import WRITE_PROBE, RunDir, default_location, shared_location
from diagnose.session import analyze_and_save, analyze_run
from tests.tracebuilder import TraceBuilder


def cpu_trace(path: Path, first_step: int = 2, data_wait_us: int = 300) -> Path:
    b = TraceBuilder(device=False)
    for i in range(2):
        t = i * 1000
        b.step(first_step + i, t, 1000)
        b.data_wait(t, data_wait_us)
        b.op("aten::linear", t + data_wait_us, 300, forward=True)
    b.write(path, gz=True)
    return path


# --- names ------------------------------------------------------------------------------------


def test_names_of_a_single_process_run(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.record_path() == tmp_path / "diagnose" / "run.json"
    assert run.report_path == tmp_path / "diagnose" / "report.json"
    assert run.html_path == tmp_path / "report.html"
    assert run.workers_path() == tmp_path / "workers"
    assert run.plot_path == tmp_path / "sweep.png"
    trace = run.new_trace_path()
    assert trace.parent == tmp_path
    assert trace.name.startswith(f"{socket.gethostname()}_{os.getpid()}.") and trace.name.endswith(".pt.trace.json.gz")


def test_names_of_a_rank(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.record_path(2) == tmp_path / "diagnose" / "rank2.run.json"
    assert run.workers_path(2) == tmp_path / "workers-rank2"
    assert run.new_trace_path(2).name.startswith(f"rank2_{socket.gethostname()}_{os.getpid()}.")


def test_child_folders_of_verify_and_sweep_are_named_after_their_labels(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.child("baseline-1").path == tmp_path / "baseline-1"
    assert run.child("num_workers=2 pin_memory=true").path == tmp_path / "num_workers=2_pin_memory=true"
    assert run.child("a/b").path == tmp_path / "a_b"  # never a subfolder
    for unusable in ("???", "/..//", "."):  # nothing usable left, or a way out of the folder
        assert run.child(unusable).path == tmp_path / "run"


def test_default_and_shared_locations() -> None:
    first = default_location("train", root=Path("/nonexistent"))
    assert first.parent == Path("/nonexistent") and first.name.startswith("train-")
    assert shared_location("train", {"TORCHELASTIC_RUN_ID": "abc"}) == Path("runs/train-abc")
    assert shared_location("train", {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77"}) == Path("runs/train-77")
    assert shared_location("train", {"MASTER_PORT": "29500"}) == Path("runs/train-port29500")


def test_default_location_is_unique_within_a_second(tmp_path: Path) -> None:
    first = default_location("train", root=tmp_path)
    assert first.is_dir()  # claimed: made by an exclusive mkdir
    second = default_location("train", root=tmp_path)
    assert second != first and second.name.startswith(first.name)


def test_an_older_layout_with_its_files_at_the_top_is_still_read(tmp_path: Path) -> None:
    RunRecord(status="stopped").save(tmp_path / "run.json")
    RunRecord(status="failed").save(tmp_path / "rank1.run.json")
    status = {"state": "stopped", "exit_code": 0, "message": "", "error": None}
    Report(verdict="old", source={"kind": "run"}, status=status).save(tmp_path / "report.json")
    run = RunDir(tmp_path)
    assert run.record_path() == tmp_path / "run.json" and run.load_record().status == "stopped"
    assert run.ranks() == [1] and run.load_ranks()[1].status == "failed"
    assert run.load_report().verdict == "old"
    run.save_report(
        Report(verdict="again", source={"kind": "run"}, status=status)
    )  # re-analysing an old run rewrites its own file
    assert Report.load(tmp_path / "report.json").verdict == "again"


def hta_trace_files(folder: Path) -> list[str]:
    """HTA's rule (hta/common/trace_file.py, create_rank_to_trace_dict_from_dir): every name at the
    top of the folder ending in .gz or .json is read as a trace."""
    return sorted(name for name in os.listdir(folder) if name.endswith((".gz", ".json")))


def test_the_traces_are_the_only_json_files_at_the_top_of_a_run_directory(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    trace = cpu_trace(run.new_trace_path())
    run.save_record(RunRecord(status="stopped", trace_files=[trace.name]))
    analyze_and_save(run, AnalysisOptions.load(), html=True)
    run.save_record(RunRecord(status="stopped"), rank=0)
    assert hta_trace_files(tmp_path) == [trace.name]
    assert run.report_path.is_file() and run.load_record() is not None


def test_hta_reads_a_run_directory_as_it_is(tmp_path: Path) -> None:
    trace_analysis = pytest.importorskip("hta.trace_analysis")
    run = RunDir(tmp_path)
    cpu_trace(run.new_trace_path())
    analyze_and_save(run, AnalysisOptions.load(), html=True)
    analysis = trace_analysis.TraceAnalysis(trace_dir=str(tmp_path))
    assert list(analysis.t.traces) == [0]


# --- creating ---------------------------------------------------------------------------------


def test_create_makes_the_folder_and_refuses_a_used_one(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "a" / "b")
    assert run.path.is_dir() and run.path.is_absolute()
    (run.path / "run.json").write_text("{}")
    with pytest.raises(OutputError, match="already exists and is not empty"):
        RunDir.create(run.path)
    assert RunDir.create(run.path, overwrite=True).path == run.path
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="is not a folder"):
        RunDir.create(tmp_path / "file")


def test_another_process_write_probe_is_not_content(tmp_path: Path) -> None:
    """The nodes of a multi-node job create their shared --out at the same instant: the write
    probe one node had not yet removed made the other's folder "not empty", that node ended and
    the first waited at torchrun's rendezvous for a node that never came (a CI run, 400 s)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / f"{WRITE_PROBE}4242").write_text("")
    assert RunDir.create_for("train", shared, shared=True).path == shared
    (shared / "rank0.run.json").write_text("{}")
    with pytest.raises(OutputError, match="already exists and is not empty"):
        RunDir.create_for("train", shared, shared=True)


def test_create_for_takes_out_or_a_fresh_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert RunDir.create_for("train", tmp_path / "given").path == tmp_path / "given"
    fresh = RunDir.create_for("train", None)
    assert fresh.path.parent == tmp_path / "runs" and fresh.path.name.startswith("train-")


# --- load and save ----------------------------------------------------------------------------


def test_record_round_trip_per_rank(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.load_record() is None and run.ranks() == [] and run.load_ranks() == {}
    run.save_record(RunRecord(status="stopped", trace_files=["a.pt.trace.json.gz"]))
    assert run.load_record() == RunRecord(status="stopped", trace_files=["a.pt.trace.json.gz"])
    run.save_record(RunRecord(status="failed"), rank=1)
    run.save_record(RunRecord(status="stopped"), rank=0)
    assert run.ranks() == [0, 1]
    assert {r: rec.status for r, rec in run.load_ranks().items()} == {0: "stopped", 1: "failed"}


def test_report_round_trip_and_clear_errors(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    with pytest.raises(UsageError, match=r"no report\.json in"):
        run.load_report()
    report = Report(verdict="fine", warnings=["w"])
    assert run.save_report(report) == tmp_path / "diagnose" / "report.json"
    assert run.load_report().to_dict() == report.to_dict()
    run.report_path.write_text("{not json")
    with pytest.raises(UsageError, match="cannot read"):
        run.load_report()


def test_save_html_and_events(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    cpu_trace(run.new_trace_path())
    report = analyze_and_save(run, AnalysisOptions.load(), html=True)
    assert run.html_path.read_text().startswith("<!DOCTYPE html>")
    assert Report.load(run.report_path).verdict == report.verdict
    assert len(list(tmp_path.glob("events.out.tfevents.*.diagnose"))) == 1


def test_an_unwritable_report_is_an_output_error(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.report_path.mkdir(parents=True)  # a folder where the file should go
    with pytest.raises(OutputError, match="cannot write"):
        run.save_report(Report())


# --- which trace ------------------------------------------------------------------------------


def test_the_trace_run_json_names_wins_over_the_last_in_the_folder(tmp_path: Path) -> None:
    """An earlier run's trace left by --overwrite may sort after this run's: pids are not in
    time order (host_999 sorts after host_1000)."""
    run = RunDir(tmp_path)
    ours = cpu_trace(tmp_path / "host_1000.1700000000000.pt.trace.json.gz", data_wait_us=300)
    stale = cpu_trace(tmp_path / "host_999.1600000000000.pt.trace.json.gz", data_wait_us=700)
    assert run.traces() == [ours, stale]
    record = RunRecord(status="stopped", trace_files=[ours.name])
    chosen, warnings = run.trace_for(record)
    assert chosen == ours
    assert warnings == [f"1 other trace(s) in the run directory; analysed {ours.name}, the one its record names"]
    run.save_record(record)
    report = analyze_run(run, AnalysisOptions.load())
    assert report.source["trace"] == str(ours)
    assert report.breakdown["steps"][0]["exposed_ms"]["data_wait"] == pytest.approx(0.3)  # type: ignore[index]


def test_without_a_record_naming_one_the_last_trace_by_name(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.trace_for(None) == (None, [])
    a = cpu_trace(tmp_path / "a.pt.trace.json.gz")
    b = cpu_trace(tmp_path / "b.pt.trace.json.gz")
    (tmp_path / "notes.json").write_text("{}")  # not a trace
    assert run.trace_for(None) == (b, [f"2 traces in the run directory; analysed {b.name}"])
    gone = RunRecord(trace_files=["deleted.pt.trace.json.gz"])  # the record names a trace no longer there
    assert run.trace_for(gone)[0] == b
    assert run.trace_for(RunRecord(trace_files=[a.name])) == (
        a,
        [f"1 other trace(s) in the run directory; analysed {a.name}, the one its record names"],
    )


def test_a_rank_gets_its_own_trace(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    r0 = cpu_trace(tmp_path / "rank0_host_5.1.pt.trace.json.gz")
    r1_old = cpu_trace(tmp_path / "rank1_host_9.1.pt.trace.json.gz")
    r1 = cpu_trace(tmp_path / "rank1_host_10.2.pt.trace.json.gz")
    assert run.traces(0) == [r0]
    assert run.trace_for(None, rank=1)[0] == r1_old  # by name alone
    assert run.trace_for(RunRecord(trace_files=[r1.name]), rank=1)[0] == r1


def test_a_folder_with_neither_record_nor_trace_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"neither run\.json nor a trace"):
        analyze_run(RunDir(tmp_path), AnalysisOptions.load())


# --- the window plan --------------------------------------------------------------------------


def test_window_arithmetic() -> None:
    plan = WindowPlan(warmup=3, steps=4, timed=5)
    assert plan.window_end == 7
    assert plan.first_timed == 8  # step 7 absorbs the trace export
    assert plan.last_boundary == 13
    assert [k for k in range(15) if plan.in_window(k)] == [3, 4, 5, 6]
    assert [plan.profiled(done) for done in (0, 3, 4, 7, 20)] == [0, 0, 1, 4, 4]
    assert list(range(20))[plan.timed_slice()] == [8, 9, 10, 11, 12]


def test_window_argv() -> None:
    # a fixed window says so: without --max-steps a child `diagnose run` would let its window grow
    assert WindowPlan(warmup=3, steps=4, timed=5).to_argv() == [
        "--warmup",
        "3",
        "--steps",
        "4",
        "--max-steps",
        "4",
        "--timed-steps",
        "5",
    ]
    assert WindowPlan(warmup=3, steps=4, timed=5, max_steps=12).to_argv()[4:6] == ["--max-steps", "12"]
    assert WindowPlan(warmup=1, steps=2, timed=3, stop=False).to_argv()[-1] == "--no-stop"


@pytest.mark.parametrize(
    "plan",
    [
        WindowPlan(warmup=3, steps=4, timed=5, max_steps=4),
        WindowPlan(warmup=1, steps=2, timed=9, stop=False, max_steps=6),
    ],
)
def test_window_argv_round_trips_through_diagnose_run(plan: WindowPlan) -> None:
    """What a rank or an experiment is started with parses back, in ``diagnose run``, to the plan."""
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    params = command.make_context("run", [*plan.to_argv(), "train.py"]).params
    parsed = WindowPlan(
        warmup=params["warmup"],
        steps=params["steps"],
        timed=params["timed_steps"],
        stop=not params["no_stop"],
        max_steps=params["max_steps"],
    )
    assert parsed == plan
