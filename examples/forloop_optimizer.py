"""Planted: an optimizer that loops over hundreds of small parameter tensors one by one.

A model of 150 small blocks has 600 parameter tensors; Adam with foreach=False updates them
one at a time, launching several tiny kernels per tensor: thousands of launches per step.
Expected diagnosis: OPT001 (fused=True or foreach=True).
"""

from __future__ import annotations

import torch
from torch import nn

from _common import PlainTimer, device, parser


def main() -> None:
    args = parser(__doc__).parse_args()
    dev = device()
    width, depth, batch = (16, 10, 8) if args.small else (128, 150, 1024)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU()) for _ in range(depth))).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(batch, width, device=dev)
    timer = PlainTimer(args.time_steps, batch)
    for step in range(args.steps):
        timer.step(step)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
