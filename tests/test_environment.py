"""The loader-receive probe: what a batch handed over through shared memory costs the main process."""

from __future__ import annotations

import os

import pytest

from diagnose.runtime import environment
from diagnose.runtime.environment import loader_receive_ms_per_mb


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd is Linux-only")
def test_the_probe_measures_a_cost_per_mb_and_leaves_no_descriptor_open() -> None:
    before = len(os.listdir("/proc/self/fd"))
    small, large = loader_receive_ms_per_mb(1 << 20), loader_receive_ms_per_mb(16 << 20)
    assert len(os.listdir("/proc/self/fd")) == before
    # a copy of one MB costs at least ~10 µs (100 GB/s) and, faulting every page, well under 100 ms
    for value in (small, large):
        assert value is not None and 0.01 < value < 100


def test_the_probe_says_nothing_without_memfd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(environment.os, "memfd_create", raising=False)
    assert loader_receive_ms_per_mb() is None
