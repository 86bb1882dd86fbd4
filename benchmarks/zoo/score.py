"""Score a corpus run against issue 32's goals, each half beside the other.

    python benchmarks/zoo/score.py zoo-out/results.jsonl              # markdown to stdout, score.json beside
    python benchmarks/zoo/score.py zoo-out/results.jsonl --json s.json

Contract: ``score(records) -> dict`` is pure: the last record of each script name counts (run.py
appends one after the runs and one after verify). Per half:

* **helps**: of the scripts whose top finding (the runs', which run.py asks verify for since
  the eleventh run; verify's own before it) verify measured on its own baseline,
  the share whose speedup beats 1 + the baseline's spread (goal: at least 90%); **slower**: how
  many measured below 1 - the spread (goal: none). Scripts with no finding, or whose top
  finding verify could not apply, are counted apart, never as a success.
* **error**: |predicted - measured| / measured over every verified recommendation (the top 1-3)
  with a prediction: its median (goal: at most 15%) and 90th percentile (at most 35%; linear
  interpolation between the closest ranks, as numpy's default).
* **inside**: of the verified recommendations with a stated interval, the share whose measured
  speedup lies inside it, ends included (goal: at least 80%).
* **stable**: of the scripts with at least two successful diagnose runs, the share whose runs
  all named the same top finding ("none" counts as a finding; goal: at least 90%).

Beside the goals, **as the runs state it**: for each diagnose run whose top finding verify
measured, the figure the run itself gave (what its in-run check measured where it measured it,
else its prediction) against verify's, and whether its interval (a measured one's: what a rerun
of the A/B reads) held it: the accuracy a user reads off ``diagnose run``, checks included.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
# the halves, and the holdout groups (each run once for its score and never tuned on): a column
# each, a holdout group's where a run holds any
from corpus import HALVES, HOLDOUTS

GOALS = {"helps": 0.90, "slower": 0, "median_error": 0.15, "p90_error": 0.35, "inside": 0.80, "stable": 0.90}


def percentile(values: list[float], q: float) -> float:
    """The q-th quantile (0..1) by linear interpolation between the closest ranks."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (pos - low)


