"""The symptom computations on small hand-made inputs, one table per subject module, exact values;
and the registry: declared dependencies set the order, undeclared reads are errors."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from diagnose.analysis.measure.breakdown import EXPOSED, PHASES, Breakdown, StepBreakdown
from diagnose.analysis.measure.ranks import RankSet, RankSummary
from diagnose.analysis.symptoms import CATALOG, compute_symptoms
from diagnose.analysis.symptoms.registry import declare, evaluate, evaluation_order, symptom
from diagnose.analysis.trace.timeline import TraceMeta
from diagnose.record import (
    DataLoaderInfo,
    FlopCount,
    FrameworkInfo,
    MatmulShape,
    MemorySplit,
    ModelInfo,
    OpCount,
    OptimizerInfo,
    RunRecord,
)
from tests.wholebuilder import whole_record

# dyadic shares, so that sums are exact
EXPOSED_SHARE = dict(
    zip(EXPOSED, (0.125, 0.0625, 0.0625, 0.125, 0.0625, 0.0625, 0.125, 0.0625, 0.125, 0.125, 0.0625, 0.0), strict=True)
)
PHASE_SHARE = dict(zip(PHASES, (0.25, 0.0, 0.25, 0.25, 0.125, 0.125), strict=True))
HIDDEN_SHARE = {p: (0.125 if p == "data_wait" else 0.0) for p in PHASES}


def _step(number: int, duration: float, **kw) -> StepBreakdown:
    return StepBreakdown(number, 0.0, duration, phases={"data_wait": kw.pop("data_wait_us", 0.0)}, exposed={}, **kw)


STEPS = [
    _step(
        1,
        1000.0,
        data_wait_us=500.0,
        gpu_busy_us=600.0,
        kernel_count=10,
        kernel_time_us=400.0,
        median_kernel_us=20.0,
        h2d_pageable_bytes=1000,
        h2d_pinned_bytes=3000,
        h2d_copies=2,
        h2d_copy_us=100.0,
        sync_count=2,
        sync_blocked_us=50.0,
        sync_idle_after_us=30.0,
        matmul_us={"fp32": 100.0, "bf16": 200.0, "tf32": 100.0},
        conv_us=100.0,
        transpose_us=20.0,
        triton_us=100.0,
        communication_us=50.0,
        optimizer_kernels=4,
        multi_tensor_kernels=2,
        graph_launches=1,
    ),
    _step(
        2,
        3000.0,
        data_wait_us=1500.0,
        gpu_busy_us=1800.0,
        kernel_count=20,
        kernel_time_us=600.0,
        median_kernel_us=40.0,
        h2d_pageable_bytes=3000,
        h2d_pinned_bytes=1000,
        h2d_copies=4,
        h2d_copy_us=300.0,
        sync_count=4,
        sync_blocked_us=150.0,
        sync_idle_after_us=90.0,
        matmul_us={"fp32": 300.0, "fp16": 100.0},
        conv_us=300.0,
        transpose_us=60.0,
        communication_us=150.0,
        optimizer_kernels=6,
        graph_launches=3,
    ),
]


def _breakdown(has_gpu: bool = True, kinds: dict[str, int] | None = None) -> Breakdown:
    return Breakdown(
        steps=STEPS,
        has_gpu=has_gpu,
        has_step_marks=True,
        exposed_share=dict(EXPOSED_SHARE),
        phase_share=dict(PHASE_SHARE),
        hidden_share=dict(HIDDEN_SHARE),
        dataloader_kinds=kinds or {},
    )


def _loader(**kw) -> DataLoaderInfo:
    base = dict(
        loader_id=0,
        created_at=None,
        dataset="D",
        dataset_len=1000,
        batch_size=32,
        num_workers=4,
        pin_memory=True,
        prefetch_factor=None,
        persistent_workers=False,
        drop_last=False,
        iterators_created=2,
        first_batch_wait_s=[1.0, 2.0, 3.0],
        fetches_in_window=10,
    )
    return DataLoaderInfo(**{**base, **kw})


def _record(**kw) -> RunRecord:
    return RunRecord(**kw)


def _wrapped(parallel: dict) -> RunRecord:
    """A record of one model under a parallel wrapper with these settings (``ModelInfo.parallel``)."""
    return _record(models=[ModelInfo("fsdp", 10, "float32", 0, False, False, False, False, parallel)])


def _summary(rank: int, wait_ms: float, comm: float | None, samples: float) -> RankSummary:
    return RankSummary(rank, "stopped", 10.0, wait_ms, wait_ms / 10, 0.0, comm, None, samples, "data_wait", "gloo")


def _with_collectives(s: RankSummary, **kinds: tuple[float, ...]) -> RankSummary:
    """kind=(exposed ms, overlapped ms[, calls per step]) per step of the summary's 10 ms."""
    for kind, (exposed, overlapped, *calls) in kinds.items():
        s.collectives[kind] = {
            "calls_per_step": calls[0] if calls else 1.0,
            "ms": exposed + overlapped,
            "exposed_ms": exposed,
            "overlapped_ms": overlapped,
        }
    return s


# --- the distance to the hardware limit: an H100 step of 4.947 TFLOP in 10 ms (bf16: MFU 0.5) ---

LIMITS_GPU = replace(
    _breakdown(),
    kernels_by_name={
        "sm90_xmma_gemm_bf16bf16_bf16f32": (12000.0, 4),
        "vectorized_elementwise_kernel<add>": (6000.0, 8),
        "reduce_kernel<softmax>": (2000.0, 2),
    },
)
LIMITS_FLOPS = FlopCount(
    step=15,
    seconds=0.2,
    total=4_947_000_000_000,
    by_phase={"forward": 1_649_000_000_000, "backward": 3_298_000_000_000, "optimizer": 0},
    ops={
        "aten.mm": OpCount(calls=2, flops=4_328_625_000_000, bytes=3_000_000_000),
        "aten.bmm": OpCount(calls=2, flops=618_375_000_000),  # beside a softmax, no SDPA: hand-written attention
        "aten.add": OpCount(calls=8, bytes=6_000_000_000, elements_out=1_000_000_000),
        "aten._softmax": OpCount(calls=2, bytes=1_000_000_000, elements_in=500_000_000),
    },
    # a 50,257-wide head (n not a multiple of 8) carries a quarter of the matmul FLOPs
    matmuls=[
        MatmulShape("aten.mm", 4096, 4096, 4096, "bfloat16", 1, 3_000_000_000_000),
        MatmulShape("aten.mm", 4096, 50257, 768, "bfloat16", 1, 1_000_000_000_000),
    ],
)
LIMITS_SPLIT = MemorySplit(
    when="step",
    parameters_bytes=2_000_000_000,
    gradients_bytes=2_000_000_000,
    optimizer_state_bytes=4_000_000_000,
    allocated_start_bytes=7_000_000_000,
    allocated_end_bytes=9_000_000_000,
    peak_allocated_bytes=29_000_000_000,
    peak_reserved_bytes=30_000_000_000,
    capacity_bytes=80_000_000_000,
    samples=64,
)
LIMITS_OOM = MemorySplit(
    when="oom",
    parameters_bytes=2_000_000_000,
    gradients_bytes=2_000_000_000,
    optimizer_state_bytes=4_000_000_000,
    allocated_end_bytes=78_000_000_000,
    peak_allocated_bytes=78_000_000_000,
    peak_reserved_bytes=78_000_000_000,
    capacity_bytes=80_000_000_000,
    message="CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB",
)
LIMITS_RECORD_FIELDS = dict(
    environment={"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"},
    flags={"matmul_allow_tf32": False},
    timed_seconds=0.02,
    timed_steps=2,
    flops=LIMITS_FLOPS,
    memory_split=LIMITS_SPLIT,
)
LIMITS_RECORD = RunRecord(**LIMITS_RECORD_FIELDS)
# a tiny batch: 16 rows through 8192-wide bf16 layers (forward, input and weight gradients),
# 16 GB of persistent memory and 1 GB of activations (62.5 MB a sample)
LIMITS_TINY_FIELDS = dict(
    LIMITS_RECORD_FIELDS,
    flops=FlopCount(
        step=15,
        seconds=0.1,
        total=3 * 2 * 16 * 8192 * 8192,
        ops={"aten.mm": OpCount(calls=3, flops=3 * 2 * 16 * 8192 * 8192)},
        matmuls=[
            MatmulShape("aten.mm", 16, 8192, 8192, "bfloat16", 2, 2 * 2 * 16 * 8192 * 8192),
            MatmulShape("aten.mm", 8192, 8192, 16, "bfloat16", 1, 2 * 16 * 8192 * 8192),
        ],
    ),
    memory_split=MemorySplit(
        when="step",
        parameters_bytes=4_000_000_000,
        gradients_bytes=4_000_000_000,
        optimizer_state_bytes=8_000_000_000,
        allocated_start_bytes=12_000_000_000,
        peak_allocated_bytes=17_000_000_000,
        peak_reserved_bytes=18_000_000_000,
        capacity_bytes=80_000_000_000,
        samples=16,
    ),
)


