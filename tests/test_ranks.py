"""Many ranks: each rank's own analysis and summary, the job's view built from the summaries
alone, the traces worth keeping, collectives by kind (exposed vs overlapped), and the launchers'
variables. No process group here: tests/test_distributed.py runs the gloo ranks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from diagnose.analysis.measure.collectives import collective_kind, collective_times
from diagnose.analysis.measure.ranks import RankSummary, job_view, notable_ranks, outliers, slowest
from diagnose.analysis.pipeline import AnalysisOptions, analyse_rank
from diagnose.analysis.trace.timeline import build_timeline
from diagnose.distributed import (
    PARENT_MERGES,
    RankInfo,
    launch_environment,
    launch_options,
    rank_info,
    torchrun_command,
)
from diagnose.errors import UsageError
from diagnose.record import RunRecord
from diagnose.rundir import RunDir, shared_location
from diagnose.session import RunRequest, analyze_run, finish_rank, keep_notable_traces
from tests.conftest import DATA
from tests.tracebuilder import AUTOGRAD, BF16_GEMM, NCCL_ALLREDUCE, TraceBuilder

# --- summaries and the job's view -------------------------------------------------------------


def _summary(rank: int, step: float = 10.0, wait: float = 1.0, comm: float = 0.5) -> RankSummary:
    return RankSummary(
        rank,
        "stopped",
        step,
        wait,
        wait / step,
        0.0,
        comm / step,
        None,
        16,
        "data_wait",
        "gloo",
        steady_samples_per_s=100.0,
        steady_step_ms=step,
        communication_exposed_ms=comm,
        collectives={"all_reduce": {"calls_per_step": 1.0, "ms": comm + 1, "exposed_ms": comm, "overlapped_ms": 1.0}},
    )


def test_a_summary_round_trips_through_json_and_ignores_keys_it_does_not_know() -> None:
    s = _summary(3)
    data = json.loads(json.dumps(s.to_dict()))
    assert RankSummary.from_dict(data) == s
    data["from_a_newer_diagnose"] = 1
    del data["collectives"]
    back = RankSummary.from_dict(data)
    assert back.rank == 3 and back.collectives == {}


def test_the_slowest_rank_is_the_one_with_the_most_work_of_its_own() -> None:
    # synchronous training: every step is as long; rank 2 waits least at the all-reduce
    ranks = [_summary(0, comm=6.0), _summary(1, comm=5.0), _summary(2, comm=0.5), _summary(3, comm=6.0)]
    assert slowest(ranks) == 2
    assert slowest([]) is None


def test_outliers_stand_out_by_robust_deviations_and_a_floor_of_the_step() -> None:
    ranks = [_summary(r, wait=1.0 + 0.01 * r) for r in range(8)] + [_summary(8, wait=4.0)]
    assert list(outliers(ranks)) == [8]
    assert "data wait 4.00 ms" in outliers(ranks)[8][0]
    # a wobble below 5% of the step is no outlier, however tight the others are
    tight = [_summary(r, wait=1.0) for r in range(8)] + [_summary(8, wait=1.4)]
    assert outliers(tight) == {}
    assert outliers([_summary(0), _summary(1, wait=9.0)]) == {}  # two ranks: neither is the odd one


def test_notable_ranks_are_the_first_the_straggler_the_slowest_and_the_outliers() -> None:
    ranks = [_summary(r, wait=1.0, comm=5.0) for r in range(1, 16)] + [_summary(16, wait=6.0, comm=0.2)]
    notable = notable_ranks(ranks)
    assert list(notable) == [1, 16]  # the lowest rank present is "the first"
    assert notable[1] == "the report's breakdown"
    assert notable[16].startswith("straggler, slowest step, outlier: data wait 6.00 ms")


def test_the_job_report_leads_with_the_rank_the_others_wait_for() -> None:
    """The slowest rank (its step less its waits at collectives) leads when it does clearly more of
    its own work than the first rank (10% of the step): two FSDP ranks on H200s put either one in
    the all-gathers' wait from run to run, and rank 0's view gave three top findings in five."""
    from diagnose.analysis.measure.ranks import lead_rank

    waiting, working = _summary(0, step=10.0, comm=9.0), _summary(1, step=10.0, comm=0.5)
    assert lead_rank([waiting, working], 0) == 1
    assert lead_rank([working, _summary(1, step=10.0, comm=9.0)], 0) == 0  # rank 0 does the work
    # within 10% of the step of each other: the first rank stays (no flip on a wobble)
    assert lead_rank([_summary(0, step=10.0, comm=1.5), _summary(1, step=10.0, comm=0.8)], 0) == 0
    assert lead_rank([_summary(0, step=10.0, comm=2.0), _summary(1, step=10.0, comm=0.5)], 0) == 1


def test_the_job_view_comes_from_summaries_alone() -> None:
    ranks = [_summary(0, step=10.0, comm=4.0), _summary(1, step=10.2, comm=0.5), _summary(2, step=10.1, comm=2.0)]
    view = job_view(ranks)
    assert view["job_samples_per_s"] == 300.0
    assert view["step_ms"] == {"min": 10.0, "median": 10.1, "max": 10.2}
    assert view["step_imbalance"] == 1.02
    assert view["communication_exposed_ms"] == {"min": 0.5, "median": 2.0, "max": 4.0}
    assert view["collectives_worst_rank"]["all_reduce"] == {
        "rank": 0,
        "calls_per_step": 1.0,
        "ms": 5.0,
        "exposed_ms": 4.0,
        "overlapped_ms": 1.0,
    }


# --- collectives by kind ----------------------------------------------------------------------


def test_collective_kinds_from_nccl_kernels_gloo_annotations_and_c10d_calls() -> None:
    assert collective_kind("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "all_gather"
    assert collective_kind("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "reduce_scatter"
    assert collective_kind(NCCL_ALLREDUCE) == "all_reduce"
    assert collective_kind("c10d::_reduce_scatter_base_") == "reduce_scatter"
    assert collective_kind("c10d::_allgather_base_") == "all_gather"
    assert collective_kind("gloo:all_reduce") == "all_reduce"
    assert collective_kind("ncclDevKernel_Broadcast_RING_LL") == "broadcast"
    assert collective_kind("gloo:barrier") == "other"


def test_gpu_collectives_exposed_and_overlapped_to_the_microsecond() -> None:
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.step(2, 1000, 1000)
    for base in (0, 1000):
        b.kernel(BF16_GEMM, base + 100, 400, launch_ts=base + 10)  # compute 100-500
        b.kernel("ncclDevKernel_AllGather_RING_LL", base + 50, 100, launch_ts=base + 20, stream=9)  # 50-150: 50 alone
        b.kernel(
            "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", base + 450, 250, launch_ts=base + 30, stream=9
        )  # 450-700: 200 alone
    times = collective_times(build_timeline(b.to_dict()))
    assert times["all_gather"].to_dict() == {
        "calls_per_step": 1.0,
        "ms": 0.1,
        "exposed_ms": 0.05,
        "overlapped_ms": 0.05,
    }
    assert times["reduce_scatter"].to_dict() == {
        "calls_per_step": 1.0,
        "ms": 0.25,
        "exposed_ms": 0.2,
        "overlapped_ms": 0.05,
    }
    assert set(times) == {"all_gather", "reduce_scatter"}


def test_gloo_reduce_scatter_runs_as_an_all_reduce_and_takes_the_issuing_calls_kind() -> None:
    b = TraceBuilder(device=False)
    b.step(1, 0, 1000)
    b.op("c10d::_allgather_base_", 10, 20)
    b.x("user_annotation", "gloo:all_gather", 15, 200, tid=5)  # 15-215
    b.op("aten::linear", 100, 300, forward=True)  # compute 100-400: 115 overlapped, 100 exposed
    b.backward_op(500, 200, tid=AUTOGRAD)  # 500-700
    b.op("c10d::_reduce_scatter_base_", 600, 10, tid=AUTOGRAD)  # FSDP reduces from a backward hook
    b.x("user_annotation", "gloo:all_reduce", 610, 300, tid=5)  # 610-910: 90 overlapped, 210 exposed
    times = collective_times(build_timeline(b.to_dict()))
    assert times["all_gather"].to_dict() == {
        "calls_per_step": 1.0,
        "ms": 0.2,
        "exposed_ms": 0.085,
        "overlapped_ms": 0.115,
    }
    assert times["reduce_scatter"].to_dict() == {
        "calls_per_step": 1.0,
        "ms": 0.3,
        "exposed_ms": 0.21,
        "overlapped_ms": 0.09,
    }
    assert "all_reduce" not in times


# --- the run directory: each rank's own analysis, the merge, the traces kept ------------------


def _four_ranks(tmp_path: Path) -> RunDir:
    """tests/data/ddp_straggler_cpu (2 gloo ranks), widened to 4: ranks 2 and 3 copy rank 0's
    record and trace (the fast ranks), so that rank 1 alone stands out."""
    folder = tmp_path / "run"
    (folder / "diagnose").mkdir(parents=True)
    source = DATA / "ddp_straggler_cpu"
    for rank, origin in ((0, 0), (1, 1), (2, 0), (3, 0)):
        record = json.loads((source / f"rank{origin}.run.json").read_text())
        trace = next(source.glob(f"rank{origin}_*.pt.trace.json.gz"))
        name = f"rank{rank}_" + trace.name.split("_", 1)[1]
        shutil.copy(trace, folder / name)
        record["trace_files"] = [name]
        (folder / "diagnose" / f"rank{rank}.run.json").write_text(json.dumps(record))
    return RunDir(folder)


OPTIONS = AnalysisOptions.load()


class _FakeExchange:
    """The job's store, for one process: what the ranks published."""

    def __init__(self) -> None:
        self.published: dict[int, dict] = {}
        self.store = object()

    def publish(self, summary: dict) -> bool:
        self.published[summary["rank"]] = summary
        return True

    def collect(self, timeout_s: float) -> list[dict] | None:
        return [self.published[r] for r in sorted(self.published)]


