"""The distance to the hardware limit through the report: the ``limits`` section, the view, the
terminal lines, the HTML roofline, the TensorBoard scalars, and the rules over it (MEM003 replaces
MEM002 when the OOM snapshot exists; NEXT002 speaks only when no problem fired)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

from diagnose.analysis.measure.breakdown import Breakdown
from diagnose.analysis.measure.categories import EXPOSED, PHASES
from diagnose.analysis.report import Report, build_report
from diagnose.analysis.symptoms import compute_symptoms
from diagnose.analysis.verdict.findings import diagnose_symptoms
from diagnose.analysis.verdict.rules import load_rules
from diagnose.record import DataLoaderInfo, RunRecord
from diagnose.renderers.html import HTMLRenderer
from diagnose.renderers.tensorboard import scalars
from diagnose.renderers.terminal import TerminalRenderer
from diagnose.renderers.view import ReportView
from tests.test_symptoms import LIMITS_GPU, LIMITS_OOM, LIMITS_RECORD_FIELDS, LIMITS_TINY_FIELDS

RULES = load_rules()


def _renderable(breakdown: Breakdown) -> Breakdown:
    """The symptom tests' breakdown with every step's exposed and phase times filled: the GPU
    busy with backward kernels the whole step."""
    steps = [
        replace(
            s,
            exposed={k: (s.duration_us if k == "gpu_backward" else 0.0) for k in EXPOSED},
            phases={p: (s.duration_us if p == "backward" else 0.0) for p in PHASES},
        )
        for s in breakdown.steps
    ]
    return replace(
        breakdown,
        steps=steps,
        exposed_share={k: (1.0 if k == "gpu_backward" else 0.0) for k in EXPOSED},
        phase_share={p: (1.0 if p == "backward" else 0.0) for p in PHASES},
        hidden_share={p: 0.0 for p in PHASES},
    )


GPU = _renderable(LIMITS_GPU)


def _report(record: RunRecord, breakdown: Breakdown | None = GPU) -> Report:
    symptoms = compute_symptoms(breakdown, record, None)
    report = build_report(
        record=record,
        meta=None,
        breakdown=breakdown,
        symptoms=symptoms,
        diagnosis=diagnose_symptoms(RULES, symptoms),
        source={"kind": "test"},
        limit=None,
    )
    return Report.from_dict(json.loads(report.to_json()))  # what report.json gives back


def test_limits_section_keeps_the_structure_and_the_symptoms_keep_the_scalars() -> None:
    report = _report(RunRecord(**LIMITS_RECORD_FIELDS))
    limits = report.limits
    assert limits["gpu"]["name"] == "H100 SXM" and limits["gpu"]["peak_tflops"]["bf16"] == 989.4
    assert limits["flops"]["per_step"] == 4.947e12 and limits["flops"]["dtype"] == "bf16"
    assert [k["class"] for k in limits["kernels"]] == ["matmul", "elementwise", "reduction"]
    assert limits["kernels"][0]["ms_per_step"] == 6.0
    bound = {p["class"]: p["bound"] for p in limits["roofline"]["points"]}
    assert bound == {"matmul": "compute", "elementwise": "memory", "reduction": "memory"}
    assert limits["memory_split"]["activations_bytes"] == 20e9 and limits["memory_split"]["largest_batch"] == 201
    assert limits is not None and "mfu" not in json.dumps(
        limits.to_dict()
    )  # each number once: MFU is the symptom flops.mfu
    assert report.symptom_value("flops.mfu") == 0.5


def test_view_terminal_and_tensorboard_show_mfu_and_memory_owners() -> None:
    report = _report(RunRecord(**LIMITS_RECORD_FIELDS))
    view = ReportView.from_report(report)
    assert view.limits is not None and view.limits.mfu == 0.5 and view.limits.roofline.ridge == 989.4e12 / 3350e9
    assert [m.owner for m in view.limits.memory][:4] == ["parameters", "gradients", "optimizer state", "activations"]
    text = TerminalRenderer(color=False, width=140).render(report)
    assert "MFU 50% · 494.7 TFLOP/s of 989 peak (bf16, H100 SXM)" in text
    assert "activations 20.0 GB" in text and "about 201 samples/step fit" in text
    tags = {tag: value for _, tag, value in scalars(report)}
    assert (
        tags["limits/mfu"] == 0.5
        and tags["limits/achieved_tflops"] == 494.7
        and tags["memory/activations_bytes"] == 20e9
    )


def test_html_roofline_puts_the_matmul_right_of_the_ridge_and_elementwise_under_the_memory_roof() -> None:
    html = HTMLRenderer().render(_report(RunRecord(**LIMITS_RECORD_FIELDS)))
    assert 'id="limits"' in html and "roofline" in html
    dots = {
        m.group(3): (float(m.group(1)), float(m.group(2)))
        for m in re.finditer(r'<circle[^>]*cx="([\d.]+)" cy="([\d.]+)"[^>]*data-class="(\w+)"', html)
    }
    assert set(dots) == {"matmul", "elementwise", "reduction"}
    roof = re.search(r'<polyline[^>]*points="([^"]+)"', html).group(1).split()
    ridge_x = float(roof[1].split(",")[0])
    assert dots["matmul"][0] > ridge_x > dots["elementwise"][0] and dots["reduction"][0] < ridge_x
    # higher TFLOP/s is higher on the page: smaller y
    assert dots["matmul"][1] < dots["reduction"][1] < dots["elementwise"][1]


def test_oom_report_explains_what_filled_the_memory() -> None:
    record = RunRecord(status="oom", memory={"capacity_bytes": 80e9}, memory_at_oom=LIMITS_OOM)
    report = _report(record, breakdown=None)
    ids = [f["rule"] for f in report.findings]
    assert "MEM003" in ids and "MEM002" not in ids  # one cause, one finding
    finding = report.findings[ids.index("MEM003")]
    assert "asking for 2.1 GB" in finding["says"] and "activations and batch 70.0 GB" in finding["says"]
    assert finding["says"].endswith("the largest owner: activations.")
    assert finding["do"].strip().startswith("# 1. a smaller batch")
    assert report.limits["oom"]["largest"] == "activations"


def test_low_mfu_is_a_next_step_only_when_nothing_else_fired() -> None:
    slow = dict(LIMITS_RECORD_FIELDS, timed_seconds=0.2)  # 10x slower: MFU 5%
    report = _report(RunRecord(**slow))
    fired = [f["rule"] for f in report.findings]
    nexts = [f["rule"] for f in report.next_steps]
    assert math.isclose(report.symptom_value("flops.mfu"), 0.05)
    assert fired == ["ATTN001", "PREC004"]  # problems fired: the next steps wait
    assert nexts == []
    quiet = dict(
        slow,
        flops=replace(
            slow["flops"],
            ops={k: v for k, v in slow["flops"].ops.items() if k != "aten._softmax"},
            matmuls=slow["flops"].matmuls[:1],
        ),
    )
    report = _report(RunRecord(**quiet))
    assert [f["rule"] for f in report.findings] == []
    next_step = next(f for f in report.next_steps if f["rule"] == "NEXT002")
    assert next_step["says"].startswith("MFU 5%: 49.5 TFLOP/s of this GPU's 989 TFLOP/s dense peak")
    assert "matmul 60% (compute-bound" in next_step["says"]


def test_tiny_batch_matmuls_ask_for_the_batch_that_fills_them_and_fits() -> None:
    fed = DataLoaderInfo(0, None, "D", 100_000, 16, 4, True, 2, False, False, 1, fetches_in_window=4)
    report = _report(RunRecord(**{**LIMITS_TINY_FIELDS, "dataloaders": [fed]}))
    ids = [f["rule"] for f in report.findings]
    assert "MEM004" in ids
    finding = report.findings[ids.index("MEM004")]
    assert "allow at most 5% of the GPU's compute peak" in finding["says"]
    # 512 rows would fill them; a suggestion grows the batch 8x at most (MAX_BATCH_FACTOR)
    assert "The step held 16 samples; about 896 fit in memory, and 128 fill the matmuls." in finding["says"]
    assert finding["do"].startswith("loader = DataLoader(dataset, batch_size=128, ...)   # was 16")
    assert finding["knobs"] == {"batch_size": "128"}
    # a script that builds its batches itself (no DataLoader fed the steps): no knob to set
    # and the same numbers for the script's own batch size, not a DataLoader's
    alone = next(f for f in _report(RunRecord(**LIMITS_TINY_FIELDS)).findings if f["rule"] == "MEM004")
    assert alone["knobs"] == {}
    assert alone["do"].startswith(
        "batch_size = 128   # was 16: the argument or variable the script builds each batch with"
    )
    assert "DataLoader(" not in alone["do"]
    # the 4096-row step of the other tests: its matmuls are compute-bound, no such finding
    assert "MEM004" not in [f["rule"] for f in _report(RunRecord(**LIMITS_RECORD_FIELDS)).findings]


def test_a_huge_number_of_samples_that_fit_is_written_in_words_not_in_exponent() -> None:
    """A small model on a large GPU: "about 1.19451e+09 samples/s" was printed where it means
    how many samples per step fit."""
    report = _report(RunRecord(**LIMITS_RECORD_FIELDS))
    report.symptoms["memory.largest_batch"]["value"] = 1.19451e9
    text = TerminalRenderer(color=False, width=140).render(report)
    html = HTMLRenderer().render(report)
    assert "about 1.19 billion samples/step fit (estimate)" in text
    assert "about 1.19 billion samples per step would fit" in html
    assert "e+0" not in text and "e+0" not in html
