"""The distributed rules against the truth on N GPUs: each planted example under torchrun, its rule
fired or not, its fix measured, the predicted gain beside the measured one.

    python benchmarks/dist_truth.py --out dist-2gpu --gpus 2 --budget-s 540        # a host with 2 GPUs
    python benchmarks/dist_truth.py --out dist-4gpu --gpus 4 --budget-s 540        # ... with 4
    python benchmarks/dist_truth.py --out smoke --cpu-smoke                         # 2 gloo ranks, tiny

For each case (``CASES``, in order of priority) one command of diagnose's own, in its own
session (a timeout ends the whole torchrun job, not only its parent):

* ``verify``: ``diagnose verify --nproc-per-node N --rule RULE`` of the planted example: the
  baseline's report says which rules fired; verify then tries the planted rule's knob, wherever
  its finding ranks (DIST004's backend, DIST006's prefetch, DIST007's bf16 reduction, DIST008's
  and DIST009's bucket size, each a torchrun job), and measures the job's samples/s (steps/s
  where the script has no samples).
* ``sweep``: rules whose fix is the script's own change (DIST003's straggler, DIST005's uneven
  data split equally, DIST002's no_sync accumulation): ``diagnose sweep --nproc-per-node N --set arg.X=planted,fixed``;
  the first point's report says what fired, the second is the fix. DIST002's accumulation does 4
  micro-batches a step, so its steps/s are multiplied by 4 (``work_knob``).
* ``run``: one ``diagnose run --nproc-per-node N`` (the FSDP example with the advice applied: the
  rules should stay quiet).
* ``scaling``: ``diagnose sweep --set nproc_per_node=1,N`` of the straggler example without its
  straggler (the job's samples/s) and of the DDP MLP (steps/s times the ranks: it has no
  samples): N ranks' rate over N times one rank's (scaling efficiency).

Every report's ``distributed`` section gives the rest of docs/distributed.md's "Not run" list:
exposed communication per collective kind (each kind at its worst rank), the straggler found.

Writes, under ``--out``, as it goes (a killed run keeps what it measured): ``results.json``
(every case's row, rewritten after each case), ``results.md`` (the tables), ``<case>.log`` (the
command's stderr tail) and the run directories under ``runs/``. Cases already in
``results.json`` are skipped (``--rerun`` runs them again): call it again with a fresh budget to
go on. ``--budget-s`` bounds the whole call: a case is not started without ``MIN_CASE_S`` left
(by its kind), and each command's timeout is what remains. Keep NCCL's NVLink multicast off where the host asks
for it (``NCCL_NVLS_ENABLE=0`` reaches the ranks through the environment).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the repository's diagnose, as the commands it runs use
from diagnose.supervise import run_bounded  # noqa: E402

#: a case is not started with less than this left of the budget (seconds, by kind: a verify is
#: three torchrun jobs, a sweep two; a case cut short is lost, and run again by the next call)
MIN_CASE_S = {"verify": 150.0, "sweep": 100.0, "scaling": 100.0, "run": 60.0}


#: beside the dist.* symptoms, what tells a host-bound rank from a communication-bound one
WHY_SYMPTOMS = ("gpu.busy", "exposed.host_code", "exposed.launch_model", "exposed.communication_own")


@dataclass(frozen=True)
class Case:
    name: str
    #: the rule the example plants ("" for none: the rules should stay quiet)
    rule: str
    kind: str  # verify, sweep, run, scaling
    script: str
    args: tuple[str, ...] = ()
    #: --set of every run (verify's baseline included): DIST004's gloo
    base_knobs: tuple[str, ...] = ()
    #: sweep: the knob and its planted and fixed values
    sweep: str = ""
    #: sweep: the knob whose value is the work per step (accumulation): rates are scaled by it
    work_knob: str = ""
    gpu_only: bool = False
    #: rules that must not fire (a "run" case)
    quiet: tuple[str, ...] = ()
    note: str = ""
    #: on GPUs, the sizes tried in turn (added to ``args``) until the planted rule fires: a plant
    #: sized for one GPU can leave another host-bound (LAUNCH001 leads, the rule stays silent);
    #: each size that does not fire costs its baseline only (verify tries nothing then)
    sizes: tuple[tuple[str, ...], ...] = ()


CASES: tuple[Case, ...] = (
    Case(
        "ddp-one-bucket",
        "DIST008",
        "verify",
        "examples/ddp_buckets.py",
        ("--bucket-cap-mb", "10000"),
        note="one bucket holds every gradient: its all-reduce starts after backward",
    ),
    Case(
        "ddp-one-bucket-compute",
        "DIST008",
        "verify",
        "examples/ddp_buckets.py",
        ("--bucket-cap-mb", "10000"),
        note="the same, with backward's kernels long against the all-reduce: where smaller buckets can help "
        "(on 2 H200s batch 1024 left the all-reduce 8% of the step: too little to fire)",
        sizes=(("--batch", "256"), ("--batch", "512"), ("--batch", "128")),
    ),
    Case(
        "fsdp2-all-gather",
        "DIST006",
        "verify",
        "examples/fsdp_exposed_comm.py",
        ("--plant", "all-gather"),
        note="fully_shard blocks resharded after forward, no prefetch",
        sizes=(("--width", "8192"), ("--width", "8192", "--batch", "128"), ()),
    ),
    Case(
        "straggler",
        "DIST003",
        "sweep",
        "examples/ddp_straggler.py",
        (),
        sweep="arg.no-delay=none,flag",
        note="the last rank prepares each sample longer; the fix: --no-delay",
    ),
    Case(
        "scaling",
        "",
        "scaling",
        "examples/ddp_straggler.py",
        ("--no-delay",),
        sweep="nproc_per_node=1,{n}",
        note="the same per-rank batch on 1 and N ranks",
    ),
    Case(
        "scaling-mlp",
        "",
        "scaling",
        "examples/ddp_buckets.py",
        ("--bucket-cap-mb", "25", "--batch", "256"),
        sweep="nproc_per_node=1,{n}",
        note="a deep MLP under DDP, default buckets, batch 256 (compute-bound on an H200: GPU 97% busy); "
        "no samples: steps/s times the ranks",
    ),
    Case(
        "fsdp2-reduce-scatter",
        "DIST007",
        "verify",
        "examples/fsdp_exposed_comm.py",
        ("--plant", "reduce-scatter"),
        note="parameters kept gathered, fp32 gradients reduced every step",
        sizes=(("--width", "8192"), ("--width", "8192", "--batch", "128"), ()),
    ),
    Case(
        "ddp-small-buckets",
        "DIST009",
        "verify",
        "examples/ddp_buckets.py",
        ("--bucket-cap-mb", "0.25"),
        note="dozens of 0.25 MiB buckets a step",
        sizes=(("--depth", "48", "--width", "1024"), ("--depth", "64", "--width", "1024")),
    ),
    Case(
        "fsdp1",
        "DIST006",
        "verify",
        "examples/fsdp_exposed_comm.py",
        ("--fsdp1",),
        note="FullyShardedDataParallel (FSDP1) blocks, no prefetch",
        sizes=(("--width", "8192"), ()),
    ),
    Case(
        "ddp-comm-bound",
        "DIST002",
        "sweep",
        "examples/ddp_buckets.py",
        ("--bucket-cap-mb", "25"),
        sweep="arg.accumulate=1,4",
        work_knob="arg.accumulate",
        note="DDP's default buckets; the fix: all-reduce once per 4 micro-batches (no_sync)",
    ),
    Case(
        "uneven-data",
        "DIST005",
        "sweep",
        "examples/ddp_straggler.py",
        (),
        sweep="arg.split=uneven,even",
        note="the last rank's batches twice as large; the fix: the same samples per step, split equally",
    ),
    Case(
        "gloo-on-gpus",
        "DIST004",
        "verify",
        "examples/ddp_buckets.py",
        ("--bucket-cap-mb", "25"),
        base_knobs=("backend=gloo",),
        gpu_only=True,
        note="the script's process group forced to gloo (--set backend=gloo); verify tries backend=nccl",
    ),
    Case(
        "fsdp2-fixed",
        "",
        "run",
        "examples/fsdp_exposed_comm.py",
        ("--fixed",),
        # DIST006 may still speak in its [already] words: prefetched gathers longer than the
        # compute at batch 8 (2 and 4 H200s, 2026-11-27); what must not come is its prefetch advice
        quiet=("DIST007",),
        note="the rules' advice applied to the --width 8192 plant: prefetch, last block kept gathered, bf16 "
        "reduction, accumulation without resharding between micro-batches",
        sizes=(("--width", "8192"),),
    ),
)


@dataclass
class Settings:
    out: Path
    nproc: int
    smoke: bool
    budget_s: float
    timeout_s: float
    top: int
    repeats: int
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def window(self) -> list[str]:
        if self.smoke:
            return ["--warmup", "2", "--steps", "3", "--timed-steps", "6"]
        return ["--warmup", "5", "--steps", "5", "--timed-steps", "20"]

    def script_args(self, case: Case, size: tuple[str, ...] = ()) -> list[str]:
        return [*case.args, *(["--small", "--steps", "60"] if self.smoke else size)]

    def sizes(self, case: Case) -> tuple[tuple[str, ...], ...]:
        """The sizes to try in turn (on the CPU ``--small`` sizes every case: one run)."""
        return ((),) if self.smoke or not case.sizes else case.sizes


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_command(cmd: list[str], timeout: float, log_path: Path) -> tuple[int | None, str]:
    """Run in its own session; on timeout the whole group (torchrun and its ranks) is ended.
    Returns the exit code (None: timed out) and stdout; stderr goes to ``log_path``."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off unless the caller chose
    with log_path.open("w") as err:
        err.write(" ".join(cmd) + "\n\n")
        err.flush()

        def to_log(line: str) -> bool:  # the job's stderr into its log as it comes, none kept
            err.write(line)
            return False

        # past its time, or on Ctrl-C or SIGTERM, the job in its own session goes (politely first)
        finished = run_bounded(cmd, timeout, env, on_stderr_line=to_log, cwd=REPO)
        return (None, "") if finished.timed_out else (finished.returncode, finished.stdout)


