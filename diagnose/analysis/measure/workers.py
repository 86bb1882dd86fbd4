"""How many DataLoader workers can build batches at once on the CPUs a run recorded.

Contract: ``usable_cpus(cpus, cores)``, ``building_workers(workers, cpus)`` and
``per_batch_ms(...)``, ``wait_ratio(steady_wait)``: pure arithmetic, no torch. The symptoms (``workers.load``, the suggested worker count) and the prediction (the
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


#: a steady wait for data (measured: the share of the steady steps spent inside DataLoader
#: ``__next__``) from which on the loader is taken to set the steady pace
LOADER_PACED_WAIT = 0.1


#: no step is ever all loading or waiting: the estimates keep at least this share of the step for
#: its own work (the wait's ratio here, the suggested worker count in the symptoms)
MIN_REST_SHARE = 0.05


def wait_ratio(steady_wait: float | None) -> float | None:
    """The steady step over its own work, ``1 / (1 - w)``, where its measured data wait ``w`` says
    the loader set the pace (at least ``LOADER_PACED_WAIT``), else None: what removing the wait
    gains, and how far the workers fall behind the step (``workers.load``)."""
    if steady_wait is None or steady_wait < LOADER_PACED_WAIT:
        return None
    return 1 / max(1 - steady_wait, MIN_REST_SHARE)


def per_batch_ms(
    cpu_ms: float | None,
    workers: float | None,
    cpus: float | None,
    steady_mean_ms: float | None,
    steady_wait: float | None,
) -> float | None:
    """What a worker takes to build a batch, as far as the run tells: a loader that sets the pace
    makes the mean steady step its interval (the time per batch over the workers that build at
    once). Where the steady steps waited for data (``steady_wait``, measured, at least
    ``LOADER_PACED_WAIT``) that is the time per batch, whatever the CPU time says (a worker that
    sleeps or waits on I/O spends little CPU); elsewhere the workers' CPU time per batch
    (``cpu_ms``), at most what the steady steps allow (a longer interval, a worker's CPU time
    counting threads that decode side by side, is not the loader's). None where neither says."""
    if workers and steady_mean_ms and steady_wait is not None and steady_wait >= LOADER_PACED_WAIT:
        return steady_mean_ms * building_workers(workers, cpus)
    if cpu_ms and workers and steady_mean_ms:
        return min(cpu_ms, steady_mean_ms * building_workers(workers, cpus))
    return cpu_ms
