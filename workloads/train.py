"""Configurable image-classification training: the book's single-GPU / DDP case study.

Trains the custom MLP (grayscale, flattened) or ViT-H/14 (RGB) on a folder of JPEGs
(``DATASET/train/<class>/*.JPEG`` and ``DATASET/val/<class>/*.JPEG``, see make_dataset.py)
or on ``--dataset synthetic`` (in-memory JPEGs, no files), and prints the book's log: the
config block, per-epoch training throughput, validation accuracy, the complete training
time, the throughput excluding the first (warm-up) epoch and the peak GPU memory reserved.

Run it alone (one device) or under torchrun (DDP: one process per GPU, a DistributedSampler
per process, NCCL on CUDA and gloo on CPU; only rank 0 prints; throughputs are summed over
ranks)::

    python workloads/train.py --model_name custom --dataset datasets/micro-224 --num_workers 8
    torchrun --nproc_per_node=4 workloads/train.py --model_name vit --dataset datasets/tiny-224 \\
        --batch_size 128 --mixed_precision bf16 --compile

A small run that finishes in seconds on a CPU-only machine, with nothing to download::

    python workloads/train.py --model_name custom --dataset synthetic --resolution 32 \\
        --intermidiate_dimensions 256 128 --batch_size 32 --num_epochs 2

The defaults are the book's (batch size 64, 5 epochs, 224 pixels, the full-size models).
Flags that are ours, not the book's: --max_steps and --synthetic_samples (short, file-free
measurement runs), --pin_memory (off, as in the book's baseline), --compile_mode,
--fused_optimizer and --seed. ``--iteration_logging`` alone logs the loss every step;
``--iteration_logging N`` every N steps, as in the book's job scripts.

Exit codes: 0 on success, 2 on a usage error (including --pretrained: weights are never
downloaded), 3 when CUDA runs out of memory (one line "CUDA out of memory at batch size N",
so that a batch-size sweep can stop).

The script is safe to run in-process with ``runpy.run_path(path, run_name="__main__")``:
it changes no working directory, keeps no state between runs, builds its loaders with
``torch.utils.data.DataLoader`` and steps a stock ``torch.optim`` optimizer.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# Make ``workloads`` importable when this file is run by path (python, torchrun, runpy):
# DataLoader workers unpickle the dataset and collator classes by that module name.
_REPO_ROOT = str(Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from workloads.data import GrayscaleCollator, RGBCollator, SyntheticJPEGDataset, image_folder, split_dirs  # noqa: E402
from workloads.models import (  # noqa: E402
    DEFAULT_MLP_DIMS,
    ViTClassifier,
    build_custom_mlp,
    count_parameters,
    vit_config,
)

# Few classes, so that a short CPU run shows learning: at 32 px the small MLP example with
# --optimizer adamw --learning_rate 1e-3 reaches about 20% after 5 epochs (chance: 10%).
SYNTHETIC_CLASSES = 10
# Validation images per training image for --dataset synthetic (micro-224 has 2000 / 12800).
SYNTHETIC_VAL_FRACTION = 0.25
OOM_EXIT_CODE = 3
_GIB = 1024**3
_EPILOG = """\
small CPU run (seconds, nothing to download):
  python workloads/train.py --model_name custom --dataset synthetic --resolution 32 \\
      --intermidiate_dimensions 256 128 --batch_size 32 --num_epochs 2