def _json(text: str) -> dict[str, Any]:
    start = text.find("{")
    try:
        return json.loads(text[start:]) if start >= 0 else {}
    except ValueError:
        return {}


def _report_of(run_dir: str | None) -> dict[str, Any]:
    if not run_dir:
        return {}
    path = Path(run_dir) / "diagnose" / "report.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def describe(report: dict[str, Any]) -> dict[str, Any]:
    """What a planted run's report says: its findings with their gains, the job's figures, the
    straggler, and each collective kind at its worst rank (and per rank)."""
    dist = report.get("distributed") or {}
    steady = (report.get("throughput") or {}).get("steady") or {}
    return {
        "findings": [
            {
                "rule": f["rule"],
                "title": f.get("title"),
                "predicted": f.get("predicted_speedup"),
                "bound": f.get("gain_bound"),
                "knobs": f.get("knobs"),
            }
            for f in report.get("findings") or []
        ],
        "world_size": dist.get("world_size"),
        "job_samples_per_s": dist.get("job_samples_per_s"),
        "steps_per_s": steady.get("steps_per_s"),
        "step_ms": dist.get("step_ms"),
        "straggler": dist.get("straggler"),
        "collectives_worst_rank": dist.get("collectives_worst_rank"),
        "ranks": [
            {
                k: r.get(k)
                for k in (
                    "rank",
                    "steady_step_ms",
                    "data_wait_ms",
                    "communication_ms",
                    "communication_exposed_ms",
                    "gpu_busy",
                    "collectives",
                    "top_exposed",
                )
            }
            for r in dist.get("ranks") or []
        ],
        "lead_rank": (report.get("source") or {}).get("rank"),
        # what the distributed rules read, to tell why one fired or stayed silent
        "symptoms": {
            k: v.get("value")
            for k, v in (report.get("symptoms") or {}).items()
            if k.startswith(("dist.all_", "dist.reduce_", "dist.gpu_", "model.gradient")) or k in WHY_SYMPTOMS
        },
        "warnings": [w for w in report.get("warnings") or [] if "rank" in w],
        "device": _device(report.get("environment") or {}),
    }


