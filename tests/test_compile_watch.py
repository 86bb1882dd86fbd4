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
from diagnose.runtime.instrument import first_user_frame, is_generated
from diagnose.runtime.marks import PhaseMarks
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
    later = [metric("forward", "0/1: tensor 'x' size mismatch at index 0. expected 16, actual 24"),
             metric("forward", "0/2: tensor 'x' size mismatch at index 0. expected 24, actual 25")]
    metrics = list(warm)
    monkeypatch.setattr(compilewatch, "_compilation_metrics", lambda: list(metrics))
    monkeypatch.setattr(compilewatch, "_counters", lambda: {
        "stats": {"unique_graphs": 4},
        "graph_break": {"Unsupported Tensor.item() call with capture_scalar_outputs=False\n  Explanation: ...": 3},
    })
    watch = CompileWatch()
    watch.calls.append({"api": "torch.compile", "target": "GPT", "mode": "default", "cudagraphs": False})
    watch.window_opened()
    metrics.extend(later)
    summary = watch.summary()
    assert summary["graph_breaks"] == [{"reason": "Unsupported Tensor.item() call with capture_scalar_outputs=False", "count": 3}]
    assert summary["graph_break_sites"] == [{"site": "/w/model.py:24", "count": 1, "code": ""}]
    assert summary["compiles_after_warmup"] == 2
    assert summary["recompile_reasons"] == [{
        "reason": "tensor 'x' size mismatch at index 0. expected 16, actual 24",
        "site": "/w/model.py:10", "function": "forward", "count": 2,
    }]
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
    code = compile("def call(look):\n    return look(sys._getframe())\n", "/tmp/torchinductor_me/cb/cbvy3rog.py", "exec")
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
        [sys.executable, "-m", "diagnose", "run", "--warmup", "2", "--steps", "2", "--timed-steps", "2", "-o", str(out), "--json", "-q", str(script)],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((out / "diagnose" / "run.json").read_text())
    compiled = record["compile"]
    assert compiled["enabled"] and compiled["modes"] == ["default"]
    assert compiled["calls"][0]["target"] == "TinyNet" and compiled["calls"][0]["site"].endswith("compiled_break.py:39")
    assert "Tensor.item()" in compiled["graph_breaks"][0]["reason"]
    assert any(s["site"].endswith("compiled_break.py:26") for s in compiled["graph_break_sites"])
    lines = record["host_samples"].get("lines", [])
    assert all("torchinductor" not in x["site"] for x in lines)
    report = json.loads(result.stdout)
    comp = [f for f in report["findings"] if f["rule"] == "COMP001"]
    assert comp and "Tensor.item()" in comp[0]["says"] and "compiled_break.py:26" in comp[0]["lines"]
