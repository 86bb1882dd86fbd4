"""Faults of issue 19, each reproduced as a user or a hostile input met it: rule files that load
but would fail when evaluated, non-finite numbers, duplicated events, escapes in trace strings,
malformed files, analysing a user's own folder, and two runs started at the same instant."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.analysis.symptoms import symptoms_from_values
from diagnose.analysis.verdict.findings import diagnose_symptoms
from diagnose.analysis.verdict.rules import MAX_NESTING, ExprError, Rule, load_rule_file, parse_condition, parse_expr
from diagnose.errors import RuleError
from tests.test_rules import VALID


def python_in(folder: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python *args`` in ``folder``, importing this checkout's diagnose; its output captured."""
    from tests.conftest import REPO

    return subprocess.run(
        [sys.executable, *args],
        cwd=folder,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- 3. rule files: checked fully at load time, and never fatal at run time ----------------------


@pytest.mark.parametrize(
    ("gain", "problem"),
    [
        ("ceil(gpu.busy, 2)", "ceil() takes 1 argument(s), not 2"),
        ("max(gpu.busy)", "max() takes at least 2 argument(s), not 1"),
        ("ceil(1e999)", "the number 1e999 is too large"),
        ("(" * 330 + "gpu.busy" + ")" * 330, "longer than 256 tokens"),
        ("(" * (MAX_NESTING + 1) + "1" + ")" * (MAX_NESTING + 1), f"nests deeper than {MAX_NESTING} levels"),
        (" + ".join(["gpu.busy"] * 200), "longer than 256 tokens"),
    ],
)
def test_gain_expressions_are_checked_at_load_time(tmp_path: Path, gain: str, problem: str) -> None:
    path = tmp_path / "MY001.toml"
    path.write_text(VALID.replace('why = "w"', f'why = "w"\ngain = "{gain}"'))
    with pytest.raises(RuleError) as info:
        load_rule_file(path)
    assert f"{path}:6: bad gain expression" in info.value.message and problem in info.value.message


@pytest.mark.parametrize(
    ("says", "problem"),
    [
        ("{gpu.busy:>1500000000}", "width over 40"),
        ("{gpu.busy:.99f}", "precision over 12"),
        ("{gpu.busy:d}", "not a number format"),
        ("{gpu.busy:!r}", "not a number format"),
    ],
)
def test_format_specs_are_checked_at_load_time(tmp_path: Path, says: str, problem: str) -> None:
    path = tmp_path / "MY001.toml"
    path.write_text(VALID.replace('says = "s"', f'says = "{says}"'))
    with pytest.raises(RuleError) as info:
        load_rule_file(path)
    assert f"{path}:3: says: " in info.value.message and problem in info.value.message


def test_sane_format_specs_still_load(tmp_path: Path) -> None:
    path = tmp_path / "MY001.toml"
    path.write_text(VALID.replace('says = "s"', 'says = "{gpu.busy:%} {gpu.busy:>8,.2f} {gpu.busy:x} {gpu.busy:+.1e}"'))
    assert load_rule_file(path).says.startswith("{gpu.busy:%}")


@pytest.mark.parametrize(
    ("text", "expected"), [("ceil(1 / 0)", math.inf), ("floor(0 / 0)", math.nan), ("ceil(-1 / 0)", -math.inf)]
)
def test_rounding_passes_non_finite_values_through(text: str, expected: float) -> None:
    from diagnose.analysis.verdict.rules import evaluate

    value = evaluate(parse_expr(text), {})
    assert (math.isnan(value) and math.isnan(expected)) or value == expected


def test_an_infinite_gain_is_an_unknown_bound_not_infx(tmp_path: Path) -> None:
    path = tmp_path / "MY001.toml"
    path.write_text(
        VALID.replace('why = "w"', 'why = "w"\ngain = "ceil(1 / gpu.busy)"').replace(
            'says = "s"', 'says = "up to {gain}"'
        )
    )
    rule = load_rule_file(path)
    diagnosis = diagnose_symptoms([rule], symptoms_from_values({"gpu.busy": 0.0}))
    (finding,) = diagnosis.findings
    assert finding.gain is None and finding.says == "up to n/a"


def test_a_rule_failing_at_run_time_is_skipped_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "MY001.toml"
    path.write_text(VALID)
    good = load_rule_file(path)

    class Exploding(ExprError):
        pass

    def explode(values: object) -> bool:
        raise Exploding("cannot evaluate")

    broken = Rule(**{**good.__dict__, "id": "MY002"})
    object.__setattr__(broken, "fires", explode)
    diagnosis = diagnose_symptoms([broken, good], symptoms_from_values({"gpu.busy": 0.1}))
    assert [f.rule_id for f in diagnosis.findings] == ["MY001"]
    assert diagnosis.skipped == ["rule MY002 (MY001.toml) was skipped: Exploding: cannot evaluate"]


def test_conditions_still_parse() -> None:
    assert parse_condition("max(gpu.busy, 0.5) < ceil(2.5)")[0] == "<"


# --- 10. non-finite numbers, duplicated events, escapes in trace strings ---------------------------

STEPS = [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 100, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 110, "dur": 50},
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 110, "dur": 20},  # same start, nested
]


