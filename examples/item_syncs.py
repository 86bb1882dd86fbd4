"""Planted: per-step `.item()` calls that synchronise the host with the GPU.

After every step the loop logs each sample's loss with `.item()`: hundreds of host-GPU
synchronisations per step, each one waiting for the GPU and leaving it idle while the host
catches up.
Expected diagnosis: SYNC001 (keep values on the GPU, read them every N steps).
"""

from __future__ import annotations

import torch
from torch import nn

from _common import PlainTimer, device, parser


def main() -> None:
    args = parser(__doc__).parse_args()
    dev = device()
    width, batch = (64, 8) if args.small else (2048, 256)
    model = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev.type == "cuda")
    x = torch.randn(batch, width, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    history: list[float] = []
    timer = PlainTimer(args.time_steps, batch)
    for step in range(args.steps):
        timer.step(step)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            per_sample = nn.functional.cross_entropy(model(x), y, reduction="none")
        loss = per_sample.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        for value in per_sample.detach():  # the planted part: one sync per sample
            history.append(value.item())


if __name__ == "__main__":
    main()