def _device(env: dict[str, Any]) -> str | None:
    """``4x NVIDIA H100 80GB HBM3, torch 2.11.0+cu130``, as the report's environment says."""
    name = env.get("device_name") if env.get("gpu_count") else env.get("device")
    count = f"{env['gpu_count']}x " if env.get("gpu_count") else ""
    torch = f", torch {env['torch']}" if env.get("torch") else ""
    return f"{count}{name}{torch}" if name else None


def run_case(case: Case, s: Settings) -> dict[str, Any]:
    """The case at each of its sizes in turn until its planted rule fires (or the budget ends);
    the row of the last size run, with the sizes that did not fire."""
    tried: list[dict[str, Any]] = []
    sizes = s.sizes(case)
    for i, size in enumerate(sizes):
        row = run_case_at(case, s, size, suffix=f"-{i}" if len(sizes) > 1 else "")
        fired = case.rule and case.rule in (row.get("fired") or [])
        if fired or not case.rule or case.kind != "verify" or i == len(sizes) - 1 or s.left() < MIN_CASE_S[case.kind]:
            row["sizes_not_firing"] = tried
            return row
        tried.append(
            {"args": row.get("args"), "fired": row.get("fired"), "symptoms": (row.get("planted") or {}).get("symptoms")}
        )
        log(
            f"{case.name}: {case.rule} did not fire at {' '.join(size) or 'the default size'} ({row.get('fired')}); the next size"
        )
    raise AssertionError("unreachable")


