"""What only the ranks together show: the straggler, unequal data, and the process group's backend;
and the gradient volume a DDP bucket size is chosen against."""

from __future__ import annotations

from diagnose.analysis.measure.kernels import ELEMENT_BYTES
from diagnose.analysis.measure.ranks import RankSet
from diagnose.analysis.symptoms.registry import Known, symptom
from diagnose.record import RunRecord


@symptom("dist.world_size", "count", "ranks in the run")
def world_size(ranks: RankSet) -> int:
    return len(ranks.summaries)


def _straggler(ranks: RankSet, key: str) -> float | None:
    return ranks.straggler[key] if ranks.straggler is not None else None


@symptom("dist.straggler_rank", "count", "the rank whose exposed data wait stands out")
def straggler_rank(ranks: RankSet) -> float | None:
    return _straggler(ranks, "rank")


@symptom(
    "dist.straggler_data_share",
    "share",
    "the straggler's exposed data wait over the other ranks' median, as a share of the step",
)
def straggler_data_share(ranks: RankSet) -> float | None:
    return _straggler(ranks, "excess_share")


@symptom("dist.straggler_data_ms", "ms", "the straggler's exposed data wait per step")
def straggler_data_ms(ranks: RankSet) -> float | None:
    return _straggler(ranks, "data_wait_ms")


@symptom("dist.others_data_ms", "ms", "the other ranks' exposed data wait per step (median)")
def others_data_ms(ranks: RankSet) -> float | None:
    return _straggler(ranks, "others_data_wait_ms")


@symptom("dist.samples_imbalance", "", "samples per step of the busiest rank over the lightest")
def samples_imbalance(ranks: RankSet) -> float | None:
    samples = [s.samples_per_step for s in ranks.summaries if s.samples_per_step]
    if not samples or len(samples) != len(ranks.summaries):
        return None
    return max(samples) / min(samples)


@symptom("dist.gloo_with_gpus", "bool", "the process group uses gloo although GPUs (and NCCL) are there")
def gloo_with_gpus(record: RunRecord) -> bool | None:
    group = record.distributed
    return group.get("backend") == "gloo" and bool(group.get("cuda_available")) if group else None


# --- communication by collective kind (analysis.measure.collectives), from the ranks' summaries ----------
# The least exposed share of any rank is what a collective itself costs: the rank that arrives
# last at it waits only for the transfer, the others also for that rank (a straggler's fault).


def _least_exposed_share(ranks: RankSet, kind: str) -> float | None:
    shares = []
    for s in ranks.summaries:
        step = s.steady_step_ms or s.median_step_ms
        if kind in s.collectives and step:
            shares.append(s.collectives[kind]["exposed_ms"] / step)
    return round(min(shares), 4) if shares and len(shares) == len(ranks.summaries) else None


@symptom(
    "dist.all_gather_exposed",
    "share",
    "share of the step the all-gathers (FSDP's parameter gathers) run with no compute beside them, least of any rank",
)
def all_gather_exposed(ranks: RankSet) -> float | None:
    return _least_exposed_share(ranks, "all_gather")


@symptom(
    "dist.reduce_scatter_exposed",
    "share",
    "share of the step the reduce-scatters (FSDP's gradient reductions) run with no compute beside them, least of any rank",
)
def reduce_scatter_exposed(ranks: RankSet) -> float | None:
    return _least_exposed_share(ranks, "reduce_scatter")


@symptom(
    "dist.all_reduce_exposed",
    "share",
    "share of the step the all-reduces (DDP's gradient buckets) run with no compute beside them, least of any rank",
)
def all_reduce_exposed(ranks: RankSet) -> float | None:
    return _least_exposed_share(ranks, "all_reduce")


@symptom(
    "dist.all_reduce_calls_per_step",
    "count",
    "all-reduce calls per step (DDP: one per gradient bucket), the first rank's",
)
def all_reduce_calls_per_step(ranks: RankSet) -> float | None:
    first = min(ranks.summaries, key=lambda s: s.rank)
    return first.collectives["all_reduce"]["calls_per_step"] if "all_reduce" in first.collectives else None


@symptom(
    "dist.all_reduce_overlapped",
    "share",
    "share of the all-reduce time that runs beside compute (backward), the first rank's",
)
def all_reduce_overlapped(ranks: RankSet) -> float | None:
    first = min(ranks.summaries, key=lambda s: s.rank)
    c = first.collectives.get("all_reduce")
    return round(c["overlapped_ms"] / c["ms"], 4) if c and c["ms"] else None


# --- DDP's buckets, against the gradient volume -------------------------------------------------
# DDP's first bucket holds 1 MiB, the others up to bucket_cap_mb (25 MiB by default). A bucket size
# is advice only against the gradients it splits: 70 KB of gradients go in one bucket whatever
# the size, and below a few MiB each all-reduce is latency, not bytes, so nothing hides it better.

