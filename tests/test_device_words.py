"""Words fit the device the run used: a CPU-only run's findings never speak of a GPU (issue 18, item 4).

Every built-in rule is checked: either it cannot fire on a CPU-only run (one of its required
conditions reads a symptom such a run never has, or asks for ``gpu.present == 1``), or its
texts, as a CPU-only run shows them (``[on_cpu]`` where the rule has one), have no "GPU" in
them, rendered with its own firing examples' values made into a CPU run's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pytest

from diagnose.analysis.symptoms import DEFINITIONS, symptoms_from_values
from diagnose.analysis.symptoms.registry import Known
from diagnose.analysis.verdict.findings import Finding, diagnose_symptoms, make_finding
from diagnose.analysis.verdict.rules import Condition, Rule, load_rules, names_in
from diagnose.errors import RuleError

RULES = load_rules()
GPU_WORD = re.compile(r"\bGPU")

#: symptoms a CPU-only run lacks although their functions do not take the ``gpu`` input: they
#: read the CUDA caching allocator, the GPU peak table or torch's CUDA out-of-memory error
CUDA_RECORD_SYMPTOMS = frozenset(
    {
        "memory.peak_reserved_share",
        "memory.peak_allocated_share",
        "memory.capacity_gb",
        "memory.largest_batch",
        "flops.mfu",
        "flops.peak_tflops",
        "gpu.compute_capability",
        "memory.oom",
        "oom.allocated_gb",
        "oom.requested_gb",
        "oom.activations_gb",
        "oom.parameters_gb",
        "oom.gradients_gb",
        "oom.optimizer_gb",
        "oom.largest",
        "oom.changes",
    }
)
#: computed from the GPU's kernels and activity only
GPU_INPUT_SYMPTOMS = frozenset(d.name for d in DEFINITIONS if "gpu" in d.required)


def _derived_gpu_only() -> frozenset[str]:
    """Symptoms computed from others only, that come out absent when every symptom a CPU-only
    run has is there (``exposed.host_code`` needs ``exposed.launch``)."""
    absent = set(GPU_INPUT_SYMPTOMS | CUDA_RECORD_SYMPTOMS)
    values = {d.name: 1.0 for d in DEFINITIONS if d.name not in absent}
    values["gpu.present"] = 0.0
    for d in DEFINITIONS:
        if d.uses and not d.required and d.compute(known=Known(values, d)) is None:
            absent.add(d.name)
            values.pop(d.name, None)
    return frozenset(absent)


#: every symptom a CPU-only run never has
CPU_ABSENT = _derived_gpu_only()


def cpu_values(values: dict[str, float]) -> dict[str, float]:
    """A rule example's symptoms as a CPU-only run has them: no GPU, none of the GPU's own
    symptoms, and the symptoms computed from others recomputed from what is left."""
    out = {k: v for k, v in values.items() if k not in CPU_ABSENT}
    out["gpu.present"] = 0.0
    for d in DEFINITIONS:  # in the order of computation
        if d.uses and not d.required and d.name in out:
            value = d.compute(known=Known(out, d))
            if value is None:
                del out[d.name]
            else:
                out[d.name] = float(value)
    return out


def needs_a_gpu(condition: Condition) -> bool:
    _op, left, right = condition.tree
    names = names_in(left) | names_in(right)
    if names & CPU_ABSENT:
        return True
    return condition.text.replace(" ", "") in ("gpu.present==1", "gpu.present>=1", "gpu.present>0")


def cannot_fire_on_a_cpu(rule: Rule) -> bool:
    blocked = any(c.text.replace(" ", "") == "gpu.present==0" for c in rule.none_of)
    return (
        blocked
        or any(needs_a_gpu(c) for c in rule.all_of)
        or (bool(rule.any_of) and all(needs_a_gpu(c) for c in rule.any_of))
    )


def gpu_words(rule: Rule, values: dict[str, float]) -> list[str]:
    finding = make_finding(rule, symptoms_from_values(values))
    texts = {"title": finding.title, "says": finding.says, "why": finding.why, "do": finding.do}
    for framework, text in rule.do_by_framework.items():
        texts[f"do under {framework}"] = text
    return [f"{key}: {text!r}" for key, text in texts.items() if GPU_WORD.search(text)]


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_a_cpu_only_run_never_reads_of_a_gpu(rule: Rule) -> None:
    if cannot_fire_on_a_cpu(rule):
        for example in rule.examples:  # the static reading agrees with the rule's own examples
            assert not rule.fires(cpu_values(example.symptoms)), example.name
        return
    firing = [e for e in rule.examples if e.fires]
    for example in firing:
        values = cpu_values(example.symptoms)
        assert not gpu_words(rule, values), f"{rule.id} on a CPU run ({example.name}): {gpu_words(rule, values)}"


#: code a CPU run (gloo, no device) cannot run: DDP refuses device_ids there, NCCL needs GPUs
CUDA_CODE = re.compile(r"device_ids\s*=|\.cuda\(|torch\.cuda\.|backend\s*=\s*\"nccl\"|init_process_group\(\"nccl\"")


@pytest.mark.parametrize("rule", [r for r in RULES if not cannot_fire_on_a_cpu(r)], ids=lambda r: r.id)
def test_a_cpu_runs_advice_code_runs_on_a_cpu(rule: Rule) -> None:
    """DIST008 advised ``DistributedDataParallel(model, device_ids=[local_rank], ...)`` on a
    gloo run on the CPU, which DDP rejects."""
    for example in (e for e in rule.examples if e.fires):
        finding = make_finding(rule, symptoms_from_values(cpu_values(example.symptoms)))
        assert not CUDA_CODE.search(finding.do), f"{rule.id} ({example.name}): {finding.do!r}"


def test_the_rules_that_can_fire_on_a_cpu_are_the_ones_expected() -> None:
    """Guards the check above against passing by skipping everything."""
    can = {r.id for r in RULES if not cannot_fire_on_a_cpu(r)}
    assert {"DATA001", "DATA004", "DATA006", "DATA007", "EXPO001", "DIST002", "COMP001"} <= can
    assert {"LAUNCH001", "FUSE001", "PREC001", "MEM002", "EXPO004", "DIST001", "DIST004", "EXPO002"}.isdisjoint(can)


def test_a_gpu_run_keeps_the_gpu_words() -> None:
    rule = next(r for r in RULES if r.id == "DATA004")
    values = {"exposed.other_not_sync": 0.5, "exposed.host_other": 0.5, "phase.other": 0.55}
    gpu = make_finding(rule, symptoms_from_values({**values, "gpu.present": 1}))
    cpu = make_finding(rule, symptoms_from_values({**values, "gpu.present": 0}))
    assert "GPU" in gpu.title and "GPU" in gpu.says
    assert "GPU" not in cpu.title + cpu.says + cpu.why + cpu.do


def test_the_verdict_of_a_cpu_run_names_no_gpu() -> None:
    rule = next(r for r in RULES if r.id == "DATA001")
    values = {
        "gpu.present": 0,
        "exposed.data_wait": 0.5,
        "data.wait": 0.5,
        "phase.data_wait": 0.5,
        "dataloader.num_workers": 0,
        "cpu.count": 16,
        "suggest.num_workers": 4,
    }
    diagnosis = diagnose_symptoms([rule], symptoms_from_values(values))
    assert diagnosis.findings and not GPU_WORD.search(diagnosis.findings[0].title)


@dataclass
class BadCpuWords:
    table: str
    message: str


@pytest.mark.parametrize(
    "case",
    [
        BadCpuWords('[on_cpu]\nheadline = "x"', "unknown key 'headline'"),
        BadCpuWords('[on_cpu]\nsays = ""', "on_cpu.says must be a non-empty string"),
        BadCpuWords('[on_cpu]\nsays = "{exposed.dat_wait:%}"', "unknown symptom 'exposed.dat_wait'"),
        BadCpuWords('on_cpu = "CPU words"', "on_cpu must be a table"),
    ],
    ids=lambda c: c.message,
)
def test_on_cpu_texts_are_checked_at_load(tmp_path, case: BadCpuWords) -> None:
    path = tmp_path / "X001.toml"
    path.write_text(
        'id = "XTRA001"\ntitle = "t"\nsays = "s"\ndo = "d"\nwhy = "w"\n'
        f"{case.table}\n"
        '[when]\nall = ["exposed.data_wait >= 0.5"]\n'
        '[[examples]]\nsymptoms = { "exposed.data_wait" = 0.6 }\nfires = true\n'
        '[[examples]]\nsymptoms = { "exposed.data_wait" = 0.1 }\nfires = false\n'
    )
    with pytest.raises(RuleError, match=re.escape(case.message)):
        load_rules([path], include_builtin=False)


def preprocess_finding(values: dict[str, float]) -> tuple[Finding, dict[str, float]]:
    """DATA004's finding with ``suggest.preprocess_workers`` and its basis computed as a run does."""
    from diagnose.analysis.symptoms import dataloader

    known = dict(values)
    texts = {}
    for definition in (dataloader.suggested_preprocess_workers, dataloader.workers_basis):
        value = definition.compute(known=Known(known, definition))
        if isinstance(value, str):
            texts[definition.name] = value
        elif value is not None:
            known[definition.name] = float(value)
    symptoms = symptoms_from_values(known)
    symptoms.texts.update(texts)
    rule = next(r for r in RULES if r.id == "DATA004")
    return make_finding(rule, symptoms), known


