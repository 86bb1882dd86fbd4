"""The renderers' view of a report: exact rows from a hand-made report, the straggler flag from
the DIST003 finding, and a schema 1 report.json read and rendered as the version that wrote it."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from diagnose.analysis.measure.categories import EXPOSED, PHASES
from diagnose.analysis.pipeline import AnalysisOptions
from diagnose.analysis.report import REPORT_SCHEMA, Report
from diagnose.record import RunRecord, WindowPlan
from diagnose.renderers.markdown import MarkdownRenderer
from diagnose.renderers.terminal import TerminalRenderer
from diagnose.renderers.view import (
    EvidenceRow,
    ExposedRow,
    GpuCounters,
    PhaseRow,
    ReportView,
    Segment,
)
from diagnose.report import Straggler, Timing
from diagnose.rundir import RunDir
from diagnose.session import analyze_run
from tests.conftest import DATA
from tests.recordbuilder import record_from_steps, report_of_record

#: Two GPU steps of 10 and 12 ms; the window's shares are the symptoms' (as schema 2 keeps them).
EXPOSED_MS = [
    {"data_wait": 4.0, "gpu_forward": 3.0, "gpu_backward": 3.0},
    {"data_wait": 6.0, "gpu_forward": 3.0, "gpu_backward": 3.0},
]
SHARES = {"data_wait": 0.45, "gpu_forward": 0.27, "gpu_backward": 0.2796, "sync": 0.0004}
PHASE_SHARES = {"data_wait": 0.45, "forward": 0.3, "backward": 0.25}


def _step(number: int, exposed: dict[str, float]) -> dict[str, Any]:
    duration = sum(exposed.values())
    return {
        "number": number,
        "start_us": 0,
        "duration_ms": duration,
        "exposed_ms": {cat: exposed.get(cat, 0.0) for cat in EXPOSED},
        "phases_ms": {
            p: {"data_wait": exposed["data_wait"], "forward": 3.0, "backward": 3.0}.get(p, 0.0) for p in PHASES
        },
        "gpu_busy_ms": 6.0,
        "kernels": 40,
        "median_kernel_us": 12.5,
        "h2d_pageable_bytes": 0,
        "h2d_pinned_bytes": 2048,
        "h2d_copies": 1,
        "d2h_bytes": 0,
        "syncs": 0,
        "sync_blocked_ms": 0.0,
    }


def _symptom(value: float, unit: str = "share", description: str = "") -> dict[str, Any]:
    return {"value": value, "unit": unit, "description": description}


def _stat(mean_ms: float) -> dict[str, float]:
    """A table row's statistics: the mean, and a spread of 10% either side."""
    return {"mean_ms": mean_ms, "p10_ms": round(mean_ms * 0.9, 4), "p90_ms": round(mean_ms * 1.1, 4)}


