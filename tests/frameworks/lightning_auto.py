"""Lightning automatic optimization on the CPU (tiny): ``training_step`` and ``backward`` run
inside ``optimizer.step(closure)``, with gradient clipping after the closure."""

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=20)
p.add_argument("--accelerator", default="cpu")
a = p.parse_args()


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


torch.manual_seed(0)
ds = TensorDataset(torch.randn(2048, 128), torch.randint(0, 10, (2048,)))
trainer = L.Trainer(
    max_epochs=a.epochs, accelerator=a.accelerator, devices=1, gradient_clip_val=1.0,
    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(Classifier(), DataLoader(ds, batch_size=64, shuffle=True))
