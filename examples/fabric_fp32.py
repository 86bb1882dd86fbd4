"""Planted: a GPU-bound transformer trained in a Lightning Fabric loop in plain fp32.

The user's own loop made with Lightning Fabric: ``Fabric(accelerator=..., devices=1)``,
``fabric.setup(model, optimizer)``, ``fabric.setup_dataloaders(loader)``, ``fabric.backward(loss)``.
Fabric's default precision, "32-true", leaves every matmul in fp32 on CUDA cores. ``--fixed``
builds ``Fabric(precision="bf16-mixed")``; ``--compile`` compiles the model before ``setup``
(which compiles it again with the same arguments).
Expected diagnosis: PREC001, written as ``Fabric(precision="bf16-mixed")``.
"""

from __future__ import annotations

import torch
from lightning.fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _common import PlainTimer, parser


def main() -> None:
    p = parser(__doc__, steps=200)
    p.add_argument("--fixed", action="store_true", help='train with precision="bf16-mixed"')
    p.add_argument("--compile", action="store_true", help="torch.compile the model before fabric.setup")
    args = p.parse_args()
    d, layers, batch, seq = (64, 2, 4, 32) if args.small else (1024, 8, 16, 512)
    fabric = Fabric(accelerator="cuda" if torch.cuda.is_available() else "cpu", devices=1,
                    precision="bf16-mixed" if args.fixed else "32-true")
    layer = nn.TransformerEncoderLayer(d, nhead=max(d // 64, 1), dim_feedforward=4 * d, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), nn.Linear(d, 1000))
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = fabric.setup(model, optimizer)
    n = batch * 8  # a few distinct batches, epochs of 8 steps (full size: 268 MB of inputs)
    data = TensorDataset(torch.randn(n, seq, d), torch.randint(0, 1000, (n, seq)))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=batch, shuffle=True, pin_memory=torch.cuda.is_available()))
    timer = PlainTimer(args.time_steps, batch)
    step = 0
    while step < args.steps:
        for x, y in loader:
            timer.step(step)
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizer.zero_grad(set_to_none=True)
            fabric.backward(loss)
            optimizer.step()
            step += 1
            if step == args.steps:
                break


if __name__ == "__main__":
    main()
