"""What the benchmark scripts share: the repository, the planted examples' timer line, and
running a command the way a user would (the repository importable, output unbuffered)."""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: what examples/_common.PlainTimer prints for each window it times
PLAIN_RE = re.compile(r"plain timer: steps (\d+)-(\d+): ([\d.]+) steps/s")


def repo_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the repository importable, output unbuffered, then ``env``."""
    full = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    full.update(env or {})
    return full


def run_in_repo(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` from the repository root, its output captured; raises TimeoutExpired."""
    return subprocess.run(
        cmd, cwd=REPO, env=repo_env(env), capture_output=True, text=True, timeout=timeout, check=False
    )


#: clock ticks a second, the unit of ``/proc``'s CPU times
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_stat(path: str | Path) -> tuple[str, float]:
    """A ``/proc/<pid>/stat`` (or a thread's ``/proc/<pid>/task/<tid>/stat``) file's name and
    its user + system CPU seconds; raises OSError where it is gone."""
    text = Path(path).read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return text[text.index("(") + 1 : text.rindex(")")], (int(fields[11]) + int(fields[12])) / TICK


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (Linux: each thread's ``children`` file), those that
    ended meanwhile left out."""
    out, pending = [], [pid]
    while pending:
        p = pending.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                pending.extend(int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split())
        except (OSError, ValueError):
            continue
    return out


def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` (the kernel's cpulist format) -> ``[0, 1, 2, 3, 8, 10, 11]``."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def gpu_local_cpus(count: int, visible: str | None = None) -> list[int] | None:
    """``count`` CPUs on the first visible GPU's NUMA node, a slice of its own (the n-th visible
    GPU of the host takes the n-th slice, so two benchmarks on two GPUs of one host do not share
    cores), within this process's affinity; None where there is no GPU or the host does not say.

    Why: a launch-bound loop's pace depends on which cores it lands on (the GPU's socket or the
    other, a core shared with another process); on a 2-GPU H200 host plain runs of the same
    script moved by 27% from one process to the next, more than the costs being measured.
    ``visible``: that GPU's index instead of the first in ``CUDA_VISIBLE_DEVICES``."""
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        bus = subprocess.run(
            ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", visible],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        domain, rest = bus.split(":", 1)
        local = Path(f"/sys/bus/pci/devices/{domain[-4:]}:{rest}".lower()) / "local_cpulist"
        allowed = os.sched_getaffinity(0)
        cpus = [c for c in parse_cpulist(local.read_text()) if c in allowed]
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    slot = int(visible) if visible.isdigit() else 0
    chosen = cpus[slot * count : (slot + 1) * count]
    return chosen if len(chosen) == count else cpus[:count] or None


def pin_cpus(spec: str) -> list[int] | None:
    """Pin this process (and so every child it starts) to ``spec``: ``auto`` (4 GPU-local CPUs,
    nothing on a CPU-only machine), ``none``, or a cpulist. Returns the CPUs pinned to."""
    if spec == "none":
        return None
    cpus = gpu_local_cpus(4) if spec == "auto" else parse_cpulist(spec)
    if cpus:
        os.sched_setaffinity(0, cpus)
    return cpus


def additive_effects(
    rows: list[tuple[str, str, str, float]], reference: str = "plain"
) -> tuple[dict[str, tuple[float, float]], float, int]:
    """Least squares of ``value = moment + side + variant + noise`` over ``rows`` (moment, side,
    variant, value): each variant's effect against ``reference``'s, with its standard error, the
    residual standard deviation and its degrees of freedom.

    For runs made at the same moments on sides of one host, the sides rotating (a Latin square
    where the repeats are a multiple of the variants): the moment's load and the side's GPU and
    cores are fitted out, so what is left of the spread is each process's own. With the values
    the logarithms of rates, an effect is a log ratio: ``exp(-effect) - 1`` the variant's cost.
    The standard error is 0 where the data fit exactly, nan where no degree of freedom is left."""
    import numpy as np

    moments = sorted({r[0] for r in rows})
    sides = sorted({r[1] for r in rows})
    variants = [reference, *sorted({r[2] for r in rows} - {reference})]
    if reference not in {r[2] for r in rows}:
        raise ValueError(f"no row of the reference variant {reference!r}")
    columns = (
        [("intercept", None)]
        + [("moment", m) for m in moments[1:]]
        + [("side", s) for s in sides[1:]]
        + [("variant", v) for v in variants[1:]]
    )
    x = np.zeros((len(rows), len(columns)))
    for i, (moment, side, variant, _) in enumerate(rows):
        for j, (kind, level) in enumerate(columns):
            x[i, j] = (
                kind == "intercept"
                or (kind == "moment" and level == moment)
                or (kind == "side" and level == side)
                or (kind == "variant" and level == variant)
            )
    # a side seen at one call's moments only (sides named per call, calls pooled) repeats what the
    # moments say: such nuisance columns are dropped; a variant's column never may be
    kept: list[int] = []
    for j in range(len(columns)):
        if np.linalg.matrix_rank(x[:, [*kept, j]]) == len(kept) + 1:
            kept.append(j)
        elif columns[j][0] == "variant":
            raise ValueError("the moments, sides and variants cannot be told apart (each variant on each side once?)")
    columns = [columns[j] for j in kept]
    x = x[:, kept]
    y = np.array([r[3] for r in rows])
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    dof = len(rows) - len(columns)
    residual = y - x @ beta
    sigma2 = float(residual @ residual) / dof if dof > 0 else float("nan")
    cov = sigma2 * np.linalg.inv(x.T @ x)
    first = len(columns) - len(variants) + 1
    effects = {
        v: (float(beta[first + k]), math.sqrt(max(float(cov[first + k, first + k]), 0.0)) if dof > 0 else float("nan"))
        for k, v in enumerate(variants[1:])
    }
    return effects, math.sqrt(sigma2) if dof > 0 else float("nan"), dof
