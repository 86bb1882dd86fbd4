"""The DataLoader and its workers: settings, start-up, how busy the workers are, how many would keep up."""

from __future__ import annotations

import math
import statistics

from diagnose.analysis.measure.breakdown import Breakdown
from diagnose.analysis.measure.workers import MIN_REST_SHARE, building_workers, per_batch_ms, usable_cpus, wait_ratio
from diagnose.analysis.symptoms.registry import Known, symptom
from diagnose.record import DataLoaderInfo, RunRecord

#: "no limit" on workers when the CPU count is unknown
NO_CPU_LIMIT = 1 << 16
#: what the workers' pace by their CPU time reads (``worker_interval_ms``, ``per_batch_ms``)
INTERVAL_USES = ("workers.cpu_per_batch_ms", "dataloader.num_workers", "cpu.count", "cpu.cores")


@symptom("dataloader.present", "bool", "the steps draw batches from a torch DataLoader")
def present(steps: Breakdown | None = None, record: RunRecord | None = None) -> bool | None:
    if record is not None:
        # a DataLoader the script built but did not iterate in the profiled steps (one built at
        # start-up by a script that feeds its steps from its own loader) is not the steps' data:
        # its knobs cannot change them (findings leave them out then)
        return record.fed_by_dataloader()
    return True if steps is not None and steps.dataloader_kinds else None


@symptom(
    "dataloader.single_process", "bool", "the DataLoader loads in the main process (num_workers=0), as the trace shows"
)
def single_process(steps: Breakdown) -> bool | None:
    return "multi" not in steps.dataloader_kinds if steps.dataloader_kinds else None


def _loader(record: RunRecord) -> DataLoaderInfo | None:
    return record.train_loader()


@symptom("dataloader.num_workers", "count", "DataLoader num_workers (a bare trace shows only whether it is 0)")
def num_workers(record: RunRecord | None = None, steps: Breakdown | None = None) -> int | None:
    if record is not None:
        loader = _loader(record)
        return loader.num_workers if loader else None
    # _SingleProcessDataLoaderIter is num_workers=0; a multi-process iterator does not say how many
    if steps is not None and steps.dataloader_kinds and "multi" not in steps.dataloader_kinds:
        return 0
    return None


@symptom("dataloader.pin_memory", "bool", "DataLoader pin_memory")
def pin_memory(record: RunRecord) -> bool | None:
    loader = _loader(record)
    return loader.pin_memory if loader else None


@symptom("dataloader.persistent_workers", "bool", "DataLoader persistent_workers")
def persistent_workers(record: RunRecord) -> bool | None:
    loader = _loader(record)
    return loader.persistent_workers if loader else None


@symptom("dataloader.prefetch_factor", "count", "DataLoader prefetch_factor (0 with no workers)")
def prefetch_factor(record: RunRecord) -> int | None:
    loader = _loader(record)
    return (loader.prefetch_factor or 0) if loader else None


@symptom("dataloader.batch_size", "count", "DataLoader batch_size")
def batch_size(record: RunRecord) -> int | None:
    loader = _loader(record)
    return loader.batch_size if loader else None


@symptom("dataloader.iterators", "count", "times the DataLoader was iterated from the start (epochs begun)")
def iterators(record: RunRecord) -> int | None:
    loader = _loader(record)
    return loader.iterators_created if loader else None


@symptom("dataloader.steps_per_epoch", "count", "batches per epoch")
def steps_per_epoch(record: RunRecord) -> int | None:
    return record.epoch_batches()


@symptom(
    "dataloader.startup_s", "s", "extra wait for the first batch of an epoch, over a normal batch (worker start-up)"
)
def startup_s(record: RunRecord, steps: Breakdown | None = None) -> float | None:
    """Wait for an epoch's first batch beyond a normal batch's wait: the cost of starting workers."""
    loader = _loader(record)
    if loader is None or not loader.first_batch_wait_s:
        return None
    normal = (steps.median_of("phases", "data_wait") or 0.0) / 1e6 if steps is not None else 0.0
    return max(0.0, statistics.median(loader.first_batch_wait_s) - normal)


@symptom(
    "dataloader.restart_share",
    "share",
    "share of an epoch spent starting DataLoader workers",
    uses=("dataloader.startup_s", "step.time_ms", "dataloader.steps_per_epoch"),
)
def restart_share(known: Known) -> float | None:
    startup, step_ms, epoch_steps = (
        known.get("dataloader.startup_s"),
        known.get("step.time_ms"),
        known.get("dataloader.steps_per_epoch"),
    )
    if startup is None or not step_ms or not epoch_steps:
        return None
    return startup / (startup + epoch_steps * step_ms / 1000)


