"""Planted for diagnose watch: an evaluation loop that takes about a third of the run.

An MLP classifier trains for a few epochs; after each epoch it evaluates on a validation set
one and a half times the training set (forward only, under model.eval() and torch.no_grad()).
The training steps never show it; over the whole run, evaluation is about a third of the time.
Expected whole-run finding: WHOLE001 (evaluate less often, or on a subset).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _common import device, parser


def main() -> None:
    p = parser(__doc__, steps=600)
    p.add_argument("--epochs", type=int, default=4)
    args = p.parse_args()
    dev = device()
    width, batch = (256, 64) if args.small else (4096, 256)
    per_epoch = max(1, args.steps // args.epochs)
    train = TensorDataset(torch.randn(per_epoch * batch, width), torch.randint(0, 10, (per_epoch * batch,)))
    val = TensorDataset(torch.randn(int(1.5 * per_epoch * batch), width), torch.randint(0, 10, (int(1.5 * per_epoch * batch),)))
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        model.train()
        for x, y in DataLoader(train, batch_size=batch, shuffle=True):
            loss = nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in DataLoader(val, batch_size=batch):
                # evaluation done the slow way: three passes per batch (test-time augmentation)
                logits = sum(model(x.to(dev) + 0.01 * k) for k in range(3))
                correct += int((logits.argmax(1) == y.to(dev)).sum())
        print(f"epoch {epoch}: val accuracy {correct / len(val):.3f}", flush=True)


if __name__ == "__main__":
    main()
