"""Stage 5: named symptoms with units, computed from the breakdown and the run record.

Contract: ``compute_symptoms(breakdown, record, meta) -> Symptoms``; pure, no torch. Rules read
nothing else: every number a rule tests or quotes is a symptom here, with a unit and a sentence
that says what it measures (``diagnose rules --symptoms`` lists them, docs/rules.md too).

Booleans are 0/1 so that the rule grammar stays arithmetic. A symptom the run could not
measure (no DataLoader, a bare trace with no run record) is absent, and conditions over it are
false: a rule never fires on a guess.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from diagnose.analysis.breakdown import EXPOSED, GPU_EXPOSED, LAUNCH_EXPOSED, PHASES, Breakdown
from diagnose.distributed import RankSummary
from diagnose.record import RunRecord
from diagnose.analysis.timeline import TraceMeta


@dataclass(frozen=True)
class Symptom:
    name: str
    value: float
    unit: str
    description: str


#: name -> (unit, description) for every symptom this version computes; the rule loader checks
#: that conditions only name these (a typo in a rule file is an error, not a silent never-fire).
CATALOG: dict[str, tuple[str, str]] = {}


def _declare(name: str, unit: str, description: str) -> str:
    CATALOG[name] = (unit, description)
    return name


for _cat in EXPOSED:
    _declare(f"exposed.{_cat}", "share", f"share of step time exposed as {_cat.replace('_', ' ')}")
for _phase in PHASES:
    _declare(f"phase.{_phase}", "share", f"share of step time the main thread spends in {_phase.replace('_', ' ')}")
    _declare(f"hidden.{_phase}", "share", f"share of step time in {_phase.replace('_', ' ')} hidden behind GPU work")
_declare("exposed.communication_own", "share", "exposed communication that is the collectives' own cost: in a distributed run, the least any rank sees (the others also wait for the slowest)")
_declare("exposed.launch", "share", "GPU idle while the host runs forward/backward/optimizer code (launch and Python overhead)")
_declare("exposed.launch_model", "share", "GPU idle while the host runs forward and backward code (launch and Python overhead)")
_declare("exposed.other_not_sync", "share", "GPU idle while the host runs other code, not counting the idle that follows syncs")
_declare("exposed.host", "share", "GPU idle for any host reason (sum of the host-side exposed shares)")
_declare("gpu.present", "bool", "the trace holds GPU activity")
_declare("gpu.busy", "share", "share of step time the GPU runs anything (kernels, copies, memsets)")
_declare("gpu.kernel_step_share", "share", "share of step time the GPU runs kernels (copies not counted): the work a copy can hide behind")
_declare("gpu.compute_capability", "", "CUDA compute capability, e.g. 9.0 for Hopper")
_declare("gpu.tensor_cores", "bool", "the GPU has Tensor Cores for bf16/TF32 (compute capability 8.0 or newer)")
_declare("gpu.kernels_per_step", "count", "GPU kernels launched per step (median)")
_declare("gpu.median_kernel_us", "us", "median kernel duration")
_declare("gpu.matmul_step_share", "share", "share of step time in matmul/conv/attention kernels")
_declare("gpu.fp32_matmul_share", "share", "share of matmul/conv kernel time in plain fp32 (CUDA cores, no Tensor Cores)")
_declare("gpu.fp32_matmul_step_share", "share", "share of step time in plain-fp32 matmul/conv kernels")
_declare("gpu.reduced_precision_share", "share", "share of matmul/conv kernel time in bf16/fp16/fp8")
_declare("gpu.tf32_share", "share", "share of matmul/conv kernel time in TF32")
_declare("gpu.conv_step_share", "share", "share of step time in convolution kernels")
_declare("gpu.transpose_step_share", "share", "share of step time in cuDNN NCHW<->NHWC layout conversions")
_declare("gpu.triton_share", "share", "share of kernel time in Triton kernels (torch.compile)")
_declare("gpu.graph_launches_per_step", "count", "CUDA graph launches per step")
_declare("gpu.communication_step_share", "share", "share of step time in communication (NCCL) kernels")
_declare("h2d.bytes_per_step", "bytes", "bytes copied host-to-device per step")
_declare("h2d.pageable_bytes_per_step", "bytes", "bytes copied host-to-device per step from pageable (unpinned) memory")
_declare("h2d.pageable_fraction", "share", "fraction of host-to-device bytes that came from pageable memory")
_declare("h2d.copies_per_step", "count", "host-to-device copies per step")
_declare("h2d.gpu_copy_step_share", "share", "share of step time the GPU spends in host-to-device copies")
_declare("h2d.bandwidth_gbs", "GB/s", "achieved host-to-device bandwidth")
_declare("sync.per_step", "count", "host-GPU synchronisations per step (.item(), .cpu(), synchronize, ...), median")
_declare("sync.blocked_share", "share", "share of step time the host is blocked in synchronisations")
_declare("sync.idle_after_share", "share", "share of step time the GPU idles after a sync until new work arrives")
_declare("sync.cost_share", "share", "exposed sync time plus the GPU idle time that follows syncs")
_declare("optimizer.present", "bool", "the script steps a torch.optim optimizer")
_declare("optimizer.param_tensors", "count", "parameter tensors the optimizers update")
_declare("optimizer.forloop", "bool", "an optimizer runs its per-tensor for-loop (neither foreach nor fused)")
_declare("optimizer.kernels_per_step", "count", "GPU kernels the optimizer launches per step (median)")
_declare("optimizer.multi_tensor_share", "share", "share of the optimizer's GPU kernels that are multi-tensor (foreach/fused)")
_declare("optimizer.step_share", "share", "share of step time limited by the optimizer (host or GPU)")
_declare("dataloader.present", "bool", "the steps draw batches from a torch DataLoader")
_declare("dataloader.num_workers", "count", "DataLoader num_workers")
_declare("dataloader.single_process", "bool", "the DataLoader loads in the main process (num_workers=0), as the trace shows")
_declare("dataloader.pin_memory", "bool", "DataLoader pin_memory")
_declare("dataloader.persistent_workers", "bool", "DataLoader persistent_workers")
_declare("dataloader.prefetch_factor", "count", "DataLoader prefetch_factor (0 with no workers)")
_declare("dataloader.batch_size", "count", "DataLoader batch_size")
_declare("dataloader.iterators", "count", "times the DataLoader was iterated from the start (epochs begun)")
_declare("dataloader.startup_s", "s", "extra wait for the first batch of an epoch, over a normal batch (worker start-up)")
_declare("dataloader.steps_per_epoch", "count", "batches per epoch")
_declare("dataloader.restart_share", "share", "share of an epoch spent starting DataLoader workers")
_declare("cpu.count", "count", "CPUs this process may use")
_declare("memory.capacity_gb", "GB", "GPU memory capacity")
_declare("memory.peak_allocated_share", "share", "peak memory allocated by tensors, of capacity")
_declare("memory.peak_reserved_share", "share", "peak memory reserved by the caching allocator, of capacity")
_declare("memory.oom", "bool", "the script ran out of GPU memory")
_declare("batch.size", "count", "samples per step, found from the data")
_declare("model.conv_layers", "count", "convolution layers in the model")
_declare("model.channels_last", "bool", "the model's convolution weights are channels_last")
_declare("model.compiled", "bool", "the model runs through torch.compile")
_declare("model.data_parallel", "bool", "the model is wrapped in nn.DataParallel")
_declare("model.ddp", "bool", "the model is wrapped in DistributedDataParallel")
_declare("cudnn.benchmark", "bool", "torch.backends.cudnn.benchmark")
_declare("matmul.tf32", "bool", "TF32 matmuls allowed (allow_tf32 or float32_matmul_precision high/medium)")
_declare("step.time_ms", "ms", "median step time (steady state where measured, else profiled)")
_declare("step.profiled", "count", "profiled steps analysed")
_declare("suggest.num_workers", "count", "DataLoader workers that would keep the GPU fed, within the CPUs (half of them on a CPU-only run)")
_declare("suggest.batch_size", "count", "a larger batch that fits the measured memory headroom")
_declare("dist.world_size", "count", "ranks in the run")
_declare("dist.straggler_rank", "count", "the rank whose exposed data wait stands out")
_declare("dist.straggler_data_share", "share", "the straggler's exposed data wait over the other ranks' median, as a share of the step")
_declare("dist.straggler_data_ms", "ms", "the straggler's exposed data wait per step")
_declare("dist.others_data_ms", "ms", "the other ranks' exposed data wait per step (median)")
_declare("dist.samples_imbalance", "", "samples per step of the busiest rank over the lightest")
_declare("dist.gloo_with_gpus", "bool", "the process group uses gloo although GPUs (and NCCL) are there")
_declare("workers.cpu_per_batch_ms", "ms", "CPU time a DataLoader worker spends building one batch")
_declare("workers.busy", "share", "share of the DataLoader workers' time spent building batches (not waiting for work)")
_declare("workers.saturated", "bool", "the data pipeline has no idle capacity: no workers, or workers busy most of the time (assumed when not sampled)")
_declare("workers.balance", "count", "DataLoader workers whose combined output matches the GPU's step rate")
_declare("lines.sync", "text", "the source lines that synchronise, with their counts per step")
_declare("lines.host_other", "text", "the user's lines where the main thread spends the time outside DataLoader, model and optimizer")
_declare("lines.data", "text", "the lines where data loading spends its time (main thread or workers)")
_declare("lines.h2d", "text", "the lines that copy to the GPU from pageable memory")
_declare("lines.model", "text", "the lines that run the model (forward and backward)")
_declare("lines.optimizer", "text", "where the optimizer is built and stepped")
_declare("host.other_user_share", "share", "share of step time the main thread spends in the user's own code outside DataLoader, model and optimizer")


class Symptoms(Mapping[str, Symptom]):
    """Numeric symptoms by name; ``texts`` holds the ``text`` ones (source lines to quote)."""

    def __init__(self, items: dict[str, Symptom], texts: dict[str, str] | None = None) -> None:
        self._items = items
        self.texts = texts or {}

    def __getitem__(self, name: str) -> Symptom:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def values_by_name(self) -> dict[str, float]:
        return {name: s.value for name, s in self._items.items()}

    def with_values(self, values: Mapping[str, float | None]) -> Symptoms:
        """These symptoms and more (None values are left out)."""
        items = dict(self._items)
        for name, value in values.items():
            if value is not None:
                unit, description = CATALOG[name]
                items[name] = Symptom(name, float(value), unit, description)
        return Symptoms(items, self.texts)

    @classmethod
    def from_values(cls, values: Mapping[str, float]) -> Symptoms:
        """Symptoms from bare numbers (rule examples, tests): units come from the catalog."""
        items = {}
        for name, value in values.items():
            unit, description = CATALOG.get(name, ("", ""))
            items[name] = Symptom(name, float(value), unit, description)
        return cls(items)


class _Builder:
    def __init__(self) -> None:
        self.items: dict[str, Symptom] = {}
        self.texts: dict[str, str] = {}

    def text(self, name: str, value: str) -> None:
        if value:
            assert CATALOG[name][0] == "text", name
            self.texts[name] = value

    def set(self, name: str, value: float | bool | None) -> None:
        if value is None:
            return
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return
        unit, description = CATALOG[name]
        self.items[name] = Symptom(name, float(value), unit, description)

    def get(self, name: str) -> float | None:
        s = self.items.get(name)
        return s.value if s else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def compute_symptoms(breakdown: Breakdown | None, record: RunRecord | None, meta: TraceMeta | None = None) -> Symptoms:
    b = _Builder()
    if breakdown is not None and breakdown.steps:
        _from_breakdown(b, breakdown, meta)
    if record is not None:
        _from_record(b, record, breakdown)
        _from_lines(b, record, breakdown)
    _suggestions(b, record)
    return Symptoms(b.items, b.texts)


def _from_breakdown(b: _Builder, bd: Breakdown, meta: TraceMeta | None) -> None:
    steps = bd.steps
    total = bd.total_us or 1.0
    for cat in EXPOSED:
        b.set(f"exposed.{cat}", bd.exposed_share[cat])
    b.set("exposed.communication_own", bd.exposed_share["communication"])
    for phase in PHASES:
        b.set(f"phase.{phase}", bd.phase_share[phase])
        b.set(f"hidden.{phase}", bd.hidden_share[phase])
    b.set("step.profiled", len(steps))
    if bd.dataloader_kinds:
        b.set("dataloader.present", True)
        b.set("dataloader.single_process", "multi" not in bd.dataloader_kinds)
    b.set("step.time_ms", _median([s.duration_us for s in steps]) / 1000)  # replaced by steady time if any
    b.set("gpu.present", bd.has_gpu)
    if not bd.has_gpu:  # every instant is host time; there are no syncs to set apart
        b.set("exposed.other_not_sync", bd.exposed_share["host_other"])
        return
    b.set("exposed.launch", sum(bd.exposed_share[c] for c in LAUNCH_EXPOSED))
    b.set("exposed.launch_model", bd.exposed_share["host_forward"] + bd.exposed_share["host_backward"])
    b.set("exposed.host", sum(bd.exposed_share[c] for c in EXPOSED[:7]))
    b.set("gpu.busy", bd.gpu_busy_share())  # over the steady step, like the exposed shares
    b.set("gpu.kernel_step_share", sum(bd.exposed_share[c] for c in GPU_EXPOSED))
    b.set("gpu.kernels_per_step", _median([s.kernel_count for s in steps]))
    b.set("gpu.median_kernel_us", _median([s.median_kernel_us for s in steps if s.median_kernel_us is not None]))
    if meta is not None and meta.compute_capability is not None:
        major, minor = meta.compute_capability
        b.set("gpu.compute_capability", major + minor / 10)
        b.set("gpu.tensor_cores", major >= 8)
    matmul: dict[str, float] = {}
    for s in steps:
        for precision, us in s.matmul_us.items():
            matmul[precision] = matmul.get(precision, 0.0) + us
    matmul_total = sum(matmul.values())
    kernel_total = sum(s.kernel_time_us for s in steps)
    b.set("gpu.matmul_step_share", matmul_total / total)
    if matmul_total > 0:
        b.set("gpu.fp32_matmul_share", matmul.get("fp32", 0.0) / matmul_total)
        b.set("gpu.tf32_share", matmul.get("tf32", 0.0) / matmul_total)
        reduced = sum(matmul.get(p, 0.0) for p in ("bf16", "fp16", "fp8"))
        b.set("gpu.reduced_precision_share", reduced / matmul_total)
    b.set("gpu.fp32_matmul_step_share", matmul.get("fp32", 0.0) / total)
    b.set("gpu.conv_step_share", sum(s.conv_us for s in steps) / total)
    b.set("gpu.transpose_step_share", sum(s.transpose_us for s in steps) / total)
    if kernel_total > 0:
        b.set("gpu.triton_share", sum(s.triton_us for s in steps) / kernel_total)
    b.set("gpu.graph_launches_per_step", _median([s.graph_launches for s in steps]))
    b.set("gpu.communication_step_share", sum(s.communication_us for s in steps) / total)
    h2d = [s.h2d_pageable_bytes + s.h2d_pinned_bytes for s in steps]
    b.set("h2d.bytes_per_step", _median(h2d))
    b.set("h2d.pageable_bytes_per_step", _median([s.h2d_pageable_bytes for s in steps]))
    if sum(h2d):
        b.set("h2d.pageable_fraction", sum(s.h2d_pageable_bytes for s in steps) / sum(h2d))
    b.set("h2d.copies_per_step", _median([s.h2d_copies for s in steps]))
    copy_us = sum(s.h2d_copy_us for s in steps)
    b.set("h2d.gpu_copy_step_share", copy_us / total)
    if copy_us > 0:
        b.set("h2d.bandwidth_gbs", sum(h2d) / (copy_us * 1e-6) / 1e9)
    b.set("sync.per_step", _median([s.sync_count for s in steps]))
    b.set("sync.blocked_share", sum(s.sync_blocked_us for s in steps) / total)
    idle_after = sum(s.sync_idle_after_us for s in steps) / total
    b.set("sync.idle_after_share", idle_after)
    b.set("sync.cost_share", bd.exposed_share["sync"] + idle_after)
    b.set("exposed.other_not_sync", max(0.0, bd.exposed_share["host_other"] - idle_after))
    b.set("optimizer.kernels_per_step", _median([s.optimizer_kernels for s in steps]))
    optimizer_kernels = sum(s.optimizer_kernels for s in steps)
    if optimizer_kernels:
        b.set("optimizer.multi_tensor_share", sum(s.multi_tensor_kernels for s in steps) / optimizer_kernels)
    b.set("optimizer.step_share", bd.exposed_share["host_optimizer"] + bd.exposed_share["gpu_optimizer"])


def _from_record(b: _Builder, record: RunRecord, bd: Breakdown | None) -> None:
    env = record.environment
    if env.get("cpu_count"):
        b.set("cpu.count", env["cpu_count"])
    if b.get("gpu.compute_capability") is None and env.get("compute_capability"):
        major, _, minor = str(env["compute_capability"]).partition(".")
        b.set("gpu.compute_capability", int(major) + int(minor or 0) / 10)
        b.set("gpu.tensor_cores", int(major) >= 8)
    if record.timed_seconds and record.timed_steps:
        b.set("step.time_ms", record.timed_seconds / record.timed_steps * 1000)
    bs = record.batch_size()
    b.set("batch.size", bs)

    loader = record.train_loader()
    b.set("dataloader.present", loader is not None)
    if loader is not None:
        b.set("dataloader.num_workers", loader.num_workers)
        b.set("dataloader.pin_memory", loader.pin_memory)
        b.set("dataloader.persistent_workers", loader.persistent_workers)
        b.set("dataloader.prefetch_factor", loader.prefetch_factor or 0)
        b.set("dataloader.batch_size", loader.batch_size)
        b.set("dataloader.iterators", loader.iterators_created)
        if loader.dataset_len and loader.batch_size:
            steps_per_epoch = loader.dataset_len // loader.batch_size if loader.drop_last else math.ceil(loader.dataset_len / loader.batch_size)
            b.set("dataloader.steps_per_epoch", steps_per_epoch)
        startup = _startup_seconds(loader.first_batch_wait_s, bd)
        b.set("dataloader.startup_s", startup)
        step_ms = b.get("step.time_ms")
        epoch_steps = b.get("dataloader.steps_per_epoch")
        if startup is not None and step_ms and epoch_steps:
            epoch_s = epoch_steps * step_ms / 1000
            b.set("dataloader.restart_share", startup / (startup + epoch_s))

    b.set("optimizer.present", bool(record.optimizers))
    if record.optimizers:
        b.set("optimizer.param_tensors", sum(o.param_tensors for o in record.optimizers))
        b.set("optimizer.forloop", any(o.implementation == "for-loop" for o in record.optimizers))

    mem = record.memory
    if mem.get("capacity_bytes"):
        cap = mem["capacity_bytes"]
        b.set("memory.capacity_gb", cap / 1e9)
        b.set("memory.peak_allocated_share", mem.get("peak_allocated_bytes", 0) / cap)
        b.set("memory.peak_reserved_share", mem.get("peak_reserved_bytes", 0) / cap)
    b.set("memory.oom", record.status == "oom")

    if record.models:
        main = record.models[0]
        b.set("model.conv_layers", sum(m.conv_layers for m in record.models))
        b.set("model.channels_last", main.channels_last)
        b.set("model.compiled", any(m.compiled for m in record.models) or (b.get("gpu.triton_share") or 0) > 0.2)
        b.set("model.data_parallel", any(m.data_parallel for m in record.models))
        b.set("model.ddp", any(m.distributed_data_parallel for m in record.models))
    elif b.get("gpu.triton_share") is not None:
        b.set("model.compiled", (b.get("gpu.triton_share") or 0) > 0.2)
    dist = record.distributed
    if dist:
        b.set("dist.gloo_with_gpus", dist.get("backend") == "gloo" and bool(dist.get("cuda_available")))
    flags = record.flags
    if flags:
        b.set("cudnn.benchmark", flags.get("cudnn_benchmark", False))
        b.set(
            "matmul.tf32",
            bool(flags.get("matmul_allow_tf32")) or flags.get("float32_matmul_precision") in ("high", "medium"),
        )


def _startup_seconds(first_batch_waits: list[float], bd: Breakdown | None) -> float | None:
    """Wait for an epoch's first batch beyond a normal batch's wait: the cost of starting workers."""
    if not first_batch_waits:
        return None
    normal = 0.0
    if bd is not None and bd.steps:
        normal = (bd.median_of("phases", "data_wait") or 0.0) / 1e6
    return max(0.0, statistics.median(first_batch_waits) - normal)


def _suggestions(b: _Builder, record: RunRecord | None) -> None:
    cpus = b.get("cpu.count")
    workers = b.get("dataloader.num_workers")
    if workers is not None or b.get("dataloader.single_process") == 1:
        busy = b.get("workers.busy")
        b.set("workers.saturated", not workers or busy is None or busy >= 0.6)
    if workers is None and b.get("dataloader.single_process") == 1:
        workers = 0
    data_wait = b.get("exposed.data_wait")
    phase_wait = b.get("phase.data_wait")
    if workers is not None and data_wait is not None and phase_wait is not None:
        if cpus is not None and b.get("gpu.present") == 0:
            cpus = max(1, int(cpus) // 2)  # a CPU-only model computes on the same cores: leave it half
        suggestion = suggest_num_workers(None if cpus is None else int(cpus), int(workers), data_wait, phase_wait)
        balance = b.get("workers.balance")
        if balance is not None:  # measured in the workers themselves: better than the estimate
            limit = max(1, int(cpus) - 1) if cpus is not None else 1 << 16
            suggestion = int(min(limit, max(balance + 1, workers + 1, 2)))
        b.set("suggest.num_workers", suggestion)
    bs = b.get("batch.size")
    reserved = b.get("memory.peak_reserved_share")
    if bs and reserved and reserved > 0:
        b.set("suggest.batch_size", suggest_batch_size(int(bs), reserved))


def suggest_num_workers(cpus: int | None, workers: int, exposed_wait: float, phase_wait: float) -> int:
    """Workers that deliver one batch per step of GPU work, capped at the CPUs (one kept for the
    main process) when the CPU count is known.

    With no workers the main thread loads each batch itself: loading takes ``phase_wait`` of the
    step and the rest is the work the loader must keep up with, so ``ceil(L / G)`` workers load
    as fast as the GPU consumes (plus one so a slow batch does not stall it). With ``n`` workers
    and an exposed wait ``w``, each worker takes ``n * step`` per batch, and ``n / (1 - w)`` of
    them would have delivered on time.
    """
    limit = max(1, cpus - 1) if cpus is not None else 1 << 16
    if workers == 0:
        load, rest = phase_wait, max(1.0 - phase_wait, 0.05)
        needed = math.ceil(load / rest) + 1
    else:
        needed = math.ceil(workers / max(1.0 - exposed_wait, 0.05)) + 1
    return int(min(limit, max(needed, workers + 1, 2)))


def suggest_batch_size(batch: int, reserved_share: float) -> int:
    """The largest power-of-two multiple of the batch whose memory stays under 80% of the device,
    if all memory grew with the batch (it does not: weights and optimizer state stay, so this
    errs on the safe side)."""
    factor = 1
    while reserved_share * factor * 2 <= 0.8 and factor < 64:
        factor *= 2
    return batch * factor


def _short(site: str) -> str:
    path, _, line = site.rpartition(":")
    return f"{path.rsplit('/', 1)[-1]}:{line}"


def _quote(lines: list[dict], n: int = 2, where: bool = False) -> str:
    return "; ".join(
        f"{_short(x['site'])} `{x['code']}`" + (f" ({x['where']}, {x['share'] * 100:.0f}% of the step)" if where else f" ({x['share'] * 100:.0f}% of the step)")
        for x in lines[:n]
    )


def _sync_site_text(site: dict, steps: int) -> str:
    blocked = site.get("blocked_ms_per_step")
    time = f", {blocked:.3g} ms/step blocked" if blocked is not None else ""
    return f"{_short(site['site'])} `{site['code']}` ({site['kind']}, {site['count'] / steps:.3g}/step{time})"


def _from_lines(b: _Builder, record: RunRecord, bd: Breakdown | None) -> None:
    """Quote the source lines that line attribution found (diagnose.runtime.lines)."""
    # the sync counts cover the whole profiled window (a trimmed trace may hold fewer steps)
    steps = record.profiled_steps or (len(bd.steps) if bd is not None and bd.steps else 1)
    copies = [s for s in record.sync_sites if s["kind"] == "blocking copy"]
    if copies:
        b.text("lines.h2d", "; ".join(f"{_short(s['site'])} `{s['code']}` ({s['count'] / steps:.3g}/step)" for s in copies[:2]))
    sampled = (record.host_samples or {}).get("lines", [])
    if not copies:
        b.text("lines.h2d", _quote([x for x in sampled if ".to(" in x["code"] or ".cuda(" in x["code"]]))
    b.text("lines.model", _quote([x for x in sampled if x["where"] in ("model", "backward")], where=True))
    optimizer_sites = [f"{_short(o.created_at)} ({o.name}, {o.implementation}, {o.param_tensors} tensors)" for o in record.optimizers if o.created_at]
    stepped = [x for x in sampled if x["where"] == "optimizer"]
    b.text("lines.optimizer", "; ".join(optimizer_sites + ([_quote(stepped, 1)] if stepped else [])))
    if record.sync_sites:
        b.text("lines.sync", "; ".join(_sync_site_text(s, steps) for s in record.sync_sites[:3]))
    host = record.host_samples
    if host and host.get("lines"):
        other = [x for x in host["lines"] if x["where"] == "other"]
        if other:
            b.text("lines.host_other", "; ".join(f"{_short(x['site'])} `{x['code']}` ({x['share'] * 100:.0f}% of the step)" for x in other[:3]))
            b.set("host.other_user_share", sum(x["share"] for x in other))
        data = [x for x in host["lines"] if x["where"] == "data"]
        workers = record.worker_samples
        if workers and workers.get("lines"):
            b.text(
                "lines.data",
                "; ".join(f"{_short(x['site'])} `{x['code']}` ({x['activity']}, {x['share'] * 100:.0f}% of worker time)" for x in workers["lines"][:3]),
            )
        elif data:
            b.text("lines.data", "; ".join(f"{_short(x['site'])} `{x['code']}` ({x['share'] * 100:.0f}% of the step)" for x in data[:3]))
    workers = record.worker_samples
    if workers and workers.get("by_activity"):
        b.set("workers.busy", 1.0 - workers["by_activity"].get("idle", 0.0))
    if workers and workers.get("cpu_s_per_batch"):
        cpu_ms = workers["cpu_s_per_batch"] * 1000
        b.set("workers.cpu_per_batch_ms", cpu_ms)
        step_ms = b.get("step.time_ms")
        wait = b.get("exposed.data_wait") or 0.0
        if step_ms:
            gpu_ms = step_ms * (1 - wait)  # the step as it would be with no data wait
            b.set("workers.balance", math.ceil(cpu_ms / max(gpu_ms, 1e-3)))


def summarize_rank(rank: int, record: RunRecord, bd: Breakdown | None) -> RankSummary:
    """One rank's row of the side-by-side table."""
    steps = bd.steps if bd is not None else []
    median_step = _median([s.duration_us for s in steps])
    top = max(bd.exposed_share, key=bd.exposed_share.get) if bd is not None else None
    comm_us = _median([s.communication_us for s in steps])
    exposed_comm = bd.exposed_share["communication"] if bd is not None else None
    data_wait_share = bd.exposed_share["data_wait"] if bd is not None else None
    return RankSummary(
        rank=rank,
        status=record.status,
        median_step_ms=median_step / 1000 if median_step is not None else None,
        data_wait_ms=(data_wait_share * median_step / 1000) if data_wait_share is not None and median_step else None,
        data_wait_share=data_wait_share,
        communication_ms=comm_us / 1000 if comm_us is not None else None,
        exposed_communication_share=exposed_comm,
        gpu_busy=(sum(s.gpu_busy_us for s in steps) / bd.total_us) if bd is not None and bd.has_gpu and bd.total_us else None,
        samples_per_step=record.batch_size(),
        top_exposed=top,
        backend=(record.distributed or {}).get("backend"),
        steady_samples_per_s=(
            round(record.timed_samples / record.timed_seconds, 3) if record.timed_samples and record.timed_seconds else None
        ),
    )


def distributed_symptoms(summaries: list[RankSummary], lagging: dict | None) -> dict[str, float | None]:
    out: dict[str, float | None] = {"dist.world_size": len(summaries)}
    # The rank that reaches the all-reduce last waits only for the reduction itself; the others
    # also wait for it. So the least exposed communication of any rank is what the network costs.
    shares = [s.exposed_communication_share for s in summaries if s.exposed_communication_share is not None]
    if len(shares) == len(summaries) and shares:
        out["exposed.communication_own"] = min(shares)
    if lagging is not None:
        out["dist.straggler_rank"] = lagging["rank"]
        out["dist.straggler_data_share"] = lagging["excess_share"]
        out["dist.straggler_data_ms"] = lagging["data_wait_ms"]
        out["dist.others_data_ms"] = lagging["others_data_wait_ms"]
    samples = [s.samples_per_step for s in summaries if s.samples_per_step]
    if len(samples) == len(summaries) and samples:
        out["dist.samples_imbalance"] = max(samples) / min(samples)
    return out
