"""What ``diagnose watch`` costs a training job, and what it finds in the planted whole-run shifts.

    python benchmarks/watch_cost.py                          # on a GPU: both parts
    python benchmarks/watch_cost.py --part overhead --only gpu_bound
    python benchmarks/watch_cost.py --part planted
    python benchmarks/watch_cost.py --cpu                    # tiny sizes, on the CPU (a smoke run)

Part ``overhead``: a GPU-bound example (examples/fp32_transformer.py) and a host-bound one
(examples/launch_bound.py) run plainly and under ``diagnose watch``, alternating (plain, watch,
plain, watch, ...: a drift of the machine hits both alike), ``--repeats`` times each. Two figures
per pair, then their median and range over the pairs:

* the step timer's cost: the examples' own plain timer (steps/s over steps past diagnose's main
  window, where only the per-step hook runs; the sampling runs on a thread of its own) under
  watch against the plain run: what item 2 of issue 36 calls the cheap step timer. Beside the
  wall-clock rate, the main thread's CPU time per step over the same steps (``time.thread_time``:
  on a shared machine it moves far less with the other processes than the wall-clock does);
* for a load that can profile itself (``--profile-window``: examples/launch_bound.py), a third run
  per repeat, plain but with a torch.profiler window over the steps diagnose's main window takes:
  what the profiler itself leaves behind after its window (Kineto, CUPTI on a GPU), against what
  watch adds beyond it;
* the whole mode's cost: the script's wall-clock under watch (``report.whole.wall_s``: process
  start to script end, the main profiled window and its trace export included) against the
  plain process's wall-clock; it shrinks as the run grows (the window is a fixed cost).

Part ``residue`` (``--forked``: a third run a repeat, the plain script in a child forked as watch
forks its own) and part ``concurrent`` (plain and watched at once on GPUs of one host, the sides
rotating each repeat: ``--sides 2,3``; ``--variants plain,watch,watch-nogpu,run --sides 0,1,2,3``
adds watch without its GPU samples and ``diagnose run --no-stop``): see their functions. With
``--variants plain,plain-again,watch,watch-again --sides 0,1,2,3`` each repeat runs two processes
of each at once, and the cost comes from a least-squares fit of ``log rate = moment + GPU +
variant`` with its standard error (``_bench.additive_effects``); ``--rows FILE`` keeps each run's
rates and ``--pool FILE...`` fits several calls together.

Part ``planted``: each examples/watch_*.py under ``diagnose watch``: the top whole-run finding
(WHOLE*), where it ranks among all findings, what it says the shift cost, the share of the
wall-clock in named buckets, and goodput. Each row says whether the expected finding came first
among the whole-run ones.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import PLAIN_RE, REPO, additive_effects, gpu_local_cpus, pin_cpus, repo_env, run_in_repo


@dataclass(frozen=True)
class Load:
    name: str
    script: str
    gpu_args: list[str]
    cpu_args: list[str]
    #: the example's own torch.profiler window over diagnose's main window's steps (none: no third run)
    window_args: tuple[str, ...] = ()


#: the timed range starts past the main window (5 warm-up + up to 30 profiled + export + 20 timed);
#: on the CPU the host-bound load runs 1,500 steps too (a few ms each: the timed range must be
#: long against the machine's noise)
LOADS = (
    Load(
        "gpu_bound",
        "examples/fp32_transformer.py",
        ["--steps", "200", "--time-steps", "100:199"],
        ["--small", "--steps", "200", "--time-steps", "100:199"],
    ),
    Load(
        "host_bound",
        "examples/launch_bound.py",
        ["--steps", "1500", "--time-steps", "200:1499"],
        ["--small", "--steps", "1500", "--time-steps", "300:1499"],
        ("--profile-window", "5:35"),
    ),
)


@dataclass(frozen=True)
class Planted:
    script: str
    expected: str
    gpu_args: list[str]
    cpu_args: list[str]


PLANTED = (
    Planted("examples/watch_eval_third.py", "WHOLE001", [], ["--small", "--steps", "200"]),
    Planted("examples/watch_blocking_checkpoint.py", "WHOLE002", [], ["--small", "--steps", "200"]),
    Planted("examples/watch_epoch_restart.py", "WHOLE003", [], ["--small", "--steps", "100", "--epochs", "5"]),
    Planted("examples/watch_memory_creep.py", "WHOLE004", [], ["--small", "--steps", "1500"]),
    Planted("examples/watch_slowing_step.py", "WHOLE005", [], ["--small", "--steps", "600"]),
    Planted("examples/watch_dynamic_recompiles.py", "WHOLE006", [], ["--small", "--steps", "48", "--lengths", "4"]),
)


def plain_rate(output: str) -> float | None:
    match = PLAIN_RE.search(output)
    return float(match.group(3)) if match else None


CPU_RE = re.compile(r"main thread cpu ([\d.]+) ms/step")


def plain_cpu_ms(output: str) -> float | None:
    """The main thread's CPU time per step over the plain timer's steps (examples/_common.py)."""
    match = CPU_RE.search(output)
    return float(match.group(1)) if match else None


#: the child processes' environment: on the CPU, one intra-op thread (a small shared machine's
#: cores are not fought over by the example's threads); on a GPU, as the user's
ENV: dict[str, str] = {}


def plain_output(script: str, args: list[str], timeout: float) -> tuple[str, float]:
    """The script run plainly: its stdout and its wall-clock."""
    start = time.perf_counter()
    done = run_in_repo([sys.executable, script, *args], timeout, env=ENV)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{script} failed plainly:\n{done.stderr[-2000:]}")
    return done.stdout, wall


#: the plain script in a child forked from a process that imported diagnose's command line, as
#: ``diagnose watch`` forks its supervised child (supervise.py), with nothing of diagnose installed:
#: what a process made that way costs, apart from watch's hooks
#: the script of ``sys.argv[1:]`` run in this process as ``python script.py args`` runs it
RUN_SCRIPT = """
def run_script():
    import os, runpy, sys
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as python script.py sets it
    runpy.run_path(script, run_name="__main__")
