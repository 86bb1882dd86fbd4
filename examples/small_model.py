"""Planted: nothing wrong, and far from the GPU's peak. A small language model (width 256, 4
layers, sequence 256, 1,024 sequences a step) done right: bf16 autocast, fused AdamW,
torch.compile, pinned and prefetched input from persistent workers, non_blocking copies, no
syncs in the loop. The GPU is busy, yet its matmuls are short (256-wide) and much of the step is
normalisation, softmax and the loss: MFU stays far under what a large model reaches. (At 128
sequences a step the H100 idled 55% of the step between 12 us kernels: launch-bound, LAUNCH002's
case, not this one.)
Expected diagnosis: no problem (no false alarm); next step NEXT002, which gives the MFU and the
kernel classes that hold the time and names no bottleneck.

``--eager`` leaves the model uncompiled (NEXT001 then says torch.compile, and FUSE001 may speak).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader

from _common import PlainTimer, device, parser
from well_tuned import LM, Tokens


def main() -> None:
    p = parser(__doc__, steps=300)
    p.add_argument("--eager", action="store_true", help="do not compile the model")
    p.add_argument("--batch-size", "--batch_size", type=int, default=1024)
    args = p.parse_args()
    dev = device()
    vocab, d, layers, batch, seq = (100, 64, 2, 4, 32) if args.small else (4096, 256, 4, args.batch_size, 256)
    data = DataLoader(Tokens(batch * args.steps, seq, vocab), batch_size=batch, num_workers=0 if args.small else 4,
                      pin_memory=dev.type == "cuda", persistent_workers=not args.small, prefetch_factor=None if args.small else 4)
    model = LM(vocab, d, layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    step_model = model if args.eager or args.small else torch.compile(model)
    timer = PlainTimer(args.time_steps, batch)
    for step, tokens in enumerate(data):
        timer.step(step)
        tokens = tokens.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = step_model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
