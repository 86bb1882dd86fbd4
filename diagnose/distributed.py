"""Distributed runs: each rank profiles itself into one shared run directory; the analysis puts
the ranks side by side and looks for a straggler (that analysis: ``diagnose.analysis.ranks``).

Launch paths, all ending in the same per-rank ``diagnose run --rank-aware``:

* ``diagnose run --nproc-per-node N SCRIPT -- ARGS``: diagnose starts ``torch.distributed.run``
  (torchrun) itself, then merges the ranks' results;
* ``torchrun --nproc-per-node N -m diagnose run --rank-aware SCRIPT``: rank 0 merges once every
  rank has saved its record;
* ``srun ... diagnose run SCRIPT``: SLURM's variables make every task rank-aware.

Each rank's files carry its rank in their names (``rundir.RunDir`` names them: torch-tb-profiler
and ``diagnose analyze`` tell the ranks apart by that prefix); ``report.json`` is the merged report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from diagnose.errors import UsageError

PARENT_MERGES = "DIAGNOSE_PARENT_MERGES"


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    launcher: str  # "torchrun" or "slurm"


def rank_info(environ: Mapping[str, str] = os.environ) -> RankInfo | None:
    """This process's rank, from torchrun's variables or SLURM's; None when not distributed."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return RankInfo(int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ.get("LOCAL_RANK", 0)), "torchrun")
    if "SLURM_PROCID" in environ and int(environ.get("SLURM_NTASKS", "1")) > 1:
        return RankInfo(
            int(environ["SLURM_PROCID"]), int(environ["SLURM_NTASKS"]), int(environ.get("SLURM_LOCALID", 0)), "slurm"
        )
    return None


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