"""
FORKED = (
    RUN_SCRIPT
    + """
import os, sys
import diagnose.cli  # noqa: F401 - what watch's parent holds when it forks
pid = os.fork()
if pid == 0:
    code = 0
    try:
        run_script()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    sys.stdout.flush()
    os._exit(code)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
)

#: ``plain-imports``: the plain script in its own process after importing what a watched training
#: process holds at its steps (diagnose's runtime, analysis and CLI modules and what they import),
#: nothing installed: what the modules' footprint (memory, the heap's layout) costs the steps
IMPORTED = (
    RUN_SCRIPT
    + """
import importlib
for name in ("diagnose.cli", "diagnose.session", "diagnose.api", "diagnose.jupyter", "diagnose.analysis.pipeline",
             "diagnose.analysis.compare", "diagnose.analysis.gate", "diagnose.runtime.runner", "diagnose.runtime.whole",
             "diagnose.runtime.instrument", "diagnose.runtime.line_attribution", "diagnose.runtime.compilewatch",
             "diagnose.runtime.flops", "diagnose.runtime.frameworkwatch", "diagnose.runtime.marks",
             "diagnose.runtime.memory_probe", "diagnose.runtime.environment", "torch.utils.flop_counter", "pydantic"):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
run_script()
"""
)

#: watch with one piece of a diagnose run left out, by a patch made before ``diagnose``'s command
#: line runs (``PATCHED_WATCH``): what that piece costs the training threads, apart from the rest.
#: ``watch-nosampler``: watch's sampler thread never started (host RSS, GPU memory and
#: utilisation, the run-queue wait, the slow-step limit and the periodic windows' flag all go
#: unread); ``watch-nowindow``: no main profiler window (the session goes on as where the
#: script's own profiler holds Kineto: step times only, no CUPTI, no trace, no export);
#: ``watch-nocount``: no counted step after the window (the FLOP-counting dispatch mode over one
#: step and the memory probe)
WATCH_PATCHES = {
    "watch-nosampler": "import diagnose.runtime.whole as m\nm.Sampler.start = lambda self: None\n",
    "watch-nowindow": (
        "import diagnose.runtime.capture as m\n"
        "m.CaptureSession._start_profiler = lambda self: self._profiler_failed(RuntimeError('left out by the benchmark'))\n"
    ),
    "watch-nocount": (
        "import diagnose.runtime.flops as f, diagnose.runtime.memory_probe as p\n"
        "f.StepCounter.start = lambda self, step: None\np.MemoryProbe.start = lambda self: None\n"
    ),
}
PATCHED_WATCH = """
import sys
{patch}
from diagnose.cli import main
sys.argv = ["diagnose", *sys.argv[1:]]
main()
"""


def forked_output(script: str, args: list[str], timeout: float) -> str:
    """The script run as ``FORKED`` runs it: its stdout."""
    done = run_in_repo([sys.executable, "-c", FORKED, script, *args], timeout, env=ENV)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed in a forked child:\n{done.stderr[-2000:]}")
    return done.stdout


def run_plain(load: Load, args: list[str], timeout: float) -> tuple[float | None, float | None, float]:
    stdout, wall = plain_output(load.script, args, timeout)
    return plain_rate(stdout), plain_cpu_ms(stdout), wall


def run_watch(
    script: str, args: list[str], out: Path, timeout: float, options: tuple[str, ...] = ()
) -> tuple[str, dict]:
    """The script under ``diagnose watch`` (with watch's own ``options``): its stdout and report."""
    done = run_in_repo(
        [
            sys.executable,
            "-m",
            "diagnose",
            "watch",
            script,
            "-q",
            *options,
            "--out",
            str(out),
            "--overwrite",
            "--",
            *args,
        ],
        timeout,
        env=ENV,
    )
    if done.returncode != 0:
        raise SystemExit(f"diagnose watch {script} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads((out / "diagnose" / "report.json").read_text())
    return done.stdout, report


def _plus(values: list[float]) -> str:
    """A median and range of differences (not shares): "+1.23 (-0.50 .. +2.00)"."""
    if not values:
        return "-"
    return f"{statistics.median(values):+.2f} ({min(values):+.2f} .. {max(values):+.2f})"


def spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):+.2%} (range {min(values):+.2%} .. {max(values):+.2%}, {len(values)} runs)"