def _request(keep: str = "notable") -> RunRequest:
    from diagnose.record import WindowPlan

    return RunRequest(
        script="x.py",
        module=None,
        script_args=[],
        knobs=None,
        options=AnalysisOptions.load(),
        plan=WindowPlan(),
        keep_traces=keep,
    )  # type: ignore[arg-type]


def test_each_rank_writes_its_report_and_summary_and_rank_0_merges_from_summaries(tmp_path: Path) -> None:
    run_dir = _four_ranks(tmp_path)
    exchange = _FakeExchange()
    for rank in (3, 2, 1):  # the others first: they publish and return, merging nothing
        assert finish_rank(run_dir, RankInfo(rank, 4, rank, "torchrun"), OPTIONS, exchange) is None  # type: ignore[arg-type]
    report = finish_rank(run_dir, RankInfo(0, 4, 0, "torchrun"), OPTIONS, exchange)  # type: ignore[arg-type]
    assert report is not None
    own = sorted(p.name for p in run_dir.own_path.iterdir())
    assert own == [f"rank{r}.{kind}.json" for r in range(4) for kind in ("report", "run", "summary")] + ["report.json"]
    d = report.distributed
    assert d["gathered"] == "process group store" and d["world_size"] == 4
    assert d["straggler"]["rank"] == 1
    # the job's report is rank 1's view, the rank the others wait for, analysed from its trace by
    # the merging rank 0; rank 0's trace stays as the first rank's
    assert report.source["rank"] == 1 and any("findings are rank 1's" in w for w in report.warnings)
    assert list(d["notable_ranks"]) == ["0", "1"] and d["notable_ranks"]["0"] == "the first rank"
    assert d["notable_ranks"]["1"].startswith(
        "the report's breakdown, straggler, slowest step, outlier: data wait 6.24 ms"
    )
    assert d["traces_removed"] == [2, 3]
    assert [p.name.split("_")[0] for p in run_dir.traces()] == ["rank0", "rank1"]
    assert [r["trace"] is None for r in d["ranks"]] == [False, False, True, True]
    # DIST003 first; rank 1's own loader rules (DATA001, DATA007) say nothing more (DATA005, its
    # workers starting again every epoch, is a cause of its own)
    assert next(f["rule"] for f in report.findings) == "DIST003"
    assert not {"DATA001", "DATA007", "DIST002"} & {f["rule"] for f in report.findings}
    # rank 1's own report is its own diagnosis: no other rank is in it
    own_report = json.loads(run_dir.rank_report_path(1).read_text())
    assert own_report["distributed"] is None and own_report["source"]["rank"] == 1
    # later, `diagnose analyze RUN_DIR` works from the summaries and rank 0's trace alone
    again = analyze_run(run_dir, AnalysisOptions.load())
    assert again.distributed["straggler"] == d["straggler"]
    assert [r["rank"] for r in again.distributed["ranks"]] == [0, 1, 2, 3]
    assert again.distributed["ranks"][3]["data_wait_ms"] == d["ranks"][3]["data_wait_ms"]


