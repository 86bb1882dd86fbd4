"""Faults of issue 38, tried as an attacker would: a crash, a fork, an exec, a full disk, a
file-size limit, a memory limit, signals at each stage, concurrent runs and read-only places.
Each end-to-end case runs ``diagnose`` in a child bounded in time, then checks that no process
of the run is left and no temporary file remains (``leftovers``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

# --- 12. the handlers an in-process run installs are all put back ----------------------------------


def test_an_in_process_run_puts_back_sig_dfl_for_sigterm(tmp_path: Path) -> None:
    """``SignalHold`` took SIG_DFL (0, falsy) for "no handler" and kept diagnose's own SIGTERM
    handler installed: children forked later ignored SIGTERM (the suite hung 8 minutes)."""
    from diagnose.signals import SignalHold

    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:

        def ours(signum: int, frame: object) -> None:
            raise AssertionError("diagnose's handler")

        signal.signal(signal.SIGTERM, ours)  # the runner's own, temporary
        hold = SignalHold()
        hold.hold({"SIGTERM": signal.SIG_DFL})
        hold.release()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


# --- the harness: a run in its own session, bounded, then nothing of it may be left ---------------

FAST = ["--warmup", "2", "--steps", "3", "--max-steps", "3", "--timed-steps", "3", "--quiet"]

#: a small training loop; ``# STEP`` is where each case injects its fault (``n`` counts steps)
LOOP = """
import os, sys, time, torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
for n in range(1, 400):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    # STEP
"""


def loop_with(fault: str) -> str:
    """LOOP with ``fault`` (indented lines) run after each optimizer step."""
    body = "\n".join("    " + line for line in fault.strip("\n").splitlines())
    return LOOP.replace("    # STEP", body)


def run_processes(sid: int, folder: Path) -> list[int]:
    """The processes of the run still alive (zombies are gone for our purpose): those of session
    ``sid``, and those working in ``folder`` (a process in a session of its own: verify's runs
    and what their scripts start)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, session
        if fields[0] != "Z" and (int(fields[3]) == sid or cwd == str(folder) or cwd.startswith(f"{folder}/")):
            found.append(int(entry.name))
    return found


TEMPORARY = ("*.tmp", "*.partial*", ".diagnose-write-test-*", "*.tmp.*")


def leftovers(folder: Path, sid: int, wait_s: float = 10.0) -> tuple[list[int], list[str]]:
    """The run's processes still alive after ``wait_s`` (then killed), and temporary files."""
    deadline = time.monotonic() + wait_s
    alive = run_processes(sid, folder)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = run_processes(sid, folder)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    temporary = sorted({str(p.relative_to(folder)) for pattern in TEMPORARY for p in folder.rglob(pattern)})
    return alive, temporary


