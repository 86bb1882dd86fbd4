"""The streaming trace reader: pieces cut anywhere still give the events exactly; malformed fields
give a clear TraceError; the Timeline equals the one the whole-JSON reader built, on every fixture."""

from __future__ import annotations

import gzip
import json
import mmap
import os
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from diagnose.analysis.trace import timeline as timeline_module
from diagnose.analysis.trace import tracefile
from diagnose.analysis.trace.timeline import build_timeline, load_timeline, read_trace_json
from diagnose.analysis.trace.tracefile import TraceStream, decode_objects
from diagnose.errors import TraceError
from tests import reference_timeline
from tests.tracebuilder import TraceBuilder, one_gpu_step

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("*/*.json.gz"))


@pytest.fixture
def tiny_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of a few bytes: every trace is cut into many pieces, at every kind of place."""
    monkeypatch.setattr(tracefile, "BLOCK_BYTES", 7)


def stream_events(path: Path) -> tuple[list[Any], dict[str, Any]]:
    stream = TraceStream(path)
    events = [e for objects in stream.decoded(decode_objects) for e in objects]
    return events, stream.metadata


# --- cutting the array into pieces ------------------------------------------------------------------

TRICKY = [
    {"ph": "X", "cat": "cpu_op", "name": 'a}, {"b": 1}, {', "tid": 1, "ts": 1.5, "dur": 2},
    {"ph": "X", "cat": "cpu_op", "name": 'quote " and \\" and \\\\', "tid": 1, "ts": 2, "dur": 1},
    {
        "ph": "X",
        "cat": "kernel",
        "name": "k",
        "tid": 7,
        "ts": 3,
        "dur": 1,
        "args": {"nested": [{"a": "},{"}, {"b": [[], {}]}], "device": 0},
    },
    {"ph": "X", "cat": "cpu_op", "name": "unicode é ✓ \u2028", "tid": 1, "ts": 4, "dur": 1, "args": {"s": "}\n,\n{"}},
    {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "main"}},
]


@dataclass
class Layout:
    name: str
    dumps: Any


LAYOUTS = [
    Layout("compact", lambda d: json.dumps(d, separators=(",", ":"), ensure_ascii=False)),
    Layout("spaced", lambda d: json.dumps(d)),
    Layout("indented", lambda d: json.dumps(d, indent=2)),
    Layout(
        "kineto",
        lambda d: (
            '{\n  "schemaVersion": 1,\n  "traceEvents": [\n'
            + ",\n".join("  " + json.dumps(e) for e in d["traceEvents"])
            + '\n  ],\n  "traceName": "x]}, {"\n}\n'
        ),
    ),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
@pytest.mark.parametrize("gz", [False, True], ids=["json", "gz"])
def test_pieces_cut_inside_strings_and_nested_args_give_the_events_exactly(
    tmp_path: Path, tiny_blocks: None, layout: Layout, gz: bool
) -> None:
    text = layout.dumps({"schemaVersion": 1, "traceEvents": TRICKY}).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    events, metadata = stream_events(path)
    assert events == TRICKY
    assert metadata["schemaVersion"] == 1
    assert "traceEvents" not in metadata


def test_metadata_before_and_after_the_array_and_a_bare_array(tmp_path: Path, tiny_blocks: None) -> None:
    doc = {
        "deviceProperties": [{"name": "GPU", "x": [1, {"traceEvents": []}]}],
        "traceEvents": TRICKY[:2],
        "after": {"a": "]"},
    }
    (tmp_path / "t.json").write_text(json.dumps(doc))
    events, metadata = stream_events(tmp_path / "t.json")
    assert events == TRICKY[:2]
    assert metadata == {"deviceProperties": doc["deviceProperties"], "after": {"a": "]"}}
    (tmp_path / "bare.json").write_text(json.dumps(TRICKY))
    assert stream_events(tmp_path / "bare.json") == (TRICKY, {})
    (tmp_path / "empty.json").write_text('{"traceEvents": [ ], "x": 1}')
    assert stream_events(tmp_path / "empty.json") == ([], {"x": 1})


def test_read_trace_json_returns_the_whole_document(tmp_path: Path, tiny_blocks: None) -> None:
    doc = one_gpu_step().to_dict()
    (tmp_path / "t.json").write_text(json.dumps(doc, indent=1))
    assert read_trace_json(tmp_path / "t.json") == doc


# --- errors ---------------------------------------------------------------------------------------


def _write(tmp_path: Path, name: str, content: bytes) -> Path:
    (tmp_path / name).write_bytes(content)
    return tmp_path / name


GOOD = json.dumps(one_gpu_step().to_dict()).encode()


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("truncated.json", GOOD[: len(GOOD) // 2], "is not valid JSON"),
        ("cut_at_the_end.json", GOOD[:-3], "is not valid JSON"),
        ("garbage_inside.json", GOOD.replace(b'"ph": "X"', b'"ph": X', 1), "is not valid JSON"),
        ("not_a_trace.json", b'{"hello": [1, 2]}', "not a Chrome trace"),
        ("not_json.json", b"hello", "is not valid JSON"),
        ("corrupt.json.gz", gzip.compress(GOOD)[:40] + b"\x00garbage" * 50, "cannot read"),
        ("bad_header.json.gz", b"\x1f\x8b\x08\x00garbage", "cannot read"),
    ],
)
def test_unreadable_traces_are_trace_errors(
    tmp_path: Path, tiny_blocks: None, name: str, content: bytes, message: str
) -> None:
    path = _write(tmp_path, name, content)
    with pytest.raises(TraceError, match=message):
        load_timeline(path)


@pytest.fixture(params=["default", "zlib"])
def inflater(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inflater the reader finds (ISA-L where installed), and zlib, its fallback."""
    if request.param == "zlib":
        monkeypatch.setattr(tracefile, "_inflating", zlib)


