"""Planted: a validation forward pass inside every training step.

A full-batch model (as graph networks on a citation graph are trained: the whole graph each step)
is evaluated after every optimizer step: `model.eval()`, a forward over the validation set with
autograd on, `model.train()` at the next step. About a third of each step goes to a pass no
backward follows; the trace shows it as other host work.
Expected diagnosis: EVAL001 (evaluate every N steps, under torch.no_grad()).
`--eval-every N` evaluates every N steps instead: the fix.
"""

from __future__ import annotations

import torch
from torch import nn

from _common import PlainTimer, device, parser


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--eval-every", type=int, default=1, help="evaluate every N steps (1: the planted case)")
    args = p.parse_args()
    dev = device()
    width, rows = (64, 256) if args.small else (1024, 8192)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.5), nn.Linear(width, 8)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(rows, width, device=dev)
    y = torch.randint(0, 8, (rows,), device=dev)
    train_idx, val_idx = torch.arange(0, rows // 2, device=dev), torch.arange(rows // 2, rows, device=dev)
    timer = PlainTimer(args.time_steps, rows // 2)
    for step in range(args.steps):
        timer.step(step)
        model.train()
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = nn.functional.cross_entropy(out[train_idx], y[train_idx])
        loss.backward()
        opt.step()
        if step % args.eval_every == 0:  # the planted part: a whole forward again, every step
            model.eval()
            out = model(x)
            val_loss = nn.functional.cross_entropy(out[val_idx], y[val_idx])
            val_loss.detach()


if __name__ == "__main__":
    main()
