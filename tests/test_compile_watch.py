"""The runtime side of phases and torch.compile: annotations that change nothing, the compile
observer, generated files that are never a user's line, and a real compiled run on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from diagnose.runtime import compilewatch
from diagnose.runtime.compilewatch import CompileWatch, first_line, reason_kind
from diagnose.runtime.marks import PhaseMarks
from diagnose.runtime.usercode import first_user_frame, is_generated
from tests.conftest import REPO


def _annotations(prof: torch.profiler.profile) -> list[str]:
    return [e.name for e in prof.events() if e.name.startswith(("diagnose#", "Optimizer."))]


def test_marks_annotate_closure_clipping_and_scaler_and_change_nothing() -> None:
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss

    marks = PhaseMarks()
    marks.install()
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            returned = opt.step(closure)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            model.zero_grad()
            scaler = torch.amp.GradScaler("cpu", enabled=False)
            scaler.update()
    finally:
        marks.remove()
    names = _annotations(prof)
    assert "diagnose#optimizer_closure" in names and "diagnose#clip_grad_norm_" in names
    assert "diagnose#Module.zero_grad" in names and "diagnose#GradScaler.update" in names
    assert isinstance(returned, torch.Tensor) and returned.ndim == 0  # the closure's own result
    assert isinstance(norm, torch.Tensor)
    assert torch.nn.utils.clip_grad_norm_.__name__ == "clip_grad_norm_"
    assert not hasattr(torch.nn.utils.clip_grad_norm_, "__diagnose_original__")  # removed


def test_marks_make_no_record_function_while_no_profiler_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the window nothing reads the marks, and each record_function costs two operator
    calls (about 6 µs): one is made only while a profiler records on the calling thread."""
    made: list[str] = []
    real = torch.profiler.record_function

    def counting(name: str) -> object:
        made.append(name)
        return real(name)

    monkeypatch.setattr(torch.profiler, "record_function", counting)
    model = nn.Linear(4, 2)
    marks = PhaseMarks()
    marks.install()
    try:
        model.zero_grad()
        assert made == []
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model.zero_grad()
        model.zero_grad()
    finally:
        marks.remove()
    assert made == ["diagnose#Module.zero_grad"]
    assert "diagnose#Module.zero_grad" in _annotations(prof)


def test_compile_watch_records_calls_and_modes_without_changing_them() -> None:
    watch = CompileWatch(user_frame=lambda: "train.py:7")
    watch.install()
    try:
        net = nn.Sequential(nn.Linear(2, 2))
        compiled = torch.compile(net, mode="reduce-overhead")
        other = nn.Linear(2, 2)
        other.compile()  # Module.compile calls torch.compile inside: one record, not two
        decorator = torch.compile(mode="max-autotune")  # a decorator factory: nothing compiled yet
    finally:
        watch.remove()
    assert type(compiled).__name__ == "OptimizedModule" and callable(decorator)
    assert [(c["api"], c["target"], c["mode"], c["cudagraphs"]) for c in watch.calls] == [
        ("torch.compile", "Sequential", "reduce-overhead", True),
        ("Module.compile", "Linear", "default", False),
    ]
    assert watch.calls[0]["site"] == "train.py:7"
    assert torch.compile.__module__ == "torch"  # the original is back