class Run:
    """``python -m diagnose ARGS`` in ``cwd``, in a session of its own (its processes are found
    by session id afterwards); stdout and stderr go to files, so a signal test can watch them."""

    def __init__(
        self, cwd: Path, *args: str, env: dict[str, str] | None = None, preexec: object = None, stdout: str = ".stdout"
    ) -> None:
        self.cwd = cwd
        self.out, self.err = open(cwd / stdout, "w+"), open(cwd / ".stderr", "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "diagnose", *args],
            cwd=cwd,
            stdout=self.out,
            stderr=self.err,
            start_new_session=True,
            env=dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **(env or {})),
            preexec_fn=preexec,  # type: ignore[arg-type]
        )

    def wait_for(self, path: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not (self.cwd / path).exists():
            assert self.proc.poll() is None, (
                f"diagnose ended ({self.proc.returncode}) before {path}: {self.stderr[-2000:]}"
            )
            assert time.monotonic() < deadline, f"no {path} after {timeout} s"
            time.sleep(0.02)

    def finish(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"diagnose did not end within {timeout} s: {self.stderr[-2000:]}") from None
        finally:
            alive, temporary = leftovers(self.cwd, self.proc.pid)
            assert not alive, f"processes of the run left: {alive}"
            assert not temporary, f"temporary files left: {temporary}"

    @property
    def stderr(self) -> str:
        self.err.flush()
        return (self.cwd / ".stderr").read_text(errors="replace")

    @property
    def stdout(self) -> str:
        self.out.flush()
        return (self.cwd / ".stdout").read_text(errors="replace")


def diagnose_run(
    cwd: Path, script: str, *options: str, timeout: float = 120, env: dict[str, str] | None = None
) -> tuple[int, Run]:
    """``diagnose run`` of ``script`` (written as train.py) into ``cwd/run``; its exit code."""
    (cwd / "train.py").write_text(script)
    run = Run(cwd, "run", *FAST, *options, "--out", "run", "train.py", env=env)
    return run.finish(timeout), run


def saved_states(run_dir: Path) -> tuple[str | None, str | None]:
    """The status in run.json and report.json (None where the file is missing)."""
    own = run_dir / "diagnose"
    record = json.loads((own / "run.json").read_text())["status"] if (own / "run.json").is_file() else None
    report = (
        json.loads((own / "report.json").read_text())["status"]["state"] if (own / "report.json").is_file() else None
    )
    return record, report


# --- 2. a child forked by the script never writes the run's files ---------------------------------


@pytest.mark.slow
def test_a_forked_child_that_exits_later_never_overwrites_the_report(tmp_path: Path) -> None:
    script = loop_with(
        """
if n == 3 and os.fork() == 0:  # the child waits until the parent's report is written, then exits
    open("child.pid", "w").write(str(os.getpid()))
    deadline = time.time() + 60
    while not os.path.exists("run/diagnose/report.json") and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    sys.exit(0)
"""
    )
    code, run = diagnose_run(tmp_path, script)  # finish() waits until the child is gone too
    assert code == 0, run.stderr[-3000:]
    assert saved_states(tmp_path / "run") == ("stopped", "stopped")
    assert "ran to its end" not in json.loads((tmp_path / "run/diagnose/report.json").read_text())["status"]["message"]


# --- places that cannot take the run: a full disk, a file-size limit, a read-only folder ----------


@pytest.fixture
def mounted(tmp_path: Path):  # a factory
    """``mounted(kind, size_kb)``: a folder under tmp_path that is a small tmpfs ("tmpfs"), or a
    read-only view of a folder ("ro", with ``source``). Skips where mounting is refused (not root)."""
    mounts: list[Path] = []

    def mount(kind: str, size_kb: int = 256, source: Path | None = None) -> Path:
        target = tmp_path / f"mnt{len(mounts)}"
        target.mkdir()
        if kind == "tmpfs":
            commands = [["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(target)]]
        else:
            commands = [["mount", "--bind", str(source), str(target)], ["mount", "-o", "remount,ro,bind", str(target)]]
        for command in commands:
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
            except OSError as exc:
                pytest.skip(f"cannot mount: {exc}")
            if done.returncode != 0:
                pytest.skip(f"cannot mount: {done.stderr.strip()}")
            if target not in mounts:
                mounts.append(target)
        return target

    yield mount
    for target in reversed(mounts):
        subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=30, check=False)


def fill(folder: Path, leave_kb: int) -> None:
    """Fill the file system of ``folder`` until ``leave_kb`` KB are free."""
    stat = os.statvfs(folder)
    free = stat.f_bavail * stat.f_frsize
    (folder / "filler").write_bytes(b"\0" * max(free - leave_kb * 1024, 0))


@pytest.mark.slow
@pytest.mark.parametrize("free_kb", [60, 4])
def test_a_full_disk_leaves_one_line_what_fits_and_no_temporary_file(tmp_path: Path, mounted, free_kb: int) -> None:
    disk = mounted("tmpfs", 256)
    fill(disk, free_kb)
    (tmp_path / "train.py").write_text(LOOP)
    run = Run(tmp_path, "run", *FAST, "--out", str(disk / "run"), "train.py")
    code = run.finish()
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    leftover = sorted(p.name for p in disk.rglob("*") if p.is_file() and p.name != "filler")
    assert not [name for name in leftover if name.endswith((".tmp", ".partial"))], leftover
    if free_kb == 60:  # the trace does not fit; the record and the report do, and say so
        assert code == 0, run.stderr[-3000:]
        assert saved_states(disk / "run") == ("stopped", "stopped")
        warnings = json.loads((disk / "run/diagnose/report.json").read_text())["warnings"]
        assert any(
            "the trace could not be written (torch.profiler wrote no trace: is the disk full" in w for w in warnings
        ), warnings
    else:  # nothing fits: one line that says so, exit 5
        assert code == 5, run.stderr[-3000:]
        (line,) = [x for x in run.stderr.splitlines() if x.startswith("diagnose: error:")]
        assert "No space left on device" in line and "hint: the disk is full" in run.stderr


@pytest.mark.slow
def test_a_file_size_limit_keeps_the_record_and_blames_the_limit(tmp_path: Path) -> None:
    import resource

    def limit() -> None:  # ulimit -f 40: the trace cannot be written, the record and report can
        resource.setrlimit(resource.RLIMIT_FSIZE, (40 * 1024, 40 * 1024))

    (tmp_path / "train.py").write_text(LOOP)
    run = Run(tmp_path, "run", *FAST, "--out", "run", "train.py", preexec=limit)
    assert run.finish() == 0, run.stderr[-3000:]
    warnings = json.loads((tmp_path / "run/diagnose/report.json").read_text())["warnings"]
    assert not any("FileNotFoundError" in w for w in warnings) and any("file-size limit" in w for w in warnings), (
        warnings
    )
    assert saved_states(tmp_path / "run") == ("stopped", "stopped")


@pytest.mark.slow
def test_a_newline_in_the_run_directory_keeps_the_trace(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(LOOP)
    run = Run(tmp_path, "run", *FAST, "--out", "new\nline", "train.py")
    assert run.finish() == 0, run.stderr[-3000:]
    record = json.loads((tmp_path / "new\nline" / "diagnose" / "run.json").read_text())
    assert record["trace_files"] and (tmp_path / "new\nline" / record["trace_files"][0]).is_file()
    report = json.loads((tmp_path / "new\nline" / "diagnose" / "report.json").read_text())
    assert report["breakdown"]["steps"], report["warnings"]


def _trace(folder: Path) -> Path:
    from tests.test_faults import STEPS

    path = folder / "t.json"
    path.write_text(json.dumps({"traceEvents": STEPS}))
    return path


def test_analyze_of_a_read_only_run_directory_shows_the_report_and_says_it_was_not_saved(
    tmp_path: Path, mounted
) -> None:
    source = tmp_path / "run"
    source.mkdir()
    (source / "run.json").write_text('{"trace_files": ["h_1.1.pt.trace.json"], "status": "stopped"}')
    _trace(source).rename(source / "h_1.1.pt.trace.json")
    view = mounted("ro", source=source)
    run = Run(tmp_path, "analyze", "--json", str(view))
    assert run.finish(60) == 5, run.stderr
    assert json.loads(run.stdout)["breakdown"]["steps"]  # shown all the same
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("diagnose: error:")]
    assert (
        line.startswith("diagnose: error: the report above could not be saved: cannot write")
        and "Read-only file system" in line
    )


def test_analyze_html_onto_a_full_disk_leaves_no_temporary_file(tmp_path: Path, mounted) -> None:
    disk = mounted("tmpfs", 64)
    fill(disk, 4)
    _trace(tmp_path)
    run = Run(tmp_path, "analyze", "--html", "-o", str(disk / "out"), "t.json")
    assert run.finish(60) == 5, run.stderr
    assert "Traceback" not in run.stderr and "No space left on device" in run.stderr
    assert sorted(p.name for p in (disk / "out").rglob("*") if p.is_file()) == []


# --- 1, 17. the script's process dies without a word, replaces itself, or will not end ------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "code", "died_of"),
    [
        ("import ctypes; ctypes.string_at(0)", 128 + signal.SIGSEGV, "died of SIGSEGV (segmentation fault)"),
        ("import ctypes; ctypes.CDLL(None).exit(7)", 7, "ended with code 7 without returning to diagnose"),
    ],
)
def test_a_process_that_dies_without_a_word_still_leaves_what_was_measured(
    tmp_path: Path, fault: str, code: int, died_of: str
) -> None:
    code_seen, run = diagnose_run(tmp_path, loop_with(f"import signal\nif n == 7:\n    {fault}"))
    assert code_seen == code, run.stderr[-3000:]
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("diagnose: error:")]
    assert line.startswith(f"diagnose: error: the script's process {died_of}") and line.endswith(
        "what was measured until then is in the report"
    )
    record = json.loads((tmp_path / "run/diagnose/run.json").read_text())
    report = json.loads((tmp_path / "run/diagnose/report.json").read_text())
    assert record["status"] == report["status"]["state"] == "crashed" and died_of in report["status"]["message"]
    assert record["trace_files"] and report["breakdown"]["steps"], "the profiled window (steps 3-5) is kept"


