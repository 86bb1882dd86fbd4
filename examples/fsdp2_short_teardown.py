"""A short FSDP2 script as public examples write it: 10 steps, explicit prefetch, a teardown.

Not a planted bottleneck: a script whose shape used to mislead the diagnosis (issue 33). It
trains only ``--steps`` optimizer steps (10 by default: fewer than diagnose's warm-up, window
and timed steps), with FSDP2's explicit forward and backward prefetch switched on
(``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``), and after its last
step it gathers a full checkpoint (``full_tensor()`` on every parameter, saved on rank 0) and
calls ``destroy_process_group()``. What diagnose must say of it: the steps it had (the window
and the timing shrunk to them, and ``--steps`` named as the flag that gives more), no step
holding the teardown (reported apart, never a training-loop finding), and no advice to switch
on the prefetch it already set (DIST006 says why that is not enough, or stays silent).

    torchrun --nproc-per-node 2 examples/fsdp2_short_teardown.py              # plain
    diagnose run --nproc-per-node 2 examples/fsdp2_short_teardown.py          # GPUs: NCCL
    diagnose run --nproc-per-node 2 examples/fsdp2_short_teardown.py -- --small  # CPU: gloo
    ... -- --no-prefetch    the same without the explicit prefetch (FSDP2's defaults)
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from _common import parser, init_distributed


def main() -> None:
    p = parser(__doc__, steps=10)
    p.add_argument("--no-prefetch", action="store_true", help="leave FSDP2's prefetch at its defaults")
    p.add_argument("--checkpoint", default=None, help="where rank 0 saves the gathered state dict (default: a temporary file)")
    args = p.parse_args()
    dev = init_distributed()
    width, depth, batch = (256, 4, 8) if args.small else (4096, 8, 16)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))
    model = nn.Sequential(*blocks, nn.Linear(width, 10)).to(dev)
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    if not args.no_prefetch:
        for i, block in enumerate(blocks[:-1]):
            block.set_modules_to_forward_prefetch(list(blocks[i + 1 : i + 3]))
        for i in range(1, depth):
            blocks[i].set_modules_to_backward_prefetch(list(blocks[max(0, i - 2) : i])[::-1])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rank = dist.get_rank()
    g = torch.Generator(device=dev).manual_seed(rank)
    for _ in range(args.steps):
        x = torch.randn(batch, width, device=dev, generator=g)
        y = torch.randint(0, 10, (batch,), device=dev, generator=g)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    # the teardown: a full checkpoint gathered from the shards, then the process group's end
    full = {name: param.full_tensor().cpu() for name, param in model.state_dict().items()}
    if rank == 0:
        path = args.checkpoint or os.path.join(tempfile.gettempdir(), f"fsdp2_short_teardown-{os.getpid()}.pt")
        torch.save(full, path)
        if args.checkpoint is None:
            os.remove(path)
        print(f"rank 0: {args.steps} steps, checkpoint of {len(full)} tensors gathered, prefetch {'off' if args.no_prefetch else 'explicit'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
