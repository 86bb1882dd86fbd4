"""Issue 20 on the GPU: MFU against a hand computation, the roofline's placement of a known
memory-bound and a known compute-bound kernel, and an out-of-memory run explained.

    python benchmarks/mfu_gpu.py --out "$OUT"     # about 3 minutes on an H100; JSON in $OUT

1. examples/matmul_only.py under ``diagnose run``: MFU from what diagnose recorded (the counted
   step's FLOPs, the steady step time, the GPU table) against MFU by hand (repeat x 2n^3 FLOPs
   over the script's own plain-timer step time, the same table's peak). Must agree within 2%.
2. examples/roofline.py under ``diagnose run``: the elementwise class must sit left of the
   ridge point (memory-bound), the matmul class right of it (compute-bound).
3. examples/oom.py under ``diagnose run``: status "oom", the memory owners at the error, what
   filled it and what to change; then ``--batch-size 16384``: the split over a step and the
   largest batch estimated to fit (the batch read from the model's input: no DataLoader).
4. With ``--planted`` (about 6 more minutes): the planted examples of the rules over these
   numbers under ``diagnose verify --top 1`` (benchmarks/truth.py's ``one``): the top finding
   must be the planted rule, and the fix is measured: the rule's knob where it has one
   (FUSE001: compile, MEM004: batch_size), else the example's fix flag by hand. small_model.py
   must get no finding and NEXT002 as a next step.

    python benchmarks/mfu_gpu.py --out "$OUT" --planted --only planted    # the planted part alone
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import truth
from _bench import PLAIN_RE, REPO, run_in_repo

sys.path.insert(0, str(REPO))

from diagnose.analysis.measure import hardware, kernels, memory_breakdown
from diagnose.analysis.trace.timeline import load_timeline
from diagnose.record import RunRecord
from diagnose.rundir import RunDir


def diagnose_run(script: str, out: Path, name: str, args: list[str]) -> tuple[RunRecord, Path, str]:
    run_dir = out / name
    # --no-check: MFU is read off the run itself; the check's reruns would only spend device time
    cmd = [
        sys.executable,
        "-m",
        "diagnose",
        "run",
        "--no-check",
        "--out",
        str(run_dir),
        f"examples/{script}",
        "--",
        *args,
    ]
    t0 = time.perf_counter()
    proc = run_in_repo(cmd, timeout=240)
    print(f"[{name}] {' '.join(cmd[2:])}: exit {proc.returncode} in {time.perf_counter() - t0:.0f} s", flush=True)
    (out / f"{name}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    return RunRecord.load(RunDir(run_dir).record_path()), run_dir, proc.stdout + proc.stderr


def report_of(run_dir: Path) -> dict:
    """What diagnose itself reported (report.json): the symptoms, findings and limits section."""
    path = RunDir(run_dir).report_path
    return json.loads(path.read_text()) if path.exists() else {}


def symptom(report: dict, name: str) -> float | None:
    return (report.get("symptoms", {}).get(name) or {}).get("value")


def rule_ids(report: dict) -> list[str]:
    return [f.get("rule") for f in report.get("findings", []) + report.get("next_steps", [])]


def steady_step_s(record: RunRecord) -> float:
    return record.timed_seconds / record.timed_steps


def flops_by_dtype(record: RunRecord) -> dict[str, float]:
    count = record.flops
    seen: dict[str, float] = {}
    for shape in count.matmuls:
        seen[shape.dtype] = seen.get(shape.dtype, 0.0) + shape.flops
    tf32 = bool(record.flags.get("matmul_allow_tf32")) or record.flags.get("float32_matmul_precision") in (
        "high",
        "medium",
    )
    return hardware.split_by_dtype(count.total, seen, tf32)


def check_mfu(out: Path, result: dict) -> None:
    n, repeat = 8192, 8
    record, run_dir, log = diagnose_run(
        "matmul_only.py", out, "matmul", ["--n", str(n), "--repeat", str(repeat), "--steps", "80"]
    )
    report = report_of(run_dir)
    gpu = hardware.find_gpu(record.environment.get("device_name"))
    ours = hardware.utilisation(flops_by_dtype(record), steady_step_s(record), gpu)
    rates = [float(m.group(3)) for m in PLAIN_RE.finditer(log)]
    hand_flops = repeat * 2 * n**3
    hand_step_s = 1 / rates[-1] if rates else float("nan")
    hand_mfu = hand_flops / hand_step_s / (gpu.peak("bf16") * 1e12)
    result["mfu"] = {
        "device": record.environment.get("device_name"),
        "gpu": gpu.name,
        "peak_bf16_tflops": gpu.peak("bf16"),
        "flops_counted": record.flops.total,
        "flops_by_hand": hand_flops,
        "step_s_diagnose": steady_step_s(record),
        "step_s_plain_timer": hand_step_s,
        "tflops_diagnose": ours.achieved_tflops,
        "tflops_by_hand": hand_flops / hand_step_s / 1e12,
        "mfu_diagnose": ours.mfu,
        "mfu_by_hand": hand_mfu,
        "relative_difference": abs(ours.mfu - hand_mfu) / hand_mfu,
        "mfu_report": symptom(report, "flops.mfu"),
        "tflops_report": symptom(report, "flops.achieved_tflops"),
        "rules": rule_ids(report),
    }
    r = result["mfu"]
    print(
        f"MFU: diagnose {r['mfu_diagnose']:.4f} ({r['tflops_diagnose']:.1f} TFLOP/s), by hand {r['mfu_by_hand']:.4f} "
        f"({r['tflops_by_hand']:.1f} TFLOP/s): {r['relative_difference']:.2%} apart (must be < 2%)"
    )
    result["checks"]["mfu_within_2pct"] = r["relative_difference"] < 0.02 and r["flops_counted"] == hand_flops
    result["checks"]["report_mfu_within_2pct"] = (
        r["mfu_report"] is not None and abs(r["mfu_report"] - hand_mfu) / hand_mfu < 0.02
    )


def check_roofline(out: Path, result: dict) -> None:
    record, run_dir, _ = diagnose_run("roofline.py", out, "roofline", ["--steps", "80"])
    report = report_of(run_dir)
    reported = {p["class"]: p["bound"] for p in ((report.get("limits") or {}).get("roofline") or {}).get("points", [])}
    gpu = hardware.find_gpu(record.environment.get("device_name"))
    timeline = load_timeline(run_dir / record.trace_files[0])
    table = kernels.kernel_table(timeline.kernels, len(timeline.steps), record.flops, gpu, "bf16")
    points = {p.kind: p for p in table.roofline}
    result["roofline"] = {
        "ridge_flop_per_byte": gpu.ridge_point("bf16"),
        "points": {
            k: {
                "intensity": p.intensity,
                "tflops": p.tflops,
                "roof_tflops": p.roof_tflops,
                "bound": p.bound,
                "of_roof": p.of_roof,
                "time_share": p.time_share,
            }
            for k, p in points.items()
        },
        "classes": {
            k: {"time_us": c.time_s * 1e6, "flops": c.flops, "bytes": c.bytes, "gbs": c.gbs}
            for k, c in table.classes.items()
        },
        "top": [{"name": r.name[:90], "kind": r.kind, "us": r.time_s * 1e6} for r in table.rows[:6]],
        "report_bounds": reported,
        "rules": rule_ids(report),
    }
    for kind, p in points.items():
        print(
            f"roofline: {kind:12s} {p.intensity:10.2f} FLOP/B {p.tflops:8.2f} TFLOP/s, roof {p.roof_tflops:8.2f}: {p.bound}-bound, {p.of_roof:.0%} of roof"
        )
    result["checks"]["roofline_placement"] = (
        "elementwise" in points
        and points["elementwise"].bound == "memory"
        and "matmul" in points
        and points["matmul"].bound == "compute"
    )
    result["checks"]["report_roofline_placement"] = (
        reported.get("elementwise") == "memory" and reported.get("matmul") == "compute"
    )


def check_oom(out: Path, result: dict) -> None:
    record, run_dir, _ = diagnose_run("oom.py", out, "oom", ["--steps", "20"])
    report = report_of(run_dir)
    mem003 = next((f for f in report.get("findings", []) if f.get("rule") == "MEM003"), None)
    entry: dict = {
        "status": record.status,
        "error": (record.error or {}).get("message", "")[:300],
        "rules": rule_ids(report),
        "MEM003_says": mem003 and mem003["says"],
        "MEM003_do": mem003 and mem003["do"],
    }
    if record.memory_at_oom is not None:
        why = memory_breakdown.explain_oom(record.memory_at_oom)
        entry["at_oom"] = {
            "parts_gib": {k: v / 2**30 for k, v in why.parts.items()},
            "largest": why.largest,
            "requested_gib": (why.requested or 0) / 2**30,
            "changes": why.changes,
        }
        print(
            f"OOM: {why.largest} held {why.largest_bytes / 2**30:.1f} GiB; first change: {why.changes[0] if why.changes else '-'}"
        )
    fixed, _, _ = diagnose_run("oom.py", out, "oom_fixed", ["--batch-size", "16384", "--steps", "40"])
    entry["fixed_status"] = fixed.status
    if fixed.memory_split is not None:
        m = memory_breakdown.memory_breakdown(fixed.memory_split)
        entry["fixed_split_gib"] = {k: v / 2**30 for k, v in m.parts().items()}
        entry["fixed_largest_batch_estimate"] = memory_breakdown.largest_batch(m)
        print(
            f"fits at 16384: split {json.dumps({k: round(v, 2) for k, v in entry['fixed_split_gib'].items()})}; "
            f"largest batch estimated {entry['fixed_largest_batch_estimate']}"
        )
    result["oom"] = entry
    result["checks"]["oom_explained"] = (
        record.status == "oom" and record.memory_at_oom is not None and mem003 is not None
    )
    result["checks"]["fixed_fits_with_split"] = fixed.status == "stopped" and fixed.memory_split is not None
    fixed_report = report_of(out / "oom_fixed")
    entry["fixed_report_largest_batch"] = symptom(fixed_report, "memory.largest_batch")
    entry["fixed_report_samples"] = symptom(fixed_report, "memory.samples")
    result["checks"]["fixed_largest_batch_estimated"] = (
        entry.get("fixed_largest_batch_estimate") is not None
        and entry["fixed_report_samples"] == 16384
        and (entry["fixed_report_largest_batch"] or 0) > 16384
    )


#: the planted examples of issue 20's rules: example -> (the rule that must come first, the
#: fix applied by hand when the rule has no knob verify can apply)
PLANTED: dict[str, tuple[str | None, list[str]]] = {
    "attention_by_hand": ("ATTN001", ["--sdpa"]),
    "misaligned_matmuls": ("PREC004", ["--hidden", "4096"]),
    "elementwise_chain": ("FUSE001", []),
    "tiny_batch": ("MEM004", []),
    "small_model": (None, []),
}


def check_planted(out: Path, result: dict) -> None:
    """Each planted example under ``diagnose verify --top 1`` through truth.py's ``one`` (which
    also measures a by-hand fix and the plain timer)."""
    for name, (rule, by_hand) in PLANTED.items():
        truth.PLANTED[name] = rule
        if by_hand:
            truth.BY_HAND[name] = by_hand
    rows = {}
    for name, (rule, _) in PLANTED.items():
        try:
            row = truth.one(name, out / "planted", [], timeout=540, top=1)
        except Exception as exc:  # noqa: BLE001 - one example's failure must not hide the others
            row = {"example": name, "error": f"{type(exc).__name__}: {exc}"}
        rows[name] = row
        speedup = row.get("fix_speedup")
        print(
            f"planted {name}: top {row.get('top_rule')} (fired {row.get('fired')}, next {row.get('next_steps')}); "
            f"fix {row.get('fix_knobs') or row.get('fix')}: {speedup}x {row.get('fix_verdict')}",
            flush=True,
        )
        if rule is None:
            result["checks"][f"planted_{name}"] = bool(row.get("right")) and "NEXT002" in (row.get("next_steps") or [])
        else:
            result["checks"][f"planted_{name}"] = bool(row.get("right")) and row.get("fix_verdict") == "helped"
    result["planted"] = rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--planted",
        action="store_true",
        help="also run the planted examples of ATTN001, PREC004, FUSE001, MEM004, NEXT002",
    )
    p.add_argument("--only", nargs="+", choices=("mfu", "roofline", "oom", "planted"), help="run only these parts")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"checks": {}}
    parts = {"mfu": check_mfu, "roofline": check_roofline, "oom": check_oom, "planted": check_planted}
    wanted = args.only or ["mfu", "roofline", "oom", *(["planted"] if args.planted else [])]
    for check in (parts[name] for name in wanted):
        try:
            check(args.out, result)
        except Exception as exc:  # noqa: BLE001 - one failed part must not hide the others' figures
            result["checks"][check.__name__] = f"error: {type(exc).__name__}: {exc}"
            print(f"{check.__name__}: {type(exc).__name__}: {exc}", flush=True)
    (args.out / "mfu_gpu.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result["checks"], indent=1))


if __name__ == "__main__":
    main()
