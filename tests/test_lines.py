"""Line attribution on CPU: the main thread's hot line, the workers' hot line, the helpers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from diagnose.analysis.pipeline import AnalysisOptions
from diagnose.progress import Progress
from diagnose.record import WindowPlan
from diagnose.rundir import RunDir
from diagnose.runtime.line_attribution import LineAttribution, classify_main, sync_kind, worker_frames
from diagnose.runtime.runner import resolve_target, run_target
from diagnose.runtime.usercode import source_line
from diagnose.session import analyze_run

PLAN = WindowPlan(warmup=2, steps=25, timed=3)

HOT_MAIN = """
import torch
from torch.utils.data import DataLoader, TensorDataset

def augment(x):
    # one line holds the step's CPU work; the sorts release the GIL, so the sampler sees this line
    # whenever it runs (a pure-Python loop is only seen at the interpreter's switch points, which
    # land on its neighbours as often as on its body on a loaded machine)
    total = float(torch.sort(x.flatten().repeat(8)).values[-1])  # HOT-MAIN: slow CPU work in the loop
    return x * 0 + total

m = torch.nn.Linear(64, 1); opt = torch.optim.SGD(m.parameters(), lr=1e-6)
for (x,) in DataLoader(TensorDataset(torch.randn(100000, 64)), batch_size=1024):
    x = augment(x)
    m(x).sum().backward(); opt.step(); opt.zero_grad()
"""

HOT_WORKER = """
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 100000
    def __getitem__(self, i):
        total = 0
        for k in range(20000):
            total += k * i   # HOT-WORKER: per-sample Python in the worker
        return torch.full((8,), float(total % 7))

m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for x in DataLoader(Slow(), batch_size=8, num_workers=2):
    m(x).sum().backward(); opt.step(); opt.zero_grad()
"""


OWN_PRODUCERS = """
import queue, threading, time
import torch

def produce(q):
    while True:
        time.sleep(0.02)  # a producer slower than the step: the loop waits for it
        q.put(torch.randn(64, 8))

q = queue.Queue(maxsize=4)
threading.Thread(target=produce, args=(q,), daemon=True).start()

def next_batch():
    return q.get()  # WAITS: the script's own producer's queue

m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(40):
    x = next_batch()
    m(x).sum().backward(); opt.step(); opt.zero_grad()
"""


def _line_of(path: Path, marker: str) -> int:
    for i, text in enumerate(path.read_text().splitlines(), 1):
        if marker in text:
            return i
    raise AssertionError(marker)


def _run(script: Path, tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    hook = LineAttribution(RunDir(run_dir).workers_path())
    record = run_target(
        resolve_target(str(script), None, []),
        PLAN,
        RunDir(run_dir),
        progress=Progress(enabled=False),
        extra_hooks=[hook],
    )
    return record, run_dir


def test_main_thread_hot_line_is_found_and_quoted(write_script, tmp_path: Path) -> None:
    script = write_script(HOT_MAIN)
    record, run_dir = _run(script, tmp_path)
    hot = _line_of(script, "HOT-MAIN")
    host = record.host_samples
    assert host["samples"] > 20
    top_other = [x for x in host["lines"] if x["where"] == "other"]
    # sampling is statistical: the loop's body leads, its neighbours in augment() follow
    assert f"{script}:{hot}" in [x["site"] for x in top_other[:2]], top_other[:3]
    assert top_other[0]["function"] == "augment"
    assert host["by_where"]["other"] > 0.25
    report = analyze_run(RunDir(run_dir), AnalysisOptions.load())
    (finding,) = [f for f in report.findings if f["rule"] == "DATA004"]
    assert f"train.py:{hot}" in finding["lines"]


def test_worker_hot_line_and_cpu_per_batch(write_script, tmp_path: Path) -> None:
    script = write_script(HOT_WORKER)
    record, run_dir = _run(script, tmp_path)
    hot = _line_of(script, "HOT-WORKER")
    workers = record.worker_samples
    assert workers["workers"] == 2 and workers["batches"] > 0
    assert workers["cpu_s_per_batch"] > 0
    assert workers["lines"][0]["site"] == f"{script}:{hot}"
    assert workers["lines"][0]["activity"] == "user code"
    busy = {k: v for k, v in workers["by_activity"].items() if k != "idle"}
    assert max(busy, key=busy.get) == "user code"  # workers may idle: the main process is the slow one
    report = analyze_run(RunDir(run_dir), AnalysisOptions.load())
    assert report.symptoms["workers.cpu_per_batch_ms"]["value"] > 0
    assert report.symptoms["workers.balance"]["value"] >= 1


def test_a_wait_on_the_scripts_own_producers_queue_is_counted_at_its_line(write_script, tmp_path: Path) -> None:
    """The loop takes each batch from a queue a slower thread fills: the samples of the line that
    gets from it waited in the standard library for another thread (``waits``), and the symptom
    reads the share of the main thread's samples that did."""
    script = write_script(OWN_PRODUCERS)
    record, run_dir = _run(script, tmp_path)
    site = f"{script}:{_line_of(script, 'WAITS')}"
    (line,) = [x for x in record.host_samples["lines"] if x["site"] == site]
    assert line["where"] == "other" and line["waits"] >= 0.9 * line["samples"] > 0
    assert not any(x.get("waits") for x in record.host_samples["lines"] if x["site"] != site)
    report = analyze_run(RunDir(run_dir), AnalysisOptions.load())
    assert report.symptoms["host.queue_wait_share"]["value"] > 0.5


