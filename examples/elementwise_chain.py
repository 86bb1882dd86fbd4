"""Planted: memory-bound elementwise kernels hold most of the GPU's time. Eight pre-norm MLP
blocks (width 1,024, hidden 4,096, 16,384 rows a step, bf16 autocast, fused AdamW, data on the
GPU) whose RMSNorm and tanh-GELU are written out by hand, as in many research codebases: each is
a chain of small arithmetic operators, and in eager mode every one of them is its own kernel
that reads and writes a 16,384 x 4,096 tensor, forward and backward.
Expected diagnosis: FUSE001 (torch.compile fuses each chain into one kernel).

The fix is the rule's own knob (``diagnose verify ... --set compile=default``); ``--compile``
does the same by hand.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F  # noqa: F401 - kept: the lines below keep the numbers the docs quote

from _common import PlainTimer, device, parser


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(gelu_tanh(self.up(rms_norm(x, self.weight))))


def main() -> None:
    p = parser(__doc__, steps=120)
    p.add_argument("--compile", action="store_true", help="the fix by hand: torch.compile(model)")
    args = p.parse_args()
    dev = device()
    d, blocks, rows = (64, 2, 32) if args.small else (1024, 8, 16384)
    model = nn.Sequential(*[Block(d) for _ in range(blocks)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    step_model = torch.compile(model) if args.compile else model
    x = torch.randn(rows, d, device=dev)
    timer = PlainTimer(args.time_steps, rows)
    for step in range(args.steps):
        timer.step(step)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = step_model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
