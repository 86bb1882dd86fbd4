"""Planted: a GPU-bound transformer trained under PyTorch Lightning in plain fp32.

A LightningModule (automatic optimization: Lightning runs ``training_step`` and ``backward``
inside ``optimizer.step(closure)``) with the Trainer's default precision, "32-true": every matmul
runs in fp32 on CUDA cores and the Tensor Cores sit unused. ``--fixed`` trains with
``Trainer(precision="bf16-mixed")``.
Expected diagnosis: PREC001, written as ``Trainer(precision="bf16-mixed")``.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _common import PlainTimer, parser


class TokenClassifier(L.LightningModule):
    def __init__(self, d: int, layers: int, classes: int = 1000) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, nhead=max(d // 64, 1), dim_feedforward=4 * d, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.head(self.encoder(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class TimerCallback(L.Callback):
    def __init__(self, timer: PlainTimer) -> None:
        self.timer = timer

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: object, batch_idx: int) -> None:
        self.timer.step(trainer.global_step)


def main() -> None:
    p = parser(__doc__, steps=200)
    p.add_argument("--fixed", action="store_true", help='train with precision="bf16-mixed"')
    args = p.parse_args()
    d, layers, batch, seq = (64, 2, 4, 32) if args.small else (1024, 8, 16, 512)
    n = batch * 8  # a few distinct batches, epochs of 8 steps (full size: 268 MB of inputs)
    data = TensorDataset(torch.randn(n, seq, d), torch.randint(0, 1000, (n, seq)))
    loader = DataLoader(data, batch_size=batch, shuffle=True, num_workers=0 if args.small else 2, pin_memory=torch.cuda.is_available(),
                        persistent_workers=not args.small)
    trainer = L.Trainer(
        max_steps=args.steps,
        precision="bf16-mixed" if args.fixed else "32-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[TimerCallback(PlainTimer(args.time_steps, batch))],
    )
    trainer.fit(TokenClassifier(d, layers), loader)


if __name__ == "__main__":
    main()
