"""What a fix buys: transform the step's dependency model and replay it.

Contract: each transformation is a pure function ``(model, facts, **params) -> StepModel`` that
raises ``CannotPredict(reason)`` when the model cannot express the change;
``predict(model, check, name, facts, params) -> Prediction`` replays the model before and after.
``TRANSFORMATIONS`` names them (rule files use these names in their ``predict`` key).

``facts`` are the run's symptoms by name (``dataloader.num_workers``, ``cpu.count``,
``workers.cpu_per_batch_ms``, ``optimizer.param_tensors`` ...): what the trace alone does not
carry. Every modelling assumption is a named constant here, with its reason.

Why one module (about 850 lines): ``TRANSFORMATIONS`` is one table, and the transformations
share the tabled rates and the model helpers at the top (rate ratios, which kernels fuse, host
time per launch); each is a few dozen lines, and the rule files name them here, so that a
reader sees every modelling assumption of every fix in one place. ``Predictor`` (the findings'
door to them) is the last section.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial
from itertools import compress, pairwise
from typing import Any

from diagnose.analysis.measure.workers import LOADER_PACED_WAIT, building_workers, per_batch_ms, usable_cpus, wait_ratio
from diagnose.analysis.prediction.replay import (
    STREAM_GAP_US,
    GpuOp,
    HostItem,
    Replay,
    ReplayCheck,
    StepModel,
    changed,
    changer,
    replay,
)
from diagnose.analysis.prediction.uncertainty import StepSample, within_model_error
from diagnose.analysis.trace import forking
from diagnose.analysis.trace import patterns as P
from diagnose.record import Z_INTERVAL

# --- tabled rates ---------------------------------------------------------------------------------

#: Dense Tensor Core throughput over plain fp32 (CUDA core) throughput, by GPU. Keyed by compute
#: capability and a fragment of the device name (first match wins; "" matches any name).
#: Sources: NVIDIA's datasheets, dense (no sparsity) TFLOPS.
RATE_RATIOS: tuple[tuple[tuple[int, int], str, dict[str, float]], ...] = (
    # A100 datasheet: FP32 19.5, TF32 156, BF16 312
    ((8, 0), "", {"tf32": 156 / 19.5, "bf16": 312 / 19.5}),
    # A10 datasheet: FP32 31.2, TF32 62.5, BF16 125
    ((8, 6), "A10", {"tf32": 62.5 / 31.2, "bf16": 125 / 31.2}),
    # L40S datasheet: FP32 91.6, TF32 183, BF16 362
    ((8, 9), "L40S", {"tf32": 183 / 91.6, "bf16": 362 / 91.6}),
    # L4 datasheet: FP32 30.3, TF32 60, BF16 121
    ((8, 9), "L4", {"tf32": 60 / 30.3, "bf16": 121 / 30.3}),
    # H100 SXM datasheet: FP32 67, TF32 494.7, BF16 989.4 (H200: the same compute)
    ((9, 0), "", {"tf32": 494.7 / 67, "bf16": 989.4 / 67}),
)

#: Pinned host-to-device bandwidth when the trace shows no pinned copy to measure it: the link's
#: rate. PCIe 5.0 x16 (Hopper): 32 GT/s x 16 lanes, 128b/130b coding = 63 GB/s; PCIe 4.0 x16
#: (Ampere, Ada): 31.5 GB/s. An upper bound: a real copy reaches 80-90% of it.
PINNED_GBS_BY_MAJOR = {9: 63.0, 8: 31.5}
#: Copies smaller than this are latency, not bandwidth: they do not measure the link.
BANDWIDTH_MIN_BYTES = 1 << 20
#: The most a kernel's batch-independent time (launch, ramp, tail) is taken to be: on an H100
#: the shortest kernels of a step take 1.0-1.5 µs, and a GELU over 16 x 8192 bf16 elements took
#: 1.5 µs where 32 times the rows took 6.5 µs (examples/tiny_batch.py), not 48.
KERNEL_FLOOR_MAX_US = 3.0
#: The least share of the main thread's samples spent waiting on a queue or pipe of the script's
#: own producers (``host.queue_wait_share``) that says they set the pace: below it, a wait can be
#: the queue running dry once (a producer's first batch) rather than producers that never keep up.
#: Not fitted, and a step: SASRec's runs (the one script seen so) read 26%, 5.2% and 7.0%; one at
#: 4.9% would be predicted as if its producers kept up.
QUEUE_PACED_MIN_SHARE = 0.05
#: What the main process spends per MB of a batch that a DataLoader worker hands it through shared
#: memory, where the run did not measure it (``host.loader_receive_ms_per_mb``): receiving it,
#: faulting its pages into this process (the mapping is new), copying them to pinned memory and
#: freeing them. Measured with benchmarks/loader_limits.py on an H100 host (16 cores): with 15
#: workers the pin thread spent 32.5 ms of CPU on each 77.1 MB batch and the loader delivered one
#: every 34.4 ms, although the workers alone delivered one every 25.8 ms without pinning.
LOADER_RECEIVE_MS_PER_MB = 32.5 / 77.1
#: The run's probe (``host.loader_receive_ms_per_mb``: map, fault in, copy, free) runs once at
#: the end, on an idle machine; the pin thread receives while the workers load, and pays more per
#: MB: on the H100 host above the probe gave 0.27-0.37 ms per MB (runs of four calls) against the
#: pin thread's 0.41 beyond its fixed cost with 15 workers busy.
LOADER_RECEIVE_CONTENTION = 1.3
#: What receiving a batch costs beyond its bytes: unpickling it, fetching each storage's file
#: descriptor from the worker, the queues' hand-off (a 0.8 MB batch of two tensors cost the main
#: process 1.3 ms of CPU with pin_memory off on the 2-core development machine, most of it fixed).
LOADER_RECEIVE_BATCH_MS = 1.0

#: Tensors one multi-tensor (fused/foreach) kernel takes: ``depth_to_max_tensors`` in PyTorch's
#: ``aten/src/ATen/native/cuda/MultiTensorApply.cuh`` is {110, 64, 48, 36, 30} for 1-5 tensor
#: lists; Adam's fused step walks 4 lists (params, grads, exp_avg, exp_avg_sq).
FUSED_TENSORS_PER_LAUNCH = 36
#: A fused Adam step reads params, grads and both moments and writes params and moments: 7
#: tensor passes, against 3 for one binary elementwise kernel of the for-loop.
FUSED_PASSES_PER_ELEMENTWISE = 7 / 3
#: torch.compile's elementwise fusion: a run of pointwise kernels (between two kernels that are
#: not) becomes one kernel that reads the run's inputs and writes its outputs, taking about as
#: long as the run's longest kernel (examples/elementwise_chain.py on the H200: 3.39x measured,
#: 2.98x replayed; "two kernels into one" had predicted 1.64x).
#: Kernels that torch.compile's Inductor can fuse (pointwise ops, reductions, norms).
ELEMENTWISE_KERNEL = re.compile(
    r"elementwise_kernel|vectorized_elementwise|unrolled_elementwise|reduce_kernel|softmax|layer_norm|"
    r"LayerNorm|dropout|CatArrayBatchedCopy|fused_dropout|GeluCUDAKernel|index_elementwise|triton_"
)


#: Kernels of library calls that torch.compile cannot fuse, whatever their names share with the
#: pointwise ones: cuDNN's (its recurrent layers' cells: ``elemWiseRNNcell``,
#: ``LSTM_elementWise_fp``; the persistent ``RNN_blockPersist_*``) and cuBLAS/CUTLASS matmuls.
#: Inductor generates its own kernels for what it fuses; these it calls as they are.
LIBRARY_KERNEL = re.compile(r"cudnn|cublas|cutlass|gemm|xmma|nvjet|RNN|LSTM|GRU|elemWise")
#: Kernels of cuDNN's recurrent layers (nn.LSTM, nn.GRU, nn.RNN). TorchDynamo does not trace
#: those modules (``torch._dynamo.config.allow_rnn`` is False by default): each call is a graph
#: break, run eagerly, its host code (cuDNN's own, launching a cell per time step) as it was.
#: An LSTM word-language model measured 0.89x under torch.compile on an H200 where the model,
#: compiling the recurrent layer's host code away, had predicted 2.98x and 3.31x (issue 32).
RNN_KERNEL = re.compile(r"RNN|LSTM|GRU")


#: Under autocast, a memory-bound kernel fed by a bf16 matmul moves bf16 elements (2 bytes)
#: instead of fp32 ones (4 bytes): it takes half as long.
AUTOCAST_BYTE_RATIO = 4 / 2
#: Kernels that stay fp32 under autocast: CUDA autocast runs softmax, the norms and reductions
#: (sum, mean, the losses) in fp32 (the "ops that autocast to float32" list of torch.amp's
#: documentation).
AUTOCAST_FP32_KERNEL = re.compile(
    r"softmax|layer_norm|LayerNorm|group_norm|batch_norm|reduce_kernel|nll_loss|cross_entropy", re.I
)
#: Kernels whose name says they already move 16-bit elements.
HALF_KERNEL = re.compile(r"bfloat16|bf16|half|fp16|__nv_bfloat|c10::Half", re.I)


class CannotPredict(Exception):
    """The model cannot express this change; the message says why."""


@dataclass(frozen=True)
class Prediction:
    transformation: str
    speedup: float | None
    step_us: float | None
    note: str
    #: why the model is known to predict this change badly on this run (None: no known weakness)
    weak: str | None = None
    #: the least speedup the weakness allows where it names one (a loader that may set the pace:
    #: ``loader_ceiling``): the interval's lower edge reaches down to it
    floor: float | None = None
    #: the most it allows where another measure of the run says more (``steady_wait_gain``): the
    #: interval's upper edge reaches up to it
    reach: float | None = None

    @property
    def ok(self) -> bool:
        return self.speedup is not None


# --- helpers --------------------------------------------------------------------------------------


def _fact(facts: Mapping[str, float], name: str) -> float | None:
    value = facts.get(name)
    return None if value is None or math.isnan(value) else float(value)


def rate_ratio(model: StepModel, precision: str) -> float:
    """Tensor Core rate of ``precision`` ("tf32", "bf16") over plain fp32 on this GPU."""
    cc, name = model.compute_capability, model.device_name or ""
    for key, fragment, ratios in RATE_RATIOS:
        if cc == key and fragment in name:
            return ratios[precision]
    raise CannotPredict(f"no tabled Tensor Core rate for {name or 'this GPU'} (compute capability {cc})")


def _median_duration(ops: tuple[GpuOp, ...], keep: Callable[[GpuOp], bool]) -> float | None:
    durations = [op.duration_us for op in ops if keep(op)]
    return statistics.median(durations) if durations else None


def _is_elementwise(op: GpuOp) -> bool:
    return op.kind == "kernel" and bool(ELEMENTWISE_KERNEL.search(op.name)) and not LIBRARY_KERNEL.search(op.name)


def fusible(op: GpuOp) -> bool:
    """Whether torch.compile's Inductor fuses this kernel with its pointwise neighbours: the
    pointwise kernels, reductions and norms ``ELEMENTWISE_KERNEL`` names, never a library's
    (``LIBRARY_KERNEL``)."""
    return _is_elementwise(op)


def _host_per_launch(model: StepModel, phases: tuple[str, ...]) -> float:
    """Host time of model code per launched op in these phases (Python, dispatch, launch)."""
    host = sum(
        it.duration_us for it in model.items if it.phase in phases and it.kind in ("work", "launch") and not it.blocking
    )
    launches = sum(1 for it in model.items if it.kind == "launch" and it.phase in phases)
    return host / launches if launches else model.launch_cost_us


def _rebuild(model: StepModel, items: list[HostItem], ops: list[GpuOp]) -> StepModel:
    return replace(model, items=tuple(items), ops=tuple(ops))


# --- transformations ------------------------------------------------------------------------------


def _reprecision(model: StepModel, ratios: dict[str, float], casts: bool) -> StepModel:
    """Scale matmul/conv/attention kernels by a rate ratio per current precision; with ``casts``
    (autocast) the forward's and backward's memory-bound kernels move bf16 elements
    (``AUTOCAST_BYTE_RATIO``; not those autocast keeps in fp32, ``AUTOCAST_FP32_KERNEL``), and
    one cast kernel (and its launch) comes before each forward matmul: autocast casts its weight
    (inputs that come from another matmul are bf16 already). Casts take as long as the median
    memory-bound kernel did."""
    ops = list(model.ops)
    scaled = set()
    for i, op in enumerate(ops):
        if op.kind != "kernel":
            continue
        precision = P.classify_kernel(op.name).precision
        if precision in ratios:
            ops[i] = _with_duration(op, op.duration_us / ratios[precision])
            scaled.add(i)
    if not scaled:
        raise CannotPredict("no matmul/convolution kernel in this precision to speed up")
    if not casts:
        return model.with_ops(ops)
    for i, op in enumerate(ops):  # memory-bound kernels of forward and backward move bf16
        if (
            i not in scaled
            and _is_elementwise(op)
            and op.phase in ("forward", "backward", "unknown")
            and not AUTOCAST_FP32_KERNEL.search(op.name)
            and not HALF_KERNEL.search(op.name)
        ):
            ops[i] = _with_duration(op, op.duration_us / AUTOCAST_BYTE_RATIO)
    cast_us = _median_duration(model.ops, _is_elementwise) or 0.0
    items: list[HostItem] = []
    for it in model.items:
        if it.kind == "launch" and it.phase == "forward" and any(i in scaled for i in it.ops):
            first = ops[it.ops[0]]
            ops.append(
                GpuOp(
                    first.stream, cast_us, "kernel", "autocast cast", "forward", model.launch_latency_us, STREAM_GAP_US
                )
            )
            items.append(HostItem("launch", model.launch_cost_us, "forward", (len(ops) - 1,)))
        items.append(it)
    for i in sorted(scaled):  # carried-in forward matmuls: their casts are carried in too
        op = model.ops[i]
        if op.carried_ready_us is not None and op.phase in ("forward", "unknown"):
            ops.append(
                GpuOp(op.stream, cast_us, "kernel", "autocast cast", op.phase, 0.0, STREAM_GAP_US, op.carried_ready_us)
            )
    return _rebuild(model, items, ops)


def autocast_bf16(model: StepModel, facts: Mapping[str, float], **_: Any) -> StepModel:
    bf16 = rate_ratio(model, "bf16")
    return _reprecision(model, {"fp32": bf16, "tf32": bf16 / rate_ratio(model, "tf32")}, casts=True)


def tf32(model: StepModel, facts: Mapping[str, float], **_: Any) -> StepModel:
    return _reprecision(model, {"fp32": rate_ratio(model, "tf32")}, casts=False)


def fused_optimizer(
    model: StepModel, facts: Mapping[str, float], param_tensors: float | None = None, **_: Any
) -> StepModel:
    """The optimizer's per-tensor kernels become multi-tensor kernels of
    ``FUSED_TENSORS_PER_LAUNCH`` tensors each; its host code collapses to their launches."""
    tensors = param_tensors or _fact(facts, "optimizer.param_tensors")
    if not tensors:
        raise CannotPredict("the number of parameter tensors is unknown (a trace without its run record)")
    per_tensor = [
        i
        for i, op in enumerate(model.ops)
        if op.phase == "optimizer" and op.kind == "kernel" and not P.classify_kernel(op.name).multi_tensor
    ]
    if not per_tensor:
        raise CannotPredict("the optimizer launches no per-tensor kernels in the trace (already foreach/fused?)")
    steps = max(model.steps, 1)
    kernels_per_tensor = len(per_tensor) / steps / tensors
    fused_launches = math.ceil(tensors / FUSED_TENSORS_PER_LAUNCH)
    total_us = sum(model.ops[i].duration_us for i in per_tensor) / steps
    fused_us = total_us * FUSED_PASSES_PER_ELEMENTWISE / max(kernels_per_tensor, FUSED_PASSES_PER_ELEMENTWISE)
    host_per_launch = _host_per_launch(model, ("forward",))
    dropped = set(per_tensor)
    ops = list(model.ops)
    stream = model.ops[per_tensor[0]].stream
    items: list[HostItem] = []
    in_optimizer = False
    for it in model.items:
        if it.phase != "optimizer":
            in_optimizer = False
            items.append(it)
            continue
        if not in_optimizer:  # the first item of this step's optimizer: the fused launches
            in_optimizer = True
            for _launch in range(fused_launches):
                ops.append(
                    GpuOp(
                        stream,
                        fused_us / fused_launches,
                        "kernel",
                        "multi_tensor_apply_kernel (fused)",
                        "optimizer",
                        model.launch_latency_us,
                        STREAM_GAP_US,
                    )
                )
                items.append(HostItem("launch", host_per_launch, "optimizer", (len(ops) - 1,)))
        if it.kind == "work":
            continue  # the per-tensor Python loop is gone
        kept = tuple(i for i in it.ops if i not in dropped)
        if it.kind == "launch" and not kept:
            continue
        items.append(changed(it, ops=kept) if it.kind == "launch" else it)
    keep = [i not in dropped for i in range(len(ops))]
    return _drop_ops(_rebuild(model, items, ops), keep)


def _drop_ops(model: StepModel, keep: list[bool]) -> StepModel:
    """Remove ops (and their indices from the launches), renumbering the rest."""
    renumbered: list[int | None] = [None] * len(keep)
    kept_at = list(compress(range(len(keep)), keep))
    for new, old in enumerate(kept_at):
        renumbered[old] = new
    ops = list(map(model.ops.__getitem__, kept_at))
    items = []
    for it in model.items:
        if it.kind == "launch":
            kept = tuple(n for n in map(renumbered.__getitem__, it.ops) if n is not None)
            if not kept:
                if it.blocking:
                    continue
                items.append(HostItem("work", it.duration_us, it.phase))
                continue
            if kept != it.ops:  # ops before the first one dropped keep their numbers
                it = _with_ops(it, kept)
        items.append(it)
    return _rebuild(model, items, ops)


#: copies with a few fields changed, for the loops that change the same fields of every op or item
_with_ops = changer(HostItem, "ops")
_with_duration = changer(GpuOp, "duration_us")
_with_host_time = changer(HostItem, "duration_us", "lead_us")
_queued_back_to_back = changer(GpuOp, "latency_us", "gap_us")


#: Host cost of one call of a compiled graph beyond its kernels' launches, as a profile shows
#: it (pytorch/pytorch#150488, one small graph on an H100-class GPU): TorchDynamo's cache lookup
#: and guards, 176 µs; with CUDA graphs, cudagraph trees' checks (128 µs) and cudaGraphLaunch
#: (41 µs) on top. Every graph break makes one more call: each piece of a broken forward is its
#: own graph, and so is its backward (which the autograd engine calls without a cache lookup).
COMPILED_CALL_HOST_US = 176.0
CUDA_GRAPH_CALL_HOST_US = 128.0 + 41.0
#: Host cost of a CUDA-graph replay per parameter tensor the graph takes: cudagraph trees check
#: that each static input still lives at its recorded address before a replay. Measured on the
#: H200 (examples/launch_bound.py under mode="reduce-overhead", 258 parameter tensors): the
#: forward's compiled region with its cache lookup took 1.12 ms and CompiledFunctionBackward
#: 1.13 ms of a profiled step, about 0.86 ms each at the host's unprofiled pace (the steady step
#: was 0.77x the profiled one), where the fixed costs above give 0.35 and 0.17 ms: about 2.3 µs
#: a tensor, forward and backward alike.
CUDA_GRAPH_INPUT_HOST_US = 2.3
#: the phase of a compiled call's own host cost in a transformed model: not model code, so the
#: replay does not scale it (it was measured without the profiler). It comes before the piece's
#: launches, as the guards run before the compiled code launches its kernels.
COMPILED_CALL_PHASE = "compiled call"


def _elastic(it: HostItem) -> bool:
    return it.kind != "wait" and not it.blocking


def graph_breaks(model: StepModel) -> list[int]:
    """Items at which a compiled forward or backward would break its graph: the script's own
    syncs inside them (``if t.all():``, ``.item()``, ``.tolist()``: Dynamo cannot trace a value
    read on the host, so it ends the graph there, runs the sync eagerly and resumes in a new one)."""
    return [i for i, it in enumerate(model.items) if it.phase in ("forward", "backward") and _is_user_sync(model, it)]


def library_layers(model: StepModel) -> set[int]:
    """Items of the host's sequence inside a call of a cuDNN recurrent layer: the launches of its
    kernels (``RNN_KERNEL``) and everything between two of them in the same phase while every
    launch in between launched library kernels only (the layer's matmuls): cuDNN's own host code,
    which no compiler removes. Each such call breaks a compiled graph (``RNN_KERNEL``)."""
    items = model.items

    def library_only(it: HostItem) -> bool:
        return all(LIBRARY_KERNEL.search(model.ops[j].name) for j in it.ops)

    marks = [
        i
        for i, it in enumerate(items)
        if it.kind == "launch" and any(RNN_KERNEL.search(model.ops[j].name) for j in it.ops)
    ]
    out = set(marks)
    for a, b in pairwise(marks):
        if items[a].phase == items[b].phase and all(
            items[i].kind != "launch" or library_only(items[i]) for i in range(a + 1, b)
        ):
            out.update(range(a + 1, b))
    return out


def _is_user_sync(model: StepModel, it: HostItem) -> bool:
    if it.kind == "wait":
        return it.sync_kind == "user"
    return (
        it.kind == "launch" and it.blocking and bool(it.ops) and all(model.ops[j].copy_kind == "DtoH" for j in it.ops)
    )


def _runs(items: tuple[HostItem, ...], phase: str, breaks: set[int]) -> list[list[int]]:
    """Maximal runs of ``phase``'s elastic items, cut at every item that is not one of them and
    at each graph break: the pieces one compiled graph each replaces."""
    runs: list[list[int]] = []
    current: list[int] = []
    for i, it in enumerate(items):
        if it.phase == phase and _elastic(it) and i not in breaks:
            current.append(i)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def compile_model(
    model: StepModel,
    facts: Mapping[str, float],
    fuse: bool = True,
    cuda_graphs: bool = False,
    host_scale: float = 1.0,
    **_: Any,
) -> StepModel:
    """torch.compile: runs of forward/backward pointwise kernels fuse into one (``fuse``), and each piece of
    the host's model code (a forward, or the part of it between two graph breaks; a backward)
    becomes one compiled call: its remaining launches (with ``cuda_graphs``: one graph launch, the
    GPU running the ops back to back) plus the call's own cost (``COMPILED_CALL_HOST_US``). A
    whole forward (backward) in one graph never costs more than it did eagerly; the pieces of a
    broken one each pay their call, even where that is more than their few eager launches: a
    model whose forward syncs at every layer ran 0.70x as fast under mode="reduce-overhead" on an
    H100 (examples/implicit_syncs.py), where capping each piece at its eager cost predicted 1.06x.
    The syncs stay, and so does the autograd engine's AccumulateGrad node of each parameter
    tensor (``StepModel.accumulate_grad_us``), with the engine's own time around each node
    (``StepModel.engine_gap_us``, 4-6 µs on the H200, eager and graphed alike): it runs outside
    the graph, and on the H200 it was most of what a CUDA-graphed backward still cost the host
    (examples/launch_bound.py: 258 nodes, 2.0 ms of a profiled step; predicted 5.06x without it,
    measured 2.90x). A CUDA-graph replay also checks each parameter tensor it takes
    (``CUDA_GRAPH_INPUT_HOST_US``).

    A call's own cost is a figure measured without the profiler: it is a host item of its own
    (phase ``COMPILED_CALL_PHASE``) that the replay's ``host_scale`` (the profiler's inflation
    taken out of the traced host code) leaves as it is; and whether a whole forward is cheaper
    compiled is judged at that same pace (``host_scale``). Scaled with the traced code, a call
    cost a quarter of itself on a host whose profiled code ran 3.5x slow, and 48 graph breaks a
    step looked cheap (examples/implicit_syncs.py on the H200: LAUNCH001 predicted 1.51x)."""
    phases = ("forward", "backward", "unknown")
    ops = list(model.ops)
    keep = [True] * len(ops)
    runs: dict[tuple[int, str], list[int]] = {}

    def fuse_run(run: list[int]) -> None:
        # a chain of pointwise kernels becomes one that reads the chain's inputs and writes its
        # outputs: about what its largest kernel moves
        if len(run) >= 2 and fuse:
            ops[run[-1]] = changed(ops[run[-1]], duration_us=max(ops[j].duration_us for j in run))
            for j in run[:-1]:
                keep[j] = False

    for i, op in enumerate(ops):
        if op.phase in phases and fusible(op):
            runs.setdefault((op.stream, op.phase), []).append(i)
        else:
            fuse_run(runs.pop((op.stream, op.phase), []))
    for run in runs.values():
        fuse_run(run)
    fused = _drop_ops(_rebuild(model, list(model.items), ops), keep)
    # a recurrent layer's call runs eagerly between two graphs, its host code as it was
    breaks = set(graph_breaks(fused)) | library_layers(fused)
    graph_us = 0.0
    if cuda_graphs:
        tensors = _fact(facts, "optimizer.param_tensors")
        if tensors is None and model.steps:
            tensors = model.accumulate_grad_nodes / model.steps
        graph_us = CUDA_GRAPH_CALL_HOST_US + CUDA_GRAPH_INPUT_HOST_US * (tensors or 0.0)
    call_us = COMPILED_CALL_HOST_US + graph_us
    backward_call_us = graph_us
    forward_pieces = _runs(fused.items, "forward", breaks)
    backward_pieces = _runs(fused.items, "backward", breaks)
    # the backward of each forward piece is a graph of its own: as many backward calls as
    # forward pieces, shared out over the backward's runs
    backward_calls = len(forward_pieces) / len(backward_pieces) if backward_pieces and forward_pieces else 1.0
    # the engine's AccumulateGrad nodes (one per parameter tensor) run outside any graph: each
    # backward piece keeps its share of them
    backward_eager = sum(fused.items[i].duration_us for piece in backward_pieces for i in piece)
    outside = min(model.accumulate_grad_us + model.accumulate_grad_nodes * model.engine_gap_us, backward_eager)
    scales: dict[int, float] = {}
    calls_before: dict[int, float] = {}  # first item of a compiled piece -> its call's cost
    for pieces, per_call, calls in (
        (forward_pieces, call_us, 1.0),
        (backward_pieces, backward_call_us, backward_calls),
    ):
        for piece in pieces:
            eager = sum(fused.items[i].duration_us for i in piece)
            launches = sum(1 for i in piece if fused.items[i].kind == "launch")
            kept = model.launch_cost_us * (min(launches, 1) if cuda_graphs else launches)
            if pieces is backward_pieces and backward_eager > 0:
                kept += outside * eager / backward_eager
            call = per_call * calls
            if len(pieces) == 1 and kept * host_scale + call >= eager * host_scale:
                continue  # a whole forward (backward) in one graph: never worse than eager
            for i in piece:
                scales[i] = kept / eager if eager > 0 else 1.0
            if call > 0:
                calls_before[piece[0]] = call
    items: list[HostItem] = []
    for i, it in enumerate(fused.items):
        if i in calls_before:
            items.append(HostItem("work", calls_before[i], COMPILED_CALL_PHASE))
        items.append(_with_host_time(it, it.duration_us * scales[i], it.lead_us * scales[i]) if i in scales else it)
    ops = list(fused.ops)
    if cuda_graphs:  # a piece that became a graph runs its ops back to back; one left eager does not
        graphed = {j for i, it in enumerate(fused.items) if it.kind == "launch" and i in scales for j in it.ops}
        graphed |= {j for j, op in enumerate(ops) if op.carried_ready_us is not None and op.phase in phases}
        ops = [
            _queued_back_to_back(op, 0.0, min(op.gap_us, STREAM_GAP_US)) if j in graphed else op
            for j, op in enumerate(ops)
        ]
    return replace(fused, items=tuple(items), ops=tuple(ops))


def cuda_graphs(model: StepModel, facts: Mapping[str, float], **params: Any) -> StepModel:
    return compile_model(model, facts, cuda_graphs=True, **params)


def graphs_of_compiled(model: StepModel, facts: Mapping[str, float], **params: Any) -> StepModel:
    """mode="reduce-overhead" on a model compiled already: its kernels are fused (nothing more
    fuses), and each compiled call becomes a CUDA-graph replay: one launch, the GPU running the
    piece's kernels back to back, the call's own cost plus the graph's."""
    return compile_model(model, facts, fuse=False, cuda_graphs=True, **params)


