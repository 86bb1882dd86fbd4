"""Planted for diagnose watch: a training step that slows down over the run.

Each step appends its per-sample losses to a Python list and reports the running median over
all of them (sorted again every step): the list grows with the run, and so does the step.
Expected whole-run finding: WHOLE005 (O(1) bookkeeping per step).
"""

from __future__ import annotations

import torch
from torch import nn

from _common import device, parser


def main() -> None:
    args = parser(__doc__, steps=1500).parse_args()
    dev = device()
    width, batch = (32, 512) if args.small else (1024, 64)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, width, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    history: list[float] = []
    for step in range(args.steps):
        per_sample = nn.functional.cross_entropy(model(x), y, reduction="none")
        loss = per_sample.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        history.extend(per_sample.detach().cpu().tolist())
        running_median = sorted(history)[len(history) // 2]  # the bug: O(n log n) per step, n grows
    print(f"running median loss {running_median:.4f}", flush=True)


if __name__ == "__main__":
    main()