def _analyse(tmp_path: Path, events: list[dict], name: str = "t.json"):  # Report
    from diagnose.analysis.pipeline import AnalysisOptions, analyze_trace

    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return analyze_trace(path, AnalysisOptions.load())


def _strict_json(text: str) -> object:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in JSON output")

    return json.loads(text, parse_constant=refuse)


def test_json_output_never_holds_nan_or_infinity(tmp_path: Path) -> None:
    from diagnose.report import Symptom

    report = _analyse(tmp_path, STEPS)
    assert report.throughput.profiled is not None
    report.throughput.profiled.steps_per_s = math.inf
    report.symptoms["gpu.busy"] = Symptom(value=math.nan, unit="share", description="d")
    data = _strict_json(report.to_json())
    assert data["throughput"]["profiled"]["steps_per_s"] is None and data["symptoms"]["gpu.busy"]["value"] is None


def test_a_share_of_100_percent_bounds_nothing_and_says_no_infx(tmp_path: Path) -> None:
    from diagnose.renderers import TerminalRenderer

    report = _analyse(tmp_path, STEPS)  # all host time is "other": 1 / (1 - 1) is unbounded
    assert all(f["gain_bound"] is None or math.isfinite(f["gain_bound"]) for f in report.findings)
    text = TerminalRenderer(color=False).render(report)
    assert "infx" not in text and "inf ms" not in text and "nan" not in text.lower().split()


def test_duplicated_events_are_counted_once_and_said(tmp_path: Path) -> None:
    once = _analyse(tmp_path, STEPS, "once.json")
    twice = _analyse(tmp_path, STEPS + STEPS, "twice.json")
    assert twice.breakdown["steps"] == once.breakdown["steps"]
    assert any("holds 5 duplicated event(s)" in w for w in twice.warnings), twice.warnings
    assert not any("duplicated" in w for w in once.warnings)