def more_workers(
    model: StepModel,
    facts: Mapping[str, float],
    num_workers: float | None = None,
    pin_memory: float | None = None,
    host_scale: float = 1.0,
    **_: Any,
) -> StepModel:
    """Data waits become: take a batch that ``n`` workers, each ``t`` per batch, deliver at
    ``n / t`` batches per second, bounded by the CPUs (one left for the main process), counted
    as physical cores where the run recorded them, and by the main process, which receives each
    batch from shared memory (``receive_us``): with ``pin_memory`` its pin thread takes the
    batches one at a time (no faster than one per ``receive_us``), without it the main thread
    pays it at each fetch. Where the loader already had workers, that cost is in the trace."""
    fetches = fetch_waits(model)
    if not fetches:
        raise CannotPredict("the trace shows no DataLoader fetch on the main thread")
    current = _fact(facts, "dataloader.num_workers")
    if current is None:
        current = 0.0 if _fact(facts, "dataloader.single_process") == 1 else None
    if current is None:
        raise CannotPredict("the DataLoader's num_workers is unknown")
    wanted = num_workers or _fact(facts, "suggest.num_workers")
    if not wanted:
        raise CannotPredict("no worker count to predict for")
    workers = parallel_workers(facts, wanted)
    per_batch = worker_cpu_per_batch_ms(facts)
    per_batch_us = per_batch * 1000 if per_batch else None
    overhead = 0.0
    if per_batch_us is None:
        if current == 0:  # the main thread loads each batch itself: the wait is the batch's cost
            per_batch_us = statistics.median(fetches.values())
        else:  # saturated workers deliver one batch per per_batch / n
            per_batch_us = current * model.measured_us / max(len(fetches), 1)
    if current > 0:
        overhead = min(fetches.values())  # taking a ready batch from the queue
    interval = per_batch_us / workers
    if current == 0:
        receive = receive_us(model, facts, len(fetches))
        pinned = _fact(facts, "dataloader.pin_memory") if pin_memory is None else pin_memory
        if pinned:
            interval = max(interval, receive)
        else:
            overhead += receive
    return paced(model, fetches, interval, overhead, host_scale)


