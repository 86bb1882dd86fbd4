"""The control: a well-tuned loop. bf16 autocast, fused AdamW, pinned and prefetched input
from persistent workers, non_blocking copies, no syncs in the loop, and a model big enough to
keep the GPU busy.
Expected diagnosis: no bottleneck (no false alarm); next step: torch.compile.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from _common import PlainTimer, device, parser


class Tokens(Dataset):
    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, self.vocab, (self.seq + 1,), generator=g)


class LM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, nhead=d // 64, dim_feedforward=4 * d, batch_first=True, dropout=0.0, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens), is_causal=False))


def main() -> None:
    args = parser(__doc__).parse_args()
    dev = device()
    vocab, d, layers, batch, seq = (100, 64, 2, 4, 32) if args.small else (8192, 1024, 8, 16, 512)
    data = DataLoader(Tokens(batch * args.steps, seq, vocab), batch_size=batch, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=4)
    model = LM(vocab, d, layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    running = torch.zeros((), device=dev)
    timer = PlainTimer(args.time_steps, batch)
    for step, tokens in enumerate(data):
        timer.step(step)
        tokens = tokens.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        running += loss.detach()
        if (step + 1) % 100 == 0:
            print(f"step {step + 1}: loss {running.item() / 100:.3f}")
            running.zero_()


if __name__ == "__main__":
    main()