def test_a_get_from_a_queue_waits_for_another_and_a_put_into_a_full_one_does_not() -> None:
    """The stack below the user's line, read off two threads blocked in a queue: the one getting
    from an empty queue waits for a producer; the one putting into a full queue waits for a
    consumer, which paces nothing of its own steps' batches."""
    import queue
    import threading
    import time

    from diagnose.runtime.line_attribution import waits_for_another

    empty, full = queue.Queue(), queue.Queue(maxsize=1)
    full.put(0)

    def getter() -> None:
        empty.get()

    def putter() -> None:
        full.put(1)

    threads = {fn.__name__: threading.Thread(target=fn, daemon=True) for fn in (getter, putter)}
    for t in threads.values():
        t.start()
    time.sleep(0.2)  # both blocked by now
    try:
        frames = sys._current_frames()
        for name, expected in (("getter", True), ("putter", False)):
            leaf = frames[threads[name].ident]
            user = leaf
            while user is not None and user.f_code.co_name != name:
                user = user.f_back
            assert user is not None and waits_for_another(leaf, user) is expected, name
    finally:
        empty.put(None)
        full.get()


def test_no_lines_means_no_sampling(write_script, tmp_path: Path) -> None:
    script = write_script(HOT_MAIN)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = run_target(resolve_target(str(script), None, []), PLAN, RunDir(run_dir), progress=Progress(enabled=False))
    assert record.host_samples == {} and record.worker_samples == {} and record.sync_sites == []


def test_classify_main_by_the_frames_on_the_stack() -> None:
    import torch

    seen: dict[str, str] = {}

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen["model"] = classify_main(sys._getframe())
            return x

    Probe()(torch.ones(1))
    assert seen["model"] == "model"
    assert classify_main(sys._getframe()) == "other"


def test_worker_frames_stop_at_the_worker_loop() -> None:
    def _worker_loop():
        return inner()

    def inner():
        return worker_frames(sys._getframe())

    frames = _worker_loop()
    assert [f.f_code.co_name for f in frames] == ["inner"]


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("history.append(value.item())", "item"),
        ("preds = out.argmax(1).cpu()", "copy to host"),
        ("torch.cuda.synchronize()", "synchronize"),
        ("print(loss)", "print of a CUDA tensor"),
        ("idx = mask.nonzero()", "data-dependent shape"),
        ("y = x[mask]", "implicit (data-dependent shape or blocking copy)"),
    ],
)
def test_sync_kind_from_the_source_line(code: str, kind: str) -> None:
    assert sync_kind(code) == kind


