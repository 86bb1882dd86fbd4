"""Planted: implicit host-GPU syncs, a per-layer `isfinite(x).all()` check in the forward.

A deep MLP checks after every layer that its activations are finite (`if not
torch.isfinite(x).all(): raise ...`) and logs the loss with `loss.item()`: 48 implicit syncs
(`bool()` of a GPU tensor) and one explicit one per step. Each waits for the GPU to drain its
queue and leaves it idle while the host launches the next layer. `item_every` reaches only the
`.item()`; the check is what costs.
Expected diagnosis: SYNC001 (`diagnose verify`: `--set unsync=implicit_syncs.py:29` measures
the check not blocking; it changes the program's meaning, so it is a measurement only).
"""

from __future__ import annotations

import torch
from torch import nn

from _common import PlainTimer, device, parser


class CheckedMLP(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
            if not torch.isfinite(x).all():  # the planted part: an implicit sync per layer
                raise FloatingPointError("non-finite activations")
        return self.head(x)


def main() -> None:
    args = parser(__doc__).parse_args()
    dev = device()
    width, depth, batch = (32, 4, 8) if args.small else (1024, 48, 512)
    model = CheckedMLP(width, depth).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    x = torch.randn(batch, width, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    timer = PlainTimer(args.time_steps, batch)
    for step in range(args.steps):
        timer.step(step)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()  # one explicit sync a step
        if step % 100 == 0:
            print(f"step {step}: loss {value:.4f}")


if __name__ == "__main__":
    main()