@pytest.mark.slow
def test_a_segfault_inside_the_profiled_window_keeps_the_steps_and_says_how_to_get_a_report(tmp_path: Path) -> None:
    """The window's trace lives in the script's process until the window ends (torch.profiler
    writes it then): a segfault inside the window loses it. What survives: the record, the
    steps' times up to the crash (noted in memory shared with the supervising parent), the step
    it died in, and a window that ends before it, which the report names and which then works."""
    import re

    code, run = diagnose_run(tmp_path, loop_with("import ctypes\nif n == 4:\n    ctypes.string_at(0)"), "--no-rerun")
    assert code == 128 + signal.SIGSEGV, run.stderr[-3000:]
    record = json.loads((tmp_path / "run/diagnose/run.json").read_text())
    report = json.loads((tmp_path / "run/diagnose/report.json").read_text())
    assert record["status"] == report["status"]["state"] == "crashed" and record["trace_files"] == []
    assert len(record["boundaries_s"]) == 5 and record["step_mode"] == "optimizer"  # steps 0-3 ended, step 4 begun
    assert report["status"]["message"].endswith("after 4 steps; 0 of the 3 planned steps were profiled")
    (lost,) = [w for w in report["warnings"] if "died during step" in w]
    assert lost.startswith(
        "the script's process died during step 4, inside the profiled window (steps 2-4): torch.profiler holds"
    )
    assert "no trace was written: the script ended before the profiled window" not in report["warnings"]
    assert not any(w.startswith("no trace was written") for w in report["warnings"])
    suggested = re.search(r"diagnose run (--warmup \d+ --steps \d+ --max-steps \d+) \.\.\.", lost)
    assert suggested is not None and suggested.group(1) == "--warmup 2 --steps 2 --max-steps 2", lost
    again = Run(
        tmp_path, "run", *suggested.group(1).split(), "--timed-steps", "3", "--quiet", "--out", "run2", "train.py"
    )
    assert again.finish(120) == 128 + signal.SIGSEGV, again.stderr[-3000:]
    record = json.loads((tmp_path / "run2/diagnose/run.json").read_text())
    report = json.loads((tmp_path / "run2/diagnose/report.json").read_text())
    assert record["trace_files"] and record["profiled_steps"] == 2 and len(report["breakdown"]["steps"]) == 2


