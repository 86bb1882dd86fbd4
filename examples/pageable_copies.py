"""Planted: batches copied to the GPU from pageable memory, blocking the host.

Batches of 64 images of 3x256x256 float32 (50 MB) arrive from the DataLoader in ordinary
pageable memory; `.to("cuda")` stages every byte through a bounce buffer while the host waits,
and the copy cannot overlap the convolutions of the previous step.
Expected diagnosis: DATA002 (pin_memory=True with non_blocking=True copies).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from _common import PlainTimer, device, parser


class PremadeBatches(Dataset):
    """A few ready batches, handed out in turn (batch_size=None: the items are batches)."""

    def __init__(self, n: int, shape: tuple[int, ...], keep: int = 3) -> None:
        g = torch.Generator().manual_seed(0)
        self.batches = [(torch.rand(shape, generator=g), torch.randint(0, 10, (shape[0],), generator=g)) for _ in range(keep)]
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batches[i % len(self.batches)]


def main() -> None:
    args = parser(__doc__).parse_args()
    dev = device()
    torch.backends.cudnn.benchmark = True
    shape, width, depth = ((4, 3, 32, 32), 16, 2) if args.small else ((64, 3, 256, 256), 128, 8)
    data = DataLoader(PremadeBatches(args.steps, shape), batch_size=None, num_workers=2, pin_memory=False)
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Conv2d(width, width, 3, padding=1), nn.ReLU()]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))
    model = model.to(dev, memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev.type == "cuda")
    timer = PlainTimer(args.time_steps, shape[0])
    for step, (x, y) in enumerate(data):
        timer.step(step)
        x, y = x.to(dev), y.to(dev)  # pageable memory: a blocking, staged copy
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