def hand_made() -> dict[str, Any]:
    symptoms = {f"exposed.{cat}": _symptom(SHARES.get(cat, 0.0)) for cat in EXPOSED}
    symptoms |= {f"phase.{p}": _symptom(PHASE_SHARES.get(p, 0.0)) for p in PHASES}
    symptoms |= {f"hidden.{p}": _symptom(0.1 if p == "forward" else 0.0) for p in PHASES}
    symptoms |= {
        "gpu.busy": _symptom(0.55),
        "gpu.kernels_per_step": _symptom(40, "count"),
        "gpu.median_kernel_us": _symptom(12.5, "us"),
        "h2d.pageable_bytes_per_step": _symptom(0, "bytes"),
        "sync.per_step": _symptom(0, "count"),
        "dataloader.num_workers": _symptom(0, "count", "DataLoader worker processes"),
        "dist.straggler_data_ms": _symptom(6.24, "ms", "the straggler's data wait"),
    }
    return {
        "schema": REPORT_SCHEMA,
        "created_at": "2026-01-01T00:00:00+00:00",
        "source": {"kind": "run", "run_dir": "runs/train"},
        "status": {"state": "stopped", "exit_code": 0, "message": "diagnose stopped the script", "error": None},
        "run": {"target": {"kind": "script", "value": "/home/me/train.py", "args": []}, "step_mode": "optimizer"},
        "environment": {
            "device": "cuda",
            "device_name": "NVIDIA H200",
            "torch": "2.13.0",
            "python": "3.11.7",
            "cpu_count": 16,
        },
        "dataloader": {"num_workers": 0, "pin_memory": False, "batch_size": 64, "created_at": "train.py:12"},
        "optimizers": [{"name": "AdamW", "param_tensors": 6, "implementation": "foreach"}],
        "throughput": {
            "batch_size": 64,
            "profiled": {
                "steps": 2,
                "median_step_ms": 11.0,
                "p90_step_ms": 12.0,
                "mean_step_ms": 11.0,
                "steps_per_s": 90.9,
                "samples_per_s": 5818.2,
            },
            "steady": {"steps": 0},
        },
        "memory": {
            "peak_allocated_bytes": 5e9,
            "peak_reserved_bytes": 6e9,
            "capacity_bytes": 8e10,
            "peak_reserved_share": 0.075,
        },
        "breakdown": {
            "device": "cuda",
            "median_step_timeline": None,
            "steps": [_step(5, EXPOSED_MS[0]), _step(6, EXPOSED_MS[1])],
            "window": {
                "total_ms": 22.0,
                "median_step_ms": 11.0,
                "trace_exposed_share": None,
                "profiler_inflation": None,
                "per_step": {
                    "statistic": "mean",
                    "spread": "p10-p90",
                    "exposed_basis": "profiled",
                    "exposed_step_ms": 11.0,
                    "phase_step_ms": 11.0,
                    "exposed": {cat: _stat(SHARES.get(cat, 0.0) * 11.0) for cat in EXPOSED},
                    "phases": {p: _stat(PHASE_SHARES.get(p, 0.0) * 11.0) for p in PHASES},
                },
                "h2d_pinned_bytes_per_step": 2048,
            },
        },
        "symptoms": symptoms,
        "verdict": "Input pipeline starves the GPU (up to 1.82x faster).",
        "findings": [
            {
                "rule": "DATA001",
                "title": "Input pipeline starves the GPU",
                "says": "Waiting for data is 45% of each step.",
                "do": "DataLoader(..., num_workers=8)",
                "gain_bound": 1.8182,
                "evidence": ["exposed.data_wait", "dataloader.num_workers"],
            }
        ],
        "distributed": {
            "world_size": 2,
            "ranks": [
                {"rank": 0, "status": "stopped", "data_wait_ms": 1.75},
                {"rank": 1, "status": "stopped", "data_wait_ms": 6.24},
            ],
            "straggler": {"rank": 1, "data_wait_ms": 6.24, "others_data_wait_ms": 1.75, "excess_share": 0.48},
        },
    }


def test_rows_of_a_hand_made_report() -> None:
    view = ReportView.from_report(Report.from_dict(hand_made()))
    assert (view.name, view.device, view.versions) == ("train.py", "NVIDIA H200", ("torch 2.13.0", "Python 3.11.7"))
    assert view.status.ok and view.status.step_mode == "optimizer step"
    assert view.throughput.steady is None  # no timed step: no steady figures
    assert view.throughput.profiled == Timing(
        steps=2, median_step_ms=11.0, p90_step_ms=12.0, mean_step_ms=11.0, steps_per_s=90.9, samples_per_s=5818.2
    )
    breakdown = view.breakdown
    assert breakdown is not None and breakdown.on_gpu
    assert [row.number for row in breakdown.steps] == [5, 6]
    assert breakdown.listed == (
        ExposedRow("data_wait", "waiting for data (DataLoader)", 4.95, 4.455, 5.445, 0.45, listed=True, present=True),
        ExposedRow("gpu_forward", "GPU: forward kernels", 2.97, 2.673, 3.267, 0.27, listed=True, present=True),
        ExposedRow("gpu_backward", "GPU: backward kernels", 3.0756, 2.768, 3.3832, 0.2796, listed=True, present=True),
    )
    # under half a permille: not listed, and no step has time in it
    assert (
        ExposedRow(
            "sync", "host-GPU syncs (.item(), .cpu(), ...)", 0.0044, 0.004, 0.0048, 0.0004, listed=False, present=False
        )
        in breakdown.exposed
    )
    assert breakdown.phases[:3] == (
        PhaseRow("data_wait", "data wait", 4.95, 4.455, 5.445, 0.45, 0.0),
        PhaseRow("h2d_copy", "host-to-device copy", 0.0, 0.0, 0.0, 0.0, 0.0),
        PhaseRow("forward", "forward", 3.3, 2.97, 3.63, 0.3, 0.1),
    )
    assert (breakdown.exposed_basis, breakdown.exposed_step_ms, breakdown.phase_step_ms) == ("profiled", 11.0, 11.0)
    assert breakdown.gpu == GpuCounters(0.55, 40, 12.5, 0, 2048, 0)
    median = breakdown.median_step  # steps of 10 and 12 ms: the lower median is step 5
    assert (median.number, median.duration_ms, median.in_time_order) == (5, 10.0, False)
    assert median.exposed == (
        Segment("exposed", "data_wait", "waiting for data (DataLoader)", 4.0),
        Segment("exposed", "gpu_forward", "GPU: forward kernels", 3.0),
        Segment("exposed", "gpu_backward", "GPU: backward kernels", 3.0),
    )
    (finding,) = view.findings
    assert view.evidence(finding) == (
        EvidenceRow("exposed.data_wait", 0.45, "share", "45%", ""),
        EvidenceRow("dataloader.num_workers", 0, "count", "0", "DataLoader worker processes"),
    )
    assert view.ranks is not None and view.ranks.straggler is None  # DIST003 did not fire
    assert view.config.dataloader is not None and dict(view.config.dataloader.settings)["num_workers"] == 0


