"""benchmarks/_bench.py's CPU pinning: the kernel's cpulist read right, and nothing pinned
where no GPU says which cores are its own (this CPU-only machine)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from _bench import gpu_local_cpus, parse_cpulist, pin_cpus


def test_cpulists_read_as_the_kernel_writes_them() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("5") == [5]
    assert parse_cpulist("") == []


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_auto_pins_nothing_without_a_gpu_and_none_leaves_the_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")  # no nvidia-smi to ask
    before = os.sched_getaffinity(0)
    assert gpu_local_cpus(4) is None
    assert pin_cpus("auto") is None and pin_cpus("none") is None
    assert os.sched_getaffinity(0) == before