@pytest.mark.parametrize("color", [False, True])
def test_escape_sequences_in_trace_strings_never_reach_the_terminal(tmp_path: Path, color: bool) -> None:
    from diagnose.renderers import TerminalRenderer

    hostile = [
        *STEPS,
        {"ph": "X", "cat": "\x1b[2Jquantum\x1b]0;pwned\x07", "name": "x", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
    ]
    text = TerminalRenderer(color=color).render(_analyse(tmp_path, hostile))
    assert "\\x1b[2Jquantum\\x1b]0;pwned\\x07" in text  # shown, written out
    assert "\x1b[2J" not in text and "\x1b]0" not in text and "\x07" not in text
    if not color:
        assert "\x1b" not in text


# --- 11. two runs that start at the same instant --------------------------------------------------


def _start_a_run(root: str, barrier: object, made: object) -> None:
    from diagnose.rundir import RunDir, default_location

    barrier.wait()  # type: ignore[attr-defined]
    made.put(str(RunDir.create(default_location("train", root=Path(root))).path))  # type: ignore[attr-defined]


def test_runs_started_at_the_same_instant_never_share_a_default_run_directory(tmp_path: Path) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    starters = 24
    barrier, made = ctx.Barrier(starters), ctx.Queue()
    processes = [ctx.Process(target=_start_a_run, args=(str(tmp_path), barrier, made)) for _ in range(starters)]
    for p in processes:
        p.start()
    paths = [made.get(timeout=60) for _ in processes]
    for p in processes:
        p.join(timeout=60)
    assert len(set(paths)) == starters, f"{starters - len(set(paths))} runs shared a folder"


# --- 8. malformed fields and files: one line, the right exit code, never a traceback ---------------

KERNEL_STEP = [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {
        "ph": "X",
        "cat": "kernel",
        "name": "k",
        "pid": 0,
        "tid": 7,
        "ts": 30,
        "dur": 5,
        "args": {"correlation": 1, "stream": 7},
    },
]


def _with(index: int, **fields: object) -> list[dict]:
    events = [dict(e) for e in KERNEL_STEP]
    events[index] = {**events[index], **fields}
    return events


@pytest.mark.parametrize(
    ("events", "message"),
    [
        (
            _with(1, args={"correlation": 1, "stream": [7]}),
            "event 1 (kernel 'k') has args.stream [7], not a number or a string",
        ),
        (_with(1, args=[1, 2]), "event 1 (kernel 'k') has args [1, 2], not an object"),
        (_with(1, args={"correlation": [1]}), "has args.correlation [1], not a number or a string"),
        (_with(1, name=None), "event 1 has name None, not a string"),
        (_with(1, name=5), "event 1 has name 5, not a string"),
    ],
)
def test_malformed_trace_fields_are_one_line(tmp_path: Path, events: list[dict], message: str) -> None:
    from tests.test_failures import diagnose, error_line

    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    proc = diagnose("analyze", "t.json", cwd=tmp_path)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    assert message in error_line(proc)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ('{"status": ', "cannot read"),
        ('{"status": 5}', "its field status is 5, not str"),
        ('{"trace_files": 7}', "its field trace_files is 7, not list"),
        ('{"trace_files": [7]}', "its field trace_files holds [7], not a list[str]"),
        ("[]", "holds list, not an object"),
    ],
)
def test_a_corrupt_run_json_is_one_line(tmp_path: Path, record: str, message: str) -> None:
    from tests.test_failures import diagnose, error_line

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(record)
    (run / "h_1.1.pt.trace.json").write_text(json.dumps({"traceEvents": STEPS}))
    proc = diagnose("analyze", "run", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot read run/run.json: " in error_line(proc) and message in error_line(proc)


@pytest.mark.parametrize("saved", ["[]", '{"findings": 3}', "{"])
def test_a_corrupt_report_json_is_one_line(tmp_path: Path, saved: str) -> None:
    from tests.test_failures import diagnose, error_line

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.json").write_text(saved)
    proc = diagnose("report", "run", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot read" in error_line(proc)


# --- 9. analyze FOLDER: a user's own folder is never written into ---------------------------------


def test_analyze_of_a_users_folder_of_traces_writes_nothing_there(tmp_path: Path) -> None:
    from tests.test_failures import diagnose

    mine = tmp_path / "my_traces"
    mine.mkdir()
    (mine / "host_1.1.pt.trace.json").write_text(json.dumps({"traceEvents": STEPS}))
    (mine / "report.json").write_text("my own notes")
    before = sorted((p.name, p.read_bytes()) for p in mine.iterdir())
    proc = diagnose("analyze", "--json", "my_traces", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["breakdown"]["steps"]
    proc = diagnose("analyze", "--html", "my_traces", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted((p.name, p.read_bytes()) for p in mine.iterdir()) == before
    (written,) = (tmp_path / "runs").iterdir()
    assert written.name.startswith("analyze-my_traces-") and (written / "report.html").is_file()
    assert f"wrote {written}" in proc.stderr


def test_analyze_of_a_run_directory_still_rewrites_its_report(tmp_path: Path) -> None:
    from tests.test_failures import diagnose

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text('{"trace_files": ["h_1.1.pt.trace.json"]}')
    (run / "h_1.1.pt.trace.json").write_text(json.dumps({"traceEvents": STEPS}))
    proc = diagnose("analyze", "run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    from diagnose.rundir import RunDir

    assert json.loads(RunDir(run).report_path.read_text())["breakdown"]["steps"]


# --- 11. Ctrl-C says so --------------------------------------------------------------------------


def test_ctrl_c_outside_the_script_prints_the_interrupted_line(tmp_path: Path) -> None:

    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": STEPS}))
    code = (
        "import sys, diagnose.analysis.pipeline as p\n"
        "def interrupted(*a, **k): raise KeyboardInterrupt\n"
        "p.analyze = interrupted\n"
        "sys.argv = ['diagnose', 'analyze', 't.json']\n"
        "from diagnose.cli import main; main()\n"
    )
    proc = python_in(tmp_path, "-c", code)
    assert proc.returncode == 130
    assert "diagnose: interrupted" in proc.stderr and "Traceback" not in proc.stderr


# --- 4. the trace run.json names, never a stray one -------------------------------------------------


def test_a_stray_trace_is_not_analysed_when_the_record_names_none(tmp_path: Path) -> None:
    from diagnose.record import RunRecord
    from diagnose.rundir import RunDir

    (tmp_path / "script_1.1.pt.trace.json").write_text(json.dumps({"traceEvents": STEPS}))  # the script's own
    chosen, warnings = RunDir(tmp_path).trace_for(RunRecord(status="stopped", trace_files=[]))
    assert chosen is None
    assert warnings == ["1 trace(s) in the run directory that its record does not name were not analysed"]


# --- 2. a second signal while diagnose saves ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "exit_code", "state"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")]
)
@pytest.mark.parametrize("gap_s", [0.02, 0.1])
def test_a_second_signal_soon_after_the_first_keeps_the_report(
    write_script, tmp_path: Path, sig: str, exit_code: int, state: str, gap_s: float
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO
    from tests.scripts import MLP_TRAIN

    write_script(
        MLP_TRAIN.replace(
            "opt.step()",
            "opt.step()\n        n = globals().setdefault('n', [0]); n[0] += 1\n"
            "        if n[0] == 6: open('in_window', 'w').close()\n"
            "        if n[0] >= 6: __import__('time').sleep(0.05)",
        )
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--warmup",
            "2",
            "--steps",
            "50",
            "--quiet",
            "--out",
            "run",
            "train.py",
        ],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (tmp_path / "in_window").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(getattr(signal, sig))
    time.sleep(gap_s)
    proc.send_signal(getattr(signal, sig))
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == exit_code, stderr[-3000:]
    assert "diagnose/" not in stderr and "Terminated" not in stderr.replace("terminated (SIGTERM)", ""), stderr[-3000:]
    from diagnose.rundir import RunDir

    saved = RunDir(tmp_path / "run")
    run = json.loads(saved.record_path().read_text())
    report = json.loads(saved.report_path.read_text())
    assert run["status"] == state and report["status"]["state"] == state


@pytest.mark.slow
def test_ctrl_c_inside_torchs_step_mark_still_stops_cleanly_with_the_report(write_script, tmp_path: Path) -> None:
    """The race CI met once, made to happen every time: SIGINT arrives just after torch's step
    began its step mark in C++ and before Python stored it. Deferred, it raises once the step
    returns: exit 130, the report saved, no crash as the interpreter exits (it was -11)."""

    from tests.scripts import MLP_TRAIN

    write_script(
        "import signal, torch\n"
        "enter = torch.ops.profiler._record_function_enter_new\n"
        "marks = []\n"
        "def cut(name, *args):\n"
        "    handle = enter(name, *args)\n"
        "    if name.startswith('ProfilerStep#'):\n"
        "        marks.append(name)\n"
        "        if len(marks) == 4: signal.raise_signal(signal.SIGINT)\n"
        "    return handle\n"
        "torch.ops.profiler._record_function_enter_new = cut\n" + MLP_TRAIN
    )
    proc = python_in(
        tmp_path,
        "-m",
        "diagnose",
        "run",
        "--warmup",
        "2",
        "--steps",
        "20",
        "--quiet",
        "--out",
        "run",
        "train.py",
        timeout=300,
    )
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "finish failed" not in proc.stderr and "diagnose/" not in proc.stderr, proc.stderr[-3000:]
    from diagnose.rundir import RunDir

    saved = RunDir(tmp_path / "run")
    run = json.loads(saved.record_path().read_text())
    assert run["status"] == "interrupted" and run["trace_files"], run
    assert json.loads(saved.report_path.read_text())["status"]["state"] == "interrupted"


def test_a_signal_inside_a_deferred_call_is_delivered_when_it_returns() -> None:
    import signal

    from diagnose.signals import deferred

    before = signal.getsignal(signal.SIGINT)
    done = []
    with pytest.raises(KeyboardInterrupt), deferred():
        signal.raise_signal(signal.SIGINT)
        done.append("the call ran to its end")
    assert done == ["the call ran to its end"]
    assert signal.getsignal(signal.SIGINT) is before


def test_a_step_mark_begun_but_never_stored_still_lets_the_profiler_stop(tmp_path: Path) -> None:
    """What a signal inside torch's step leaves: stop() fails on the mark before it stops
    anything, and the running profiler crashes the interpreter at exit (-11)."""

    code = (
        "import torch\n"
        "from torch.autograd.profiler import record_function\n"
        "from torch.profiler import profile, schedule\n"
        "from diagnose.runtime.capture import stop_profiler\n"
        "saved = []\n"
        "p = profile(schedule=schedule(wait=0, warmup=1, active=30), on_trace_ready=lambda p: saved.append(1))\n"
        "p.start()\n"
        "for _ in range(3):\n"
        "    torch.randn(64, 64) @ torch.randn(64, 64)\n"
        "    p.step()\n"
        "p.step_rec_fn.__exit__(None, None, None)\n"
        "p.step_rec_fn = record_function('ProfilerStep#3')\n"
        "handle = torch.ops.profiler._record_function_enter_new('ProfilerStep#3', None); del handle\n"
        "stop_profiler(p)\n"
        "print('saved', len(saved))\n"
    )
    proc = python_in(tmp_path, "-c", code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "saved 1" in proc.stdout


# --- 6. a DataLoader worker's death signalled while diagnose handles the script's failure ------------

#: The race, made to happen every time. A worker dies; the script fails with an error of its own
#: (a batch its dead worker was sending, say) before torch's SIGCHLD handler has run: the script
#: blocks SIGCHLD. This driver runs ``diagnose run`` in-process and unblocks SIGCHLD at the first
#: call diagnose's failure handling makes: the pending signal runs torch's handler right there,
#: as a late SIGCHLD does (Python runs pending handlers between bytecodes, and ``signal.signal``
#: runs them before it changes a handler: once in ~20 runs on this machine, before the fix).
SIGCHLD_DRIVER = """
import os, runpy, signal, sys
from diagnose.runtime import runner

HANDLING = {"execute", "_ending", "_describe_error", "_finalize", "_uninstall", "_print_script_traceback"}

def deliver(frame, event, arg):
    caller = frame if event == "c_call" else frame.f_back
    if event in ("call", "c_call") and caller is not None and caller.f_code.co_name in HANDLING \\
            and caller.f_code.co_filename == runner.__file__:
        sys.setprofile(None)
        print(f"SIGCHLD delivered in {caller.f_code.co_name}", file=sys.stderr)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})

run_path = runpy.run_path
def run_script(*args, **kwargs):
    try:
        return run_path(*args, **kwargs)
    finally:  # the script ended (it failed): diagnose handles it from here
        sys.setprofile(deliver)
runpy.run_path = run_script
sys.argv = ["diagnose", "run", "--warmup", "2", "--steps", "20", "--quiet", "--no-lines", "train.py"]
runpy.run_module("diagnose", run_name="__main__")
"""


@pytest.mark.slow
def test_a_dead_workers_sigchld_during_the_failure_handling_keeps_the_report(write_script, tmp_path: Path) -> None:
    import re

    from tests.test_failures import run_dir_of, saved

    write_script(
        """
import os, signal, time, torch
from torch.utils.data import DataLoader, Dataset
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # torch's handler does not run in the script
torch.multiprocessing.set_sharing_strategy("file_system")  # a batch received needs no live sender
class Data(Dataset):
    def __len__(self):
        return 100000
    def __getitem__(self, i):
        if i == 64:  # batch 8: die once batch 7 was received (a dying worker's queued batches can be lost)
            while not os.path.exists("batch7-received"):
                time.sleep(0.01)
            os._exit(3)
        return torch.ones(4)
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
batches = iter(DataLoader(Data(), batch_size=8, num_workers=1))
for i, x in enumerate(batches):
    m(x).sum().backward(); opt.step(); opt.zero_grad()
    if i == 7:  # the worker was asked for batch 8: wait until it is dead (not reaped), then fail
        open("batch7-received", "w").close()
        deadline = time.time() + 60
        while os.waitid(os.P_PID, batches._workers[0].pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None and time.time() < deadline:
            time.sleep(0.05)
        raise ConnectionResetError("the dead worker's batch cannot be received")
"""
    )
    (tmp_path / "driver.py").write_text(SIGCHLD_DRIVER)
    proc = python_in(tmp_path, "driver.py", timeout=180)
    assert "SIGCHLD delivered in execute" in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "diagnose/runtime" not in proc.stderr, proc.stderr[-3000:]  # the script's traceback, not diagnose's
    run, report = saved(run_dir_of(tmp_path))
    assert run["status"] == report["status"]["state"] == "failed"
    assert "the dead worker's batch cannot be received" in report["status"]["message"]
    assert any(
        re.search(r"torch reported: DataLoader worker \(pid \d+\) exited unexpectedly", w) for w in run["warnings"]
    ), run["warnings"]


# --- 7. out of memory while saving the trace -------------------------------------------------------


def test_a_failed_compression_keeps_the_raw_trace_and_leaves_no_empty_gz(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diagnose.progress import Progress
    from diagnose.record import WindowPlan
    from diagnose.rundir import RunDir
    from diagnose.runtime import capture

    class Profiler:
        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text(json.dumps({"traceEvents": STEPS}))

    def out_of_memory(*args: object) -> None:
        raise MemoryError("cannot allocate")

    monkeypatch.setattr(capture.shutil, "copyfileobj", out_of_memory)
    session = capture.CaptureSession(WindowPlan(), RunDir(tmp_path), Progress(enabled=False), window=None)  # type: ignore[arg-type]
    session._save_trace(Profiler())
    (kept,) = tmp_path.iterdir()
    assert kept.name.endswith(".pt.trace.json") and session.trace_files == [kept.name]
    assert "could not be compressed (MemoryError: cannot allocate)" in session.notes[0]
    assert RunDir(tmp_path).traces() == [kept]


def test_a_failed_export_leaves_no_trace_and_never_raises_into_the_script(tmp_path: Path) -> None:
    from diagnose.progress import Progress
    from diagnose.record import WindowPlan
    from diagnose.rundir import RunDir
    from diagnose.runtime import capture

    class OutOfMemory:
        """Kineto writes part of the trace, then memory runs out."""

        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text('{"traceEvents": [')
            raise MemoryError("std::bad_alloc")

    session = capture.CaptureSession(WindowPlan(), RunDir(tmp_path), Progress(enabled=False), window=None)  # type: ignore[arg-type]
    session._save_trace(OutOfMemory())
    assert list(tmp_path.iterdir()) == [] and session.trace_files == []
    assert "the trace could not be written (MemoryError: std::bad_alloc)" in session.notes[0]


def test_analyze_never_picks_an_empty_trace_or_a_cut_short_gz(tmp_path: Path) -> None:
    import gzip

    from diagnose.record import RunRecord
    from diagnose.rundir import RunDir

    raw = tmp_path / "h_1.1.pt.trace.json"
    raw.write_text(json.dumps({"traceEvents": STEPS}))
    with gzip.open(tmp_path / "h_1.1.pt.trace.json.gz", "wb"):
        pass  # the header alone, as a compression cut short leaves it
    (tmp_path / "h_1.2.pt.trace.json").write_text("")
    run = RunDir(tmp_path)
    assert run.traces() == [raw]
    assert run.trace_for(None)[0] == raw
    named_empty = RunRecord(trace_files=["h_1.2.pt.trace.json"])
    assert run.trace_for(named_empty)[0] == raw  # the record's trace is empty: none of it is read


def test_memory_running_out_in_the_analysis_still_leaves_a_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diagnose import session
    from diagnose.analysis.pipeline import AnalysisOptions
    from diagnose.errors import TraceError
    from diagnose.record import RunRecord
    from diagnose.rundir import RunDir

    run = RunDir(tmp_path)
    run.save_record(RunRecord(status="stopped", trace_files=["h_1.1.pt.trace.json"], boundaries_s=[0.0, 0.1, 0.2, 0.3]))
    (tmp_path / "h_1.1.pt.trace.json").write_text(json.dumps({"traceEvents": STEPS}))

    def out_of_memory(*args: object) -> None:
        raise MemoryError()

    monkeypatch.setattr(session, "analyze_run", out_of_memory)
    with pytest.raises(TraceError, match="memory ran out while analysing the trace") as raised:
        session.analyze_and_save(run, AnalysisOptions.load(()))
    assert raised.value.exit_code == 4
    report = json.loads(run.report_path.read_text())
    assert report["status"]["state"] == "stopped"
    assert any(w.startswith("the trace could not be analysed: memory ran out") for w in report["warnings"])
    # a re-analysis that fails keeps the report the run has
    run.report_path.write_text(json.dumps({**report, "warnings": ["kept"]}))
    with pytest.raises(TraceError):
        session.analyze_and_save(run, AnalysisOptions.load(()))
    assert json.loads(run.report_path.read_text())["warnings"] == ["kept"]


# --- 5. a quote or a backslash in the run directory's path -------------------------------------------


@pytest.mark.parametrize("folder", ['we"ird', "back\\slash"])
def test_a_quote_or_backslash_in_the_run_directory_keeps_the_trace_valid(tmp_path: Path, folder: str) -> None:
    from diagnose.analysis.trace.timeline import load_timeline
    from diagnose.progress import Progress
    from diagnose.record import WindowPlan
    from diagnose.rundir import RunDir
    from diagnose.runtime import capture

    class KinetoLike:
        """Writes the path into the trace unescaped, as Kineto does."""

        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text('{"traceName": "' + path + '", "traceEvents": ' + json.dumps(STEPS) + "}")

    run = RunDir.create(tmp_path / folder)
    session = capture.CaptureSession(WindowPlan(), run, Progress(enabled=False), window=None)  # type: ignore[arg-type]
    session._save_trace(KinetoLike())
    (trace,) = run.traces()
    assert session.trace_files == [trace.name] and len(load_timeline(trace).steps) == 2
    assert sorted(p.name for p in run.path.iterdir()) == [trace.name]


# --- issue 38, 4. a duplicated trace: the profiler's cost is charged once per event ------------------


def test_every_event_duplicated_gives_the_same_corrected_shares_and_findings(tmp_path: Path) -> None:
    import gzip

    from diagnose.analysis.pipeline import AnalysisOptions, analyze_trace
    from tests.conftest import DATA

    (source,) = (DATA / "launch_bound").glob("*.pt.trace.json.gz")
    trace = json.loads(gzip.decompress(source.read_bytes()))
    (tmp_path / "once.json").write_text(json.dumps(trace))
    (tmp_path / "twice.json").write_text(json.dumps({**trace, "traceEvents": trace["traceEvents"] * 2}))
    once, twice = (analyze_trace(tmp_path / name, AnalysisOptions.load()) for name in ("once.json", "twice.json"))
    assert once.breakdown["window"]["profiler_inflation"] == twice.breakdown["window"]["profiler_inflation"]
    assert {k: v["value"] for k, v in twice.symptoms.items()} == {k: v["value"] for k, v in once.symptoms.items()}
    assert [f["rule"] for f in twice.findings] == [f["rule"] for f in once.findings]


# --- issue 38, 16. characters that reorder or break lines are written out too -------------------------


@pytest.mark.parametrize(
    "hostile", ["\u202ereversed", "line\u2028break", "para\u2029graph", "iso\u2066late\u2069", "mark\u200f"]
)
def test_bidi_overrides_and_line_separators_never_reach_the_terminal(tmp_path: Path, hostile: str) -> None:
    from diagnose.renderers import TerminalRenderer

    events = [*STEPS, {"ph": "X", "cat": hostile, "name": "x", "pid": 1, "tid": 1, "ts": 10, "dur": 5}]
    text = TerminalRenderer(color=False).render(_analyse(tmp_path, events))
    shown = "".join(f"\\u{ord(c):04x}" if ord(c) > 0x2000 or ord(c) == 0x200F else c for c in hostile)
    assert shown in text, text
    assert not any(c in text for c in "\u202e\u2028\u2029\u2066\u2069\u200f")


# --- issue 38, 5, 6, 15. JSON nested too deep, bytes that are not UTF-8, negative durations -----------


def test_json_nested_too_deep_inside_an_event_is_one_line(tmp_path: Path) -> None:
    from tests.test_failures import diagnose, error_line

    deep = {"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, "ts": 20, "dur": 5, "args": {}}
    text = json.dumps({"traceEvents": [deep, *STEPS]}).replace(
        '"args": {}', '"args": {"deep": ' + "[" * 1200 + "]" * 1200 + "}", 1
    )
    (tmp_path / "t.json").write_text(text)
    proc = diagnose("analyze", "t.json", cwd=tmp_path)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "t.json nests JSON too deep" in error_line(proc)
    from diagnose import api
    from diagnose.errors import TraceError

    with pytest.raises(
        TraceError, match="nests JSON too deep"
    ):  # the API raises it as the one-line error, not RecursionError
        api.analyze(tmp_path / "t.json")


def test_a_name_that_is_not_utf8_is_read_with_a_replacement_character(tmp_path: Path) -> None:
    kernel = [*KERNEL_STEP[:1], {**KERNEL_STEP[1], "name": "gemm_@@"}]
    (tmp_path / "t.json").write_bytes(json.dumps({"traceEvents": kernel}).encode().replace(b"@@", b"\xff\xfe"))
    from tests.test_failures import diagnose

    proc = diagnose("analyze", "--json", "t.json", cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["breakdown"]["steps"][0]["kernels"] == 1
    proc = diagnose("compare", "t.json", "t.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(("index", "what"), [(1, "kernel 'k'"), (0, "user_annotation 'ProfilerStep#1'")])
def test_a_negative_duration_is_a_malformed_trace(tmp_path: Path, index: int, what: str) -> None:
    from tests.test_failures import diagnose, error_line

    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": _with(index, dur=-26)}))
    proc = diagnose("analyze", "t.json", cwd=tmp_path)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"event {index} ({what}) has dur -26, not a duration (0 or more)" in error_line(proc)


# --- issue 38, 7. a gzip bomb is refused before it is read, or as soon as it shows -----------------------


def _gzip_bomb(path: Path, whitespace_mb: int, trailer: int | None = None) -> Path:
    """A gzip of ``whitespace_mb`` MB of whitespace inside an events array (about 1,000 times
    smaller); ``trailer``: the length its trailer records instead of the true one (a lie)."""
    import gzip
    import struct

    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(b'{"traceEvents": [')
        for _ in range(whitespace_mb):
            out.write(b" " * (1 << 20))
        out.write(b"]}")
    if trailer is not None:
        raw = path.read_bytes()
        path.write_bytes(raw[:-4] + struct.pack("<I", trailer))
    return path


def test_a_gzip_that_inflates_like_no_trace_is_refused_before_it_is_read(tmp_path: Path) -> None:
    import gzip

    from diagnose.analysis.trace import tracefile
    from diagnose.analysis.trace.timeline import load_timeline
    from diagnose.errors import TraceError
    from tests.test_failures import diagnose, error_line
    from tests.tracebuilder import one_gpu_step

    _gzip_bomb(tmp_path / "bomb.json.gz", 50)
    proc = diagnose("analyze", "bomb.json.gz", cwd=tmp_path, timeout=60)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "bomb.json.gz inflates over 100 times its compressed size (0." in error_line(proc)
    # refused by the check before the read (which a damaged trailer alone does not fail: the
    # read names the damage), after inflating 16 MB or so of its 50
    bomb = tmp_path / "bomb.json.gz"
    with pytest.raises(
        TraceError, match=r"inflates over 100 times its compressed size \(0\.\d MB to (1[6-9]|2\d) MB so far\)"
    ):
        tracefile.check_size(bomb, tracefile.json_size_estimate(bomb))
    trace = gzip.compress(json.dumps(one_gpu_step().to_dict()).encode())
    damaged = tmp_path / "damaged.json.gz"  # a trace whose trailer says 2 GB: damaged, no bomb
    damaged.write_bytes(trace[:-4] + (2**31 - 1).to_bytes(4, "little"))
    assert tracefile.json_size_estimate(damaged) > 100 * len(trace)
    tracefile.check_size(damaged, tracefile.json_size_estimate(damaged))
    with pytest.raises(TraceError, match="cannot read"):
        load_timeline(damaged)


def test_a_gzip_bomb_whose_trailer_lies_is_refused_once_16_MB_are_inflated(tmp_path: Path) -> None:
    from diagnose.analysis.trace import tracefile
    from diagnose.analysis.trace.timeline import load_timeline
    from diagnose.errors import TraceError
    from tests.test_failures import diagnose, error_line

    bomb = _gzip_bomb(tmp_path / "bomb.json.gz", 50, trailer=1000)
    proc = diagnose("analyze", "bomb.json.gz", cwd=tmp_path, timeout=60)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "bomb.json.gz inflates over 100 times its compressed size" in error_line(proc) and "so far" in error_line(
        proc
    )
    stream = tracefile.TraceStream(bomb)
    with pytest.raises(TraceError, match="inflates over 100 times"):
        for _ in stream.decoded(tracefile.decode_objects):
            pass
    # stopped where the ratio showed, not at the end of the 50 MB (the input is read 256 KB at a time)
    assert (
        stream.bytes_read
        <= max(tracefile.RATIO_AFTER_BYTES, 100 * bomb.stat().st_size) + tracefile.BLOCK_BYTES
        < 50 << 20
    )
    with pytest.raises(TraceError, match="inflates over 100 times"):
        load_timeline(bomb)


def test_the_size_limit_given_holds_while_a_gzip_inflates(tmp_path: Path) -> None:
    """A gzip trailer records the length modulo 4 GiB, or a lie: --max-trace-gb is kept while
    the trace inflates, not only by what the trailer says."""
    from tests.test_failures import diagnose, error_line

    _gzip_bomb(tmp_path / "bomb.json.gz", 12, trailer=1000)  # under the ratio's 16 MB: only the limit stops it
    proc = diagnose("analyze", "bomb.json.gz", "--max-trace-gb", "0.005", cwd=tmp_path, timeout=60)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "bomb.json.gz inflates to more than 0.00" in error_line(
        proc
    ) and " GB, over the 0.005 GB limit given" in error_line(proc)


@pytest.mark.parametrize(("value", "said"), [("1", False), ("0", True), (None, True)])
def test_cupti_left_attached_after_a_cuda_window_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None, said: bool
) -> None:
    """TEARDOWN_CUPTI other than "1" after a window with CUDA activity (torch sets "0" for its
    CUDA graphs): the steps after the window pay for CUPTI's callbacks, and the report says so."""
    from diagnose.progress import Progress
    from diagnose.record import WindowPlan
    from diagnose.rundir import RunDir
    from diagnose.runtime import capture

    if value is None:
        monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    else:
        monkeypatch.setenv("TEARDOWN_CUPTI", value)
    session = capture.CaptureSession(WindowPlan(), RunDir(tmp_path), Progress(enabled=False), window=None)  # type: ignore[arg-type]
    session._cuda = True
    session._note_cupti_attached()
    assert any("CUPTI stayed attached" in n for n in session.notes) is said
    session = capture.CaptureSession(WindowPlan(), RunDir(tmp_path), Progress(enabled=False), window=None)  # type: ignore[arg-type]
    session._note_cupti_attached()  # a CPU window: no CUPTI
    assert session.notes == []
