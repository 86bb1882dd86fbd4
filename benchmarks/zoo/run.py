"""Run the outside corpus under diagnose: top finding over reruns, then what verify measures.

    python benchmarks/zoo/run.py --scripts zoo-scripts --out zoo-out --half evaluation
    python benchmarks/zoo/run.py --scripts zoo-scripts --out zoo-out --half all --reruns 2 --verify-top 2 --budget-s 600
    python benchmarks/zoo/run.py --scripts zoo-scripts --out zoo-smoke --half all --cpu-smoke

For each script of the half (the manifest, benchmarks/zoo/manifest.toml; the sources fetched by
fetch.py into --scripts): its data is generated if missing (prepare.py), then ``python -m
diagnose run`` runs it 1 + --reruns times (each into OUT/runs/<name>/run<i>), recording the top
finding of each with its predicted speedup, interval and whether it was measured in the run;
then ``python -m diagnose verify --top K`` measures, against its own baseline and in the runs'
window, the top the runs named (``--rule``: the one most of them led with, then the first run's
next findings; ``runs_top_rules``), or where no run named one, verify's own top K.
OUT/results.jsonl gets one line per script after its runs and another after verify (the last line of a name is its record), so a run cut short still counts; score.py reads it.
One failing or hanging script (--timeout-s per command) never stops the others; --budget-s
stops starting new scripts once the estimated time would pass it.

A ``launcher = "torchrun"`` script runs as one process with the variables torchrun would set
(RANK, LOCAL_RANK, WORLD_SIZE=1, MASTER_ADDR/PORT), for run and verify alike: verify has no
launcher of its own.

--cpu-smoke checks that each script starts: its ``cpu_args``, CUDA hidden, a window of a few
steps, no reruns and no verify; a script whose report.json is written passes (OUT/smoke.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import corpus
import fetch
import prepare

REPO = Path(__file__).resolve().parents[2]

#: diagnose run's window for the corpus: its defaults (what a user gets)
RUN_WINDOW = ["--warmup", "5", "--steps", "10", "--timed-steps", "20"]
#: verify's window: the runs' own, so that its diagnosis (the prediction the error is measured
#: on) is made as the runs' were; a shorter one (warm-up 3, 5 steps, 15 timed, until the eleventh
#: run) read PointNet's compile 1.00x where the three runs read 1.46-1.52x
VERIFY_WINDOW = RUN_WINDOW
SMOKE_WINDOW = ["--warmup", "3", "--steps", "2", "--max-steps", "2", "--timed-steps", "2"]
TORCHRUN_ENV = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": os.environ.get("ZOO_MASTER_PORT", "29517"),  # a lane of gpu.sh: its own port
}


def _interval(finding: dict) -> list[float] | None:
    """A finding's predicted interval, [low, high], whatever shape the report gives it in."""
    for key in ("predicted_interval", "interval", "predicted_speedup_interval"):
        value = finding.get(key)
        if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
            return [float(value[0]), float(value[1])]
        if isinstance(value, dict):
            low, high = value.get("low", value.get("lo")), value.get("high", value.get("hi"))
            if isinstance(low, (int, float)) and isinstance(high, (int, float)):
                return [float(low), float(high)]
    return None


def _measured(finding: dict) -> float | None:
    """The speedup a short A/B inside ``diagnose run`` measured for a finding (None: not measured)."""
    value = finding.get("measured")
    if isinstance(value, dict):
        speedup = value.get("speedup")
        return float(speedup) if isinstance(speedup, (int, float)) else None
    if value is True:
        speedup = finding.get("measured_speedup")
        return float(speedup) if isinstance(speedup, (int, float)) else None
    return None


