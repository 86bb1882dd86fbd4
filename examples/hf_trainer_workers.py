"""Planted: a Hugging Face Trainer whose Dataset tokenizes in Python, with no DataLoader workers.

A small GPT-2 built from a ``GPT2Config`` (nothing is downloaded) trains on text generated in
the process; each sample is tokenized by a slow pure-Python loop in ``__getitem__``, and
``TrainingArguments(dataloader_num_workers=0)`` (the default) makes the main process do it while
the GPU waits. ``--fixed`` sets ``dataloader_num_workers``, ``dataloader_persistent_workers``.
Expected diagnosis: DATA001, written as ``TrainingArguments(dataloader_num_workers=N, ...)``
(on a CPU-only run of a few cores: DATA007).
"""

from __future__ import annotations

import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from _common import PlainTimer, parser


class SlowTokenizedText(Dataset):
    """Random 'sentences' turned into token ids by a deliberately slow Python tokenizer."""

    def __init__(self, samples: int, seq: int, vocab: int, rounds: int) -> None:
        self.samples, self.seq, self.vocab, self.rounds = samples, seq, vocab, rounds

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = [(i * 7919 + t * 104729) % self.vocab for t in range(self.seq)]
        for r in range(self.rounds):  # the planted cost: merges done one token at a time
            ids = [(a * 31 + b + r) % self.vocab for a, b in zip(ids, ids[1:] + ids[:1], strict=True)]
        tokens = torch.tensor(ids)
        return {"input_ids": tokens, "labels": tokens}


class TimerCallback(TrainerCallback):
    def __init__(self, timer: PlainTimer) -> None:
        self.timer = timer

    def on_step_begin(self, args: TrainingArguments, state: object, control: object, **kwargs: object) -> None:
        self.timer.step(state.global_step)  # type: ignore[attr-defined]


def main() -> None:
    p = parser(__doc__, steps=200)
    p.add_argument("--fixed", action="store_true", help="load with DataLoader workers")
    args = p.parse_args()
    layers, d, seq, batch, rounds = (1, 32, 32, 2, 6000) if args.small else (4, 512, 256, 16, 60)
    config = GPT2Config(n_layer=layers, n_embd=d, n_head=max(d // 64, 1), n_positions=seq, vocab_size=8192, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    workers = 4 if args.fixed else 0
    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=batch,
            learning_rate=3e-4,
            dataloader_num_workers=workers,
            dataloader_persistent_workers=workers > 0,
            dataloader_pin_memory=torch.cuda.is_available(),
            save_strategy="no",
            report_to="none",
            logging_steps=50,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=SlowTokenizedText(batch * (args.steps + 8), seq, config.vocab_size, rounds),
            callbacks=[TimerCallback(PlainTimer(args.time_steps, batch))],
        )
        trainer.train()


if __name__ == "__main__":
    main()