flags added to the book's interface: --max_steps, --synthetic_samples, --pin_memory,
--compile_mode, --fused_optimizer, --seed.  Exit codes: 2 usage error (also --pretrained),
3 CUDA out of memory ("CUDA out of memory at batch size N")."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The book's command-line interface, plus the measurement flags described above."""
    parser = argparse.ArgumentParser(
        description="Train the book's custom MLP or ViT-H/14 on a JPEG folder or synthetic data, and log throughput.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--model_name",
        required=True,
        choices=["custom", "vit"],
        help="custom: the dense MLP on grayscale images; vit: ViT-H/14 on RGB images",
    )
    add(
        "--dataset",
        required=True,
        help="folder with train/ and val/ class sub-folders of images, or 'synthetic' for in-memory JPEGs (no files)",
    )
    add("--num_epochs", type=int, default=5, help="number of training epochs (default: %(default)s)")
    add("--batch_size", type=int, default=64, help="training batch size per process (default: %(default)s)")
    add("--eval_batch_size", type=int, default=64, help="validation batch size per process (default: %(default)s)")
    add(
        "--num_workers",
        type=int,
        default=0,
        help="DataLoader worker processes; 0 decodes the JPEGs in the training process (default: %(default)s)",
    )
    add(
        "--optimizer",
        type=str.lower,
        default="sgd",
        choices=["sgd", "adam", "adamw"],
        help="optimizer, case-insensitive (default: %(default)s)",
    )
    add("--learning_rate", type=float, default=5e-4, help="learning rate (default: %(default)s)")
    add(
        "--mixed_precision",
        choices=["fp16", "bf16"],
        default=None,
        help="autocast dtype; fp16 adds a gradient scaler (default: fp32, no autocast)",
    )
    add("--compile", action="store_true", help="compile the model with torch.compile; logs the first step's time")
    add(
        "--compile_mode",
        choices=["default", "reduce-overhead", "max-autotune"],
        default="default",
        help="torch.compile mode when --compile is given (default: %(default)s)",
    )
    add(
        "--iteration_logging",
        type=int,
        nargs="?",
        const=1,
        default=None,
        metavar="N",
        help="log the training loss every N steps (every step when N is omitted); off by default, "
        "because reading the loss waits for the GPU",
    )
    add(
        "--epochs_eval",
        type=int,
        default=5,
        metavar="N",
        help="validate every N epochs and after the last one; 0 never validates (default: %(default)s)",
    )
    add("--resolution", type=int, default=224, help="side in pixels the images are resized to (default: %(default)s)")
    add(
        "--intermidiate_dimensions",
        "--intermediate_dimensions",
        type=int,
        nargs="+",
        default=None,
        metavar="DIM",
        help="hidden sizes of the custom MLP, in the book's spelling "
        f"(default: {' '.join(map(str, DEFAULT_MLP_DIMS))})",
    )
    add("--pretrained", action="store_true", help="not supported: the workloads never download weights (exit code 2)")
    add(
        "--pin_memory",
        action="store_true",
        help="pin host memory in the DataLoaders and copy with non_blocking=True (off, as in the book's baseline)",
    )
    add(
        "--fused_optimizer",
        action="store_true",
        help="construct the optimizer with fused=True instead of PyTorch's default implementation choice",
    )
    add(
        "--max_steps",
        type=int,
        default=None,
        metavar="N",
        help="stop after N optimizer steps in total, for short measurement runs (default: run every epoch)",
    )
    add(
        "--synthetic_samples",
        type=int,
        default=1024,
        metavar="N",
        help=f"training images for --dataset synthetic; validation gets {SYNTHETIC_VAL_FRACTION:g} as many "
        "(default: %(default)s)",
    )
    add(
        "--seed",
        type=int,
        default=0,
        help="seed for model initialisation, shuffling and synthetic images (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.pretrained:
        parser.error(
            "--pretrained is not supported: the workloads never download weights; "
            "models start from random initialisation"
        )
    for name in ("num_epochs", "batch_size", "eval_batch_size", "resolution", "synthetic_samples", "max_steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be at least 1")
    if args.dataset != "synthetic":
        try:
            split_dirs(args.dataset)
        except FileNotFoundError as error:
            parser.error(str(error))
    return args


@dataclass(frozen=True)
class Cluster:
    """This process's place in the job: torchrun's RANK/LOCAL_RANK/WORLD_SIZE, or a lone process."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    distributed: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        """Sum ``values`` over ranks (identity when running alone)."""
        if not self.distributed:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        summed = tensor.tolist()
        if dist.get_backend() == "gloo":
            released_by_backend(tensor)
        return summed


def released_by_backend(tensor: torch.Tensor, timeout_s: float = 5.0) -> None:
    """Return once no thread of the process group holds ``tensor`` any more (or after ``timeout_s``).

    Gloo's worker thread drops a finished collective a moment after ``wait`` returns. If Python
    has dropped the tensor by then, that drop must take the GIL to free the tensor's Python
    object; during interpreter shutdown the thread cannot, and the process aborts ("terminate
    called without an active exception", SIGABRT after training, about 1 run in 30 on the CPU).
    Keeping the tensor until the collective's own references are gone leaves nothing for the
    worker thread to free but C++ references.
    """
    deadline = time.monotonic() + timeout_s
    while tensor._use_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.001)  # releases the GIL, which the worker thread may be waiting for


def init_cluster() -> Cluster:
    """Join the process group when launched by torchrun (WORLD_SIZE set), else run alone."""
    if "WORLD_SIZE" not in os.environ:
        return Cluster()
    cluster = Cluster(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ["WORLD_SIZE"]),
        distributed=True,
    )
    if torch.cuda.is_available():
        torch.cuda.set_device(cluster.local_rank)
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return cluster


class Logger:
    """The book's log format (``[date] INFO - message``), printed by rank 0 only."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[{time.strftime('%m/%d/%Y %I:%M:%S %p')}] INFO - {message}", flush=True)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that wall-clock timers measure finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


Datasets = tuple[torch.utils.data.Dataset, torch.utils.data.Dataset]


def load_datasets(args: argparse.Namespace, log: Logger) -> Datasets:
    """Training and validation datasets from the folder, or generated for ``synthetic``."""
    if args.dataset == "synthetic":
        return synthetic_datasets(args, log)
    train_dir, val_dir = split_dirs(args.dataset)
    train_set, val_set = image_folder(train_dir), image_folder(val_dir)
    if train_set.classes != val_set.classes:
        raise SystemExit(f"train.py: error: {train_dir} and {val_dir} hold different class folders")
    return train_set, val_set


def synthetic_datasets(args: argparse.Namespace, log: Logger) -> Datasets:
    """In-memory JPEG datasets, generated before any timer starts."""
    start = time.perf_counter()
    n_val = max(1, round(args.synthetic_samples * SYNTHETIC_VAL_FRACTION))
    train_set = SyntheticJPEGDataset(args.synthetic_samples, SYNTHETIC_CLASSES, args.resolution, args.seed, "train")
    val_set = SyntheticJPEGDataset(n_val, SYNTHETIC_CLASSES, args.resolution, args.seed, "val")
    seconds = time.perf_counter() - start
    log(f"Synthetic dataset: {len(train_set)} training + {len(val_set)} validation JPEGs generated in {seconds:.2f} s")
    return train_set, val_set


def build_model(args: argparse.Namespace, n_classes: int, device: torch.device) -> nn.Module:
    """The requested model, initialised directly on ``device`` (fast for half a billion weights)."""
    with device:
        if args.model_name == "custom":
            return build_custom_mlp(args.resolution, n_classes, args.intermidiate_dimensions or DEFAULT_MLP_DIMS)
        return ViTClassifier(vit_config(args.resolution, n_classes))


def wrap_model(model: nn.Module, args: argparse.Namespace, cluster: Cluster, device: torch.device) -> nn.Module:
    """DDP when distributed, then torch.compile when asked (the book's order)."""
    if cluster.distributed:
        device_ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    if args.compile:
        model = torch.compile(model, mode=None if args.compile_mode == "default" else args.compile_mode)
    return model


def make_optimizer(args: argparse.Namespace, model: nn.Module) -> torch.optim.Optimizer:
    """A stock torch.optim optimizer, with PyTorch's default foreach/fused choice unless --fused_optimizer."""
    optimizers = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    implementation = {"fused": True} if args.fused_optimizer else {}
    return optimizers[args.optimizer](model.parameters(), lr=args.learning_rate, **implementation)


def make_loader(
    dataset: torch.utils.data.Dataset,
    batch_size: int,
    train: bool,
    args: argparse.Namespace,
    cluster: Cluster,
    device: torch.device,
) -> torch.utils.data.DataLoader:
    """A DataLoader whose collator decodes the images; sharded by a DistributedSampler under DDP.

    --pin_memory only applies to CUDA: there is no device memory to pin for on a CPU run.
    """
    sampler = None
    if cluster.distributed:
        sampler = torch.utils.data.distributed.DistributedSampler(
            dataset, num_replicas=cluster.world_size, rank=cluster.rank, shuffle=train, seed=args.seed, drop_last=train
        )
    collate = GrayscaleCollator(args.resolution) if args.model_name == "custom" else RGBCollator(args.resolution)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=train and sampler is None,
        sampler=sampler,
        num_workers=args.num_workers,
        collate_fn=collate,
        pin_memory=args.pin_memory and device.type == "cuda",
    )


@dataclass(frozen=True)
class Precision:
    """Autocast dtype (None: fp32, no autocast) and the gradient scaler that fp16 needs."""

    device: torch.device
    dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None

    @classmethod
    def from_flag(cls, flag: str | None, device: torch.device) -> Precision:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(flag or "")
        scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        return cls(device, dtype, scaler)

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)


