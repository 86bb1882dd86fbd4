"""The training framework the loop runs under (the run record's ``frameworks``): which one, whether
its own mixed precision is on, and the user's lines that configure it (quoted in ``where``)."""

from __future__ import annotations

from diagnose.analysis.symptoms.lines import _short
from diagnose.analysis.symptoms.registry import symptom
from diagnose.record import FrameworkInfo, RunRecord

#: how each framework's objects are named in a ``where`` line, in the order they are quoted
OBJECTS = {
    "lightning": (("trainer", "Lightning Trainer"),),
    "hf_trainer": (("arguments", "TrainingArguments"), ("trainer", "HF Trainer")),
    "fabric": (("fabric", "Fabric"),),
    "accelerate": (("accelerator", "Accelerator"),),
}


@symptom("framework.lightning", "bool", "the loop runs under PyTorch Lightning's Trainer")
def lightning(record: RunRecord) -> bool:
    return record.loop_framework() == "lightning"


@symptom("framework.hf_trainer", "bool", "the loop runs under the Hugging Face Trainer")
def hf_trainer(record: RunRecord) -> bool:
    return record.loop_framework() == "hf_trainer"


@symptom(
    "framework.fabric", "bool", "the loop is the user's own under Lightning Fabric (fabric.setup, fabric.backward)"
)
def fabric(record: RunRecord) -> bool:
    return record.loop_framework() == "fabric"


@symptom(
    "framework.accelerate",
    "bool",
    "the loop runs under accelerate's Accelerator (not inside Lightning or the HF Trainer)",
)
def accelerate(record: RunRecord) -> bool:
    return record.loop_framework() == "accelerate"


def _loop_objects(record: RunRecord) -> list[FrameworkInfo]:
    loop = record.loop_framework()
    return [f for f in record.frameworks if f.framework == loop]


def _mixed_precision(info: FrameworkInfo) -> bool:
    s = info.settings
    if info.role in ("trainer", "fabric") and info.framework in (
        "lightning",
        "fabric",
    ):  # "bf16-mixed", "16-mixed", "bf16-true"
        return "16" in str(s.get("precision", ""))
    if info.role == "arguments":
        return bool(s.get("bf16") or s.get("fp16"))
    if info.role == "accelerator":
        return str(s.get("mixed_precision", "no")) not in ("no", "None", "")
    return False


@symptom(
    "framework.mixed_precision",
    "bool",
    'the framework\'s own mixed-precision switch is on (Trainer or Fabric precision="bf16-mixed", TrainingArguments(bf16=True), Accelerator(mixed_precision="bf16"))',
)
def mixed_precision(record: RunRecord) -> bool | None:
    objects = _loop_objects(record)
    return any(_mixed_precision(f) for f in objects) if objects else None


@symptom(
    "lines.framework",
    "text",
    "the user's framework objects: the Trainer, TrainingArguments, Fabric or Accelerator line, and the user's training_step or fabric.setup",
)
def framework_lines(record: RunRecord) -> str | None:
    loop = record.loop_framework()
    if loop is None:
        return None
    objects = _loop_objects(record)
    quoted = []
    for role, label in OBJECTS[loop]:
        info = next((f for f in objects if f.role == role), None)
        if info is None or not info.created_at:
            continue
        name = f"{label} {info.version}" if info.version else label
        quoted.append(
            f"{_short(info.created_at)} `{info.code}` ({name})" if info.code else f"{_short(info.created_at)} ({name})"
        )
        step = info.sites.get("training_step")
        module = info.settings.get("module")
        if step:
            quoted.append(f"{_short(step)} ({module + '.' if module else ''}training_step)")
        setup = info.sites.get("setup")
        if setup:  # Fabric: where the user's model is handed over
            quoted.append(f"{_short(setup)} (fabric.setup({module or 'model'}))")
    return "; ".join(quoted) or None