def _cost(base: float | None, other: float | None, rate: bool) -> float | None:
    """What ``other`` costs against ``base``: for rates (steps/s) base/other - 1, for times other/base - 1."""
    if not base or not other:
        return None
    return base / other - 1 if rate else other / base - 1


def overhead(loads: list[Load], cpu: bool, repeats: int, work: Path, timeout: float, window: bool = True) -> None:
    for load in loads:
        args = load.cpu_args if cpu else load.gpu_args
        costs: dict[str, list[float]] = {
            k: [] for k in ("timer", "timer_cpu", "mode", "window", "window_cpu", "beyond", "beyond_cpu")
        }

        def add(key: str, value: float | None) -> None:
            if value is not None:
                costs[key].append(value)  # noqa: B023 - called within this load's iteration only

        print(f"\n== {load.name}: {load.script} {' '.join(args)}", flush=True)
        for i in range(repeats):
            # the order alternates (plain first, then watch first): a drift of the machine over
            # the call (clocks, a neighbour's load) then favours neither
            if i % 2:
                stdout, report = run_watch(load.script, args, work / f"{load.name}-{i}", timeout)
            rate_plain, cpu_plain, wall_plain = run_plain(load, args, timeout)
            windowed = run_plain(load, [*args, *load.window_args], timeout) if load.window_args and window else None
            if not i % 2:
                stdout, report = run_watch(load.script, args, work / f"{load.name}-{i}", timeout)
            rate_watch, cpu_watch = plain_rate(stdout), plain_cpu_ms(stdout)
            whole = report.get("whole") or {}
            wall_watch = whole.get("wall_s")
            add("timer", _cost(rate_plain, rate_watch, rate=True))
            add("timer_cpu", _cost(cpu_plain, cpu_watch, rate=False))
            add("mode", _cost(wall_plain, wall_watch, rate=False))
            line = f"  run {i + 1}: plain {rate_plain or 0:.3f} steps/s ({cpu_plain or 0:.3f} ms cpu/step), {wall_plain:.1f} s"
            if windowed is not None:
                rate_window, cpu_window, _ = windowed
                add("window", _cost(rate_plain, rate_window, rate=True))
                add("window_cpu", _cost(cpu_plain, cpu_window, rate=False))
                add("beyond", _cost(rate_window, rate_watch, rate=True))
                add("beyond_cpu", _cost(cpu_window, cpu_watch, rate=False))
                line += f" · plain + profiled window {rate_window or 0:.3f} steps/s ({cpu_window or 0:.3f} ms cpu/step)"
            print(
                f"{line} · watch {rate_watch or 0:.3f} steps/s ({cpu_watch or 0:.3f} ms cpu/step), "
                f"{wall_watch or 0:.1f} s (goodput {whole.get('goodput', 0):.1%}, named {whole.get('named_share', 0):.2%})",
                flush=True,
            )
        print(
            f"  step timer's cost (per step, past the main window): {spread(costs['timer'])}; main thread cpu: {spread(costs['timer_cpu'])}"
        )
        if costs["window"]:
            print(
                f"    of which the profiler's window leaves behind: {spread(costs['window'])}; cpu: {spread(costs['window_cpu'])}"
            )
            print(
                f"    watch beyond a plain run with that window: {spread(costs['beyond'])}; cpu: {spread(costs['beyond_cpu'])}"
            )
        print(f"  whole mode's cost (script wall-clock, main window included): {spread(costs['mode'])}", flush=True)


#: the plain timer's figures beyond the rate (examples/_common.py), by name
TIMER_FIGURES = {
    "cpu": CPU_RE,
    "process": re.compile(r"process cpu ([\d.]+) ms/step"),
    "waits": re.compile(r"switches ([\d.]+) waits"),
    "preempted": re.compile(r"waits ([\d.]+) preempted"),
}


def timer_figures(output: str) -> list[dict[str, float]]:
    """Per range the plain timer printed, in order: its rate and every figure of ``TIMER_FIGURES`` it gave."""
    ranges = []
    for line in output.splitlines():
        match = PLAIN_RE.search(line)
        if match:
            figures = {"rate": float(match.group(3))}
            for name, pattern in TIMER_FIGURES.items():
                found = pattern.search(line)
                if found:
                    figures[name] = float(found.group(1))
            ranges.append(figures)
    return ranges


#: residue: steps timed before the main window and after it, in the same process; the window
#: (``--warmup`` steps in, ``--steps`` long, then its export) sits between the two ranges
RESIDUE_BEFORE, RESIDUE_WINDOW, RESIDUE_AFTER = (100, 300), (320, 330), (500, 1100)
#: watch's options that move its main window to ``RESIDUE_WINDOW`` (the profiler starts one step before)
MOVED_WINDOW = ("--warmup", str(RESIDUE_WINDOW[0]), "--steps", str(RESIDUE_WINDOW[1] - RESIDUE_WINDOW[0]))


