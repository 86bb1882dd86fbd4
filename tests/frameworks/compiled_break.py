"""A tiny compiled model on the CPU with a graph break in its forward (``.item()``), and with
``--vary-batch`` batches of a new size every step under ``dynamic=False``: dynamo recompiles for
each new size, after the warm-up too (until its recompile limit)."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=50)
p.add_argument("--mode", default=None)
p.add_argument("--backend", default="inductor", help="eager: dynamo without code generation (fast tests)")
p.add_argument("--vary-batch", action="store_true")
a = p.parse_args()


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if h.mean().item() > 1e6:  # a graph break: dynamo cannot trace .item()
            h = h / 2
        return self.b(h)


torch.manual_seed(0)
ds = TensorDataset(torch.randn(1024, 32), torch.randint(0, 4, (1024,)))
if a.vary_batch:  # batches of 16, 17, ... 31 samples: a new shape each step
    sizes = [16 + i % 16 for i in range(40)]
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    dl = DataLoader(ds, batch_sampler=[list(range(s, e)) for s, e in zip(bounds, bounds[1:], strict=False)])  # noqa: RUF007 - pairwise needs an import line, which would move the lines the tests quote
else:
    dl = DataLoader(ds, batch_size=32, shuffle=True, drop_last=True)
model = torch.compile(TinyNet(), mode=a.mode, dynamic=False if a.vary_batch else None, backend=a.backend)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(a.epochs):
    for x, y in dl:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
