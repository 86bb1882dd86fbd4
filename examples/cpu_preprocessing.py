"""Planted: per-sample augmentation on the CPU inside the training loop.

The DataLoader delivers raw uint8 images quickly (with workers), but the loop then crops,
flips, jitters and normalises every image on the CPU in Python before the model runs: the GPU
waits for the main thread.
Expected diagnosis: DATA004 (move the work into the Dataset / workers, or onto the GPU).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from _common import PlainTimer, device, parser


class RawImages(Dataset):
    """uint8 images; with ``augment_here`` the Dataset augments them (in the workers): the fix."""

    def __init__(self, n: int, size: int, augment_here: bool = False) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (64, 3, size, size), dtype=torch.uint8, generator=g)
        self.n = n
        self.augment_here = augment_here

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = self.images[i % len(self.images)]
        return (augment(image, i) if self.augment_here else image), i % 100


def augment(img: torch.Tensor, i: int) -> torch.Tensor:
    """What many training loops do per sample: crop, flip, colour jitter, normalise."""
    size = img.shape[-1]
    crop = size * 7 // 8
    top = (i * 13) % (size - crop)
    x = img[:, top : top + crop, top : top + crop].float().div(255)
    x = nn.functional.interpolate(x[None], size=(size, size), mode="bilinear", align_corners=False)[0]
    if i % 2:
        x = x.flip(-1)
    x = x * (0.8 + 0.4 * ((i % 7) / 7)) + 0.05 * ((i % 5) / 5)
    mean = x.mean(dim=(1, 2), keepdim=True)
    return (x - mean) / x.std(dim=(1, 2), keepdim=True).clamp_min(1e-3)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--fixed", action="store_true", help="the recommended change: augment in the Dataset, on 8 workers")
    args = p.parse_args()
    dev = device()
    size, batch = (32, 8) if args.small else (160, 128)
    workers = 8 if args.fixed and not args.small else 2
    data = DataLoader(
        RawImages(batch * args.steps, size, augment_here=args.fixed),
        batch_size=batch, num_workers=workers, pin_memory=True, persistent_workers=True,
    )
    model = nn.Sequential(
        nn.Conv2d(3, 64, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 100),
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    timer = PlainTimer(args.time_steps, batch)
    for step, (images, y) in enumerate(data):
        timer.step(step)
        if args.fixed:  # noqa: SIM108 - the planted line stands alone, for the line attribution
            x = images
        else:
            x = torch.stack([augment(img, step * batch + k) for k, img in enumerate(images)])  # planted
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
