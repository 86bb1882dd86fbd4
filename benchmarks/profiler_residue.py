"""What one torch.profiler window leaves behind: a launch-bound step timed before and after it.

    python benchmarks/profiler_residue.py                      # the device torch sees
    python benchmarks/profiler_residue.py --repeats 5 --steps 400

diagnose watch's cost on a host-bound load (docs/watch.md) is mostly not its per-step hook but
what its main profiled window leaves in the process: on an H100 a plain loop with one window ran
its later steps 25-34% slower, and watch, which tears CUPTI down after its window
(``TEARDOWN_CUPTI=1``), 6% slower than without a window. This benchmark takes that residue apart.
Each variant runs in a fresh process: a small MLP's training step (launch-bound on a GPU) is
timed (best of blocks), then a profiler session of ``--window`` steps runs with the variant's
settings, then the step is timed again; the variant's residue is after over before, per step.

Variants: ``none`` (no session: the noise), ``cpu`` (CPU activity alone; ``cpu-teardown`` with
``TEARDOWN_CUPTI=1``), ``cuda`` (CPU and CUDA activities, CUPTI left attached:
``TEARDOWN_CUPTI=0``), ``cuda-teardown`` (CUPTI torn down, as diagnose does; ``cuda-export``
with the trace exported, as diagnose does; ``cuda-stack`` with shapes, stacks and memory), and
two of diagnose's other doings around its window without a profiler: ``sync-debug`` (CUDA's
sync debug mode "warn" over the window's steps, then off) and ``dispatch-mode`` (a
TorchDispatchMode over one step, as the FLOP count). Each reports the step's wall time and the
training thread's CPU time. On the CPU the GPU-only variants are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from _bench import pin_cpus

VARIANTS: dict[str, dict[str, str | bool]] = {
    "none": {},
    "cpu": {"cuda": False},
    "cpu-teardown": {"cuda": False, "teardown": "1"},
    "cuda": {"cuda": True, "teardown": "0"},
    "cuda-teardown": {"cuda": True, "teardown": "1"},
    "cuda-export": {"cuda": True, "teardown": "1", "export": True},
    "cuda-stack": {"cuda": True, "teardown": "1", "detail": True},
    # what diagnose does around its window besides the profiler: CUDA's sync debug mode "warn"
    # over the window (line attribution's sync sites), a TorchDispatchMode over one step (the
    # FLOP count)
    "sync-debug": {"sync_debug": True},
    "dispatch-mode": {"dispatch": True},
}


def child(variant: str, steps: int, window: int, blocks: int) -> dict[str, float]:
    """One process: the step's time (wall and this thread's CPU) before and after ``variant``."""
    spec = VARIANTS[variant]
    if "teardown" in spec:
        os.environ["TEARDOWN_CUPTI"] = str(spec["teardown"])
    import tempfile
    import time

    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(16)]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 64, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()

    def timed() -> tuple[float, float]:
        best, best_cpu = float("inf"), float("inf")
        for _ in range(blocks):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t, c = time.perf_counter(), time.thread_time()
            for _ in range(steps):
                step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best, best_cpu = min(best, time.perf_counter() - t), min(best_cpu, time.thread_time() - c)
        return best / steps * 1e6, best_cpu / steps * 1e6

    for _ in range(50):
        step()
    before, before_cpu = timed()
    if "cuda" in spec:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if spec.get("cuda") else [])
        detail = bool(spec.get("detail"))
        prof = profile(activities=activities, record_shapes=detail, with_stack=detail, profile_memory=detail)
        prof.start()
        for _ in range(window):
            step()
        prof.stop()
        if spec.get("export"):
            with tempfile.TemporaryDirectory() as folder:
                prof.export_chrome_trace(os.path.join(folder, "trace.json"))
        del prof
    elif spec.get("sync_debug") and device.type == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
        for _ in range(window):
            step()
        torch.cuda.set_sync_debug_mode(0)
    elif spec.get("dispatch"):
        from torch.utils._python_dispatch import TorchDispatchMode

        class Counting(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                return func(*args, **(kwargs or {}))

        with Counting():
            step()
    after, after_cpu = timed()
    return {"before_us": before, "after_us": after, "before_cpu_us": before_cpu, "after_cpu_us": after_cpu}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="processes per variant")
    p.add_argument("--steps", type=int, default=300, help="steps per timed block")
    p.add_argument("--blocks", type=int, default=5, help="timed blocks before and after (the best counts)")
    p.add_argument("--window", type=int, default=30, help="steps the profiler session records")
    p.add_argument(
        "--cpus", default="auto", help="pin to these CPUs: auto (4 on the GPU's NUMA node), none, or a cpulist"
    )
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), help="these variants only (default: all)")
    p.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.window, args.blocks)))
        return
    pinned = pin_cpus(args.cpus)
    import torch

    gpu_only = ("cuda", "teardown", "sync_debug")
    variants = [
        v
        for v in (args.variants or list(VARIANTS))
        if torch.cuda.is_available() or not any(VARIANTS[v].get(k) for k in gpu_only)
    ]
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(
        f"profiler residue on {where}, torch {torch.__version__}: {args.repeats} process(es) a variant, CPUs {pinned or 'not pinned'}"
    )
    results: dict[str, list[float]] = {v: [] for v in variants}
    results_cpu: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for variant in variants:  # interleaved: a drift of the machine hits every variant alike
            command = [sys.executable, __file__, "--child", variant, "--steps", str(args.steps)]
            command += ["--blocks", str(args.blocks), "--window", str(args.window)]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            results[variant].append(row["after_us"] / row["before_us"] - 1)
            results_cpu[variant].append(row["after_cpu_us"] / row["before_cpu_us"] - 1)
            print(
                f"  {variant}: {row['before_us']:.1f} -> {row['after_us']:.1f} us/step, "
                f"thread CPU {row['before_cpu_us']:.1f} -> {row['after_cpu_us']:.1f} us/step",
                flush=True,
            )
    print("residue per step after the session (median, range), wall and the thread's CPU:")
    for variant, values in results.items():
        cpu = results_cpu[variant]
        print(
            f"  {variant:14s} {statistics.median(values):+.2%} ({min(values):+.2%} .. {max(values):+.2%})"
            f"   CPU {statistics.median(cpu):+.2%} ({min(cpu):+.2%} .. {max(cpu):+.2%})"
        )


if __name__ == "__main__":
    main()
