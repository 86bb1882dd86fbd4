"""Planted: matmul shapes that waste the Tensor Cores. An MLP of 8 residual blocks whose width is
4,095 features (bf16 autocast, fused AdamW, 8,192 rows a step, data on the GPU): every matmul has
two dimensions that are not multiples of 8, so cuBLAS cannot use its aligned Tensor Core kernels.
Expected diagnosis: PREC004 (pad the dimension to a multiple of 8, better 64).

``--hidden 4096`` is the fix (``diagnose verify ... --set arg.hidden=4096`` measures it): one
more feature per layer, about 0.05% more FLOPs.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import PlainTimer, device, parser


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(width), nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def main() -> None:
    p = parser(__doc__, steps=120)
    p.add_argument("--hidden", type=int, default=4095, help="the width of every layer (4096: the fix)")
    args = p.parse_args()
    dev = device()
    # --small keeps the flaw or the fix: 63 features, or 64 when --hidden is a multiple of 8
    width, blocks, rows = (64 if args.hidden % 8 == 0 else 63, 2, 32) if args.small else (args.hidden, 8, 8192)
    model = nn.Sequential(*[Block(width) for _ in range(blocks)], nn.Linear(width, 1)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    x, y = torch.randn(rows, width, device=dev), torch.randn(rows, 1, device=dev)
    timer = PlainTimer(args.time_steps, rows)
    for step in range(args.steps):
        timer.step(step)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