def finding_summary(finding: dict) -> dict:
    """What score.py needs of one finding; every key read defensively (older reports lack some)."""
    return {
        "rule": finding.get("rule"),
        "predicted": finding.get("predicted_speedup"),
        "interval": _interval(finding),
        "measured": _measured(finding),
        # what a rerun of the in-run A/B reads (the report's measured.interval; None before it)
        "measured_interval": _interval(finding.get("measured") or {})
        if isinstance(finding.get("measured"), dict)
        else None,
        "basis": finding.get("basis"),
        # why the model knew it predicts this change badly on the run (None: no known weakness);
        # calibrate.py leaves a weak compile's rows out of the model error it fits
        "weak": finding.get("model_weakness"),
        "first_share": finding.get("first_share"),
        "gain_bound": finding.get("gain_bound"),
    }


def host_share(report: dict) -> float | None:
    """The share of the profiled steps' time the GPU idled (the ``exposed.host`` symptom)."""
    symptom = (report.get("symptoms") or {}).get("exposed.host")
    value = symptom.get("value") if isinstance(symptom, dict) else symptom
    return float(value) if isinstance(value, (int, float)) else None


def run_summary(report: dict) -> dict:
    findings = report.get("findings") or []
    top = finding_summary(findings[0]) if findings else None
    steady = (report.get("throughput") or {}).get("steady") or {}
    return {
        "top": top["rule"] if top else None,
        "top_finding": top,
        "findings": [finding_summary(f) for f in findings],
        "considered": report.get("considered") or [],
        "verdict": report.get("verdict"),
        "healthy": report.get("healthy"),
        "steps_per_s": steady.get("steps_per_s"),
        # with steps_per_s, what calibrate.py fits the run-to-run term on
        "host_share": host_share(report),
    }


def select_scripts(scripts: list[corpus.Script], only: list[str] | None) -> list[corpus.Script]:
    """The half's scripts named by ``--only``, in the order they are named (the budget skips the
    last ones: a call of ``ignite-mnist segmentation-enet-voc`` ran ENet first, in the manifest's
    order, and had no time left for Ignite); all of them, in the manifest's order, without it."""
    if not only:
        return list(scripts)
    order = {name: i for i, name in enumerate(only)}
    return sorted((s for s in scripts if s.name in order), key=lambda s: order[s.name])


def runs_top_rules(runs: list[dict], count: int) -> list[str]:
    """The rules verify measures: the runs' top finding (the one most of them name; of a tie, the
    earliest run's), then the first run's next findings, ``count`` in all; none where no run named
    a top (verify then takes its own). What the corpus scores is the top a user is told, with the
    run's check in it, not verify's own ranking, which has no check (PointNet's three runs led
    with a compile; verify's own diagnosis with a change none of them named, which it measured
    0.80x)."""
    tops = [run["top"] for run in runs if run.get("top")]
    if not tops or count <= 0:
        return []
    top = max(tops, key=lambda rule: (tops.count(rule), -tops.index(rule)))
    rules = [top]
    first = next(run for run in runs if run.get("top"))
    for finding in first.get("findings") or []:
        if len(rules) >= count:
            break
        if finding.get("rule") and finding["rule"] not in rules:
            rules.append(finding["rule"])
    return rules