def run_case_at(case: Case, s: Settings, size: tuple[str, ...], suffix: str = "") -> dict[str, Any]:
    out_dir = s.out / "runs" / (case.name + suffix)
    if out_dir.exists():  # a rerun: verify and sweep want a fresh folder
        shutil.rmtree(out_dir)
    log_path = s.out / f"{case.name}{suffix}.log"
    script = str(REPO / case.script)
    budget = min(s.timeout_s, s.left())
    per_run = max(60.0, min(s.timeout_s / 2, budget))
    common = ["--json", "--out", str(out_dir), "--timeout", str(int(per_run))]
    row: dict[str, Any] = {
        "case": case.name,
        "rule": case.rule,
        "kind": case.kind,
        "script": case.script,
        "args": s.script_args(case, size),
        "note": case.note,
        "nproc": s.nproc,
    }
    if case.kind == "verify":
        cmd = [
            sys.executable,
            "-m",
            "diagnose",
            "verify",
            "--nproc-per-node",
            str(s.nproc),
            *s.window(),
            "--rule",
            case.rule,
            "--top",
            str(s.top),
            "--repeats",
            str(s.repeats),
            *common,
            *[x for k in case.base_knobs for x in ("--set", k)],
            script,
            "--",
            *s.script_args(case, size),
        ]
    elif case.kind in ("sweep", "scaling"):
        sweep = case.sweep.format(n=s.nproc)
        launch = [] if case.kind == "scaling" else ["--nproc-per-node", str(s.nproc)]
        cmd = [
            sys.executable,
            "-m",
            "diagnose",
            "sweep",
            *launch,
            *s.window(),
            "--set",
            sweep,
            *common,
            script,
            "--",
            *s.script_args(case, size),
        ]
    else:
        # --no-check: a distributed run measures nothing in-run anyway; without it the report warns so
        cmd = [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--no-check",
            "--nproc-per-node",
            str(s.nproc),
            *s.window(),
            "--json",
            "--overwrite",
            "--out",
            str(out_dir),
            script,
            "--",
            *s.script_args(case, size),
        ]
    row["command"] = " ".join(cmd)
    t0 = time.monotonic()
    code, stdout = run_command(cmd, budget, log_path)
    row["wall_s"] = round(time.monotonic() - t0, 1)
    row["exit_code"] = code
    report = _json(stdout)
    if code is None:
        row["status"] = f"timed out after {budget:.0f} s"
    elif not report:
        row["status"] = f"failed (exit {code}): " + _tail(log_path)
    else:
        row["status"] = "done"
    if report:
        summarize(case, report, row)
    return row


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])[-600:]
    except OSError:
        return ""