def test_cpu_wording_and_no_gpu_figures_on_a_cpu_run() -> None:
    data = hand_made()
    data["breakdown"]["device"] = "cpu"
    view = ReportView.from_report(Report.from_dict(data))
    assert view.device == "CPU only, no GPU used (16 cores)"
    assert view.breakdown is not None and view.breakdown.gpu is None
    assert view.breakdown.categories == EXPOSED[:7]
    assert all(row.hidden_share is None for row in view.breakdown.phases)
    assert view.labels["host_forward"] == "forward (CPU compute)"
    data["environment"].pop("cpu_count", None)  # a bare trace records no CPU count: say so, no "?"
    assert ReportView.from_report(Report.from_dict(data)).device == (
        "CPU only, no GPU used (CPU count unknown: a bare trace does not record it)"
    )


def test_the_straggler_is_flagged_only_when_its_rule_fired() -> None:
    data = hand_made()
    quiet = TerminalRenderer(color=False).render(Report.from_dict(data))
    assert "straggler:" not in quiet  # the numbers say 48%, but no rule fired: not for a renderer to decide
    data["findings"].append(
        {
            "rule": "DIST003",
            "title": "A straggling rank",
            "says": "...",
            "do": "",
            "evidence": ["dist.straggler_data_ms"],
        }
    )
    view = ReportView.from_report(Report.from_dict(data))
    assert view.ranks is not None and view.ranks.straggler == Straggler(
        rank=1, data_wait_ms=6.24, others_data_wait_ms=1.75, excess_share=0.48
    )
    assert view.evidence(view.findings[-1])[0].text == "6.2 ms"
    assert "straggler: rank 1 waits 6.24 ms/step for data, the others 1.75" in TerminalRenderer(
        color=False
    ).render_view(view)


def test_a_large_job_lists_its_notable_ranks_and_sums_up_the_rest() -> None:
    from diagnose.renderers.html import HTMLRenderer

    data = hand_made()
    data["distributed"] = {
        "world_size": 40,
        "ranks": [{"rank": r, "status": "stopped", "median_step_ms": 100.0 + r} for r in range(40)],
        "notable_ranks": {"39": "the slowest"},
    }
    view = ReportView.from_report(Report.from_dict(data))
    ranks = view.ranks
    assert ranks is not None and len(ranks.rows) == 40
    assert [row.rank for row in ranks.shown] == [0, 39]
    # ranks 1-38: steps of 101-138 ms
    assert ranks.others is not None and (ranks.others.count, ranks.others.step_ms_median) == (38, 119.5)
    assert (ranks.others.step_ms_p10, ranks.others.step_ms_p90) == pytest.approx((104.7, 134.3))
    text = TerminalRenderer(color=False, width=200).render_view(view)
    assert "38 other ranks, not listed: step 119.5 ms median (p10-p90 104.7-134.3)" in text
    assert "the slowest" in text and "the first rank" in text
    page = HTMLRenderer().render_view(view)
    assert "38 other ranks, not listed" in page and page.count("the slowest") >= 1
    # a small job lists every rank, without the column
    assert ReportView.from_report(Report.from_dict(hand_made())).ranks.others is None


@pytest.mark.parametrize("fresh", [True, False], ids=["analysed", "schema-1-upgraded"])
def test_report_json_keeps_each_number_once(fresh: bool) -> None:
    """exposed.data_wait once, as a symptom: not again as a window share nor as evidence text."""
    if fresh:
        report = analyze_run(RunDir(DATA / "ddp_straggler_cpu"), AnalysisOptions.load())
    else:
        report = Report.load(DATA / "report_v1" / "report.json")
    data = json.loads(report.to_json())
    window = data["breakdown"]["window"]
    assert not {"exposed_share", "phase_share", "hidden_share", "gpu_busy_share", "steps"} & set(window)
    assert data["findings"][0]["evidence"] == [
        "dist.straggler_rank",
        "dist.straggler_data_ms",
        "dist.others_data_ms",
        "dist.straggler_data_share",
        "dist.world_size",
    ]
    # the job's report is the straggler's view (rank 1, the rank the others wait for) in the fresh
    # analysis, rank 0's in the schema-1 report
    assert data["symptoms"]["exposed.data_wait"]["value"] == pytest.approx(0.667 if fresh else 0.1928, abs=1e-3)


