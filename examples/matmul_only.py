"""Planted: a step that is nothing but bf16 matmuls, for checking MFU by hand. Each step calls
a module that multiplies a 8192x8192 matrix by another ``--repeat`` times (2 * 8192^3 FLOPs
each), under no_grad: no optimizer, no DataLoader, so steps are found by module calls.
Expected diagnosis: no bottleneck; MFU near what benchmarks/gpu_rates.py measures for bf16
(about 70% of the H100's 989 TFLOP/s datasheet peak).
"""

from __future__ import annotations

import torch
from torch import nn

from _common import PlainTimer, device, parser


class MatmulChain(nn.Module):
    def __init__(self, n: int, repeat: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n) / n**0.5, requires_grad=False)
        self.repeat = repeat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.repeat):
            x = x @ self.weight
        return x


def main() -> None:
    p = parser(__doc__, steps=80)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=8)
    args = p.parse_args()
    dev = device()
    n = 64 if args.small else args.n
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model = MatmulChain(n, args.repeat).to(dev, dtype)
    x = torch.randn(n, n, device=dev, dtype=dtype)
    timer = PlainTimer(args.time_steps)
    with torch.no_grad():
        for step in range(args.steps):
            timer.step(step)
            model(x)
    print(f"FLOPs per step by hand: {args.repeat * 2 * n**3}")


if __name__ == "__main__":
    main()
