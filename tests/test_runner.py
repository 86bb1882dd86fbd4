"""The runner in-process on tiny scripts: step finding, the window, the record, clean-up."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")

from diagnose.errors import UsageError
from diagnose.progress import Progress
from diagnose.record import RunRecord, WindowPlan
from diagnose.rundir import RunDir
from diagnose.runtime.runner import resolve_target, run_target
from tests.scripts import MLP_TRAIN

SMALL = WindowPlan(warmup=2, steps=3, timed=4)


def run(script: Path, args: list[str] | None = None, plan: WindowPlan = SMALL, tmp: Path | None = None) -> RunRecord:
    run_dir = (tmp or script.parent) / "run"
    run_dir.mkdir(exist_ok=True)
    record = run_target(
        resolve_target(str(script), None, args or []), plan, RunDir(run_dir), progress=Progress(enabled=False)
    )
    assert (run_dir / "diagnose" / "run.json").is_file()
    assert RunRecord.load(run_dir / "diagnose" / "run.json").status == record.status
    return record


def test_training_script_is_profiled_then_stopped(write_script) -> None:
    script = write_script(MLP_TRAIN)
    record = run(script, ["--batch-size", "8"])
    assert record.status == "stopped" and record.exit_code == 0
    assert record.step_mode == "optimizer"
    # boundaries: warm-up 2, profiled 3, one for the export, timed 4, and the last one
    assert len(record.boundaries_s) == 2 + 3 + 1 + 4 + 1
    assert record.profiled_steps == 3
    assert record.timed_steps == 4 and record.timed_seconds > 0
    assert record.batch_size() == 8
    assert record.timed_samples == 4 * 8
    (loader,) = record.dataloaders
    assert (loader.num_workers, loader.batch_size, loader.pin_memory) == (0, 8, False)
    assert loader.created_at.endswith("train.py:11")
    assert loader.fetches_in_window == 3
    # a DataLoader ran: what receiving a batch from a worker would cost this process, measured once
    assert 0 < record.environment["loader_receive_ms_per_mb"] < 100
    (opt,) = record.optimizers
    assert (opt.name, opt.param_tensors, opt.implementation) == ("SGD", 4, "for-loop")
    assert opt.created_at.endswith("train.py:13")  # where the script built it
    assert record.models and record.models[0].name == "Sequential"
    (trace,) = record.trace_files
    assert trace.endswith(".pt.trace.json.gz")
    assert (script.parent / "run" / trace).stat().st_size > 1000


def test_script_runs_as_main_with_its_argv_path_and_our_cwd(write_script, tmp_path: Path) -> None:
    script = write_script(
        """
        import os, sys
        assert __name__ == "__main__"
        assert sys.argv == [__file__, "--x", "1"], sys.argv
        assert sys.path[0] == os.path.dirname(__file__), sys.path[0]
        with open("cwd.txt", "w") as f:
            f.write(os.getcwd())
        import helper  # a module beside the script
        """,
        name="sub/train.py",
    )
    write_script("VALUE = 1\n", name="sub/helper.py")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        record = run(script, ["--x", "1"])
    finally:
        os.chdir(cwd)
    assert record.status == "no_steps", record.error
    assert (tmp_path / "cwd.txt").read_text() == str(tmp_path)


def test_two_optimizers_per_iteration_make_one_step(write_script) -> None:
    script = write_script(
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        g, d = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        og, od = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.SGD(d.parameters(), lr=0.1)
        dl = DataLoader(TensorDataset(torch.randn(400, 4)), batch_size=4)
        iterations = 0
        for (x,) in dl:
            d(g(x).detach()).mean().backward(); od.step(); od.zero_grad()
            d(g(x)).mean().backward(); og.step(); og.zero_grad()
            iterations += 1
        """
    )
    record = run(script)
    assert record.status == "stopped"
    assert record.completed_steps() == 2 + 3 + 1 + 4
    # one step per iteration (one batch of 4), not one per optimizer
    assert record.samples_per_step[: record.completed_steps()] == [4] * record.completed_steps()