def loader_paced_now(model: StepModel, facts: Mapping[str, float], host_scale: float = 1.0) -> Replay | None:
    """The unchanged step as the DataLoader's workers pace it (one batch each
    ``worker_cpu_per_batch_ms`` over the workers that build at once), replayed; None where that
    is not known or the trace shows no fetch. Where it replays slower than the
    window, the window took batches the workers had queued before it (``workers.steady_wait``),
    and a change that paces the loader itself (more workers, a larger batch) is measured against
    the step the loader allows: otherwise more workers would be predicted to gain nothing over
    a window that hardly waited, and a larger batch to gain what the GPU allows, where the
    loader allows neither."""
    workers, per_batch = _fact(facts, "dataloader.num_workers"), worker_cpu_per_batch_ms(facts)
    fetches = fetch_waits(model)
    if not workers or not per_batch or not fetches:
        return None
    interval = per_batch * 1000 / parallel_workers(facts, workers)
    return replay(paced(model, fetches, interval, min(fetches.values()), host_scale), host_scale)


def loader_paced_steady(facts: Mapping[str, float]) -> bool:
    """The steady steps waited for their batches (measured: ``data.steady_wait`` at least
    ``LOADER_PACED_WAIT``), or the workers' CPU time says they would (``workers.steady_wait``):
    the DataLoader sets the steady pace."""
    measured = _fact(facts, "data.steady_wait")
    if measured is not None:
        return measured >= LOADER_PACED_WAIT
    return (_fact(facts, "workers.steady_wait") or 0.0) > 0