@symptom("workers.busy", "share", "share of the DataLoader workers' time spent building batches (not waiting for work)")
def workers_busy(record: RunRecord) -> float | None:
    by_activity = (record.worker_samples or {}).get("by_activity")
    return 1.0 - by_activity.get("idle", 0.0) if by_activity else None


@symptom("workers.cpu_per_batch_ms", "ms", "CPU time a DataLoader worker spends building one batch")
def cpu_per_batch_ms(record: RunRecord) -> float | None:
    seconds = (record.worker_samples or {}).get("cpu_s_per_batch")
    return seconds * 1000 if seconds else None


@symptom(
    "workers.load",
    "share",
    "how busy the DataLoader workers are, the largest of three measures: their sampled busy share, their CPU time per "
    "batch over the time they have for it (the workers that build at once times the median step), and where the "
    "steady steps measurably waited for data (data.steady_wait), the steady step over its own work; 1 or more: they "
    "cannot keep up",
    uses=("workers.busy", *INTERVAL_USES, "step.median_ms", "step.time_ms", "data.steady_wait"),
)
def workers_load(known: Known) -> float | None:
    """Each measure errs its own way: the sampled share missed most of an MNIST VAE's work (0.17
    where its CPU time said 0.8) and of timm's JPEG workers (0.11, where 4 workers at 105 ms of CPU
    a batch could not keep up with 17 ms steps, docs/zoo.md); the CPU time counts a worker's
    first, slow batches, and misses a worker that waits on storage or sleeps (the planted
    prefetch_loader: 2 ms of CPU a batch, 91% of its steady steps measured waiting, and its
    sampled share below 60% on one run of two). A steady wait of ``w`` (at least
    ``LOADER_PACED_WAIT``) makes the loader's interval the steady step and the step's own work
    ``1 - w`` of it: a load of ``1 / (1 - w)``. Taking the largest, a loader is called idle only
    where every measure says so."""
    busy = known.get("workers.busy")
    step_ms = typical_step_ms(known)
    interval = worker_interval_ms(known)
    by_cpu = interval / step_ms if interval and step_ms else None
    loads = [v for v in (busy, by_cpu, wait_ratio(known.get("data.steady_wait"))) if v is not None]
    return round(max(loads), 4) if loads else None


def worker_interval_ms(known: Known, steady_mean_ms: float | None = None) -> float | None:
    """How often the DataLoader's workers can hand over a batch, by their CPU time: the CPU time
    per batch over the workers that build at once (``INTERVAL_USES``). A worker's wall time per
    batch is at least its CPU time, so the real interval is no shorter; with ``steady_mean_ms``,
    at most that (``measure.workers.per_batch_ms``'s bound)."""
    cpu_ms, workers = known.get("workers.cpu_per_batch_ms"), known.get("dataloader.num_workers")
    if not cpu_ms or not workers:
        return None
    cpus = worker_cpus(known)
    per_batch = per_batch_ms(cpu_ms, workers, cpus, steady_mean_ms, None)
    return per_batch / building_workers(workers, cpus) if per_batch else None


@symptom(
    "workers.steady_wait",
    "share",
    "share of a steady step spent waiting for the DataLoader's workers by their CPU time per batch: where they hand "
    "over a batch less often than the step consumes one, 1 - the step's own work over their interval (0 where they "
    "keep up)",
    uses=(*INTERVAL_USES, "step.median_ms", "step.time_ms", "step.steady_mean_ms", "exposed.data_wait"),
)
def steady_wait(known: Known) -> float | None:
    """A short window can hide a loader that cannot keep up: the batches the workers queued
    before it (``prefetch_factor`` a worker, built while the model was set up or an evaluation
    ran) are taken at once, and only once the queue is empty does each step wait. timm's
    ResNet-18 with 4 JPEG workers at 103 ms of CPU a batch (one every 26 ms) and 12.5 ms steps
    waited 9% of its profiled window; its steady steps' mean was 2.5 times their median (three
    quick steps, then one that waited for the next burst of batches). The step's own work is the
    typical step less the window's share of data wait. The steady steps bound it: a loader that
    sets the pace makes the mean steady step its interval, so an interval longer than that (a
    worker's CPU time counting threads that decode side by side) is not the loader's."""
    interval = worker_interval_ms(known, known.get("step.steady_mean_ms"))
    step_ms = typical_step_ms(known)
    if not interval or not step_ms:
        return None
    work = step_ms * (1 - (known.get("exposed.data_wait") or 0.0))
    return round(max(0.0, 1 - work / interval), 4)


