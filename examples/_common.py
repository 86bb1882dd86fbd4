"""Shared bits of the planted examples: the device, a plain step timer, the common flags.

Each example plants one bottleneck in an otherwise ordinary training loop. Run one plainly
(``python examples/data_bound.py``) and it prints its own throughput, measured with plain
timers over steps 16-35; run it under ``diagnose run`` and the report should name the planted
cause (docs/truth.md records what the GPU runs said).
"""

from __future__ import annotations

import argparse
import time

import torch


def parser(description: str, steps: int = 400) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps, help="training steps to run")
    p.add_argument("--small", action="store_true", help="tiny sizes, for a CPU smoke run")
    p.add_argument("--time-steps", default="16:36", help="the steps to time plainly, START:END")
    return p


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class PlainTimer:
    """Steps per second over a range of steps, with the GPU synchronised at both ends: the
    reference that ``diagnose``'s steady-state figure is compared with (benchmarks/)."""

    def __init__(self, spec: str, samples_per_step: int = 0) -> None:
        start, end = (int(x) for x in spec.split(":"))
        self.start, self.end, self.samples = start, end, samples_per_step
        self._t0 = 0.0

    def step(self, index: int) -> None:
        """Call at the top of every step with its index (0-based)."""
        if index not in (self.start, self.end):
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        now = time.perf_counter()
        if index == self.start:
            self._t0 = now
            return
        n = self.end - self.start
        rate = n / (now - self._t0)
        extra = f" · {rate * self.samples:.1f} samples/s" if self.samples else ""
        print(f"plain timer: steps {self.start}-{self.end - 1}: {rate:.3f} steps/s{extra}", flush=True)
