"""Planted: one known memory-bound kernel and one known compute-bound kernel per step, for
checking where the roofline puts them. Each step adds two 256 MiB bf16 tensors (one FLOP per
6 bytes moved: far left of the H100's ridge point of about 295 FLOP/byte) and multiplies two
8192x8192 bf16 matrices (2 * 8192^3 FLOPs over 384 MiB: about 2,700 FLOP/byte, far right).
Expected: the elementwise class on the memory roof's slope, the matmul class under the compute
roof; no rule should call this a bottleneck.
"""

from __future__ import annotations

import torch
from torch import nn

from _common import PlainTimer, device, parser


class Both(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = u + v  # memory-bound: reads 2 x 256 MiB, writes 256 MiB
        return (a @ b).sum() + s[0]  # compute-bound


def main() -> None:
    args = parser(__doc__, steps=80).parse_args()
    dev = device()
    n, m = (64, 4096) if args.small else (8192, 128 * 1024 * 1024)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)
    u, v = torch.randn(m, device=dev, dtype=dtype), torch.randn(m, device=dev, dtype=dtype)
    model = Both()
    timer = PlainTimer(args.time_steps)
    with torch.no_grad():
        for step in range(args.steps):
            timer.step(step)
            model(a, b, u, v)


if __name__ == "__main__":
    main()
