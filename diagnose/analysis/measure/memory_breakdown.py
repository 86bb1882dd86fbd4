"""GPU memory by owner, the headroom as a batch size, and why a script ran out of memory.

Contract: ``memory_breakdown(split) -> MemoryBreakdown`` turns the runner's ``MemorySplit``
(``runtime/memory_probe.py``) into parameters, gradients, optimizer state, activations and the rest;
``largest_batch(breakdown) -> int | None`` estimates the batch that fits; ``batch_factor_limit``
is the most a suggested batch grows the run's, whatever fits; ``explain_oom(split)``
says what filled the memory and what to change. Pure, no torch.

Activations are not measured directly: they are what the step allocated above the memory it
started with (the allocator's peak over the step minus the allocated bytes at its start),
less the gradients the step created (with ``zero_grad(set_to_none=True)`` they are freed
between steps and made again in backward). That is the activations saved for backward plus the
step's temporaries, and the figure the batch size scales.

The largest batch is an estimate: activation memory is assumed proportional to the batch (true
for the usual layers; attention scratch grows with sequence length, not batch), with a margin
for the allocator's fragmentation. ``diagnose sweep --set arg.batch_size=...`` finds the real
one: points run in the order given and, once a value runs out of memory, larger values of the
same knob are skipped (experiments.py), and the sweep says the largest that fits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diagnose.record import MemorySplit

#: keep this share of the device free when estimating what fits (fragmentation, cuDNN
#: workspaces, the CUDA context's own memory that torch does not count)
SAFETY_MARGIN = 0.10
#: A suggested batch is at most this multiple of the run's. Memory on a 80-141 GB GPU holds 64x
#: the batch of a small model, and the outside corpus (docs/zoo.md) showed what such a jump
#: does: the replay extrapolates kernel times 64x (predicted 12x where 32x was measured on one
#: script, 37x where 10x was on another), the data pipeline that kept up at the old batch does
#: not at the new one, and linear learning-rate scaling is trusted over a few doublings, not six.
#: Three doublings at a time: verify measures them, and the next run suggests the next three.
MAX_BATCH_FACTOR = 8
#: A suggested batch leaves at least this many batches in an epoch: a batch near the data set's
#: size makes every step an epoch start (workers restarted, the last partial batch) or, with
#: ``drop_last``, no batch at all (a timm script crashed on an empty loader at 4096 of 2560).
MIN_STEPS_PER_EPOCH = 16

GB = 1e9


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes by owner at the step's peak; ``other`` is the rest of what tensors held (the batch,
    buffers, anything the script keeps between steps); ``cache`` is reserved but unallocated."""

    when: str
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    other: int
    cache: int
    peak_allocated: int
    peak_reserved: int
    capacity: int
    samples: int | None

    @property
    def persistent(self) -> int:
        """What stays between steps whatever the batch: weights, gradients, optimizer state, other."""
        return self.parameters + self.gradients + self.optimizer_state + self.other

    @property
    def activations_per_sample(self) -> float | None:
        return self.activations / self.samples if self.samples and self.activations > 0 else None

    @property
    def headroom(self) -> int:
        """Bytes the device has beyond the step's peak reservation."""
        return max(0, self.capacity - self.peak_reserved)

    def parts(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer state": self.optimizer_state,
            "activations": self.activations,
            "other tensors": self.other,
            "allocator cache": self.cache,
        }


