"""Training frameworks: detection without imports, advice in their terms, knobs through their switches.

The unit tests use a stand-in framework module (a ``Watched`` entry pointing at a file written
into the test's folder), so they need none of the real frameworks. The end-to-end tests run
``python -m diagnose run`` on examples/ under the installed Lightning, transformers and
accelerate (CPU, ``--small``), with a rule of the test's own that always fires: whether a
built-in rule fires depends on timings, and the choice of text does not.
"""

from __future__ import annotations

import gzip
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from diagnose.analysis.symptoms import symptoms_from_values
from diagnose.analysis.verdict.findings import diagnose_symptoms, loop_framework
from diagnose.analysis.verdict.rules import load_rule_file, load_rules
from diagnose.errors import RuleError
from diagnose.experiments import describe_change, knobs_via
from diagnose.record import RunRecord
from diagnose.runtime import frameworkwatch
from diagnose.runtime.knobs import Knobs, framework_switch

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
FAST = ["--warmup", "2", "--steps", "4", "--timed-steps", "5"]

FAKE_FRAMEWORK = """
class Trainer:
    def __init__(self, precision="32-true", workers=0):
        self.precision = precision
        self.workers = workers
        self.inner = Inner()        # built by the framework, not by the user


class Inner:
    def __init__(self, mixed_precision="no"):
        self.mixed_precision = mixed_precision
"""


