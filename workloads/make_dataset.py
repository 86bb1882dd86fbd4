"""Generate the case study's JPEG folders (micro-224, tiny-224) without downloading anything.

The book trains on ImageNet-derived 224x224 JPEG folders. These stand-ins keep what the
measurements depend on: the folder layout (``ROOT/train/<class>/<name>.JPEG`` and
``ROOT/val/<class>/<name>.JPEG``, wnid-like class names, the layout of the book's
Chapters 11-12 archive, so a real archive is a drop-in replacement), the image count and
the per-image decode cost (textured images of about 24 KB at quality 90, see
``workloads/imagegen.py``), and a class signal a model can learn.

    python workloads/make_dataset.py --preset micro-224 --out datasets/micro-224
    python workloads/make_dataset.py --preset tiny-224 --out datasets/tiny-224 --workers 16
    python workloads/make_dataset.py --preset tiny-224 --classes 20 --per_class 100   # a subset

Every image is a pure function of (seed, split, class, index), so the output is
byte-for-byte reproducible and a subset (--classes/--per_class) holds the same files as the
full preset. Files are written to a hidden temporary name and renamed into place, so an
interrupted run never leaves a truncated JPEG, and a re-run only generates missing files.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

# Make ``workloads`` importable when this file is run by path.
_REPO_ROOT = str(Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from workloads.imagegen import DEFAULT_QUALITY, class_names, render_jpeg  # noqa: E402

T = TypeVar("T")


@dataclass(frozen=True)
class Preset:
    """Image counts and size of one dataset variant."""

    classes: int
    per_class: int
    val_per_class: int
    resolution: int = 224


PRESETS = {
    # 200 classes x 64 = 12,800 training images: 100 batches of 128, as in the book's runs.
    "micro-224": Preset(classes=200, per_class=64, val_per_class=10),
    "tiny-224": Preset(classes=200, per_class=500, val_per_class=50),
    # For tests: a handful of full-size images per class.
    "smoke": Preset(classes=4, per_class=8, val_per_class=2),
}


@dataclass(frozen=True)
class Task:
    """One file to generate."""

    path: str
    split: str
    class_idx: int
    index: int
    resolution: int
    quality: int
    seed: int


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line; unset counts and sizes come from the preset."""
    parser = argparse.ArgumentParser(description="Generate a synthetic ImageNet-style JPEG folder dataset.")
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="micro-224",
        help="dataset variant whose counts and size are the defaults (default: %(default)s)",
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: datasets/<preset>)")
    parser.add_argument(
        "--classes",
        type=int,
        default=None,
        help="number of classes, the first N of the preset's (default: the preset's)",
    )
    parser.add_argument("--per_class", type=int, default=None, help="training images per class (default: the preset's)")
    parser.add_argument(
        "--val_per_class", type=int, default=None, help="validation images per class (default: the preset's)"
    )
    parser.add_argument(
        "--resolution", type=int, default=None, help="image side in pixels (default: the preset's, 224)"
    )
    parser.add_argument(
        "--quality", type=int, default=DEFAULT_QUALITY, help="JPEG quality, 1-95 (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="dataset seed; same seed, same bytes (default: %(default)s)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="generator processes (default: the number of CPUs, %(default)s)",
    )
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    for name in ("classes", "per_class", "val_per_class", "resolution"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(preset, name))
    if args.out is None:
        args.out = Path("datasets") / args.preset
    if min(args.classes, args.per_class, args.resolution, args.workers) < 1 or args.val_per_class < 0:
        parser.error("--classes, --per_class, --resolution and --workers must be positive, --val_per_class >= 0")
    if not 1 <= args.quality <= 95:
        parser.error("--quality must be between 1 and 95")
    return args


def plan(args: argparse.Namespace) -> list[Task]:
    """Every file of the dataset, creating the class folders on the way."""
    tasks = []
    for split, count in (("train", args.per_class), ("val", args.val_per_class)):
        for class_idx, name in enumerate(class_names(args.classes)):
            folder = args.out / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(count):
                path = str(folder / f"{name}_{index:05d}.JPEG")
                tasks.append(Task(path, split, class_idx, index, args.resolution, args.quality, args.seed))
    return tasks


def generate_file(task: Task) -> tuple[int, float]:
    """Render one JPEG and move it into place atomically; returns (bytes, seconds)."""
    start = time.perf_counter()
    data = render_jpeg(task.seed, task.split, task.class_idx, task.index, task.resolution, task.quality)
    folder, name = os.path.split(task.path)
    temporary = os.path.join(folder, f".{name}.tmp")  # hidden, and not an image extension
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.replace(temporary, task.path)
    return len(data), time.perf_counter() - start


def progress(items: Iterable[T], total: int, description: str) -> Iterable[T]:
    """A tqdm or rich progress bar when one is installed, else a line every 10%."""
    try:
        from tqdm import tqdm
    except ImportError:
        pass
    else:
        return tqdm(items, total=total, desc=description, unit="img")
    try:
        from rich.progress import track
    except ImportError:
        return _plain_progress(items, total, description)
    return track(items, total=total, description=description)


def _plain_progress(items: Iterable[T], total: int, description: str) -> Iterator[T]:
    step = max(1, total // 10)
    for done, item in enumerate(items, start=1):
        if done % step == 0 or done == total:
            print(f"{description}: {done}/{total}", file=sys.stderr, flush=True)
        yield item


def run(pending: list[Task], workers: int) -> list[tuple[int, float]]:
    """Generate ``pending`` in ``workers`` processes (in this one when a pool cannot help)."""
    if not pending:
        return []
    if workers == 1 or len(pending) == 1:
        return list(progress(map(generate_file, pending), len(pending), "generating"))
    chunksize = max(1, min(64, len(pending) // (workers * 8)))
    with multiprocessing.Pool(workers) as pool:
        results = pool.imap_unordered(generate_file, pending, chunksize=chunksize)
        return list(progress(results, len(pending), "generating"))


def main(argv: list[str] | None = None) -> int:
    """Generate the missing files of the requested dataset and print a summary line."""
    args = parse_args(argv)
    tasks = plan(args)
    pending = [task for task in tasks if not os.path.exists(task.path)]
    workers = min(args.workers, max(len(pending), 1))
    start = time.perf_counter()
    results = run(pending, workers)
    elapsed = time.perf_counter() - start
    skipped = len(tasks) - len(pending)
    summary = f"{args.out}: {len(tasks)} images, wrote {len(pending)}, skipped {skipped} already present"
    if results:
        mean_kb = sum(size for size, _ in results) / len(results) / 1000
        mean_ms = 1000 * sum(seconds for _, seconds in results) / len(results)
        summary += f"; {mean_kb:.1f} KB and {mean_ms:.1f} ms per image, {elapsed:.1f} s with {workers} workers"
    print(summary, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
