"""Bad input and faults, end to end through the CLI: a clear one-line error, the right exit
code, and a run directory whose run.json and report.json say what happened (docs/failures.md)."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.scripts import MLP_TRAIN

FAST = ["--warmup", "2", "--steps", "3", "--max-steps", "3", "--timed-steps", "3", "--quiet"]


def diagnose(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "diagnose", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_dir_of(tmp_path: Path) -> Path:
    (found,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    return found


def saved(run_dir: Path) -> tuple[dict, dict]:
    own = run_dir / "diagnose"
    return json.loads((own / "run.json").read_text()), json.loads((own / "report.json").read_text())


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("diagnose: error:")]
    return line


# --- 1. the target ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py"], "no such script: missing.py"),
        (["folder"], "folder is a folder, not a Python script"),
        (["weights.pt"], "is not"),
        (["-m", "no_such_pkg.train"], "no module named 'no_such_pkg.train'"),
    ],
)
def test_bad_targets(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "weights.pt").write_bytes(b"\x80\x02\x8a\x0alo\x00\x00garbage")
    proc = diagnose("run", *args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in error_line(proc)
    assert not (tmp_path / "runs").exists()  # a usage error leaves no run directory (issue 37)


# --- 2-5. the script fails, exits, is stopped, runs out of memory, ends early --------------------


@pytest.mark.slow
def test_exception_traceback_like_python_and_captured_steps_analysed(write_script, tmp_path: Path) -> None:
    write_script(
        MLP_TRAIN.replace("opt.step()", "opt.step()\n        if epoch == 1: raise ValueError('boom at epoch 1')")
    )
    proc = diagnose("run", *FAST, "train.py", "--", "--batch-size", "64", cwd=tmp_path)
    assert proc.returncode == 1
    tb = proc.stderr[proc.stderr.index("Traceback (most recent call last):") :]
    assert tb.splitlines()[1].lstrip().startswith(f'File "{tmp_path / "train.py"}"')  # starts in the script
    assert "ValueError: boom at epoch 1" in tb
    run, report = saved(run_dir_of(tmp_path))
    assert run["status"] == "failed" and report["status"]["state"] == "failed"
    assert report["breakdown"]["steps"], "the steps before the exception are analysed"
    assert "ValueError" in report["status"]["message"]


@pytest.mark.slow
@pytest.mark.parametrize(("code", "exit_code", "state"), [("sys.exit(4)", 4, "exited"), ("os._exit(5)", 5, "exited")])
def test_exit_and_hard_exit_mid_window(write_script, tmp_path: Path, code: str, exit_code: int, state: str) -> None:
    body = MLP_TRAIN.replace(
        "opt.step()", f"opt.step()\n        n = globals().setdefault('n', [0]); n[0] += 1\n        if n[0] == 5: {code}"
    )
    write_script("import os\n" + body)
    proc = diagnose("run", *FAST, "train.py", cwd=tmp_path)
    assert proc.returncode == exit_code
    run, report = saved(run_dir_of(tmp_path))
    assert run["status"] == state and report["status"]["exit_code"] == exit_code
    assert report["breakdown"]["steps"]
    if "os._exit" in code:
        assert "os._exit(5)" in " ".join(run["warnings"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "exit_code", "state"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_signals_mid_window_save_the_capture(
    write_script, tmp_path: Path, sig: int, exit_code: int, state: str
) -> None:
    # the script tells us (via a file) when it is inside the profiled window, then waits
    write_script(
        MLP_TRAIN.replace(
            "opt.step()",
            "opt.step()\n        n = globals().setdefault('n', [0]); n[0] += 1\n"
            "        if n[0] == 6: open('in_window', 'w').close()\n"
            "        if n[0] >= 6: __import__('time').sleep(0.05)",
        )
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "diagnose", "run", "--warmup", "2", "--steps", "50", "--quiet", "train.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (tmp_path / "in_window").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(sig)
    proc.communicate(timeout=120)
    assert proc.returncode == exit_code
    run, report = saved(run_dir_of(tmp_path))
    assert run["status"] == state
    assert run["trace_files"] and report["breakdown"]["steps"], "what was captured is analysed"


@pytest.mark.slow
def test_out_of_memory_is_reported_with_memory_advice(write_script, tmp_path: Path) -> None:
    write_script(
        MLP_TRAIN.replace(
            "opt.step()",
            "opt.step()\n        if epoch == 1: raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')",
        )
    )
    proc = diagnose("run", *FAST, "--json", "train.py", "--", "--batch-size", "64", cwd=tmp_path)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["status"]["state"] == "oom"
    assert "CUDA out of memory" in report["status"]["message"]
    assert "MEM002" in [f["rule"] for f in report["findings"]]


@pytest.mark.slow
def test_script_shorter_than_the_warmup(write_script, tmp_path: Path) -> None:
    # two optimizer steps, and nothing that says so before they run (a script whose --epochs
    # says it has the plan cut to its steps: tests/test_short_scripts.py)
    write_script(
        """
        import torch
        m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):
            m(torch.randn(8, 4)).mean().backward(); opt.step(); opt.zero_grad()
        """
    )
    proc = diagnose("run", "--warmup", "5", "--quiet", "train.py", cwd=tmp_path)
    assert proc.returncode == 0
    assert "ran only 2 steps, not more than --warmup 5" in proc.stderr
    run, report = saved(run_dir_of(tmp_path))
    assert run["status"] == "completed" and report["breakdown"] is None
    assert "Nothing to diagnose" in report["verdict"]


@pytest.mark.slow
def test_zero_steps_is_a_message_not_a_traceback(write_script, tmp_path: Path) -> None:
    write_script("print('hello')\n")
    proc = diagnose("run", "--quiet", "train.py", cwd=tmp_path)
    assert proc.returncode == 3
    assert "no training step was found" in error_line(proc)
    assert "Traceback" not in proc.stderr
    run, report = saved(run_dir_of(tmp_path))
    assert run["status"] == report["status"]["state"] == "no_steps"


# --- 6-8. unusual loops, the script's own profiler, DataLoader workers ------------------------------


@pytest.mark.slow
def test_eval_loop_between_train_steps(write_script, tmp_path: Path) -> None:
    write_script(
        MLP_TRAIN.replace(
            '    print("script finished"',
            '    print("script finished"',
        ).replace(
            "        opt.step()\n",
            "        opt.step()\n    with torch.no_grad():\n        for x, y in DataLoader(ds, batch_size=64):\n            model(x)\n",
        )
    )
    proc = diagnose("run", *FAST, "--json", "train.py", "--", "--batch-size", "128", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["run"]["step_mode"] == "optimizer"
    assert report["dataloader"]["batch_size"] == 128  # the training loader, not the eval one


# The script's own profiler around the loop (a plain one, or a scheduled one stepped each
# iteration) or started mid-run. Two Kineto sessions crash the process with SIGSEGV when the
# first one's results are read (diagnose/runtime/foreign.py): each script reads its own.
OWN_PROFILERS = {
    "around the loop": (
        "with torch.profiler.profile() as own:\n    train()\n",
        "print('own profiler rows:', len(own.key_averages()), file=sys.stderr)\n",
    ),
    "scheduled": (
        "def ready(prof):\n"
        "    prof.export_chrome_trace('own_trace.json')\n"
        "    print('own profiler rows:', len(prof.key_averages()), file=sys.stderr)\n"
        # the schedule records steps 3-5: inside diagnose's window (warm-up 2, steps 2-4 profiled)
        "sched = torch.profiler.schedule(wait=3, warmup=1, active=3, repeat=1)\n"
        "with torch.profiler.profile(schedule=sched, on_trace_ready=ready) as own:\n    train(own.step)\n",
        "",
    ),
    "mid-run": (
        "state = {'n': 0}\n"
        "def step():\n"
        "    state['n'] += 1\n"
        # optimizer step 4 is inside diagnose's window
        "    if state['n'] == 4:\n        state['own'] = torch.profiler.profile(); state['own'].start()\n"
        "    if state['n'] == 7:\n"
        "        state['own'].stop()\n"
        "        print('own profiler rows:', len(state['own'].key_averages()), file=sys.stderr)\n"
        "train(step)\n",
        "",
    ),
}

OWN_PROFILER_TRAIN = """
import sys, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
ds = TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,)))
dl = DataLoader(ds, batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def train(step=lambda: None):
    for epoch in range(3):
        for x, y in dl:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step(); step()
"""


@pytest.mark.slow
@pytest.mark.parametrize("stop", [True, False], ids=["stopped", "--no-stop"])
@pytest.mark.parametrize("where", list(OWN_PROFILERS))
def test_script_with_its_own_profiler(write_script, tmp_path: Path, where: str, stop: bool) -> None:
    profiling, after = OWN_PROFILERS[where]
    write_script(OWN_PROFILER_TRAIN + profiling + after + "print('script finished', file=sys.stderr)\n")
    proc = diagnose("run", *FAST, *([] if stop else ["--no-stop"]), "--json", "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]  # -11 (SIGSEGV) with two Kineto sessions
    report = json.loads(proc.stdout)
    run, _ = saved(run_dir_of(tmp_path))
    (note,) = [w for w in report["warnings"] if "own torch.profiler" in w]
    assert "Kineto holds one profiling session" in note, note
    assert not [w for w in report["warnings"] if "ended before the profiled window" in w]
    assert report["throughput"].get("steady"), "timings go on without the profiler"
    if where == "mid-run":  # diagnose's window was cut short: what it had is kept and analysed
        assert "kept the 1 profiled step(s)" in note and len(run["trace_files"]) == 1 and report["breakdown"]
        assert run["profiled_steps"] == 1
    else:  # the script's profiler was on before diagnose's first step: diagnose never started its own
        assert "did not profile" in note and run["trace_files"] == [] and run["profiled_steps"] == 0
    if stop and where == "around the loop":
        return  # stopped inside the profiled block: the script never reads its results
    assert re.search(r"own profiler rows: [1-9]", proc.stderr), proc.stderr[-3000:]
    if where == "scheduled":
        assert json.loads((tmp_path / "own_trace.json").read_text())["traceEvents"]
    if not stop:
        assert "script finished" in proc.stderr


def test_the_profiler_guard_is_removed_after_the_run(tmp_path: Path) -> None:
    """The four profiler methods diagnose watches are torch's own again once the run ended."""
    import torch.autograd.profiler as autograd_profiler
    from torch.profiler import profile

    from diagnose.progress import Progress
    from diagnose.record import WindowPlan
    from diagnose.rundir import RunDir
    from diagnose.runtime.runner import Target, run_target

    watched = [
        (profile, "start"),
        (profile, "stop"),
        (autograd_profiler.profile, "_prepare_trace"),
        (autograd_profiler.profile, "__exit__"),
    ]
    before = [owner.__dict__[name] for owner, name in watched]
    script = tmp_path / "train.py"
    script.write_text(OWN_PROFILER_TRAIN + OWN_PROFILERS["mid-run"][0])
    record = run_target(
        Target("script", str(script)),
        WindowPlan(warmup=2, steps=3, timed=3),
        RunDir.create(tmp_path / "run"),
        progress=Progress(enabled=False),
    )
    assert record.status == "stopped" and record.profiled_steps == 1
    assert [owner.__dict__[name] for owner, name in watched] == before


@pytest.mark.slow
@pytest.mark.parametrize(
    ("failure", "message"),
    [
        ("raise RuntimeError('corrupt sample')", "corrupt sample"),
        ("os.kill(os.getpid(), 9)", "killed by signal|exited unexpectedly"),  # PyTorch says either
        ("time.sleep(30)", "timed out"),
    ],
)
def test_dataloader_worker_crash_or_hang(write_script, tmp_path: Path, failure: str, message: str) -> None:
    # Batches pass from the worker as shared memory whose file descriptor the main process fetches
    # from the worker itself (the default "file_descriptor" strategy): a worker killed while a
    # batch is in flight then surfaces as a ConnectionResetError in that fetch, in most runs, and
    # torch's own worker-death messages only in the others. Shared memory by name
    # ("file_system") needs nothing from the dead worker, so its death is reported as such.
    write_script(
        f"""
import os, time, torch
torch.multiprocessing.set_sharing_strategy("file_system")
from torch.utils.data import DataLoader, Dataset
class Data(Dataset):
    def __len__(self):
        return 100000
    def __getitem__(self, i):
        if i == 64:
            {failure}
        return torch.ones(4)
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for x in DataLoader(Data(), batch_size=8, num_workers=1, timeout=2):
    m(x).sum().backward(); opt.step(); opt.zero_grad()
"""
    )
    proc = diagnose("run", "--warmup", "2", "--steps", "20", "--quiet", "train.py", cwd=tmp_path)
    assert proc.returncode == 1
    assert re.search(message, proc.stderr)
    run, report = saved(run_dir_of(tmp_path))
    assert run["status"] == "failed" and re.search(message, report["status"]["message"])


# --- 9. analyze ---------------------------------------------------------------------------------


def _trace(events: list[dict]) -> bytes:
    return json.dumps({"traceEvents": events}).encode()


STEP = [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50},
]