def latest(records: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for record in records:
        out[record["name"]] = record
    return out


def outcome(record: dict) -> dict:
    """One script's share of the goals: its top finding's verdict, its rows' errors, its reruns."""
    verify = record.get("verify") or {}
    spread = max(float(verify.get("baseline_spread") or 0.0), 0.0)
    top = verify.get("top")
    rows = [r for r in verify.get("rows") or [] if isinstance(r.get("measured"), (int, float)) and r["measured"] > 0]
    top_row = next((r for r in rows if r.get("rule") == top), None) if top else None
    if not verify or "error" in verify:
        top_verdict = "not verified"
    elif top is None:
        top_verdict = "no finding"
    elif top_row is None:
        top_verdict = "not measured"
    elif top_row["measured"] > 1 + spread:
        top_verdict = "helps"
    elif top_row["measured"] < 1 - spread:
        top_verdict = "slower"
    else:
        top_verdict = "no effect"
    errors = [
        abs(r["predicted"] - r["measured"]) / r["measured"]
        for r in rows
        if isinstance(r.get("predicted"), (int, float))
    ]
    intervals = [r for r in rows if r.get("interval")]
    inside = [r["interval"][0] <= r["measured"] <= r["interval"][1] for r in intervals]
    tops = [run.get("top") or "none" for run in record.get("runs") or [] if "error" not in run]
    by_rule = {r.get("rule"): r["measured"] for r in rows}
    stated = []
    for run in record.get("runs") or []:
        top_finding = run.get("top_finding") or {}
        truth = by_rule.get(top_finding.get("rule"))
        checked = top_finding.get("basis") == "measured" and isinstance(top_finding.get("measured"), (int, float))
        value = top_finding.get("measured") if checked else top_finding.get("predicted")
        if "error" in run or truth is None or not isinstance(value, (int, float)):
            continue
        band = top_finding.get("measured_interval") if checked else top_finding.get("interval")
        stated.append(
            {
                "measured_in_run": checked,
                "error": abs(value - truth) / truth,
                "inside": None if not band else band[0] <= truth <= band[1],
            }
        )
    return {
        "name": record["name"],
        "half": record.get("half"),
        "status": record.get("status"),
        "tops": tops,
        "stable": len(set(tops)) == 1 if len(tops) >= 2 else None,
        "verify_top": top,
        "top_measured": top_row["measured"] if top_row else None,
        "top_predicted": top_row.get("predicted") if top_row else None,
        "top_interval": top_row.get("interval") if top_row else None,
        "spread": spread if verify else None,
        "top_verdict": top_verdict,
        "errors": errors,
        "inside": inside,
        "stated": stated,
    }


def summarize(outcomes: list[dict]) -> dict:
    verdicts = [o["top_verdict"] for o in outcomes]
    measured = [v for v in verdicts if v in ("helps", "slower", "no effect")]
    errors = [e for o in outcomes for e in o["errors"]]
    inside = [i for o in outcomes for i in o["inside"]]
    stable = [o["stable"] for o in outcomes if o["stable"] is not None]
    stated = [s for o in outcomes for s in o.get("stated") or []]
    stated_bands = [s for s in stated if s["inside"] is not None]

    def share(hits: int, total: int) -> float | None:
        return hits / total if total else None

    return {
        "scripts": len(outcomes),
        "failed": sum(o["status"] in ("failed", "missing") for o in outcomes),
        "skipped": sum(o["status"] == "skipped" for o in outcomes),
        "top_measured": len(measured),
        "helps_count": verdicts.count("helps"),
        "helps": share(verdicts.count("helps"), len(measured)),
        "slower": verdicts.count("slower"),
        "no_effect": verdicts.count("no effect"),
        "no_finding": verdicts.count("no finding"),
        "not_measured": verdicts.count("not measured"),
        "not_verified": verdicts.count("not verified"),
        "predicted_rows": len(errors),
        "median_error": statistics.median(errors) if errors else None,
        "p90_error": percentile(errors, 0.9) if errors else None,
        "interval_rows": len(inside),
        "inside_count": sum(inside),
        "inside": share(sum(inside), len(inside)),
        "rerun_scripts": len(stable),
        "stable_count": sum(stable),
        "stable": share(sum(stable), len(stable)),
        "stated_runs": len(stated),
        "stated_measured": sum(s["measured_in_run"] for s in stated),
        "stated_median_error": statistics.median(s["error"] for s in stated) if stated else None,
        "stated_inside_count": sum(bool(s["inside"]) for s in stated_bands),
        "stated_interval_runs": len(stated_bands),
        "stated_inside": share(sum(bool(s["inside"]) for s in stated_bands), len(stated_bands)),
    }


def met(summary: dict) -> dict[str, bool | None]:
    """Each goal: True met, False not, None no data."""

    def at_least(key: str) -> bool | None:
        return None if summary[key] is None else summary[key] >= GOALS[key]

    def at_most(key: str) -> bool | None:
        return None if summary[key] is None else summary[key] <= GOALS[key]

    return {
        "helps": at_least("helps"),
        "slower": None if not summary["top_measured"] else summary["slower"] == 0,
        "median_error": at_most("median_error"),
        "p90_error": at_most("p90_error"),
        "inside": at_least("inside"),
        "stable": at_least("stable"),
    }


def score(records: list[dict]) -> dict:
    outcomes = [outcome(r) for r in latest(records).values()]
    halves = {}
    groups = [*HALVES, *(g for g in HOLDOUTS if any(o["half"] == g for o in outcomes))]
    for half in groups:
        summary = summarize([o for o in outcomes if o["half"] == half])
        halves[half] = dict(summary, met=met(summary))
    return {"goals": GOALS, "halves": halves, "scripts": outcomes}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _mark(ok: bool | None) -> str:
    return "" if ok is None else " (met)" if ok else " (not met)"


def markdown(result: dict) -> str:
    h = result["halves"]
    groups = list(h)
    lines = [f"| goal | {' | '.join(groups)} | target |", "|---|" + "---|" * (len(groups) + 1)]
    rows = [
        (
            "top recommendation helps beyond the baseline's spread",
            "helps",
            lambda s: f"{s['helps_count']}/{s['top_measured']} ({_pct(s['helps'])})",
            ">= 90%",
        ),
        ("top recommendation slower than the spread", "slower", lambda s: f"{s['slower']}", "0"),
        (
            "\\|predicted - measured\\| / measured, median",
            "median_error",
            lambda s: f"{_pct(s['median_error'])} (n={s['predicted_rows']})",
            "<= 15%",
        ),
        (
            "the same, 90th percentile",
            "p90_error",
            lambda s: f"{_pct(s['p90_error'])} (n={s['predicted_rows']})",
            "<= 35%",
        ),
        (
            "measured inside the stated interval",
            "inside",
            lambda s: f"{s['inside_count']}/{s['interval_rows']} ({_pct(s['inside'])})",
            ">= 80%",
        ),
        (
            "same top finding on every rerun",
            "stable",
            lambda s: f"{s['stable_count']}/{s['rerun_scripts']} ({_pct(s['stable'])})",
            ">= 90%",
        ),
    ]
    for label, key, fn, target in rows:
        values = " | ".join(fn(h[half]) + _mark(h[half]["met"][key]) for half in groups)
        lines.append(f"| {label} | {values} | {target} |")
    for label, fn in (
        (
            "as the runs state it: their top's figure (measured in-run where it was) against verify's, median error",
            lambda s: (
                f"{_pct(s['stated_median_error'])} (n={s['stated_runs']}, {s['stated_measured']} measured in-run)"
            ),
        ),
        (
            "as the runs state it: verify's figure inside the run's interval",
            lambda s: f"{s['stated_inside_count']}/{s['stated_interval_runs']} ({_pct(s['stated_inside'])})",
        ),
    ):
        lines.append(f"| {label} | {' | '.join(fn(h[half]) for half in groups)} | (no goal) |")
    counts = " | ".join(
        f"{s['scripts']} scripts: {s['failed']} failed, {s['skipped']} skipped, {s['no_finding']} no finding, "
        f"{s['not_measured']} top not measurable, {s['not_verified']} not verified, {s['no_effect']} no effect"
        for s in (h[half] for half in groups)
    )
    lines.append(f"| scripts | {counts} | |")
    lines += [
        "",
        "| script | half | top finding per run | verify's top | predicted | interval | measured | spread | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for o in sorted(result["scripts"], key=lambda o: (o["half"] or "", o["name"])):
        interval = f"{o['top_interval'][0]:.2f}-{o['top_interval'][1]:.2f}x" if o["top_interval"] else "-"
        predicted = f"{o['top_predicted']:.2f}x" if isinstance(o["top_predicted"], (int, float)) else "-"
        measured = f"{o['top_measured']:.2f}x" if o["top_measured"] else "-"
        spread = _pct(o["spread"]) if o["spread"] is not None else "-"
        lines.append(
            f"| {o['name']} | {o['half']} | {', '.join(o['tops']) or o['status']} | {o['verify_top'] or '-'} "
            f"| {predicted} | {interval} | {measured} | {spread} | {o['top_verdict']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="results.jsonl that run.py wrote")
    p.add_argument("--json", type=Path, help="where the scores go (default: score.json beside the results)")
    args = p.parse_args()
    if not args.results.exists():
        print(f"error: {args.results}: no such file", file=sys.stderr)
        return 2
    records = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    result = score(records)
    (args.json or args.results.with_name("score.json")).write_text(json.dumps(result, indent=1))
    print(markdown(result), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
