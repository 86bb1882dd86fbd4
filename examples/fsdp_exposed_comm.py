"""Planted (distributed, FSDP2): communication that compute does not hide.

A stack of wide linear blocks, each wrapped with ``fully_shard`` (FSDP2), trained with a small
per-rank batch: each block's parameters are large against the compute they feed, so each
all-gather (before forward, and again before backward as the blocks reshard after forward)
and each gradient reduce-scatter has little to hide under.

    --plant all-gather      reshard after forward, no prefetch hints: expected DIST006
    --plant reduce-scatter  parameters kept gathered (no backward all-gathers), fp32 gradients
                            reduced every step: expected DIST007
    --fixed                 the rules' advice: forward/backward prefetch two blocks ahead, the
                            last block kept gathered, bf16 reduction, reduce every 4th micro-batch
    --fsdp1                 the same blocks under FSDP1 (FullyShardedDataParallel), no prefetch
                            (expected DIST006)
    --width, --depth, --batch
                            the blocks' size, their number, the per-rank batch (default 4096, 12, 8):
                            on an H100 or H200 the default's collectives are short against the host's
                            hooks (LAUNCH001 led, docs/distributed.md); --width 8192 makes each gather
                            four times longer

    diagnose run --nproc-per-node 2 examples/fsdp_exposed_comm.py -- --plant all-gather
    diagnose run --nproc-per-node 2 examples/fsdp_exposed_comm.py -- --small    # CPU, gloo

NCCL on GPUs, gloo on CPUs (FSDP2 runs over gloo on the CPU: the CPU run checks the path, the
collectives' split and the rules' plumbing; the GPU figures need a machine of 2-4 GPUs).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from _common import parser, init_distributed


def main() -> None:
    p = parser(__doc__, steps=200)
    p.add_argument("--plant", choices=("all-gather", "reduce-scatter"), default="all-gather")
    p.add_argument("--fixed", action="store_true")
    p.add_argument("--fsdp1", action="store_true", help="FullyShardedDataParallel (FSDP1) instead of fully_shard")
    p.add_argument("--width", type=int, default=None, help="the blocks' width (default 4096, 256 with --small)")
    p.add_argument("--depth", type=int, default=None, help="the number of blocks (default 12, 6 with --small)")
    p.add_argument("--batch", type=int, default=None, help="the per-rank batch (default 8)")
    args = p.parse_args()
    dev = init_distributed()
    cuda = dev.type == "cuda"
    width, depth, batch = (256, 6, 8) if args.small else (4096, 12, 8)
    width, depth, batch = args.width or width, args.depth or depth, args.batch or batch
    args.batch = batch
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)).to(dev)
    model = nn.Sequential(*blocks, nn.Linear(width, 10)).to(dev)
    if args.fsdp1:
        return train_fsdp1(args, blocks, model, dev, cuda)
    reduce_dtype = torch.bfloat16 if args.fixed and cuda else torch.float32
    mp = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    keep_gathered = args.plant == "reduce-scatter"  # no re-gather before backward
    for i, block in enumerate(blocks):
        fully_shard(block, reshard_after_forward=not (keep_gathered or (args.fixed and i == depth - 1)), mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    if args.fixed:
        for i, block in enumerate(blocks[:-1]):
            block.set_modules_to_forward_prefetch(list(blocks[i + 1 : i + 3]))
        for i in range(1, depth):
            block_list = list(blocks[max(0, i - 2) : i])[::-1]
            blocks[i].set_modules_to_backward_prefetch(block_list)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    accumulate = 4 if args.fixed else 1
    rank = dist.get_rank()
    print(
        f"rank {rank}/{dist.get_world_size()} ({dist.get_backend()}): {depth} blocks of {width}, batch {batch}, plant {args.plant}, fixed {args.fixed}",
        flush=True,
    )
    g = torch.Generator(device=dev).manual_seed(rank)
    try:
        for step in range(args.steps * accumulate):
            x = torch.randn(batch, width, device=dev, generator=g)
            y = torch.randint(0, 10, (batch,), device=dev, generator=g)
            last = (step + 1) % accumulate == 0
            model.set_requires_gradient_sync(last)
            if args.fixed:  # accumulating: keep the gathered parameters until the last micro-batch
                model.set_reshard_after_backward(last)
            nn.functional.cross_entropy(model(x), y).backward()
            if last:
                opt.step()
                opt.zero_grad(set_to_none=True)
    finally:
        dist.destroy_process_group()


def train_fsdp1(
    args: argparse.Namespace, blocks: nn.ModuleList, model: nn.Module, dev: torch.device, cuda: bool
) -> None:
    """FSDP1: each block its own FullyShardedDataParallel unit inside the root's, no prefetch."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    for i in range(len(blocks)):
        blocks[i] = FSDP(blocks[i], device_id=dev, backward_prefetch=None, use_orig_params=True)
    root = FSDP(nn.Sequential(*blocks, model[-1]), device_id=dev, backward_prefetch=None, use_orig_params=True)
    opt = torch.optim.SGD(root.parameters(), lr=0.01)
    batch = args.batch
    width = blocks[0].module[0].in_features
    rank = dist.get_rank()
    print(
        f"rank {rank}/{dist.get_world_size()} ({dist.get_backend()}): FSDP1, {len(blocks)} blocks of {width}, batch {batch}",
        flush=True,
    )
    g = torch.Generator(device=dev).manual_seed(rank)
    try:
        for _ in range(args.steps):
            x = torch.randn(batch, width, device=dev, generator=g)
            y = torch.randint(0, 10, (batch,), device=dev, generator=g)
            nn.functional.cross_entropy(root(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
