"""Distributed runs: each rank profiles itself into one shared run directory; the analysis puts
the ranks side by side and looks for a straggler (that analysis: ``diagnose.analysis.measure.ranks``).

Launch paths, all ending in the same per-rank ``diagnose run --rank-aware``:

* ``diagnose run --nproc-per-node N SCRIPT -- ARGS``: diagnose starts ``torch.distributed.run``
  (torchrun) itself, then merges the ranks' results;
* ``torchrun --nproc-per-node N -m diagnose run --rank-aware SCRIPT``: rank 0 merges once every
  rank has saved its record;
* ``srun ... diagnose run SCRIPT``: SLURM's variables make every task rank-aware.

Each rank's files carry its rank in their names (``rundir.RunDir`` names them: torch-tb-profiler
and ``diagnose analyze`` tell the ranks apart by that prefix); ``report.json`` is the merged report.

Each rank analyses its own trace right after its run and hands its small summary over:
``SummaryExchange`` (an extra hook of the runner) keeps a handle on the job's process-group store
when the window closes, while the group is surely up; afterwards every rank ``publish``-es its
summary there and the merging rank ``collect``-s them, with a deadline. A store, not
``all_gather_object``: by then the script has usually destroyed its group, and a collective
would hang every rank on one that died; a store wait times out on the merging rank alone.
Where no store was reachable the summaries are read from the run directory.

Multi-node: ``torchrun_command`` passes ``--nnodes``, ``--node-rank`` and the ``--rdzv-*``
options through (``launch_options``), dropping ``--standalone``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

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


#: torchrun options passed through for a multi-node launch (``--rdzv-backend=c10d`` ...)
PASSED_THROUGH = (
    "--nnodes",
    "--node-rank",
    "--rdzv-backend",
    "--rdzv-endpoint",
    "--rdzv-id",
    "--rdzv-conf",
    "--max-restarts",
    "--master-addr",
    "--master-port",
)


def launch_options(options: Sequence[str]) -> list[str]:
    """The torchrun options of a multi-node launch, as ``--name=value``; anything else is a
    usage error (diagnose's own options are not torchrun's)."""
    out = []
    for option in options:
        name = option.split("=", 1)[0].replace("_", "-")
        if name not in PASSED_THROUGH or "=" not in option:
            raise UsageError(
                f"not a torchrun option diagnose passes on: {option}",
                hint="give --torchrun " + " ".join(f"{n}=..." for n in PASSED_THROUGH[:4]),
            )
        out.append(f"{name}={option.split('=', 1)[1]}")
    return out


def torchrun_command(
    nproc: int, run_dir: Path, rank_args: list[str], target: list[str], torchrun_options: Sequence[str] = ()
) -> list[str]:
    """The torchrun command that starts ``nproc`` rank-aware ``diagnose run`` processes: on this
    node alone (``--standalone``), or with ``torchrun_options`` as one node of several."""
    if nproc < 1:
        raise UsageError("--nproc-per-node takes a positive number")
    passed = launch_options(torchrun_options)
    where = passed if passed else ["--standalone"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *where,
        f"--nproc-per-node={nproc}",
        "-m",
        "diagnose",
        "run",
        "--rank-aware",
        "--out",
        str(run_dir),
        *rank_args,
        *target,
    ]


def launch(
    nproc: int,
    run_dir: Path,
    rank_args: list[str],
    target: list[str],
    quiet_stdout: bool = False,
    torchrun_options: Sequence[str] = (),
) -> int:
    """Run torchrun; with ``quiet_stdout`` (``--json``) the ranks' output goes to stderr, so that
    stdout carries the merged report alone. On one node this process merges once torchrun
    returns; across nodes the job's rank 0 merges (each node's launcher would otherwise merge)."""
    command = torchrun_command(nproc, run_dir, rank_args, target, torchrun_options)
    env = launch_environment(torchrun_options)
    return subprocess.run(command, env=env, check=False, stdout=sys.stderr if quiet_stdout else None).returncode


def launch_environment(torchrun_options: Sequence[str] = (), environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The ranks' environment: on one node, this launcher merges (the ranks' rank 0 must not);
    across nodes each node's launcher would merge, so the job's rank 0 does instead."""
    env = dict(environ)
    if not torchrun_options:
        env[PARENT_MERGES] = "1"
    return env


# --- the ranks' summaries, over the job's process-group store ----------------------------------

_STORE_PREFIX = "diagnose/summary/"


class SummaryExchange:
    """A runner hook: holds the job's process-group store from the window's end on, so that the
    ranks can exchange their summaries after the script has destroyed its group (a held store
    stays connected). ``publish`` and ``collect`` return False/None where no store was reached."""

    def __init__(self, rank: RankInfo) -> None:
        self.rank = rank
        self.store: Any = None

    # the runner's hook protocol
    def install(self) -> None:
        pass

    def window_opened(self) -> None:
        pass

    def window_closed(self, record: Any) -> None:
        if self.store is None:
            self.store = _group_store()

    def finish(self, record: Any) -> None:
        self.window_closed(record)  # a window cut short still had a group, maybe

    def remove(self) -> None:
        pass

    def publish(self, summary: dict[str, Any]) -> bool:
        if self.store is None:
            return False
        try:
            self.store.set(str(self.rank.rank), json.dumps(summary))
            return True
        except Exception:  # noqa: BLE001 - the store's server went away: the run directory holds it too
            return False

    def collect(self, timeout_s: float) -> list[dict[str, Any]] | None:
        """Every rank's summary, once all are published; None when the deadline passes first
        (a rank failed) or no store was reached: the caller reads the run directory instead."""
        if self.store is None:
            return None
        keys = [str(r) for r in range(self.rank.world_size)]
        try:
            self.store.wait(keys, timedelta(seconds=timeout_s))
            return [json.loads(self.store.get(key)) for key in keys]
        except Exception:  # noqa: BLE001 - a timeout (DistStoreError) or a lost connection
            return None


def _group_store() -> Any:
    """The default process group's store, under diagnose's own prefix; None when no group is up."""
    try:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _get_default_store

        if not (dist.is_available() and dist.is_initialized()):
            return None
        # a torchrun restart reuses the agent's store: each attempt keeps its own keys
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"{_STORE_PREFIX}{attempt}/", _get_default_store())
    except Exception:  # noqa: BLE001 - a private API of torch: without it, the run directory serves
        return None