@symptom(
    "data.steady_wait",
    "share",
    "share of the steady steps (profiler off) the training thread waited inside DataLoader __next__, measured (none: "
    "not recorded)",
)
def measured_steady_wait(record: RunRecord) -> float | None:
    share = record.steady_data_wait_share()
    return round(share, 4) if share is not None else None


@symptom(
    "data.wait",
    "share",
    "share of the step spent waiting for data with nothing else running: the profiled window's, or where larger the "
    "steady steps' (measured: data.steady_wait; where not recorded, what the DataLoader workers' CPU time per batch "
    "implies: workers.steady_wait)",
    uses=("exposed.data_wait", "data.steady_wait", "workers.steady_wait"),
)
def data_wait(known: Known) -> float | None:
    """The steady steps' wait, measured, where the record holds it: a window can draw the batches
    the workers queued before it, and the steps after the untimed ones that drew what they queued
    during it are the loader's steady state. A wait while the GPU still runs the step before is
    not exposed; a steady step that waits for its batch has little queued on the GPU, so the
    measured wait stands for the exposed one. Where it was not recorded (a run of an older
    version, a bare trace), the workers' CPU time per batch says what the steady step waits."""
    exposed = known.get("exposed.data_wait")
    if exposed is None:
        return None
    measured = known.get("data.steady_wait")
    steady = measured if measured is not None else known.get("workers.steady_wait")
    return max(exposed, steady or 0.0)


@symptom(
    "workers.balance",
    "count",
    "DataLoader workers whose combined output matches the step rate without the data wait",
    uses=(
        *INTERVAL_USES,
        "step.median_ms",
        "step.time_ms",
        "exposed.data_wait",
        "step.steady_mean_ms",
        "data.steady_wait",
    ),
)
def balance(known: Known) -> int | None:
    """A worker's time per batch (``measure.workers.per_batch_ms``: the steady pace where the
    steady steps waited for data, whose workers may spend little CPU, else their CPU time) over
    the step without its data wait."""
    cpu_ms = per_batch_ms(
        known.get("workers.cpu_per_batch_ms"),
        known.get("dataloader.num_workers"),
        worker_cpus(known),
        known.get("step.steady_mean_ms"),
        known.get("data.steady_wait"),
    )
    step_ms = typical_step_ms(known)
    if cpu_ms is None or not step_ms:
        return None
    gpu_ms = step_ms * (1 - (known.get("exposed.data_wait") or 0.0))  # the step as it would be with no data wait
    return math.ceil(cpu_ms / max(gpu_ms, 1e-3))