@dataclass
class Case:
    name: str
    expected: dict[str, float | str | None]  # None: the symptom is absent
    breakdown: Breakdown | None = None
    record: RunRecord | None = None
    meta: TraceMeta | None = None
    ranks: RankSet | None = None
    tolerance: float = field(default=0.0)


GPU = _breakdown()
# four 1 ms steps: one waits 600 us for data, one 40 us (under 5% of its step: not a wait), two none
BURSTY = Breakdown(
    steps=[
        StepBreakdown(i, i * 1000.0, 1000.0, phases={}, exposed={"data_wait": wait})
        for i, wait in enumerate((600.0, 40.0, 0.0, 0.0))
    ],
    has_gpu=False,
    has_step_marks=True,
    exposed_share={c: 0.16 if c == "data_wait" else 0.0 for c in EXPOSED},
    phase_share=dict(PHASE_SHARE),
    hidden_share=dict(HIDDEN_SHARE),
)
SYNC_SITES = [
    {"site": "/a/train.py:10", "code": "loss.item()", "kind": "item", "count": 4, "blocked_ms_per_step": 0.5},
    {"site": "/a/train.py:12", "code": "x.to(dev)", "kind": "blocking copy", "count": 2},
]
HOST_LINES = [
    {"site": "/a/train.py:20", "code": "augment(x)", "where": "other", "share": 0.25},
    {"site": "/a/model.py:5", "code": "self.fc(x)", "where": "model", "share": 0.5},
    {"site": "/a/train.py:8", "code": "next(it)", "where": "data", "share": 0.125},
    {"site": "/a/train.py:30", "code": "opt.step()", "where": "optimizer", "share": 0.0625},
]

#: nanoGPT's shape: the loop at module level calls backward and step; its get_batch stacks one
#: sample at a time (two looping lines, counted), opens a memory map and copies to the GPU (once a
#: batch, not counted); the loop's own looping line and the model's are not the batch's building
BATCH_BUILDING_LINES = [
    {
        "site": "/a/train.py:305",
        "function": "<module>",
        "code": "loss.backward()",
        "where": "backward",
        "samples": 52,
        "share": 0.52,
    },
    {
        "site": "/a/train.py:311",
        "function": "<module>",
        "code": "optimizer.step()",
        "where": "optimizer",
        "samples": 2,
        "share": 0.02,
    },
    {
        "site": "/a/model.py:90",
        "function": "forward",
        "code": "for block in self.h: x = block(x)",
        "where": "model",
        "samples": 9,
        "share": 0.09,
    },
    {
        "site": "/a/train.py:124",
        "function": "get_batch",
        "code": "x = torch.stack([torch.from_numpy(d[i:i+T]) for i in ix])",
        "where": "other",
        "samples": 5,
        "share": 0.05,
    },
    {
        "site": "/a/train.py:125",
        "function": "get_batch",
        "code": "y = torch.stack([torch.from_numpy(d[i+1:i+1+T]) for i in ix])",
        "where": "other",
        "samples": 3,
        "share": 0.03,
    },
    {
        "site": "/a/train.py:120",
        "function": "get_batch",
        "code": "d = np.memmap(path, dtype=np.uint16, mode='r')",
        "where": "other",
        "samples": 2,
        "share": 0.02,
    },
    {
        "site": "/a/train.py:128",
        "function": "get_batch",
        "code": "x = x.pin_memory().to(device, non_blocking=True)",
        "where": "other",
        "samples": 1,
        "share": 0.01,
    },
    {
        "site": "/a/train.py:298",
        "function": "<module>",
        "code": "for micro_step in range(accum):",
        "where": "other",
        "samples": 2,
        "share": 0.02,
    },
]

#: warm-up 1, profiled 1, the export step, then 5 timed steps: 3, 3, 4, 3 and 30 ms
FIVE_TIMED = {
    "plan": {"warmup": 1, "steps": 1, "timed": 5},
    "boundaries_s": [0.0, 0.01, 0.02, 0.03, 0.033, 0.036, 0.040, 0.043, 0.073],
    "timed_seconds": 0.043,
    "timed_steps": 5,
}