def summarize(case: Case, report: dict[str, Any], row: dict[str, Any]) -> None:
    experiments = report.get("experiments") or {}
    rows = experiments.get("rows") or []
    row["compared_by"] = experiments.get("compared_by")
    if case.kind == "run":
        planted = report
    elif case.kind == "verify":
        planted = report  # verify's report is its first baseline's, with the experiments
    else:
        planted = _report_of(rows[0].get("run_dir")) if rows else {}
    row["planted"] = describe(planted) if planted else None
    fired = [f["rule"] for f in (planted.get("findings") or [])] if planted else []
    row["fired"] = fired
    row["expected_fired"] = (
        (case.rule in fired) if case.rule else (not (set(case.quiet) & set(fired)) if case.quiet else None)
    )
    finding = next((f for f in (planted.get("findings") or []) if f["rule"] == case.rule), None) if planted else None
    row["predicted"] = finding.get("predicted_speedup") if finding else None
    row["bound"] = finding.get("gain_bound") if finding else None
    if case.kind == "verify":
        tried = next((r for r in rows if r.get("rule") == case.rule), None)
        row["baseline_spread"] = experiments.get("baseline_spread")
        row["tried"] = [
            {
                k: r.get(k)
                for k in (
                    "label",
                    "rule",
                    "knobs",
                    "via",
                    "speedup",
                    "verdict",
                    "predicted_speedup",
                    "gain_bound",
                    "error",
                )
            }
            for r in rows
            if r.get("role") != "baseline"
        ]
        if tried is not None:
            row["fix"] = " ".join(f"{k}={v}" for k, v in (tried.get("knobs") or {}).items())
            row["via"] = tried.get("via")
            row["measured"] = tried.get("speedup")
            row["verdict"] = tried.get("verdict") or tried.get("status")
        else:
            row["fix"] = "not tried: the rule did not fire" if case.rule not in fired else "not tried"
    elif case.kind in ("sweep", "scaling") and rows:
        key = experiments.get("compared_by") or "samples_per_s"
        if case.work_knob and any(r.get(key) is None and r.get("steps_per_s") for r in rows):
            # samples unknown (a script without a DataLoader): the sweep leaves points of unlike
            # work uncompared, but this case knows each point's work a step (``work_knob``)
            key = "steps_per_s"

        def rate(r: dict[str, Any]) -> float | None:
            value = r.get(key)
            if value is None or r.get("status") != "ok":
                return None
            knobs = r.get("knobs") or {}
            work = float(knobs.get(case.work_knob, 1)) if case.work_knob else 1.0
            if case.kind == "scaling" and key == "steps_per_s":  # every rank does a step's work
                work *= float(knobs.get("nproc_per_node", 1))
            return value * work

        rates = [rate(r) for r in rows]
        row["points"] = [
            {"label": r.get("label"), key: r.get(key), "status": r.get("status"), "error": r.get("error")} for r in rows
        ]
        if len(rates) >= 2 and rates[0] and rates[-1]:
            row["measured"] = round(rates[-1] / rates[0], 4)
        row["fix"] = rows[-1].get("label")
        if case.kind == "scaling" and len(rates) >= 2 and rates[0] and rates[-1]:
            n = float((rows[-1].get("knobs") or {}).get("nproc_per_node", 1))
            row["scaling_efficiency"] = round(rates[-1] / (n * rates[0]), 4)
            row["by"] = key
        last = _report_of(rows[-1].get("run_dir"))
        row["fixed"] = describe(last) if last else None


