"""Planted for diagnose watch: a blocking checkpoint save every N steps.

Every 20 steps (5 with --small) the loop saves the model and the AdamW state (three copies of the weights) with
torch.save, synchronously: the training steps stop until the file is written (the last one is kept).
Expected whole-run finding: WHOLE002 (save asynchronously, or less often).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import torch
from torch import nn

from _common import device, parser


def main() -> None:
    p = parser(__doc__, steps=200)
    p.add_argument("--save-every", type=int, default=None, help="steps between saves (default 20; --small: 5)")
    args = p.parse_args()
    dev = device()
    every = args.save_every or (5 if args.small else 20)
    width, depth, batch = (1024, 4, 32) if args.small else (4096, 8, 256)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=dev)
    folder = tempfile.mkdtemp(prefix="watch-ckpt-")
    try:
        for step in range(args.steps):
            loss = model(x).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if (step + 1) % every == 0:
                path = os.path.join(folder, f"step{step + 1}.pt")
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}, path)
                previous = os.path.join(folder, f"step{step + 1 - every}.pt")
                if os.path.exists(previous):  # keep the last one only
                    os.remove(previous)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