def worker_cpu_per_batch_ms(facts: Mapping[str, float]) -> float | None:
    """What a DataLoader worker takes to build a batch, as far as the run tells
    (``measure.workers.per_batch_ms``: the steady pace where the steady steps waited for data,
    else the workers' CPU time per batch bounded by it); the workers.balance symptom reads the
    same."""
    return per_batch_ms(
        _fact(facts, "workers.cpu_per_batch_ms"),
        _fact(facts, "dataloader.num_workers"),
        usable_cpus(_fact(facts, "cpu.count"), _fact(facts, "cpu.cores")),
        _fact(facts, "step.steady_mean_ms"),
        _fact(facts, "data.steady_wait"),
    )


def fetch_waits(model: StepModel) -> dict[int, float]:
    """The main thread's data waits by fetch (0, 1, ...), summed: what taking each batch cost."""
    fetches: dict[int, float] = {}
    for it in model.items:
        if it.fetch is not None:
            fetches[it.fetch] = fetches.get(it.fetch, 0.0) + it.duration_us
    return fetches


def parallel_workers(facts: Mapping[str, float], workers: float) -> float:
    """How many of ``workers`` build batches at once on the run's CPUs, counted as physical cores
    where the run recorded them (``measure.workers``, which the symptoms read too)."""
    return building_workers(workers, usable_cpus(_fact(facts, "cpu.count"), _fact(facts, "cpu.cores")))


def paced(
    model: StepModel, fetches: Mapping[int, float], interval_us: float, overhead_us: float, host_scale: float = 1.0
) -> StepModel:
    """The model with its batches delivered by workers at one per ``interval_us``: each fetch's
    waits become one item of ``overhead_us`` (taking a ready batch) that cannot start before its
    batch is ready.

    In the steady state of a loader that sets the pace, a step takes one interval: its batch
    arrives an interval after the last one, however little work the step does after it. The
    window's first batch is therefore ready an interval less one step's own work (replayed with
    every batch at hand) after the window starts, not at once."""
    first = min(fetches)

    def delivered(offset_us: float | None) -> StepModel:
        items, seen = [], set()
        for it in model.items:
            if it.fetch is None:
                items.append(it)
            elif it.fetch not in seen:
                seen.add(it.fetch)
                ready = 0.0 if offset_us is None else offset_us + (it.fetch - first) * interval_us
                items.append(HostItem("work", overhead_us, "data_wait", fetch=it.fetch, ready_us=ready))
        return replace(model, items=tuple(items))

    work = replay(delivered(None), host_scale).window_us / model.steps
    return delivered(max(0.0, interval_us - work))


