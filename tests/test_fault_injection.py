"""Faults of issue 38, tried as an attacker would: a crash, a fork, an exec, a full disk, a
file-size limit, a memory limit, signals at each stage, concurrent runs and read-only places.
Each end-to-end case runs ``diagnose`` in a child bounded in time, then checks that no process
of the run is left and no temporary file remains (``leftovers``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

# --- 12. the handlers an in-process run installs are all put back ----------------------------------


def test_an_in_process_run_puts_back_sig_dfl_for_sigterm(tmp_path: Path) -> None:
    """``SignalHold`` took SIG_DFL (0, falsy) for "no handler" and kept diagnose's own SIGTERM
    handler installed: children forked later ignored SIGTERM (the suite hung 8 minutes)."""
    from diagnose.signals import SignalHold

    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        def ours(signum: int, frame: object) -> None:
            raise AssertionError("diagnose's handler")

        signal.signal(signal.SIGTERM, ours)  # the runner's own, temporary
        hold = SignalHold()
        hold.hold({"SIGTERM": signal.SIG_DFL})
        hold.release()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
