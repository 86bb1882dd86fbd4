"""What diagnose itself costs per step while it times the steady state (profiler off).

    python benchmarks/hook_cost.py                 # CPU is enough: the hooks are Python
    python benchmarks/hook_cost.py --rounds 20 --block 3000
    python benchmarks/hook_cost.py --whole --device cuda --width 256 --depth 16   # diagnose watch's, on a GPU

After the profiled window, the only code of diagnose's that runs in the training process is its
step detection: the global optimizer step hook, the wrapped DataLoader ``__iter__``/``__next__``,
the step clock and the capture session's bookkeeping at each boundary (and, with line
attribution, a sampling thread in each DataLoader *worker*, not measured here). This benchmark
runs the cheapest possible training step (a DataLoader over a list, an 8x8 linear layer, SGD:
tens of microseconds, so the hooks weigh as much as they ever can) in one process, with
diagnose's instrumentation installed and removed in alternating blocks (ABAB: a drift of the
machine hits both alike), the capture session past its window as during the timed steps. It
prints the microseconds per step that the instrumentation adds, and what that is as a share of
the planted examples' steps on an H200 (docs/truth.md), the bound on diagnose's profiling
overhead that no noise between processes can blur.

``--modes hook,held`` measures each listed mode against the same blocks without (``hook``: run's
instrumentation alone; ``held``/``released``: watch's too, see below), the modes' order rotating
each round; ``--skip N`` leaves each block's first N steps untimed (a fresh ``WholeRun`` a block
pays its first sample and NVML's start there, which a real run pays once). ``--whole`` adds
what ``diagnose watch`` runs between its windows (``runtime/whole.WholeRun``: its per-step hook, its patches, and its sampler thread, which wakes twice a second to read memory,
NVML and ``/proc``), a fresh one each block. ``--sampler-reads both`` runs two of it each round, its
sampler reading ``/proc`` with the GIL held (``procfs.ProcReader``, what watch does) and through
``os.open`` (which hands the GIL over at every system call): each against the blocks without. ``--device cuda`` with ``--width``/``--depth`` makes the
step a launch-bound GPU step (a stack of small linear layers: every kernel shorter than its
launch), so that the sampler's GPU queries and the GIL it takes weigh against real launches.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from diagnose.progress import Progress
from diagnose.record import WindowPlan
from diagnose.rundir import RunDir
from diagnose.runtime.capture import CaptureSession
from diagnose.runtime.instrument import Instrumentation, StepClock
from diagnose.runtime.procfs import ProcReader
from diagnose.runtime.whole import WatchBudget, WholeRun

#: median step of each planted example on an H200 (docs/truth.md, steady state), in ms
EXAMPLE_STEP_MS = {
    "item_syncs": 4.0,
    "launch_bound": 17.0,
    "well_tuned": 20.1,
    "pageable_copies": 28.0,
    "cpu_preprocessing": 156.0,
    "fp32_transformer": 124.6,
    "forloop_optimizer": 118.0,
    "data_bound": 190.0,
}


class _NoWindow:
    """The capture session's window listener, with nothing to start or stop."""

    def window_opened(self) -> None:
        pass

    def window_closing(self) -> None:
        pass

    def window_closed(self) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10, help="pairs of blocks (with, without)")
    p.add_argument("--block", type=int, default=2000, help="steps per block")
    p.add_argument("--whole", action="store_true", help="diagnose watch's runner hook too (hook and sampler thread)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: the model and batches there")
    p.add_argument(
        "--sampler-reads",
        choices=("held", "released", "both"),
        default="held",
        help="--whole: the sampler's /proc reads with the GIL held (watch's), through os.open, or both in each round",
    )
    p.add_argument(
        "--modes",
        default=None,
        help="comma list, each against the blocks without: hook (run's instrumentation alone), held and "
        "released (watch's, its /proc reads so); default: hook, or with --whole the --sampler-reads",
    )
    p.add_argument(
        "--skip",
        type=int,
        default=0,
        help="steps of each block left untimed (a fresh WholeRun's first sample and NVML start are once a run)",
    )
    p.add_argument("--width", type=int, default=8, help="the linear layers' width")
    p.add_argument("--depth", type=int, default=1, help="linear layers (more: more launches a step)")
    args = p.parse_args()
    if args.modes:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        if not modes or set(modes) - {"hook", "held", "released"} or len(set(modes)) != len(modes):
            p.error(f"--modes: each of hook, held, released at most once (got {args.modes!r})")
    elif not args.whole:
        modes = ["hook"]
    else:
        modes = ["held", "released"] if args.sampler_reads == "both" else [args.sampler_reads]
    if not 0 <= args.skip < args.block:
        p.error("--skip: fewer steps than a block")
    torch.set_num_threads(1)
    device = torch.device(args.device)
    layers = [torch.nn.Linear(args.width, args.width) for _ in range(args.depth)]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [torch.randn(args.width) for _ in range(args.block)]

    with tempfile.TemporaryDirectory() as run_dir:
        # warm-up 1, profile 1 (a real trace is written), then "timed" for as long as this runs
        plan = WindowPlan(warmup=1, steps=1, timed=10**9, stop=False)
        session = CaptureSession(plan, RunDir(Path(run_dir)), Progress(enabled=False), window=_NoWindow())
        # watch's hook: a fresh one a block (its sampler thread starts at its first boundary and
        # stops at remove), no later windows; the boundary reaches it after the session's (the
        # clock is built with this callback: it keeps the one it is given)
        whole: list[WholeRun] = []

        def on_boundary(now: float) -> None:
            session.on_boundary(now)
            if whole:
                whole[0].on_step(now)

        clock = StepClock(on_boundary=on_boundary, on_reset=session.on_reset)
        instrumentation = Instrumentation(clock)
        run = SimpleNamespace(clock=clock, t0=time.perf_counter(), session=session)

        def install(reads: str = "held") -> None:
            instrumentation.install()
            if reads != "hook":
                # no later windows: what runs between them is what is measured
                hook = WholeRun(RunDir(Path(run_dir)), budget=WatchBudget(period_s=0.0, max_windows=0))
                if reads == "released":
                    hook._delays.reader = ProcReader(hold_gil=False)  # RSS and run-queue waits alike
                hook.attach(run)
                hook.install()
                whole.append(hook)

        def remove() -> None:
            instrumentation.remove()
            while whole:
                whole.pop().remove()

        def block() -> float:
            loader = torch.utils.data.DataLoader(data, batch_size=1)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i, x in enumerate(loader):
                if i == args.skip and i:
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                loss = model(x.to(device, non_blocking=True)).sum()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            return (time.perf_counter() - t0) / (len(data) - args.skip) * 1e6

        install("hook")
        block()  # through the window: the profiler starts, records a step, exports, stops
        assert session.window_closed, "the capture session should be past its window"
        remove()
        block()
        with_us: dict[str, list[float]] = {mode: [] for mode in modes}
        without_us: list[float] = []
        for i in range(args.rounds):
            # each round: every mode once, then the block without; the modes' order rotates
            for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:
                install(mode)
                with_us[mode].append(block())
                remove()
            without_us.append(block())
        session.finish()
    print(
        f"step without diagnose: {statistics.median(without_us):.1f} us (median of {args.rounds} blocks of {args.block})"
    )
    added_us = {mode: [w - o for w, o in zip(with_us[mode], without_us, strict=True)] for mode in modes}
    for mode, added in added_us.items():
        share = [a / o for a, o in zip(added, without_us, strict=True)]
        what = (
            "diagnose's hooks"
            if mode == "hook"
            else f"diagnose watch's hooks and sampler, /proc read with the GIL {mode}"
        )
        print(f"step with {what}, past the window: {statistics.median(with_us[mode]):.1f} us ({device})")
        error = statistics.stdev(share) / len(share) ** 0.5 if len(share) > 1 else float("nan")
        print(
            f"  added per step: {statistics.median(added):.2f} us (median of paired blocks; range {min(added):.2f} to "
            f"{max(added):.2f}); {statistics.median(share):+.2%} of this step (range {min(share):+.2%} .. {max(share):+.2%}; "
            f"mean {statistics.mean(share):+.2%} +- {error:.2%}, its standard error)"
        )
    cost = statistics.median(added_us[modes[0]])
    print(f"as a share of each planted example's step on an H200 ({modes[0]}):")
    for name, ms in sorted(EXAMPLE_STEP_MS.items(), key=lambda kv: kv[1]):
        print(f"  {name:<18} {ms:7.1f} ms  {cost / (ms * 1000) * 100:.4f}%")


if __name__ == "__main__":
    main()
