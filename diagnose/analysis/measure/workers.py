"""How many DataLoader workers can build batches at once on the CPUs a run recorded.

Contract: ``usable_cpus(cpus, cores)`` and ``building_workers(workers, cpus)``: pure arithmetic,
no torch. The symptoms (``workers.load``, the suggested worker count) and the prediction (the
loader's ceiling, more workers) both read it, from their own mappings of the run's facts: they
sit side by side in one layer and never import each other (tests/test_layout.py).
"""

from __future__ import annotations


def usable_cpus(cpus: float | None, cores: float | None) -> float | None:
    """The CPUs DataLoader workers can use: the physical cores among them where the run recorded
    them (``lscpu``'s "Thread(s) per core: 2"): a CPU-bound worker (decoding, augmenting) on a
    core's second hyperthread shares that core's execution units with the first and adds a
    fraction of a worker, not one. Where every CPU is its own core this is the CPU count."""
    if cores:
        return min(cpus, cores) if cpus else cores
    return cpus


def building_workers(workers: float, cpus: float | None) -> float:
    """How many of ``workers`` build batches at once on ``cpus`` usable CPUs (``usable_cpus``):
    one CPU is the main process's."""
    return min(workers, cpus - 1) if cpus and cpus > 1 else workers
