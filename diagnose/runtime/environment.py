"""The machine and software a run used: device, driver, torch, Python, CPUs."""

from __future__ import annotations

import mmap
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

#: Bytes the loader-receive probe moves: large enough that page faults, not fixed costs, dominate
#: (8,192 pages of 4 KiB), small enough to cost tens of milliseconds once per run.
RECEIVE_PROBE_BYTES = 32 << 20


def cpu_count() -> int:
    """CPUs this process may use (the affinity mask, which containers and SLURM narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def physical_cores(cpus: set[int] | None = None, sysfs: str = "/sys/devices/system/cpu") -> int | None:
    """Physical cores among the CPUs this process may use: hyperthreads of one core count once
    (a CPU-bound DataLoader worker gains little from its core's second thread). None where the
    kernel does not say (no sysfs topology)."""
    if cpus is None:
        try:
            cpus = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return None
    cores = set()
    for cpu in cpus:
        try:
            base = f"{sysfs}/cpu{cpu}/topology"
            with open(f"{base}/core_id") as core, open(f"{base}/physical_package_id") as package:
                cores.add((package.read().strip(), core.read().strip()))
        except OSError:
            return None
    return len(cores) or None


def nvidia_driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out else None


def describe_environment() -> dict[str, Any]:
    """Versions and the device. Imports torch: call it from the runner, never from the analysis."""
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_count": cpu_count(),
        "cpu_cores": physical_cores(),
        "cpu_count_total": os.cpu_count(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": "cpu",
        "device_name": platform.processor() or platform.machine(),
        "gpu_count": 0,
    }
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        env.update(
            device="cuda",
            device_name=props.name,
            gpu_count=torch.cuda.device_count(),
            compute_capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            device_memory_bytes=int(props.total_memory),
            driver=nvidia_driver_version(),
        )
    return env


def describe_flags() -> dict[str, Any]:
    """The global switches that change which kernels run."""
    import torch

    return {
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "grad_enabled": torch.is_grad_enabled(),
    }


def describe_memory() -> dict[str, Any]:
    """Peak memory of the run so far against the device's capacity."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    free, total = torch.cuda.mem_get_info()
    return {
        "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        "capacity_bytes": int(total),
        "free_bytes_at_window_end": int(free),
    }


def describe_distributed() -> dict[str, Any]:
    """The process group, when the script made one: backend, rank, world size."""
    import torch

    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return {}
    return {
        "backend": str(dist.get_backend()),
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "cuda_available": torch.cuda.is_available(),
    }


def loader_receive_ms_per_mb(nbytes: int = RECEIVE_PROBE_BYTES) -> float | None:
    """What the main process spends per MB (1e6 bytes) on a batch that a DataLoader worker hands
    it through shared memory: map the worker's pages, read each one (a page fault per page: the
    mapping is new to this process), copy them into a pinned buffer as the loader's pin thread
    does (plain memory where the script did not start CUDA: the probe never starts it), then
    unmap and drop the last reference, which frees the pages. One thread, as the pin thread runs
    (numpy's copy, not torch's intra-op pool). The worker's side (writing the pages) is done
    before the clock starts. None off Linux (no memfd). Imports torch and numpy: call it from
    the runner, never from the analysis."""
    if not hasattr(os, "memfd_create"):
        return None
    import numpy as np
    import torch

    pinned = torch.cuda.is_available() and torch.cuda.is_initialized()  # never start CUDA for the probe
    target = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).numpy()
    fd = os.memfd_create("diagnose-receive-probe")
    try:
        os.ftruncate(fd, nbytes)
        with mmap.mmap(fd, nbytes) as written:  # the worker's mapping: its pages are written
            np.frombuffer(written, dtype=np.uint8)[:] = 1
        start = time.perf_counter()
        received = mmap.mmap(fd, nbytes)
        view = np.frombuffer(received, dtype=np.uint8)
        np.copyto(target, view)
        del view
        received.close()
        os.close(fd)
        fd = -1
        elapsed = time.perf_counter() - start
    finally:
        if fd >= 0:
            os.close(fd)
    return 1e3 * elapsed / (nbytes / 1e6)
