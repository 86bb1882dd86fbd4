"""Planted: a deep, narrow model compiled with torch.compile's default mode, still launch-bound.

The same 64 small blocks at batch 32 as ``launch_bound.py``, compiled with ``torch.compile(model)``:
inductor fuses each block's elementwise work, but every fused kernel is still launched one by
one from the host, and they run for a few microseconds each. ``mode="reduce-overhead"``
captures the step's kernels in CUDA graphs, launched as one. ``--fixed`` compiles that way.
Expected diagnosis: LAUNCH002, ``mode="reduce-overhead"`` (compile is already on, in default
mode: diagnose must not tell the user to turn it on). ``diagnose verify`` measures it through this
script's own ``torch.compile(...)`` call, its mode replaced by the knob's.
"""

from __future__ import annotations

import torch
from torch import nn

from _common import PlainTimer, device, parser


def block(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU())


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--fixed", action="store_true", help='compile with mode="reduce-overhead"')
    args = p.parse_args()
    dev = device()
    width, depth, batch = (32, 8, 4) if args.small else (256, 64, 32)
    model = nn.Sequential(*(block(width) for _ in range(depth)), nn.Linear(width, 10)).to(dev)
    compiled = torch.compile(model, mode="reduce-overhead" if args.fixed else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev.type == "cuda")
    x = torch.randn(batch, width, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    timer = PlainTimer(args.time_steps, batch)
    for step in range(args.steps):
        timer.step(step)
        loss = nn.functional.cross_entropy(compiled(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
