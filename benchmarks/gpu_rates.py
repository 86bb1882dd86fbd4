"""The rates the replay's transformations scale by, measured on this GPU: dense matmul TFLOP/s
in fp32, TF32, bf16 and fp16, and host-to-device bandwidth from pageable and pinned memory.

    python benchmarks/gpu_rates.py      # prints a JSON object; docs/performance.md keeps the figures
    python benchmarks/gpu_rates.py --curve   # also square matmuls from 256 to 8192: time per size and precision

Matmuls of 4096^3 and 8192^3 on random data (never zeros: they run faster), CUDA events, the
median of 20 after 5 warm-ups; copies of 256 MB, the median of 10.
"""

from __future__ import annotations

import json
import statistics

import torch


def _time_ms(fn, warmup: int = 5, repeat: int = 20) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def matmul_tflops(n: int, dtype: torch.dtype, tf32: bool = False) -> float:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ms = _time_ms(lambda: a @ b)
    torch.backends.cuda.matmul.allow_tf32 = False
    return 2 * n**3 / (ms / 1000) / 1e12


def h2d_gbs(pinned: bool, nbytes: int = 256 << 20) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    ms = _time_ms(lambda: dev.copy_(host, non_blocking=pinned), warmup=2, repeat=10)
    return nbytes / (ms / 1000) / 1e9


#: square sizes of ``--curve``: from launch-bound to the peak
CURVE_SIZES = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)


def matmul_ms(n: int, dtype: torch.dtype, tf32: bool = False) -> float:
    """One n x n matmul's kernel time, as a trace would show it: a CUDA graph of up to 200 of them
    back to back, timed between two events, so that neither the events' overhead (about 20 µs)
    nor the host's launches (about 5 µs each) hide a small matmul's time."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    batch = max(1, min(200, int(2e10 / n**3)))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            a @ b
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(batch):
            a @ b
    ms = _time_ms(graph.replay, warmup=2, repeat=7) / batch
    torch.backends.cuda.matmul.allow_tf32 = False
    return ms


def curve() -> dict[str, list[float]]:
    """Milliseconds of one n x n matmul per precision: how far below the datasheet ratio a
    mid-sized matmul's bf16/fp32 speedup falls."""
    out: dict[str, list[float]] = {"n": list(CURVE_SIZES), "fp32_ms": [], "tf32_ms": [], "bf16_ms": []}
    for n in CURVE_SIZES:
        out["fp32_ms"].append(round(matmul_ms(n, torch.float32), 5))
        out["tf32_ms"].append(round(matmul_ms(n, torch.float32, tf32=True), 5))
        out["bf16_ms"].append(round(matmul_ms(n, torch.bfloat16), 5))
    return out


def main() -> None:
    import sys

    props = torch.cuda.get_device_properties(0)
    out = {"device": props.name, "capability": f"{props.major}.{props.minor}", "torch": torch.__version__}
    for n in (4096, 8192):
        out[f"fp32_tflops_{n}"] = round(matmul_tflops(n, torch.float32), 1)
        out[f"tf32_tflops_{n}"] = round(matmul_tflops(n, torch.float32, tf32=True), 1)
        out[f"bf16_tflops_{n}"] = round(matmul_tflops(n, torch.bfloat16), 1)
        out[f"fp16_tflops_{n}"] = round(matmul_tflops(n, torch.float16), 1)
    out["h2d_pageable_gbs"] = round(h2d_gbs(False), 2)
    out["h2d_pinned_gbs"] = round(h2d_gbs(True), 2)
    if "--curve" in sys.argv[1:]:
        out["curve"] = curve()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