def test_gzip_members_one_after_another_and_zeros_between_read_as_one_document(
    tmp_path: Path, tiny_blocks: None, inflater: None
) -> None:
    """As ``gzip`` reads them: members concatenated (``cat a.gz b.gz``), zeros padding between."""
    text = json.dumps({"schemaVersion": 1, "traceEvents": TRICKY}).encode()
    half = len(text) // 2
    content = gzip.compress(text[:half]) + b"\0" * 300 + gzip.compress(text[half:]) + b"\0" * 10
    assert gzip.decompress(content) == text
    path = _write(tmp_path, "t.json.gz", content)
    assert stream_events(path)[0] == TRICKY


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda raw: raw[:-20], "cannot read .*ended before the end-of-stream"),  # cut short
        (
            lambda raw: raw[:-8] + bytes([raw[-8] ^ 1]) + raw[-7:],
            "cannot read .*(incorrect data check|Incorrect checksum)",
        ),  # CRC
        (lambda raw: raw + b"garbage", "cannot read"),  # not a member after the last
    ],
    ids=["truncated", "crc", "trailing_garbage"],
)
def test_a_damaged_gzip_stream_is_a_trace_error(tmp_path: Path, damage: Any, message: str, inflater: None) -> None:
    path = _write(tmp_path, "t.json.gz", damage(gzip.compress(GOOD)))
    with pytest.raises(TraceError, match=message):
        load_timeline(path)