def test_compile_summary_reads_breaks_and_recompiles_after_the_warmup(monkeypatch) -> None:
    def metric(name: str, reason: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(co_name=name, co_filename="/w/model.py", co_firstlineno=10, recompile_reason=reason)

    warm = [metric("forward"), metric("torch_dynamo_resume_in_forward_at_24")]
    later = [
        metric("forward", "0/1: tensor 'x' size mismatch at index 0. expected 16, actual 24"),
        metric("forward", "0/2: tensor 'x' size mismatch at index 0. expected 24, actual 25"),
    ]
    metrics = list(warm)
    monkeypatch.setattr(compilewatch, "_compilation_metrics", lambda: list(metrics))
    monkeypatch.setattr(
        compilewatch,
        "_counters",
        lambda: {
            "stats": {"unique_graphs": 4},
            "graph_break": {"Unsupported Tensor.item() call with capture_scalar_outputs=False\n  Explanation: ...": 3},
        },
    )
    watch = CompileWatch()
    watch.calls.append({"api": "torch.compile", "target": "GPT", "mode": "default", "cudagraphs": False})
    watch.window_opened()
    metrics.extend(later)
    summary = watch.summary()
    assert summary["graph_breaks"] == [
        {"reason": "Unsupported Tensor.item() call with capture_scalar_outputs=False", "count": 3}
    ]
    assert summary["graph_break_sites"] == [{"site": "/w/model.py:24", "count": 1, "code": ""}]
    assert summary["compiles_after_warmup"] == 2
    assert summary["recompile_reasons"] == [
        {
            "reason": "tensor 'x' size mismatch at index 0. expected 16, actual 24",
            "site": "/w/model.py:10",
            "function": "forward",
            "count": 2,
        }
    ]
    assert summary["modes"] == ["default"] and summary["graphs"] == 4


def test_reason_helpers() -> None:
    assert first_line("1/3: tensor 'h' size mismatch\nmore") == "tensor 'h' size mismatch"
    assert reason_kind("expected 16, actual 24") == reason_kind("expected 24, actual 25")


@pytest.mark.parametrize(
    ("filename", "generated"),
    [
        ("/tmp/torchinductor_root/cb/cbvy3rogq5kxv2.py", True),
        ("<eval_with_key>.12", True),
        ("/home/u/.triton/cache/x/kernel.py", True),
        ("/home/u/project/model.py", False),
    ],
)
def test_generated_files_are_nobodys_line(filename: str, generated: bool) -> None:
    assert is_generated(filename) is generated


def test_generated_cache_dir_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/scratch/ind")
    assert is_generated("/scratch/ind/ab/cab.py") and not is_generated("/scratch/other.py")


def test_first_user_frame_skips_inductor_output() -> None:
    """A frame of Inductor's output code (its file under /tmp/torchinductor_*) is skipped: the
    user's caller is named instead."""
    code = compile(
        "def call(look):\n    return look(sys._getframe())\n", "/tmp/torchinductor_me/cb/cbvy3rog.py", "exec"
    )
    namespace: dict = {"sys": sys}
    exec(code, namespace)
    library = (os.path.dirname(torch.__file__),)

    def users_forward() -> str:
        frame = namespace["call"](lambda f: first_user_frame(f, library))
        return frame.f_code.co_name

    assert users_forward() == "users_forward"


@pytest.mark.slow
def test_compiled_run_on_the_cpu_names_the_graph_break(tmp_path: Path) -> None:
    """End to end: torch.compile of a tiny model whose forward breaks the graph at ``.item()``.
    The run record knows compile is on, in which mode, and where and why the graph breaks."""
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    script = REPO / "tests" / "frameworks" / "compiled_break.py"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--warmup",
            "2",
            "--steps",
            "2",
            "--timed-steps",
            "2",
            "-o",
            str(out),
            "--json",
            "-q",
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((out / "diagnose" / "run.json").read_text())
    compiled = record["compile"]
    assert compiled["enabled"] and compiled["modes"] == ["default"]
    assert compiled["calls"][0]["target"] == "TinyNet" and compiled["calls"][0]["site"].endswith("compiled_break.py:40")
    assert "Tensor.item()" in compiled["graph_breaks"][0]["reason"]
    assert any(s["site"].endswith("compiled_break.py:27") for s in compiled["graph_break_sites"])
    lines = record["host_samples"].get("lines", [])
    assert all("torchinductor" not in x["site"] for x in lines)
    report = json.loads(result.stdout)
    comp = [f for f in report["findings"] if f["rule"] == "COMP001"]
    assert comp and "Tensor.item()" in comp[0]["says"] and "compiled_break.py:27" in comp[0]["lines"]


# --- the compile knob through the script's own torch.compile -------------------------------------


@pytest.fixture
def compile_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """torch.compile replaced by a recorder (installed before the watch, so the watch wraps it):
    the keyword arguments each call reached torch with. It returns the model unchanged."""
    calls: list[dict] = []

    def recorder(model=None, **kwargs):
        calls.append(dict(kwargs, model=model))
        return model

    monkeypatch.setattr(torch, "compile", recorder)
    return calls


def _watched(knobs, library=()):
    from diagnose.runtime.knobs import Knobs

    knobs = Knobs.parse(knobs)
    watch = CompileWatch(
        user_frame=lambda: "train.py:3",
        knob_hook=knobs.script_compile,
        is_library=lambda filename: filename.startswith(library) if library else False,
    )
    watch.install()
    return knobs, watch


def test_the_compile_knob_sets_the_mode_of_the_scripts_own_call(compile_calls) -> None:
    knobs, watch = _watched(["compile=reduce-overhead"])
    net = nn.Linear(2, 2)
    try:
        compiled = torch.compile(net, options={"triton.cudagraphs": False}, dynamic=False)
    finally:
        watch.remove()
    assert compiled is net
    assert compile_calls == [{"model": net, "mode": "reduce-overhead", "dynamic": False}], (
        "options give way to the mode"
    )
    assert [(c["api"], c["mode"], c["cudagraphs"]) for c in watch.calls] == [("torch.compile", "reduce-overhead", True)]
    assert knobs.via() == {"compile": "the script's torch.compile(...) call"}
    assert knobs.maybe_compile(net) is False, "the knob's own wrapping is skipped: no second compile"
    assert "forward" not in vars(net)


def test_compile_off_leaves_the_scripts_model_eager(compile_calls) -> None:
    knobs, watch = _watched(["compile=off"])
    net = nn.Linear(2, 2)
    try:
        same = torch.compile(net, mode="max-autotune")
        decorator = torch.compile(mode="max-autotune")  # @torch.compile(mode=...)

        def step(x):
            return x + 1

        decorated = decorator(step)
        assert net.compile() is None
    finally:
        watch.remove()
    assert same is net and decorated is step
    assert compile_calls == [] and watch.calls == []
    assert knobs.via() == {"compile": "the script's torch.compile(...) call"}


def test_the_knob_reaches_a_decorator_and_module_compile_but_not_library_calls(compile_calls) -> None:
    _knobs, watch = _watched(["compile=default"], library=(os.path.dirname(torch.__file__),))
    try:

        @torch.compile(mode="reduce-overhead", fullgraph=True)
        def step(x):
            return x * 2

        lib_net = nn.Linear(2, 2)
        # a call whose direct caller is library code (here torch's own file) is not the script's
        lib_call = compile(
            "result = torch.compile(net, mode='max-autotune')",
            os.path.join(os.path.dirname(torch.__file__), "fake_lib.py"),
            "exec",
        )
        namespace = {"torch": torch, "net": lib_net}
        exec(lib_call, namespace)
    finally:
        watch.remove()
    assert compile_calls[0] == {"model": step, "fullgraph": True}, (
        "the decorator's own mode is replaced by the knob's (default)"
    )
    assert compile_calls[1] == {"model": lib_net, "mode": "max-autotune"}, "a library's call is left alone"
    assert [c["mode"] for c in watch.calls] == ["default", "max-autotune"]


def test_module_compile_gets_the_knobs_mode(compile_calls) -> None:
    knobs, watch = _watched(["compile=reduce-overhead"])
    net = nn.Linear(2, 2)
    try:
        net.compile(mode="default", backend="eager")  # Module.compile calls torch.compile inside
    finally:
        watch.remove()
    assert [{k: v for k, v in c.items() if k != "model"} for c in compile_calls] == [
        {"backend": "eager", "mode": "reduce-overhead"}
    ]
    assert [(c["api"], c["mode"], c["backend"]) for c in watch.calls] == [
        ("Module.compile", "reduce-overhead", "eager")
    ]
    assert knobs.via() == {"compile": "the script's Module.compile(...) call"}


def test_a_script_compiling_after_the_knobs_own_wrap_undoes_it(compile_calls) -> None:
    """The knob wraps the first module the script calls; a script that runs its model eagerly
    once and compiles it afterwards must not end up compiled twice."""
    knobs, watch = _watched(["compile=reduce-overhead"])
    net = nn.Linear(2, 2)
    try:
        assert knobs.maybe_compile(net) and "forward" in vars(net)
        torch.compile(net)
    finally:
        watch.remove()
    assert "forward" not in vars(net), "the knob's own compiled forward is gone"
    assert [c.get("mode") for c in compile_calls] == [
        "reduce-overhead",
        "reduce-overhead",
    ]  # its wrap, then the script's
    assert knobs.via()["compile"] == "the script's torch.compile(...) call"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("knob", "calls"),
    [("compile=reduce-overhead", [("torch.compile", "reduce-overhead")]), ("compile=off", [])],
    ids=["reduce-overhead", "off"],
)
def test_the_compile_knob_takes_the_scripts_own_call_end_to_end(tmp_path: Path, knob: str, calls: list) -> None:
    """``diagnose run --set compile=...`` on a script that compiles itself (dynamo's eager backend:
    no code generation, so the test is quick): its own call runs in the knob's mode, or not at
    all, and the run says so; the knob's own wrapping of the first module never happens."""
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    script = REPO / "tests" / "frameworks" / "compiled_break.py"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--warmup",
            "2",
            "--steps",
            "2",
            "--timed-steps",
            "2",
            "-o",
            str(out),
            "--json",
            "-q",
            "--set",
            knob,
            str(script),
            "--",
            "--backend",
            "eager",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((out / "diagnose" / "run.json").read_text())
    assert record["knobs_via"] == {"compile": "the script's torch.compile(...) call"}
    assert [(c["api"], c["mode"]) for c in (record["compile"] or {}).get("calls", [])] == calls
    assert [(m["name"], m["compiled"]) for m in record["models"]] == [("TinyNet", bool(calls))]


