"""Planted: attention written by hand. A GPT-style decoder (bf16 autocast, fused AdamW, data on
the GPU) whose attention is ``softmax(q @ k.transpose(-2, -1) / sqrt(d) + causal mask) @ v``:
two batched matmuls around a sequence x sequence score matrix that is written, scaled, masked,
soft-maxed in fp32, cast back and kept for backward, layer after layer.
Expected diagnosis: ATTN001 (F.scaled_dot_product_attention).

``--sdpa`` is the fix (``diagnose verify ... --set arg.sdpa=flag`` measures it): the same
attention as one fused kernel (FlashAttention or cuDNN, picked by torch).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from _common import PlainTimer, device, parser


class Block(nn.Module):
    def __init__(self, d: int, heads: int, sdpa: bool) -> None:
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            out = scores.masked_fill(causal, float("-inf")).softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int, sdpa: bool) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.Sequential(*[Block(d, heads, sdpa) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens) + self.pos[: tokens.shape[1]]))


def main() -> None:
    p = parser(__doc__, steps=120)
    p.add_argument("--sdpa", action="store_true", help="the fix: F.scaled_dot_product_attention")
    args = p.parse_args()
    dev = device()
    vocab, d, heads, layers, batch, seq = (128, 64, 4, 2, 2, 32) if args.small else (8192, 1024, 16, 6, 8, 1024)
    model = GPT(vocab, d, heads, layers, seq, args.sdpa).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    tokens = torch.randint(0, vocab, (batch, seq + 1), device=dev)
    timer = PlainTimer(args.time_steps, batch)
    for step in range(args.steps):
        timer.step(step)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
