"""benchmarks/_bench.py's /proc readers, which thread_cpu.py, trace_memory.py and
loader_limits.py share: a process's name and CPU time, and the processes below it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from _bench import descendants, proc_stat

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="no /proc here")


def test_a_process_stat_gives_its_name_and_the_cpu_it_spent() -> None:
    start = time.process_time()
    while time.process_time() - start < 0.05:  # spend some CPU, so that the ticks move
        pass
    name, cpu = proc_stat(f"/proc/{os.getpid()}/stat")
    assert name and cpu >= 0.02
    with pytest.raises(OSError):
        proc_stat("/proc/0/stat")


def test_descendants_are_the_process_and_every_one_below_it() -> None:
    shell = subprocess.Popen(["sh", "-c", "sleep 5 & sleep 5 & wait"])
    try:
        for _ in range(100):  # the shell starts its two children
            found = descendants(shell.pid)
            if len(found) == 3:
                break
            time.sleep(0.02)
        assert found[0] == shell.pid and len(found) == 3
        assert all(proc_stat(f"/proc/{p}/stat")[0] == "sleep" for p in found[1:])
    finally:
        for p in reversed(descendants(shell.pid)):
            os.kill(p, 9)
        shell.wait()
    assert descendants(shell.pid) == [shell.pid]  # gone: itself, nothing below
