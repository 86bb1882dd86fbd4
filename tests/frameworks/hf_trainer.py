"""A Hugging Face Trainer run on the CPU, on a tiny GPT-2 built from a config (no downloads)."""

import argparse

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--grad-accum", type=int, default=1)
p.add_argument("--out", default="/tmp/diagnose-hf-trainer")
p.add_argument("--gpu", action="store_true")
a = p.parse_args()


class RandomTokens(Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64)
torch.manual_seed(0)
model = GPT2LMHeadModel(config)
args = TrainingArguments(
    output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=8,
    gradient_accumulation_steps=a.grad_accum, max_grad_norm=1.0, learning_rate=1e-3,
    logging_steps=1000, save_strategy="no", report_to=[], use_cpu=not a.gpu, dataloader_num_workers=0,
    disable_tqdm=True,
)
Trainer(model=model, args=args, train_dataset=RandomTokens(4096, 32, 512)).train()