def verify_summary(report: dict) -> dict:
    experiments = report.get("experiments") or {}
    by_rule = {f.get("rule"): finding_summary(f) for f in report.get("findings") or []}
    rows = []
    for row in experiments.get("rows") or []:
        if row.get("role") != "recommendation":
            continue
        finding = by_rule.get(row.get("rule")) or {}
        rows.append(
            {
                "rule": row.get("rule"),
                "knobs": row.get("knobs"),
                "status": row.get("status"),
                "verdict": row.get("verdict"),
                "measured": row.get("speedup"),
                "predicted": row.get("predicted_speedup", finding.get("predicted")),
                "interval": _interval(row) or finding.get("interval"),
                "weak": finding.get("weak"),
                "via": row.get("via"),
            }
        )
    summary = run_summary(report)
    return {
        "top": summary["top"],
        "top_finding": summary["top_finding"],
        "baseline_spread": experiments.get("baseline_spread"),
        "baseline_spread_from": experiments.get("baseline_spread_from"),
        "rows": rows,
        # the baseline's own steady figure: one more run of the script (calibrate.py)
        "steps_per_s": summary["steps_per_s"],
        "host_share": summary["host_share"],
    }


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str, str, float]:
    """Run ``cmd``; on timeout kill its whole process group (DataLoader workers, compile workers)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    _CHILDREN.append(p)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err, time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err, time.perf_counter() - t0
    finally:
        _CHILDREN.remove(p)


#: the command running now: its own session, so a signal to run.py does not reach it
_CHILDREN: list[subprocess.Popen] = []


def _stop(signum: int, _frame: object) -> None:
    """Killed (``timeout``, Ctrl-C): take the running command's whole group down with us, so
    that no training script is left holding the GPU; what results.jsonl holds stays."""
    for child in list(_CHILDREN):
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(f"stopped by signal {signum}", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def script_env(script: corpus.Script, src: Path, cpu: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    extra = {k: v.replace("{src}", str(src)) for k, v in script.env.items()}
    # diagnose itself (this checkout) first, then what the script needs
    paths = [str(REPO), extra.pop("PYTHONPATH", ""), env.get("PYTHONPATH", "")]
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if script.launcher == "torchrun":
        env.update(TORCHRUN_ENV)
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def script_arguments(script: corpus.Script, src: Path, cpu: bool, env: dict[str, str]) -> list[str]:
    """The script's arguments (``cpu_args`` for the smoke check) with the manifest's placeholders
    filled: ``{src}``, its fetched folder, and ``{cuda_visible_devices}``, the GPUs the run is
    given (its CUDA_VISIBLE_DEVICES, "0" where none is set), for a script that sets that variable
    itself from an option: in a lane of gpu.sh it must name the lane's GPU, not the host's first."""
    visible = env.get("CUDA_VISIBLE_DEVICES") or "0"
    chosen = (script.cpu_args or ()) if cpu else script.args
    return [a.replace("{src}", str(src)).replace("{cuda_visible_devices}", visible) for a in chosen]


def _tail(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def diagnose_once(cmd: list[str], src: Path, script: corpus.Script, env: dict[str, str], timeout: float) -> dict:
    code, out, err, wall = _run(cmd, src / script.cwd, env, timeout)
    record: dict = {"exit_code": code, "wall_s": round(wall, 1)}
    if code is None:
        record["error"] = f"timed out after {timeout:.0f} s: {_tail(err, 3)}"
        return record
    try:
        report = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        report = None
    if report is None:
        record["error"] = _tail(err) or f"exit {code}, no report"
        return record
    status = report.get("status") or {}
    profiled = (report.get("run") or {}).get("profiled_steps")
    record["state"] = status.get("state")
    if code != 0 or not profiled:
        # diagnose writes a report even when the script died before its first step: no verdict
        record["error"] = f"{status.get('message') or f'exit {code}'}; profiled steps: {profiled or 0}: {_tail(err, 3)}"
        return record
    record["report"] = report
    return record


def run_script(
    script: corpus.Script, args: argparse.Namespace, out: Path, log: Callable[[str], None], save: Callable[[dict], None]
) -> dict:
    """One script: its runs, then verify; ``save`` gets the record after the runs (a run cut
    short during verify keeps them), the caller the whole record at the end."""
    src = args.scripts / script.repo.slug
    record: dict = {
        "name": script.name,
        "repo": script.repo.name,
        "commit": script.commit,
        "half": script.half,
        "domain": script.domain,
        "kind": script.kind,
        "runs": [],
        "verify": None,
    }
    if fetch.fetched_commit(src) != script.commit:
        record.update(status="missing", error=f"{src} is not fetched at {script.commit[:12]} (run fetch.py)")
        return record
    if not args.no_prepare:
        try:
            for step in script.prepare:
                prepare.prepare(step, src)
        except Exception as e:  # noqa: BLE001 - the script cannot run without its data: say so, go on
            record.update(status="failed", error=f"prepare {step.get('kind')}: {type(e).__name__}: {e}")
            return record
    cpu = args.cpu_smoke
    if cpu and script.cpu_args is None:
        record.update(status="skipped", error=f"no CPU variant: {script.cpu_skip}")
        return record
    env = script_env(script, src, cpu)
    script_args = script_arguments(script, src, cpu, env)
    target = str(src / script.path)
    extra = shlex.split(args.diagnose_args or "")
    runs_dir = out / "runs" / script.name
    window = SMOKE_WINDOW if cpu else RUN_WINDOW
    for i in range(1 if cpu else 1 + args.reruns):
        run_dir = runs_dir / f"run{i}"
        # with diagnose run's check (no --no-check): the corpus scores the ranking a user gets, the
        # check's measurements included (``measured_speedup``); verify's runs take --no-check themselves
        cmd = [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--quiet",
            "--json",
            "--overwrite",
            "--out",
            str(run_dir),
            *window,
            *extra,
            target,
            "--",
            *script_args,
        ]
        result = diagnose_once(cmd, src, script, env, args.timeout_s)
        result["run_dir"] = str(run_dir)
        report = result.pop("report", None)
        if report is not None:
            result.update(run_summary(report))
        record["runs"].append(result)
        top = result.get("top_finding") or {}
        said = (
            f"top {result.get('top') or 'none'}"
            + (f" predicted {top['predicted']:.2f}x" if top.get("predicted") else "")
            if report is not None
            else f"FAILED: {result.get('error', '')[-300:]}"
        )
        log(f"  run {i + 1}: {said} ({result['wall_s']} s)")
    ok = [r for r in record["runs"] if "error" not in r]
    record["status"] = "ok" if ok else "failed"
    if not ok:
        record["error"] = record["runs"][-1].get("error")
    if cpu:
        record["smoke"] = "passed" if ok else "failed"
        return record
    save(dict(record, phase="runs"))
    if not ok or args.verify_top == 0:
        return record
    asked = runs_top_rules(ok, args.verify_top)
    verify_dir = runs_dir / "verify"
    if verify_dir.exists():
        verify_dir = runs_dir / f"verify-{int(time.time())}"
    cmd = [
        sys.executable,
        "-m",
        "diagnose",
        "verify",
        "--json",
        "--top",
        str(args.verify_top),
        "--repeats",
        str(args.verify_repeats),
        "--timeout",
        str(int(args.timeout_s)),
        "--out",
        str(verify_dir),
        *[option for rule in asked for option in ("--rule", rule)],
        *VERIFY_WINDOW,
        target,
        "--",
        *script_args,
    ]
    timeout = args.timeout_s * (args.verify_repeats + args.verify_top + 1)
    result = diagnose_once(cmd, src, script, env, timeout)
    result["run_dir"] = str(verify_dir)
    report = result.pop("report", None)
    if report is not None:
        result.update(verify_summary(report))
        if asked:  # the top scored is the runs' (what a user is told), measured by verify
            result["diagnosis_top"], result["top"], result["asked"] = result["top"], asked[0], asked
        measured = (
            ", ".join(
                f"{r['rule']} {r['measured']:.2f}x" if r.get("measured") else f"{r['rule']} ({r.get('status')})"
                for r in result["rows"]
            )
            or "nothing to try"
        )
        log(
            f"  verify: top {result.get('top') or 'none'}; measured {measured}; spread {result.get('baseline_spread')} ({result['wall_s']} s)"
        )
    else:
        log(f"  verify FAILED: {result.get('error', '')[-300:]}")
    record["verify"] = result
    return record


def finished(results: Path) -> set[str]:
    """The scripts whose last record is whole: verify ran, or the script failed (a record of the
    runs alone, or one skipped for the budget, is not)."""
    last: dict[str, dict] = {}
    if results.exists():
        for line in results.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                last[record["name"]] = record
    return {name for name, r in last.items() if r.get("phase") != "runs" and r.get("status") not in ("skipped", None)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scripts", type=Path, required=True, help="the folder fetch.py filled")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--half", choices=[*corpus.GROUPS, "all"], required=True)
    p.add_argument("--reruns", type=int, default=2, help="diagnose runs after the first (default 2: three runs)")
    p.add_argument(
        "--verify-top", type=int, default=1, choices=[0, 1, 2, 3], help="recommendations verify measures (0: no verify)"
    )
    p.add_argument(
        "--verify-repeats", type=int, default=1, help="verify's baseline runs (1: the spread of its steps' block means)"
    )
    p.add_argument(
        "--budget-s", type=float, help="start no script whose estimate (gpu_s) would pass this many seconds in all"
    )
    p.add_argument("--timeout-s", type=float, default=300, help="seconds one diagnose run may take")
    p.add_argument("--only", nargs="*", help="script names, run in the order given")
    p.add_argument("--diagnose-args", default="", help='more options for each diagnose run, e.g. "--no-check"')
    p.add_argument(
        "--resume",
        action="store_true",
        help="skip the scripts OUT's results already hold whole (runs and verify, or failed)",
    )
    p.add_argument("--no-prepare", action="store_true", help="the data is there: do not check it")
    p.add_argument(
        "--cpu-smoke", action="store_true", help="does each script start? its cpu_args, a few steps, no verify"
    )
    p.add_argument("--manifest", type=Path, default=corpus.MANIFEST)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    args.scripts = args.scripts.resolve()
    manifest = corpus.load(args.manifest)
    scripts = select_scripts(manifest.half(args.half), args.only)
    unknown = set(args.only or ()) - {s.name for s in manifest.scripts}
    if unknown:
        print(f"error: no script named {', '.join(sorted(unknown))} in the manifest", file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = out / ("smoke.jsonl" if args.cpu_smoke else "results.jsonl")

    def append(record: dict) -> None:
        with results.open("a") as f:
            f.write(json.dumps(record) + "\n")

    done = finished(results) if args.resume else set()
    t0 = time.perf_counter()
    estimate = sum(s.gpu_s for s in scripts)
    print(
        f"{len(scripts)} scripts ({args.half}); estimated {estimate:.0f} s of GPU time; results in {results}",
        flush=True,
    )
    for n, script in enumerate(scripts, 1):
        elapsed = time.perf_counter() - t0
        if script.name in done:
            print(f"[{n}/{len(scripts)}] {script.name}: already in {results.name}", flush=True)
            continue
        if args.budget_s is not None and elapsed + script.gpu_s > args.budget_s:
            print(
                f"[{n}/{len(scripts)}] {script.name}: skipped, {elapsed:.0f} s spent and its estimate {script.gpu_s:.0f} s would pass --budget-s",
                flush=True,
            )
            append(
                {
                    "name": script.name,
                    "repo": script.repo.name,
                    "half": script.half,
                    "status": "skipped",
                    "error": "budget",
                    "runs": [],
                    "verify": None,
                }
            )
            continue
        print(
            f"[{n}/{len(scripts)}] {script.name} ({script.repo.name}, {script.kind}, {script.half}) at {elapsed:.0f} s",
            flush=True,
        )
        try:
            record = run_script(script, args, out, lambda line: print(line, flush=True), append)
        except Exception as e:  # noqa: BLE001 - a bug of ours on one script never stops the others
            record = {
                "name": script.name,
                "repo": script.repo.name,
                "half": script.half,
                "status": "failed",
                "error": f"{type(e).__name__}: {e}",
                "runs": [],
                "verify": None,
            }
        record["wall_s"] = round(time.perf_counter() - t0 - elapsed, 1)
        append(record)
        if record.get("error"):
            print(f"  {record['status']}: {record['error']}", flush=True)
    print(f"done in {time.perf_counter() - t0:.0f} s; {results}", flush=True)
    if args.cpu_smoke:
        rows = [json.loads(line) for line in results.read_text().splitlines()]
        last = {r["name"]: r for r in rows}
        for name, r in last.items():
            print(
                f"| {name} | {r.get('smoke', r.get('status'))} | {(r.get('error') or '').splitlines()[-1][:120] if r.get('error') else ''} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
