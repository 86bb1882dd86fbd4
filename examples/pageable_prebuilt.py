"""Planted: pre-built float32 batches in pageable host memory, copied to the GPU every step.

The script builds its batches once, outside any DataLoader (a data set held in host memory,
as many research loops do), and sends one to the GPU each step with `.to("cuda")`. The host
tensors are pageable: every byte is staged through a bounce buffer while the host waits, and
the copy cannot overlap the convolutions. Pinning them once (they never change) and copying
with non_blocking=True lets the DMA run beside the previous step's kernels.
Expected diagnosis: a host-to-device finding (DATA002/DATA003) whose knob pins the host tensors
(`diagnose verify`: `--set pin_host=true`).
"""

from __future__ import annotations

import torch
from torch import nn

from _common import PlainTimer, device, parser


def main() -> None:
    args = parser(__doc__).parse_args()
    dev = device()
    # 64 x 3 x 224 x 224 float32 = 38.5 MB a batch; four batches a step (154 MB), as in the issue
    batch, side, per_step, kept = (4, 32, 2, 3) if args.small else (64, 224, 4, 8)
    batches = [torch.randn(batch, 3, side, side) for _ in range(kept)]  # pageable, built once
    labels = [torch.randint(0, 10, (batch,)) for _ in range(kept)]
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev.type == "cuda")
    timer = PlainTimer(args.time_steps, batch * per_step)
    for step in range(args.steps):
        timer.step(step)
        opt.zero_grad(set_to_none=True)
        for k in range(per_step):  # the planted part: pageable copies of pre-built batches
            i = (step * per_step + k) % kept
            x, y = batches[i].to(dev), labels[i].to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y) / per_step
            loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