@pytest.mark.parametrize(
    ("penalty", "calls"),
    [
        # a gradient penalty: autograd.grad(create_graph=True) inside the step, then backward
        ("(g,) = torch.autograd.grad(out.sum(), x, create_graph=True); loss = loss + g.pow(2).mean()", True),
        # Tensor.backward passes create_graph to torch.autograd.backward by position
        ("loss.backward(create_graph=True); opt.zero_grad()", True),
        ("(g,) = torch.autograd.grad(out.sum(), x, retain_graph=True); loss = loss + g.pow(2).mean()", False),
    ],
)
def test_a_gradient_differentiated_again_is_recorded(write_script, penalty: str, calls: bool) -> None:
    """A step that builds a graph of a gradient makes its backward a double backward (which
    torch.compile cannot run): ``flags["create_graph_calls"]`` counts such calls, and the
    ``autograd.create_graph`` symptom says so; torch.autograd's functions are put back after."""
    import torch

    from diagnose.analysis.symptoms.environment import create_graph

    grad, backward = torch.autograd.grad, torch.autograd.backward
    script = write_script(
        f"""
        import torch
        m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(20):
            x = torch.randn(8, 4, requires_grad=True)
            out = m(x); loss = out.mean()
            {penalty}
            loss.backward(); opt.step(); opt.zero_grad()
        """
    )
    record = run(script)
    assert record.status == "stopped"
    assert (record.flags["create_graph_calls"] > 0) is calls
    assert create_graph.compute(record) is calls
    assert (torch.autograd.grad, torch.autograd.backward) == (grad, backward)


def test_gradient_accumulation_is_one_step_per_optimizer_step(write_script) -> None:
    script = write_script(
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        dl = DataLoader(TensorDataset(torch.randn(400, 4)), batch_size=4)
        for i, (x,) in enumerate(dl):
            m(x).mean().backward()
            if (i + 1) % 4 == 0:
                opt.step(); opt.zero_grad()
        """
    )
    record = run(script)
    assert record.step_mode == "optimizer"
    assert record.status == "stopped"
    assert record.batch_size() == 16  # four micro-batches of 4 samples per step


def test_inference_loop_without_optimizer_counts_batches(write_script) -> None:
    script = write_script(
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        m = torch.nn.Linear(4, 1)
        with torch.no_grad():
            for (x,) in DataLoader(TensorDataset(torch.randn(200, 4)), batch_size=4):
                m(x)
        """
    )
    record = run(script)
    assert record.step_mode == "dataloader"
    assert record.status == "stopped"


def test_loop_without_optimizer_or_dataloader_counts_model_calls(write_script) -> None:
    script = write_script(
        """
        import torch
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        x = torch.randn(8, 4)
        with torch.no_grad():
            for _ in range(100):
                m(x)
        """
    )
    record = run(script)
    assert record.step_mode == "forward"
    assert record.status == "stopped"
    assert record.profiled_steps == 3


INNER_CALLS = """
import torch
cell, head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.01)
for _ in range({steps}):
    h = torch.zeros(2, 4)
    for _ in range(30):  # a cell stepped in Python, as an RNN encoder or an ODE solver's function
        h = torch.tanh(cell(h))
    loss = head(h).pow(2).mean()
    opt.zero_grad(){step}
"""


def test_a_module_called_many_times_before_the_first_optimizer_step_is_no_step(write_script) -> None:
    # each of the cell's 30 calls had been a step: the window ended inside the first training step
    record = run(write_script(INNER_CALLS.format(steps=12, step="; loss.backward(); opt.step()")))
    assert record.step_mode == "optimizer"
    assert record.status == "stopped" and record.profiled_steps == 3


def test_an_optimizer_never_stepped_leaves_model_calls_counted_once_the_hold_is_over(write_script, monkeypatch) -> None:
    import diagnose.runtime.instrument as instrument

    monkeypatch.setattr(instrument, "FORWARD_HOLD_S", 0.0)
    record = run(write_script(INNER_CALLS.format(steps=3, step="")))
    assert record.step_mode == "forward"
    assert record.status == "stopped" and record.profiled_steps == 3


def test_script_that_ends_inside_the_window_is_analysed(write_script) -> None:
    script = write_script(MLP_TRAIN)
    record = run(script, ["--batch-size", "128", "--epochs", "1"], plan=WindowPlan(warmup=1, steps=10, timed=4))
    assert record.status == "completed"
    # 512/128 = 4 batches, 4 optimizer steps: the first step began at its fetch, the last ends
    # at the fetch that finds the loader exhausted. One warm-up step, three profiled.
    assert record.completed_steps() == 4
    assert record.profiled_steps == 3
    assert record.trace_files, "what the window captured is saved"


THREE_STEPS = """
import torch
from torch.utils.data import DataLoader, TensorDataset
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
{loop}
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
"""
WITH_LOADER = "for x, y in DataLoader(TensorDataset(torch.randn(12, 4), torch.randn(12, 1)), batch_size=4):"
WITHOUT_LOADER = "for x, y in [(torch.randn(4, 4), torch.randn(4, 1)) for _ in range(3)]:"


