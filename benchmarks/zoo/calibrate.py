"""Fit each transformation's model error on the calibration half (issue 32: the one half the models
may be fitted on), from the rows verify measured there.

    python benchmarks/zoo/calibrate.py benchmarks/zoo/results/2026-11-28-calibration.jsonl   # markdown
    python benchmarks/zoo/calibrate.py RESULTS.jsonl ... --json fit.json

Contract: ``fit(records, rules) -> dict`` is pure. Only records of the calibration half count (a
row of the evaluation half or the holdout group is never read: what is scored there must not
have been fitted there); of each file, the last record of each script (run.py appends one after
the runs and one after verify). A row counts where verify measured it (a speedup > 0) and the
baseline's finding predicted it; its transformation is its rule's ``predict`` (rules/*.toml).
Rows of a compile the model knew it predicts badly on the run (``weak``, where the record has
it, for a transformation of ``uncertainty.WEAK_DOWNSIDE_ERROR``) are left out: their interval
has its own downside.

The **run-to-run term** (``uncertainty.RUN_TO_RUN_HOST``): each calibration script's steady
steps/s over its diagnose runs (fresh processes of one plan on one machine; verify's baseline,
a shorter window timed earlier in the script, is not a rerun of them) and each run's host share (the share of its profiled steps the GPU idled). The model
is ``uncertainty.run_to_run``: a coefficient of variation of ``RUN_TO_RUN_GPU`` where the GPU
paces every step, rising linearly with the host share to ``RUN_TO_RUN_HOST``; the fitted value is
the one of greatest likelihood for the scripts' log steps/s variances (each ``(n - 1) s^2 /
sigma^2`` a chi-square of n - 1 degrees), on a grid of 0.001. Where a record lacks what run.py
keeps since (each run's steps/s and host share, verify's baseline's, each verify row's
``weak``), a ``reports.tgz`` beside the results file (what gpu.sh brings back) supplies them from
the reports (``upgrade``; ``--upgrade OUT`` writes the records so filled, to commit).

Each row's error is the one the interval is drawn in: log-symmetric, ``exp(|ln(predicted /
measured)|) - 1`` (a prediction 2x too high and one 2x too low both miss by 100%), less in
quadrature what the run-to-run term (at the fitted value, for verify's baseline's host share)
already covers at the interval's edge: the model error is what is left for the model. A
transformation's **edge** is the split-conformal quantile of its rows' errors for the
interval's coverage, per side: the interval leaves 5% out above and 5% below, so each side's
edge is the ``ceil((n + 1) * 0.95)``-th smallest of the rows' errors on that side (a row missed the
other way counts 0 there), the largest of them while there are fewer than nineteen. A side's
**fitted** error is its edge where that passes what the project's own examples showed
(``MODEL_ERROR``, never lowered by a few lucky rows); ``uncertainty.CALIBRATED_UPSIDE`` and
``CALIBRATED_DOWNSIDE`` carry them, with the rows they came from.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tarfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from corpus import HALVES  # noqa: E402
from run import run_summary  # noqa: E402
from score import latest  # noqa: E402

from diagnose.analysis.prediction.uncertainty import (  # noqa: E402
    INTERVAL,
    RUN_TO_RUN_GPU,
    WEAK_DOWNSIDE_ERROR,
    model_error,
    run_to_run,
)
from diagnose.record import Z_INTERVAL  # noqa: E402

CALIBRATION = HALVES[0]


def row_error(predicted: float, measured: float, rerun: float = 0.0) -> float:
    """The model error at the interval's edge that would just cover ``measured``: the
    prediction's log-distance from it, less (in quadrature) what the run-to-run term of the two
    runs verify compared already covers at the edge (``rerun``: their coefficient of variation),
    as a ratio less one."""
    distance = abs(math.log(predicted / measured))
    covered = Z_INTERVAL * math.sqrt(2) * rerun
    return math.exp(math.sqrt(max(distance**2 - covered**2, 0.0))) - 1


def conformal_edge(errors: list[float], coverage: float = INTERVAL) -> float:
    """The split-conformal quantile: the ``ceil((n + 1) * coverage)``-th smallest error (the
    largest where that rank passes n)."""
    xs = sorted(errors)
    rank = math.ceil((len(xs) + 1) * coverage)
    return xs[min(rank, len(xs)) - 1]


def calibration_rows(
    records: Iterable[dict],
    predicts: Mapping[str, str],
    rerun: Callable[[dict], float] = lambda record: 0.0,
) -> list[dict]:
    """The measured and predicted verify rows of the calibration half's records, each with its
    transformation and error (``row_error``, ``rerun`` giving the record's run-to-run term)."""
    rows = []
    for record in records:
        if record.get("half") != CALIBRATION:
            continue
        term = rerun(record)
        for row in (record.get("verify") or {}).get("rows") or []:
            predicted, measured = row.get("predicted"), row.get("measured")
            if not isinstance(measured, (int, float)) or measured <= 0:
                continue
            if not isinstance(predicted, (int, float)) or predicted <= 0:
                continue
            transformation = predicts.get(row.get("rule") or "")
            if transformation is None:
                continue
            entry = {
                "script": record["name"],
                "rule": row["rule"],
                "transformation": transformation,
                "predicted": float(predicted),
                "measured": float(measured),
                "error": row_error(float(predicted), float(measured), term),
                "rerun": term,
                "weak": bool(row.get("weak")),
            }
            rows.append(entry)
    return rows


#: each side of the interval holds half of what it leaves out: its edge is a one-sided quantile
SIDE_COVERAGE = (1 + INTERVAL) / 2


def fit(
    records: Iterable[dict],
    predicts: Mapping[str, str],
    rerun: Callable[[dict], float] = lambda record: 0.0,
) -> dict:
    """Per transformation: its calibration rows, the conformal edge of each side (a row missed
    upwards counts 0 on the lower side, and the other way round), the examples' model error, and
    each side's fitted error where its edge passes the examples' (None: the examples' stands)."""
    rows = calibration_rows(records, predicts, rerun)
    out: dict[str, dict] = {}
    for transformation in sorted({r["transformation"] for r in rows}):
        mine = [r for r in rows if r["transformation"] == transformation]
        used = [r for r in mine if not (r["weak"] and transformation in WEAK_DOWNSIDE_ERROR)]
        examples = model_error(transformation)
        entry: dict = {"rows": used, "left_weak": len(mine) - len(used), "examples": examples}
        for side, above in (("upside", True), ("downside", False)):
            errors = [r["error"] if (r["measured"] > r["predicted"]) == above else 0.0 for r in used]
            edge = conformal_edge(errors, SIDE_COVERAGE) if errors else None
            entry[f"{side}_edge"] = edge
            entry[side] = edge if edge is not None and edge > examples else None
        entry["largest_rank"] = bool(used) and math.ceil((len(used) + 1) * SIDE_COVERAGE) >= len(used)
        out[transformation] = entry
    return out


class Reports:
    """The report.json files of a ``reports.tgz`` (gpu.sh's), by their path in it."""

    def __init__(self, path: Path | None) -> None:
        self.reports: dict[str, dict] = {}
        if path is not None and path.is_file():
            with tarfile.open(path) as tar:
                for member in tar.getmembers():
                    # runs/<name>/<run>/diagnose/report.json, under a lane's folder where gpu.sh ran lanes
                    parts = member.name.split("/")
                    if member.isfile() and parts[-2:] == ["diagnose", "report.json"] and "runs" in parts:
                        f = tar.extractfile(member)
                        if f is not None:
                            at = len(parts) - 1 - parts[::-1].index("runs")
                            self.reports["/".join(parts[at:])] = json.loads(f.read())

    def _report(self, name: str, run: str) -> dict | None:
        return self.reports.get(f"runs/{name}/{run}/diagnose/report.json")

    def figures(self, name: str, run: str) -> tuple[float | None, float | None]:
        """A run's steady steps/s and host share (``run``: run0, run1, ..., verify)."""
        report = self._report(name, run)
        if not report:
            return None, None
        summary = run_summary(report)
        return summary["steps_per_s"], summary["host_share"]

    def weakness(self, name: str, rule: str) -> str | None:
        """Why verify's baseline knew it predicts ``rule``'s change badly (its finding's
        ``model_weakness``; None: it did not, or no report says)."""
        report = self._report(name, "verify") or {}
        return next(
            (
                f["model_weakness"]
                for f in report.get("findings") or []
                if f.get("rule") == rule and f.get("model_weakness")
            ),
            None,
        )


def upgrade(record: dict, reports: Reports) -> dict:
    """The record with what run.py keeps since (each run's and verify's baseline's steady
    steps/s and host share, each verify row's ``weak``) read off its reports where it lacks
    them; the rest as it was."""
    out = json.loads(json.dumps(record))
    name = out["name"]
    for i, run in enumerate(out.get("runs") or []):
        if "error" in run:
            continue
        found = reports.figures(name, Path(run.get("run_dir") or f"run{i}").name)
        run.setdefault("steps_per_s", found[0])
        if run.get("host_share") is None:
            run["host_share"] = found[1]
    verify = out.get("verify")
    if verify and "error" not in verify:
        found = reports.figures(name, "verify")
        if verify.get("steps_per_s") is None:
            verify["steps_per_s"] = found[0]
        if verify.get("host_share") is None:
            verify["host_share"] = found[1]
        for row in verify.get("rows") or []:
            if "weak" not in row:
                row["weak"] = reports.weakness(name, row.get("rule") or "")
    return out


def steady_runs(record: dict) -> list[tuple[float, float]]:
    """A script's diagnose runs as (steady steps/s, host share), each where both are known: runs
    of one plan, so that what differs between them is the rerun (verify's baseline, a shorter
    window timed earlier in the run, is not one of them)."""
    out = []
    for run in record.get("runs") or []:
        rate, share = run.get("steps_per_s"), run.get("host_share")
        if "error" not in run and isinstance(rate, (int, float)) and rate > 0 and isinstance(share, (int, float)):
            out.append((float(rate), float(share)))
    return out


def rerun_term(record: dict, host: float | None) -> float:
    """A record's run-to-run term at a host-paced value ``host``: for verify's baseline's host
    share (0 where either is unknown: the model error then takes it all)."""
    share = (record.get("verify") or {}).get("host_share")
    return 0.0 if share is None or host is None else run_to_run(share, host)


def fit_run_to_run(scripts: Mapping[str, list[tuple[float, float]]]) -> dict:
    """The host-paced coefficient of variation of greatest likelihood (see the module's
    docstring), with each script's figures; None where no script has two runs."""
    rows: list[dict[str, Any]] = []
    for name, runs in scripts.items():
        if len(runs) < 2:
            continue
        logs = [math.log(rate) for rate, _ in runs]
        rows.append(
            {
                "script": name,
                "runs": len(runs),
                "cv": statistics.stdev(logs),
                "host_share": statistics.fmean(share for _, share in runs),
                "steps_per_s": [round(rate, 2) for rate, _ in runs],
            }
        )
    if not rows:
        return {"host": None, "scripts": rows}

    def loglik(host: float) -> float:
        total = 0.0
        for r in rows:
            sigma = run_to_run(r["host_share"], host)
            dof = r["runs"] - 1
            total += -dof * math.log(sigma) - dof * r["cv"] ** 2 / (2 * sigma**2)
        return total

    grid = [RUN_TO_RUN_GPU + i / 1000 for i in range(round((1 - RUN_TO_RUN_GPU) * 1000) + 1)]
    return {"host": max(grid, key=loglik), "scripts": rows}


def markdown(result: dict) -> str:
    lines = [
        "| transformation | rows (script rule: predicted -> measured, error left to the model) | upside edge | downside edge | examples' | fitted upside | fitted downside |",
        "|---|---|---|---|---|---|---|",
    ]

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    for name, entry in result.items():
        rows = "; ".join(
            f"{r['script']} {r['rule']}: {r['predicted']:.2f}x -> {r['measured']:.2f}x, {r['error']:.0%}"
            for r in entry["rows"]
        )
        if entry["left_weak"]:
            rows += f" ({entry['left_weak']} weak compile rows left out)"
        largest = " (the largest)" if entry["largest_rank"] else ""
        edges = [
            pct(entry[f"{side}_edge"]) + (largest if entry[f"{side}_edge"] else "") for side in ("upside", "downside")
        ]
        lines.append(
            f"| {name} | {rows or '-'} | {edges[0]} | {edges[1]} | {entry['examples']:.0%} "
            f"| **{pct(entry['upside'])}** | **{pct(entry['downside'])}** |"
        )
    return "\n".join(lines)


def rerun_markdown(rerun: dict) -> str:
    lines = ["| script | runs | steps/s | host share | run-to-run CV |", "|---|---|---|---|---|"]
    for r in rerun["scripts"]:
        steps = ", ".join(f"{v:g}" for v in r["steps_per_s"])
        lines.append(f"| {r['script']} | {r['runs']} | {steps} | {r['host_share']:.0%} | {r['cv']:.1%} |")
    host = "-" if rerun["host"] is None else f"{rerun['host']:.1%}"
    lines.append(f"\nRUN_TO_RUN_HOST of greatest likelihood: **{host}** (RUN_TO_RUN_GPU {RUN_TO_RUN_GPU:.0%})")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, nargs="+", help="run.py's results.jsonl files")
    p.add_argument("--json", type=Path, help="write the fit here too")
    p.add_argument(
        "--upgrade",
        type=Path,
        help="write the records read (each file's last per script), their missing fields filled from reports.tgz, here",
    )
    args = p.parse_args()
    missing = [str(path) for path in args.results if not path.is_file()]
    if missing:
        print(f"error: {', '.join(missing)}: no such file", file=sys.stderr)
        return 2
    from diagnose.analysis.verdict.rules import load_rules

    predicts = {rule.id: rule.predict for rule in load_rules() if rule.predict}
    records: list[dict] = []
    for path in args.results:
        reports = Reports(path.with_name("reports.tgz"))
        records += [
            upgrade(record, reports)
            for record in latest([json.loads(line) for line in path.read_text().splitlines() if line.strip()]).values()
        ]
    calibration = [r for r in records if r.get("half") == CALIBRATION]
    rerun = fit_run_to_run({f"{r['name']} #{i}": steady_runs(r) for i, r in enumerate(calibration)})
    result = fit(records, predicts, lambda record: rerun_term(record, rerun["host"]))
    print(markdown(result))
    print()
    print(rerun_markdown(rerun))
    if args.json:
        args.json.write_text(json.dumps({"model_error": result, "run_to_run": rerun}, indent=1) + "\n")
    if args.upgrade:
        args.upgrade.write_text("".join(json.dumps(r) + "\n" for r in records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
