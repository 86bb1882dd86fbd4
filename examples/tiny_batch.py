"""Planted: a batch too small for the GPU. A linear probe: a trainable head over a frozen
backbone of 12 layers of 8,192 x 8,192 (bf16, 1.6 GB of weights) fed 16 samples a step from a
DataLoader. Every backbone matmul reads its whole 128 MiB weight to multiply 16 rows by it: 16
FLOPs per byte where an H100 needs about 300 to be compute-bound, so the Tensor Cores idle at
a few percent of their peak while the memory, nearly empty, could hold a batch hundreds of
times larger.
Expected diagnosis: MEM004 (a larger batch: the one whose matmuls reach the compute roof and
that fits the memory measured).

The fix is the rule's own knob (``diagnose verify ... --set batch_size=512``) or
``--batch-size 512``; throughput is compared in samples per second.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from _common import PlainTimer, device, parser


class Features(Dataset):
    """Pre-made input features and labels (a cheap dataset: the batch, not the data, is planted)."""

    def __init__(self, n: int, features: int, classes: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, features, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def main() -> None:
    p = parser(__doc__, steps=300)
    p.add_argument("--batch-size", "--batch_size", type=int, default=16)
    args = p.parse_args()
    dev = device()
    features, width, layers, classes = (32, 64, 2, 10) if args.small else (1024, 8192, 12, 1000)
    backbone = nn.Sequential(nn.Linear(features, width), *[m for _ in range(layers - 1) for m in (nn.GELU(), nn.Linear(width, width))])
    backbone = backbone.to(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32).requires_grad_(False)
    head = nn.Linear(width, classes).to(dev)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3, fused=dev.type == "cuda")
    data = DataLoader(Features(16384 if not args.small else 256, features, classes), batch_size=args.batch_size, shuffle=True,
                      drop_last=True, num_workers=0 if args.small else 4, pin_memory=dev.type == "cuda",
                      persistent_workers=not args.small)
    timer = PlainTimer(args.time_steps, args.batch_size)
    step = 0
    while step < args.steps:
        for x, y in data:
            timer.step(step)
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                loss = F.cross_entropy(head(backbone(x)).float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step == args.steps:
                break


if __name__ == "__main__":
    main()