@pytest.mark.slow
def test_a_segfault_inside_the_profiled_window_runs_the_script_again_with_a_window_before_it(tmp_path: Path) -> None:
    """What the profiler held in the dead process is gone; what the user wants is the report of
    the steps before the crash. diagnose runs the script once more, supervised the same way,
    its window ending before the step it died in, and the report says so first. The crash comes
    again after that window (the exit code says it); the window's trace is written by then."""
    code, run = diagnose_run(tmp_path, loop_with("import ctypes\nif n == 4:\n    ctypes.string_at(0)"))
    assert code == 128 + signal.SIGSEGV, run.stderr[-3000:]
    assert (
        "diagnose ▸ the script's process died of SIGSEGV (segmentation fault) during step 4, inside the profiled "
        "window: running it again, profiling steps 2-3 (--no-rerun: not again)"
    ) in run.stderr
    record = json.loads((tmp_path / "run/diagnose/run.json").read_text())
    report = json.loads((tmp_path / "run/diagnose/report.json").read_text())
    assert record["trace_files"] and record["profiled_steps"] == 2 and len(report["breakdown"]["steps"]) == 2
    assert record["environment"]["cpu_count"] >= 1  # noted with the trace: the report names the machine
    assert report["warnings"][0] == (
        "in a first run the script's process died of SIGSEGV (segmentation fault) during step 4, inside its "
        "profiled window (steps 2-4), and the window's trace with it: this report is of a second run, which "
        "profiled steps 2-3 (a window that ends before step 4)"
    )
    assert sum("running it again" in line for line in run.stderr.splitlines()) == 1  # once, never a third run


def test_what_a_crash_in_the_window_loses_is_said_with_a_window_before_it() -> None:
    from diagnose.supervise import Steps

    def words(step: int, warmup: int, window_end: int) -> str:
        return Steps([0.0] * (step + 1), warmup, window_end, True, "optimizer").window_lost()

    assert "during step 7, inside the profiled window (steps 5-9)" in words(
        7, 5, 10
    ) and "--warmup 5 --steps 2 --max-steps 2" in words(7, 5, 10)
    assert "during step 10, while the trace of the profiled window (steps 5-9) was being written" in words(10, 5, 10)
    assert "--warmup 5 --steps 4 --max-steps 4" in words(
        10, 5, 10
    )  # a window as long would be written at step 10 again
    assert (
        "with fewer warm-up steps, where the script allows it: diagnose run --warmup 4 --steps 1 --max-steps 1"
        in words(5, 5, 10)
    )
    assert "Step 1 comes too soon for a window before it" in words(1, 1, 4)
    assert not Steps([0.0] * 3, 5, 10, True, None).in_window and not Steps([0.0] * 7, 5, 10, False, None).in_window


def test_the_steps_a_supervised_child_notes_are_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import mmap

    from diagnose import supervise

    block = mmap.mmap(-1, supervise._HEAD.size + 8 * supervise.NOTED_STEPS)
    assert supervise._read_steps(block) is None  # nothing noted: no step began
    monkeypatch.setattr(supervise, "_steps_block", block)
    monkeypatch.setattr(supervise, "_child_pid", os.getpid() + 1)  # a process the child forked notes nothing
    supervise.note_step(0, 1.5, 2, 5, True, "forward")
    assert supervise._read_steps(block) is None
    monkeypatch.setattr(supervise, "_child_pid", os.getpid())
    for k, at in enumerate([1.5, 2.5, 4.0]):
        supervise.note_step(k, at, 2, 5, k > 0, "optimizer")
    assert supervise._read_steps(block) == supervise.Steps([1.5, 2.5, 4.0], 2, 5, True, "optimizer")
    supervise.note_step(0, 9.0, 3, 6, False, None)  # a new count (a stronger step signal) starts again
    assert supervise._read_steps(block) == supervise.Steps([9.0], 3, 6, False, None)
    supervise.note_step(supervise.NOTED_STEPS, 9.0, 3, 6, False, None)  # past the block: not noted
    assert supervise._read_steps(block) == supervise.Steps([9.0], 3, 6, False, None)


