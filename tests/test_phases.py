"""Phases when they nest: forward and backward inside ``optimizer.step(closure)`` (Lightning,
LBFGS), GradScaler, clipping, ``zero_grad``, the HF Trainer's and accelerate's shapes, and
compiled graphs; hand-written traces with exact microseconds, then the recorded CPU fixtures."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field

import pytest

from diagnose.analysis.measure.breakdown import compute_breakdown, merge, resolve_nesting
from diagnose.analysis.trace.timeline import build_timeline, load_timeline
from tests.conftest import DATA
from tests.tracebuilder import AUTOGRAD, ELEMENTWISE, FP32_GEMM, MAIN, MULTI_TENSOR, TraceBuilder

TRITON = "triton_poi_fused_add_relu_0"


def annotate(b: TraceBuilder, name: str, ts: float, dur: float) -> None:
    b.x("user_annotation", name, ts, dur)


@dataclass
class NestCase:
    """One step [0, 1000): annotations and operators, and the phases expected to the microsecond."""

    name: str
    annotations: list[tuple[str, float, float]]
    forward: list[tuple[float, float]]  # operators that record autograd history
    backward: list[tuple[float, float]]  # autograd engine events
    expected: dict[str, float]
    ops: list[tuple[str, float, float]] = field(default_factory=list)  # other top-level operators


STEP = "Optimizer.step#SGD.step"
ZERO = "Optimizer.zero_grad#SGD.zero_grad"
CLOSURE = "diagnose#optimizer_closure"

NEST_CASES = [
    NestCase(
        # Lightning automatic optimization: the step [100,900) calls the closure [110,880):
        # training_step (forward from 150), zero_grad [400,420), backward [450,700), clipping
        # [720,760) after the closure's backward; the update runs after the closure [880,900).
        name="Lightning: forward and backward inside optimizer.step(closure)",
        annotations=[
            ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 100),
            (STEP, 100, 800),
            (CLOSURE, 110, 770),
            (ZERO, 400, 20),
            ("diagnose#clip_grad_norm_", 720, 40),
        ],
        forward=[(150, 10), (300, 10)],
        backward=[(450, 100), (550, 150)],
        # forward [150,450) less zero_grad; optimizer: [100,110) + zero_grad + clip + [880,900);
        # other: [110,150) + [700,720) + [760,880) in the closure, and [900,1000) after the step
        expected={"data_wait": 100, "h2d_copy": 0, "forward": 280, "backward": 250, "optimizer": 90, "other": 280},
    ),
    NestCase(
        name="a bare trace of a closure step (no diagnose annotation): the model's part still is not optimizer",
        annotations=[(STEP, 100, 800)],
        forward=[(150, 10)],
        backward=[(450, 250)],
        expected={"data_wait": 0, "h2d_copy": 0, "forward": 300, "backward": 250, "optimizer": 250, "other": 200},
    ),
    NestCase(
        # LBFGS calls the closure twice in one step; its own line search runs between the calls
        name="LBFGS: two closure calls inside one step",
        annotations=[
            (STEP, 0, 1000),
            (CLOSURE, 10, 390),
            ("Optimizer.zero_grad#LBFGS.zero_grad", 10, 10),
            (CLOSURE, 500, 390),
            ("Optimizer.zero_grad#LBFGS.zero_grad", 500, 10),
        ],
        forward=[(50, 10), (550, 10)],
        backward=[(200, 150), (700, 150)],
        # forward [50,200) + [550,700); closures' rest: [20,50)+[350,400)+[510,550)+[850,890)
        expected={"data_wait": 0, "h2d_copy": 0, "forward": 300, "backward": 300, "optimizer": 240, "other": 160},
    ),
    NestCase(
        # fp16 with GradScaler in a plain loop: scale() is a multiply before backward (forward);
        # unscale_ (for clipping), clipping, scaler.step (which holds optimizer.step) and update
        name="GradScaler: unscale_, clipping, step and update are optimizer work",
        annotations=[
            ("diagnose#GradScaler.unscale_", 500, 50),
            ("diagnose#clip_grad_norm_", 560, 40),
            ("diagnose#GradScaler.step", 610, 200),
            ("Optimizer.step#AdamW.step", 650, 150),
            ("diagnose#GradScaler.update", 820, 30),
        ],
        forward=[(100, 10)],
        backward=[(300, 180)],
        expected={"data_wait": 0, "h2d_copy": 0, "forward": 200, "backward": 180, "optimizer": 320, "other": 300},
    ),
    NestCase(
        name="GradScaler in a bare trace: its AMP operators are optimizer work",
        annotations=[("Optimizer.step#AdamW.step", 650, 150)],
        ops=[("aten::_amp_foreach_non_finite_check_and_unscale_", 500, 50), ("aten::_amp_update_scale_", 820, 30)],
        forward=[(100, 10)],
        backward=[(300, 180)],
        expected={"data_wait": 0, "h2d_copy": 0, "forward": 200, "backward": 180, "optimizer": 230, "other": 390},
    ),
    NestCase(
        # HF Trainer with gradient_accumulation_steps=2: two training_steps (forward, backward
        # through accelerator.backward), then clipping, optimizer.step(), model.zero_grad()
        name="HF Trainer: accumulation, clipping, step, model.zero_grad()",
        annotations=[
            ("diagnose#clip_grad_norm_", 700, 50),
            ("Optimizer.step#AdamW.step", 760, 100),
            ("diagnose#Module.zero_grad", 870, 20),
        ],
        forward=[(50, 10), (400, 10)],
        backward=[(200, 150), (550, 100)],
        expected={"data_wait": 0, "h2d_copy": 0, "forward": 300, "backward": 250, "optimizer": 170, "other": 280},
    ),
    NestCase(
        # Lightning Fabric: fabric.backward(loss) [400,800) scales the loss (16-mixed: a multiply that
        # records autograd history, at 410), runs the engine [450,700), then the strategy's hooks
        # [700,800); all of it is backward (diagnose#backward), none of it forward or other work
        name="Fabric: the whole fabric.backward call is backward",
        annotations=[("diagnose#backward", 400, 400), ("Optimizer.step#AdamW.step", 850, 100)],
        forward=[(100, 10), (200, 10), (410, 10)],
        backward=[(450, 250)],
        expected={"data_wait": 0, "h2d_copy": 0, "forward": 300, "backward": 400, "optimizer": 100, "other": 200},
    ),
    NestCase(
        # optimizer-in-backward (a post-accumulate-grad hook steps each parameter): the step runs
        # inside the backward span and is optimizer work
        name="an optimizer step inside backward is optimizer work",
        annotations=[("Optimizer.step#AdamW.step", 400, 50), ("Optimizer.step#AdamW.step", 600, 50)],
        forward=[(0, 10)],
        backward=[(300, 200), (500, 200)],
        expected={"data_wait": 0, "h2d_copy": 0, "forward": 300, "backward": 300, "optimizer": 100, "other": 300},
    ),
]


@pytest.mark.parametrize("case", NEST_CASES, ids=lambda c: c.name)
def test_nested_phases_to_the_microsecond(case: NestCase) -> None:
    b = TraceBuilder(device=False)
    b.step(0, 0, 1000)
    for name, ts, dur in case.annotations:
        annotate(b, name, ts, dur)
    for ts, dur in case.forward:
        b.op("aten::linear", ts, dur, forward=True)
    for name, ts, dur in case.ops:
        b.op(name, ts, dur)
    for ts, dur in case.backward:
        b.backward_op(ts, dur, tid=MAIN)
    step = compute_breakdown(build_timeline(b.to_dict())).steps[0]
    assert step.phases == case.expected
    assert sum(step.phases.values()) == 1000


def test_resolve_nesting_innermost_wins() -> None:
    got = resolve_nesting(
        {"optimizer": [(0, 100), (40, 50)], "closure": [(10, 90)], "forward": [(20, 60)], "backward": []}
    )
    assert got["optimizer"] == [(0, 10), (40, 50), (90, 100)]
    assert got["forward"] == [(20, 40), (50, 60)]
    assert merge(got["closure"]) == [(10, 20), (60, 90)]
    # two spans that start together: the shorter is inside the longer
    assert resolve_nesting({"optimizer": [(0, 10)], "forward": [(0, 30)]}) == {
        "optimizer": [(0, 10)],
        "forward": [(10, 30)],
    }


def test_kernels_launched_inside_a_closure_step_follow_their_phase() -> None:
    """The exposed view: a forward kernel launched inside optimizer.step(closure) is forward
    GPU time, the update's multi-tensor kernel is the optimizer's."""
    b = TraceBuilder()
    b.step(0, 0, 1000)
    annotate(b, STEP, 100, 800)
    annotate(b, CLOSURE, 110, 600)
    b.op("aten::linear", 150, 10, forward=True)
    b.kernel(FP32_GEMM, 160, 200, launch_ts=155)  # [160,360) forward
    b.backward_op(400, 300)
    b.kernel(ELEMENTWISE, 410, 250, launch_ts=405, tid=AUTOGRAD)  # [410,660) backward
    b.kernel(MULTI_TENSOR, 720, 100, launch_ts=715)  # [720,820) the update, after the closure
    step = compute_breakdown(build_timeline(b.to_dict())).steps[0]
    assert (step.exposed["gpu_forward"], step.exposed["gpu_backward"], step.exposed["gpu_optimizer"]) == (200, 250, 100)
    assert step.optimizer_kernels == 1
    assert step.phases["optimizer"] == 10 + 190  # [100,110) and [710,900)
    assert step.phases["forward"] == 250 and step.phases["backward"] == 300


def compiled_step(graphs: bool) -> TraceBuilder:
    """One step of a compiled model on a GPU, as torch 2.x records it: the guard check and the
    compiled region around ``CompiledFunction`` (forward), ``CompiledFunctionBackward`` on the
    autograd thread; Triton kernels, or CUDA-graph replays (mode="reduce-overhead")."""
    b = TraceBuilder()
    b.step(0, 0, 1000)
    b.op("TorchDynamo Cache Lookup", 10, 10)
    b.op("Torch-Compiled Region: 0/0", 20, 130)
    b.op("CompiledFunction", 40, 100, forward=True)
    b.backward_op(300, 200, name="CompiledFunctionBackward")
    if graphs:
        for launch_ts, tid, start in ((60, MAIN, 100), (320, AUTOGRAD, 350)):
            corr = b.runtime("cudaGraphLaunch", launch_ts, 5, tid=tid)
            for k in range(2):  # the graph's kernels share the launch's correlation id
                b.x("kernel", TRITON, start + 60 * k, 50, tid=7, pid=0, device=0, stream=7, correlation=corr)
    else:
        b.kernel(TRITON, 100, 110, launch_ts=60)
        b.kernel(TRITON, 350, 110, launch_ts=320, tid=AUTOGRAD)
    annotate(b, "Optimizer.step#AdamW.step", 600, 100)
    b.kernel(MULTI_TENSOR, 620, 50, launch_ts=610)
    return b


@pytest.mark.parametrize("graphs", [False, True], ids=["triton kernels", "CUDA graph replays"])
def test_compiled_graphs_are_forward_and_backward(graphs: bool) -> None:
    step = compute_breakdown(build_timeline(compiled_step(graphs).to_dict())).steps[0]
    # forward from the guard check (10) to the start of backward (300)
    assert step.phases == {
        "data_wait": 0,
        "h2d_copy": 0,
        "forward": 290,
        "backward": 200,
        "optimizer": 100,
        "other": 410,
    }
    kernels_us = 2 * 50 if graphs else 110  # a replay runs two 50 us kernels 10 us apart
    assert step.exposed["gpu_forward"] == kernels_us and step.exposed["gpu_backward"] == kernels_us
    assert step.exposed["gpu_optimizer"] == 50 and step.exposed["gpu_other"] == 0
    assert step.graph_launches == (2 if graphs else 0)
    assert step.triton_us == 2 * kernels_us


# --- recorded CPU runs of the frameworks' own loops (tests/frameworks/*.py) --------------------

FRAMEWORK_FIXTURES = ["closure_cpu", "lightning_cpu", "hf_trainer_cpu", "accelerate_cpu", "compiled_cpu"]


def _own_optimizer_work_us(trace: dict, step: tuple[float, float]) -> float:
    """The optimizer's own time in a step, computed straight from the annotations: optimizer-side
    spans, less the closures inside them, plus the optimizer-side spans inside those closures."""
    from diagnose.analysis.trace import patterns as P

    events = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation" and step[0] <= e["ts"] < step[1]]
    spans = lambda pred: merge([(e["ts"], e["ts"] + e["dur"]) for e in events if pred(e["name"])])  # noqa: E731
    outer = spans(lambda n: n.startswith(P.OPTIMIZER_SIDE_PREFIXES))
    closures = spans(lambda n: n.startswith(P.OPTIMIZER_CLOSURE_PREFIX))
    inner = [
        e
        for e in events
        if e["name"].startswith(P.OPTIMIZER_SIDE_PREFIXES) and any(c0 <= e["ts"] < c1 for c0, c1 in closures)
    ]

    def length(ivs: list[tuple[float, float]]) -> float:
        return sum(e - s for s, e in ivs)

    def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
        return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)

    return length(outer) - overlap(outer, closures) + length(merge([(e["ts"], e["ts"] + e["dur"]) for e in inner]))


@pytest.mark.parametrize("name", FRAMEWORK_FIXTURES)
def test_framework_loops_have_forward_backward_and_only_the_optimizers_own_work(name: str) -> None:
    (trace_path,) = (DATA / name).glob("*.pt.trace.json.gz")
    trace = json.loads(gzip.decompress(trace_path.read_bytes()))
    breakdown = compute_breakdown(load_timeline(trace_path))
    assert len(breakdown.steps) >= 2
    for step in breakdown.steps:
        assert step.phases["forward"] > 0 and step.phases["backward"] > 0, (step.number, step.phases)
        own = _own_optimizer_work_us(trace, (step.start_us, step.start_us + step.duration_us))
        # the AMP operators of a bare trace are the only optimizer work besides annotations
        assert step.phases["optimizer"] == pytest.approx(own, abs=1.0), (step.number, step.phases)
    share = breakdown.phase_share
    assert share["forward"] + share["backward"] > share["optimizer"]
    assert share["optimizer"] < 0.5


def test_closure_fixture_was_charged_to_the_optimizer_before() -> None:
    """What the issue saw: with torch's own annotation only, the whole closure step was optimizer
    work. The fixture still shows why: its step annotation covers forward and backward."""
    (trace_path,) = (DATA / "lightning_cpu").glob("*.pt.trace.json.gz")
    timeline = load_timeline(trace_path)
    step_spans = [s for s in timeline.optimizer_spans]
    covered = merge(step_spans)
    assert any(s <= f[0] < e for s, e in covered for f in timeline.forward_ops)
    assert timeline.closure_spans, "the runtime's closure annotation is in the recorded trace"
