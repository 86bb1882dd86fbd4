"""A plain loop whose forward and backward run inside ``optimizer.step(closure)`` (CPU, tiny).

Recorded by tests/frameworks/record.sh into tests/data/closure_cpu/; the optimizer annotation
then wraps the whole step, and only its own update is optimizer work.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--optimizer", choices=("sgd", "lbfgs"), default="sgd")
p.add_argument("--epochs", type=int, default=50)
p.add_argument("--device", default="cpu")
a = p.parse_args()
torch.manual_seed(0)
ds = TensorDataset(torch.randn(2048, 128), torch.randint(0, 10, (2048,)))
dl = DataLoader(ds, batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(a.device)
if a.optimizer == "lbfgs":
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3, history_size=5)
else:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

for epoch in range(a.epochs):
    for x, y in dl:
        x, y = x.to(a.device), y.to(a.device)

        def closure() -> torch.Tensor:  # opt.step calls it at once, on this batch
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)  # noqa: B023
            loss.backward()
            return loss

        opt.step(closure)