@pytest.mark.parametrize(
    ("name", "content", "code", "message"),
    [
        ("missing.json", None, 2, "no such run directory or trace"),
        ("empty.json", b"", 4, "empty trace file"),
        ("truncated.json", _trace(STEP)[:-20], 4, "is not valid JSON"),
        ("corrupt.json.gz", b"\x1f\x8b\x08\x00garbage", 4, "cannot read"),
        ("no_events.json", b'{"traceEvents": []}', 4, "holds no profiled events"),
        ("not_a_trace.json", b'{"hello": 1}', 4, "not a Chrome trace"),
    ],
)
def test_analyze_bad_traces(tmp_path: Path, name: str, content: bytes | None, code: int, message: str) -> None:
    if content is not None:
        (tmp_path / name).write_bytes(content)
    proc = diagnose("analyze", name, cwd=tmp_path)
    assert proc.returncode == code
    assert message in error_line(proc)
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_analyze_cpu_trace_from_a_future_torch(tmp_path: Path, suffix: str) -> None:
    events = [*STEP, {"ph": "X", "cat": "quantum_op", "name": "entangle", "pid": 1, "tid": 1, "ts": 70, "dur": 5}]
    raw = _trace(events)
    (tmp_path / f"t{suffix}").write_bytes(gzip.compress(raw) if suffix.endswith(".gz") else raw)
    proc = diagnose("analyze", "--json", f"t{suffix}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["breakdown"]["device"] == "cpu"
    assert any("quantum_op (1)" in w for w in report["warnings"])


def test_analyze_refuses_a_trace_over_the_memory_limit(tmp_path: Path) -> None:
    (tmp_path / "big.json").write_bytes(_trace(STEP * 200))
    proc = diagnose("analyze", "--max-trace-gb", "0.00001", "big.json", cwd=tmp_path)
    assert proc.returncode == 4
    line = error_line(proc)
    assert "GB, over the" in line
    assert "--steps" in proc.stderr or "--max-trace-gb" in proc.stderr


# --- 10. rules, output directories ------------------------------------------------------------------


def test_malformed_rule_file_names_file_and_line(write_script, tmp_path: Path) -> None:
    write_script(MLP_TRAIN)
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "BAD001.toml").write_text(
        'id = "BAD001"\ntitle = "t"\nsays = "s"\ndo = "d"\nwhy = "w"\n[when]\nall = ["gpu.bussy < 1"]\n'
    )
    proc = diagnose("run", "--rules", str(rules), "train.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert f"{rules / 'BAD001.toml'}:7: unknown symptom 'gpu.bussy'" in error_line(proc)


def test_unwritable_or_existing_output(write_script, tmp_path: Path) -> None:
    write_script(MLP_TRAIN)
    (tmp_path / "file").write_text("x")
    proc = diagnose("run", "--out", "file/run", "train.py", cwd=tmp_path)
    assert proc.returncode == 5 and "cannot create the run directory" in error_line(proc)
    existing = tmp_path / "done"
    existing.mkdir()
    (existing / "run.json").write_text("{}")
    proc = diagnose("run", "--out", "done", "train.py", cwd=tmp_path)
    assert proc.returncode == 5 and "already exists and is not empty" in error_line(proc)
    assert "--overwrite" in proc.stderr


# --- 11. nothing of the user's is touched -------------------------------------------------------------


@pytest.mark.slow
def test_nothing_outside_the_run_directory_changes(write_script, tmp_path: Path) -> None:
    project = tmp_path / "project"
    script = write_script(MLP_TRAIN, name="project/train.py")
    write_script("X = 1\n", name="project/helper.py")
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")

    def snapshot() -> dict[str, tuple[int, float]]:
        out = {}
        for root in (project, work):
            for p in root.rglob("*"):
                if "runs" not in p.relative_to(tmp_path).parts and "__pycache__" not in p.parts:
                    out[str(p)] = (p.stat().st_size, p.stat().st_mtime)
        return out

    before = snapshot()
    proc = diagnose("run", *FAST, str(script), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert snapshot() == before
    assert [p.name for p in work.iterdir() if p.is_dir()] == ["runs"]


def test_a_second_sigterm_while_the_script_unwinds_keeps_the_run_terminated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM to verify's run's process group reaches the script's process twice: directly,
    and forwarded by the supervising parent (which cannot tell a group signal from one sent to it
    alone). The second one, raised while the first unwinds (before the run's signals are held),
    left the run "completed: the script ran to its end" (tests/test_fault_injection.py's verify
    timeout, under load). Here the second signal is raised at the first point it could come."""
    from diagnose.progress import Progress
    from diagnose.record import WindowPlan
    from diagnose.rundir import RunDir
    from diagnose.runtime import runner

    script = tmp_path / "train.py"
    script.write_text(
        "from diagnose.runtime.runner import Terminated\nimport signal\nraise Terminated(signal.SIGTERM)\n"
    )
    real = runner._ScriptRun._script_ended
    seen: list[int] = []

    def second_signal(self: runner._ScriptRun) -> None:
        seen.append(1)
        if len(seen) == 1:  # the except block's call: the forwarded copy arrives
            raise runner.Terminated(signal.SIGTERM)
        real(self)

    monkeypatch.setattr(runner._ScriptRun, "_script_ended", second_signal)
    with pytest.raises(runner.Terminated):  # the second signal still ends the command
        runner.run_target(
            runner.Target("script", str(script)),
            WindowPlan(warmup=2, steps=3, timed=3),
            RunDir.create(tmp_path / "run"),
            progress=Progress(enabled=False),
        )
    record = RunDir(tmp_path / "run").load_record()
    assert record is not None and (record.status, record.exit_code) == ("terminated", 143)
