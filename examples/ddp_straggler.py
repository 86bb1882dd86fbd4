"""Planted (distributed): one rank's data pipeline is slower than the others'.

DDP over all ranks (NCCL on GPUs, gloo on CPUs); every rank loads its shard with a
DataLoader, but the last rank's samples take several times longer to prepare (as on a node with
a slower disk or fewer CPUs). At every gradient all-reduce the other ranks wait for it.
Expected diagnosis: DIST003, naming the last rank and its data loading.

    diagnose run --nproc-per-node 2 examples/ddp_straggler.py
    --no-delay      every rank loads alike (the fix; the reference of a scaling run)
    --split uneven  no delay, but the last rank takes batches twice as large (expected DIST005)
    --split even    its fix: every rank the same batch, the job's samples per step unchanged
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from _common import parser


class Samples(Dataset):
    def __init__(self, n: int, width: int, delay_s: float) -> None:
        self.n, self.width, self.delay_s = n, width, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.delay_s:
            time.sleep(self.delay_s)  # planted: this rank's samples cost more to prepare
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.width, generator=g), i % 10


def main() -> None:
    p = parser(__doc__, steps=200)
    p.add_argument("--no-delay", action="store_true", help="no rank is slower to load (the fix)")
    p.add_argument("--split", choices=("uneven", "even"), help="no delay; uneven: the last rank's batches twice as large; even: the same total, split equally")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:
        torch.set_num_threads(1)
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    width, batch = (64, 16) if args.small else (1024, 256)
    slow = rank == world - 1
    delay = 0.002 if args.small else 0.0004  # per sample; --small (CPU) plants it above the noise of 2 cores
    if args.no_delay or args.split:
        delay = 0.0
    if args.split == "uneven" and slow:
        batch *= 2
    elif args.split == "even":  # the uneven split's samples per step, shared equally
        batch = round(batch * (world + 1) / world)
    dataset = Samples(batch * args.steps * world, width, delay_s=delay if slow else 0.0)
    loader = DataLoader(dataset, batch_size=batch, sampler=DistributedSampler(dataset, shuffle=False), num_workers=1)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(dev), device_ids=[dev.index] if cuda else None
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    print(f"rank {rank}/{world} ({dist.get_backend()}): {len(loader)} batches of {batch}", flush=True)
    try:
        for x, y in loader:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