@pytest.mark.slow
def test_an_exec_in_the_script_saves_the_report_first(tmp_path: Path) -> None:
    code, run = diagnose_run(tmp_path, loop_with("if n == 7:\n    os.execv('/bin/sh', ['sh', '-c', 'exit 3'])"))
    assert code == 3, run.stderr[-3000:]
    assert "diagnose: the script replaced its process (os.execv /bin/sh)" in run.stderr
    assert saved_states(tmp_path / "run") == ("completed", "completed")
    assert json.loads((tmp_path / "run/diagnose/report.json").read_text())["breakdown"]["steps"]


@pytest.mark.slow
def test_a_thread_the_script_leaves_running_does_not_keep_diagnose(tmp_path: Path) -> None:
    code, run = diagnose_run(
        tmp_path,
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), name='forever').start()\n" + LOOP,
    )
    assert code == 0, run.stderr[-3000:]
    assert "the script left 1 thread(s) running (forever)" in run.stderr
    assert saved_states(tmp_path / "run") == ("stopped", "stopped")


@pytest.mark.slow
def test_a_deadlocked_fork_child_dies_of_sigterm_as_without_diagnose(tmp_path: Path) -> None:
    script = loop_with(
        """
if n == 3:
    pid = os.fork()
    if pid == 0:  # stuck in C: a lock taken twice (no Python handler runs until it returns)
        import _thread
        lock = _thread.allocate_lock(); lock.acquire()
        open("child.pid", "w").write(str(os.getpid()))
        lock.acquire()
    _, status = os.waitpid(pid, 0)
    open("child.status", "w").write(str(os.waitstatus_to_exitcode(status)))
"""
    )
    (tmp_path / "train.py").write_text(script)
    run = Run(tmp_path, "run", *FAST, "--out", "run", "train.py")
    run.wait_for("child.pid")
    time.sleep(0.2)
    os.kill(int((tmp_path / "child.pid").read_text()), signal.SIGTERM)
    assert run.finish() == 0, run.stderr[-3000:]
    assert (tmp_path / "child.status").read_text() == str(-signal.SIGTERM)


# --- 8, 19. signals at each stage: before the script, in the window, while the report is saved -----


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code", "words"), [(signal.SIGHUP, 129, "terminated (SIGHUP)")]
)  # SIGINT, SIGTERM: test_failures
def test_a_signal_in_the_window_keeps_the_report(tmp_path: Path, sig: int, code: int, words: str) -> None:
    (tmp_path / "train.py").write_text(loop_with("if n == 4:\n    open('in_window', 'w').close()\n    time.sleep(30)"))
    run = Run(tmp_path, "run", *FAST, "--out", "run", "train.py")
    run.wait_for("in_window")
    time.sleep(0.2)
    run.proc.send_signal(sig)
    assert run.finish() == code, run.stderr[-3000:]
    assert f"diagnose: {words}: what was measured until then is in the report" in run.stderr
    state = "interrupted" if sig == signal.SIGINT else "terminated"
    assert saved_states(tmp_path / "run") == (state, state)


@pytest.mark.slow
def test_sigterm_before_the_script_starts_says_so_and_leaves_a_report(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(LOOP)
    run = Run(tmp_path, "run", *FAST, "--out", "run", "train.py")
    run.wait_for("run")  # the run directory is made before torch is imported (seconds)
    time.sleep(0.1)
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 143, run.stderr[-3000:]
    assert "diagnose: terminated (SIGTERM): what was measured until then is in the report" in run.stderr
    assert saved_states(tmp_path / "run") == ("terminated", "terminated")


#: where a signal for "diagnose" goes from inside the script: the supervising parent when there
#: is one, else this very process (never the test runner that started diagnose)
DIAGNOSE_PID = """
def diagnose_pid():
    ppid = os.getppid()
    try:
        supervised = b"diagnose" in open(f"/proc/{ppid}/cmdline", "rb").read()
    except OSError:
        supervised = False
    return ppid if supervised else os.getpid()
"""

#: the script's last act: a thread that signals diagnose once the run's record is final (the
#: script has ended; the analysis and the report follow), as a user's Ctrl-C would then
SIGNAL_WHILE_SAVING = (
    DIAGNOSE_PID
    + """
import json, threading
def signal_when_recorded(sig=SIG):
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if json.load(open("run/diagnose/run.json"))["status"] != "crashed":
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.005)
    os.kill(diagnose_pid(), sig)  # the supervising diagnose passes it on
threading.Thread(target=signal_when_recorded, daemon=True).start()
"""
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGTERM, 143)]
)  # SIGINT: test_a_ctrl_c_after_the_report_is_written_exits_130
def test_a_signal_while_the_report_is_saved_keeps_it_and_says_so_in_the_exit_code(
    tmp_path: Path, sig: int, code: int
) -> None:
    script = LOOP.replace("for n in range(1, 400):", "for n in range(1, 16):") + SIGNAL_WHILE_SAVING.replace(
        "SIG", str(int(sig))
    )
    code_seen, run = diagnose_run(tmp_path, script, "--no-stop")
    assert code_seen == code, run.stderr[-3000:]
    assert saved_states(tmp_path / "run") == ("completed", "completed")
    assert "the report was saved first" in run.stderr or "as diagnose was exiting: its work was done" in run.stderr, (
        run.stderr[-2000:]
    )


