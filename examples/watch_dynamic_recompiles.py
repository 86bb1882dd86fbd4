"""Planted for diagnose watch: torch.compile recompiling on dynamic shapes.

A compiled model (dynamic=False) sees sequences of a new length every few steps (variable-length
text without padding to fixed sizes): each new length fails dynamo's shape guard and compiles
again, until the recompile limit, where dynamo falls back to eager for that frame.
Expected whole-run finding: WHOLE006 (mark_dynamic, dynamic=True, or padding to a few lengths).
"""

from __future__ import annotations

import torch
from torch import nn

from _common import device, parser


class Tagger(nn.Module):
    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.out = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        return self.out(h + self.mix(h))


def main() -> None:
    p = parser(__doc__, steps=240)
    p.add_argument("--lengths", type=int, default=4, help="distinct sequence lengths")
    p.add_argument("--backend", default=None, help="torch.compile backend (default: inductor on a GPU, aot_eager on the CPU)")
    args = p.parse_args()
    dev = device()
    vocab, width, batch = (1000, 64, 8) if args.small else (32000, 1024, 32)
    backend = args.backend or ("inductor" if dev.type == "cuda" else "aot_eager")
    model = torch.compile(Tagger(vocab, width).to(dev), dynamic=False, backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = [64 + 16 * i for i in range(args.lengths)]
    per_length = max(1, args.steps // len(lengths))
    for step in range(args.steps):
        seq = lengths[min(step // per_length, len(lengths) - 1)]
        tokens = torch.randint(0, vocab, (batch, seq), device=dev)
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