def test_launch002_names_its_verify_knob() -> None:
    """``diagnose verify`` tries a finding's knobs: LAUNCH002 (compiled, still launch-bound) is
    measured with the script's own compile call in mode reduce-overhead."""
    from diagnose.analysis.symptoms import symptoms_from_values
    from diagnose.analysis.verdict.findings import diagnose_symptoms
    from diagnose.analysis.verdict.rules import load_rules

    values = {
        "compile.enabled": 1,
        "compile.mode_reduce_overhead": 0,
        "exposed.launch_model": 0.45,
        "gpu.busy": 0.4,
        "exposed.data_wait": 0.0,
        "gpu.kernels_per_step": 120,
        "gpu.median_kernel_us": 4.0,
    }
    findings = diagnose_symptoms(load_rules(), symptoms_from_values(values)).findings
    launch = next(f for f in findings if f.rule_id == "LAUNCH002")
    assert launch.knobs == {"compile": "reduce-overhead"}


LIBRARY_WRAPPER = '''
import functools
import torch

def capture(compile_fn):
    """Like Lightning's: wraps torch.compile after the watch, to remember the arguments."""
    @functools.wraps(compile_fn)
    def _capture(model=None, **kwargs):
        compiled = compile_fn(model, **kwargs)
        compiled.kwargs_seen = dict(kwargs)
        return compiled
    return _capture

def setup(compiled):
    """Like Fabric.setup: unwrap the script's compiled model, compile it again with its arguments."""
    return torch.compile(compiled.inner, **compiled.kwargs_seen)
'''


