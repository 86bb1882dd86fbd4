"""Datasets and collators for the case study.

The datasets hand out lazily opened PIL images and the collators decode, convert and resize
them, as the book's pipeline does. Both run inside DataLoader workers, or in the main
process when ``num_workers=0``: that placement of the JPEG decode is what the num_workers
sweep of the case study measures, so nothing here pre-decodes or caches pixels.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from workloads.imagegen import DEFAULT_QUALITY, class_names, render_jpeg

# The extensions torchvision's ImageFolder accepts, so both readers see the same files.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# The book's collators call PIL's resize with its default filter, which is bicubic.
_RESAMPLE = Image.Resampling.BICUBIC

Sample = tuple[Image.Image, int]


def open_image(path: str) -> Image.Image:
    """Open an image without decoding it; the collator's ``convert`` does the decode."""
    return Image.open(path)


def find_classes(directory: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
    """Sorted class sub-folders and their indices (torchvision's ``find_classes`` rule)."""
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"no class folders in {directory}")
    return classes, {name: index for index, name in enumerate(classes)}


def make_samples(directory: str | os.PathLike[str], class_to_idx: dict[str, int]) -> list[tuple[str, int]]:
    """(path, class index) for every image file, in torchvision's ``make_dataset`` order."""
    samples = []
    for class_name in sorted(class_to_idx):
        class_dir = os.path.join(directory, class_name)
        for folder, _, file_names in sorted(os.walk(class_dir, followlinks=True)):
            for file_name in sorted(file_names):
                if file_name.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(folder, file_name), class_to_idx[class_name]))
    return samples


class ImageFolderDataset(torch.utils.data.Dataset):
    """Fallback for torchvision's ``DatasetFolder``: same classes, samples and item layout."""

    def __init__(self, root: str | os.PathLike[str], loader: Callable[[str], Image.Image] = open_image) -> None:
        self.root = str(root)
        self.loader = loader
        self.classes, self.class_to_idx = find_classes(root)
        self.samples = make_samples(root, self.class_to_idx)
        if not self.samples:
            raise FileNotFoundError(f"no images with extensions {IMG_EXTENSIONS} under {root}")
        self.targets = [target for _, target in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample:
        path, target = self.samples[index]
        return self.loader(path), target


def image_folder(root: str | os.PathLike[str]) -> torch.utils.data.Dataset:
    """torchvision's ``DatasetFolder`` when it imports, else ``ImageFolderDataset``.

    torchvision is imported here, not at module load, because a torchvision built for another
    torch fails on import (``operator torchvision::nms does not exist``); any such failure
    selects the fallback, which follows the same conventions.
    """
    try:
        from torchvision.datasets import DatasetFolder
    except Exception:  # noqa: BLE001 - a mismatched build raises RuntimeError, not ImportError
        return ImageFolderDataset(root)
    return DatasetFolder(str(root), loader=open_image, extensions=IMG_EXTENSIONS)


#: distinct images a synthetic set renders at most; a larger set repeats them (labels still cycle)
UNIQUE_IMAGES = 1024


class SyntheticJPEGDataset(torch.utils.data.Dataset):
    """In-memory JPEGs from ``workloads.imagegen``, decoded on every access.

    The bytes are generated once, up front (outside the timed loop); each ``__getitem__``
    returns a fresh, undecoded image so the decode and resize cost stays in the data path.
    Images are encoded at the training resolution: at 224 they cost what micro-224 files
    cost to decode, and a small-resolution CPU smoke run stays fast. At most ``UNIQUE_IMAGES``
    distinct images are rendered (a multiple of the classes, so that labels still cycle); a larger
    set repeats them: a sample costs the same to decode, and 12,288 samples at 224 px (the DDP
    scaling benchmark's 4 GPUs) no longer take minutes to render before the first step (34 ms
    an image on a 2-core machine).
    """

    def __init__(
        self, n_samples: int, n_classes: int, size: int, seed: int, split: str, quality: int = DEFAULT_QUALITY
    ) -> None:
        self.classes = class_names(n_classes)
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
        self.targets = [index % n_classes for index in range(n_samples)]
        unique = min(n_samples, max(n_classes, UNIQUE_IMAGES // n_classes * n_classes))
        self.images = [
            render_jpeg(seed, split, index % n_classes, index // n_classes, size, quality) for index in range(unique)
        ]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> Sample:
        if not -len(self.targets) <= index < len(self.targets):
            raise IndexError(f"sample {index} of {len(self.targets)}")
        return Image.open(io.BytesIO(self.images[index % len(self.images)])), self.targets[index]


def _decode_batch(samples: list[Sample], mode: str, resolution: int) -> tuple[np.ndarray, torch.Tensor]:
    """Decode + colour-convert + resize every image; return uint8 pixels and int64 labels."""
    size = (resolution, resolution)
    pixels = np.stack([np.asarray(image.convert(mode).resize(size, _RESAMPLE)) for image, _ in samples])
    labels = torch.tensor([label for _, label in samples], dtype=torch.int64)
    return pixels, labels


@dataclass(frozen=True)
class GrayscaleCollator:
    """The MLP's input: 1-channel ``resolution`` x ``resolution`` floats in [0, 1]."""

    resolution: int

    def __call__(self, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
        pixels, labels = _decode_batch(samples, "L", self.resolution)
        return torch.from_numpy(pixels).unsqueeze(1).float().div_(255.0), labels


@dataclass(frozen=True)
class RGBCollator:
    """The ViT's input: 3-channel floats normalised to [-1, 1] (ViTImageProcessor's 0.5/0.5)."""

    resolution: int

    def __call__(self, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
        pixels, labels = _decode_batch(samples, "RGB", self.resolution)
        channels_first = torch.from_numpy(pixels).permute(0, 3, 1, 2).contiguous()
        return channels_first.float().div_(127.5).sub_(1.0), labels


def split_dirs(dataset: str | os.PathLike[str]) -> tuple[Path, Path]:
    """``dataset/train`` and ``dataset/val``, with a clear error when either is missing."""
    root = Path(dataset)
    dirs = root / "train", root / "val"
    for split_dir in dirs:
        if not split_dir.is_dir():
            raise FileNotFoundError(
                f"{split_dir} is not a folder: --dataset must hold train/ and val/ class folders "
                "(make one with workloads/make_dataset.py) or be 'synthetic'"
            )
    return dirs