def markdown(rows: list[dict[str, Any]], s: Settings) -> str:
    device = next((r["planted"]["device"] for r in rows if r.get("planted") and r["planted"].get("device")), None)
    lines = [
        f"# Distributed rules against the truth: {s.nproc} {'gloo ranks (CPU smoke)' if s.smoke else 'GPUs'}",
        "",
        f"device: {device or 'unknown'} · {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| case | planted | fired | expected? | fix | predicted | bound | measured | verdict | job rate | wall s | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r.get("planted") or {}
        rate = p.get("job_samples_per_s") or p.get("steps_per_s")
        unit = "samples/s" if p.get("job_samples_per_s") else "steps/s"
        lines.append(
            f"| {r['case']} | {r['rule'] or '(none)'} | {' '.join(r.get('fired') or []) or '-'} | {_yes(r.get('expected_fired'))} "
            f"| {r.get('fix') or '-'} | {_x(r.get('predicted'))} | {_x(r.get('bound'))} | {_x(r.get('measured'))} | {r.get('verdict') or '-'} "
            f"| {f'{rate:,.1f} {unit}' if rate else '-'} | {r.get('wall_s', '-')} | {r.get('status', '-')} |"
        )
    scaling = [r for r in rows if r.get("scaling_efficiency") is not None]
    if scaling:
        lines += ["", "## Scaling", "", "| case | 1 rank | N ranks | speedup | efficiency |", "|---|---|---|---|---|"]
        for r in scaling:
            pts = r.get("points") or []
            key = r.get("by") or "samples_per_s"
            unit = "samples/s (job)" if key == "samples_per_s" else "steps/s per rank"
            lines.append(
                f"| {r['case']} | {_num(pts[0].get(key))} | {_num(pts[-1].get(key))} {unit} | {_x(r.get('measured'))} | {r['scaling_efficiency']:.0%} |"
            )
    lines += [
        "",
        "## Communication per collective kind (the planted run; each kind at its worst rank, per step)",
        "",
        "| case | kind | rank | calls | ms | exposed ms | overlapped ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for kind, c in ((r.get("planted") or {}).get("collectives_worst_rank") or {}).items():
            lines.append(
                f"| {r['case']} | {kind} | {c.get('rank')} | {c.get('calls_per_step')} | {_num(c.get('ms'), 2)} | {_num(c.get('exposed_ms'), 2)} "
                f"| {_num(c.get('overlapped_ms'), 2)} |"
            )
    lines += ["", "## Why a rule fired or not (the planted run's symptoms; sizes tried before that did not fire)", ""]
    for r in rows:
        for before in r.get("sizes_not_firing") or []:
            lines.append(
                f"* {r['case']} `{' '.join(before.get('args') or [])}`: fired {before.get('fired')}; {_symptoms(before.get('symptoms'))}"
            )
        planted = r.get("planted") or {}
        if planted.get("symptoms"):
            titles = "; ".join(f"{f['rule']}: {f.get('title')}" for f in planted.get("findings") or [])
            lines.append(
                f"* {r['case']} `{' '.join(r.get('args') or [])}`: {_symptoms(planted['symptoms'])} ({titles or 'no finding'})"
            )
    lines += ["", "## Stragglers found (DIST003 fired, or the straggler case)", ""]
    for r in rows:
        st = (r.get("planted") or {}).get("straggler")
        if st and ("DIST003" in (r.get("fired") or []) or r["case"] == "straggler"):
            lines.append(
                f"* {r['case']}: rank {st['rank']} waits {st['data_wait_ms']:.2f} ms/step for data, the others {st['others_data_wait_ms']:.2f} "
                f"(excess {(st.get('excess_share') or 0):.0%} of its step); planted: rank {s.nproc - 1 if r['case'] == 'straggler' else '-'}"
            )
    return "\n".join(lines) + "\n"


def _symptoms(values: dict[str, Any] | None) -> str:
    return (
        ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted((values or {}).items()))
        or "-"
    )


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def _num(value: float | None, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if value is not None else "-"


def _yes(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "NO"


def save(rows: list[dict[str, Any]], s: Settings) -> None:
    (s.out / "results.json").write_text(json.dumps({"nproc": s.nproc, "smoke": s.smoke, "rows": rows}, indent=1))
    (s.out / "results.md").write_text(markdown(rows, s))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for results.json, results.md, the logs and runs/")
    p.add_argument(
        "--gpus", type=int, default=None, help="ranks per job (default: the GPUs torch sees; 2 with --cpu-smoke)"
    )
    p.add_argument("--cpu-smoke", action="store_true", help="gloo ranks on the CPU, tiny models and windows")
    p.add_argument(
        "--budget-s",
        type=float,
        default=540.0,
        help="seconds for this whole call (a case starts only with MIN_CASE_S left)",
    )
    p.add_argument("--timeout", type=float, default=420.0, help="seconds one case's command may take at most")
    p.add_argument("--only", nargs="*", default=None, help="run these cases (names), in this order")
    p.add_argument("--rerun", action="store_true", help="run cases again that results.json already holds")
    p.add_argument("--top", type=int, default=1, help="verify --top, of the planted rule's findings (verify --rule)")
    p.add_argument("--repeats", type=int, default=None, help="verify --repeats (default 2; 1 with --cpu-smoke)")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # ends the running case's job too (run_command)
    nproc = args.gpus
    if nproc is None:
        if args.cpu_smoke:
            nproc = 2
        else:
            import torch

            nproc = torch.cuda.device_count()
    if nproc < 2:
        raise SystemExit("dist_truth: needs 2 ranks or more (--gpus N, or --cpu-smoke)")
    args.out.mkdir(parents=True, exist_ok=True)
    s = Settings(
        args.out.resolve(),
        nproc,
        args.cpu_smoke,
        args.budget_s,
        args.timeout,
        args.top,
        args.repeats if args.repeats is not None else (1 if args.cpu_smoke else 2),
    )
    previous = s.out / "results.json"
    rows: list[dict[str, Any]] = []
    if previous.is_file():
        try:
            rows = json.loads(previous.read_text()).get("rows", [])
        except ValueError:
            rows = []
    by_name = {c.name: c for c in CASES}
    unknown = [n for n in args.only or [] if n not in by_name]
    if unknown:
        raise SystemExit(f"dist_truth: unknown case(s) {unknown}; cases: {', '.join(by_name)}")
    cases = [by_name[n] for n in args.only] if args.only else list(CASES)
    log(
        f"{len(cases)} case(s) on {nproc} {'gloo ranks' if s.smoke else 'GPUs'}, budget {s.budget_s:.0f} s, into {s.out}"
    )
    for case in cases:
        done = next((r for r in rows if r["case"] == case.name and r.get("status") == "done"), None)
        if done is not None and not args.rerun:
            log(f"{case.name}: already in results.json, skipped (--rerun runs it again)")
            continue
        if case.gpu_only and s.smoke:
            log(f"{case.name}: needs GPUs, skipped on the CPU")
            continue
        if s.left() < MIN_CASE_S[case.kind]:
            log(f"{case.name}: not started, {s.left():.0f} s of the budget left (call again to go on)")
            continue
        expect = case.rule or ("no " + "/".join(case.quiet) if case.quiet else "a figure, no rule")
        log(
            f"{case.name}: {case.kind} of {case.script} {' '.join(s.script_args(case, s.sizes(case)[0]))} (expect {expect})"
        )
        try:
            row = run_case(case, s)
        except Exception as exc:  # noqa: BLE001 - one broken case must not stop the others
            row = {
                "case": case.name,
                "rule": case.rule,
                "kind": case.kind,
                "status": f"error: {type(exc).__name__}: {exc}",
            }
        rows = [r for r in rows if r["case"] != case.name] + [row]
        save(rows, s)
        log(
            f"{case.name}: {row.get('status')}; fired {row.get('fired')}, predicted {_x(row.get('predicted'))}, "
            f"measured {_x(row.get('measured'))} ({row.get('verdict') or '-'}), {row.get('wall_s', '-')} s"
        )
    save(rows, s)
    sys.stdout.write(markdown(rows, s))


if __name__ == "__main__":
    main()