def test_a_corrupt_gzip_body_is_a_trace_error(tmp_path: Path) -> None:
    raw = bytearray(gzip.compress(GOOD * 20))
    raw[len(raw) // 2 : len(raw) // 2 + 16] = b"\xff" * 16
    path = _write(tmp_path, "t.json.gz", bytes(raw))
    with pytest.raises(TraceError, match=r"cannot read|not valid JSON"):
        load_timeline(path)
    with pytest.raises(zlib.error):  # what leaked as a traceback before
        zlib.decompress(bytes(raw), 31)


MALFORMED = [
    ("user_annotation", "name", 17, "has name 17, not a string"),
    ("cpu_op", "name", None, "has name None, not a string"),
    ("cuda_runtime", "args", [1, 2], "has args \\[1, 2\\], not an object"),
    ("kernel", "args.correlation", [101], "has args.correlation \\[101\\], not a number or a string"),
    ("kernel", "dur", "Infinity", "has dur 'Infinity', not a finite number"),
    ("cpu_op", "ts", "soon", "has ts 'soon', not a finite number"),
    ("cpu_op", "tid", {"a": 1}, "has tid \\{'a': 1\\}, not a number or a string"),
]


@pytest.mark.parametrize(
    ("cat", "field_name", "value", "message"), MALFORMED, ids=[f"{m[0]}-{m[1]}" for m in MALFORMED]
)
def test_malformed_fields_are_named_in_a_trace_error(
    tmp_path: Path, tiny_blocks: None, cat: str, field_name: str, value: Any, message: str
) -> None:
    doc = one_gpu_step().to_dict()
    index, target = next((i, e) for i, e in enumerate(doc["traceEvents"]) if e["cat"] == cat)
    if field_name.startswith("args."):
        target["args"][field_name[5:]] = value
    else:
        target[field_name] = value
    path = _write(tmp_path, "t.json", json.dumps(doc).encode())
    for read in (lambda: load_timeline(path), lambda: build_timeline(doc)):
        with pytest.raises(TraceError, match=f"malformed trace: event {index}\\b.*{message}"):
            read()


@pytest.mark.parametrize("value", ["lots", [1], float("nan")])
def test_malformed_device_memory_is_a_trace_error(tmp_path: Path, value: Any) -> None:
    doc = one_gpu_step().to_dict()
    doc["deviceProperties"][0]["totalGlobalMem"] = value
    with pytest.raises(TraceError, match=r"deviceProperties\.totalGlobalMem .* not a number"):
        build_timeline(doc)


def test_events_that_are_not_objects_are_skipped_as_before(tmp_path: Path, tiny_blocks: None) -> None:
    doc = one_gpu_step().to_dict()
    doc["traceEvents"][3:3] = [17, None, "text", [1]]
    path = _write(tmp_path, "t.json", json.dumps(doc).encode())
    assert load_timeline(path).kernels == build_timeline(one_gpu_step().to_dict()).kernels


def test_a_size_limit_given_still_refuses_before_reading(tmp_path: Path) -> None:
    path = one_gpu_step().write(tmp_path / "t.json")
    with pytest.raises(TraceError, match=r"over the .* limit given"):
        load_timeline(path, max_bytes=100)


def test_a_trace_larger_than_the_memory_available_is_refused_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = one_gpu_step().write(tmp_path / "t.json")
    monkeypatch.setattr(tracefile, "available_memory", lambda: tracefile.MEMORY_RESERVE_BYTES + 10)
    with pytest.raises(TraceError, match=r"needs about .* GiB of memory, and .* GiB is available"):
        load_timeline(path)


def test_the_read_stops_when_memory_runs_short(
    tmp_path: Path, tiny_blocks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = one_gpu_step().write(tmp_path / "t.json")
    left = iter([2**40] + [2**20] * 1000)  # plenty before reading, then 1 MiB
    monkeypatch.setattr(tracefile, "available_memory", lambda: next(left))
    with pytest.raises(TraceError, match=r"out of memory reading .* MiB left after"):
        load_timeline(path)


# --- the Timeline: the same as the whole-JSON reader's ------------------------------------------


def _timeline_fields(timeline: Any) -> dict[str, Any]:
    fields = dict(vars(timeline))
    fields["meta"] = dict(vars(timeline.meta), path="", size_bytes=0)
    return fields


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name[:12]}")
def test_timeline_equals_the_whole_json_readers_on_every_fixture(fixture: Path) -> None:
    with gzip.open(fixture, "rb") as fh:
        data = json.load(fh)
    expected = reference_timeline.build_timeline(data)
    streamed = load_timeline(fixture)
    assert _timeline_fields(streamed) == _timeline_fields(expected)
    assert _timeline_fields(build_timeline(data)) == _timeline_fields(expected)
    assert type(streamed.kernels[0]) is type(expected.kernels[0]) if expected.kernels else True


def test_timeline_is_the_same_whatever_the_piece_size(tiny_blocks: None) -> None:
    fixture = DATA / "item_syncs"
    (trace,) = fixture.glob("*.json.gz")
    with gzip.open(trace, "rb") as fh:
        expected = reference_timeline.build_timeline(json.load(fh))
    assert _timeline_fields(load_timeline(trace)) == _timeline_fields(expected)


def test_hand_written_trace_equals_the_reference(tmp_path: Path, tiny_blocks: None) -> None:
    b: TraceBuilder = one_gpu_step()
    b.events.append(
        {"ph": "X", "cat": "kernel", "name": "other gpu", "pid": 0, "tid": 7, "ts": 10, "dur": 5, "args": {"device": 1}}
    )
    b.events.append(
        {"ph": "X", "cat": "kernel", "name": "no device", "pid": 0, "tid": 7, "ts": 11, "dur": 5, "args": {}}
    )
    b.events.append({"ph": "X", "cat": "Kernel", "name": "legacy", "pid": 0, "tid": 7, "ts": 12, "dur": 5})
    b.events.append({"ph": "X", "cat": "quantum_op", "name": "entangle", "pid": 1, "tid": 1, "ts": 13, "dur": 5})
    path = b.write(tmp_path / "t.json.gz", gz=True)
    expected = reference_timeline.build_timeline(b.to_dict())
    assert _timeline_fields(load_timeline(path)) == _timeline_fields(expected)
    assert [k.name for k in expected.kernels if k.start < 20] == ["no device", "legacy"]


# --- worker processes: the same Timeline, the same errors -------------------------------------------


CHILD = "DIAGNOSE_TEST_READER_CHILD"


@pytest.fixture
def two_workers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int] | None]:
    """Every piece decoded and folded in one of two forked worker processes, whatever the size;
    yields the sizes of the pools that really forked (to check that workers did the work).

    The reader forks only a process without other threads, and this test process has them (from
    earlier tests): the test runs again in a fresh pytest process, which has none; here it
    yields None and the test body returns."""
    if os.environ.get(CHILD) != "1":
        child = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", request.node.nodeid],
            cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, CHILD: "1"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-2000:]
        yield None
        return
    assert timeline_module.threads_in_process() == 1, "the fresh process has other threads: the reader would not fork"
    monkeypatch.setenv(timeline_module.WORKERS_ENV, "2")
    pools: list[int] = []
    make_pool = timeline_module._worker_pool

    @contextmanager
    def counted(workers: int, call: Any) -> Iterator[Any]:
        with make_pool(workers, call) as pool:
            if pool is not None:
                pools.append(workers)
            yield pool

    monkeypatch.setattr(timeline_module, "_worker_pool", counted)
    yield pools


