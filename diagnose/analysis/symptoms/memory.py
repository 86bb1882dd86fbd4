"""GPU memory and the batch: capacity, peaks, out-of-memory, and a larger batch that would fit."""

from __future__ import annotations

from diagnose.analysis.measure.memory_breakdown import batch_factor_limit
from diagnose.analysis.symptoms.registry import Known, symptom
from diagnose.record import RunRecord, step_samples

#: a suggested batch keeps the memory it would need under this share of the device
BATCH_MEMORY_TARGET = 0.8


def _capacity(record: RunRecord) -> float | None:
    return record.memory.get("capacity_bytes") or None


@symptom("memory.capacity_gb", "GB", "GPU memory capacity")
def capacity_gb(record: RunRecord) -> float | None:
    capacity = _capacity(record)
    return capacity / 1e9 if capacity else None


@symptom("memory.peak_allocated_share", "share", "peak memory allocated by tensors, of capacity")
def peak_allocated_share(record: RunRecord) -> float | None:
    capacity = _capacity(record)
    return record.memory.get("peak_allocated_bytes", 0) / capacity if capacity else None


@symptom("memory.peak_reserved_share", "share", "peak memory reserved by the caching allocator, of capacity")
def peak_reserved_share(record: RunRecord) -> float | None:
    capacity = _capacity(record)
    return record.memory.get("peak_reserved_bytes", 0) / capacity if capacity else None


@symptom("memory.oom", "bool", "the script ran out of GPU memory")
def oom(record: RunRecord) -> bool:
    return record.status == "oom"


@symptom("batch.size", "count", "samples per step, found from the data")
def batch_size(record: RunRecord) -> float | None:
    return record.batch_size()


@symptom(
    "batch.flag",
    "text",
    "the script's own option that sets its batch, where it counted the samples of steps no DataLoader fed",
)
def batch_flag(record: RunRecord) -> str | None:
    return record.samples_from or None


@symptom(
    "dataloader.batch_sampler",
    "bool",
    "the DataLoader that fed the profiled steps takes whole batches from a batch sampler (its batch_size unset)",
)
def batch_sampler(record: RunRecord) -> bool | None:
    # a batch_size knob cannot reach such a loader: DataLoader(batch_sampler=...) refuses a batch_size
    loader = record.train_loader()
    if loader is None or not loader.fetches_in_window:
        return None
    return loader.batch_size is None


def _script_batch_flag(record: RunRecord) -> str | None:
    """The script's own batch option where, times its accumulation, it holds the steps' samples."""
    option, batch = record.batch_option, record.batch_size()
    if option is None or not batch:
        return None
    try:
        samples = step_samples(option)
    except (KeyError, TypeError, ValueError):
        return None
    return str(option["flag"]) if samples == batch else None


@symptom(
    "batch.script_flag",
    "text",
    "the script's own option that sets its batch, where its value is the steps' batch (a DataLoader may have fed them)",
)
def script_batch_flag(record: RunRecord) -> str | None:
    return _script_batch_flag(record)


@symptom("batch.script_option", "bool", "the script has its own option that sets the steps' batch (batch.script_flag)")
def script_batch_option(record: RunRecord) -> bool | None:
    return True if _script_batch_flag(record) is not None else None


@symptom("batch.option", "bool", "the steps' samples were counted from the script's own batch option (no DataLoader)")
def batch_option(record: RunRecord) -> bool | None:
    # absent (not 0) where the DataLoaders or nothing counted them: the usual case says nothing
    return True if record.samples_from is not None else None


@symptom(
    "suggest.batch_size",
    "count",
    "a larger batch that fits the measured memory headroom (at most 8x the batch, 16 batches an epoch)",
    uses=("batch.size", "memory.peak_reserved_share", "dataloader.steps_per_epoch"),
)
def suggested_batch_size(known: Known) -> int | None:
    batch, reserved = known.get("batch.size"), known.get("memory.peak_reserved_share")
    if not batch or not reserved or reserved <= 0:
        return None
    return suggest_batch_size(int(batch), reserved, batch_factor_limit(known.get("dataloader.steps_per_epoch")))


def suggest_batch_size(batch: int, reserved_share: float, most: int | None = None) -> int:
    """The largest power-of-two multiple of the batch, at most ``most`` times it (default:
    ``batch_factor_limit()``), whose memory stays under the target share of the device, if all
    memory grew with the batch (it does not: weights and optimizer state stay, so this errs on
    the safe side)."""
    most = batch_factor_limit() if most is None else most
    factor = 1
    while reserved_share * factor * 2 <= BATCH_MEMORY_TARGET and factor * 2 <= most:
        factor *= 2
    return batch * factor