@dataclass
class Trainer:
    """One training run: the step, the epoch loop, validation and the book's measurements."""

    args: argparse.Namespace
    model: nn.Module
    optimizer: torch.optim.Optimizer
    precision: Precision
    device: torch.device
    cluster: Cluster
    log: Logger
    steps: int = 0

    def batches(self, loader: torch.utils.data.DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches moved to the device; asynchronous copies only from pinned memory."""
        non_blocking = self.args.pin_memory and self.device.type == "cuda"
        for inputs, labels in loader:
            yield inputs.to(self.device, non_blocking=non_blocking), labels.to(self.device, non_blocking=non_blocking)

    def step(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """zero_grad, forward, backward, optimizer step; the loss stays on the device."""
        self.optimizer.zero_grad(set_to_none=True)
        with self.precision.autocast():
            loss = F.cross_entropy(self.model(inputs), labels)
        scaler = self.precision.scaler
        if scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(self.optimizer)
            scaler.update()
        return loss

    def done(self) -> bool:
        """Whether --max_steps optimizer steps have run."""
        return self.args.max_steps is not None and self.steps >= self.args.max_steps

    def train_epoch(self, epoch: int, loader: torch.utils.data.DataLoader) -> tuple[int, float]:
        """One epoch, or until --max_steps; returns this rank's (images, seconds)."""
        self.model.train()
        every = self.args.iteration_logging
        images = 0
        synchronize(self.device)
        start = time.perf_counter()
        for inputs, labels in self.batches(loader):
            step_start = time.perf_counter()
            loss = self.step(inputs, labels)
            if self.args.compile and self.steps == 0:
                synchronize(self.device)
                self.log(f"Compile time (first step): {time.perf_counter() - step_start:.2f} s")
            self.steps += 1
            images += labels.shape[0]
            if every and self.log.enabled and self.steps % every == 0:
                self.log(f"[EPOCH: {epoch}] [STEP: {self.steps}] Loss: {loss.item():.4f}")
            if self.done():
                break
        synchronize(self.device)
        return images, time.perf_counter() - start

    @torch.no_grad()
    def evaluate(self, epoch: int, loader: torch.utils.data.DataLoader) -> None:
        """Top-1 accuracy over the validation set; counts and throughput summed over ranks."""
        self.model.eval()
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        total = 0
        synchronize(self.device)
        start = time.perf_counter()
        for inputs, labels in self.batches(loader):
            with self.precision.autocast():
                logits = self.model(inputs)
            correct += (logits.argmax(dim=1) == labels).sum()
            total += labels.shape[0]
        synchronize(self.device)
        rate = total / (time.perf_counter() - start)
        n_correct, n_total, rate = self.cluster.sum([float(correct.item()), float(total), rate], self.device)
        accuracy = n_correct / max(n_total, 1.0)
        self.log(f"[EPOCH: {epoch}] Accuracy: {accuracy:.4f} | Validation throughput: {rate:.1f} img/s")

    def run(self, train_loader: torch.utils.data.DataLoader, val_loader: torch.utils.data.DataLoader) -> None:
        """All epochs with periodic validation, then the summary lines."""
        args = self.args
        history: list[tuple[int, float]] = []
        start = time.perf_counter()
        for epoch in range(1, args.num_epochs + 1):
            if isinstance(train_loader.sampler, torch.utils.data.distributed.DistributedSampler):
                train_loader.sampler.set_epoch(epoch)
            images, seconds = self.train_epoch(epoch, train_loader)
            history.append((images, seconds))
            (rate,) = self.cluster.sum([images / seconds], self.device)
            local = f"{images} images in {seconds:.2f} s" + (" on rank 0" if self.cluster.distributed else "")
            self.log(f"[EPOCH: {epoch}] Training throughput: {rate:.1f} img/s ({local})")
            if args.epochs_eval > 0 and (epoch % args.epochs_eval == 0 or epoch == args.num_epochs or self.done()):
                self.evaluate(epoch, val_loader)
            if self.done():
                self.log(f"Stopping after --max_steps {args.max_steps} optimizer steps")
                break
        self.summarize(history, time.perf_counter() - start)

    def summarize(self, history: list[tuple[int, float]], total_seconds: float) -> None:
        """Complete training time, steady-state throughput and peak GPU memory reserved."""
        self.log(f"Complete training time: {total_seconds:.2f} s")
        if len(history) > 1:
            images = sum(n for n, _ in history[1:])
            seconds = sum(s for _, s in history[1:])
            (rate,) = self.cluster.sum([images / seconds], self.device)
            self.log(f"Training throughput excluding first epoch: {rate:.1f} img/s")
        else:
            self.log("Training throughput excluding first epoch: n/a (only one epoch ran)")
        if self.device.type == "cuda":
            self.log(f"GPU memory reserved: {torch.cuda.max_memory_reserved(self.device) / _GIB:.2f} GB")
        else:
            self.log(f"GPU memory reserved: n/a (device is {self.device.type})")


def log_config(log: Logger, args: argparse.Namespace, derived: dict[str, object]) -> None:
    """The book's config block: every argument, then what the script derived from them."""
    log("############# Config #############")
    for key, value in [*vars(args).items(), *derived.items()]:
        log(f"### {key}: {value}")
    log("##################################")


def train(args: argparse.Namespace, cluster: Cluster) -> None:
    """Build data, model and optimizer, print the config block, then train."""
    device = torch.device("cuda", cluster.local_rank) if torch.cuda.is_available() else torch.device("cpu")
    log = Logger(cluster.is_main)
    torch.manual_seed(args.seed)
    train_set, val_set = load_datasets(args, log)
    model = build_model(args, len(train_set.classes), device)
    n_parameters = count_parameters(model)
    model = wrap_model(model, args, cluster, device)
    optimizer = make_optimizer(args, model)
    train_loader = make_loader(train_set, args.batch_size, True, args, cluster, device)
    val_loader = make_loader(val_set, args.eval_batch_size, False, args, cluster, device)
    precision = Precision.from_flag(args.mixed_precision, device)
    per_process = " per process" if cluster.world_size > 1 else ""
    derived = {
        "Device": device,
        "World size": cluster.world_size,
        "AMP Enabled": precision.dtype is not None,
        "Number of classes": len(train_set.classes),
        "Total number of parameters": f"{n_parameters / 1e6:.1f}M ({n_parameters})",
        f"Total training samples (batches){per_process}": f"{len(train_loader.sampler)} ({len(train_loader)})",
        f"Total validation samples (batches){per_process}": f"{len(val_loader.sampler)} ({len(val_loader)})",
    }
    log_config(log, args, derived)
    Trainer(args, model, optimizer, precision, device, cluster, log).run(train_loader, val_loader)


def main(argv: list[str] | None = None) -> None:
    """Parse, train, tear down; on CUDA out-of-memory print one line and exit with code 3."""
    args = parse_args(argv)
    cluster = init_cluster()
    out_of_memory = False
    try:
        train(args, cluster)
        if cluster.distributed:
            dist.barrier()  # no rank tears its connections down while another still uses them
    except torch.cuda.OutOfMemoryError:
        out_of_memory = True
    finally:
        if cluster.distributed:
            dist.destroy_process_group()
    if out_of_memory:  # after the handler, so the failed step's tensors are released first
        torch.cuda.empty_cache()
        print(f"CUDA out of memory at batch size {args.batch_size}", flush=True)
        raise SystemExit(OOM_EXIT_CODE)


if __name__ == "__main__":
    main()
