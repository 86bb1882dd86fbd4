"""DDP scaling of the case study's workloads from one GPU to N, each run diagnosed.

    python benchmarks/ddp_scaling.py --data /tmp/micro-224 --out scaling/     # a host with 2+ GPUs
    python benchmarks/ddp_scaling.py --data synthetic --out s/ --gpus 2 --models custom --small   # CPU smoke test

For each model, ``diagnose run`` of ``workloads/train.py`` on one GPU (``CUDA_VISIBLE_DEVICES``
narrowed to the first), then ``diagnose run --nproc-per-node N`` (torchrun, DDP, one process per
GPU, the same per-GPU batch and workers). The job's throughput is the ranks' steady-state
samples/s added up (``distributed.job_samples_per_s``); scaling is that over the one-GPU figure.
Writes ``scaling.json`` and ``scaling.md`` (figures, per-rank communication, the findings) and
every run directory. Keep NCCL's NVLink multicast off where the host asks for it
(NCCL_NVLS_ENABLE=0 is passed through untouched: torchrun's ranks inherit the environment).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _bench import REPO, run_in_repo

sys.path.insert(0, str(REPO))  # the repository's diagnose, as the commands it runs use
from diagnose.analysis.report import Report

#: model -> train.py arguments besides the dataset (per-GPU batch; the same on 1 and N GPUs)
CONFIGS: dict[str, list[str]] = {
    "custom": ["--model_name", "custom", "--batch_size", "128", "--num_workers", "8"],
    "vit": ["--model_name", "vit", "--batch_size", "64", "--mixed_precision", "bf16", "--num_workers", "8"],
}

#: steps per rank a synthetic dataset holds: diagnose's warm-up, window, FLOP step and timed steps
SYNTHETIC_STEPS = 48

#: --small: a CPU smoke test of the whole path on tiny synthetic images
SMALL = [
    "--batch_size",
    "8",
    "--num_workers",
    "1",
    "--resolution",
    "32",
    "--dataset",
    "synthetic",
    "--synthetic_samples",
    "1024",
]


def run(model: str, gpus: int, data: str, out: Path, timeout: int, small: bool) -> dict:
    run_dir = out / f"{model}-{gpus}gpu"
    config = [*SMALL, "--model_name", model] if small else [*CONFIGS[model], "--dataset", data]
    if data == "synthetic" and not small:
        # the default 1,024 images are 8 steps of 128: the run ended before diagnose's window
        # (H200, 2 GPUs: no throughput). Enough for SYNTHETIC_STEPS steps on every rank.
        batch = int(CONFIGS[model][CONFIGS[model].index("--batch_size") + 1])
        config += ["--synthetic_samples", str(batch * gpus * SYNTHETIC_STEPS)]
    args = [*config, "--num_epochs", "1", "--epochs_eval", "0"]
    launch = ["--nproc-per-node", str(gpus)] if gpus > 1 else []
    # --no-check: the one-GPU run's A/B reruns would time more than the scaling's two runs
    cmd = [
        sys.executable,
        "-m",
        "diagnose",
        "run",
        "--json",
        "--overwrite",
        "--no-check",
        "--out",
        str(run_dir),
        *launch,
        str(REPO / "workloads" / "train.py"),
        "--",
        *args,
    ]
    one_gpu = {"CUDA_VISIBLE_DEVICES": "0"} if gpus == 1 and "CUDA_VISIBLE_DEVICES" not in os.environ else None
    t0 = time.perf_counter()
    try:
        p = run_in_repo(cmd, timeout, env=one_gpu)
    except subprocess.TimeoutExpired:
        return {"model": model, "gpus": gpus, "error": f"timed out after {timeout} s"}
    row: dict = {
        "model": model,
        "gpus": gpus,
        "exit_code": p.returncode,
        "wall_s": round(time.perf_counter() - t0, 1),
        "run_dir": str(run_dir),
    }
    if p.returncode != 0 or not p.stdout.strip():
        row["error"] = p.stderr[-3000:]
        return row
    report = json.loads(p.stdout)
    steady = (report.get("throughput") or {}).get("steady") or {}
    dist = report.get("distributed") or {}
    parsed = Report.from_dict(report)  # schema 2: the shares and GPU busy are symptoms
    shares = parsed.exposed_shares()
    top = max(shares.items(), key=lambda kv: kv[1]) if shares else (None, None)
    row.update(
        samples_per_s=dist.get("job_samples_per_s") if dist else steady.get("samples_per_s"),
        per_gpu_samples_per_s=steady.get("samples_per_s"),
        median_step_ms=steady.get("median_step_ms"),
        gpu_busy=parsed.gpu_busy_share(),
        top_exposed=top[0],
        top_exposed_share=top[1],
        exposed_communication=shares.get("communication"),
        findings=[
            {"rule": f["rule"], "says": f["says"], "gain_bound": f.get("gain_bound")}
            for f in report.get("findings", [])
        ],
        ranks=dist.get("ranks"),
        straggler=dist.get("straggler"),
        peak_reserved_bytes=(report.get("memory") or {}).get("peak_reserved_bytes"),
    )
    return row


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | GPUs | images/s (job) | scaling | step ms (rank 0) | GPU busy | exposed comm | comm ms/step | largest exposed | findings |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    one = {r["model"]: r.get("samples_per_s") for r in rows if r["gpus"] == 1}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['gpus']} | error | | | | | | | |")
            continue
        base = one.get(r["model"])
        scaling = f"{r['samples_per_s'] / base:.2f}x" if base and r.get("samples_per_s") else ""
        comm = ", ".join(
            f"{x['communication_ms']:.1f}" for x in r.get("ranks") or [] if x.get("communication_ms") is not None
        )
        top = f"{r['top_exposed']} {r['top_exposed_share'] * 100:.0f}%" if r.get("top_exposed") else ""
        lines.append(
            f"| {r['model']} | {r['gpus']} | {r.get('samples_per_s') or 0:,.1f} | {scaling} | {r.get('median_step_ms') or 0:.1f} "
            f"| {(r.get('gpu_busy') or 0) * 100:.0f}% | {(r.get('exposed_communication') or 0) * 100:.0f}% | {comm or '-'} "
            f"| {top} | {' '.join(f['rule'] for f in r['findings']) or 'none'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="the image folder (workloads/make_dataset.py), or 'synthetic'")
    p.add_argument("--out", type=Path, default=Path("scaling"))
    p.add_argument("--gpus", type=int, default=2, help="GPUs of the distributed run")
    p.add_argument("--models", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--small", action="store_true", help="tiny synthetic runs (CPU smoke test, gloo)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.models:
        for gpus in (1, args.gpus):
            row = run(model, gpus, args.data, args.out.resolve(), args.timeout, args.small)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("ranks", "findings")}), flush=True)
    (args.out / "scaling.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    (args.out / "scaling.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