@pytest.mark.parametrize("loop", [WITH_LOADER, WITHOUT_LOADER], ids=["dataloader", "no dataloader"])
def test_three_optimizer_steps_are_three_steps(write_script, loop: str) -> None:
    record = run(write_script(THREE_STEPS.format(loop=loop)), plan=WindowPlan(warmup=5, steps=3, timed=4))
    assert record.status == "completed" and record.step_mode == "optimizer"
    assert record.completed_steps() == 3  # issue 18: reported as 2 (the first step was lost to the mode switch)


def test_torchs_own_warnings_keep_their_origin(write_script) -> None:
    script = write_script(
        THREE_STEPS.format(loop=WITH_LOADER.replace("batch_size=4)", "batch_size=4, pin_memory=True)"))
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(script)
    origins = {Path(w.filename).name for w in caught if "pin_memory" in str(w.message)}
    if not origins:
        pytest.skip("this torch has an accelerator or no longer warns about pin_memory")
    assert origins == {"dataloader.py"}  # torch's own file, as without diagnose; was instrument.py


def test_the_warm_up_line_is_printed_once(write_script, tmp_path: Path) -> None:
    script = write_script(THREE_STEPS.format(loop=WITH_LOADER))
    stream = io.StringIO()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_target(
        resolve_target(str(script), None, []),
        WindowPlan(warmup=2, steps=1, timed=1),
        RunDir(run_dir),
        progress=Progress(stream=stream),
    )
    assert [line for line in stream.getvalue().splitlines() if "warm-up:" in line] == ["diagnose ▸ warm-up: 2 steps"]


def test_script_failure_is_recorded_with_its_traceback(write_script, capsys) -> None:
    script = write_script(
        MLP_TRAIN.replace("opt.step()", "opt.step()\n        if epoch == 2: raise ValueError('boom')")
    )
    record = run(script, ["--batch-size", "256"])
    assert record.status == "failed" and record.exit_code == 1
    assert record.error["type"] == "ValueError"
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ValueError: boom" in err
    assert "runpy" not in err and "diagnose/runner.py" not in err  # starts in the script
    assert record.trace_files
    assert "loader_receive_ms_per_mb" not in record.environment  # no probe after a failure


@pytest.mark.skipif(not hasattr(signal, "SIGCHLD"), reason="no SIGCHLD here")
def test_a_dead_dataloader_worker_cannot_raise_after_the_script(write_script) -> None:
    """torch's SIGCHLD handler raises for a dead worker at *any* later child exit; the script's
    iterator lives on in the traceback. diagnose gives the handler back before analysing."""
    before = signal.getsignal(signal.SIGCHLD)
    script = write_script(
        """
import os, torch
from torch.utils.data import DataLoader, Dataset
class Data(Dataset):
    def __len__(self):
        return 1000
    def __getitem__(self, i):
        if i == 24:
            os.kill(os.getpid(), 9)
        return torch.ones(4)
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for x in DataLoader(Data(), batch_size=8, num_workers=1, timeout=5):
    m(x).sum().backward(); opt.step(); opt.zero_grad()
"""
    )
    record = run(script)
    assert record.status == "failed"
    assert signal.getsignal(signal.SIGCHLD) == before
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # a child exits: nothing raises


@pytest.mark.skipif(not hasattr(signal, "SIGCHLD"), reason="no SIGCHLD here")
def test_a_dead_workers_pending_sigchld_cannot_raise_in_diagnose(write_script, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race behind the flaky test above, made certain: the script fails while a dead
    worker's SIGCHLD is still pending, and signal.signal runs torch's handler (which raises)
    before it replaces it. The script's own error is recorded; nothing escapes diagnose."""
    real = signal.signal
    pending = [True]

    def with_pending_sigchld(signum: int, handler: object) -> object:
        if signum == signal.SIGCHLD and pending:
            pending.clear()
            raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.")  # torch's handler, run first
        return real(signum, handler)

    script = write_script("raise ValueError('the queue saw the worker die first')\n")
    monkeypatch.setattr(signal, "signal", with_pending_sigchld)
    record = run(script)
    assert record.status == "failed" and not pending
    assert "the queue saw the worker die first" in record.error["message"]


def test_sys_exit_code_is_kept(write_script) -> None:
    script = write_script("import sys\nsys.exit(3)\n")
    record = run(script)
    assert (record.status, record.exit_code) == ("exited", 3)


def test_keyboard_interrupt_mid_window_saves_the_capture(write_script) -> None:
    script = write_script(
        MLP_TRAIN.replace(
            "opt.step()",
            "opt.step()\n        if epoch == 0 and x.sum() > 1e9: pass\n        steps = globals().setdefault('n', [0]); steps[0] += 1\n        if steps[0] == 5: raise KeyboardInterrupt",
        )
    )
    record = run(script, ["--batch-size", "8"], plan=WindowPlan(warmup=1, steps=10, timed=4))
    assert record.status == "interrupted" and record.exit_code == 130
    assert record.trace_files


def test_knobs_reach_the_dataloader_and_optimizer(write_script, tmp_path: Path) -> None:
    from diagnose.runtime.knobs import Knobs

    script = write_script(
        MLP_TRAIN.replace("torch.optim.SGD(model.parameters(), lr=0.1)", "torch.optim.Adam(model.parameters(), lr=0.1)")
    )
    knobs = Knobs.parse(["num_workers=2", "batch_size=32", "optimizer=foreach", "persistent_workers=true"])
    run_dir = tmp_path / "knobs"
    run_dir.mkdir()
    record = run_target(
        resolve_target(str(script), None, []), SMALL, RunDir(run_dir), knobs=knobs, progress=Progress(enabled=False)
    )
    (loader,) = record.dataloaders
    assert (loader.num_workers, loader.batch_size, loader.persistent_workers) == (2, 32, True)
    assert loader.knobs_applied == {"num_workers": 2, "batch_size": 32, "persistent_workers": True}
    assert record.optimizers[0].implementation == "foreach"
    assert record.batch_size() == 32
    assert record.knobs["num_workers"] == 2


@pytest.mark.parametrize(
    ("script", "module", "message"),
    [
        ("missing.py", None, "no such script"),
        (".", None, "is a folder, not a Python script"),
        (None, "no_such_module_xyz", "no module named"),
    ],
)
def test_bad_targets_are_clear_errors(script, module, message, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=message):
        resolve_target(script, module, [])


def test_not_python_is_a_clear_error(tmp_path: Path) -> None:
    binary = tmp_path / "model.pt"
    binary.write_bytes(b"\x80\x02\x00\x00garbage")
    with pytest.raises(UsageError, match=r"not (valid Python|a Python source)"):
        resolve_target(str(binary), None, [])


def test_python_dash_m_module(write_script, tmp_path: Path, monkeypatch) -> None:
    write_script("", name="pkg/__init__.py")
    write_script(MLP_TRAIN, name="pkg/train.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = run_target(
        resolve_target(None, "pkg.train", ["--batch-size", "4"]),
        SMALL,
        RunDir(run_dir),
        progress=Progress(enabled=False),
    )
    assert record.status == "stopped"
    assert record.batch_size() == 4
    sys.modules.pop("pkg", None)


def test_the_step_after_the_window_is_counted_and_reloads(write_script) -> None:
    """FLOPs of one step, outside the window: the step that absorbs the export (index 5 here)."""
    script = write_script(MLP_TRAIN)
    record = run(script, ["--batch-size", "8"])
    count = record.flops
    assert count is not None and count.step == SMALL.warmup + SMALL.steps and count.samples == 8
    forward = 2 * 8 * 32 * 64 + 2 * 8 * 64 * 4
    backward = 2 * 8 * 32 * 64 + 2 * 2 * 8 * 64 * 4  # no gradient for the input
    assert count.by_phase == {"forward": forward, "backward": backward, "optimizer": 0}
    assert record.memory_split is None  # a CPU run: no allocator to read
    from diagnose.rundir import RunDir

    assert RunRecord.load(RunDir(script.parent / "run").record_path()).flops == count


def test_planted_oom_example_ends_as_oom_on_cpu(tmp_path: Path) -> None:
    """examples/oom.py --simulate-oom raises torch's own OOM error: status "oom", its message kept.
    (No allocator on CPU, so no memory owners: those come from the GPU run, benchmarks/mfu_gpu.py.)"""
    script = Path(__file__).parent.parent / "examples" / "oom.py"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = run_target(
        resolve_target(str(script), None, ["--small", "--simulate-oom"]),
        SMALL,
        RunDir(run_dir),
        progress=Progress(enabled=False),
    )
    assert record.status == "oom"
    assert record.error["message"].startswith("CUDA out of memory. Tried to allocate 4.00 GiB")
    assert record.memory_at_oom is None


def test_an_oom_in_a_script_that_batches_by_hand_takes_the_batch_from_its_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No DataLoader counted the step that ran out of memory: its samples are the batch option's
    value where the counted step's input held it or was not measured yet; not where the input
    held another number (a global batch split by hand), and not without an option."""
    from types import SimpleNamespace

    from diagnose.runtime import runner as R

    taken: list[int | None] = []
    monkeypatch.setattr(R, "_cuda_in_use", lambda: True)
    monkeypatch.setattr(
        "diagnose.runtime.memory_probe.snapshot_at_oom", lambda message, samples: taken.append(samples) or "split"
    )

    def oom(option: dict | None, dims: tuple[int, ...], counted: list[int]) -> int | None:
        fake = SimpleNamespace(
            record=SimpleNamespace(memory_at_oom=None),
            clock=SimpleNamespace(samples_this_step=0, samples_per_step=counted),
            script_args=SimpleNamespace(batch_option=lambda: option),
            memory_probe=SimpleNamespace(input_dims=dims),
        )
        fake._option_batch = lambda unmeasured=False: R._ScriptRun._option_batch(fake, unmeasured)
        R._ScriptRun._on_oom(fake, "CUDA out of memory")
        return taken.pop()

    option = {"flag": "--batch_size", "dest": "batch_size", "value": 128}
    assert oom(option, (), []) == 128  # at the first step: nothing measured yet
    assert oom(option, (128, 256), [0]) == 128  # the input holds it
    assert oom(option, (16, 256), [0]) is None  # the input holds another number
    assert oom(None, (), []) is None
    assert oom(option, (), [64]) == 64  # a DataLoader counted the step: its count


# --- the script's traceback leaves out the diagnose frames an error only passed through ----------

WRAPPER = """
def through(f):
    return f()

def own_bug():
    return {}["missing"]
"""


def test_the_scripts_traceback_hides_pass_through_frames_but_not_our_own_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from diagnose.runtime import runner

    path = tmp_path / "own_wrapper.py"
    path.write_text(WRAPPER)
    spec = importlib.util.spec_from_file_location("own_wrapper", path)
    assert spec is not None and spec.loader is not None
    wrapper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wrapper)
    monkeypatch.setattr(runner, "_OWN_FILES", (str(path),))

    def user_code() -> None:
        try:
            wrapper.through(lambda: 1 / 0)
        except ZeroDivisionError as exc:
            raise RuntimeError("the script's own error") from exc

    def caught(f):  # type: ignore[no-untyped-def]
        try:
            f()
        except BaseException as exc:  # noqa: BLE001 - the test looks at any error
            return exc
        raise AssertionError("no error")

    passed_through = runner._script_traceback(caught(user_code))
    assert "own_wrapper.py" not in passed_through  # the wrapper frame, in the cause too
    assert (
        "ZeroDivisionError: division by zero" in passed_through
        and "RuntimeError: the script's own error" in passed_through
    )
    assert "direct cause" in passed_through and "user_code" in passed_through and "<lambda>" in passed_through

    ours = runner._script_traceback(caught(lambda: wrapper.through(wrapper.own_bug)))
    assert ours.count("own_wrapper.py") == 2 and "KeyError: 'missing'" in ours  # raised in diagnose: kept


# An evaluation before training, before the optimizer is built (once one is built, model calls
# wait for its first step: ``FORWARD_HOLD_S``): the model's calls are the first step signal, so
# the profiler starts on them; the first optimizer step (a stronger signal) drops it from inside
# ``optimizer.step``, within record_functions begun under it (torch's, the script's own).
EVALUATE_THEN_TRAIN = """
import contextlib
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
x = torch.randn(32, 64)
model.eval()
with torch.no_grad():
    for _ in range(3):
        model(x)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for it in range(40):
    with contextlib.ExitStack() as marks:
        for depth in range(32):  # many open annotations: many stale end times to write
            marks.enter_context(torch.profiler.record_function(f"train_step.{depth}"))
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
"""


def test_a_stronger_step_signal_restarts_the_profiler_after_the_step_that_found_it(
    write_script, tmp_path: Path
) -> None:
    """The zoo's nanoGPT crash: the new profiler started inside the resetting ``optimizer.step``,
    so the record_functions begun under the dropped one ended under it and torch wrote their end
    times into freed memory; the process died (SIGSEGV / glibc abort) at the ``gc.collect()`` that
    closes the window. Now it starts at the first boundary of a later call."""
    script = write_script(EVALUATE_THEN_TRAIN)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--warmup",
            "1",
            "--steps",
            "6",
            "--max-steps",
            "6",
            "--timed-steps",
            "3",
            "--out",
            str(out),
            "--no-color",
            str(script),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = RunRecord.load(out / "diagnose" / "run.json")
    assert record.step_mode == "optimizer" and record.status == "stopped"
    # boundaries 0 and 1 both come from the resetting optimizer.step: boundary 2 starts the
    # profiler, recording at once, and the warm-up grows from 1 to 2 steps
    assert record.plan["warmup"] == 2
    assert record.profiled_steps == 6 and record.trace_files
