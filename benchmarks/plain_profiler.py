"""Record a trace the way a user's own code would: a plain ``torch.profiler`` schedule, one
profiler step per optimizer step, no diagnose anywhere in the process.

    python benchmarks/plain_profiler.py OUT_DIR examples/data_bound.py [ARGS...]

This is what ``diagnose analyze my_trace.json`` meets in the wild: a trace with no run record
(no DataLoader settings, no CPU count, no steady-state timing). The script runs unmodified
(runpy, as ``python script.py``); the optimizer step post hook stands in for the line a user
adds after ``opt.step()``, and the process exits once the trace is written. Recorded on the
GPU for every planted example, these traces are the fixtures of tests/test_bare_traces.py.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path


class _Done(BaseException):
    """Raised from the hook once the trace is written: ends the user's loop like Ctrl-C would."""


def main() -> None:
    out, script, *args = sys.argv[1:]
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    wait, warmup, active = int(os.environ.get("PLAIN_WAIT", "4")), 1, int(os.environ.get("PLAIN_ACTIVE", "5"))

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    written: list[str] = []

    def on_ready(prof: profile) -> None:
        path = out_dir / f"{Path(script).stem}.pt.trace.json"
        prof.export_chrome_trace(str(path))
        written.append(str(path))

    prof = profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=on_ready,
    )
    steps = {"n": 0}

    def after_step(optimizer: torch.optim.Optimizer, *_: object) -> None:
        prof.step()
        steps["n"] += 1
        if written:
            raise _Done

    prof.start()
    register_optimizer_step_post_hook(after_step)
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
    except _Done:
        pass
    finally:
        if not written:
            prof.stop()
    print(f"plain profiler: {steps['n']} optimizer steps, trace {written[-1] if written else 'none'}", flush=True)
    os._exit(0)  # DataLoader workers and the script's own threads must not keep the process alive


if __name__ == "__main__":
    main()