def test_a_schema_1_report_reads_and_renders_as_its_version_did() -> None:
    folder = DATA / "report_v1"
    report = Report.load(folder / "report.json")
    assert report.schema == REPORT_SCHEMA
    assert report.findings[0]["evidence"][:2] == ["dist.straggler_rank", "dist.straggler_data_ms"]
    assert TerminalRenderer(color=False).render(report) == (folder / "terminal.txt").read_text()
    assert MarkdownRenderer().render(report) == (folder / "tensorboard.md").read_text()


def test_upgrading_leaves_the_schema_1_dict_alone() -> None:
    original = json.loads((DATA / "report_v1" / "report.json").read_text())
    kept = copy.deepcopy(original)
    Report.from_dict(original)
    assert original == kept


@pytest.mark.parametrize("renderer", [TerminalRenderer(color=False), MarkdownRenderer()], ids=["terminal", "markdown"])
def test_a_report_with_nothing_profiled_renders(renderer) -> None:
    data = hand_made()
    data.update(breakdown=None, findings=[], distributed=None, verdict="")
    data["symptoms"] = {}
    text = renderer.render(Report.from_dict(data))
    assert "diagnose stopped the script" in text


def test_each_table_row_is_one_statistic_and_every_renderer_shows_the_same() -> None:
    """ms = share x the table's step, in report.json, the terminal, markdown and TensorBoard."""
    from diagnose.renderers.tensorboard import view_scalars

    report = analyze_run(RunDir(DATA / "data_bound"), AnalysisOptions.load())
    view = ReportView.from_report(report)
    bd = view.breakdown
    assert bd is not None
    window = report.breakdown["window"]["per_step"]  # type: ignore[index]
    assert (window["statistic"], window["spread"]) == ("mean", "p10-p90")
    for row in bd.exposed:
        assert row.mean_ms == pytest.approx(row.share * bd.exposed_step_ms, abs=2e-3)
        assert row.p10_ms is not None and row.p90_ms is not None and row.p10_ms <= row.p90_ms
    for phase in bd.phases:
        assert phase.mean_ms == pytest.approx(phase.share * bd.phase_step_ms, abs=2e-3)
    terminal = TerminalRenderer(color=False, width=140).render_view(view)
    markdown = MarkdownRenderer().render(report)
    scalars = {tag: value for _, tag, value in view_scalars(view)}
    top = max(bd.listed, key=lambda row: row.share)
    for text in (terminal, markdown):
        assert "mean ms/step" in text and "p10–p90 ms" in text and "mean per step = share x" in text
    line = next(line for line in terminal.splitlines() if top.label in line and "%" in line)
    assert f"{top.mean_ms:.2f}" in line and f"{top.p10_ms:.2f}–{top.p90_ms:.2f}" in line
    assert scalars[f"mean/exposed_{top.category}_ms"] == top.mean_ms


def _record_with_steps(durations_ms: list[float], timed_skipped: int) -> RunRecord:
    """A record of warm-up 1, profiled 2, timed 4 steps, the given step times."""
    return record_from_steps(durations_ms, WindowPlan(warmup=1, steps=2, timed=4), 8, timed_skipped)


def test_the_steady_state_leaves_out_the_batches_the_workers_queued() -> None:
    # warm-up 10, profiled 30 30, export 500, then 4 fast steps on queued batches, then the real 20s
    durations = [10, 30, 30, 500, 2, 2, 2, 2, 20, 20, 20, 20]
    skipped = report_of_record(_record_with_steps(durations, 4))
    assert skipped.throughput["steady"]["mean_step_ms"] == pytest.approx(20.0)
    assert skipped.throughput["steady"]["samples_per_s"] == pytest.approx(400.0)
    naive = report_of_record(_record_with_steps(durations, 0))
    assert naive.throughput["steady"]["mean_step_ms"] == pytest.approx(2.0)  # what the queued batches made it look


def test_a_noisy_window_is_reported_as_such() -> None:
    durations = [10, 30, 30, 500, 20, 20, 20, 60]  # p90 over 1.5x the median
    report = report_of_record(_record_with_steps(durations, 0))
    assert report.throughput["steady"]["noisy"]
    assert any(w.startswith("noisy steady state") for w in report.warnings)