SLOW_MAIN_THREAD = {
    "exposed.other_not_sync": 0.6,
    "exposed.host_other": 0.6,
    "phase.other": 0.6,
    "phase.data_wait": 0.05,
    "exposed.data_wait": 0.05,
    "dataloader.num_workers": 0,
}


@pytest.mark.parametrize("gpu_present", [0, 1])
def test_data004_suggests_no_more_workers_than_a_2_cpu_machine_has(gpu_present: int) -> None:
    finding, known = preprocess_finding({**SLOW_MAIN_THREAD, "cpu.count": 2, "gpu.present": gpu_present})
    assert known["suggest.preprocess_workers"] == 1  # 2 CPUs: one for the main process
    assert "num_workers=1" in finding.do and "num_workers=8" not in finding.do
    assert "2 CPUs" in finding.do


def test_data004_suggestion_grows_with_the_cpus_and_the_work_to_move() -> None:
    _, light = preprocess_finding(
        {**SLOW_MAIN_THREAD, "phase.other": 0.25, "exposed.other_not_sync": 0.25, "cpu.count": 64, "gpu.present": 1}
    )
    _, heavy = preprocess_finding({**SLOW_MAIN_THREAD, "cpu.count": 64, "gpu.present": 1})
    # (0.05 + 0.25) / 0.7 -> 1, +1 spare; (0.05 + 0.6) / 0.35 -> 2, +1 spare
    assert (light["suggest.preprocess_workers"], heavy["suggest.preprocess_workers"]) == (2, 3)
    # the workers' measured cost per batch replaces the estimate: 30 ms a batch against a 10 ms step
    _, measured = preprocess_finding(
        {
            **SLOW_MAIN_THREAD,
            "dataloader.num_workers": 2,
            "workers.cpu_per_batch_ms": 30.0,
            "step.time_ms": 10.0,
            "cpu.count": 64,
            "gpu.present": 1,
        }
    )
    assert measured["suggest.preprocess_workers"] == math.ceil((3.0 + 0.6) / 0.35) + 1


def test_data004_on_a_bare_trace_says_the_cpu_count_is_unknown() -> None:
    finding, known = preprocess_finding({**SLOW_MAIN_THREAD, "gpu.present": 1})
    assert "suggest.preprocess_workers" not in known
    assert "num_workers=N" in finding.do and "does not record" in finding.do