def test_keep_traces_all_removes_none_and_a_missing_store_falls_back_to_the_run_directory(tmp_path: Path) -> None:
    run_dir = _four_ranks(tmp_path)
    for rank in (1, 2, 3):
        finish_rank(run_dir, RankInfo(rank, 4, rank, "slurm"), OPTIONS, None, keep_traces="all")
    report = finish_rank(run_dir, RankInfo(0, 4, 0, "slurm"), OPTIONS, None, keep_traces="all", timeout_s=5)
    assert report is not None
    assert report.distributed["gathered"] == "run directory"
    assert report.distributed["traces_removed"] == []
    assert len(run_dir.traces()) == 4


def test_a_rank_without_a_summary_is_summarised_from_its_trace(tmp_path: Path) -> None:
    """An older diagnose's run directory (no summaries) is still read: every trace is analysed,
    one at a time, and gives the same summaries as each rank's own analysis."""
    run_dir = _four_ranks(tmp_path)
    old = analyze_run(run_dir, AnalysisOptions.load())
    record = run_dir.load_record(2)
    assert record is not None
    own = analyse_rank(2, record, run_dir.trace_for(record, 2)[0], AnalysisOptions.load()).summary
    assert old.distributed["ranks"][2]["data_wait_ms"] == own.data_wait_ms
    removed = keep_notable_traces(run_dir, old, "notable")
    assert removed == [2, 3]


