"""Run every planted example under ``diagnose verify`` and plainly; tabulate what diagnose said.

    python benchmarks/truth.py --out truth/            # on a machine with a GPU
    python benchmarks/truth.py --only data_bound --small

For each example: the diagnosis (the first baseline of verify is a plain ``diagnose run``),
whether its top finding names the planted cause, the measured speedup of that finding's
recommendation (verify applies its knob; for a rule without a knob the example's ``--fixed``
flag applies the change by hand), and diagnose's steady-state throughput against the
example's own plain timer over the same steps (the profiling-overhead check). Writes
``truth.json`` and ``truth.md`` into --out, plus every run directory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from _bench import PLAIN_RE, REPO, run_in_repo

sys.path.insert(0, str(REPO))  # the repository's diagnose, as the commands it runs use
from diagnose.analysis.report import Report

#: example -> the rule that names its planted cause (None: the control, where no rule may fire)
PLANTED: dict[str, str | None] = {
    "data_bound": "DATA001",
    "pageable_copies": "DATA002",
    "fp32_transformer": "PREC001",
    "launch_bound": "LAUNCH001",
    "item_syncs": "SYNC001",
    "forloop_optimizer": "OPT001",
    "cpu_preprocessing": "DATA004",
    "pageable_prebuilt": "DATA003",
    "implicit_syncs": "SYNC001",
    # two workers that cannot keep up, hidden in the window by the batches they queued: the
    # steady steps' measured data wait (data.steady_wait) names them
    "prefetch_loader": "DATA001",
    "well_tuned": None,
}

#: examples whose planted cause has no knob: the change applied by hand (the example's flag)
BY_HAND: dict[str, list[str]] = {"cpu_preprocessing": ["--fixed"]}
#: examples whose fix is measured with a what-if knob the rule cannot name (a sync site's line)
WHAT_IF: dict[str, list[str]] = {"implicit_syncs": ["unsync=implicit_syncs.py:29"]}


def run(cmd: list[str], timeout: int) -> tuple[int, str, str, float]:
    t0 = time.perf_counter()
    p = run_in_repo(cmd, timeout)
    return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0


def one(name: str, out: Path, extra: list[str], timeout: int, top: int) -> dict:
    script = f"examples/{name}.py"
    run_dir = out / name
    cmd = [
        sys.executable,
        "-m",
        "diagnose",
        "verify",
        "--json",
        "--top",
        str(top),
        "--repeats",
        "2",
        "--out",
        str(run_dir),
    ]
    code, stdout, stderr, wall = run([*cmd, script, "--", *extra], timeout)
    row: dict = {"example": name, "planted": PLANTED[name], "exit_code": code, "verify_wall_s": round(wall, 1)}
    if code != 0 or not stdout.strip():
        row["error"] = stderr[-2000:]
        return row
    report = json.loads(stdout)
    findings = report.get("findings", [])
    top_finding = findings[0] if findings else None
    window = (report.get("breakdown") or {}).get("window", {})
    parsed = Report.from_dict(report)  # schema 2: the shares and GPU busy are symptoms
    shares = parsed.exposed_shares()
    top_exposed = max(shares.items(), key=lambda kv: kv[1]) if shares else (None, None)
    experiments = report.get("experiments") or {}
    baselines = [r for r in experiments.get("rows", []) if r["role"] == "baseline"]
    tried = [r for r in experiments.get("rows", []) if r["role"] == "recommendation"]
    row.update(
        top_rule=top_finding["rule"] if top_finding else None,
        top_says=top_finding["says"] if top_finding else None,
        top_lines=top_finding.get("lines") if top_finding else None,
        top_gain=top_finding["gain_bound"] if top_finding else None,
        fired=[f["rule"] for f in findings],
        next_steps=[f["rule"] for f in report.get("next_steps", [])],
        verdict=report.get("verdict"),
        top_exposed=top_exposed[0],
        top_exposed_share=top_exposed[1],
        gpu_busy=parsed.gpu_busy_share(),
        profiler_inflation=window.get("profiler_inflation"),
        diagnose_steps_per_s=baselines[0].get("steps_per_s") if baselines else None,
        baseline_spread=experiments.get("baseline_spread"),
        conclusions=experiments.get("conclusions"),
    )
    if tried:
        row.update(
            fix=tried[0]["label"],
            fix_knobs=tried[0]["knobs"],
            fix_speedup=tried[0].get("speedup"),
            fix_verdict=tried[0].get("verdict"),
            fix_top_exposed=tried[0].get("top_exposed"),
        )
    if name in BY_HAND or name in WHAT_IF:
        fixed_dir = out / f"{name}-fixed"
        # --no-check: the fixed variant's diagnosis is compared as predicted, as verify's runs are
        cmd = [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--quiet",
            "--json",
            "--overwrite",
            "--no-check",
            "--warmup",
            "5",
            "--steps",
            "5",
            "--out",
            str(fixed_dir),
        ]
        cmd += [x for k in WHAT_IF.get(name, []) for x in ("--set", k)]
        c2, out2, err2, _ = run([*cmd, script, "--", *extra, *BY_HAND.get(name, [])], timeout)
        if c2 == 0 and out2.strip():
            fixed = json.loads(out2)
            rate = ((fixed.get("throughput") or {}).get("steady") or {}).get("steps_per_s")
            base = statistics.mean(r["steps_per_s"] for r in baselines if r.get("steps_per_s")) if baselines else None
            fshares = Report.from_dict(fixed).exposed_shares()
            ftop = max(fshares.items(), key=lambda kv: kv[1]) if fshares else (None, 0)
            speedup = rate / base if rate and base else None
            noise = max(row.get("baseline_spread") or 0, 0.02)
            verdict = (
                "failed"
                if speedup is None
                else "helped"
                if speedup > 1 + noise
                else "slower"
                if speedup < 1 - noise
                else "no effect"
            )
            how = f"by hand: {' '.join(BY_HAND[name])}" if name in BY_HAND else f"what-if: {' '.join(WHAT_IF[name])}"
            # verify's own fix (the rule's knob) keeps the fix_* columns; this one goes beside it
            prefix = "what_if" if tried else "fix"
            row.update(
                {
                    prefix: how,
                    f"{prefix}_speedup": round(speedup, 4) if speedup else None,
                    f"{prefix}_verdict": verdict,
                    f"{prefix}_top_exposed": {"category": ftop[0], "share": ftop[1]},
                }
            )
        else:
            row["fix_error"] = err2[-800:]
    row["right"] = (row["top_rule"] == PLANTED[name]) if PLANTED[name] else (not findings)
    code, stdout, stderr, wall = run([sys.executable, script, "--steps", "40", *extra], timeout)
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
        "| example | planted | top finding | right? | top exposed | GPU busy | fix applied | measured | after the fix | diagnose steps/s | plain steps/s | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['example']} | {r['planted']} | error (exit {r['exit_code']}) | no | | | | | | | | |")
            continue
        share = f"{r['top_exposed']} {r['top_exposed_share'] * 100:.0f}%" if r.get("top_exposed") else ""
        busy = f"{r['gpu_busy'] * 100:.0f}%" if r.get("gpu_busy") is not None else ""
        top = (
            f"{r['top_rule']} (up to {r['top_gain']:.2f}x)"
            if r.get("top_rule") and r.get("top_gain")
            else (r.get("top_rule") or "none")
        )
        knobs = " ".join(f"{k}={v}" for k, v in (r.get("fix_knobs") or {}).items()) or r.get("fix", "")
        measured = (
            f"{r['fix_speedup']:.2f}x ({r.get('fix_verdict')})" if r.get("fix_speedup") else r.get("fix_verdict", "")
        )
        after = r.get("fix_top_exposed") or {}
        after_text = f"{after.get('category')} {after.get('share', 0) * 100:.0f}%" if after.get("category") else ""
        lines.append(
            f"| {r['example']} | {r['planted'] or 'none'} | {top} | {'yes' if r.get('right') else 'NO'} | {share} | {busy} "
            f"| {knobs} | {measured} | {after_text} "
            f"| {r.get('diagnose_steps_per_s', '')} | {r.get('plain_steps_per_s', '')} | {r.get('steady_vs_plain', '')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("truth"))
    p.add_argument("--only", nargs="*", default=list(PLANTED))
    p.add_argument("--small", action="store_true", help="pass --small to the examples (CPU smoke test)")
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--top", type=int, default=1, help="recommendations verify tries per example")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    extra = ["--small"] if args.small else []
    rows = []
    for name in args.only:
        row = one(name, args.out.resolve(), extra, args.timeout, args.top)
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "truth.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    (args.out / "truth.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
