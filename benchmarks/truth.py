"""Run every planted example under ``diagnose run`` and plainly; tabulate what diagnose said.

    python benchmarks/truth.py --out truth/            # on a machine with a GPU
    python benchmarks/truth.py --only data_bound --small

For each example it records: the top finding and whether it names the planted cause, the
top exposed share, and diagnose's steady-state throughput against the example's own plain
timer over the same steps (the profiling-overhead check). Writes ``truth.json`` and
``truth.md`` into --out, plus each run directory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: example -> the rule that names its planted cause (None: the control, where no rule may fire)
PLANTED: dict[str, str | None] = {
    "data_bound": "DATA001",
    "pageable_copies": "DATA002",
    "fp32_transformer": "PREC001",
    "launch_bound": "LAUNCH001",
    "item_syncs": "SYNC001",
    "forloop_optimizer": "OPT001",
    "cpu_preprocessing": "DATA004",
    "well_tuned": None,
}

PLAIN_RE = re.compile(r"plain timer: steps (\d+)-(\d+): ([\d.]+) steps/s")


def run(cmd: list[str], timeout: int) -> tuple[int, str, str, float]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0


def one(name: str, out: Path, extra: list[str], timeout: int) -> dict:
    script = f"examples/{name}.py"
    run_dir = out / name
    code, stdout, stderr, wall = run(
        [sys.executable, "-m", "diagnose", "run", "--quiet", "--json", "--overwrite", "--out", str(run_dir), script, "--", *extra],
        timeout,
    )
    row: dict = {"example": name, "planted": PLANTED[name], "exit_code": code, "diagnose_wall_s": round(wall, 1)}
    if code != 0 or not stdout.strip():
        row["error"] = stderr[-2000:]
        return row
    report = json.loads(stdout)
    findings = report.get("findings", [])
    top = findings[0] if findings else None
    shares = (report.get("breakdown") or {}).get("window", {}).get("exposed_share", {})
    top_exposed = max(shares.items(), key=lambda kv: kv[1]) if shares else (None, None)
    steady = (report.get("throughput") or {}).get("steady") or {}
    row.update(
        top_rule=top["rule"] if top else None,
        top_title=top["title"] if top else None,
        top_says=top["says"] if top else None,
        top_gain=top["gain_bound"] if top else None,
        fired=[f["rule"] for f in findings],
        next_steps=[f["rule"] for f in report.get("next_steps", [])],
        verdict=report.get("verdict"),
        top_exposed=top_exposed[0],
        top_exposed_share=top_exposed[1],
        gpu_busy=(report.get("breakdown") or {}).get("window", {}).get("gpu_busy_share"),
        diagnose_steps_per_s=steady.get("steps_per_s"),
    )
    row["right"] = (row["top_rule"] == PLANTED[name]) if PLANTED[name] else (not findings)
    code, stdout, stderr, wall = run([sys.executable, script, *extra], timeout)
    m = PLAIN_RE.search(stdout)
    if m:
        row["plain_steps_per_s"] = float(m.group(3))
        if row.get("diagnose_steps_per_s"):
            row["steady_vs_plain"] = round(row["diagnose_steps_per_s"] / row["plain_steps_per_s"], 4)
    else:
        row["plain_error"] = (stdout + stderr)[-1000:]
    return row


def markdown(rows: list[dict]) -> str:
    lines = [
        "| example | planted | top finding | right? | top exposed | GPU busy | diagnose steps/s | plain steps/s | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['example']} | {r['planted']} | error (exit {r['exit_code']}) | no | | | | | |")
            continue
        share = f"{r['top_exposed']} {r['top_exposed_share'] * 100:.0f}%" if r.get("top_exposed") else ""
        busy = f"{r['gpu_busy'] * 100:.0f}%" if r.get("gpu_busy") is not None else ""
        top = f"{r['top_rule']} (up to {r['top_gain']:.2f}x)" if r.get("top_rule") and r.get("top_gain") else (r.get("top_rule") or "none")
        lines.append(
            f"| {r['example']} | {r['planted'] or 'none'} | {top} | {'yes' if r.get('right') else 'NO'} | {share} | {busy} "
            f"| {r.get('diagnose_steps_per_s', '')} | {r.get('plain_steps_per_s', '')} | {r.get('steady_vs_plain', '')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("truth"))
    p.add_argument("--only", nargs="*", default=list(PLANTED))
    p.add_argument("--small", action="store_true", help="pass --small to the examples (CPU smoke test)")
    p.add_argument("--timeout", type=int, default=300)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    extra = ["--small"] if args.small else []
    rows = []
    for name in args.only:
        row = one(name, args.out.resolve(), extra, args.timeout)
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "truth.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    (args.out / "truth.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
