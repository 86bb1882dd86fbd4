"""Time ViT-H/14's training step eagerly and under torch.compile, with no diagnose in the process.

    python benchmarks/compile_vit.py eager
    python benchmarks/compile_vit.py compile
    python benchmarks/compile_vit.py compile-hook    # a global forward pre-hook like diagnose's first

The check behind docs/case-study.md's Table 11.6: when ``diagnose sweep`` finds torch.compile
slower, is that torch.compile's doing or the tool's? Batch 128 of random 224x224 images, bf16
autocast, SGD, as ``workloads/train.py --model_name vit --mixed_precision bf16``; the first step
(compilation) is timed alone, then 10 steps after 3. The GPU kernels of one more step are
printed, largest first: they show which attention kernels each variant runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workloads.models import ViTClassifier, vit_config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["eager", "compile", "compile-hook"])
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    if args.mode == "compile-hook":

        def pre_hook(module: torch.nn.Module, inputs: object) -> None:
            if torch.compiler.is_compiling():
                return

        torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    torch.manual_seed(0)
    model = ViTClassifier(vit_config(224, 200)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=5e-4)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 200, (args.batch,), device="cuda")
    run = torch.compile(model) if args.mode.startswith("compile") else model

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16):
            loss = F.cross_entropy(run(x), y)
        loss.backward()
        opt.step()

    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / 10
    print(
        f"{args.mode}: first step {first:.1f} s, {dt * 1000:.1f} ms/step, {args.batch / dt:.1f} images/s, "
        f"peak {torch.cuda.max_memory_allocated() / 1e9:.1f} GB",
        flush=True,
    )
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main()