def _residue_load(cpu: bool) -> tuple[Load, list[str]]:
    """The host-bound load and its arguments for ``residue`` and ``concurrent``: steps 100-299 and
    500-1098 timed, ``RESIDUE_AFTER[1]`` steps in all."""
    load = next(load for load in LOADS if load.name == "host_bound")
    before, after = f"{RESIDUE_BEFORE[0]}:{RESIDUE_BEFORE[1]}", f"{RESIDUE_AFTER[0]}:{RESIDUE_AFTER[1] - 1}"
    return load, [*(["--small"] if cpu else []), "--steps", str(RESIDUE_AFTER[1]), "--time-steps", f"{before},{after}"]


def residue(cpu: bool, repeats: int, work: Path, timeout: float, window: bool = True, forked: bool = False) -> None:
    """What watch leaves in a process after its main window, each process against itself.

    Three runs a repeat (their order rotating): the host-bound load plainly, plainly with a
    torch.profiler window where watch takes its main window (not with ``--no-window``), and under
    watch with its main window moved there (``--warmup``; diagnose starts its profiler one step
    before the window, so the steps before it carry only the per-step hook and the sampler).
    Each times steps before the window and after it; a run's drift is its after-rate over its
    before-rate, and what the window leaves behind is the plain run's drift over the other's (the
    process-to-process spread, +-14% on a shared host, cancels). The steps before the window carry
    watch's per-step hook and sampler: their cost is the cross-process figure beside it.
    ``forked`` adds a run of the plain script in a child forked as watch forks its own (``FORKED``):
    how much of that cross-process figure is the way the process was made, not what runs in it.
    """
    load, args = _residue_load(cpu)
    profile_window = ["--profile-window", f"{RESIDUE_WINDOW[0]}:{RESIDUE_WINDOW[1]}"]
    print(
        f"\n== residue: {load.script} {' '.join(args)}; window at steps {RESIDUE_WINDOW[0]}-{RESIDUE_WINDOW[1] - 1}",
        flush=True,
    )
    drift: dict[str, list[float]] = {"plain": [], "window": [], "watch": [], "forked": []}
    drift_cpu: dict[str, list[float]] = {"plain": [], "window": [], "watch": [], "forked": []}
    hook: list[float] = []
    fork_cost: list[float] = []
    for i in range(repeats):
        kinds = ["plain", *(["window"] if window else []), "watch", *(["forked"] if forked else [])]
        kinds = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]  # rotating order: a drift of the machine favours none
        rates: dict[str, list[tuple[float, float | None]]] = {}  # (before, after) a kind
        for kind in kinds:
            if kind == "watch":
                stdout, _ = run_watch(load.script, args, work / f"residue-{i}", timeout, MOVED_WINDOW)
            elif kind == "forked":
                stdout = forked_output(load.script, args, timeout)
            else:
                stdout, _ = plain_output(load.script, [*args, *(profile_window if kind == "window" else [])], timeout)
            rates[kind] = [(r["rate"], r.get("cpu")) for r in timer_figures(stdout)]
            if len(rates[kind]) != 2:
                raise SystemExit(f"{kind}: the plain timer printed {len(rates[kind])} ranges, not 2:\n{stdout[-2000:]}")
        line = []
        for kind in rates:
            (r0, c0), (r1, c1) = rates[kind]
            drift[kind].append(r1 / r0 - 1)
            if c0 and c1:
                drift_cpu[kind].append(c1 / c0 - 1)
            line.append(f"{kind} {r0:.1f} -> {r1:.1f} steps/s ({r1 / r0 - 1:+.1%})")
        hook.append(rates["plain"][0][0] / rates["watch"][0][0] - 1)
        if forked:
            fork_cost.append(rates["plain"][0][0] / rates["forked"][0][0] - 1)
        print(f"  run {i + 1}: " + " · ".join(line), flush=True)
        # the summary so far, after every repeat: a call cut short by its time keeps what it measured
        print(f"  after {i + 1} run(s):", flush=True)
        for kind in ("window", "watch") if window else ("watch",):
            # what the window leaves: the plain run's drift over this one's, pair by pair
            costs = [(1 + p) / (1 + k) - 1 for p, k in zip(drift["plain"], drift[kind], strict=True)]
            cpu_costs = [(1 + k) / (1 + p) - 1 for p, k in zip(drift_cpu["plain"], drift_cpu[kind], strict=False)]
            label = "a plain torch.profiler window" if kind == "window" else "watch's main window"
            print(f"    after {label}, per step: {spread(costs)}; main thread cpu: {spread(cpu_costs)}", flush=True)
        print(f"    watch's steps before the window against plain (across processes): {spread(hook)}", flush=True)
        if forked:
            print(f"    the plain script in a forked child, same steps, against plain: {spread(fork_cost)}", flush=True)