# profiled steps 1-5 (warm-up 1): evaluation passes of 0.1 s in steps 1 and 2, one before the window
EVAL_RECORD = _record(
    plan={"warmup": 1, "steps": 4, "timed": 0},
    profiled_steps=4,
    boundaries_s=[0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
    eval_spans_s=[[0.2, 0.9], [1.5, 1.6], [2.5, 2.6]],
)

CASES = {
    "exposed": [
        Case(
            "a GPU trace",
            breakdown=GPU,
            expected={
                **{f"exposed.{c}": v for c, v in EXPOSED_SHARE.items()},
                **{f"phase.{p}": v for p, v in PHASE_SHARE.items()},
                **{f"hidden.{p}": v for p, v in HIDDEN_SHARE.items()},
                "exposed.communication_own": 0.0625,
                "exposed.launch": 0.25,
                "exposed.launch_model": 0.1875,
                "exposed.host": 0.625,
                "exposed.other_not_sync": 0.125 - 0.03,
                "step.time_ms": 2.0,
                "step.median_ms": 2.0,
                "step.profiled": 2,
                "exposed.host_code": 0.25 + 0.125 - 0.03,
            },
        ),
        Case(
            "a CPU trace: all host time is other work, no launch shares",
            breakdown=_breakdown(has_gpu=False),
            expected={
                "exposed.other_not_sync": 0.125,
                "exposed.launch": None,
                "exposed.host": None,
                "exposed.host_code": None,
                "step.time_ms": 2.0,
            },
        ),
        Case(
            "the steady step time from the run record wins",
            breakdown=GPU,
            record=_record(timed_seconds=3.0, timed_steps=1000),
            expected={
                "step.time_ms": 3.0,
                "step.steady_mean_ms": 3.0,
                "step.median_ms": None,  # the timed steps' sum alone: no median, not the profiled one
            },
        ),
        Case(
            "the steady steps' median: an epoch's end in the mean, not in the median",
            breakdown=GPU,
            record=_record(**FIVE_TIMED),
            tolerance=1e-9,
            expected={"step.time_ms": 8.6, "step.steady_mean_ms": 8.6, "step.median_ms": 3.0},
        ),
        Case(
            "ranks: the least exposed communication of any rank",
            breakdown=GPU,
            ranks=RankSet.of([_summary(0, 1.0, 0.5, 16), _summary(1, 6.0, 0.25, 16)]),
            expected={
                "exposed.communication_own": 0.25,
            },
        ),
        Case(
            "a rank without a share: this rank's own",
            breakdown=GPU,
            ranks=RankSet.of([_summary(0, 1.0, 0.5, 16), _summary(1, 6.0, None, 16)]),
            expected={
                "exposed.communication_own": 0.0625,
            },
        ),
        Case(
            "nothing measured",
            expected={
                "exposed.data_wait": None,
                "step.time_ms": None,
                "step.profiled": None,
                "step.steady_mean_ms": None,
            },
        ),
    ],
    "gpu": [
        Case(
            "a GPU trace with the device's compute capability",
            breakdown=GPU,
            meta=TraceMeta(compute_capability=(9, 0)),
            expected={
                "gpu.present": 1,
                "gpu.busy": 0.6,
                "gpu.kernel_step_share": 0.375,
                "gpu.compute_capability": 9.0,
                "gpu.kernels_per_step": 15,
                "gpu.median_kernel_us": 30.0,
                "gpu.matmul_step_share": 0.2,
                "gpu.fp32_matmul_share": 0.5,
                "gpu.fp32_matmul_step_share": 0.1,
                "gpu.reduced_precision_share": 0.375,
                "gpu.tf32_share": 0.125,
                "gpu.conv_step_share": 0.1,
                "gpu.transpose_step_share": 0.02,
                "gpu.triton_share": 0.1,
                "gpu.graph_launches_per_step": 2,
                "gpu.communication_step_share": 0.05,
            },
        ),
        Case(
            "the compute capability from the run record",
            record=_record(environment={"compute_capability": "8.6"}),
            expected={
                "gpu.compute_capability": 8.6,
                "gpu.present": None,
                "gpu.busy": None,
            },
        ),
        Case(
            "a CPU trace",
            breakdown=_breakdown(has_gpu=False),
            meta=TraceMeta(compute_capability=(9, 0)),
            expected={
                "gpu.present": 0,
                "gpu.busy": None,
                "gpu.compute_capability": None,
                "gpu.triton_share": None,
            },
        ),
    ],
    "copies": [
        Case(
            "half the bytes pageable",
            breakdown=GPU,
            expected={
                "h2d.bytes_per_step": 4000,
                "h2d.pageable_bytes_per_step": 2000,
                "h2d.pageable_fraction": 0.5,
                "h2d.copies_per_step": 3,
                "h2d.gpu_copy_step_share": 0.1,
                "h2d.bandwidth_gbs": 8000 / 400e-6 / 1e9,
            },
        ),
    ],
    "syncs": [
        Case(
            "six syncs over two steps",
            breakdown=GPU,
            expected={
                "sync.per_step": 3,
                "sync.blocked_share": 0.05,
                "sync.idle_after_share": 0.03,
                "sync.cost_share": 0.0625 + 0.03,
            },
        ),
    ],
    "optimizer": [
        Case(
            "two optimizers, one a for-loop",
            breakdown=GPU,
            record=_record(
                optimizers=[
                    OptimizerInfo("Adam", 100, 1000, "for-loop", created_at="/x/train.py:12"),
                    OptimizerInfo("SGD", 20, 200, "fused"),
                ]
            ),
            expected={
                "optimizer.present": 1,
                "optimizer.param_tensors": 120,
                "optimizer.forloop": 1,
                "optimizer.kernels_per_step": 5,
                "optimizer.multi_tensor_share": 0.2,
                "optimizer.step_share": 0.125,
            },
        ),
        Case(
            "no optimizer",
            record=_record(),
            expected={"optimizer.present": 0, "optimizer.param_tensors": None, "optimizer.forloop": None},
        ),
        Case(
            "a bare trace of Adam(foreach=False) over 3 tensors, two step calls",
            breakdown=GPU,
            meta=TraceMeta(
                optimizer_classes={"Adam": 2},
                optimizer_step_ops=[{"aten::add_": 6, "aten::lerp_": 3, "aten::addcdiv_": 3, "aten::item": 3}] * 2,
            ),
            expected={
                "optimizer.present": 1,
                "optimizer.forloop": 1,
                "optimizer.param_tensors": 3,
                "optimizer.name": "Adam",
            },
        ),
        Case(
            "a bare trace of a fused AdamW: the tensors are not counted",
            breakdown=GPU,
            meta=TraceMeta(
                optimizer_classes={"AdamW": 1},
                optimizer_step_ops=[{"aten::_foreach_add_": 1, "aten::_fused_adamw_": 1}],
            ),
            expected={
                "optimizer.present": 1,
                "optimizer.forloop": 0,
                "optimizer.param_tensors": None,
                "optimizer.name": "AdamW",
            },
        ),
        Case(
            "a bare trace with no optimizer step recorded",
            breakdown=GPU,
            meta=TraceMeta(),
            expected={
                "optimizer.present": None,
                "optimizer.forloop": None,
                "optimizer.param_tensors": None,
                "optimizer.name": None,
            },
        ),
    ],
    "dataloader": [
        Case(
            "four busy workers, measured",
            breakdown=GPU,
            record=_record(
                timed_seconds=3.0,
                timed_steps=1000,
                environment={"cpu_count": 16},
                dataloaders=[_loader()],
                worker_samples={"by_activity": {"busy": 0.75, "idle": 0.25}, "cpu_s_per_batch": 0.012},
            ),
            tolerance=1e-12,
            expected={
                "dataloader.present": 1,
                "dataloader.num_workers": 4,
                "dataloader.pin_memory": 1,
                "dataloader.persistent_workers": 0,
                "dataloader.prefetch_factor": 0,
                "dataloader.batch_size": 32,
                "dataloader.iterators": 2,
                "dataloader.steps_per_epoch": 32,
                "dataloader.startup_s": 2.0 - 0.001,
                "dataloader.restart_share": 1.999 / (1.999 + 32 * 3.0 / 1000),
                "dataloader.single_process": None,
                "workers.busy": 0.75,
                "workers.cpu_per_batch_ms": 12.0,
                "workers.load": 1.0,  # 12 ms of CPU over 4 workers, against 3 ms steps (busy sampled 0.75)
                # one batch every 3 ms against the step's own 3 x (1 - 0.125) ms: 12.5% waiting
                "workers.steady_wait": 0.125,
                "data.steady_wait": None,  # not recorded: the CPU time's figure
                "data.wait": 0.125,
                "workers.balance": 5,  # ceil(12 / (3.0 * (1 - 0.125)))
                "suggest.num_workers": 6,  # the balance plus one
                # the measured 12 ms per batch is 4 steps of 3 ms; plus the main thread's other work (12.5%),
                # over the step left without data wait and other work (1 - 0.125 - 0.095): ceil(5.29) + 1
                "suggest.preprocess_workers": 7,
                "suggest.workers_basis": "16 CPUs: at most 15 workers beside the main process",
            },
        ),
        Case(
            "the steady steps' waits, recorded: measured, before any CPU time",
            breakdown=GPU,
            # the timed steps of 3, 3, 4, 3 and 30 ms waited 1, 1, 2, 1 and 20 ms for data
            record=_record(**FIVE_TIMED, data_wait_s=[0.0, 0.0, 0.0, 0.0, 0.001, 0.002, 0.004, 0.005, 0.025]),
            tolerance=1e-4,
            expected={"data.steady_wait": 25 / 43, "data.wait": 25 / 43},  # the window's: 0.125
        ),
        Case(
            "drop_last: whole batches only",
            record=_record(dataloaders=[_loader(drop_last=True, first_batch_wait_s=[])]),
            expected={
                "dataloader.steps_per_epoch": 31,
                "dataloader.startup_s": None,
                "dataloader.restart_share": None,
                "suggest.num_workers": None,
            },
        ),
        Case(
            "a bare trace of a single-process loader",
            breakdown=_breakdown(kinds={"single": 2}),
            expected={
                "dataloader.present": 1,
                "dataloader.single_process": 1,
                "dataloader.num_workers": 0,  # the iterator class says so
                "suggest.num_workers": 2,  # ceil(0.25 / 0.75) + 1, no CPU limit known
                "suggest.preprocess_workers": None,
                "suggest.workers_basis": None,  # the CPU count is not in a trace
            },
        ),
        Case(
            "a bare trace of a multi-process loader: how many workers is not in the trace",
            breakdown=_breakdown(kinds={"multi": 2}),
            expected={
                "dataloader.present": 1,
                "dataloader.single_process": 0,
                "dataloader.num_workers": None,
                "suggest.num_workers": None,
            },
        ),
        Case(
            "a CPU-only run on 4 cores leaves the model half of them",
            breakdown=_breakdown(has_gpu=False),
            record=_record(
                environment={"cpu_count": 4},
                dataloaders=[_loader(num_workers=0)],
            ),
            expected={
                "suggest.num_workers": 1,
                "suggest.preprocess_workers": 1,
                "suggest.workers_basis": "4 CPUs, shared with the model's own threads (half for the workers): at most 1 worker beside the main process",
            },
        ),
        Case(
            "a record without a DataLoader",
            breakdown=_breakdown(kinds={"multi": 2}),
            record=_record(),
            expected={
                "dataloader.present": 0,
                "dataloader.single_process": 0,
            },
        ),
        Case(
            "a DataLoader built at start-up that fed no profiled step: the script feeds its steps itself",
            breakdown=GPU,
            record=_record(dataloaders=[_loader(fetches_in_window=0), _loader(loader_id=1, fetches_in_window=0)]),
            expected={"dataloader.present": 0},
        ),
        Case("one step in four waits long: bursty", breakdown=BURSTY, expected={"data.waiting_steps": 0.25}),
    ],
    "memory": [
        Case(
            "an eighth of 80 GB reserved",
            record=_record(
                memory={"capacity_bytes": 80e9, "peak_allocated_bytes": 8e9, "peak_reserved_bytes": 10e9},
                samples_per_step=[32, 32, 0, 16],
            ),
            expected={
                "memory.capacity_gb": 80.0,
                "memory.peak_allocated_share": 0.1,
                "memory.peak_reserved_share": 0.125,
                "memory.oom": 0,
                "batch.size": 32,
                "suggest.batch_size": 128,
            },
        ),
        Case(
            "1% of 80 GB reserved: memory holds 64x the batch, a suggestion grows it 8x",
            record=_record(
                memory={"capacity_bytes": 80e9, "peak_allocated_bytes": 0.6e9, "peak_reserved_bytes": 0.8e9},
                samples_per_step=[32, 32],
            ),
            expected={"batch.size": 32, "suggest.batch_size": 256, "batch.option": None, "batch.flag": None},
        ),
        Case(
            "no DataLoader: the samples counted from the script's --batch-size, which is the knob",
            record=_record(
                memory={"capacity_bytes": 80e9, "peak_allocated_bytes": 0.6e9, "peak_reserved_bytes": 0.8e9},
                samples_per_step=[32, 32],
                samples_from="--batch-size",
            ),
            expected={"batch.size": 32, "suggest.batch_size": 256, "batch.option": 1, "batch.flag": "--batch-size"},
        ),
        Case(
            "a DataLoader over the script's batch sampler (batch_size unset), built with its --batch-size 4",
            record=_record(
                memory={"capacity_bytes": 80e9, "peak_allocated_bytes": 0.6e9, "peak_reserved_bytes": 0.8e9},
                samples_per_step=[4, 4],
                dataloaders=[_loader(batch_size=None, fetches_in_window=2)],
                batch_option={"flag": "--batch-size", "dest": "batch_size", "value": 4},
            ),
            expected={
                "dataloader.batch_sampler": 1,
                "batch.script_option": 1,
                "batch.script_flag": "--batch-size",
                "batch.flag": None,
            },
        ),
        Case(
            "the script's --batch_size 32 accumulated 8 times is the step's 256 samples; a loader's batch_size set",
            record=_record(
                memory={"capacity_bytes": 80e9, "peak_allocated_bytes": 0.6e9, "peak_reserved_bytes": 0.8e9},
                samples_per_step=[256, 256],
                dataloaders=[_loader(batch_size=32, fetches_in_window=16)],
                batch_option={"flag": "--batch_size", "dest": "batch_size", "value": 32, "accumulation": 8},
            ),
            expected={"dataloader.batch_sampler": 0, "batch.script_flag": "--batch_size"},
        ),
        Case(
            "an option whose value is not the steps' batch names nothing",
            record=_record(samples_per_step=[64, 64], batch_option={"flag": "--bs", "dest": "bs", "value": 16}),
            expected={"dataloader.batch_sampler": None, "batch.script_option": None, "batch.script_flag": None},
        ),
        Case(
            "a data set of 40 batches: at most 2x, so that an epoch keeps 16 batches",
            record=_record(
                memory={"capacity_bytes": 80e9, "peak_allocated_bytes": 0.6e9, "peak_reserved_bytes": 0.8e9},
                samples_per_step=[64, 64],
                dataloaders=[_loader(dataset_len=2560, batch_size=64, batches_per_epoch=40, fetches_in_window=2)],
            ),
            expected={"batch.size": 64, "dataloader.steps_per_epoch": 40, "suggest.batch_size": 128},
        ),
        Case(
            "a data set of 20 batches: no larger batch to suggest",
            record=_record(
                memory={"capacity_bytes": 80e9, "peak_allocated_bytes": 0.6e9, "peak_reserved_bytes": 0.8e9},
                samples_per_step=[64, 64],
                dataloaders=[_loader(dataset_len=1280, batch_size=64, batches_per_epoch=20, fetches_in_window=2)],
            ),
            expected={"batch.size": 64, "suggest.batch_size": 64},
        ),
        Case(
            "out of memory, capacity unknown",
            record=_record(status="oom"),
            expected={
                "memory.oom": 1,
                "memory.capacity_gb": None,
                "batch.size": None,
                "suggest.batch_size": None,
            },
        ),
    ],
    "limits": [
        Case(
            "bf16 on an H100: half the peak, 3 kernel classes, a misaligned head, hand-written attention, memory by owner",
            breakdown=LIMITS_GPU,
            record=LIMITS_RECORD,
            expected={
                "flops.tflop_per_step": 4.947,
                "flops.achieved_tflops": 494.7,
                "flops.peak_tflops": 989.4,
                "flops.mfu": 0.5,
                "kernels.matmul_share": 0.6,
                "kernels.elementwise_share": 0.3,
                "kernels.reduction_share": 0.1,
                "kernels.attention_share": 0.0,
                "kernels.summary": "matmul 60% (compute-bound, 83% of its roof), elementwise 30% (memory-bound, 60% of its roof), "
                "reduction 10% (memory-bound, 30% of its roof)",
                "attention.unfused_flop_share": 0.125,
                "matmul.misaligned_share": 0.25,
                "memory.parameters_gb": 2.0,
                "memory.gradients_gb": 2.0,
                "memory.optimizer_gb": 4.0,
                "memory.activations_gb": 20.0,
                "memory.headroom_gb": 50.0,
                "memory.largest_batch": 201,
                "memory.samples": 64,
                "matmul.roof_share": 1.0,
                "suggest.batch_to_fill": None,
                "oom.allocated_gb": None,
                "oom.requested_gb": None,
                "oom.largest": None,
                "oom.changes": None,
            },
            tolerance=1e-9,
        ),
        Case(
            "a tiny batch: 16-row matmuls at 5% of the peak at best, 512 rows fill them, 8x (128) suggested",
            breakdown=LIMITS_GPU,
            record=_record(**LIMITS_TINY_FIELDS),
            expected={
                # activations 17 - 12 - 4 (gradients made) = 1 GB for 16 samples; (72 - 16) GB / 62.5 MB = 896
                "memory.activations_gb": 1.0,
                "memory.samples": 16,
                "memory.largest_batch": 896,
                "matmul.roof_share": 0.05396,
                "suggest.batch_to_fill": 128,
            },
            tolerance=1e-4,
        ),
        Case(
            "out of memory: the snapshot at the error",
            record=_record(status="oom", memory_at_oom=LIMITS_OOM),
            expected={
                "oom.allocated_gb": 78.0,
                "oom.requested_gb": 2.147483648,
                "oom.activations_gb": 70.0,
                "oom.parameters_gb": 2.0,
                "oom.gradients_gb": 2.0,
                "oom.optimizer_gb": 4.0,
                "oom.largest": "activations",
                "oom.changes": "# 1. a smaller batch (activations scale with it), or gradient accumulation over micro-batches\n"
                "# 2. activation checkpointing: torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)\n"
                '# 3. bf16 autocast: with torch.autocast("cuda", dtype=torch.bfloat16) halves activations\n'
                "# 4. smaller optimizer state: SGD with momentum keeps one copy of the weights, Adam two"
                " (or shard it: ZeroRedundancyOptimizer, FSDP)\n"
                "# 5. optimizer.zero_grad(set_to_none=True) frees gradients between steps (the default since torch 2.0)",
                "memory.parameters_gb": None,
                "flops.mfu": None,
            },
        ),
        Case(
            "an unknown GPU: achieved TFLOP/s, no peak, no MFU",
            breakdown=LIMITS_GPU,
            record=_record(
                **{**LIMITS_RECORD_FIELDS, "environment": {"device": "cuda", "device_name": "Some Future GPU"}}
            ),
            expected={
                "flops.achieved_tflops": 494.7,
                "flops.peak_tflops": None,
                "flops.mfu": None,
                "kernels.matmul_share": 0.6,
                "kernels.summary": "matmul 60%, elementwise 30%, reduction 10%",
            },
            tolerance=1e-9,
        ),
        Case(
            "a bare trace: kernel classes, never a FLOP count or a guess",
            breakdown=LIMITS_GPU,
            expected={
                "kernels.elementwise_share": 0.3,
                "flops.mfu": None,
                "flops.achieved_tflops": None,
                "attention.unfused_flop_share": None,
                "matmul.misaligned_share": None,
                "memory.largest_batch": None,
            },
            tolerance=1e-9,
        ),
    ],
    "environment": [
        Case(
            "flags and two models",
            record=_record(
                environment={"cpu_count": 16, "cpu_cores": 8, "loader_receive_ms_per_mb": 0.33},
                flags={
                    "cudnn_benchmark": True,
                    "matmul_allow_tf32": False,
                    "float32_matmul_precision": "high",
                    "create_graph_calls": 3,
                },
                models=[
                    ModelInfo("m", 10, "float32", 3, True, False, False, True),
                    ModelInfo("n", 5, "float32", 2, False, True, True, False),
                ],
            ),
            expected={
                "cpu.count": 16,
                "cpu.cores": 8,
                "host.loader_receive_ms_per_mb": 0.33,
                "cudnn.benchmark": 1,
                "matmul.tf32": 1,
                "autograd.create_graph": 1,
                "model.conv_layers": 5,
                "model.channels_last": 1,
                "model.compiled": 1,
                "model.data_parallel": 1,
                "model.ddp": 1,
            },
        ),
        Case(
            "nothing recorded",
            record=_record(),
            expected={
                "cpu.count": None,
                "cpu.cores": None,
                "host.loader_receive_ms_per_mb": None,
                "cudnn.benchmark": None,
                "matmul.tf32": None,
                "autograd.create_graph": None,  # flags from before it was counted say nothing of it
                "model.compiled": None,
                "model.data_parallel_devices": None,
                "fsdp.prefetch_set": None,
                "fsdp.version": None,
                "ddp.bucket_cap_mb": None,
            },
        ),
        # issue 33: the settings the rules would advise, as the runner read them off the wrappers
        Case(
            "nn.DataParallel over one GPU",
            record=_record(
                models=[
                    ModelInfo("dp", 10, "float32", 0, False, False, True, False, {"kind": "DataParallel", "devices": 1})
                ]
            ),
            expected={
                "model.data_parallel": 1,
                "model.data_parallel_devices": 1,
                "fsdp.prefetch_set": None,
                "fsdp.version": None,
            },
        ),
        Case(
            "FSDP2 with explicit forward and backward prefetch",
            record=_wrapped(
                {
                    "kind": "FSDP2",
                    "sharded_modules": 5,
                    "forward_prefetch_modules": 3,
                    "backward_prefetch_modules": 3,
                }
            ),
            expected={"fsdp.prefetch_set": 1, "fsdp.version": 2, "model.data_parallel_devices": None},
        ),
        Case(
            "FSDP2 with its default prefetch",
            record=_wrapped(
                {
                    "kind": "FSDP2",
                    "sharded_modules": 5,
                    "forward_prefetch_modules": 0,
                    "backward_prefetch_modules": 0,
                }
            ),
            expected={"fsdp.prefetch_set": 0, "fsdp.version": 2},
        ),
        Case(
            "FSDP1 with forward_prefetch and BACKWARD_PRE",
            record=_wrapped(
                {
                    "kind": "FSDP1",
                    "sharded_modules": 3,
                    "forward_prefetch": True,
                    "backward_prefetch": "BACKWARD_PRE",
                }
            ),
            expected={"fsdp.prefetch_set": 1, "fsdp.version": 1},
        ),
        Case(
            "FSDP1 with its defaults: BACKWARD_PRE but no forward_prefetch",
            record=_wrapped(
                {
                    "kind": "FSDP1",
                    "sharded_modules": 3,
                    "forward_prefetch": False,
                    "backward_prefetch": "BACKWARD_PRE",
                }
            ),
            expected={"fsdp.prefetch_set": 0, "fsdp.version": 1},
        ),
        Case(
            "DDP with 100 MB buckets",
            record=_record(
                models=[
                    ModelInfo(
                        "ddp", 10, "float32", 0, False, False, False, True, {"kind": "DDP", "bucket_cap_mb": 100.0}
                    )
                ]
            ),
            expected={"ddp.bucket_cap_mb": 100.0, "model.ddp": 1, "fsdp.version": None},
        ),
    ],
    "compiled": [
        Case(
            "a graph break and shape recompilations after the warm-up",
            record=_record(
                compile={
                    "enabled": True,
                    "cudagraphs": False,
                    "graph_break_count": 2,
                    "window_seen": True,
                    "compiles_after_warmup": 3,
                    "graph_breaks": [
                        {"reason": "Unsupported Tensor.item() call with capture_scalar_outputs=False", "count": 2}
                    ],
                    "graph_break_sites": [{"site": "/a/model.py:26", "count": 1, "code": "if h.mean().item() > 1e6:"}],
                    "recompile_reasons": [
                        {
                            "reason": "tensor 'x' size mismatch at index 0. expected 16, actual 24",
                            "site": "/a/model.py:20",
                            "function": "forward",
                            "count": 2,
                        },
                        {
                            "reason": "first compilation of this frame",
                            "site": "/a/model.py:26",
                            "function": "resume",
                            "count": 1,
                        },
                    ],
                }
            ),
            expected={
                "compile.enabled": 1,
                "compile.mode_reduce_overhead": 0,
                "compile.graph_breaks": 2,
                "compile.recompiles": 3,
                "compile.issues": "dynamo broke the graph: `Unsupported Tensor.item() call with capture_scalar_outputs=False` (2x); "
                "it recompiled after the warm-up: `tensor 'x' size mismatch at index 0. expected 16, actual 24` (2x)",
                "compile.sites": "model.py:26 `if h.mean().item() > 1e6:` (graph break); model.py:20 in forward (recompiles)",
            },
        ),
        Case(
            "reduce-overhead, clean",
            record=_record(compile={"enabled": True, "cudagraphs": True, "graph_break_count": 0, "window_seen": False}),
            expected={
                "compile.enabled": 1,
                "compile.mode_reduce_overhead": 1,
                "compile.graph_breaks": 0,
                "compile.recompiles": None,
                "compile.issues": None,
                "compile.sites": None,
            },
        ),
        Case(
            "not compiled",
            record=_record(),
            expected={"compile.enabled": 0, "compile.mode_reduce_overhead": 0, "compile.graph_breaks": None},
        ),
    ],
    "distributed": [
        Case(
            "rank 1 waits for data, with twice the samples",
            record=_record(distributed={"backend": "gloo", "cuda_available": True}),
            ranks=RankSet.of([_summary(0, 1.0, 0.5, 16), _summary(1, 6.0, 0.25, 32)]),
            expected={
                "dist.world_size": 2,
                "dist.straggler_rank": 1,
                "dist.straggler_data_share": 0.5,
                "dist.straggler_data_ms": 6.0,
                "dist.others_data_ms": 1.0,
                "dist.samples_imbalance": 2.0,
                "dist.gloo_with_gpus": 1,
            },
        ),
        Case(
            "one rank: no straggler",
            ranks=RankSet.of([_summary(0, 1.0, 0.5, 16)]),
            expected={
                "dist.world_size": 1,
                "dist.straggler_rank": None,
                "dist.samples_imbalance": 1.0,
                "dist.gloo_with_gpus": None,
                "dist.all_gather_exposed": None,
                "dist.all_reduce_calls_per_step": None,
                "dist.all_reduce_overlapped": None,
            },
        ),
        Case(
            "FSDP: the least exposed all-gather and reduce-scatter of any rank; the first rank's all-reduce",
            ranks=RankSet.of(
                [
                    _with_collectives(
                        _summary(0, 1.0, 0.5, 16),
                        all_gather=(3.0, 1.0),
                        reduce_scatter=(1.0, 1.0),
                        all_reduce=(0.5, 1.5, 2),
                    ),
                    _with_collectives(
                        _summary(1, 1.0, 0.5, 16),
                        all_gather=(2.0, 2.0),
                        reduce_scatter=(1.5, 0.5),
                        all_reduce=(1.0, 1.0, 2),
                    ),
                ]
            ),
            expected={
                "dist.all_gather_exposed": 0.2,
                "dist.reduce_scatter_exposed": 0.1,
                "dist.all_reduce_exposed": 0.05,
                "dist.all_reduce_calls_per_step": 2,
                "dist.all_reduce_overlapped": 0.75,
            },
        ),
        Case(
            "DDP buckets against 70 KB of gradients: the least bucket; a 1.7 GiB model's: 4 and 8 buckets",
            record=_record(
                models=[ModelInfo("DistributedDataParallel", 17_920, "float32", 0, False, False, False, True)],
            ),
            expected={"model.gradient_mib": 0.068, "dist.bucket_mb_to_overlap": 1.0, "dist.bucket_mb_to_batch": 25.0},
        ),
        Case(
            "a bf16 model of 300 MiB of gradients",
            record=_record(
                models=[
                    ModelInfo("DistributedDataParallel", 157_286_400, "torch.bfloat16", 0, False, False, False, True)
                ],
            ),
            expected={"model.gradient_mib": 300.0, "dist.bucket_mb_to_overlap": 25.0, "dist.bucket_mb_to_batch": 38.0},
        ),
        # issue 34: what smaller buckets could hide (the exposed all-reduce, 0.2 of the 10 ms step,
        # less the last of four 25 MiB buckets: 0.15, at most backward's compute), and whether the
        # GPU waits for the host's code (launch 0.25 + other code 0.125 less the idle after syncs)
        Case(
            "100 MiB in one bucket on a GPU: at most the GPU's backward kernels (0.125) hide it",
            breakdown=_breakdown(),
            record=_record(
                models=[ModelInfo("DistributedDataParallel", 26_214_400, "float32", 0, False, False, False, True)],
            ),
            ranks=RankSet.of([_with_collectives(_summary(r, 1.0, 2.0, 16), all_reduce=(2.0, 0.0, 1)) for r in (0, 1)]),
            expected={
                "dist.all_reduce_hideable": 0.125,
                "dist.gpu_idle_for_host": 0.25 + 0.125 - 0.03,
                "dist.cpu_cores_per_rank": None,  # a GPU run
            },
            tolerance=1e-9,
        ),
        Case(
            "the same on a CPU run: the main thread's backward (0.25); no GPU to wait; 2 ranks on 3 CPUs",
            breakdown=_breakdown(has_gpu=False),
            record=_record(
                models=[ModelInfo("DistributedDataParallel", 26_214_400, "float32", 0, False, False, False, True)],
                environment={"cpu_count": 3},
            ),
            ranks=RankSet.of([_with_collectives(_summary(r, 1.0, 2.0, 16), all_reduce=(2.0, 0.0, 1)) for r in (0, 1)]),
            expected={
                "dist.all_reduce_hideable": 0.15,
                "dist.gpu_idle_for_host": None,
                "dist.cpu_cores_per_rank": 1.5,
            },
        ),
        Case(
            "a rank without the kind: none (its share is unknown, not zero)",
            ranks=RankSet.of(
                [
                    _with_collectives(_summary(0, 1.0, 0.5, 16), all_gather=(3.0, 1.0)),
                    _summary(1, 1.0, 0.5, 16),
                ]
            ),
            expected={"dist.all_gather_exposed": None, "dist.reduce_scatter_exposed": None},
        ),
    ],
    "lines": [
        Case(
            "syncs, a blocking copy, sampled lines",
            record=_record(
                profiled_steps=2,
                sync_sites=SYNC_SITES,
                host_samples={"lines": HOST_LINES},
                optimizers=[OptimizerInfo("Adam", 100, 1000, "for-loop", created_at="/x/train.py:12")],
            ),
            expected={
                "lines.sync": "train.py:10 `loss.item()` (item, 2/step, 0.5 ms/step blocked); train.py:12 `x.to(dev)` (blocking copy, 1/step)",
                "lines.sync_sites": "train.py:10",  # the blocking copy is DATA002's, not a sync to unsync
                "lines.h2d": "train.py:12 `x.to(dev)` (1/step)",
                "lines.model": "model.py:5 `self.fc(x)` (model, 50% of the step)",
                "lines.optimizer": "train.py:12 (Adam, for-loop, 100 tensors); train.py:30 `opt.step()` (6% of the step)",
                "lines.host_other": "train.py:20 `augment(x)` (25% of the step)",
                "host.other_user_share": 0.25,
                "lines.data": "train.py:8 `next(it)` (12% of the step)",
            },
        ),
        Case(
            "the workers' lines, when sampled",
            record=_record(
                host_samples={"lines": HOST_LINES[2:3]},
                worker_samples={
                    "lines": [{"site": "/a/data.py:40", "code": "decode(f)", "activity": "cpu", "share": 0.75}],
                },
            ),
            expected={
                "lines.data": "data.py:40 `decode(f)` (cpu, 75% of worker time)",
                "host.samples": None,  # no count of the main thread's samples: no share rests on it
                "lines.sync": None,
                "lines.sync_sites": None,
                "host.other_user_share": None,
            },
        ),
        Case(
            "a batch built by hand a sample at a time: the helper's looping lines, not the loop's own",
            breakdown=GPU,
            record=_record(samples_from="--batch_size", host_samples={"lines": BATCH_BUILDING_LINES, "samples": 99}),
            expected={"host.batch_build_share": 0.05 + 0.03, "host.samples": 99.0},
        ),
        Case(
            "the main thread waiting on the script's own producers' queue: the waiting samples of other code",
            breakdown=GPU,
            record=_record(
                host_samples={
                    "samples": 400,
                    "lines": [
                        {
                            "where": "other",
                            "site": "/x/utils.py:87",
                            "function": "next_batch",
                            "code": "return q.get()",
                            "samples": 100,
                            "share": 0.25,
                            "waits": 96,
                        },
                        {
                            "where": "other",
                            "site": "/x/train.py:20",
                            "function": "<module>",
                            "code": "x = prep(b)",
                            "samples": 40,
                            "share": 0.1,
                        },
                        {
                            "where": "data",
                            "site": "/x/train.py:8",
                            "function": "<module>",
                            "code": "next(it)",
                            "samples": 40,
                            "share": 0.1,
                            "waits": 40,
                        },
                    ],
                }
            ),
            expected={"host.queue_wait_share": 96 / 400},
        ),
        Case(
            "no sampled line waited for another thread or process",
            breakdown=GPU,
            record=_record(host_samples={"lines": BATCH_BUILDING_LINES, "samples": 99}),
            expected={"host.queue_wait_share": None},
        ),
        Case(
            "the same lines where a DataLoader fed the steps: nothing counted",
            breakdown=GPU,
            record=_record(host_samples={"lines": BATCH_BUILDING_LINES}),
            expected={"host.batch_build_share": None},
        ),
        Case(
            "no line sampled in backward or the optimizer: the loop's function is unknown",
            breakdown=GPU,
            record=_record(
                samples_from="--batch_size",
                host_samples={
                    "lines": [x for x in BATCH_BUILDING_LINES if x["where"] not in ("backward", "optimizer")]
                },
            ),
            expected={"host.batch_build_share": None},
        ),
    ],
    "frameworks": [
        Case(
            "the HF Trainer (and the Accelerator it builds itself)",
            record=_record(
                frameworks=[
                    FrameworkInfo(
                        "hf_trainer",
                        "arguments",
                        "TrainingArguments",
                        "5.23.0",
                        "/u/train.py:40",
                        "args = TrainingArguments(",
                        {"bf16": False},
                    ),
                    FrameworkInfo("hf_trainer", "trainer", "Trainer", "5.23.0", "/u/train.py:50", "trainer = Trainer("),
                    FrameworkInfo(
                        "accelerate",
                        "accelerator",
                        "Accelerator",
                        "1.15.0",
                        "/u/train.py:50",
                        "",
                        {"mixed_precision": "bf16"},
                    ),
                ]
            ),
            expected={
                "framework.hf_trainer": 1,
                "framework.lightning": 0,
                "framework.accelerate": 0,
                "framework.mixed_precision": 0,
                "lines.framework": "train.py:40 `args = TrainingArguments(` (TrainingArguments 5.23.0); train.py:50 `trainer = Trainer(` (HF Trainer 5.23.0)",
            },
        ),
        Case(
            "Lightning in bf16-mixed, with the user's training_step",
            record=_record(
                frameworks=[
                    FrameworkInfo(
                        "lightning",
                        "trainer",
                        "Trainer",
                        "2.6.6",
                        "/u/fit.py:30",
                        "trainer = L.Trainer(",
                        {"precision": "bf16-mixed", "module": "Net"},
                        {"training_step": "/u/fit.py:12"},
                    ),
                ]
            ),
            expected={
                "framework.lightning": 1,
                "framework.mixed_precision": 1,
                "lines.framework": "fit.py:30 `trainer = L.Trainer(` (Lightning Trainer 2.6.6); fit.py:12 (Net.training_step)",
            },
        ),
        Case(
            "Lightning Fabric in 32-true, with the user's setup call",
            record=_record(
                frameworks=[
                    FrameworkInfo(
                        "fabric",
                        "fabric",
                        "Fabric",
                        "2.6.6",
                        "/u/loop.py:20",
                        'fabric = Fabric(accelerator="cuda")',
                        {"precision": "32-true", "world_size": 1, "module": "GPT"},
                        {"setup": "/u/loop.py:24"},
                    ),
                ]
            ),
            expected={
                "framework.fabric": 1,
                "framework.lightning": 0,
                "framework.accelerate": 0,
                "framework.mixed_precision": 0,
                "lines.framework": 'loop.py:20 `fabric = Fabric(accelerator="cuda")` (Fabric 2.6.6); loop.py:24 (fabric.setup(GPT))',
            },
        ),
        Case(
            "a plain PyTorch loop",
            record=_record(),
            expected={
                "framework.lightning": 0,
                "framework.hf_trainer": 0,
                "framework.fabric": 0,
                "framework.accelerate": 0,
                "framework.mixed_precision": None,
                "lines.framework": None,
            },
        ),
        Case("a bare trace: nothing known", expected={"framework.hf_trainer": None, "framework.mixed_precision": None}),
    ],
    "evaluation": [
        Case(
            "passes in two of four profiled steps",
            record=EVAL_RECORD,
            expected={"step.eval_share": 0.2 / 4, "step.eval_steps": 0.5, "step.eval_passes": 2},
            tolerance=1e-9,
        ),
        Case(
            "a GPU trace with evaluation passes: the other host work is net of them",
            breakdown=GPU,
            record=EVAL_RECORD,
            expected={"exposed.other_not_sync": 0.125 - 0.03 - 0.05},
            tolerance=1e-9,
        ),
        Case(
            "no pass in the window: not measured",
            record=_record(plan={"warmup": 1, "steps": 4, "timed": 0}, profiled_steps=4, boundaries_s=[0.0, 1.0, 2.0]),
            expected={"step.eval_share": None, "step.eval_steps": None, "step.eval_passes": None},
        ),
    ],
    "wholerun": [
        Case(
            "windows taken at slow steps (one due, one at once) and a periodic one",
            record=whole_record(
                windows=[
                    {"reason": "slow step", "first_step": 3, "steps": 3},
                    {"reason": "slow step due", "first_step": 9, "steps": 1},
                    {"reason": "periodic", "first_step": 12, "steps": 3},
                ]
            ),
            expected={"whole.slow_windows": 2},
        ),
        Case(
            "a watched run: tests/wholebuilder.py",
            record=whole_record(),
            tolerance=1e-9,
            expected={
                "whole.watched": 1,
                "whole.wall_s": 16.0,
                "whole.goodput": 8.7 / 16,
                "whole.named_share": 1 - 3.2 / 16,
                "whole.startup_share": 1.9 / 16,
                "whole.stall_share": 3.2 / 16,
                "whole.gc_share": 0.0,
                "whole.contention_share": 0.0,
                "whole.eval_share": 0.5 / 16,
                "whole.eval_s": 0.5,
                "whole.eval_count": 1,
                "whole.eval_name": "HF Trainer.evaluate (eval_strategy / eval_steps)",
                "whole.checkpoint_share": 0.4 / 16,
                "whole.checkpoint_s": 0.4,
                "whole.checkpoint_count": 2,
                "whole.checkpoint_mean_s": 0.2,
                "whole.checkpoint_every_steps": 2,
                "whole.checkpoint_name": "torch.save",
                "whole.epoch_starts": 1,
                "whole.epoch_start_share": 0.3 / 16,
                "whole.epoch_start_mean_s": 0.25,
                "whole.loader_persistent": 0,
                "whole.loader_workers": 2,
                "whole.compile_share": 0.4 / 16,
                "whole.recompiles": 1,
                "whole.recompile_share": 0.1 / 16,
                "whole.recompile_reason": "tensor 'x' size mismatch at index 1. expected 8, actual 9 (1x)",
                "whole.slowdown": None,
                "whole.slowdown_share": None,
                "whole.creep_lost_share": None,
                "whole.step_early_ms": None,
                "whole.step_late_ms": None,
                "whole.memory_growth": 0.4,
                "whole.memory_growth_gb": 0.04,
                "whole.memory_rising": 1.0,
                "whole.memory_hours_to_capacity": (1e9 - 140e6) / 5e6 / 3600,
                "whole.memory_kind": "host memory (RSS)",
                "whole.slow_windows": 0,
            },
        ),
        Case(
            "diagnose run: nothing watched",
            record=_record(),
            expected={"whole.watched": None, "whole.goodput": None, "whole.eval_share": None},
        ),
    ],
}


@pytest.mark.parametrize(
    "case",
    [c for cases in CASES.values() for c in cases],
    ids=[f"{m}: {c.name}" for m, cases in CASES.items() for c in cases],
)
def test_symptom_values(case: Case) -> None:
    symptoms = compute_symptoms(case.breakdown, case.record, case.meta, case.ranks)
    values = symptoms.values_by_name()
    for name, want in case.expected.items():
        assert name in CATALOG, name
        got = symptoms.texts.get(name) if CATALOG[name][0] == "text" else values.get(name)
        if isinstance(want, float) and case.tolerance:
            assert got == pytest.approx(want, rel=case.tolerance), name
        else:
            assert got == want, name


def test_every_symptom_is_tested_in_its_own_module() -> None:
    from diagnose.analysis.symptoms import MODULES
    from diagnose.analysis.symptoms.registry import definitions_in

    for module in MODULES:
        subject = module.__name__.rsplit(".", 1)[-1]
        declared = {d.name for d in definitions_in(vars(module))}
        tested = {name for case in CASES[subject] for name in case.expected}
        assert declared <= tested, (subject, sorted(declared - tested))


def _plus_one(known) -> float | None:
    first = known.get("t.first")
    return None if first is None else first + 1


def test_order_comes_from_declared_uses_not_from_position() -> None:
    later = declare("t.later", "count", "reads t.first", _plus_one, uses=("t.first",))
    first = declare("t.first", "count", "from the record", lambda record: record.profiled_steps)
    ordered = evaluation_order((later, first))
    assert [d.name for d in ordered] == ["t.first", "t.later"]
    assert evaluate(ordered, {"record": _record(profiled_steps=4)}).values_by_name() == {"t.first": 4.0, "t.later": 5.0}
    assert evaluate(ordered, {}).values_by_name() == {}  # no record: neither


def test_declarations_are_checked() -> None:
    sneaky = declare(
        "t.sneaky", "count", "reads what it did not declare", lambda known: known.get("t.other"), uses=("t.first",)
    )
    first = declare("t.first", "count", "one", lambda record: 1)
    with pytest.raises(KeyError, match="without naming it in uses"):
        evaluate(evaluation_order((first, sneaky)), {"record": _record()})
    with pytest.raises(TypeError, match="not an input"):
        declare("t.bad", "count", "a made-up input", lambda breakdown_please: 1)
    with pytest.raises(TypeError, match="uses="):
        declare("t.bad", "count", "reads others without saying which", lambda known: 1)
    a = declare("t.a", "count", "", lambda known: 1, uses=("t.b",))
    b = declare("t.b", "count", "", lambda known: 1, uses=("t.a",))
    with pytest.raises(ValueError, match="cycle"):
        evaluation_order((a, b))
    with pytest.raises(ValueError, match="no module declares"):
        evaluation_order((a,))
    with pytest.raises(ValueError, match="declared twice"):
        evaluation_order((first, first))


def test_the_decorator_makes_a_definition() -> None:
    @symptom("t.nan", "share", "not a number is not a value")
    def nan(record: RunRecord) -> float:
        return float("nan")

    assert nan.name == "t.nan" and nan.required == frozenset({"record"})
    assert evaluate((nan,), {"record": _record()}).values_by_name() == {}


def test_the_epoch_that_caps_a_suggested_batch_is_the_one_of_the_loader_that_fed_the_steps() -> None:
    """One reading of an epoch's length for the batch a finding suggests (MEM001's symptom) and
    the batch that fills the matmuls (hardware_limits): the loader that fed the window, else none."""
    from diagnose.analysis.measure.memory_breakdown import MAX_BATCH_FACTOR, batch_factor_limit
    from diagnose.analysis.symptoms.dataloader import steps_per_epoch

    fed = _record(dataloaders=[_loader(dataset_len=1000, batch_size=32)])  # 32 batches, 2x at most
    assert steps_per_epoch.compute(fed) == fed.epoch_batches() == 32
    assert batch_factor_limit(fed.epoch_batches()) == 2
    built_only = _record(dataloaders=[_loader(dataset_len=64, fetches_in_window=0)])  # 2 batches, never drawn
    assert steps_per_epoch.compute(built_only) is None and built_only.epoch_batches() is None
    assert batch_factor_limit(built_only.epoch_batches()) == MAX_BATCH_FACTOR