def memory_breakdown(split: MemorySplit) -> MemoryBreakdown:
    # gradients at their largest during the step: made in backward, or kept from the last step
    gradients = max(split.gradients_bytes, split.gradients_start_bytes)
    owners = split.parameters_bytes + gradients + split.optimizer_state_bytes
    if split.when == "oom":
        # at the error, what tensors held beyond the owners is activations of the failing step
        # (and the batch): the split cannot tell them apart, so it calls them activations
        activations = max(0, split.allocated_end_bytes - owners)
        other = 0
    else:
        grads_made = max(0, split.gradients_bytes - split.gradients_start_bytes)
        activations = max(0, split.peak_allocated_bytes - split.allocated_start_bytes - grads_made)
        other = max(0, split.peak_allocated_bytes - activations - owners)
    cache = max(0, split.peak_reserved_bytes - split.peak_allocated_bytes)
    return MemoryBreakdown(
        when=split.when,
        parameters=split.parameters_bytes,
        gradients=gradients,
        optimizer_state=split.optimizer_state_bytes,
        activations=activations,
        other=other,
        cache=cache,
        peak_allocated=split.peak_allocated_bytes,
        peak_reserved=split.peak_reserved_bytes,
        capacity=split.capacity_bytes,
        samples=split.samples,
    )


def largest_batch(m: MemoryBreakdown, margin: float = SAFETY_MARGIN) -> int | None:
    """The batch whose activations fit beside what persists, with ``margin`` of the device
    kept free (an estimate; see the module docstring). None when activations were not seen."""
    per_sample = m.activations_per_sample
    if per_sample is None or m.capacity <= 0:
        return None
    usable = m.capacity * (1 - margin) - m.persistent
    if usable <= 0:
        return 0
    return int(usable // per_sample)


def batch_factor_limit(steps_per_epoch: float | None = None) -> int:
    """The most times the run's batch a suggestion grows it: ``MAX_BATCH_FACTOR``, and no more
    than leaves ``MIN_STEPS_PER_EPOCH`` batches in an epoch where the epoch's length is known
    (1: no larger batch to suggest)."""
    limit = MAX_BATCH_FACTOR
    if steps_per_epoch:
        limit = min(limit, max(1, int(steps_per_epoch // MIN_STEPS_PER_EPOCH)))
    return limit


_OOM_REQUEST = re.compile(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB|B)")
_UNITS = {"GiB": 1024**3, "MiB": 1024**2, "KiB": 1024, "B": 1}


def requested_bytes(message: str | None) -> int | None:
    """The allocation that failed, from torch's message ("Tried to allocate 2.00 GiB ...")."""
    match = _OOM_REQUEST.search(message or "")
    return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else None


@dataclass(frozen=True)
class OomExplanation:
    #: the largest owner of memory at the error, and its bytes
    largest: str
    largest_bytes: int
    parts: dict[str, int]
    requested: int | None
    capacity: int
    changes: list[str]


def explain_oom(split: MemorySplit, mixed_precision: bool = False) -> OomExplanation:
    """What filled the memory when the script ran out, and the changes that free the most of it,
    largest first."""
    m = memory_breakdown(split)
    parts = {k: v for k, v in m.parts().items() if k != "allocator cache"}
    largest = max(parts, key=lambda k: parts[k])
    changes: list[tuple[int, str]] = []
    if m.activations:
        changes.append(
            (m.activations, "a smaller batch (activations scale with it), or gradient accumulation over micro-batches")
        )
        changes.append(
            (
                m.activations // 2,
                "activation checkpointing: torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
            )
        )
        if not mixed_precision:
            changes.append(
                (
                    m.activations // 2,
                    'bf16 autocast: with torch.autocast("cuda", dtype=torch.bfloat16) halves activations',
                )
            )
    if m.gradients:
        changes.append(
            (
                m.gradients,
                "optimizer.zero_grad(set_to_none=True) frees gradients between steps (the default since torch 2.0)",
            )
        )
    if m.optimizer_state:
        changes.append(
            (
                m.optimizer_state,
                "smaller optimizer state: SGD with momentum keeps one copy of the weights, Adam two"
                " (or shard it: ZeroRedundancyOptimizer, FSDP)",
            )
        )
    if m.cache:
        changes.append((m.cache, "fragmentation: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"))
    changes.sort(key=lambda c: -c[0])
    return OomExplanation(
        largest, parts[largest], parts, requested_bytes(split.message), m.capacity, [c for _, c in changes]
    )