def _side_cpus(side: str, cpu: bool, count: int = 4) -> list[int] | None:
    """The CPUs of one side of a concurrent run: ``count`` local to GPU ``side``, or on the CPU
    (``cpu``, a smoke run) one of this process's CPUs, round robin (sides numbered from 0)."""
    if not cpu:
        return gpu_local_cpus(count, side)
    mine = sorted(os.sched_getaffinity(0))
    return [mine[(int(side) if side.isdigit() else 0) % len(mine)]]


def _start_side(cmd: list[str], side: str, cpu: bool, log: Path) -> subprocess.Popen[str]:
    """``cmd`` from the repository root on one side: its GPU alone (``CUDA_VISIBLE_DEVICES``), its
    CPUs (``taskset``), its output to ``log`` (a pipe left unread could stall it)."""
    cpus = _side_cpus(side, cpu)
    env = repo_env({**ENV, "CUDA_VISIBLE_DEVICES": "" if cpu else side})
    pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus and shutil.which("taskset") else []
    with log.open("w") as out:
        return subprocess.Popen(
            [*pin, *LAYOUT, *cmd], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True
        )


#: what starts every run of ``concurrent`` before its command: with ``--fixed-layout``, address
#: space layout randomisation off (``setarch -R``) and ``PYTHONHASHSEED`` fixed in ``ENV``, so
#: that processes differ by what runs in them, not by where their memory landed
LAYOUT: list[str] = []


#: what runs on a side of ``concurrent``: the plain script, watch, watch without its GPU samples
#: (NVML and the allocator read twice a second), ``diagnose run --no-stop`` (run's hooks and its
#: window, none of watch's own), the plain script once more (``plain-again``: a control, what the
#: method itself says of two identical processes) and the plain script in a forked child
#: (``forked``: ``FORKED``, made as watch makes its child, nothing of diagnose installed), and the
#: plain script with its own torch.profiler window over the steps of watch's main window, CUPTI
#: torn down after it as diagnose has it (``plain-window``: what the profiler leaves, apart from
#: diagnose), the same window with CPU activity only (``plain-window-cpu``: no CUPTI at all, so
#: what the window leaves apart from CUPTI's attachment and teardown), and the window exported
#: and gzipped in the process as diagnose does (``plain-window-export``: what writing the trace leaves),
#: and the plain script after importing what watch's training process holds (``plain-imports``);
#: ``watch-nosampler``, ``watch-nowindow`` and ``watch-nocount`` are watch with a piece left out (``WATCH_PATCHES``)
#: ``watch-again`` is watch once more: with ``plain-again``, two runs of each at every moment, the
#: pair's mean against the pair's mean (``additive_effects`` pools a variant with its ``-again``)
CONCURRENT_VARIANTS = (
    "plain",
    "watch",
    "watch-nogpu",
    "run",
    "plain-again",
    "forked",
    "plain-window",
    "watch-again",
    "plain-window-cpu",
    "plain-window-export",
    "plain-imports",
    "watch-nosampler",
    "watch-nowindow",
    "watch-nocount",
)
#: ``plain-window``'s profiler window: the steps watch's main window takes where a user's run has it
USER_WINDOW = "4:15"


def _variant_cmd(variant: str, script: str, args: list[str], window: tuple[str, ...], out: Path) -> list[str]:
    if variant in ("plain", "plain-again"):
        return [sys.executable, script, *args]
    if variant.startswith("plain-window"):
        start, end = RESIDUE_WINDOW if window else map(int, USER_WINDOW.split(":"))
        cuda_teardown = ["env", "TEARDOWN_CUPTI=1"]
        extra = {
            "plain-window-cpu": ["--profile-cpu-only"],
            "plain-window-export": ["--profile-export", str(out.parent)],
        }
        return [
            *cuda_teardown,
            sys.executable,
            script,
            *args,
            "--profile-window",
            f"{start}:{end}",
            *extra.get(variant, []),
        ]
    if variant == "forked":
        return [sys.executable, "-c", FORKED, script, *args]
    if variant == "plain-imports":
        return [sys.executable, "-c", IMPORTED, script, *args]
    tail = ["-q", *window, "--out", str(out), "--overwrite"]
    if variant == "run":
        return [sys.executable, "-m", "diagnose", "run", script, *tail, "--no-stop", "--no-check", "--", *args]
    extra = ["--no-gpu-samples"] if variant == "watch-nogpu" else []  # watch and watch-again alike
    patch = WATCH_PATCHES.get(variant)
    launcher = ["-c", PATCHED_WATCH.format(patch=patch)] if patch else ["-m", "diagnose"]
    return [sys.executable, *launcher, "watch", script, *tail, *extra, "--", *args]