@pytest.mark.parametrize("slot_bytes", [None, 300])
def test_worker_processes_give_the_same_timeline_as_one_process(
    tiny_blocks: None, two_workers: list[int] | None, monkeypatch: pytest.MonkeyPatch, slot_bytes: int | None
) -> None:
    """A gzipped trace's pieces reach the workers through shared slots, several per worker under
    way; a piece larger than a slot (300 bytes: a kernel event with its args) is folded here."""
    if two_workers is None:
        return  # it ran in a fresh process
    if slot_bytes is not None:
        monkeypatch.setattr(timeline_module, "SLOT_BYTES", slot_bytes)
    folded = timeline_module._folded
    slotted: list[bool] = []

    def counted(result: Any, piece: tracefile.Piece) -> Any:
        slotted.append(type(piece) is tracefile.SlotPiece)
        return folded(result, piece)

    monkeypatch.setattr(timeline_module, "_folded", counted)
    (trace,) = (DATA / "item_syncs").glob("*.json.gz")
    with gzip.open(trace, "rb") as fh:
        expected = reference_timeline.build_timeline(json.load(fh))
    assert _timeline_fields(load_timeline(trace)) == _timeline_fields(expected)
    assert two_workers == [2]
    assert any(slotted) and (all(slotted) if slot_bytes is None else not all(slotted))


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gz"])
@pytest.mark.parametrize("layout", LAYOUTS[:2], ids=lambda layout: layout.name)
def test_worker_processes_join_pieces_cut_inside_strings(
    tmp_path: Path, tiny_blocks: None, two_workers: list[int] | None, layout: Layout, gz: bool
) -> None:
    if two_workers is None:
        return  # it ran in a fresh process
    b: TraceBuilder = one_gpu_step()
    b.events += [{**e, "pid": 0, "ts": 0.5 + i, "dur": 0.25} for i, e in enumerate(TRICKY[:2] + TRICKY[3:4])]
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    text = layout.dumps(b.to_dict()).encode()
    path.write_bytes(gzip.compress(text) if gz else text)
    expected = reference_timeline.build_timeline(b.to_dict())
    assert _timeline_fields(load_timeline(path)) == _timeline_fields(expected)
    assert two_workers == [2]


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gz"])
def test_worker_processes_name_a_malformed_event_by_its_index_in_the_trace(
    tmp_path: Path, tiny_blocks: None, two_workers: list[int] | None, gz: bool
) -> None:
    if two_workers is None:
        return  # it ran in a fresh process
    pack = gzip.compress if gz else bytes
    doc = one_gpu_step().to_dict()
    index = max(i for i, e in enumerate(doc["traceEvents"]) if e["cat"] == "kernel")
    doc["traceEvents"][index]["dur"] = "Infinity"
    path = _write(tmp_path, "t.json.gz" if gz else "t.json", pack(json.dumps(doc).encode()))
    with pytest.raises(TraceError, match=f"malformed trace: event {index}\\b.*has dur 'Infinity'"):
        load_timeline(path)
    doc["traceEvents"][index]["dur"] = 1.0
    path = _write(tmp_path, "bad.json.gz" if gz else "bad.json", pack(json.dumps(doc).encode()[:-40]))
    with pytest.raises(TraceError, match="is not valid JSON"):
        load_timeline(path)
    assert threading.active_count() == 1  # a gzipped trace's inflating thread ended with the read