def test_a_summary_is_written_whole(tmp_path: Path) -> None:
    run_dir = RunDir.create(tmp_path / "r")
    run_dir.save_rank_summary(5, _summary(5).to_dict())
    assert run_dir.summary_ranks() == [5]
    assert [p.name for p in run_dir.own_path.iterdir()] == ["rank5.summary.json"]  # no partial file left
    assert RankSummary.from_dict(run_dir.load_rank_summaries()[5]) == _summary(5)


# --- launchers: the variables each one sets ---------------------------------------------------


def test_srun_variables_make_every_task_a_rank() -> None:
    # srun --nodes 2 --ntasks-per-node 4: task 6 is the third task of the second node
    env = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NODEID": "1", "SLURM_JOB_ID": "4242"}
    assert rank_info(env) == RankInfo(6, 8, 2, "slurm")
    assert shared_location("train", env) == Path("runs/train-4242")
    # torchrun inside an sbatch allocation: torchrun's variables win over SLURM's
    assert rank_info({**env, "RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3"}) == RankInfo(3, 16, 3, "torchrun")


def test_kubeflow_and_ray_train_workers_are_torchrun_ranks() -> None:
    """A Kubeflow PyTorchJob runs torchrun in each pod (PET_* become its options; torchrun sets
    RANK ...); Ray Train's TorchTrainer sets RANK, WORLD_SIZE, LOCAL_RANK in each worker."""
    pod = {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "4",
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "TORCHELASTIC_RUN_ID": "job-7",
    }
    assert rank_info(pod) == RankInfo(5, 8, 1, "torchrun")
    assert shared_location("train", pod) == Path("runs/train-job-7")


