"""Does the same script diagnosed twice give the same top finding? The flip rate, per example.

    python benchmarks/flip_rate.py --out flips/                        # every planted example, 5 runs each
    python benchmarks/flip_rate.py --out flips/ --only launch_bound data_bound --runs 3
    python benchmarks/flip_rate.py --out flips/ --reports runs/verify-*/baseline-*/   # reuse verify's baselines
    python benchmarks/flip_rate.py --out flips/ --small --runs 2 --only well_tuned     # CPU smoke test
    python benchmarks/flip_rate.py --out fixed/ --run-args="--max-steps 10"   # the window never grows
    python benchmarks/flip_rate.py --out dist/ --distributed             # DDP/FSDP examples, 2 GPUs

Each example runs ``--runs`` times under ``diagnose run``; a run's top finding is its first
finding's rule, or "none". The modal top finding is the example's verdict; a run that differs
flips. A flip is excused when the run's or the mode's top finding is borderline (its evidence lies
within the steps' spread of the rule's threshold) or when a near miss was reported (a rule within
the spread of firing, report.json ``borderline``): the report said a rerun may differ. The target
(issue 17): 0 unexcused flips. ``--reports`` reads report.json files already written (the
baselines of ``diagnose verify --repeats N`` are N runs of the same script), grouped by script.

Writes ``runs.jsonl`` (one line per run, as it happens), ``flip_rate.json`` and ``flip_rate.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from _bench import REPO, run_in_repo

from overhead import EXAMPLES as OVERHEAD_EXAMPLES

#: every single-GPU planted and framework example (examples/README.md): the distributed ones need
#: several ranks, oom.py is meant to fail, matmul_only.py and roofline.py are MFU probes
EXAMPLES = [
    *OVERHEAD_EXAMPLES,
    "attention_by_hand",
    "misaligned_matmuls",
    "elementwise_chain",
    "tiny_batch",
    "small_model",
    "fabric_fp32",
]
#: the distributed examples whose planted cause a rule names, on 2 GPUs (``--distributed``):
#: name -> (script, its arguments); each runs under ``diagnose run --nproc-per-node 2``
DISTRIBUTED = {
    "ddp_straggler": ("ddp_straggler", []),
    "fsdp_all_gather": ("fsdp_exposed_comm", ["--plant", "all-gather"]),
    "ddp_one_bucket": ("ddp_buckets", ["--bucket-cap-mb", "10000"]),
}

sys.path.insert(0, str(REPO))
from diagnose.rundir import RunDir  # noqa: E402


def top_of(report: dict) -> dict:
    """The run's top finding, whether it is borderline, and the near misses."""
    findings = report.get("findings") or []
    top = findings[0] if findings else {}
    steady = (report.get("throughput") or {}).get("steady") or {}
    growth = (report.get("run") or {}).get("window_growth") or {}
    return {
        "profiled_steps": (report.get("run") or {}).get("profiled_steps"),
        "window_grew": growth.get("steps", 0) > growth.get("planned_steps", 0),
        "top": top.get("rule", "none"),
        "top_borderline": bool(top.get("borderline")),
        "near_misses": len(report.get("borderline") or []),
        "noisy": bool(steady.get("noisy")),
        "verdict": report.get("verdict"),
    }


def run_once(example: str, run_dir: Path, small: bool, timeout: int, run_args: list[str] | None = None) -> dict:
    t0 = time.perf_counter()
    row = _run_once(example, run_dir, small, timeout, run_args)
    return {**row, "wall_s": round(time.perf_counter() - t0, 1)}


def _run_once(example: str, run_dir: Path, small: bool, timeout: int, run_args: list[str] | None = None) -> dict:
    name, script_args, ranks = example, [], []
    if example in DISTRIBUTED:
        name, script_args = DISTRIBUTED[example]
        ranks = ["--nproc-per-node", "2"]
    script = str(REPO / "examples" / f"{name}.py")
    # --no-check unless --run-args asks for a check: the flip rate is the analysis' own (as of the
    # baselines --reports reads, which verify runs with --no-check); the check would rank measured
    # findings first and take each run's time again (benchmarks/zoo/run.py keeps it: it scores the
    # ranking a user gets)
    check = [] if any(a.startswith("--check") for a in run_args or []) else ["--no-check"]
    cmd = [
        sys.executable,
        "-m",
        "diagnose",
        "run",
        "--quiet",
        "--json",
        "--overwrite",
        *check,
        "--out",
        str(run_dir),
        *ranks,
        *(run_args or []),
        script,
        "--",
        *script_args,
        *(["--small"] if small else []),
    ]
    try:
        p = run_in_repo(cmd, timeout)
    except subprocess.TimeoutExpired:
        return {"example": example, "error": f"timed out after {timeout} s"}
    if p.returncode != 0 or not p.stdout.strip():
        return {"example": example, "error": (p.stdout + p.stderr)[-1500:]}
    return {"example": example, **top_of(json.loads(p.stdout))}


