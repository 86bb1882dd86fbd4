"""Planted (distributed, DDP): gradient buckets of the wrong size.

A deep MLP under DistributedDataParallel; only ``bucket_cap_mb`` changes:

    --bucket-cap-mb 10000   one bucket holds every gradient: its all-reduce starts when backward
                            is over, nothing hides it (expected DIST008)
    --bucket-cap-mb 0.25    dozens of small buckets a step, each paying the collective's latency
                            (expected DIST009 where that latency is exposed)
    --bucket-cap-mb 25      DDP's default, for comparison
    --accumulate 4          DIST002's advice: all-reduce once per 4 micro-batches (model.no_sync())
    --batch 1024            a per-rank batch that makes backward's kernels long against the one
                            all-reduce on an H100 (the default 64 leaves the rank host-bound: there
                            DIST008 stays silent, its fix measured 0.82x; docs/distributed.md)
    --width, --depth        the layers' width and number (default 2048, 24): with 0.25 MiB buckets
                            each weight is a bucket of its own, so --depth 48 --width 1024 makes
                            48 all-reduces a step (the default's 24 stay under DIST009's 40)

    diagnose run --nproc-per-node 2 examples/ddp_buckets.py -- --bucket-cap-mb 10000
    diagnose run --nproc-per-node 2 examples/ddp_buckets.py -- --small --bucket-cap-mb 10000   # CPU, gloo

NCCL on GPUs, gloo on CPUs; the GPU figures need a machine of 2-4 GPUs.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from _common import parser, init_distributed


def main() -> None:
    p = parser(__doc__, steps=300)
    p.add_argument("--bucket-cap-mb", type=float, default=10000.0)
    p.add_argument(
        "--accumulate", type=int, default=1, help="micro-batches per optimizer step, all-reduced once (no_sync)"
    )
    p.add_argument("--batch", type=int, default=None, help="per-rank batch (default 64, 32 with --small)")
    p.add_argument("--width", type=int, default=None, help="the layers' width (default 2048, 256 with --small)")
    p.add_argument("--depth", type=int, default=None, help="the number of layers (default 24, 8 with --small)")
    args = p.parse_args()
    dev = init_distributed()
    cuda = dev.type == "cuda"
    width, depth, batch = (256, 8, 32) if args.small else (2048, 24, 64)
    width, depth, batch = args.width or width, args.depth or depth, args.batch or batch
    layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())]
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(*layers, nn.Linear(width, 10)).to(dev),
        device_ids=[dev.index] if cuda else None,
        bucket_cap_mb=args.bucket_cap_mb,
        gradient_as_bucket_view=True,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rank = dist.get_rank()
    print(f"rank {rank}/{dist.get_world_size()} ({dist.get_backend()}): bucket_cap_mb={args.bucket_cap_mb}", flush=True)
    g = torch.Generator(device=dev).manual_seed(rank)
    try:
        for _ in range(args.steps):
            for micro in range(args.accumulate):
                x = torch.randn(batch, width, device=dev, generator=g)
                y = torch.randint(0, 10, (batch,), device=dev, generator=g)
                with model.no_sync() if micro < args.accumulate - 1 else contextlib.nullcontext():
                    nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
