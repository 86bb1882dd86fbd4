"""Planted for diagnose watch: memory that creeps up over the run.

The loop keeps every step's loss tensor in a list "for logging": each one holds its autograd
graph and the activations saved for backward, so memory grows by the same amount every step
(GPU memory on a GPU, host memory on the CPU) until the run ends, or runs out of memory.
Expected whole-run finding: WHOLE004 (keep loss.item(), not the tensor).

On a GPU it runs for --seconds of steps (default 8, counted from the first step) with a small
model: 2,000 steps of the CPU's sizes took under 2 s on an H100, too few of watch's
twice-a-second samples to see a trend (it needs 4); about 0.5 MB is kept per step, some GB over
the run.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from _common import device, parser


def main() -> None:
    p = parser(__doc__, steps=2000)
    p.add_argument("--seconds", type=float, default=None, help="stop after this long too (default 8 on a GPU)")
    args = p.parse_args()
    dev = device()
    gpu = dev.type == "cuda" and not args.small
    width, depth, batch = (1024, 4, 16) if gpu else (512, 2, 32) if args.small else (4096, 8, 64)
    seconds = args.seconds if args.seconds is not None else (8.0 if gpu else None)
    steps = args.steps if args.steps != p.get_default("steps") or not gpu else 40_000
    layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())]
    model = nn.Sequential(*layers, nn.Linear(width, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    began = time.perf_counter()  # at the first step: CUDA's start-up and the profiler's are not the run's steps
    for step in range(steps):
        if seconds is not None and step % 100 == 0 and time.perf_counter() - began > seconds:
            break
        x = torch.randn(batch, width, device=dev)
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward(retain_graph=True)  # the graph stays alive: the list below keeps it
        opt.step()
        losses.append(loss)  # the bug: the tensor, with its graph and saved activations
    print(f"mean loss {torch.stack(losses).mean().item():.4f}", flush=True)


if __name__ == "__main__":
    main()
