"""The rates the replay's transformations scale by, measured on this GPU: dense matmul TFLOP/s
in fp32, TF32, bf16 and fp16, and host-to-device bandwidth from pageable and pinned memory.

    python benchmarks/gpu_rates.py      # prints a JSON object; docs/performance.md keeps the figures

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


def main() -> None:
    props = torch.cuda.get_device_properties(0)
    out = {"device": props.name, "capability": f"{props.major}.{props.minor}", "torch": torch.__version__}
    for n in (4096, 8192):
        out[f"fp32_tflops_{n}"] = round(matmul_tflops(n, torch.float32), 1)
        out[f"tf32_tflops_{n}"] = round(matmul_tflops(n, torch.float32, tf32=True), 1)
        out[f"bf16_tflops_{n}"] = round(matmul_tflops(n, torch.bfloat16), 1)
        out[f"fp16_tflops_{n}"] = round(matmul_tflops(n, torch.float16), 1)
    out["h2d_pageable_gbs"] = round(h2d_gbs(False), 2)
    out["h2d_pinned_gbs"] = round(h2d_gbs(True), 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
