"""Shared bits of the planted examples: the device, a plain step timer, the common flags.

Each example plants one bottleneck in an otherwise ordinary training loop. Run one plainly
(``python examples/data_bound.py``) and it prints its own throughput, measured with plain
timers over steps 16-35; run it under ``diagnose run`` and the report should name the planted
cause (docs/truth.md records what the GPU runs said).
"""

from __future__ import annotations

import argparse
import resource
import time

import torch


def parser(description: str, steps: int = 400) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps, help="training steps to run")
    p.add_argument("--small", action="store_true", help="tiny sizes, for a CPU smoke run")
    p.add_argument("--time-steps", default="16:36", help="the steps to time plainly, START:END[,START:END...]")
    return p


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def init_distributed() -> torch.device:
    """The process group of a torchrun rank (nccl on GPUs, gloo on the CPU, one thread a rank
    there) and the rank's device."""
    import os

    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    if not cuda:
        torch.set_num_threads(1)
        return torch.device("cpu")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cuda", torch.cuda.current_device())


class PlainTimer:
    """Steps per second over ranges of steps, with the GPU synchronised at both ends: the
    reference that ``diagnose``'s steady-state figure is compared with (benchmarks/). Several
    ranges (``"100:300,311:611"``) time the same process before and after diagnose's window."""

    def __init__(self, spec: str, samples_per_step: int = 0) -> None:
        self.windows = [tuple(int(x) for x in part.split(":")) for part in spec.split(",")]
        self.samples = samples_per_step
        self._t0: dict[int, float] = {}
        self._cpu0: dict[int, float] = {}  # the main thread's CPU time: less moved by other processes
        self._process0: dict[int, float] = {}  # every thread's CPU time (the process's)
        self._switches0: dict[int, tuple[int, int]] = {}  # the main thread's context switches

    def step(self, index: int) -> None:
        """Call at the top of every step with its index (0-based)."""
        starts = [w for w in self.windows if w[0] == index]
        ends = [w for w in self.windows if w[1] == index]
        if not starts and not ends:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        now, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        switches = (usage.ru_nvcsw, usage.ru_nivcsw)
        for start, end in ends:
            n = end - start
            rate = n / (now - self._t0[start])
            extra = f" · {rate * self.samples:.1f} samples/s" if self.samples else ""
            cpu_ms = (cpu - self._cpu0[start]) / n * 1000
            process_ms = (process - self._process0[start]) / n * 1000
            waits, preempted = (now_ - was for now_, was in zip(switches, self._switches0[start], strict=True))
            print(
                f"plain timer: steps {start}-{end - 1}: {rate:.3f} steps/s{extra} · main thread cpu {cpu_ms:.4f} ms/step"
                f" · process cpu {process_ms:.4f} ms/step · main thread switches {waits / n:.2f} waits"
                f" {preempted / n:.2f} preempted a step",
                flush=True,
            )
        for start, _ in starts:
            self._t0[start] = now
            self._cpu0[start] = cpu
            self._process0[start] = process
            self._switches0[start] = switches
