"""Distributed runs: each rank profiles itself into one shared run directory; the analysis puts
the ranks side by side and looks for a straggler (that analysis: ``diagnose.analysis.ranks``).

Launch paths, all ending in the same per-rank ``diagnose run --rank-aware``:

* ``diagnose run --nproc-per-node N SCRIPT -- ARGS``: diagnose starts ``torch.distributed.run``
  (torchrun) itself, then merges the ranks' results;
* ``torchrun --nproc-per-node N -m diagnose run --rank-aware SCRIPT``: rank 0 merges once every
  rank has saved its record;
* ``srun ... diagnose run SCRIPT``: SLURM's variables make every task rank-aware.

In the run directory each rank writes ``rank<R>.run.json``, a trace named
``rank<R>_<host>_<pid>.<ms>.pt.trace.json.gz`` (torch-tb-profiler and ``diagnose analyze`` tell
the ranks apart by that prefix) and ``workers-rank<R>/``; ``report.json`` is the merged report.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from diagnose.errors import UsageError

RANK_RECORD = re.compile(r"^rank(\d+)\.run\.json$")
PARENT_MERGES = "DIAGNOSE_PARENT_MERGES"


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    launcher: str  # "torchrun" or "slurm"

    @property
    def prefix(self) -> str:
        return f"rank{self.rank}"

    @property
    def record_file(self) -> str:
        return f"{self.prefix}.run.json"


def rank_info(environ: Mapping[str, str] = os.environ) -> RankInfo | None:
    """This process's rank, from torchrun's variables or SLURM's; None when not distributed."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return RankInfo(int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ.get("LOCAL_RANK", 0)), "torchrun")
    if "SLURM_PROCID" in environ and int(environ.get("SLURM_NTASKS", "1")) > 1:
        return RankInfo(
            int(environ["SLURM_PROCID"]), int(environ["SLURM_NTASKS"]), int(environ.get("SLURM_LOCALID", 0)), "slurm"
        )
    return None


def shared_run_dir(name: str, environ: Mapping[str, str] = os.environ) -> Path:
    """A run directory every rank agrees on without talking to the others."""
    run_id = environ.get("TORCHELASTIC_RUN_ID", "none")
    if run_id in ("", "none"):
        run_id = environ.get("SLURM_JOB_ID") or f"port{environ.get('MASTER_PORT', '0')}"
    return Path("runs") / f"{name}-{run_id}"


def torchrun_command(nproc: int, run_dir: Path, rank_args: list[str], target: list[str]) -> list[str]:
    """The torchrun command that starts ``nproc`` rank-aware ``diagnose run`` processes."""
    if nproc < 1:
        raise UsageError("--nproc-per-node takes a positive number")
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "diagnose", "run", "--rank-aware", "--out", str(run_dir), *rank_args, *target,
    ]


def launch(nproc: int, run_dir: Path, rank_args: list[str], target: list[str], quiet_stdout: bool = False) -> int:
    """Run torchrun; with ``quiet_stdout`` (``--json``) the ranks' output goes to stderr, so that
    stdout carries the merged report alone."""
    env = dict(os.environ, **{PARENT_MERGES: "1"})
    command = torchrun_command(nproc, run_dir, rank_args, target)
    return subprocess.run(command, env=env, check=False, stdout=sys.stderr if quiet_stdout else None).returncode


def wait_for_ranks(run_dir: Path, world_size: int, timeout_s: float = 120.0) -> list[int]:
    """Rank 0 waits for every rank's record (they stop at the same step, give or take)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = rank_records(run_dir)
        if len(found) >= world_size or time.monotonic() > deadline:
            return sorted(found)
        time.sleep(0.2)


def rank_records(run_dir: Path) -> dict[int, Path]:
    out = {}
    for p in run_dir.iterdir() if run_dir.is_dir() else []:
        m = RANK_RECORD.match(p.name)
        if m:
            out[int(m.group(1))] = p
    return out


def rank_trace(run_dir: Path, rank: int) -> Path | None:
    traces = sorted(run_dir.glob(f"rank{rank}_*.pt.trace.json*"))
    return traces[-1] if traces else None
