"""An accelerate loop on the CPU (tiny): ``accelerator.backward``, gradient accumulation
(``accelerator.accumulate``: ``no_sync`` on the micro-batches) and ``clip_grad_norm_``."""

import argparse

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=20)
p.add_argument("--grad-accum", type=int, default=2)
p.add_argument("--gpu", action="store_true")
a = p.parse_args()

accelerator = Accelerator(cpu=not a.gpu, gradient_accumulation_steps=a.grad_accum)
torch.manual_seed(0)
ds = TensorDataset(torch.randn(2048, 128), torch.randint(0, 10, (2048,)))
model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, opt, dl = accelerator.prepare(model, opt, DataLoader(ds, batch_size=64, shuffle=True))
for epoch in range(a.epochs):
    for x, y in dl:
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
