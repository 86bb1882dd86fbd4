"""Planted for diagnose watch: memory that creeps up over the run.

The loop keeps every step's loss tensor in a list "for logging": each one holds its autograd
graph and the activations saved for backward, so memory grows by the same amount every step
(GPU memory on a GPU, host memory on the CPU) until the run ends, or runs out of memory.
Expected whole-run finding: WHOLE004 (keep loss.item(), not the tensor).
"""

from __future__ import annotations

import torch
from torch import nn

from _common import device, parser


def main() -> None:
    args = parser(__doc__, steps=2000).parse_args()
    dev = device()
    width, depth, batch = (512, 2, 32) if args.small else (4096, 8, 64)
    layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())]
    model = nn.Sequential(*layers, nn.Linear(width, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    for step in range(args.steps):
        x = torch.randn(batch, width, device=dev)
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward(retain_graph=True)  # the graph stays alive: the list below keeps it
        opt.step()
        losses.append(loss)  # the bug: the tensor, with its graph and saved activations
    print(f"mean loss {torch.stack(losses).mean().item():.4f}", flush=True)


if __name__ == "__main__":
    main()