def from_reports(folders: list[Path]) -> list[dict]:
    rows = []
    for folder in folders:
        path = RunDir(folder).report_path if folder.is_dir() else folder
        report = json.loads(path.read_text())
        target = ((report.get("run") or {}).get("target") or {}).get("value") or str(folder)
        rows.append({"example": Path(target).stem, "source": str(path), **top_of(report)})
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for example in dict.fromkeys(r["example"] for r in rows):
        runs = [r for r in rows if r["example"] == example and "top" in r]
        if not runs:
            continue
        mode, _ = Counter(r["top"] for r in runs).most_common(1)[0]
        mode_borderline = any(r["top_borderline"] for r in runs if r["top"] == mode)
        flips = [r for r in runs if r["top"] != mode]
        excused = [r for r in flips if r["top_borderline"] or r["near_misses"] or mode_borderline]
        out.append(
            {
                "example": example,
                "runs": len(runs),
                "top": mode,
                "tops": dict(Counter(r["top"] for r in runs)),
                "flip_rate": round(len(flips) / len(runs), 4),
                "unexcused_flips": len(flips) - len(excused),
                "borderline_runs": sum(1 for r in runs if r["top_borderline"] or r["near_misses"]),
                "noisy_runs": sum(1 for r in runs if r["noisy"]),
                "grown_runs": sum(1 for r in runs if r.get("window_grew")),
            }
        )
    return out


def markdown(summary: list[dict]) -> str:
    lines = [
        "| example | runs | top finding | tops seen | flip rate | unexcused flips | borderline runs | noisy runs | window grew |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in summary:
        tops = ", ".join(f"{k} x{v}" for k, v in e["tops"].items())
        lines.append(
            f"| {e['example']} | {e['runs']} | {e['top']} | {tops} | {e['flip_rate']:.0%} | {e['unexcused_flips']} "
            f"| {e['borderline_runs']} | {e['noisy_runs']} | {e.get('grown_runs', 0)} |"
        )
    total = sum(e["unexcused_flips"] for e in summary)
    return "\n".join(lines) + f"\n\nunexcused flips over all examples: {total} (target 0)\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("flips"))
    p.add_argument("--only", nargs="*", default=None, choices=[*EXAMPLES, *DISTRIBUTED])
    p.add_argument("--distributed", action="store_true", help="the distributed examples on 2 GPUs (DISTRIBUTED)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument(
        "--reports", nargs="*", type=Path, default=None, help="report.json files or run directories to read instead"
    )
    p.add_argument("--small", action="store_true")
    p.add_argument("--timeout", type=int, default=240)
    p.add_argument("--deadline", type=float, default=None, help="epoch seconds after which no run starts")
    p.add_argument("--run-args", default="", help='more `diagnose run` options, e.g. --run-args="--max-steps 10"')
    args = p.parse_args()
    if args.only is None:
        args.only = list(DISTRIBUTED) if args.distributed else EXAMPLES
    args.out.mkdir(parents=True, exist_ok=True)
    if args.reports:
        rows = from_reports(args.reports)
    else:
        rows = []
        with (args.out / "runs.jsonl").open("a") as log:
            for i in range(args.runs):  # round by round: a drift of the machine hits every example alike
                for example in args.only:
                    if args.deadline is not None and time.time() >= args.deadline:
                        break
                    row = run_once(
                        example,
                        args.out / "runs" / f"{example}-{i + 1}",
                        args.small,
                        args.timeout,
                        args.run_args.split(),
                    )
                    row["run"] = i + 1
                    rows.append(row)
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                    print(json.dumps({k: v for k, v in row.items() if k != "error"}), flush=True)
    summary = summarize(rows)
    (args.out / "flip_rate.json").write_text(json.dumps(summary, indent=1))
    table = markdown(summary)
    (args.out / "flip_rate.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
