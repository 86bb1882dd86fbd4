"""Planted: two DataLoader workers that cannot keep up; their queue hides it for a few steps.

Each batch costs a worker ``--batch-ms`` (default 40 ms: a sleep standing in for decoding, so
that the figure does not depend on how loaded the CPUs are); two workers deliver one batch per
20 ms while the model needs far less. In steady state every step waits for data. But the workers
keep ``num_workers x prefetch_factor`` (here 4) batches queued whenever the loop is slower than
they are, as during diagnose's profiled window and its trace export: the first steps after it
draw ready batches. ``diagnose`` leaves those steps untimed (docs/performance.md); its steady
state must match this script's plain timer (benchmarks/overhead.py compares them).
Expected diagnosis: DATA001 (more workers), steady state ~50 steps/s (``--batch-ms 40``).
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from _common import PlainTimer, device, parser


class SlowBatches(Dataset):
    """Samples that take a fixed time to make: ``batch_ms`` per batch of ``batch`` samples."""

    def __init__(self, n: int, batch: int, batch_ms: float, features: int) -> None:
        self.n, self.per_sample_s, self.features = n, batch_ms / 1000 / batch, features

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.per_sample_s)
        return torch.full((self.features,), float(i % 7)), i % 10


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch-ms", type=float, default=40.0, help="a worker's time to make one batch")
    args = p.parse_args()
    dev = device()
    batch, features = (16, 64) if args.small else (64, 1024)
    data = DataLoader(
        SlowBatches(batch * args.steps, batch, args.batch_ms, features),
        batch_size=batch, num_workers=2, prefetch_factor=2, persistent_workers=True,
    )
    model = nn.Sequential(nn.Linear(features, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    timer = PlainTimer(args.time_steps, batch)
    for step, (x, y) in enumerate(data):
        timer.step(step)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
