"""Planted: a GPU-bound transformer trained through accelerate in plain fp32.

An ordinary loop made with ``accelerate``: ``Accelerator()``, ``prepare(model, optimizer,
loader)``, ``accelerator.backward(loss)``. The Accelerator's default ``mixed_precision="no"``
leaves every matmul in fp32 on CUDA cores. ``--fixed`` builds ``Accelerator(mixed_precision="bf16")``.
Expected diagnosis: PREC001, written as ``Accelerator(mixed_precision="bf16")``.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _common import PlainTimer, parser


def main() -> None:
    p = parser(__doc__, steps=200)
    p.add_argument("--fixed", action="store_true", help='train with mixed_precision="bf16"')
    args = p.parse_args()
    d, layers, batch, seq = (64, 2, 4, 32) if args.small else (1024, 8, 16, 512)
    accelerator = Accelerator(mixed_precision="bf16" if args.fixed else "no")
    layer = nn.TransformerEncoderLayer(d, nhead=max(d // 64, 1), dim_feedforward=4 * d, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), nn.Linear(d, 1000))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n = batch * 8  # a few distinct batches, epochs of 8 steps (full size: 268 MB of inputs)
    data = TensorDataset(torch.randn(n, seq, d), torch.randint(0, 1000, (n, seq)))
    loader = DataLoader(data, batch_size=batch, shuffle=True, pin_memory=torch.cuda.is_available())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    timer = PlainTimer(args.time_steps, batch)
    step = 0
    while step < args.steps:
        for x, y in loader:
            timer.step(step)
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            optimizer.step()
            step += 1
            if step == args.steps:
                break


if __name__ == "__main__":
    main()