def test_source_line(tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_text("one\n   two  \n")
    assert source_line(f"{path}:2") == "two"
    assert source_line(f"{path}:9") == ""
    assert source_line("/nope.py:1") == ""


def test_sync_time_is_matched_call_by_call_when_the_counts_agree() -> None:
    from diagnose.analysis.pipeline import attribute_sync_time
    from diagnose.analysis.trace.timeline import build_timeline
    from diagnose.record import RunRecord
    from tests.tracebuilder import TraceBuilder

    b = TraceBuilder()
    b.step(0, 0, 1000)
    b.sync(100, 50)  # site 0
    b.sync(300, 10)  # site 1
    b.sync(500, 30)  # site 0
    timeline = build_timeline(b.to_dict())
    record = RunRecord(profiled_steps=1)
    record.sync_sites = [
        {"site": "t.py:1", "code": "a.item()", "kind": "item", "count": 2, "share_of_syncs": 2 / 3, "index": 0},
        {"site": "t.py:2", "code": "b.cpu()", "kind": "copy to host", "count": 1, "share_of_syncs": 1 / 3, "index": 1},
    ]
    record.sync_sequence = [0, 1, 0]
    sites = attribute_sync_time(record, timeline)
    assert [(s["blocked_ms_per_step"], s["blocked_from"]) for s in sites] == [(0.08, "matched"), (0.01, "matched")]
    record.sync_sequence = [0, 1]  # a trimmed trace: the counts disagree, the total is shared
    sites = attribute_sync_time(record, timeline)
    assert [s["blocked_ms_per_step"] for s in sites] == [pytest.approx(0.06), pytest.approx(0.03)]
    assert sites[0]["blocked_from"] == "shared by count"


def test_the_sampler_holds_no_frame_of_the_sampled_thread_between_samples() -> None:
    """A frame kept across the sampler's wait kept its function's locals alive after the
    function returned, and freed them later on the sampler's thread."""
    import threading
    import time
    import weakref

    from diagnose.runtime.line_attribution import Sampler

    class Payload:
        pass

    def work() -> weakref.ref[Payload]:
        payload = Payload()
        ref = weakref.ref(payload)
        time.sleep(0.6)  # the sampler takes one sample at 0.4 s, in this frame
        return ref

    sampler = Sampler(threading.get_ident(), 0.4, (), lambda f: "model")
    sampler.start()
    try:
        ref = work()
        alive = ref() is not None  # the sampler now waits until 0.8 s
    finally:
        sampler.stop()
    assert sampler.samples >= 1
    assert not alive


def test_a_model_in_cuda_graphs_turns_main_thread_sampling_off_and_says_so(tmp_path: Path) -> None:
    from types import SimpleNamespace

    hook = LineAttribution(tmp_path / "workers")
    hook.model_in_cuda_graphs()
    hook.window_opened()
    assert hook.main_sampler is None
    record = SimpleNamespace(warnings=[], sync_sites=None, sync_sequence=None, host_samples=None, worker_samples=None)
    hook.finish(record)
    assert any("CUDA graphs" in w for w in record.warnings)


CUDA_GRAPHS_MODE = """
import torch
m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
graphed = torch.compile(m, mode="reduce-overhead")  # recorded by the compile watch; never called here
for _ in range(40):
    m(torch.randn(16, 8)).sum().backward(); opt.step(); opt.zero_grad()
"""


def test_a_script_compiled_for_cuda_graphs_runs_without_the_main_thread_sampler(write_script, tmp_path: Path) -> None:
    record, _ = _run(write_script(CUDA_GRAPHS_MODE), tmp_path)
    assert record.compile and record.compile["cudagraphs"]
    assert record.host_samples.get("samples", 0) == 0
    assert any("CUDA graphs" in w for w in record.warnings)


TEARDOWN = """
import time, torch
m = torch.nn.Linear(64, 1); opt = torch.optim.SGD(m.parameters(), lr=1e-6)
for _ in range(6):
    m(torch.randn(256, 64)).sum().backward(); opt.step(); opt.zero_grad()

def teardown():
    deadline = time.perf_counter() + 0.5
    while time.perf_counter() < deadline:
        sum(range(1000))  # TEARDOWN: after the last step (a checkpoint, destroy_process_group())

teardown()
"""


def test_the_teardown_after_the_last_step_is_no_line_of_the_loop(write_script, tmp_path: Path) -> None:
    # issue 33: DATA004 pointed at destroy_process_group() and a checkpoint's gather, sampled
    # while the script's teardown ran inside a window it ended
    script = write_script(TEARDOWN)
    record, _ = _run(script, tmp_path)
    assert record.status == "completed" and record.profiled_steps == 4  # the script ended inside the window
    host = record.host_samples
    assert host.get("window_s", 0.0) < 0.4
    assert not [x for x in host.get("lines", []) if x["function"] == "teardown"]


def test_each_workers_first_batch_is_left_out_of_the_cpu_time_per_batch(tmp_path: Path) -> None:
    """A worker's first batch carries its lazy imports and cold caches (a tiny batch's workers
    took it for the pace of every later one): the CPU time per batch is that of the batches after
    it, where a worker built more than one; a file without the first batch's time (an older
    diagnose) counts whole."""
    import json

    workers = tmp_path / "workers"
    workers.mkdir()
    files = {
        "worker-1.json": {"batches": 5, "cpu_s": 0.5, "first_cpu_s": 0.3, "samples": 10},  # 4 after: 0.2 s
        "worker-2.json": {"batches": 1, "cpu_s": 0.3, "first_cpu_s": 0.3, "samples": 2},  # only one: counts
        "worker-3.json": {"batches": 3, "cpu_s": 0.15, "samples": 5},  # older file: whole
    }
    for name, data in files.items():
        (workers / name).write_text(json.dumps(data))
    merged = LineAttribution(workers)._worker_hotspots()
    assert merged["batches"] == 9
    assert merged["cpu_s_per_batch"] == pytest.approx((0.2 + 0.3 + 0.15) / (4 + 1 + 3))
    assert merged["cpu_s_per_batch_with_first"] == pytest.approx(0.95 / 9)
