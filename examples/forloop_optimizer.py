"""Planted: an optimizer that loops over hundreds of parameter tensors one by one.

A 48-layer transformer in bf16 keeps the GPU busy in forward and backward, but it has 580
parameter tensors (most of them small: biases and norm weights), and Adam with foreach=False
updates them one at a time, several tiny kernels per tensor: thousands of launches per step
while the GPU waits.
Expected diagnosis: OPT001 (fused=True or foreach=True).
"""

from __future__ import annotations

import torch
from torch import nn

from _common import PlainTimer, device, parser


def main() -> None:
    args = parser(__doc__, steps=200).parse_args()
    dev = device()
    d, layers, batch, seq = (32, 4, 4, 16) if args.small else (512, 48, 64, 256)
    layer = nn.TransformerEncoderLayer(d, nhead=max(d // 64, 1), dim_feedforward=4 * d, batch_first=True, dropout=0.0, norm_first=True)
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)  # planted: the for-loop
    x = torch.randn(batch, seq, d, device=dev)
    timer = PlainTimer(args.time_steps, batch)
    for step in range(args.steps):
        timer.step(step)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