def receive_us(model: StepModel, facts: Mapping[str, float], fetches: int) -> float:
    """What the main process spends receiving one batch from a worker: the batch's bytes (what
    the window copies to the GPU, per fetch) at the run's measured cost per MB (as paid while the
    workers load), plus what a batch costs beyond its bytes; with no measured cost, the tabled one
    (which includes both). 0 where nothing is copied to the GPU (the batch's size is not in the
    trace)."""
    copied = sum(op.nbytes for op in model.ops if op.copy_kind.startswith("HtoD"))
    if copied <= 0:
        return 0.0
    measured = _fact(facts, "host.loader_receive_ms_per_mb")
    mb = copied / max(fetches, 1) / 1e6
    ms = (
        mb * measured * LOADER_RECEIVE_CONTENTION + LOADER_RECEIVE_BATCH_MS
        if measured
        else mb * LOADER_RECEIVE_MS_PER_MB
    )
    return ms * 1e3


def pinned_copies(
    model: StepModel, facts: Mapping[str, float], bandwidth_gbs: float | None = None, **_: Any
) -> StepModel:
    """Pageable host-to-device copies run at the pinned bandwidth, without blocking the host."""
    pageable = [i for i, op in enumerate(model.ops) if op.copy_kind == "HtoD-pageable"]
    if not pageable:
        raise CannotPredict("no pageable host-to-device copy in the trace")
    gbs = bandwidth_gbs or pinned_bandwidth_gbs(model)
    ops = list(model.ops)
    for i in pageable:
        ops[i] = changed(ops[i], duration_us=ops[i].nbytes / (gbs * 1e3), copy_kind="HtoD-pinned")
    targets = set(pageable)
    items = []
    for it in model.items:
        if it.kind == "launch" and targets.intersection(it.ops):  # the call staged the copy through host memory
            items.append(changed(it, blocking=False, duration_us=model.launch_cost_us, after_us=0.0))
        elif it.kind == "wait" and it.sync_kind == "staging":
            continue
        else:
            items.append(it)
    return _rebuild(model, items, ops)


def pinned_bandwidth_gbs(model: StepModel) -> float:
    """Pinned H2D bandwidth measured in this trace (large copies), else the link's tabled rate."""
    rates = [
        op.nbytes / op.duration_us / 1e3
        for op in model.ops
        if op.copy_kind == "HtoD-pinned" and op.nbytes >= BANDWIDTH_MIN_BYTES and op.duration_us > 0
    ]
    if rates:
        return statistics.median(rates)
    major = model.compute_capability[0] if model.compute_capability else None
    if major not in PINNED_GBS_BY_MAJOR:
        raise CannotPredict("no pinned copy in the trace to measure the bandwidth, and none tabled for this GPU")
    return PINNED_GBS_BY_MAJOR[major]


def remove_syncs(model: StepModel, facts: Mapping[str, float], keep_every: float = 0, **_: Any) -> StepModel:
    """The script's own syncs stop blocking (``keep_every`` N: one in N still does). Staging
    syncs of copies and DDP's waits stay."""
    user = [i for i, it in enumerate(model.items) if it.kind == "wait" and it.sync_kind == "user"]
    user += [
        i
        for i, it in enumerate(model.items)
        if it.kind == "launch" and it.blocking and all(model.ops[j].copy_kind == "DtoH" for j in it.ops)
    ]
    if not user:
        raise CannotPredict("the script's own code does not sync in the trace")
    user.sort()
    removed = {i for n, i in enumerate(user) if not keep_every or (n + 1) % int(keep_every) != 0}
    items = []
    for i, it in enumerate(model.items):
        if i not in removed:
            items.append(it)
        elif it.kind == "launch":  # a blocking read-back becomes an asynchronous one
            items.append(changed(it, blocking=False, duration_us=model.launch_cost_us, after_us=0.0))
    return replace(model, items=tuple(items))


def larger_batch(
    model: StepModel,
    facts: Mapping[str, float],
    factor: float | None = None,
    matmul_roof_share: float | None = None,
    host_scale: float = 1.0,
    **_: Any,
) -> StepModel:
    """A batch ``factor`` times larger: the GPU work of forward and backward and the data loading
    scale with it; launches, host code, the optimizer and communication do not.

    With ``matmul_roof_share`` (the share of the compute peak the step's matmul shapes allow,
    ``matmul.roof_share``), matmul kernels that are bound by reading their weights do not scale
    with the rows: a matmul at share ``r`` of the peak runs ``1 / r`` slower than its FLOPs need,
    so ``factor`` times the rows take ``max(1, factor * r)`` times as long (the weight reads are
    paid once, the FLOPs grow until they, not the reads, set the time).

    A kernel's time has a part that no batch changes (``kernel_floor_us``: the launch, a grid's
    ramp and tail), which stays; only the rest grows. A copy too small to measure the link grows
    by the added bytes at the link's rate. The loader: where the workers' sampled busy share
    (``workers.busy``: their stacks in the dataset's code and collate) times ``factor`` stays
    under 1, they keep up and taking a batch costs what it cost. Where it does not (or was not
    sampled) and their CPU time per batch is known (``workers.cpu_per_batch_ms``), they deliver
    a batch ``factor`` times larger every ``factor`` times that time over the workers (``paced``):
    a loader that kept up may set the pace (an MNIST VAE with one worker: 11x predicted at 64x
    the batch without this, 0.69x measured, its steps waiting 98% of the time for data), and so
    do workers whose CPU time says they cannot keep up with the step already
    (``loader_paced_steady``; timm's ResNet-18: twice the batch predicted 1.90x, measured 0.62x).
    Elsewhere the CPU time is not scaled where the sampled share says they keep up: a batch's
    CPU time holds a part no batch size changes (collating, handing the batch over). Both
    are asked because each errs: the CPU time includes a worker's first, slow batches (4 workers
    at 2.25 ms a batch of 16 kept up with 32x the batch at 2.1 ms a step), and the sampled share
    missed most of the VAE's (0.17 where its CPU time says 0.8); where they disagree the
    prediction says so (``weakness``). Otherwise the waits grow with the batch (the main thread
    loads it, or the workers would be busy all the time). A batch the script builds by hand on
    the host grows its building too (``grow_batch_building``); a batch the script's own threads
    or processes build and queue, where the main thread waited for them, comes no faster than
    now per sample (``paced_by_own_producers``)."""
    factor = factor or suggested_batch_factor(facts)
    if not factor or factor <= 1:
        raise CannotPredict("no larger batch to predict for (the memory headroom is unknown)")
    matmul_scale = factor
    if matmul_roof_share is not None and 0 < matmul_roof_share < 1:
        matmul_scale = max(1.0, factor * matmul_roof_share)
    floor = kernel_floor_us(model)
    try:
        link_gbs: float | None = pinned_bandwidth_gbs(model)
    except CannotPredict:
        link_gbs = None

    def scaled(op: GpuOp) -> GpuOp:
        kind = P.classify_kernel(op.name)
        if op.phase in ("optimizer",) or op.kind == "memset" or kind.communication:
            return op
        if op.kind == "memcpy" and link_gbs and 0 < op.nbytes < BANDWIDTH_MIN_BYTES:
            return _with_duration(op, op.duration_us + op.nbytes * (factor - 1) / (link_gbs * 1e3))
        grow = matmul_scale if op.kind == "kernel" and kind.precision is not None and not kind.convolution else factor
        fixed = min(op.duration_us, floor) if op.kind == "kernel" else 0.0
        return _with_duration(op, fixed + (op.duration_us - fixed) * grow)

    ops = [scaled(op) for op in model.ops]
    grown = replace(model, ops=tuple(ops), batch_factor=model.batch_factor * factor)
    workers, busy = _fact(facts, "dataloader.num_workers"), _fact(facts, "workers.busy")
    per_batch, fetches = worker_cpu_per_batch_ms(facts), fetch_waits(model)
    sampled_keep_up = busy is not None and busy * factor < 1
    # workers that cannot keep up with the step already (``loader_paced_steady``) set the pace of
    # a larger batch too, whatever their sampled share says
    paced_now = loader_paced_steady(facts)
    if workers and per_batch and fetches and (not sampled_keep_up or paced_now):
        # the workers build batches ``factor`` times larger at the CPU time per batch they showed
        interval = per_batch * 1000 * factor / parallel_workers(facts, workers)
        return paced(grown, fetches, interval, min(fetches.values()) * factor, host_scale)
    keep_up = bool(workers) and sampled_keep_up
    items = (
        model.items
        if keep_up
        else tuple(
            changed(it, duration_us=it.duration_us * factor) if it.fetch is not None else it for it in model.items
        )
    )
    built = grow_batch_building(replace(grown, items=items), _fact(facts, "host.batch_build_share"), factor)
    return paced_by_own_producers(model, built, _fact(facts, "host.queue_wait_share"), factor, host_scale)