def concurrent(
    cpu: bool,
    repeats: int,
    work: Path,
    timeout: float,
    sides: tuple[str, ...] = ("0", "1"),
    moved: bool = True,
    variants: tuple[str, ...] = ("plain", "watch"),
    rows_out: Path | None = None,
    call: str = "",
) -> None:
    """Watch (and its variants) against plain, all run at the same time on sides of one host.

    Runs in sequence (``residue``) share the host's moments: a plain run and the next moved by
    +-13% within one process on an H100 host (the host's load, its clocks), more than the cost
    measured. Here each repeat starts the host-bound load once per variant (``CONCURRENT_VARIANTS``,
    plain first among them) together, each on a GPU of its own with its own GPU-local cores
    (``sides``: as many GPUs of the host as variants; on the CPU, shares of the cores), so that
    whatever the host does in those seconds hits all; the assignment rotates every repeat, so
    that a faster GPU or socket favours none. Per repeat and variant: plain's rate over the
    variant's on steps 100-299 and 500-1098, and the process's wall-clock over plain's. Watch's
    main window sits at steps 320-329 (``moved``) or where a user's run has it (after 5 warm-up
    steps: both timed ranges then lie past it)."""
    if variants[0] != "plain" or len(set(variants)) != len(variants) or len(sides) < len(variants):
        raise SystemExit(
            f"concurrent: plain first, each variant once, a side each (variants {variants}, sides {sides})"
        )
    load, args = _residue_load(cpu)
    window = MOVED_WINDOW if moved else ()
    first = "before the window" if moved else "steps 100-299"
    second = "after it" if moved else "steps 500-1098"
    n = len(variants)
    print(
        f"\n== concurrent: {load.script} {' '.join(args)}; {', '.join(variants)} at once on sides {', '.join(sides[:n])} "
        f"(CPUs {[_side_cpus(side, cpu) for side in sides[:n]]}), rotating; watch's window "
        + (f"at steps {RESIDUE_WINDOW[0]}-{RESIDUE_WINDOW[1] - 1}" if moved else "where a user's run has it"),
        flush=True,
    )
    costs: dict[str, dict[str, list[float]]] = {
        v: {"first": [], "second": [], "wall": [], "first_both": [], "second_both": []} for v in variants[1:]
    }
    #: per variant, what its steps 500-1098 (or after the window) cost beyond the rate, against plain's
    beside: dict[str, dict[str, list[float]]] = {v: {name: [] for name in TIMER_FIGURES} for v in variants[1:]}
    #: per timed range, (repeat, side, variant, log rate): the additive model's rows
    rows: tuple[list[tuple[str, str, str, float]], list[tuple[str, str, str, float]]] = ([], [])
    for i in range(repeats):
        placed = {v: sides[(j + i) % n] for j, v in enumerate(variants)}
        procs: dict[str, subprocess.Popen[str]] = {}
        started = time.perf_counter()
        for v in variants:
            cmd = _variant_cmd(v, load.script, args, window, work / f"concurrent-{i}-{v}")
            procs[v] = _start_side(cmd, placed[v], cpu, work / f"concurrent-{i}-{v}.log")
        walls: dict[str, float] = {}
        while len(walls) < n:
            for v, proc in procs.items():
                if v not in walls and proc.poll() is not None:
                    walls[v] = time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                for proc in procs.values():
                    proc.kill()
                raise SystemExit(
                    f"concurrent run {i + 1}: {sorted(set(variants) - set(walls))} ran past {timeout:.0f} s"
                )
            time.sleep(0.05)
        figures: dict[str, list[dict[str, float]]] = {}
        for v, proc in procs.items():
            output = (work / f"concurrent-{i}-{v}.log").read_text()
            if proc.returncode != 0:
                raise SystemExit(f"concurrent run {i + 1}: {v} failed ({proc.returncode}):\n{output[-2000:]}")
            figures[v] = timer_figures(output)
            if len(figures[v]) != 2:
                raise SystemExit(f"{v}: the plain timer printed {len(figures[v])} ranges, not 2:\n{output[-2000:]}")
        p0, p1 = (r["rate"] for r in figures["plain"])
        for v in variants:
            for k, r in enumerate(figures[v]):
                rows[k].append((str(i), placed[v], v, math.log(r["rate"])))
                if rows_out is not None:
                    record = {
                        "call": call,
                        "repeat": i + 1,
                        "side": placed[v],
                        "variant": v,
                        "range": k,
                        "rate": r["rate"],
                    }
                    with rows_out.open("a") as out:
                        out.write(json.dumps(record) + "\n")
        # with the control: the two plain runs' geometric mean, a reference with half the spread of one
        both = (
            [math.sqrt(r["rate"] * a["rate"]) for r, a in zip(figures["plain"], figures["plain-again"], strict=True)]
            if "plain-again" in figures
            else None
        )
        line = [f"plain (side {placed['plain']}) {p0:.1f} -> {p1:.1f} steps/s"]
        for v in variants[1:]:
            r0, r1 = (r["rate"] for r in figures[v])
            costs[v]["first"].append(p0 / r0 - 1)
            costs[v]["second"].append(p1 / r1 - 1)
            if both is not None and v != "plain-again":
                costs[v]["first_both"].append(both[0] / r0 - 1)
                costs[v]["second_both"].append(both[1] / r1 - 1)
            costs[v]["wall"].append(walls[v] / walls["plain"] - 1)
            late, plain_late = figures[v][1], figures["plain"][1]
            for name in TIMER_FIGURES:
                if name in late and name in plain_late:
                    # CPU: the variant's over plain's, a share; switches: the variant's minus plain's, a step
                    ratio = name in ("cpu", "process")
                    if not ratio or plain_late[name] > 0:
                        beside[v][name].append(
                            late[name] / plain_late[name] - 1 if ratio else late[name] - plain_late[name]
                        )
            line.append(f"{v} (side {placed[v]}) {r0:.1f} -> {r1:.1f} ({p0 / r0 - 1:+.2%}, {p1 / r1 - 1:+.2%})")
        print(f"  run {i + 1}: " + " · ".join(line), flush=True)
        print(f"  after {i + 1} run(s), against plain at the same moment:", flush=True)
        for v in variants[1:]:
            c, b = costs[v], beside[v]
            print(
                f"    {v}: {first} {spread(c['first'])}; {second} {spread(c['second'])}; "
                f"process wall-clock {spread(c['wall'])}",
                flush=True,
            )
            if c["first_both"]:
                print(
                    f"      against both plain runs (their geometric mean): {first} {spread(c['first_both'])}; "
                    f"{second} {spread(c['second_both'])}",
                    flush=True,
                )
            if b["cpu"]:
                print(
                    f"      {second}, against plain: main thread cpu a step {spread(b['cpu'])}; the process's cpu a step "
                    f"{spread(b['process'])}; main thread's waits a step {_plus(b['waits'])}, preemptions a step "
                    f"{_plus(b['preempted'])}",
                    flush=True,
                )
        if i + 1 >= 2:
            print(
                f"  after {i + 1} run(s), the moment and the side fitted out (additive model of log rates):", flush=True
            )
            for label, range_rows in zip((first, second), rows, strict=True):
                print(f"    {label}: {fitted_costs(range_rows)}", flush=True)