def test_the_knob_sees_through_a_librarys_wrapper_and_reaches_its_recompile(monkeypatch) -> None:
    """Lightning wraps torch.compile when it is imported (after the watch): the script's call then
    reaches the watch through library code, and is still the script's. Fabric.setup compiles the
    script's model again with the arguments it remembered: the knob applies there too; a library's
    compile of anything else is left alone."""
    calls: list[dict] = []

    class Compiled:
        def __init__(self, inner):
            self.inner = inner

    def recorder(model=None, **kwargs):
        calls.append(kwargs)
        return Compiled(model)

    monkeypatch.setattr(torch, "compile", recorder)
    torch_dir = os.path.dirname(torch.__file__)
    namespace: dict = {}
    exec(compile(LIBRARY_WRAPPER, os.path.join(torch_dir, "fake_framework.py"), "exec"), namespace)
    knobs, watch = _watched(["compile=reduce-overhead"], library=(torch_dir,))
    try:
        torch.compile = namespace["capture"](torch.compile)  # installed after the watch, as on import
        net, other = nn.Linear(2, 2), nn.Linear(2, 2)
        compiled = torch.compile(net, mode="default")
        assert compiled.kwargs_seen == {"mode": "default"}, "the library remembers the script's own arguments"
        again = namespace["setup"](compiled)
        stranger = Compiled(other)
        stranger.kwargs_seen = {}
        namespace["setup"](stranger)  # not the script's compiled model: left alone
    finally:
        watch.remove()
    assert again.inner is net
    assert calls == [{"mode": "reduce-overhead"}, {"mode": "reduce-overhead"}, {}]
    assert knobs.via() == {"compile": "the script's torch.compile(...) call"}