def grow_batch_building(model: StepModel, share: float | None, factor: float) -> StepModel:
    """The host work of building a batch by hand, a sample at a time (``host.batch_build_share``
    of the steps: the lines of the script's own helpers that loop in Python, in a script that
    copies its inputs from the host and has no DataLoader) grown ``factor`` times: ``factor - 1``
    times that work is added to the host's sequence just before each step's host-to-device
    copies, where the batch is handed to the GPU, shared among them. Every sample costs what one
    cost, and what those lines spend once a batch (entering the loop, the stack of its results)
    is counted as if it grew too: the work added is the most a larger batch adds there (nanoGPT's
    ``get_batch`` took 5.6 times as long at 8 times the batch). Like all host work it is replayed
    at the profiler-free pace (``host_scale``), though a Python loop with few operators in it is
    slowed less by the profiler than the rest.
    Unchanged without the share or without a host-to-device copy in the modelled steps."""
    if not share or share <= 0 or factor <= 1 or not model.steps:
        return model
    # the modelled steps' building, (factor - 1) times over, shared among their copies
    return _before_copies(model, share * sum(model.step_durations_us) * (factor - 1), phase=None)


def _before_copies(model: StepModel, total_us: float, phase: str | None) -> StepModel:
    """``total_us`` of host work added to the window, shared among its host-to-device copy
    launches (where a batch is handed to the GPU) and put just before each, in the copy's phase
    (``phase`` None) or in ``phase``. The model as it is where no such copy was traced."""
    copies = [
        i
        for i, it in enumerate(model.items)
        if it.kind == "launch"
        and it.ops
        and all(model.ops[j].kind == "memcpy" and model.ops[j].copy_kind.startswith("HtoD") for j in it.ops)
    ]
    if not copies or total_us <= 0:
        return model
    added_us = total_us / len(copies)
    at = set(copies)
    items: list[HostItem] = []
    for i, it in enumerate(model.items):
        if i in at:
            items.append(HostItem(kind="work", duration_us=added_us, phase=phase or it.phase))
        items.append(it)
    return replace(model, items=tuple(items))


def paced_by_own_producers(
    model: StepModel, grown: StepModel, wait_share: float | None, factor: float, host_scale: float = 1.0
) -> StepModel:
    """``grown`` (``model`` with a batch ``factor`` times larger) where the script's own
    producers set the pace: the main thread waited on a queue or pipe of another thread or process
    (``host.queue_wait_share`` of its samples, at least ``QUEUE_PACED_MIN_SHARE``), so they did
    not keep up with the step, and deliver a batch a step. Building ``factor`` times the samples
    at the rate they built them, they deliver one every ``factor`` steps of now: the step of the
    larger batch takes at least that (a wait added before its copies to the GPU, in no phase the
    profiler slows), and its samples a second are no more than now. SASRec's samplers (three
    processes building batches of 128 users in Python) held the main thread 26% of the step;
    eight times the batch was predicted 3.33x without this and measured 0.79x."""
    if wait_share is None or wait_share < QUEUE_PACED_MIN_SHARE or factor <= 1 or not model.steps:
        return grown
    step_now = replay(model, host_scale).window_us / model.steps
    step_grown = replay(grown, host_scale).window_us / grown.steps
    short = factor * step_now - step_grown
    return _before_copies(grown, short * grown.steps, phase="data_wait")


def suggested_batch_factor(facts: Mapping[str, float]) -> float | None:
    """How many times the run's batch the suggested one is (``suggest.batch_size`` over
    ``batch.size``; None where either is unknown): a larger batch's factor when its rule gives none."""
    size, suggested = _fact(facts, "batch.size"), _fact(facts, "suggest.batch_size")
    return suggested / size if size and suggested else None


