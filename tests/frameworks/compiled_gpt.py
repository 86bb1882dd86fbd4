"""A small GPT trained eagerly or under torch.compile, for the compiled-model fixtures.

    python tests/frameworks/compiled_gpt.py --compile none|default|reduce-overhead [--graph-break]

Small enough to be launch-bound on an H100 at batch 8 (many short kernels), so the modes differ
in what limits the step; ``--graph-break`` reads a scalar back in each block's forward (a graph
break). Runs on the CPU too (slowly), on CUDA when there is one.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--compile", choices=("none", "default", "reduce-overhead"), default="default")
p.add_argument("--graph-break", action="store_true")
p.add_argument("--layers", type=int, default=4)
p.add_argument("--width", type=int, default=256)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--epochs", type=int, default=100)
a = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB, LENGTH = 1024, 128


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        if a.graph_break and x.abs().max().item() > 1e6:  # a read-back: dynamo breaks the graph here
            x = x / 2
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, a.width)
        self.pos = nn.Parameter(torch.zeros(LENGTH, a.width))
        self.blocks = nn.ModuleList(Block(a.width) for _ in range(a.layers))
        self.head = nn.Linear(a.width, VOCAB)
        self.register_buffer("mask", torch.triu(torch.full((LENGTH, LENGTH), float("-inf")), 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(x)


torch.manual_seed(0)
data = torch.randint(0, VOCAB, (512, LENGTH + 1))
loader = DataLoader(TensorDataset(data), batch_size=a.batch, shuffle=True, drop_last=True, pin_memory=device == "cuda")
model = GPT().to(device)
if a.compile != "none":
    model = torch.compile(model, mode=None if a.compile == "default" else a.compile)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device == "cuda")
for epoch in range(a.epochs):
    for (batch,) in loader:
        batch = batch.to(device, non_blocking=True)
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
