"""Planted: data loading in the main process (num_workers=0) starves the GPU.

Each sample is a JPEG decoded and augmented with PIL, as in an ImageNet pipeline. With
num_workers=0 the training loop does all of it between steps; the GPU waits.
Expected diagnosis: DATA001 (more DataLoader workers).
"""

from __future__ import annotations

import io

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from _common import PlainTimer, device, parser


class JpegImages(Dataset):
    """Synthetic JPEGs kept encoded in memory; decoding, cropping and flipping cost what they
    cost on ImageNet-sized images."""

    def __init__(self, n: int, size: int, classes: int = 100) -> None:
        from PIL import Image

        rng = np.random.default_rng(0)
        self.blobs = []
        for i in range(16):
            base = rng.integers(0, 255, (size // 8, size // 8, 3), dtype=np.uint8)
            img = Image.fromarray(base).resize((size, size), Image.BICUBIC)
            noisy = np.asarray(img).astype(np.int16) + rng.integers(-30, 30, (size, size, 3))
            buf = io.BytesIO()
            Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
            self.blobs.append(buf.getvalue())
        self.n, self.size, self.classes = n, size, classes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        img = Image.open(io.BytesIO(self.blobs[i % len(self.blobs)])).convert("RGB")
        crop = self.size * 7 // 8
        left = (i * 7) % (self.size - crop)
        img = img.crop((left, left, left + crop, left + crop)).resize((self.size, self.size), Image.BILINEAR)
        if i % 2:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
        return (x - 0.45) / 0.225, i % self.classes


def main() -> None:
    args = parser(__doc__).parse_args()
    dev = device()
    size, batch = (64, 8) if args.small else (224, 128)
    data = DataLoader(JpegImages(batch * args.steps, size), batch_size=batch, shuffle=False, num_workers=0, pin_memory=True)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=4, padding=3), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 100),
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    timer = PlainTimer(args.time_steps, batch)
    for step, (x, y) in enumerate(data):
        timer.step(step)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