def kernel_floor_us(model: StepModel) -> float:
    """What a kernel takes however little it has to do: the window's shortest kernels (their 5th
    percentile), at most ``KERNEL_FLOOR_MAX_US`` (a window of large kernels says nothing of it)."""
    times = sorted(op.duration_us for op in model.ops if op.kind == "kernel")
    if not times:
        return 0.0
    return min(times[len(times) // 20], KERNEL_FLOOR_MAX_US)


Transformation = Callable[..., StepModel]

#: name -> transformation; rule files name these in their ``predict`` key.
TRANSFORMATIONS: dict[str, Transformation] = {
    "autocast_bf16": autocast_bf16,
    "tf32": tf32,
    "fused_optimizer": fused_optimizer,
    "compile": compile_model,
    "cuda_graphs": cuda_graphs,
    "graphs_of_compiled": graphs_of_compiled,
    "more_workers": more_workers,
    "pinned_copies": pinned_copies,
    "remove_syncs": remove_syncs,
    "larger_batch": larger_batch,
}


def predict(
    model: StepModel,
    check: ReplayCheck,
    name: str,
    facts: Mapping[str, float],
    params: Mapping[str, float] | None = None,
    host_scale: float = 1.0,
    gpu_stretch: float = 1.0,
    baseline: Replay | None = None,
) -> Prediction:
    """Replay the model before and after ``name``; the speedup is in samples per second.
    ``baseline``: the unchanged model's replay at ``host_scale``, when the caller has it (a
    predictor replays it once for all its predictions).

    ``gpu_stretch`` (at least 1): how much more GPU work a steady step holds than a step of the
    window. A window whose host ran ahead holds only the GPU work that starts inside it (its
    first steps often find the queue drained: fp32_transformer's held 78% of a steady step's);
    both replays' GPU-bound time is stretched by it, so that a change that leaves the step
    host-bound is measured against the whole step it replaces.

    A prediction that rests on a share read off the line sampler (a larger batch's
    ``host.batch_build_share``) is predicted again at that share's edges (``counted_share_edges``:
    its counting error over ``host.samples``), and its interval reaches down and up to those."""
    prediction = _predict(model, check, name, facts, params, host_scale, gpu_stretch, baseline)
    edges = counted_share_edges(facts) if name == "larger_batch" and prediction.ok else None
    if edges is None:
        return prediction
    low, high = (
        _predict(model, check, name, {**facts, SAMPLED_SHARE: share}, params, host_scale, gpu_stretch, baseline).speedup
        for share in edges[::-1]  # the larger share builds more: the lower speedup
    )
    return _widened(prediction, low, high, facts)


#: the sampled share a larger batch's prediction rests on
SAMPLED_SHARE = "host.batch_build_share"


def counted_share_edges(facts: Mapping[str, float]) -> tuple[float, float] | None:
    """``host.batch_build_share`` plus and minus its counting error at the interval's edge: p of
    n samples (``host.samples``) +- ``Z_INTERVAL`` sqrt(p (1 - p) / n), clipped to [0, 1]. A
    binomial error is the least it may be: the sampler's samples of one line come in runs.
    None where the share or the count is unknown."""
    share, n = _fact(facts, SAMPLED_SHARE), _fact(facts, "host.samples")
    if not share or not n or n <= 0:
        return None
    error = Z_INTERVAL * math.sqrt(share * (1 - share) / n)
    return max(share - error, 0.0), min(share + error, 1.0)


def _widened(prediction: Prediction, low: float | None, high: float | None, facts: Mapping[str, float]) -> Prediction:
    """``prediction`` whose interval reaches ``low`` and ``high`` (the predictions at the sampled
    share's edges), beside any floor or reach it has."""
    speedup = prediction.speedup
    assert speedup is not None
    floor, reach = prediction.floor, prediction.reach
    if low is not None and low < speedup:
        floor = min(floor, low) if floor is not None else low
    if high is not None and high > speedup:
        reach = max(reach, high) if reach is not None else high
    if (floor, reach) == (prediction.floor, prediction.reach):
        return prediction
    note = (
        f"{prediction.note}; the batch building's share, {facts[SAMPLED_SHARE]:.1%} of "
        f"{facts['host.samples']:.0f} samples, allows {low or speedup:.2f}-{high or speedup:.2f}x"
    )
    return replace(prediction, note=note, floor=floor, reach=reach)


def _predict(
    model: StepModel,
    check: ReplayCheck,
    name: str,
    facts: Mapping[str, float],
    params: Mapping[str, float] | None,
    host_scale: float,
    gpu_stretch: float,
    baseline: Replay | None,
) -> Prediction:
    if name not in TRANSFORMATIONS:
        return Prediction(name, None, None, f"cannot predict: no transformation called {name!r}")
    if not check.reproduces:
        return Prediction(name, None, None, f"cannot predict: the replay is {check.error:+.0%} off the measured step")
    try:
        changed = TRANSFORMATIONS[name](model, facts, **{"host_scale": host_scale, **dict(params or {})})
    except CannotPredict as exc:
        return Prediction(name, None, None, f"cannot predict: {exc}")
    first = baseline if baseline is not None else replay(model, host_scale)
    steady = loader_paced_now(model, facts, host_scale) if name in LOADER_PACED else None
    window_us = first.window_us
    if steady is not None and steady.window_us > first.window_us:
        first = steady  # against the step the loader allows, not the window's queued batches
    then = replay(changed, host_scale)
    before, after = first.window_us, then.window_us
    if gpu_stretch > 1 and first.gpu_busy_us > 0:
        utilisation = first.window_us / first.gpu_busy_us  # the window's GPU idle share kept
        before *= gpu_stretch
        after = max(after, then.gpu_busy_us * utilisation * gpu_stretch)
    if after <= 0:
        return Prediction(name, None, None, "cannot predict: the changed step replays to nothing")
    speedup = before / after * changed.batch_factor / model.batch_factor
    note = f"replayed step {before / model.steps / 1000:.2f} ms -> {after / model.steps / 1000:.2f} ms"
    if first.window_us > window_us:
        note += (
            f" (the DataLoader's workers allow a step of {first.window_us / model.steps / 1000:.2f} ms "
            f"where the window, taking batches they had queued, replays {window_us / model.steps / 1000:.2f} ms)"
        )
    if check.mode == "host ahead" and host_scale <= 0:
        note += "; the host runs ahead of the GPU, its model code is taken as hidden"
    elif check.mode == "host ahead":
        note += f"; the host runs ahead of the GPU: its own time read off its least back-pressured step ({host_scale:.2f}x the traced code)"
    elif host_scale < 1:
        note += f"; host code scaled to the steady step ({host_scale:.2f}x the traced)"
    if gpu_stretch > 1:
        note += f"; GPU time x{gpu_stretch:.2f} (the window held {1 / gpu_stretch:.0%} of a steady step's GPU work)"
    weak, floor, reach = weakness(model, check, name, facts, params), None, None
    if name == "larger_batch" and weak and _fact(facts, "workers.busy") is not None:
        floor = _paced_alternative(model, check, facts, params, host_scale, gpu_stretch, baseline, speedup)
    elif name == "larger_batch" and weak and _producers_weakness(facts):
        # the interval reaches down to the batch as if the producers set the pace
        paced = {**facts, "host.queue_wait_share": QUEUE_PACED_MIN_SHARE}
        alternative = _predict(model, check, name, paced, params, host_scale, gpu_stretch, baseline)
        if alternative.speedup is not None and alternative.speedup < speedup:
            floor = alternative.speedup
    steady_gain = steady_wait_gain(facts) if name == "more_workers" else None
    if steady_gain is not None and not within_model_error(name, steady_gain, speedup):
        weak = weak or (
            f"the window and the steady steps disagree on the step without its data wait: the replay says "
            f"{speedup:.2f}x, the steady steps' measured wait ({facts['data.steady_wait']:.0%}) {steady_gain:.2f}x"
        )
        floor, reach = (steady_gain, None) if steady_gain < speedup else (None, steady_gain)
    ceiling = loader_ceiling(facts, model) if name not in LOADER_PACED else None
    if ceiling is not None and speedup > ceiling.least:
        capped = ceiling.least  # each measure errs high (see LoaderCeiling): the lower one
        if ceiling.agree(speedup):  # the loader delivers no faster: the step waits for it
            note += f"; the DataLoader sets the pace ({ceiling.say()}): {capped:.2f}x at most"
        else:  # one measure says it binds: the lower ceiling, as workers.load takes the higher load
            weak = weak or f"the DataLoader may set the pace: {ceiling.say()}"
            note += f"; the DataLoader may set the pace ({ceiling.say()}): {capped:.2f}x, the lower"
            floor = capped
        after *= speedup / capped
        speedup = capped
    return Prediction(name, speedup, after / model.steps, note, weak, floor, reach)


#: transformations that pace the DataLoader's batches themselves (``paced``)
LOADER_PACED = ("more_workers", "larger_batch")


def steady_wait_gain(facts: Mapping[str, float]) -> float | None:
    """What removing the steady steps' measured data wait gains (``1 / (1 - data.steady_wait)``),
    where it was measured and the loader set the pace (at least ``LOADER_PACED_WAIT``): a second
    figure for more workers beside the replay of the window. The replay keeps the window's own
    step without its wait, which the steady steps need not share: a window that took batches the
    workers had queued, steps slowed by the profiler, an epoch's turn in either (the corpus's
    loader fixes missed by 22-53% both ways, docs/zoo.md "The sixth GPU run"). Where the two
    disagree beyond the model's error the prediction's interval reaches the other figure."""
    return wait_ratio(_fact(facts, "data.steady_wait"))


def _paced_alternative(
    model: StepModel,
    check: ReplayCheck,
    facts: Mapping[str, float],
    params: Mapping[str, float] | None,
    host_scale: float,
    gpu_stretch: float,
    baseline: Replay | None,
    speedup: float,
) -> float | None:
    """A larger batch whose loader the two measures disagree on (``_loader_weakness``): the
    prediction follows the sampled busy share, and its interval reaches down to what the workers'
    CPU time per batch allows (the same batch paced by it), where that is less. timm's ViT: twice
    the batch predicted 2.00x (1.65-2.44x) on the sampled share, its CPU time allowing 1.2-1.8x,
    measured 1.54x under verify and 0.92-1.30x in the runs' checks (docs/zoo.md, fifth run)."""
    unsampled = {**facts, "workers.busy": math.nan}  # ``_fact`` reads NaN as not measured
    # its speedup alone: ``_predict``, for ``predict``'s widening at a counted share's edges would replay twice more
    alternative = _predict(model, check, "larger_batch", unsampled, params, host_scale, gpu_stretch, baseline)
    if alternative.speedup is None or alternative.speedup >= speedup:
        return None
    return alternative.speedup


@dataclass(frozen=True)
class LoaderCeiling:
    """The most a change of the step can gain before the DataLoader's workers set the pace: its
    workers deliver a batch every CPU time per batch over the workers that build at once
    (``by_cpu``: the step's time over that interval), or, by their sampled busy share, at most
    ``1 / busy`` times as often (``by_busy``). Either may be None (not measured). Each errs (see
    ``larger_batch``): the CPU time counts a worker's first, slow batches; the sampled share
    missed most of an MNIST VAE's work (0.17 where its CPU time said 0.8). The ceiling is the
    lower of the two, whether or not both say the loader binds: each errs high (a worker's wall
    time per batch is at least its CPU time, and the sampled share errs low by construction: a
    worker's sampler thread takes its sample when it gets the GIL, more often while the worker
    waits for work than while it decodes). Where they disagree on whether it binds the
    prediction is weak, and a loader is taken to keep up only where both say so, as
    ``workers.load`` takes the larger load (timm's JPEG workers: busy 11% and 29% sampled, CPU
    time allowing 1.00x and 1.24x; compiles predicted 1.84x-3.18x measured 0.90x-0.93x; with
    both binding, the faster ceiling 3.28x where the CPU time allowed 1.33x, measured 0.98x and
    1.19x, docs/zoo.md)."""

    by_cpu: float | None
    by_busy: float | None

    @property
    def least(self) -> float:
        return min(c for c in (self.by_cpu, self.by_busy) if c is not None)

    def agree(self, speedup: float) -> bool:
        """Every ceiling measured says the loader binds at ``speedup``."""
        return all(c < speedup for c in (self.by_cpu, self.by_busy) if c is not None)

    def say(self) -> str:
        parts = []
        if self.by_cpu is not None:
            parts.append(f"its workers' CPU time per batch allows {self.by_cpu:.2f}x")
        if self.by_busy is not None:
            parts.append(f"their sampled busy share {self.by_busy:.2f}x")
        return "; ".join(parts)


def typical_step_ms(facts: Mapping[str, float], model: StepModel) -> float | None:
    """A typical training step, what a loader must keep up with: the steady steps' median (their
    mean also holds what a step paid for an evaluation, while the workers filled their queue),
    else their mean, else the profiled window's."""
    return (
        _fact(facts, "step.median_ms")
        or _fact(facts, "step.time_ms")
        or (model.measured_us / model.steps / 1000 if model.steps else None)
    )


def loader_ceiling(facts: Mapping[str, float], model: StepModel) -> LoaderCeiling | None:
    """How much faster the DataLoader's workers let the step go (``LoaderCeiling``); None where no
    worker loads (the main process's own loading is in the replayed step) or nothing was measured.
    A loader that already paces the step allows no gain (1x)."""
    workers = _fact(facts, "dataloader.num_workers")
    if not workers:
        return None
    step_ms = typical_step_ms(facts, model)
    per_batch, busy = worker_cpu_per_batch_ms(facts), _fact(facts, "workers.busy")
    by_cpu = max(1.0, step_ms / (per_batch / parallel_workers(facts, workers))) if per_batch and step_ms else None
    by_busy = max(1.0, 1 / busy) if busy else None
    return LoaderCeiling(by_cpu, by_busy) if by_cpu is not None or by_busy is not None else None


#: the transformations that compile the model (their predictions miss where graphs break)
COMPILING = ("compile", "cuda_graphs", "graphs_of_compiled")
#: those that change the matmuls' precision (their predictions miss where the host ran ahead)
PRECISION = ("autocast_bf16", "tf32")


def weakness(
    model: StepModel,
    check: ReplayCheck,
    name: str,
    facts: Mapping[str, float] | None = None,
    params: Mapping[str, float] | None = None,
) -> str | None:
    """Why the model is known to predict ``name`` badly on this run, or None. Compiling a model
    whose forward or backward syncs (a graph break each) or calls cuDNN's recurrent layers (run
    eagerly, ``library_layers``): the pieces' costs are estimates from one small graph
    (``COMPILED_CALL_HOST_US``), and an LSTM measured 0.89x where 2.98x had been predicted.
    Changing the precision where the host ran ahead of the GPU: the host's own time behind the
    full queue is read off one step (``host_ahead_scale``), and a ViT under accelerate was
    predicted 1.04x to 3.37x on three runs, measured 2.73x (issue 32). A larger batch drawn from
    DataLoader workers whose CPU time per batch was not measured: whether they keep up with
    ``factor`` times the samples is a guess (the outside corpus, docs/zoo.md: 37x predicted at
    64x the batch, 10x measured)."""
    if name in COMPILING:
        breaks, layers = len(graph_breaks(model)), len(library_layers(model))
        if breaks or layers:
            parts = [f"{breaks} sync(s) that break the graph"] if breaks else []
            parts += ["cuDNN recurrent layers, which run eagerly"] if layers else []
            return f"compiling a model with {' and '.join(parts)}"
    if name in PRECISION and check.mode == "host ahead":
        return "the host runs ahead of the GPU: what it costs once the GPU is faster is read off one step"
    if name == "larger_batch" and facts is not None:
        return _loader_weakness(facts, model, (params or {}).get("factor")) or _producers_weakness(facts)
    return None


def _producers_weakness(facts: Mapping[str, float]) -> str | None:
    """Why a larger batch is a guess where the script's own threads or processes build its
    batches: the main thread waited on their queue in some of its samples, too few to say that
    they set the pace (``QUEUE_PACED_MIN_SHARE``) and too many to say that they keep up with
    ``factor`` times the samples. SASRec's runs read 1.1%, 4.2%, 5.5% and 6.5% on one script:
    the two under the step were predicted 3.79x and 3.90x, measured 0.94x."""
    share = _fact(facts, "host.queue_wait_share")
    if share is None or not 0 < share < QUEUE_PACED_MIN_SHARE:
        return None
    return (
        f"the main thread waited on a queue of the script's own producers in {share:.1%} of its samples: "
        "whether they keep up with a larger batch is a guess"
    )


def _loader_weakness(facts: Mapping[str, float], model: StepModel, factor: float | None = None) -> str | None:
    """Why a larger batch's loader is a guess: the workers' CPU time was not measured, or it and
    their sampled busy share disagree on whether they keep up with the suggested batch."""
    workers = _fact(facts, "dataloader.num_workers")
    if not workers:
        return None
    per_batch, busy = worker_cpu_per_batch_ms(facts), _fact(facts, "workers.busy")
    if not per_batch:
        return "the DataLoader workers' CPU time per batch was not measured: whether they keep up with a larger batch is a guess"
    factor = factor or suggested_batch_factor(facts)
    step_ms = typical_step_ms(facts, model)
    if busy is None or not factor or not step_ms:
        return None
    by_cpu = per_batch * factor / parallel_workers(facts, workers) >= step_ms
    if by_cpu != (busy * factor >= 1):
        return (
            f"the DataLoader workers' CPU time per batch ({per_batch:.2f} ms) and their sampled busy share "
            f"({busy:.0%}) disagree on whether they keep up with {factor:g}x the batch"
        )
    return None


# --- for the findings ---------------------------------------------------------------------------

#: a rule's transformation, the run's facts and the rule's parameters: one prediction to make
PredictionRequest = tuple[str, Mapping[str, float], Mapping[str, float] | None]
#: a model of at least this many GPU ops and host items has its predictions made side by side:
#: each one transforms and replays the whole model (0.1-0.3 s at 100,000); below, a fork costs
#: more than it saves
PARALLEL_MIN_MODEL = 20_000


@dataclass(frozen=True)
class Predictor:
    """Predicts rules' fixes on one run: its model, the replay check, the host scale that matches
    the steady step, and the run-to-run spread under which a gain is not worth a user's time."""

    model: StepModel
    check: ReplayCheck
    host_scale: float
    #: relative step-to-step spread of the measured steps (see ``step_spread``)
    spread: float
    #: a host-ahead window's steady step over its replayed step (``predict``'s ``gpu_stretch``)
    gpu_stretch: float = 1.0
    #: the relative half-width of the mean step's interval (``uncertainty.mean_uncertainty``)
    mean_uncertainty: float = 0.0
    #: the profiled steps the bootstrap resamples (None: the model's step lengths alone)
    sample: StepSample | None = None

    def with_sample(self, sample: StepSample) -> Predictor:
        """The same predictor with ``sample``, keeping the unchanged replay made already."""
        out = replace(self, sample=sample)
        if "baseline" in self.__dict__:
            out.__dict__["baseline"] = self.__dict__["baseline"]
        return out

    @property
    def steps(self) -> StepSample:
        """The steps to resample: ``sample``, else the model's step lengths."""
        return self.sample if self.sample is not None else StepSample(tuple(self.model.step_durations_us))

    def predict(self, name: str, facts: Mapping[str, float], params: Mapping[str, float] | None = None) -> Prediction:
        return predict(self.model, self.check, name, facts, params, self.host_scale, self.gpu_stretch, self.baseline)

    def predict_all(self, requests: Sequence[PredictionRequest]) -> list[Prediction | Exception]:
        """Each request's prediction, or the exception that stopped it, in order. On a large
        model (``PARALLEL_MIN_MODEL``) they are computed side by side in forked processes
        (``forking.side_by_side``), the unchanged replay first, so that every one shares it."""
        calls = [partial(self._outcome, *request) for request in requests]
        if len(calls) < 2 or len(self.model.ops) + len(self.model.items) < PARALLEL_MIN_MODEL:
            return [call() for call in calls]
        self.baseline  # noqa: B018 - replayed here once, not in each child
        return forking.side_by_side(calls)

    def _outcome(
        self, name: str, facts: Mapping[str, float], params: Mapping[str, float] | None
    ) -> Prediction | Exception:
        try:
            return self.predict(name, facts, params)
        except Exception as exc:  # noqa: BLE001 - the caller says why the finding has no prediction
            return exc

    @cached_property
    def baseline(self) -> Replay:
        """The unchanged model's replay at the predictor's host scale: every prediction's "before"."""
        return replay(self.model, self.host_scale)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.check.to_dict(),
            "host_code_scale": round(self.host_scale, 4),
            "step_spread": round(self.spread, 4),
            "mean_uncertainty": round(self.mean_uncertainty, 4),
            "profiler_event_us": round(self.model.profiler_cost_us, 3),
            "profiler_event_source": self.model.profiler_cost_source,
            "gpu_stretch": round(self.gpu_stretch, 4),
        }


def step_spread(durations: list[float]) -> float:
    """Half the interquartile range of the step times over their median: how much two
    measurements of the same step differ, so that a predicted gain below it cannot be told from
    noise. Quartiles, not the range: a host that runs ahead of the GPU times a few steps short
    and the next ones long, and those outliers say nothing of the steady step."""
    if len(durations) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(durations, n=4, method="inclusive")
    median = statistics.median(durations)
    return (q3 - q1) / 2 / median if median > 0 else 0.0
