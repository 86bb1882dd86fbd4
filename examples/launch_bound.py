"""Planted: a deep, narrow model at a small batch: the GPU idles between tiny kernels.

Sixty-four small blocks at batch 32: every kernel runs for a few microseconds, less than it
takes Python and the CUDA driver to launch it, so the GPU waits on the host.
Expected diagnosis: LAUNCH001 (torch.compile / CUDA graphs, or a larger batch).
"""

from __future__ import annotations

import torch
from torch import nn

from _common import PlainTimer, device, parser


def block(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU())


def export(prof: torch.profiler.profile, folder: str) -> None:
    """The window's trace written as diagnose writes its own: Kineto's JSON, gzipped at level 6
    in 16 MB pieces, in the training process (then removed: only what doing it leaves matters)."""
    import gzip
    import os
    import shutil

    raw = os.path.join(folder, f"window-{os.getpid()}.json")
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 16 * 1024 * 1024)
    os.unlink(raw)
    os.unlink(raw + ".gz")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--profile-window", default=None, metavar="START:END",
                   help="torch.profiler over these steps, as diagnose's main window (benchmarks/watch_cost.py: what it leaves behind)")
    p.add_argument("--profile-cpu-only", action="store_true",
                   help="that window without CUDA activity (no CUPTI): what it leaves apart from CUPTI's")
    p.add_argument("--profile-export", default=None, metavar="DIR",
                   help="export that window's trace into DIR and gzip it in this process, as diagnose does, then delete it")
    args = p.parse_args()
    window = tuple(int(x) for x in args.profile_window.split(":")) if args.profile_window else None
    prof = None
    dev = device()
    width, depth, batch = (32, 8, 4) if args.small else (256, 64, 32)
    model = nn.Sequential(*(block(width) for _ in range(depth)), nn.Linear(width, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev.type == "cuda")
    x = torch.randn(batch, width, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    timer = PlainTimer(args.time_steps, batch)
    for step in range(args.steps):
        timer.step(step)
        if window and step == window[0]:
            activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" and not args.profile_cpu_only else [])
            prof = torch.profiler.profile(activities=activities)
            prof.start()
        elif prof is not None and step == window[1]:
            prof.stop()
            if args.profile_export:
                export(prof, args.profile_export)
            prof = None
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
