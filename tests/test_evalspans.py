"""Evaluation passes inside the training steps (issue 32's outside corpus: a full-batch graph
network validated after every optimizer step read as DATA004, "move per-sample work into the
Dataset"): the runtime's spans, their symptoms' arithmetic, and the planted example."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from diagnose.analysis.symptoms import compute_symptoms  # noqa: E402
from diagnose.analysis.symptoms.evaluation import eval_passes, eval_share, eval_steps  # noqa: E402
from diagnose.progress import Progress  # noqa: E402
from diagnose.record import RunRecord, WindowPlan  # noqa: E402
from diagnose.rundir import RunDir  # noqa: E402
from diagnose.runtime.evalspans import EvalSpans  # noqa: E402
from diagnose.runtime.runner import resolve_target, run_target  # noqa: E402

EXAMPLES = Path(__file__).parent.parent / "examples"


class _Trained:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> int:
        return self.count


def test_an_eval_pass_is_one_span_however_many_submodules_and_the_patch_goes() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Dropout(), nn.Linear(2, 2)))
    trained = _Trained()
    spans = EvalSpans(trained)
    original = nn.Module.train
    spans.start()
    try:
        model.train()  # no pass open: nothing
        model.eval()
        assert not model.training and not model[1][0].training  # the original ran, recursively
        model.train()
        model.eval()  # open at stop: no span
    finally:
        kept = spans.stop()
    assert nn.Module.train is original
    assert len(kept) == 1 and kept[0][0] <= kept[0][1]


def test_a_module_frozen_in_eval_mode_while_another_trains_is_no_evaluation() -> None:
    """A GAN's discriminator in eval mode while the generator learns: a backward and an optimizer
    step inside the span make it training, not an evaluation pass."""
    disc, gen = nn.Linear(2, 1), nn.Linear(2, 2)
    trained = _Trained()
    spans = EvalSpans(trained)
    spans.start()
    try:
        disc.eval()
        trained.count += 2  # the generator's backward and step
        disc.train()
        gen.eval()  # a real evaluation of the generator: nothing trains until it trains again
        gen.train()
    finally:
        kept = spans.stop()
    assert len(kept) == 1


def _record(boundaries: list[float], spans: list[list[float]], warmup: int = 1, profiled: int = 4) -> RunRecord:
    record = RunRecord()
    record.plan = {"warmup": warmup, "steps": profiled, "timed": 0}
    record.profiled_steps = profiled
    record.boundaries_s = boundaries
    record.eval_spans_s = spans
    return record


def test_the_share_the_steps_and_the_passes_to_the_microsecond() -> None:
    # profiled steps: 1-2, 2-3, 3-4, 4-5 (seconds 10..14); passes in steps 1 and 3, one before the window
    record = _record(
        [9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0],
        [[9.2, 9.5], [10.5, 10.75], [12.25, 12.5], [13.9, 14.3]],
    )
    assert eval_share.compute(record) == pytest.approx((0.25 + 0.25 + 0.1) / 4)
    assert eval_steps.compute(record) == pytest.approx(3 / 4)  # the last pass reaches into step 4-5
    assert eval_passes.compute(record) == 3
    assert eval_share.compute(_record([9.0, 10.0, 11.0], [])) is None  # no pass: not measured, never zero by guess


def test_evaluation_is_not_counted_as_work_in_the_training_loop(tmp_path: Path) -> None:
    """The planted example on the CPU: every profiled step holds a pass, EVAL001's evidence, and
    the other host work left for DATA004 is net of it; evaluating every 10 steps leaves at most
    one pass in a window of three steps."""
    plan = WindowPlan(warmup=2, steps=3, timed=4)
    records = {}
    for every in (1, 10):
        run_dir = tmp_path / f"every{every}"
        run_dir.mkdir()
        target = resolve_target(
            str(EXAMPLES / "eval_every_step.py"), None, ["--small", "--steps", "16", "--eval-every", str(every)]
        )
        records[every] = run_target(target, plan, RunDir(run_dir), progress=Progress(enabled=False))
        assert records[every].status in ("completed", "stopped"), records[every].error
    planted, fixed = records[1], records[10]
    assert eval_steps.compute(planted) == 1.0 and eval_passes.compute(planted) == 3
    assert 0 < eval_share.compute(planted) < 1
    assert len(fixed.eval_spans_s) <= 1
    assert fixed.eval_spans_s == [] or eval_steps.compute(fixed) <= 1 / 3
    symptoms = compute_symptoms(None, planted)
    assert symptoms.get("step.eval_share").value == pytest.approx(eval_share.compute(planted))
