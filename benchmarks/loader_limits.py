"""What limits a DataLoader's worker pipeline: the workers, or the main process receiving batches?

    python benchmarks/loader_limits.py                       # data_bound's JPEG dataset, 224x224, batch 128
    python benchmarks/loader_limits.py --workers 0 4 8 15 --batches 120 --out limits.json

For each worker count (and with pin_memory off and on) the loader is drained past its prefetch
queue and then timed: batches per second, the main process's CPU time per batch (the pin thread
included), the workers' CPU time per batch (read from /proc), and what the main process spends
on a received batch when it pins it or first reads it by hand. This is the measurement behind the
``more_workers`` transformation's bound on the main process (diagnose/analysis/prediction/predict.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
from data_bound import JpegImages  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import proc_stat  # noqa: E402


def cpu_s(pid: int) -> float:
    """user + system CPU seconds of one process (all its threads)."""
    return proc_stat(f"/proc/{pid}/stat")[1]


def measure(data: JpegImages, batch: int, workers: int, pin: bool, batches: int, by_hand: bool) -> dict:
    loader = DataLoader(
        data,
        batch_size=batch,
        num_workers=workers,
        pin_memory=pin and torch.cuda.is_available(),
        persistent_workers=workers > 0,
    )
    it = iter(loader)
    drain = 2 * 2 * workers + 2  # twice the prefetch queue (prefetch_factor 2 per worker)
    for _ in range(drain):
        next(it)
    pids = [w.pid for w in getattr(it, "_workers", [])]
    main0, workers0 = time.process_time(), sum(cpu_s(p) for p in pids)
    pin_s = touch_s = 0.0
    t0 = time.perf_counter()
    for _ in range(batches):
        x, _y = next(it)
        if by_hand:
            a = time.perf_counter()
            float(x[:, :, ::8, ::8].sum())  # first read of the received pages (a strided touch)
            b = time.perf_counter()
            x.pin_memory() if torch.cuda.is_available() else x.clone()
            touch_s += b - a
            pin_s += time.perf_counter() - b
    wall = time.perf_counter() - t0
    row = {
        "workers": workers,
        "pin_memory": pin,
        "by_hand": by_hand,
        "batches": batches,
        "batch_ms": 1e3 * wall / batches,
        "main_cpu_ms_per_batch": 1e3 * (time.process_time() - main0) / batches,
        "workers_cpu_ms_per_batch": 1e3 * (sum(cpu_s(p) for p in pids) - workers0) / batches if pids else None,
        "batch_mb": x.numel() * x.element_size() / 1e6,
    }
    if by_hand:
        row.update(touch_ms=1e3 * touch_s / batches, pin_or_copy_ms=1e3 * pin_s / batches)
    del it, loader
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[0, 4, 8, 15])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    data = JpegImages(args.batch * 10_000, args.size)
    rows = []
    for workers in args.workers:
        n = max(8, args.batches // 8) if workers == 0 else args.batches
        for pin, by_hand in ((False, False), (True, False), (False, True)):
            row = measure(data, args.batch, workers, pin, n, by_hand)
            rows.append(row)
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
