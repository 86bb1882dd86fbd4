"""Planted: a GPU-bound transformer in plain fp32, stepped by a closure-based optimizer.

``optimizer.step(closure)`` runs forward and backward inside the optimizer's step (as LBFGS
needs, and as Lightning's automatic optimization does): the phases must still say forward and
backward, not optimizer. The planted cause is the precision: every matmul runs in fp32.
``--lbfgs`` steps ``LBFGS`` instead of ``SGD``; ``--fixed`` autocasts the closure's forward to bf16.
Expected diagnosis: PREC001 (not OPT001: the optimizer's own work is small).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from _common import PlainTimer, device, parser


def main() -> None:
    p = parser(__doc__, steps=200)
    p.add_argument("--lbfgs", action="store_true", help="LBFGS (several closure calls per step)")
    p.add_argument("--fixed", action="store_true", help="bf16 autocast around the forward")
    args = p.parse_args()
    dev = device()
    d, layers, batch, seq = (64, 2, 4, 32) if args.small else (1024, 8, 16, 512)
    layer = nn.TransformerEncoderLayer(d, nhead=max(d // 64, 1), dim_feedforward=4 * d, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), nn.Linear(d, 1000)).to(dev)
    if args.lbfgs:
        opt: torch.optim.Optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2, history_size=4)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(batch, seq, d, device=dev)
    y = torch.randint(0, 1000, (batch, seq), device=dev)
    precision = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if args.fixed else contextlib.nullcontext

    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with precision():
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        return loss

    timer = PlainTimer(args.time_steps, batch)
    for step in range(args.steps):
        timer.step(step)
        opt.step(closure)


if __name__ == "__main__":
    main()