def pool(paths: list[Path]) -> None:
    """The additive model over the rows of several calls (``--rows`` files of ``concurrent``):
    each call's moments and sides its own (another host, another hour), the variants common."""
    ranges: dict[int, list[tuple[str, str, str, float]]] = {}
    calls: set[str] = set()
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            call = f"{path.name}:{r['call']}"
            calls.add(call)
            ranges.setdefault(int(r["range"]), []).append(
                (f"{call}:{r['repeat']}", f"{call}:{r['side']}", r["variant"], math.log(r["rate"]))
            )
    print(f"\n== pooled: {len(calls)} call(s) from {len(paths)} file(s)", flush=True)
    for k in sorted(ranges):
        repeats = len({m for m, _, _, _ in ranges[k]})
        print(f"  timed range {k + 1} ({repeats} repeats): {fitted_costs(ranges[k])}", flush=True)


def fitted_costs(rows: list[tuple[str, str, str, float]]) -> str:
    """Each variant's cost against plain from ``additive_effects`` (a cost +-its standard error),
    then a variant and its ``-again`` pooled against plain and ``plain-again`` pooled, and the
    residual spread of one process (what a repeat's pair of processes differs by, apart from
    the moment and the side)."""
    try:
        effects, sigma, dof = additive_effects(rows)
    except ValueError as exc:
        return f"not fitted ({exc})"

    def cost(effect: float, se: float) -> str:
        # exp(-effect) - 1, and the standard error carried through the exponential
        error = "(no error: no degree of freedom left)" if math.isnan(se) else f"+-{math.exp(-effect) * se:.2%}"
        return f"{math.exp(-effect) - 1:+.2%} {error}"

    parts = [f"{v} {cost(*e)}" for v, e in effects.items()]
    pooled_rows = [(m, s, v.removesuffix("-again"), y) for m, s, v, y in rows]
    if pooled_rows != rows:
        try:
            pooled, _, _ = additive_effects(pooled_rows)
            parts.append("pooled with their -again runs: " + ", ".join(f"{v} {cost(*e)}" for v, e in pooled.items()))
        except ValueError as exc:
            parts.append(f"pooled: not fitted ({exc})")
    own = "not known yet" if math.isnan(sigma) else f"{sigma:.2%}"
    return "; ".join(parts) + f"; one process's own spread {own} ({dof} degrees of freedom)"