@pytest.fixture
def fake_framework(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``fakefw.trainer`` watched as Lightning's Trainer, its ``Inner`` as an Accelerator."""
    package = tmp_path / "fakefw"
    package.mkdir()
    (package / "__init__.py").write_text("__version__ = '9.9'\n")
    (package / "trainer.py").write_text(textwrap.dedent(FAKE_FRAMEWORK))
    monkeypatch.syspath_prepend(str(tmp_path))
    watched = (
        frameworkwatch.Watched("lightning", "fakefw", "fakefw.trainer", "Trainer", "__init__", "trainer"),
        frameworkwatch.Watched("accelerate", "fakefw", "fakefw.trainer", "Inner", "__init__", "accelerator"),
    )
    monkeypatch.setattr(frameworkwatch, "WATCHED", watched)
    monkeypatch.setitem(frameworkwatch.SETTINGS, ("lightning", "trainer"), ("precision", "workers"))
    yield
    for name in ("fakefw.trainer", "fakefw"):
        sys.modules.pop(name, None)


def _here() -> str | None:
    """The user's line, as the runner finds it: the innermost frame of this test file."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename != __file__:
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else None


def test_a_framework_imported_after_install_is_watched_and_given_back(fake_framework) -> None:
    watch = frameworkwatch.FrameworkWatch(_here)
    watch.install()
    try:
        assert "fakefw.trainer" not in sys.modules, "installing imports nothing"
        module = importlib.import_module("fakefw.trainer")
        trainer = module.Trainer(precision="bf16-mixed")
        line = sys._getframe().f_lineno - 1
    finally:
        watch.remove()
    assert [(f.framework, f.role, f.cls, f.version) for f in watch.seen] == [("lightning", "trainer", "Trainer", "9.9")]
    info = watch.seen[0]
    assert info.created_at == f"{__file__}:{line}"
    assert info.code == 'trainer = module.Trainer(precision="bf16-mixed")'
    assert info.settings == {"precision": "bf16-mixed", "workers": 0}
    assert trainer.inner.mixed_precision == "no"  # built inside the Trainer: neither recorded nor changed
    assert "__wrapped__" not in vars(module.Trainer.__init__), "remove() gives the original back"
    assert not any(isinstance(f, frameworkwatch._ImportHook) for f in sys.meta_path)


def test_an_already_imported_framework_is_patched_at_once_and_knobs_take_its_switch(fake_framework) -> None:
    module = importlib.import_module("fakefw.trainer")
    knobs = Knobs.parse(["autocast=bf16", "num_workers=3"])
    asked: list[tuple[str, str]] = []

    def hook(framework: str, role: str, settings: object) -> dict[str, str]:
        asked.append((framework, role))
        return knobs.framework_changes(framework, role, settings)

    watch = frameworkwatch.FrameworkWatch(_here, hook)
    watch.install()
    try:
        trainer = module.Trainer("32-true")  # positional: bound to its parameter, then changed
    finally:
        watch.remove()
    assert trainer.precision == "bf16-mixed"
    assert trainer.workers == 0, "num_workers has no Lightning Trainer switch: it goes through DataLoader"
    assert asked == [("lightning", "trainer")]
    assert watch.seen[0].knobs_applied == {"autocast": 'Trainer(precision="bf16-mixed")'}
    assert knobs.via() == {"autocast": 'Trainer(precision="bf16-mixed")', "num_workers": "DataLoader(num_workers=...)"}


FAKE_FABRIC = """
class _Precision:
    def __init__(self, precision):
        self.precision = precision


class _Strategy:
    def __init__(self, precision):
        self.precision = _Precision(precision)


class Fabric:
    def __init__(self, *, accelerator="auto", precision=None):
        self.strategy = _Strategy(precision or "32-true")
        self.world_size = 1

    def setup(self, module, *optimizers):
        return module

    def backward(self, tensor):
        tensor.backward()
"""


def test_fabric_is_recorded_with_its_setup_its_precision_switch_and_a_marked_backward(
    tmp_path: Path, monkeypatch
) -> None:
    """A stand-in for ``lightning.fabric.fabric``: the construction is recorded with the precision
    its plugin holds, autocast takes ``Fabric(precision=...)``, ``setup`` names the user's model
    and line, and ``backward`` runs inside a ``diagnose#backward`` annotation."""
    import torch

    (tmp_path / "fakefabric.py").write_text(textwrap.dedent(FAKE_FABRIC))
    monkeypatch.syspath_prepend(str(tmp_path))
    watched = tuple(
        frameworkwatch.Watched("fabric", "fakefabric", "fakefabric", "Fabric", method, role)
        for method, role in (("__init__", "fabric"), ("setup", "setup"), ("backward", "backward"))
    )
    monkeypatch.setattr(frameworkwatch, "WATCHED", watched)
    knobs = Knobs.parse(["autocast=bf16"])
    watch = frameworkwatch.FrameworkWatch(_here, knobs.framework_changes)
    watch.install()
    try:
        module = importlib.import_module("fakefabric")
        fabric = module.Fabric(accelerator="cpu")
        model = fabric.setup(torch.nn.Linear(2, 1))
        setup_line = sys._getframe().f_lineno - 1
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fabric.backward(model(torch.randn(4, 2)).sum())
    finally:
        watch.remove()
        sys.modules.pop("fakefabric", None)
    (info,) = watch.seen
    assert (info.framework, info.role, info.cls) == ("fabric", "fabric", "Fabric")
    assert info.settings == {"precision": "bf16-mixed", "world_size": 1, "module": "Linear"}
    assert info.sites == {"setup": f"{__file__}:{setup_line}"}
    assert info.knobs_applied == {"autocast": 'Fabric(precision="bf16-mixed")'} == knobs.via()
    assert "diagnose#backward" in [e.name for e in prof.events()]
    assert model.weight.grad is not None, "the backward itself ran"
    assert "__wrapped__" not in vars(module.Fabric.backward), "remove() gives the original back"


def test_installing_the_watch_imports_no_framework() -> None:
    code = (
        "import sys; from diagnose.runtime.frameworkwatch import FrameworkWatch; w = FrameworkWatch(lambda: None); "
        "w.install(); import torch; w.remove(); "
        "print([m for m in ('lightning', 'pytorch_lightning', 'transformers', 'accelerate') if m in sys.modules])"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_framework_switches_per_knob() -> None:
    assert framework_switch("autocast", "bf16", "lightning", "trainer", True) == {"precision": "bf16-mixed"}
    assert framework_switch("autocast", "off", "lightning", "trainer", True) == {"precision": "32-true"}
    assert framework_switch("cudnn_benchmark", True, "lightning", "trainer", True) == {"benchmark": True}
    assert framework_switch("autocast", "bf16", "hf_trainer", "arguments", True) == {"bf16": True, "fp16": False}
    assert framework_switch("autocast", "bf16", "hf_trainer", "arguments", False) == {
        "bf16": True,
        "fp16": False,
        "use_cpu": True,
    }
    assert framework_switch("num_workers", 6, "hf_trainer", "arguments", True) == {"dataloader_num_workers": 6}
    assert framework_switch("batch_size", 64, "hf_trainer", "arguments", True) == {"per_device_train_batch_size": 64}
    assert framework_switch("compile", "reduce-overhead", "hf_trainer", "arguments", True) == {
        "torch_compile": True,
        "torch_compile_mode": "reduce-overhead",
    }
    assert framework_switch("autocast", "bf16", "accelerate", "accelerator", True) == {"mixed_precision": "bf16"}
    assert framework_switch("autocast", "bf16", "fabric", "fabric", False) == {"precision": "bf16-mixed"}
    assert (
        framework_switch("compile", "reduce-overhead", "fabric", "fabric", True) is None
    )  # the script's own compile call
    assert framework_switch("tf32", True, "hf_trainer", "arguments", True) is None  # global flag
    assert framework_switch("num_workers", 4, "lightning", "trainer", True) is None  # the user's DataLoader


# --- rules and findings ---------------------------------------------------------------------------


DATA_BOUND = {
    "exposed.data_wait": 0.6,
    "data.wait": 0.6,
    "phase.data_wait": 0.6,
    "dataloader.num_workers": 0,
    "cpu.count": 16,
    "suggest.num_workers": 4,
    "workers.saturated": 1,
}
FP32_BOUND = {
    "gpu.fp32_matmul_step_share": 0.7,
    "gpu.fp32_matmul_share": 0.95,
    "gpu.busy": 0.97,
    "gpu.compute_capability": 9.0,
}


def _finding(rule_id: str, values: dict[str, float], texts: dict[str, str] | None = None):
    symptoms = symptoms_from_values(values)
    symptoms.texts = texts or {}
    return next((f for f in diagnose_symptoms(load_rules(), symptoms).findings if f.rule_id == rule_id), None)


def test_the_change_is_written_in_the_frameworks_terms_and_the_where_line_starts_at_its_config() -> None:
    texts = {
        "lines.framework": "train.py:40 `args = TrainingArguments(` (TrainingArguments 5.23.0)",
        "lines.data": "train.py:12 `return tokenize(text)` (30% of the step)",
    }
    hf = _finding("DATA001", {**DATA_BOUND, "framework.hf_trainer": 1}, texts)
    assert hf is not None and hf.framework == "hf_trainer"
    assert "TrainingArguments(..., dataloader_num_workers=4," in hf.do and "dataloader_persistent_workers=True" in hf.do
    assert hf.lines == texts["lines.framework"] + "; " + texts["lines.data"]
    plain = _finding("DATA001", {**DATA_BOUND, "framework.hf_trainer": 0}, texts)
    assert plain is not None and plain.framework is None
    assert plain.do.startswith("loader = DataLoader(") and plain.lines == texts["lines.data"]
    # Lightning's DataLoader is the user's own: the plain text is the framework user's text too
    lightning = _finding("DATA001", {**DATA_BOUND, "framework.lightning": 1}, texts)
    assert lightning is not None and lightning.framework is None and lightning.do.startswith("loader = DataLoader(")
    for framework, change in (
        ("lightning", 'Trainer(..., precision="bf16-mixed")'),
        ("hf_trainer", "TrainingArguments(..., bf16=True)"),
        ("accelerate", 'Accelerator(mixed_precision="bf16")'),
    ):
        finding = _finding("PREC001", {**FP32_BOUND, f"framework.{framework}": 1, "framework.mixed_precision": 0})
        assert finding is not None and change in finding.do and "torch.autocast" not in finding.do, framework


def test_a_frameworks_own_mixed_precision_stops_the_autocast_advice() -> None:
    assert _finding("PREC001", FP32_BOUND) is not None, "a bare trace (no framework symptoms) still gets it"
    assert _finding("PREC001", {**FP32_BOUND, "framework.hf_trainer": 1, "framework.mixed_precision": 1}) is None


def test_loop_framework_prefers_the_loops_owner() -> None:
    assert loop_framework({"framework.hf_trainer": 1, "framework.accelerate": 1}) == "hf_trainer"
    assert loop_framework({"framework.lightning": 0}) is None


def _rule_file(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "X001.toml"
    path.write_text(
        textwrap.dedent("""
        id = "XX001"
        title = "t"
        why = "w"
        says = "s"
        do = "plain"
        """)
        + textwrap.dedent(extra)
        + textwrap.dedent("""
        [[examples]]
        symptoms = { "gpu.busy" = 0.9 }
        fires = true
        [[examples]]
        symptoms = { "gpu.busy" = 0.1 }
        fires = false
        """)
    )
    return path


def test_rule_files_check_do_by_framework_and_when_none(tmp_path: Path) -> None:
    rule = load_rule_file(
        _rule_file(
            tmp_path,
            """
        [do_by_framework]
        hf_trainer = "TrainingArguments(bf16=True)  # {suggest.num_workers}"
        [when]
        all = ["gpu.busy >= 0.5"]
        none = ["framework.mixed_precision == 1"]
        """,
        )
    )
    assert rule.do_for("hf_trainer") == ("TrainingArguments(bf16=True)  # {suggest.num_workers}", "hf_trainer")
    assert rule.do_for("lightning") == ("plain", None) and rule.do_for(None) == ("plain", None)
    assert rule.fires({"gpu.busy": 0.9}) and not rule.fires({"gpu.busy": 0.9, "framework.mixed_precision": 1})
    with pytest.raises(RuleError, match="unknown framework 'keras'"):
        load_rule_file(_rule_file(tmp_path, '[do_by_framework]\nkeras = "x"\n[when]\nall = ["gpu.busy >= 0.5"]\n'))
    with pytest.raises(RuleError, match="unknown symptom"):
        load_rule_file(
            _rule_file(tmp_path, '[do_by_framework]\nlightning = "{no.such}"\n[when]\nall = ["gpu.busy >= 0.5"]\n')
        )


def test_verify_names_the_way_each_knob_went(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"knobs_via": {"autocast": "TrainingArguments(bf16=True)"}}))
    via = knobs_via(tmp_path)
    assert describe_change({"autocast": "bf16"}, via) == "autocast=bf16 via TrainingArguments(bf16=True)"
    assert knobs_via(tmp_path / "missing") == {}


# --- end to end, on the installed frameworks ------------------------------------------------------

ALWAYS_RULE = """
id = "FWTEST001"
title = "Test rule: always fires"
why = "checks the choice of text"
says = "framework test"
do = "plain PyTorch change"
quote = "lines.model"
knob = { autocast = "bf16" }

[do_by_framework]
lightning = "LIGHTNING CHANGE"
hf_trainer = "HF CHANGE"
fabric = "FABRIC CHANGE"
accelerate = "ACCELERATE CHANGE"

[when]
all = ["step.profiled >= 1"]

[[examples]]
symptoms = { "step.profiled" = 3 }
fires = true

[[examples]]
symptoms = { "step.profiled" = 0 }
fires = false
"""

CASES = [
    (
        "lightning_fp32.py",
        "lightning",
        "Trainer",
        "precision",
        "bf16-mixed",
        'Trainer(precision="bf16-mixed")',
        "LIGHTNING CHANGE",
    ),
    (
        "hf_trainer_workers.py",
        "hf_trainer",
        "TrainingArguments",
        "bf16",
        True,
        "TrainingArguments(bf16=True, fp16=False, use_cpu=True)",
        "HF CHANGE",
    ),
    (
        "accelerate_fp32.py",
        "accelerate",
        "Accelerator",
        "mixed_precision",
        "bf16",
        'Accelerator(mixed_precision="bf16")',
        "ACCELERATE CHANGE",
    ),
    (
        "fabric_fp32.py",
        "fabric",
        "Fabric",
        "precision",
        "bf16-mixed",
        'Fabric(precision="bf16-mixed")',
        "FABRIC CHANGE",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("script, framework, cls, setting, value, via, change", CASES, ids=[c[1] for c in CASES])
def test_diagnose_run_under_the_framework(
    tmp_path: Path, script: str, framework: str, cls: str, setting: str, value: object, via: str, change: str
) -> None:
    pytest.importorskip(
        {"lightning": "lightning", "hf_trainer": "transformers", "accelerate": "accelerate", "fabric": "lightning"}[
            framework
        ]
    )
    import torch

    if framework == "hf_trainer" and torch.cuda.is_available():
        via = "TrainingArguments(bf16=True, fp16=False)"  # use_cpu only where there is no GPU
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "FWTEST001.toml").write_text(ALWAYS_RULE)
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        # --no-check: the rule always fires without a prediction, and a check would measure its
        # knob (set already: no effect) and leave it out; this test reads its text
        [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--quiet",
            "--json",
            "--no-check",
            "--out",
            str(out),
            "--rules",
            str(rules),
            *FAST,
            "--set",
            "autocast=bf16",
            str(EXAMPLES / script),
            "--",
            "--small",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = RunRecord.load(out / "diagnose" / "run.json")
    assert record.status in ("stopped", "completed") and record.completed_steps() >= 8
    assert record.loop_framework() == framework
    info = next(f for f in record.frameworks if f.cls == cls)
    assert info.version and info.created_at is not None and info.created_at.startswith(str(EXAMPLES / script) + ":")
    assert cls + "(" in info.code
    # the knob took the framework's own switch, and the framework ran with it
    assert info.settings[setting] == value
    assert record.knobs_via == {"autocast": via} and info.knobs_applied == {"autocast": via}
    report = json.loads(proc.stdout)
    finding = next(f for f in report["findings"] if f["rule"] == "FWTEST001")
    assert finding["do"] == change and finding["framework"] == framework
    assert finding["lines"].startswith(f"{script}:"), "the where line starts at the user's framework object"
    if framework == "lightning":
        assert f"{script}:" in finding["lines"].split(";")[1] and "TokenClassifier.training_step" in finding["lines"]
    if framework == "fabric":
        assert f"{script}:" in finding["lines"].split(";")[1] and "(fabric.setup(Sequential))" in finding["lines"]
        # fabric.backward was annotated as the backward pass, and the annotation is in the trace
        (trace,) = out.glob("*.pt.trace.json*")
        opened = gzip.open(trace, "rt") if trace.suffix == ".gz" else trace.open()  # noqa: SIM115 - the with below closes it
        with opened as f:
            assert '"diagnose#backward"' in f.read()


FABRIC_COMPILED = """
import torch
from lightning.fabric import Fabric          # Lightning wraps torch.compile as it is imported
from torch import nn

fabric = Fabric(accelerator="cpu", devices=1)
model = torch.compile(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)), backend="eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = fabric.setup(model, optimizer)   # compiles the model again, with the same arguments
x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
for step in range(40):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    fabric.backward(loss)
    optimizer.step()
"""


@pytest.mark.slow
def test_the_compile_knob_reaches_a_fabric_scripts_own_compile(tmp_path: Path) -> None:
    """Under Fabric the script's torch.compile call passes through Lightning's own wrapper, and
    fabric.setup compiles the model again: both run in the knob's mode, and verify says the
    script's call carried it."""
    pytest.importorskip("lightning")
    script = tmp_path / "fabric_compiled.py"
    script.write_text(FABRIC_COMPILED)
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--quiet",
            "--json",
            "--out",
            str(out),
            *FAST,
            "--set",
            "compile=max-autotune",
            str(script),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = RunRecord.load(out / "diagnose" / "run.json")
    assert record.loop_framework() == "fabric"
    assert record.knobs_via == {"compile": "the script's torch.compile(...) call"}
    calls = record.compile["calls"]
    assert [c["mode"] for c in calls] == ["max-autotune", "max-autotune"], "the script's call, then setup's"
    assert calls[0]["site"].endswith("fabric_compiled.py:7")
