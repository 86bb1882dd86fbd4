"""TensorBoard: the event file loads in TensorBoard's own data layer with the report's numbers,
and the trace is named so that the PyTorch Profiler plugin finds it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from diagnose.analysis.measure.categories import EXPOSED, GPU_EXPOSED, HOST_EXPOSED, PHASES
from diagnose.analysis.pipeline import AnalysisOptions
from diagnose.analysis.report import Report
from diagnose.renderers.tensorboard import TEXT_TAG, TRUST_NOTE, write_events
from diagnose.rundir import RunDir
from diagnose.session import analyze_and_save, analyze_run
from tests.tracebuilder import ELEMENTWISE, TraceBuilder, one_gpu_step

#: torch-tb-profiler 0.4.3, torch_tb_profiler/consts.py: how the plugin finds a run's traces
#: and splits a worker name into node and process.
WORKER_PATTERN = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(?:\.gz)?$")
NODE_PROCESS_PATTERN = re.compile(r"^(.*)_(\d+)")


def two_gpu_steps() -> TraceBuilder:
    """The reference step 7 of tests/test_breakdown.py, then a step 8 that mostly waits for data."""
    b = one_gpu_step()
    b.step(8, 1000, 1000)
    b.data_wait(1000, 700)
    b.kernel(ELEMENTWISE, 1710, 280, launch_ts=1705)
    return b


def cpu_steps() -> TraceBuilder:
    b = TraceBuilder(device=False)
    for i in range(2):
        t = i * 1000
        b.step(2 + i, t, 1000)
        b.data_wait(t, 300)
        b.op("aten::linear", t + 300, 300, forward=True)
        b.backward_op(t + 650, 200)
        b.optimizer(t + 850, 100)
    return b


def run_dir_with(builder: TraceBuilder, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    builder.write(RunDir(run_dir).new_trace_path(), gz=True)
    return run_dir


def load(run_dir: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def series(accumulator: EventAccumulator, tag: str) -> dict[int, float]:
    return {event.step: event.value for event in accumulator.Scalars(tag)}


def test_gpu_scalars_per_step_match_the_report(tmp_path: Path) -> None:
    run_dir = run_dir_with(two_gpu_steps(), tmp_path)
    report = analyze_run(RunDir(run_dir), AnalysisOptions.load())
    write_events(report, run_dir)
    accumulator = load(run_dir)
    steps = report.breakdown["steps"]  # type: ignore[index]
    assert [s["number"] for s in steps] == [7, 8]

    def expect(tag: str, values: list[float]) -> None:
        assert series(accumulator, tag) == pytest.approx(dict(zip([7, 8], values, strict=True)), rel=1e-6), tag

    expect("step/duration_ms", [1.0, 1.0])
    expect("exposed/data_wait_ms", [0.3, 0.7])
    for cat in EXPOSED:
        expect(f"exposed/{cat}_ms", [s["exposed_ms"][cat] for s in steps])
    for phase in PHASES:
        expect(f"phase/{phase}_ms", [s["phases_ms"][phase] for s in steps])
    expect("gpu/kernels", [4, 1])
    expect("gpu/busy_ms", [s["gpu_busy_ms"] for s in steps])
    expect("h2d/pageable_bytes", [4096, 0])
    expect("sync/count", [1, 0])

    assert series(accumulator, "share/exposed_data_wait") == pytest.approx(
        {0: report.symptoms["exposed.data_wait"]["value"]}
    )
    assert series(accumulator, "share/gpu_busy") == pytest.approx({0: report.symptoms["gpu.busy"]["value"]})
    assert series(accumulator, "throughput/profiled_steps_per_s") == pytest.approx(
        {0: report.throughput["profiled"]["steps_per_s"]}
    )
    assert series(accumulator, "memory/capacity_bytes") == pytest.approx({0: report.memory["capacity_bytes"]})


@pytest.mark.filterwarnings("ignore:html5lib's sanitizer is deprecated:DeprecationWarning")
def test_text_summary_renders_as_markdown_tables_in_tensorboard(tmp_path: Path) -> None:
    from tensorboard.plugins.text.text_plugin import text_array_to_html
    from tensorboard.util import tensor_util

    run_dir = run_dir_with(two_gpu_steps(), tmp_path)
    report = analyze_run(RunDir(run_dir), AnalysisOptions.load())
    write_events(report, run_dir)
    (text_event,) = load(run_dir).Tensors(TEXT_TAG)
    markdown = tensor_util.make_ndarray(text_event.tensor_proto).item().decode()
    assert report.verdict in markdown
    assert report.findings and all(f["rule"] in markdown and f["do"] in markdown for f in report.findings)
    assert TRUST_NOTE in markdown
    rendered = text_array_to_html(tensor_util.make_ndarray(text_event.tensor_proto), True)
    assert rendered.count("<table>") == 4  # findings, exposed, phases, throughput


def test_cpu_run_has_no_gpu_scalars(tmp_path: Path) -> None:
    run_dir = run_dir_with(cpu_steps(), tmp_path)
    write_events(analyze_run(RunDir(run_dir), AnalysisOptions.load()), run_dir)
    tags = set(load(run_dir).Tags()["scalars"])
    assert {f"exposed/{cat}_ms" for cat in HOST_EXPOSED} <= tags
    assert not {f"exposed/{cat}_ms" for cat in GPU_EXPOSED} & tags
    assert not any(tag.startswith(("gpu/", "h2d/", "sync/", "memory/")) for tag in tags)
    assert series(load(run_dir), "exposed/data_wait_ms") == pytest.approx({2: 0.3, 3: 0.3})


def test_reanalysis_replaces_our_event_file_and_keeps_others(tmp_path: Path) -> None:
    run_dir = run_dir_with(cpu_steps(), tmp_path)
    foreign = run_dir / "events.out.tfevents.1700000000.host.123.0"
    foreign.write_bytes(b"")
    analyze_and_save(RunDir(run_dir), AnalysisOptions.load())
    analyze_and_save(RunDir(run_dir), AnalysisOptions.load())
    ours = sorted(p.name for p in run_dir.glob("events.out.tfevents.*.diagnose"))
    assert len(ours) == 1 and foreign.exists()
    foreign.unlink()
    assert len(load(run_dir).Scalars("step/duration_ms")) == 2


def test_report_without_breakdown_still_gets_its_text(tmp_path: Path) -> None:
    report = Report(
        status={"state": "failed", "message": "the script raised ValueError: x"}, throughput={"batch_size": None}
    )
    write_events(report, tmp_path)
    accumulator = load(tmp_path)
    assert accumulator.Tags()["scalars"] == []
    assert len(accumulator.Tensors(TEXT_TAG)) == 1


def test_writing_events_does_not_import_torch(tmp_path: Path) -> None:
    run_dir = run_dir_with(cpu_steps(), tmp_path)
    code = (
        "import sys; from pathlib import Path; from diagnose.analysis.pipeline import AnalysisOptions; "
        "from diagnose.rundir import RunDir; from diagnose.session import analyze_run; "
        "from diagnose.renderers.tensorboard import write_events; "
        f"write_events(analyze_run(RunDir(Path({str(run_dir)!r})), AnalysisOptions.load()), Path({str(run_dir)!r})); "
        "assert 'torch' not in sys.modules and 'tensorflow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the trace as the PyTorch Profiler plugin sees it --------------------------------------------


@pytest.mark.parametrize(
    ("host", "rank", "worker"),
    [("host", None, "host_{pid}"), ("node-3.cluster.example", 2, "rank2_node-3.cluster.example_{pid}")],
)
def test_trace_name_parses_as_the_plugin_expects(
    host: str, rank: int | None, worker: str, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    name = RunDir(tmp_path).new_trace_path(rank).name
    match = WORKER_PATTERN.match(name)
    assert match is not None
    assert match.group(1) == worker.format(pid=os.getpid())
    assert re.fullmatch(r"\.\d{13}", match.group(2))  # the span: milliseconds since the epoch


def test_default_worker_is_host_and_pid(tmp_path: Path) -> None:
    match = WORKER_PATTERN.match(RunDir(tmp_path).new_trace_path().name)
    assert match is not None
    node, process = NODE_PROCESS_PATTERN.match(match.group(1)).groups()  # type: ignore[union-attr]
    assert (node, int(process)) == (socket.gethostname(), os.getpid())


def test_traces_finds_the_trace_and_nothing_else(tmp_path: Path) -> None:
    run_dir = run_dir_with(cpu_steps(), tmp_path)
    analyze_and_save(RunDir(run_dir), AnalysisOptions.load())
    assert [p.name for p in RunDir(run_dir).traces()] == [
        p.name for p in run_dir.iterdir() if WORKER_PATTERN.match(p.name)
    ]
    assert len(RunDir(run_dir).traces()) == 1


def test_a_failed_run_writes_no_events(tmp_path: Path) -> None:
    """TensorBoard lists every folder with an event file as a run: a failed run is not one."""
    from diagnose.record import RunRecord

    run_dir = run_dir_with(cpu_steps(), tmp_path)
    (trace,) = RunDir(run_dir).traces()
    RunDir(run_dir).save_record(RunRecord(status="failed", exit_code=1, trace_files=[trace.name]))
    analyze_and_save(RunDir(run_dir), AnalysisOptions.load())
    assert RunDir(run_dir).report_path.is_file()
    assert not list(run_dir.glob("events.out.tfevents.*"))