def planted(cpu: bool, work: Path, timeout: float, only: list[str] | None = None) -> int:
    misses = 0
    print("\n== planted whole-run shifts under diagnose watch", flush=True)
    for p in PLANTED:
        name = Path(p.script).stem
        if only and name not in only:
            continue
        try:
            _, report = run_watch(p.script, p.cpu_args if cpu else p.gpu_args, work / name, timeout)
        except (SystemExit, subprocess.TimeoutExpired) as exc:  # one example's failure: say so, go on
            misses += 1
            print(f"  {name}: expected {p.expected}, FAILED: {str(exc)[-1500:]}", flush=True)
            continue
        findings = report.get("findings", [])
        whole_findings = [f for f in findings if f["rule"].startswith("WHOLE")]
        whole = report.get("whole") or {}
        top = whole_findings[0] if whole_findings else None
        ok = top is not None and top["rule"] == p.expected
        misses += not ok
        rank = findings.index(top) + 1 if top is not None else None
        print(
            f"  {name}: expected {p.expected}, top whole-run finding {top['rule'] if top else 'none'}"
            f"{f' (rank {rank} of {len(findings)})' if rank else ''} {'OK' if ok else 'MISS'} · "
            f"wall {whole.get('wall_s', 0):.1f} s, goodput {whole.get('goodput', 0):.1%}, named {whole.get('named_share', 0):.2%}",
            flush=True,
        )
        if not ok:  # what a miss leaves to read: where the time went, and what the memory did
            seconds = whole.get("seconds") or {}
            print(f"      buckets (s): {', '.join(f'{k} {v:.2f}' for k, v in seconds.items() if v)}", flush=True)
            print(f"      memory: {json.dumps(whole.get('shifts', {}).get('memory'))[:600]}", flush=True)
        if top is not None:
            bound = top.get("gain_bound")
            print(
                f"      {top['says']}" + (f" (fixing it: up to {bound:.2f}x on the whole run)" if bound else ""),
                flush=True,
            )
    return misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (a smoke run of this script)")
    parser.add_argument("--part", choices=("overhead", "residue", "concurrent", "planted", "both"), default="both")
    parser.add_argument(
        "--only", choices=[load.name for load in LOADS], action="append", help="overhead: only this load (repeatable)"
    )
    parser.add_argument(
        "--planted",
        action="append",
        metavar="NAME",
        help="planted: only this example (e.g. watch_eval_third; repeatable)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs (plain, watch) per load")
    parser.add_argument("--timeout", type=float, default=500.0, help="seconds per run at most")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    parser.add_argument(
        "--no-window",
        action="store_true",
        help="overhead, residue: no run with the example's own profiler window (pairs only: more of them a call)",
    )
    parser.add_argument(
        "--forked",
        action="store_true",
        help="residue: also the plain script in a child forked as diagnose watch forks its own (nothing installed)",
    )
    parser.add_argument(
        "--sides",
        default="0,1",
        help="concurrent: the GPUs (indices on the host) the variants take, one each, rotating every repeat",
    )
    parser.add_argument(
        "--variants",
        default="plain,watch",
        help=f"concurrent: what runs on the sides, plain first (of {', '.join(CONCURRENT_VARIANTS)})",
    )
    parser.add_argument(
        "--user-window",
        action="store_true",
        help="concurrent: watch's main window where a user's run has it (both timed ranges past it), not moved to step 320",
    )
    parser.add_argument(
        "--cpus",
        default="auto",
        help="pin every run to these CPUs: auto (4 on the GPU's NUMA node; none on a CPU-only machine), none, or a cpulist",
    )
    parser.add_argument(
        "--rows",
        type=Path,
        default=None,
        help="concurrent: append each run's rates here (JSON lines: call, repeat, side, variant, range, rate)",
    )
    parser.add_argument("--call", default="", help="concurrent: this call's name in the --rows file")
    parser.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        default=None,
        help="fit the additive model over these --rows files (several calls together) and exit",
    )
    parser.add_argument(
        "--fixed-layout",
        action="store_true",
        help="concurrent: every run with address space randomisation off (setarch -R) and PYTHONHASHSEED=0",
    )
    args = parser.parse_args()
    if args.pool:
        pool(args.pool)
        return
    if args.fixed_layout:
        ENV["PYTHONHASHSEED"] = "0"
        if shutil.which("setarch"):
            LAYOUT[:] = ["setarch", os.uname().machine, "-R"]
        print(f"layout fixed: PYTHONHASHSEED=0, {' '.join(LAYOUT) or 'setarch not found: ASLR left on'}", flush=True)
    if args.cpu:
        ENV["OMP_NUM_THREADS"] = "1"
    pinned = pin_cpus("none" if args.part == "concurrent" else args.cpus)  # concurrent pins each side itself
    print(f"runs pinned to CPUs {pinned}" if pinned else "runs not pinned", flush=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="watch-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    misses = 0
    try:
        if args.part in ("overhead", "both"):
            overhead(
                [load for load in LOADS if not args.only or load.name in args.only],
                args.cpu,
                args.repeats,
                work,
                args.timeout,
                window=not args.no_window,
            )
        if args.part == "concurrent":
            sides = tuple(args.sides.split(","))
            variants = tuple(args.variants.split(","))
            concurrent(
                args.cpu,
                args.repeats,
                work,
                args.timeout,
                sides,
                moved=not args.user_window,
                variants=variants,
                rows_out=args.rows,
                call=args.call,
            )
        if args.part == "residue":
            residue(args.cpu, args.repeats, work, args.timeout, window=not args.no_window, forked=args.forked)
        if args.part in ("planted", "both"):
            misses = planted(args.cpu, work, args.timeout, args.planted)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    raise SystemExit(1 if misses else 0)


if __name__ == "__main__":
    main()
