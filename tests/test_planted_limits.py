"""The planted examples of issue 20 (hand-written attention, misaligned matmuls, elementwise
chains, a tiny batch, a small model) with ``--small`` under ``run_target`` on the CPU: each runs,
and the counted step shows what it plants (and its fix flag removes it). The GPU verdicts (the
rule that fires, what the fix measures) come from ``benchmarks/mfu_gpu.py --planted``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from diagnose.analysis.measure.hardware_limits import unfused_attention_share
from diagnose.analysis.measure.kernels import misaligned_flop_share
from diagnose.progress import Progress
from diagnose.record import RunRecord, WindowPlan
from diagnose.rundir import RunDir
from diagnose.runtime.runner import resolve_target, run_target

EXAMPLES = Path(__file__).parent.parent / "examples"
SMALL = WindowPlan(warmup=2, steps=3, timed=4)


def _run(tmp_path: Path, script: str, *args: str) -> RunRecord:
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    target = resolve_target(str(EXAMPLES / script), None, ["--small", "--steps", "16", *args])
    record = run_target(target, SMALL, RunDir(run_dir), progress=Progress(enabled=False))
    assert record.status in ("completed", "stopped"), record.error
    assert record.flops is not None and record.flops.total > 0
    return record


def test_attention_by_hand_plants_unfused_attention_and_sdpa_removes_it(tmp_path: Path) -> None:
    # width 64, sequence 32: the two attention matmuls carry 2 x 32 / (2 x 32 + 12 x 64) of a block's FLOPs
    by_hand = _run(tmp_path / "a", "attention_by_hand.py")
    assert unfused_attention_share(by_hand.flops) >= 0.05
    fused = _run(tmp_path / "b", "attention_by_hand.py", "--sdpa")
    assert unfused_attention_share(fused.flops) == 0.0


def test_misaligned_matmuls_plants_odd_widths_and_the_fix_aligns_them(tmp_path: Path) -> None:
    odd = _run(tmp_path / "a", "misaligned_matmuls.py")
    assert misaligned_flop_share(odd.flops.matmuls) == pytest.approx(1.0)
    even = _run(tmp_path / "b", "misaligned_matmuls.py", "--hidden", "4096")
    # only the one-output head (n = 1) is left misaligned
    assert misaligned_flop_share(even.flops.matmuls) < 0.02


def test_elementwise_chain_runs_its_chains_as_separate_operators(tmp_path: Path) -> None:
    record = _run(tmp_path, "elementwise_chain.py")
    ops = record.flops.ops
    for op in ("aten.tanh", "aten.rsqrt", "aten.pow", "aten.mul", "aten.add"):
        assert op in ops, op
    elementwise_calls = sum(
        c.calls for name, c in ops.items() if name in ("aten.mul", "aten.add", "aten.pow", "aten.tanh", "aten.rsqrt")
    )
    assert elementwise_calls > 10 * ops["aten.addmm"].calls


def test_tiny_batch_counts_16_row_matmuls(tmp_path: Path) -> None:
    record = _run(tmp_path, "tiny_batch.py")
    assert record.flops.samples == 16 and record.batch_size() == 16
    linear = [s for s in record.flops.matmuls if s.op in ("aten.mm", "aten.addmm")]
    assert linear and all(16 in (s.m, s.n, s.k) for s in linear)  # the batch is one dimension of each


def test_small_model_runs_and_is_counted(tmp_path: Path) -> None:
    record = _run(tmp_path, "small_model.py")
    assert record.flops.by_phase["forward"] > 0 and record.flops.by_phase["backward"] > 0