# --- 14. a binary file as the script ----------------------------------------------------------------


@pytest.mark.parametrize(
    "content", [b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4, b"\x89PNG\r\n\x1a\n\xff\xfe\xfa" * 50]
)
def test_a_binary_file_as_the_script_is_said_to_be_binary(tmp_path: Path, content: bytes) -> None:
    from diagnose.errors import UsageError
    from diagnose.runtime.runner import resolve_target

    (tmp_path / "prog").write_bytes(content)
    with pytest.raises(UsageError) as raised:
        resolve_target(str(tmp_path / "prog"), None, [])
    assert raised.value.message == f"{tmp_path / 'prog'} is not a Python source file (it holds binary data, not text)"
    assert "line None" not in raised.value.message


def test_latin1_source_with_its_coding_line_is_still_python(tmp_path: Path) -> None:
    from diagnose.runtime.runner import resolve_target

    (tmp_path / "old.py").write_bytes(b"# -*- coding: latin-1 -*-\nname = '\xe9t\xe9'\n")
    assert resolve_target(str(tmp_path / "old.py"), None, []).kind == "script"


# --- 10. two runs into one new --out at once ---------------------------------------------------------


def test_a_run_directory_another_process_holds_is_refused(tmp_path: Path) -> None:
    from diagnose.rundir import RunDir

    RunDir.create_for("train", tmp_path / "out")  # this process holds it now
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from diagnose.errors import OutputError\n"
        "from diagnose.rundir import RunDir\n"
        "try:\n"
        f"    RunDir.create_for('train', Path({str(tmp_path / 'out')!r}), overwrite=True)\n"
        "except OutputError as exc:\n"
        "    print(exc.exit_code, exc.message)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == f"5 another diagnose run is writing into {tmp_path / 'out'}", done.stderr


@pytest.mark.slow
def test_two_runs_into_one_new_out_at_once_never_both_succeed(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(LOOP)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    runs = [
        Run(tmp_path / name, "run", *FAST, "--out", str(tmp_path / "shared"), str(tmp_path / "train.py"))
        for name in ("a", "b")
    ]
    codes = sorted(run.finish() for run in runs)
    assert codes == [0, 5], [run.stderr[-1500:] for run in runs]
    loser = next(run for run in runs if run.proc.returncode == 5)
    assert "another diagnose run is writing into" in loser.stderr or "already exists and is not empty" in loser.stderr
    assert saved_states(tmp_path / "shared") == ("stopped", "stopped")


# --- 11. verify --timeout stops a run politely, with what its script started -------------------------


@pytest.mark.slow
def test_verify_timeout_stops_the_run_politely_and_everything_it_started(tmp_path: Path) -> None:
    script = "import subprocess\nsubprocess.Popen(['sleep', '600'])\n" + loop_with("if n == 4:\n    time.sleep(600)")
    (tmp_path / "train.py").write_text(script)
    run = Run(
        tmp_path,
        "verify",
        "--repeats",
        "1",
        "--top",
        "1",
        "--warmup",
        "2",
        "--steps",
        "3",
        "--timed-steps",
        "3",
        "--timeout",
        "12",
        "--out",
        "v",
        "train.py",
    )
    assert run.finish(150) == 1, run.stderr[-3000:]  # finish(): no sleep 600 left, in any session
    assert "timed out after 12 s" in run.stderr, run.stderr[-3000:]
    (baseline,) = [p for p in (tmp_path / "v").iterdir() if p.is_dir()]
    assert saved_states(baseline) == ("terminated", "terminated")


# --- 23. nested diagnose.profile blocks ----------------------------------------------------------------


@pytest.mark.parametrize("stop", [True])
def test_a_nested_profile_block_runs_unprofiled_and_the_outer_one_measures(tmp_path: Path, stop: bool) -> None:
    import torch

    import diagnose

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train(k: int) -> None:
        for _ in range(k):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()

    with diagnose.profile(out=tmp_path / "outer", warmup=1, steps=3, timed_steps=3, stop=stop) as outer:
        train(1)
        with (
            pytest.warns(RuntimeWarning, match="diagnose.profile inside a run diagnose is already profiling"),
            diagnose.profile(out=tmp_path / "inner", warmup=1, steps=2, stop=stop) as inner,
        ):
            train(20)
        train(20)
    assert outer.record is not None and outer.record.status == ("stopped" if stop else "completed")
    assert outer.report is not None and outer.report.breakdown["steps"]
    assert inner.report is None and inner.run_dir == tmp_path / "outer" and not (tmp_path / "inner").exists()


# --- 20. values no run could use are refused before anything runs ----------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["run", "--set", "batch_size=99999999999999999999", "train.py"],
            "knob batch_size takes at most 2,147,483,647, not 99999999999999999999",
        ),
        (["analyze", "--max-trace-gb", "nan", "t.json"], "--max-trace-gb takes a size in GB above 0, not nan"),
        (["analyze", "--max-trace-gb", "inf", "t.json"], "--max-trace-gb takes a size in GB above 0, not inf"),
        (["analyze", "--max-trace-gb", "-1", "t.json"], "--max-trace-gb takes a size in GB above 0, not -1.0"),
        (["verify", "--set", "nosuch=1", "train.py"], "unknown knob 'nosuch'"),
        (["sweep", "--set", "num_workers=0,1", "--with", "nosuch=1", "train.py"], "unknown knob 'nosuch'"),
    ],
)
def test_values_no_run_could_use_are_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "train.py").write_text(LOOP)
    _trace(tmp_path)
    run = Run(tmp_path, *args)
    assert run.finish(60) == 2, run.stderr
    assert run.stderr.splitlines()[0] == f"diagnose: error: {message}", run.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started