@symptom(
    "suggest.num_workers",
    "count",
    "DataLoader workers that would keep up with the step, within the CPUs (half of them on a CPU-only run)",
    uses=(
        "dataloader.num_workers",
        "dataloader.single_process",
        "cpu.count",
        "cpu.cores",
        "gpu.present",
        "exposed.data_wait",
        "phase.data_wait",
        "workers.balance",
    ),
)
def suggested_workers(known: Known) -> int | None:
    workers = known.get("dataloader.num_workers")
    if workers is None and known.get("dataloader.single_process") == 1:
        workers = 0
    data_wait, phase_wait = known.get("exposed.data_wait"), known.get("phase.data_wait")
    if workers is None or data_wait is None or phase_wait is None:
        return None
    cpus = worker_cpus(known)
    if cpus is not None and known.get("gpu.present") == 0:
        cpus = max(1, int(cpus) // 2)  # a CPU-only model computes on the same cores: leave it half
    balance = known.get("workers.balance")
    if balance is not None:  # measured in the workers themselves: better than the estimate
        limit = max(1, int(cpus) - 1) if cpus is not None else NO_CPU_LIMIT
        return int(min(limit, max(balance + 1, workers + 1, 2)))
    return suggest_num_workers(None if cpus is None else int(cpus), int(workers), data_wait, phase_wait)


def typical_step_ms(known: Known) -> float | None:
    """The step a loader must keep up with: the steady steps' median (their mean also holds what
    a step paid for an evaluation or an epoch's end), else their mean (both declared in ``uses``)."""
    return known.get("step.median_ms") or known.get("step.time_ms")


def worker_cpus(known: Known) -> float | None:
    """The CPUs DataLoader workers can use (``measure.workers.usable_cpus``): the physical cores
    among the CPUs, where the run recorded them."""
    return usable_cpus(known.get("cpu.count"), known.get("cpu.cores"))


def workers_limit(cpus: int, cpu_only: bool) -> int:
    """The most DataLoader workers a machine with ``cpus`` CPUs should run: one CPU is kept for
    the main process, and on a CPU-only run the model computes on the same cores, so the workers
    get half of them."""
    usable = max(1, cpus // 2) if cpu_only else cpus
    return max(1, usable - 1)


@symptom(
    "suggest.preprocess_workers",
    "count",
    "DataLoader workers that would take over the main thread's own per-batch work (and the loading) and keep up with "
    "the step, within the CPUs; absent when the CPU count is unknown",
    uses=(
        "cpu.count",
        "cpu.cores",
        "gpu.present",
        "dataloader.num_workers",
        "dataloader.single_process",
        "phase.other",
        "phase.data_wait",
        "exposed.data_wait",
        "exposed.other_not_sync",
        "workers.cpu_per_batch_ms",
        "step.time_ms",
    ),
)
def suggested_preprocess_workers(known: Known) -> int | None:
    cpus, other = worker_cpus(known), known.get("phase.other")
    workers = known.get("dataloader.num_workers")
    if workers is None and known.get("dataloader.single_process") == 1:
        workers = 0
    if cpus is None or other is None or workers is None:
        return None
    # what one batch costs the loader now, as a share of the step: measured in the workers where
    # they were sampled, else the main thread's loading (no workers) or n workers' turn-around
    cpu_ms, step_ms = known.get("workers.cpu_per_batch_ms"), known.get("step.time_ms")
    if cpu_ms is not None and step_ms:
        load = cpu_ms / step_ms
    elif workers == 0:
        load = known.get("phase.data_wait") or 0.0
    else:
        load = float(workers)
    # after the move neither the data wait nor the main thread's own work limits the step
    rest = max(
        1.0 - (known.get("exposed.data_wait") or 0.0) - (known.get("exposed.other_not_sync") or 0.0), MIN_REST_SHARE
    )
    needed = math.ceil((load + other) / rest) + 1  # one spare, so that a slow batch does not stall the step
    return int(min(workers_limit(int(cpus), known.get("gpu.present") == 0), max(needed, int(workers), 1)))


@symptom(
    "suggest.workers_basis",
    "text",
    "the CPU count behind a suggested number of DataLoader workers, as the findings quote it",
    uses=("cpu.count", "cpu.cores", "gpu.present"),
)
def workers_basis(known: Known) -> str | None:
    cpus = worker_cpus(known)
    if cpus is None:
        return None
    cpu_only = known.get("gpu.present") == 0
    limit = workers_limit(int(cpus), cpu_only)
    shared = ", shared with the model's own threads (half for the workers)" if cpu_only else ""
    count = known.get("cpu.count")
    what = (
        f"{int(cpus)} CPUs"
        if count is None or int(count) == int(cpus)
        else f"{int(count)} CPUs on {int(cpus)} physical cores"
    )
    return f"{what}{shared}: at most {limit} worker{'s' if limit != 1 else ''} beside the main process"


def suggest_num_workers(cpus: int | None, workers: int, exposed_wait: float, phase_wait: float) -> int:
    """Workers that deliver one batch per step of GPU work, capped at the CPUs (one kept for the
    main process) when the CPU count is known.

    With no workers the main thread loads each batch itself: loading takes ``phase_wait`` of the
    step and the rest is the work the loader must keep up with, so ``ceil(L / G)`` workers load
    as fast as the GPU consumes (plus one so a slow batch does not stall it). With ``n`` workers
    and an exposed wait ``w``, each worker takes ``n * step`` per batch, and ``n / (1 - w)`` of
    them would have delivered on time.
    """
    limit = max(1, cpus - 1) if cpus is not None else NO_CPU_LIMIT
    if workers == 0:
        load, rest = phase_wait, max(1.0 - phase_wait, MIN_REST_SHARE)
        needed = math.ceil(load / rest) + 1
    else:
        needed = math.ceil(workers / max(1.0 - exposed_wait, MIN_REST_SHARE)) + 1
    return int(min(limit, max(needed, workers + 1, 2)))


#: a step "waited" for data when its exposed data wait is at least this share of the step
WAITED_SHARE_OF_STEP = 0.05


@symptom(
    "data.waiting_steps",
    "share",
    "share of profiled steps that waited for data (exposed data wait of 5% of the step or more); "
    "low beside a large exposed.data_wait means a bursty input pipeline: periodic long waits",
)
def waiting_steps(steps: Breakdown) -> float | None:
    if len(steps.steps) < 2:
        return None
    waited = [
        s
        for s in steps.steps
        if s.duration_us and s.exposed.get("data_wait", 0.0) >= WAITED_SHARE_OF_STEP * s.duration_us
    ]
    return len(waited) / len(steps.steps)