def test_multi_node_torchrun_takes_the_rendezvous_options_instead_of_standalone() -> None:
    options = ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29400", "--rdzv-id=job7"]
    cmd = torchrun_command(4, Path("/shared/run"), ["--quiet"], ["train.py"], options)
    assert cmd[1:8] == ["-m", "torch.distributed.run", *options, "--nproc-per-node=4"]
    assert "--standalone" not in cmd
    assert launch_options(["--node_rank=1"]) == ["--node-rank=1"]
    with pytest.raises(UsageError, match="not a torchrun option"):
        launch_options(["--warmup=3"])
    with pytest.raises(UsageError):
        launch_options(["--nnodes"])  # no value


def test_one_node_merges_in_the_launcher_several_nodes_in_the_jobs_rank_0() -> None:
    assert launch_environment((), {"PATH": "/bin"}) == {"PATH": "/bin", PARENT_MERGES: "1"}
    assert launch_environment(["--nnodes=2"], {"PATH": "/bin"}) == {"PATH": "/bin"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nnodes", "2", "t.py"], "go with --nproc-per-node"),
        (["--nproc-per-node", "2", "--nnodes", "2", "--rdzv-endpoint", "h:1", "t.py"], "needs --out"),
        (["--keep-traces", "some", "t.py"], "--keep-traces takes notable or all"),
    ],
)
def test_launcher_options_are_checked_before_anything_runs(tmp_path: Path, args: list[str], message: str) -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    (tmp_path / "t.py").write_text("raise SystemExit('must not run')\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "diagnose", "run", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_the_ranks_are_told_which_traces_to_keep() -> None:
    argv = _request("all").rank_argv()
    assert argv[argv.index("--keep-traces") + 1] == "all"


def test_rank_summaries_of_a_run_record_alone(tmp_path: Path) -> None:
    """A rank that wrote no trace (it failed before its window) still has a summary: its status."""
    record = RunRecord(target={"kind": "script", "value": "x.py", "args": []}, command=[], status="failed")
    summary = analyse_rank(4, record, None, AnalysisOptions.load()).summary
    assert (summary.rank, summary.status, summary.median_step_ms, summary.step_ms, summary.trace) == (
        4,
        "failed",
        None,
        [],
        None,
    )


RAY_WORKER = """
import json, os, sys
import torch
from torch import nn
import diagnose

# Ray Train: train_loop_per_worker gets its rank from ray.train.get_context(); the recipe in
# docs/distributed.md puts it where diagnose reads it, as this worker's environment already has
torch.manual_seed(int(os.environ["RANK"]))
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with diagnose.profile(rank_aware=True, out=sys.argv[1], warmup=1, steps=3, timed_steps=3) as run:
    for _ in range(50):
        x = torch.randn(16, 32)
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
print(json.dumps({"rank": os.environ["RANK"], "world": (run.report.distributed or {}).get("world_size")}))
"""


@pytest.mark.slow
def test_ray_train_workers_profile_themselves_and_rank_0_merges(tmp_path: Path) -> None:
    """Two workers with the variables a Ray Train (or Kubeflow) worker has, no process group:
    the summaries meet in the run directory."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    (tmp_path / "worker.py").write_text(RAY_WORKER)
    procs = []
    for rank in (1, 0):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC"))}
        env.update(PYTHONPATH=str(REPO), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_PORT="29999")
        procs.append(
            subprocess.Popen(
                [sys.executable, "worker.py", str(tmp_path / "job")],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    lines = {
        json.loads(out.strip().splitlines()[-1])["rank"]: json.loads(out.strip().splitlines()[-1]) for out, _ in outputs
    }
    assert lines["0"]["world"] == 2 and lines["1"]["world"] is None  # rank 0's report is the job's
    report = json.loads((tmp_path / "job" / "diagnose" / "report.json").read_text())
    assert report["distributed"]["gathered"] == "run directory"
    assert [r["rank"] for r in report["distributed"]["ranks"]] == [0, 1]
    assert sorted(p.name for p in (tmp_path / "job" / "diagnose").iterdir()) == [
        "rank0.report.json",
        "rank0.run.json",
        "rank0.summary.json",
        "rank1.report.json",
        "rank1.run.json",
        "rank1.summary.json",
        "report.json",
    ]