# --- 18. the script closes stdout; stdout is a full device ----------------------------------------------


@pytest.mark.slow
def test_a_script_that_closes_stdout_still_gets_its_report_shown(tmp_path: Path) -> None:
    code, run = diagnose_run(tmp_path, loop_with("if n == 4:\n    sys.stdout.close()"))
    assert code == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    # the whole report on the reopened stdout: its header, its status and its verdict (whichever
    # rule fires on a loaded machine, the verdict line is there)
    assert "run directory:" in run.stderr and run.stdout.startswith("diagnose train.py") and "\nstatus: " in run.stdout
    assert "Findings, ranked" in run.stdout or "largest part of a step" in run.stdout


@pytest.mark.slow
def test_a_report_to_a_full_device_is_one_line_and_kept(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(LOOP)
    run = Run(tmp_path, "run", *FAST, "--out", "run", "train.py", stdout="/dev/full")
    assert run.finish() == 5, run.stderr[-3000:]
    assert (
        "Traceback" not in run.stderr
        and "diagnose: error: cannot write the report to stdout (No space left on device)" in run.stderr
    )
    assert saved_states(tmp_path / "run") == ("stopped", "stopped")


# --- 9. memory runs out after the report is saved, or anywhere in a command ---------------------------

#: ``diagnose ARGS`` in a child whose terminal renderer runs out of memory (as it did at the end
#: of a run that nearly exhausted the machine), or its trace reader, or the rendering of its
#: HTML page or TensorBoard events (report.json is saved by then)
OUT_OF_MEMORY = """
import sys
from diagnose.renderers import html, tensorboard, terminal
from diagnose.analysis.trace import timeline
def out_of_memory(*args, **kwargs):
    raise MemoryError()
if WHERE == "render":
    terminal.TerminalRenderer.render = out_of_memory
elif WHERE == "html":
    html.HTMLRenderer.render = out_of_memory
elif WHERE == "events":
    tensorboard.write_events = out_of_memory
else:
    timeline.load_timeline = out_of_memory
    import diagnose.analysis.pipeline as pipeline
    pipeline.load_timeline = out_of_memory
sys.argv = ["diagnose", ARGS]
from diagnose.cli import main
main()
"""


@pytest.mark.slow
def test_memory_running_out_while_showing_a_saved_report_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(LOOP)
    args = ["run", *FAST, "--out", "run", "train.py"]
    (tmp_path / "driver.py").write_text(OUT_OF_MEMORY.replace("WHERE", "'render'").replace("ARGS", repr(args)[1:-1]))
    done = subprocess.run(
        [sys.executable, "driver.py"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 4 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "diagnose: error: memory ran out while showing the report" in done.stderr
    assert f"hint: it is saved: diagnose report {tmp_path / 'run'} shows it again" in done.stderr
    assert saved_states(tmp_path / "run") == ("stopped", "stopped")


def test_memory_running_out_in_analyze_is_one_line_exit_4(tmp_path: Path) -> None:
    _trace(tmp_path)
    (tmp_path / "driver.py").write_text(OUT_OF_MEMORY.replace("WHERE", "'read'").replace("ARGS", "'analyze', 't.json'"))
    done = subprocess.run(
        [sys.executable, "driver.py"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 4 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.splitlines()[0] == "diagnose: error: memory ran out"


def _recorded_run(folder: Path) -> Path:
    """A copy of a recorded run directory (run.json and its trace), as ``diagnose run`` left it."""
    import shutil

    run = folder / "run"
    source = REPO / "tests" / "data" / "data_bound"
    (run / "diagnose").mkdir(parents=True)
    shutil.copy(source / "run.json", run / "diagnose" / "run.json")
    for trace in source.glob("*.pt.trace.json.gz"):
        shutil.copy(trace, run / trace.name)
    return run


def _driver(folder: Path, template: str, where: str, *args: str) -> subprocess.CompletedProcess[str]:
    (folder / "driver.py").write_text(template.replace("WHERE", repr(where)).replace("ARGS", repr(list(args))[1:-1]))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "driver.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_memory_running_out_while_writing_report_html_keeps_report_json(tmp_path: Path) -> None:
    """Issue 38, 9: report.json saved, then the page's rendering ran out of memory: the error
    said memory ran out "while analysing the trace" (it had been analysed and saved)."""
    run = _recorded_run(tmp_path)
    done = _driver(tmp_path, OUT_OF_MEMORY, "html", "analyze", "--html", str(run))
    assert done.returncode == 4 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        f"diagnose: error: memory ran out while writing report.html; {run / 'diagnose' / 'report.json'} is saved",
        f"hint: diagnose report {run} --html writes it again where more memory is free",
    ]
    assert saved_states(run) == ("stopped", "stopped") and not (run / "report.html").exists()
    assert not list(run.glob("*.tmp")) and not list(run.glob(".*.tmp"))


def test_memory_running_out_while_writing_the_events_is_a_warning(tmp_path: Path) -> None:
    """The TensorBoard events are the run's extra: memory running out there is a warning, as a
    failed write is; report.json and report.html are written, the report shown, exit 0."""
    run = _recorded_run(tmp_path)
    done = _driver(tmp_path, OUT_OF_MEMORY, "events", "analyze", "--html", str(run))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "diagnose: warning: could not write TensorBoard events: memory ran out" in done.stderr
    assert saved_states(run) == ("stopped", "stopped") and (run / "report.html").is_file()
    assert done.stdout.startswith("diagnose ")


#: ``diagnose ARGS`` under an address-space limit set after diagnose's own imports, ``EXTRA``
#: bytes above what the process maps: what it still imports (typer's own modules, lazily) and
#: reads runs out, in Python (a MemoryError) or in the dynamic loader (an ImportError)
UNDER_A_LIMIT = """
import resource, sys
import numpy, msgspec  # before the limit: a BLAS allocation that fails aborts, it does not raise
import diagnose.cli
def mapped():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (mapped() + EXTRA, resource.getrlimit(resource.RLIMIT_AS)[1]))
sys.argv = ["diagnose", ARGS]
diagnose.cli.main()
"""


@pytest.mark.parametrize("extra_mb", [2, 4, 8])
def test_analyze_under_an_address_space_limit_is_one_line_exit_4(tmp_path: Path, extra_mb: int) -> None:
    """Issue 38, 9: ``analyze`` under a tight ``ulimit -v``: a traceback ending in "failed to map
    segment from shared object" (an import the limit broke) where docs/failures.md promises
    one line and exit 4."""
    trace = next((REPO / "tests" / "data" / "forloop_optimizer").glob("*.pt.trace.json.gz"))
    (tmp_path / "driver.py").write_text(
        UNDER_A_LIMIT.replace("EXTRA", str(extra_mb << 20)).replace("ARGS", repr(["analyze", str(trace)])[1:-1])
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "driver.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode in (0, 4) and "Traceback" not in done.stderr, done.stderr[-3000:]
    if done.returncode == 4:
        assert done.stderr.splitlines()[0] == "diagnose: error: memory ran out"


@pytest.mark.slow
def test_a_ctrl_c_after_the_report_is_written_exits_130(tmp_path: Path) -> None:
    """Issue 37, 15: a Ctrl-C while the process tears down (the script's atexit functions, the
    interpreter's own teardown) ended it by the signal itself: -2, not 130."""
    script = (
        "import atexit, os, signal, time\n"
        + DIAGNOSE_PID
        + "atexit.register(lambda: (os.kill(diagnose_pid(), signal.SIGINT), time.sleep(1)))\n"
        + LOOP
    )
    code, run = diagnose_run(tmp_path, script)
    assert code == 130, run.stderr[-3000:]
    assert saved_states(tmp_path / "run") == ("stopped", "stopped")
    assert "diagnose: interrupted (Ctrl-C) as diagnose was exiting: its work was done" in run.stderr, run.stderr[-2000:]


# --- the suite cannot hang: a test past its time fails ---------------------------------------------


def test_a_test_that_hangs_on_a_child_fails_at_its_timeout(tmp_path: Path) -> None:
    (tmp_path / "test_hang.py").write_text(
        "import os, subprocess, sys\n"
        "def test_waits_forever():\n"
        "    subprocess.run([sys.executable, '-c', 'import time; time.sleep(600)'], cwd=os.path.dirname(__file__))\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout=3",
            "--rootdir",
            str(REPO),
            "-c",
            str(REPO / "pyproject.toml"),
            str(tmp_path / "test_hang.py"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout[-2000:]
    assert "Timeout" in done.stdout and "1 failed" in done.stdout, done.stdout[-2000:]
    assert time.monotonic() - started < 60
    alive, _ = leftovers(tmp_path, -1, wait_s=5)
    assert not alive, "the sleeping child outlived its test"