def test_a_read_stopped_by_the_memory_check_ends_its_inflating_thread_at_once(
    tiny_blocks: None, two_workers: list[int] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check raises between pieces, outside the reader's generator: the read is closed there
    and then, not when the generator is collected (the traceback still holds it here)."""
    if two_workers is None:
        return  # it ran in a fresh process
    calls: list[int] = []

    def short(self: tracefile.MemoryGuard, bytes_read: int) -> None:
        calls.append(bytes_read)
        if len(calls) == 3:
            raise TraceError("out of memory reading the trace")

    monkeypatch.setattr(tracefile.MemoryGuard, "check", short)
    (trace,) = (DATA / "item_syncs").glob("*.json.gz")
    with pytest.raises(TraceError, match="out of memory") as info:
        load_timeline(trace)
    assert threading.active_count() == 1, [t.name for t in threading.enumerate()]
    assert info.value is not None and two_workers == [2]


@pytest.mark.parametrize(
    ("json_bytes", "cpus", "forced", "workers"),
    [
        (10 * 2**30, 64, "", timeline_module.MAX_READER_WORKERS),
        (10 * 2**30, 16, "", 15),
        (10 * 2**30, 4, "", 3),
        (10 * 2**30, 2, "", 2),  # the parent, cutting and merging, leaves half a core free
        (10 * 2**30, 1, "", 1),
        (timeline_module.PARALLEL_MIN_JSON_BYTES - 1, 16, "", 1),
        (1000, 2, "3", 3),
    ],
)
def test_the_number_of_worker_processes(
    monkeypatch: pytest.MonkeyPatch, json_bytes: int, cpus: int, forced: str, workers: int
) -> None:
    monkeypatch.setenv(timeline_module.WORKERS_ENV, forced)
    assert timeline_module.reader_workers(json_bytes, cpus) == workers


def test_a_bad_worker_count_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(timeline_module.WORKERS_ENV, "many")
    with pytest.raises(TraceError, match="DIAGNOSE_READER_WORKERS='many' is not a number"):
        timeline_module.reader_workers(10**9)


def test_the_read_falls_back_to_one_process_when_workers_cannot_start(
    tiny_blocks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(timeline_module.WORKERS_ENV, "2")

    def no_fork() -> Any:
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(timeline_module.forking.os, "fork", no_fork)
    path = DATA / "item_syncs"
    (trace,) = path.glob("*.json.gz")
    with gzip.open(trace, "rb") as fh:
        expected = reference_timeline.build_timeline(json.load(fh))
    assert _timeline_fields(load_timeline(trace)) == _timeline_fields(expected)


def test_numpys_own_threads_do_not_keep_the_reader_in_one_process(
    tiny_blocks: None, two_workers: list[int] | None
) -> None:
    """The breakdown imports numpy, whose BLAS starts threads: a second trace read in the same
    process (every rank of a run, one after the other) still forks its workers."""
    if two_workers is None:
        return  # it ran in a fresh process
    import sys

    assert "numpy" not in sys.modules
    from diagnose.analysis.trace import vectorized

    assert timeline_module.threads_in_process() == 1 + vectorized.STARTED_THREADS
    (trace,) = (DATA / "item_syncs").glob("*.json.gz")
    load_timeline(trace)
    assert two_workers == [2]


def test_a_process_with_other_threads_reads_in_one_process(tiny_blocks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    monkeypatch.setenv(timeline_module.WORKERS_ENV, "2")
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert timeline_module.threads_in_process() > 1
        with timeline_module._worker_pool(2, timeline_module._fold_piece) as pool:
            assert pool is None
    finally:
        release.set()
        other.join()


# --- a trace larger than one analysis reads ----------------------------------------------------------


def steps_trace(n: int) -> TraceBuilder:
    """``n`` steps of 100 µs, each a forward operator launching a 40 µs kernel."""
    b = TraceBuilder()
    for i in range(n):
        t = i * 100.0
        b.step(i + 1, t, 100)
        b.op("aten::linear", t, 60, forward=True)
        b.kernel("ampere_sgemm_128x64_nn", t + 20, 40, launch_ts=t + 10)
    b.events.append(
        {
            "ph": "X",
            "cat": "gpu_user_annotation",
            "name": "ProfilerStep#99",
            "pid": 0,
            "tid": 7,
            "ts": 5000.0,
            "dur": 1.0,
        }
    )
    return b


@pytest.mark.parametrize("gz", [False, True], ids=["mapped", "gz"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_step_marks_are_found_by_a_scan_of_the_text(
    tmp_path: Path, tiny_blocks: None, layout: Layout, gz: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracefile, "MARKS_WINDOW_BYTES", mmap.ALLOCATIONGRANULARITY)  # windows of a page: marks cut too
    doc = steps_trace(8).to_dict()
    pad = {"ph": "X", "cat": "cpu_op", "name": "pad" * 500, "pid": 1, "tid": 99, "ts": 0.5, "dur": 0.1}
    doc["traceEvents"] = [x for e in doc["traceEvents"] for x in (e, pad)]  # a mark every page or so
    text = layout.dumps(doc).encode()
    assert len(text) > 5 * mmap.ALLOCATIONGRANULARITY
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    # the GPU's copy of a mark is not a step; blocks of 7 bytes (gz) cut every mark somewhere
    assert tracefile.step_marks(path)[0] == [(i * 100.0, i * 100.0 + 100.0) for i in range(8)]


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gz"])
def test_a_trace_over_the_detail_budget_is_analysed_over_its_first_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gz: bool
) -> None:
    path = steps_trace(8).write(tmp_path / ("t.json.gz" if gz else "t.json"), gz=gz)
    whole = load_timeline(path)
    assert (len(whole.steps), whole.meta.detail) == (8, None)
    json_bytes = tracefile.json_size_estimate(path)
    # a budget of 3/8 of the JSON (plus a little): the first three steps, every event from 300 µs on left out
    monkeypatch.setattr(timeline_module, "DETAIL_MAX_JSON_BYTES", json_bytes * 3 // 8 + 1)
    cut = load_timeline(path)
    assert [s.start for s in cut.steps] == [0.0, 100.0, 200.0]
    assert [k.start for k in cut.kernels] == [20.0, 120.0, 220.0]
    detail = cut.meta.detail
    assert (detail.steps_in_trace, detail.steps_analysed, detail.cut_us) == (8, 3, 300.0)
    # five steps of a mark, an operator and its forward->backward arrow, a launch and a kernel,
    # and the GPU's copy of a mark
    assert detail.events_left_out == 5 * 5 + 1
    assert "holds 8 steps" in detail.note() and "its first 3 steps were analysed" in detail.note()
    # a budget under one step still analyses one
    monkeypatch.setattr(timeline_module, "DETAIL_MAX_JSON_BYTES", 10)
    assert len(load_timeline(path).steps) == 1


@pytest.mark.parametrize("head_bytes", [None, 16 * 1024])
def test_a_gzipped_traces_length_past_its_trailers_modulus_is_found_from_its_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head_bytes: int | None
) -> None:
    """The trailer records the length modulo 4 GiB (a 5 GB trace's says 0.7 GB): the multiple is
    the one nearest the file's size times the ratio its head inflates at. Made small here: a
    modulus of 1 MiB, the whole file inflated, or only its first 16 KB (the ratio then close)."""
    doc = steps_trace(8).to_dict()
    doc["traceEvents"] = [{**e, "args": {"copy": k}} for k in range(800) for e in doc["traceEvents"]]
    text = json.dumps(doc).encode()
    path = _write(tmp_path, "t.json.gz", gzip.compress(text, compresslevel=6))
    assert len(text) > 3 << 20
    monkeypatch.setattr(tracefile, "_ISIZE_MODULUS", 1 << 20)
    if head_bytes is not None:
        monkeypatch.setattr(tracefile, "_RATIO_HEAD_BYTES", head_bytes)
    assert tracefile.json_size_estimate(path) == len(text)
    # the scan for the step marks counts the length exactly
    assert tracefile.step_marks(path)[1] == len(text)


def test_the_detail_window_budgets_the_length_its_scan_counted_not_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gzipped trace's estimate can be far off (members one after another, a ratio unlike its
    head's): the window is cut by the length the scan for the marks counted."""
    path = steps_trace(8).write(tmp_path / "t.json.gz", gz=True)
    with gzip.open(path, "rb") as fh:
        json_bytes = len(fh.read())
    monkeypatch.setattr(timeline_module, "DETAIL_MAX_JSON_BYTES", json_bytes * 3 // 8 + 1)
    monkeypatch.setattr(
        timeline_module, "json_size_estimate", lambda p: json_bytes // 2
    )  # over the budget, half the truth
    detail = load_timeline(path).meta.detail
    assert (detail.steps_analysed, detail.json_bytes) == (3, json_bytes)


def test_the_breakdown_says_the_trace_was_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from diagnose.analysis.measure.breakdown import compute_breakdown

    path = steps_trace(8).write(tmp_path / "t.json")
    monkeypatch.setattr(timeline_module, "DETAIL_MAX_JSON_BYTES", tracefile.json_size_estimate(path) // 2)
    breakdown = compute_breakdown(load_timeline(path))
    assert len(breakdown.steps) == 4
    assert any("its first 4 steps were analysed" in note for note in breakdown.notes)


def test_worker_processes_leave_out_the_same_events_after_a_detail_window(
    tmp_path: Path, tiny_blocks: None, two_workers: list[int] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if two_workers is None:
        return  # it ran in a fresh process
    path = steps_trace(8).write(tmp_path / "t.json")
    monkeypatch.setattr(timeline_module, "DETAIL_MAX_JSON_BYTES", tracefile.json_size_estimate(path) // 2)
    in_workers = load_timeline(path)
    assert two_workers == [2]
    monkeypatch.setenv(timeline_module.WORKERS_ENV, "1")
    assert _timeline_fields(in_workers) == _timeline_fields(load_timeline(path))
    assert (len(in_workers.steps), in_workers.meta.detail.events_left_out) == (4, 4 * 5 + 1)


def test_a_piece_wholly_after_the_detail_window_is_counted_without_being_read() -> None:
    def piece(*events: Any) -> tracefile.Piece:
        return tracefile.Piece(",".join(json.dumps(e) for e in events).encode(), b"", 0)

    late = {"ph": "X", "cat": "kernel", "name": "k", "ts": 500.0, "dur": 1, "args": {"correlation": 1}}
    assert tracefile.count_if_all_after(piece(late, {**late, "ts": 300}), 300.0) == 2
    # one event inside the window, a missing or odd ts, or an element that is not an object:
    # the piece is read as any other
    assert tracefile.count_if_all_after(piece(late, {**late, "ts": 299.5}), 300.0) is None
    assert tracefile.count_if_all_after(piece(late, {"ph": "M", "name": "thread_name"}), 300.0) is None
    assert tracefile.count_if_all_after(piece(late, {**late, "ts": "900"}), 300.0) is None
    assert tracefile.count_if_all_after(piece(late, [1, 2]), 300.0) is None
    assert tracefile.count_if_all_after(tracefile.Piece(b'{"ts": 1', b"", 0), 0.0) is None


# --- cutting a plain file by seeking (the workers read their own pieces) -------------------------


def _sought_events(path: Path) -> tuple[list[Any], dict[str, Any], list[tracefile.Piece]]:
    """Events decoded through the seeking path, every piece submitted as a worker would get it
    (its text read back from the file) and the pieces seen."""
    seen: list[tracefile.Piece] = []

    def submit(piece: tracefile.Piece) -> Any:
        seen.append(piece)
        assert isinstance(piece, tracefile.FilePiece)
        text = tracefile.read_span(path, piece.offset, piece.length)  # as a worker reads it
        return lambda: decode_objects(tracefile.Piece(text, b"", piece.offset))

    stream = TraceStream(path)
    events = [e for objects in stream.decoded(decode_objects, submit, in_flight=3) for e in objects]
    return events, stream.metadata, seen


@pytest.mark.parametrize("block", [7, 50, 300, 100_000])
def test_seeking_cuts_give_the_events_and_metadata_of_one_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(tracefile, "BLOCK_BYTES", block)
    doc = one_gpu_step().to_dict()
    doc["traceEvents"] += [
        {"ph": "X", "cat": "cpu_op", "name": 'a "},{" in a name', "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "x" * 200_000,
            "pid": 1,
            "tid": 1,
            "ts": 2.0,
            "dur": 1.0,
        },  # over the 64 KB window
    ]
    doc["deviceProperties"] = [{"name": "a ] in the metadata"}]
    for layout in LAYOUTS[:2]:
        path = tmp_path / f"{layout.name}.json"
        path.write_text(layout.dumps(doc))
        events, metadata, pieces = _sought_events(path)
        assert events == doc["traceEvents"]
        assert metadata == {k: v for k, v in doc.items() if k != "traceEvents"}
        assert (len(pieces) > 1) == (block < 100_000)
        joined = [p for p in pieces if p._text is not None]  # read here only to join a cut inside a string
        assert len(joined) <= 3  # at most the pieces around the '},{' inside the name
        # the pieces and the text between them are the file's bytes, in order
        raw = path.read_bytes()
        for piece, following in pairwise(pieces):
            assert raw[piece.offset : piece.offset + piece.length] == piece.text
            assert raw[piece.offset + piece.length : following.offset] == piece.separator


def test_a_file_without_a_cut_after_the_first_block_is_read_as_its_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracefile, "BLOCK_BYTES", 64)
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "y" * 1000, "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    events, metadata, pieces = _sought_events(path)
    assert events == doc["traceEvents"] and metadata == {} and pieces == []


# --- issue 38, 7: time linear in the text, however long an event -------------------------------------


class _CountedBoundary:
    """``tracefile._BOUNDARY``, counting the bytes its searches for a cut look at."""

    def __init__(self) -> None:
        self.searched = 0
        self.pattern = tracefile._BOUNDARY

    def finditer(self, buf: Any, start: int = 0) -> Any:
        self.searched += len(buf) - start
        return self.pattern.finditer(buf, start)

    def search(self, buf: Any, *args: Any) -> Any:
        return self.pattern.search(buf, *args)


def _long_event_trace(tmp_path: Path, gz: bool, text: str) -> tuple[Path, dict[str, Any]]:
    doc = one_gpu_step().to_dict()
    doc["traceEvents"].insert(
        3, {"ph": "X", "cat": "cpu_op", "name": "long", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0, "args": {"s": text}}
    )
    raw = json.dumps(doc).encode()
    path = _write(tmp_path, "t.json.gz" if gz else "t.json", gzip.compress(raw) if gz else raw)
    return path, doc


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gz"])
def test_an_event_of_many_blocks_is_searched_for_cuts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gz: bool
) -> None:
    """The text carried from block to block (an event longer than a block) is not searched again
    with each block: a 256 MB trace read in 31 s gzipped against 2.6 s plain."""
    monkeypatch.setattr(tracefile, "BLOCK_BYTES", 4096)
    counted = _CountedBoundary()
    monkeypatch.setattr(tracefile, "_BOUNDARY", counted)
    path, doc = _long_event_trace(tmp_path, gz, "0123456789abcdef" * 65536)  # 1 MB: 256 blocks
    events, _ = stream_events(path)
    assert events == doc["traceEvents"]
    json_bytes = len(json.dumps(doc))
    assert 0 < counted.searched < 2 * json_bytes, (counted.searched, json_bytes)


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gz"])
def test_an_event_of_many_blocks_full_of_candidate_cuts_is_parsed_a_few_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gz: bool
) -> None:
    """Each block of the event ends at a '},{' inside its string, which does not parse: the piece
    joined so far is parsed again only once it has doubled, not after each block."""
    monkeypatch.setattr(tracefile, "BLOCK_BYTES", 4096)
    path, doc = _long_event_trace(tmp_path, gz, 'abc"},{"' * 65536)  # 0.5 MB: a candidate cut every 8 bytes
    parsed: list[int] = []

    def decode(piece: tracefile.Piece) -> list[Any]:
        parsed.append(len(piece.text))
        return decode_objects(piece)

    stream = TraceStream(path)
    events = [e for objects in stream.decoded(decode) for e in objects]
    assert events == doc["traceEvents"]
    json_bytes = len(json.dumps(doc))
    assert sum(parsed) < 5 * json_bytes, (sum(parsed), json_bytes, len(parsed))


def test_an_event_of_many_blocks_in_a_trace_read_by_workers_is_searched_once(
    tmp_path: Path, two_workers: list[int] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gzipped trace read by workers: the event does not fit a slot, its text is carried."""
    if two_workers is None:
        return  # it ran in a fresh process
    monkeypatch.setattr(tracefile, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(timeline_module, "SLOT_BYTES", 8192)
    counted = _CountedBoundary()
    monkeypatch.setattr(tracefile, "_BOUNDARY", counted)
    b = one_gpu_step()
    b.events.append(
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "long",
            "pid": 1,
            "tid": 1,
            "ts": 1.0,
            "dur": 1.0,
            "args": {"s": "0123456789abcdef" * 65536},
        }
    )
    path = b.write(tmp_path / "t.json.gz", gz=True)
    expected = reference_timeline.build_timeline(b.to_dict())
    assert _timeline_fields(load_timeline(path)) == _timeline_fields(expected)
    assert two_workers == [2]
    json_bytes = len(json.dumps(b.to_dict()))
    assert 0 < counted.searched < 2 * json_bytes, (counted.searched, json_bytes)
