"""Planted: a GPU-bound transformer trained in plain fp32 on a Tensor Core GPU.

Data lives on the GPU and the GPU is busy all step long, but every matmul runs in fp32 on CUDA
cores (TF32 off, PyTorch's default): the Tensor Cores sit unused.
Expected diagnosis: PREC001 (bf16 autocast; TF32 as the minimal change).
"""

from __future__ import annotations

import torch
from torch import nn

from _common import PlainTimer, device, parser


def main() -> None:
    args = parser(__doc__, steps=200).parse_args()
    dev = device()
    d, layers, batch, seq = (64, 2, 4, 32) if args.small else (1024, 8, 16, 512)
    layer = nn.TransformerEncoderLayer(d, nhead=max(d // 64, 1), dim_feedforward=4 * d, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), nn.Linear(d, 1000)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    x = torch.randn(batch, seq, d, device=dev)
    y = torch.randint(0, 1000, (batch, seq), device=dev)
    timer = PlainTimer(args.time_steps, batch)
    for step in range(args.steps):
        timer.step(step)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
