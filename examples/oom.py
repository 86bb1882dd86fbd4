"""Planted: a batch that does not fit. An MLP of 8 layers of 8,192 x 8,192 in fp32 with AdamW
(2 GiB of weights, 2 of gradients, 4 of Adam state); the default batch of 262,144 samples saves
two 8 GiB activations per layer for backward (the Linear's input and the GELU's), 128 GiB in
all: far more than an 80 GB H100 holds. Expected diagnosis: the script ran out of GPU memory;
activations filled it; a smaller batch, bf16 autocast or activation checkpointing fits.

``--batch-size 16384`` fits (8 GiB of activations: the fixed run). There is no CPU variant of a CUDA out-of-memory
error: ``--simulate-oom`` raises ``torch.cuda.OutOfMemoryError`` with torch's own message at
step 3, which is what the CPU tests use to check the OOM path.
"""

from __future__ import annotations

import torch
from torch import nn

from _common import PlainTimer, device, parser


def main() -> None:
    p = parser(__doc__, steps=60)
    p.add_argument("--batch-size", type=int, default=262144)
    p.add_argument("--simulate-oom", action="store_true", help="raise torch.cuda.OutOfMemoryError at step 3 (CPU tests)")
    args = p.parse_args()
    dev = device()
    width, layers = (64, 2) if args.small else (8192, 8)
    batch = min(args.batch_size, 32) if args.small else args.batch_size
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.GELU())]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    timer = PlainTimer(args.time_steps, batch)
    for step in range(args.steps):
        timer.step(step)
        x = torch.randn(batch, width, device=dev)
        if args.simulate_oom and step == 3:
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
                "1.05 GiB is free. Of the allocated memory 76.20 GiB is allocated by PyTorch, and 1.10 GiB is reserved "
                "by PyTorch but unallocated."
            )
        loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
