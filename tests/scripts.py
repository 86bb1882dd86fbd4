"""Tiny training scripts for the runner and CLI tests: each one a known shape of loop."""

MLP_TRAIN = """
import argparse, sys, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--epochs", type=int, default=100)
a = p.parse_args()
torch.manual_seed(0)
ds = TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,)))
dl = DataLoader(ds, batch_size=a.batch_size, shuffle=True)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(a.epochs):
    for x, y in dl:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
print("script finished", file=sys.stderr)
"""
