"""procfs: /proc read with the GIL held, the same bytes as os.open."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from diagnose.runtime.procfs import ProcReader, RunDelays, host_rss_bytes

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and libc through ctypes")


@linux_only
def test_both_readers_give_the_files_bytes_and_none_for_a_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "schedstat"
    f.write_bytes(b"123 456 7\n")
    held, released = ProcReader(), ProcReader(hold_gil=False)
    assert held.holds_gil and not released.holds_gil
    for reader in (held, released):
        assert reader.read(str(f)) == b"123 456 7\n"
        assert reader.read(str(tmp_path / "absent")) is None
    statm = held.read("/proc/self/statm")
    assert statm is not None and len(statm.split()) >= 2
    rss = host_rss_bytes(held)
    assert rss is not None and rss > 0


@linux_only
def test_the_held_reader_never_lets_another_thread_run_and_the_os_path_does(tmp_path: Path) -> None:
    """A spinning thread gets the GIL only where the reader releases it: the switch interval is
    set far longer than the reads take, so a forced switch cannot happen meanwhile."""
    f = tmp_path / "schedstat"
    f.write_bytes(b"1 2 3\n")
    spins = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            spins[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.5)
    spinner = threading.Thread(target=spin, daemon=True)
    try:
        spinner.start()
        while spins[0] == 0:
            pass  # this thread has the GIL back once the spinner has run
        held = ProcReader()
        before = spins[0]
        for _ in range(50):
            held.read(str(f))
        assert spins[0] == before  # no hand-off in 150 system calls
        # os.open releases it: the spinner takes it where it wins the race for it (a lost race
        # costs microseconds, a won one this thread's wait for the next forced switch)
        released, before = ProcReader(hold_gil=False), spins[0]
        for _ in range(1000):
            released.read(str(f))
            if spins[0] != before:
                break
        assert spins[0] > before
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        spinner.join(timeout=5)


def test_run_delays_read_through_either_reader_alike(tmp_path: Path) -> None:
    for tid, ns in (("1", 1_000_000_000), ("2", 500_000_000)):
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "schedstat").write_text(f"9 {ns} 1\n")
    readers = [ProcReader(hold_gil=False)] + ([ProcReader()] if sys.platform.startswith("linux") else [])
    for reader in readers:
        delays = RunDelays(str(tmp_path), reader)
        assert delays.read() == 0.0
        assert delays.waited(1) == pytest.approx(1.0) and delays.waited(2) == pytest.approx(0.5)
    os.remove(tmp_path / "2" / "schedstat")
    os.rmdir(tmp_path / "2")
    (tmp_path / "1" / "schedstat").write_text("9 1250000000 1\n")
    assert delays.read() == pytest.approx(0.25)