#: the smallest bucket worth advising (DDP's own first bucket) and DDP's default cap
MIN_BUCKET_MIB = 1
DEFAULT_BUCKET_MIB = 25
#: the largest bucket DIST009 advises (fewer calls; a bucket still starts while backward runs)
MAX_BUCKET_MIB = 100
#: DIST008 splits the gradients into about this many buckets, DIST009 into at most this many
OVERLAP_BUCKETS = 4
BATCH_BUCKETS = 8


def _gradient_mib(record: RunRecord) -> float | None:
    if not record.models:
        return None
    total = sum(m.params * ELEMENT_BYTES.get(m.param_dtype.removeprefix("torch."), 4) for m in record.models)
    return round(total / 2**20, 3)


@symptom(
    "model.gradient_mib", "MiB", "gradients all-reduced per step (the models' parameters at their dtype's size), in MiB"
)
def gradient_mib(record: RunRecord) -> float | None:
    return _gradient_mib(record)


@symptom(
    "dist.bucket_mb_to_overlap",
    "MiB",
    "the bucket_cap_mb that splits the gradients into about 4 buckets (at least 1, at most DDP's default 25)",
)
def bucket_mb_to_overlap(record: RunRecord) -> float | None:
    mib = _gradient_mib(record)
    return None if mib is None else float(max(MIN_BUCKET_MIB, min(DEFAULT_BUCKET_MIB, round(mib / OVERLAP_BUCKETS))))


@symptom(
    "dist.bucket_mb_to_batch",
    "MiB",
    "the bucket_cap_mb that all-reduces the gradients in at most 8 buckets (at least DDP's default 25, at most 100)",
)
def bucket_mb_to_batch(record: RunRecord) -> float | None:
    mib = _gradient_mib(record)
    return None if mib is None else float(max(DEFAULT_BUCKET_MIB, min(MAX_BUCKET_MIB, round(mib / BATCH_BUCKETS))))


# --- whether hiding a collective can shorten the step (issue 34) ---------------------------------
# "Exposed" communication is collective time with no compute kernel beside it. On a rank whose GPU
# waits for its host's code most of the step, the collectives run in the gaps the host leaves:
# hiding them moves the GPU's idle time, not the step's end, and the changes that hide them add
# host work (more buckets to launch, prefetches issued from hooks). On 2 H100s (docs/distributed.md)
# DIST008's smaller buckets measured 0.82x and DIST006's FSDP1 prefetch 0.82x, on lead ranks whose
# GPUs were 32% and 21% busy.


@symptom(
    "dist.gpu_idle_for_host",
    "share",
    "on a GPU run, the share of the step the GPU idles while the host runs its code (exposed.host_code): the host, not the "
    "collectives, bounds the step where this is large; absent on a CPU run and on one process",
    uses=("exposed.host_code", "gpu.present", "dist.world_size"),
)
def gpu_idle_for_host(known: Known) -> float | None:
    distributed_gpu_run = known.get("gpu.present") == 1 and known.get("dist.world_size") is not None
    return known.get("exposed.host_code") if distributed_gpu_run else None


@symptom(
    "dist.cpu_cores_per_rank",
    "count",
    "on a CPU run of several ranks, the CPUs per rank: under 2, a rank's collectives (gloo's threads) and its compute share "
    "one CPU, and an all-gather issued early runs in turns with the compute, not beside it; absent on a GPU run",
    uses=("gpu.present", "cpu.count", "dist.world_size"),
)
def cpu_cores_per_rank(known: Known) -> float | None:
    world, cpus = known.get("dist.world_size"), known.get("cpu.count")
    if known.get("gpu.present") != 0 or not world or world < 2 or not cpus:
        return None
    return round(cpus / world, 4)


@symptom(
    "dist.all_reduce_hideable",
    "share",
    "the most of the step that smaller DDP buckets could hide: the exposed all-reduce less its last bucket's share (that one "
    "starts when backward ends, whatever the size), at most the backward compute beside which the others could run (the "
    "GPU's backward kernels; on a CPU run, the main thread's backward)",
    uses=(
        "dist.all_reduce_exposed",
        "model.gradient_mib",
        "dist.bucket_mb_to_overlap",
        "exposed.gpu_backward",
        "phase.backward",
        "gpu.present",
    ),
)
def all_reduce_hideable(known: Known) -> float | None:
    exposed, gradient, bucket = (
        known.get("dist.all_reduce_exposed"),
        known.get("model.gradient_mib"),
        known.get("dist.bucket_mb_to_overlap"),
    )
    backward = known.get("exposed.gpu_backward") if known.get("gpu.present") == 1 else known.get("phase.backward")
    if exposed is None or not gradient or bucket is None or backward is None:
        return None
    # the last bucket holds the model's first gradients, ready only when backward ends: its share
    # of the bytes stays exposed (an optimistic share: a smaller all-reduce is no faster per byte)
    last = min(1.0, bucket / gradient)
    return round(min(exposed * (1 - last), backward), 4)
