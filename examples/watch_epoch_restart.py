"""Planted for diagnose watch: epoch-start stalls, the DataLoader workers started again every epoch.

Two workers (persistent_workers=False, torch's default), short epochs, and a per-worker set-up
(a lookup table built in worker_init_fn, as a tokenizer or an augmentation pipeline is): every
epoch's first batch waits for new workers to start and set up.
Expected whole-run finding: WHOLE003 (persistent_workers=True).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, get_worker_info

from _common import device, parser


class Samples(Dataset):
    def __init__(self, n: int, width: int) -> None:
        self.n, self.width = n, width
        self.table: dict[int, float] | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.width, generator=g), i % 10


def build_table(worker_id: int) -> None:
    """Per-worker set-up: a vocabulary-sized lookup table, built in Python."""
    info = get_worker_info()
    info.dataset.table = {k: (k * 2654435761 % 1000) / 1000 for k in range(600_000)}


def main() -> None:
    p = parser(__doc__, steps=300)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--persistent", action="store_true", help="the fix")
    args = p.parse_args()
    dev = device()
    width, batch = (128, 32) if args.small else (1024, 128)
    per_epoch = max(1, args.steps // args.epochs)
    loader = DataLoader(Samples(per_epoch * batch, width), batch_size=batch, shuffle=True, num_workers=args.workers,
                        worker_init_fn=build_table, persistent_workers=args.persistent)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
