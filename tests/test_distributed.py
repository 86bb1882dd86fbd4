"""Distributed runs on CPU (gloo, two processes): the launcher, the shared run directory, the
ranks side by side, and the straggler. The GPU (NCCL) part of the truth needs two GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.analysis.measure.ranks import RankSummary, straggler
from diagnose.analysis.pipeline import AnalysisOptions
from diagnose.distributed import RankInfo, rank_info, torchrun_command
from diagnose.rundir import RunDir, shared_location
from diagnose.session import analyze_run
from tests.conftest import DATA, REPO

pytest.importorskip("torch")


def test_rank_info_from_torchrun_and_slurm() -> None:
    assert rank_info({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == RankInfo(1, 4, 1, "torchrun")
    assert rank_info({"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3"}) == RankInfo(3, 8, 3, "slurm")
    assert rank_info({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # one task: not distributed
    assert rank_info({}) is None


def test_every_rank_agrees_on_the_run_directory() -> None:
    assert shared_location("train", {"TORCHELASTIC_RUN_ID": "abc"}) == Path("runs/train-abc")
    assert shared_location("train", {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77"}) == Path("runs/train-77")
    assert shared_location("train", {"MASTER_PORT": "29500"}) == Path("runs/train-port29500")


def test_torchrun_command() -> None:
    cmd = torchrun_command(2, Path("runs/x"), ["--quiet"], ["train.py", "--", "--lr", "1"])
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[5:] == [
        "-m",
        "diagnose",
        "run",
        "--rank-aware",
        "--out",
        "runs/x",
        "--quiet",
        "train.py",
        "--",
        "--lr",
        "1",
    ]


def _summary(rank: int, wait: float, step: float = 10.0) -> RankSummary:
    return RankSummary(rank, "stopped", step, wait, wait / step, 0.0, 0.0, None, 16, "data_wait", "gloo")


def test_straggler_is_the_rank_whose_data_wait_stands_out() -> None:
    result = straggler([_summary(0, 1.0), _summary(1, 6.0), _summary(2, 1.5), _summary(3, 1.0)])
    assert result == {
        "rank": 1,
        "data_wait_ms": 6.0,
        "others_data_wait_ms": 1.0,
        "excess_ms": 5.0,
        "excess_share": 0.5,
        "median_step_ms": 10.0,
    }
    assert straggler([_summary(0, 1.0)]) is None


def test_recorded_two_rank_pair_names_the_straggler() -> None:
    """tests/data/ddp_straggler_cpu: examples/ddp_straggler.py --small, 2 gloo ranks on CPU, trimmed."""
    folder = DATA / "ddp_straggler_cpu"
    assert [p.name.split("_")[0] for p in RunDir(folder).traces()] == ["rank0", "rank1"]
    report = analyze_run(RunDir(folder), AnalysisOptions.load())
    ranks = report.distributed["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert report.distributed["straggler"]["rank"] == 1
    assert ranks[1]["data_wait_ms"] > 3 * ranks[0]["data_wait_ms"]
    assert ranks[0]["top_exposed"] == "communication"  # rank 0 waits for rank 1 at the all-reduce
    # the job's report is the straggler's view (the rank the others wait for), and DIST003 says
    # its loader's cause once: not DIST002 (the wait is the straggler's), not DATA001/DATA007
    assert report.source["rank"] == 1
    assert any("the job's breakdown and findings are rank 1's" in w for w in report.warnings)
    rules = [f["rule"] for f in report.findings]
    assert rules[0] == "DIST003" and not {"DIST002", "DATA001", "DATA007"} & set(rules)
    assert "Rank 1 waits" in report.findings[0]["says"]
    # every rank trains on its own samples: the job's throughput is their sum
    for r in ranks:
        record = json.loads((folder / f"rank{r['rank']}.run.json").read_text())
        assert r["steady_samples_per_s"] == round(record["timed_samples"] / record["timed_seconds"], 3)
    assert report.distributed["job_samples_per_s"] == round(sum(r["steady_samples_per_s"] for r in ranks), 3)


def test_recorded_nccl_pair_names_the_straggler_and_nothing_else() -> None:
    """tests/data/ddp_straggler_nccl: examples/ddp_straggler.py on 2 H200s with NCCL, trimmed."""
    report = analyze_run(RunDir(DATA / "ddp_straggler_nccl"), AnalysisOptions.load())
    ranks = report.distributed["ranks"]
    assert [r["backend"] for r in ranks] == ["nccl", "nccl"]
    assert report.distributed["straggler"]["rank"] == 1
    assert ranks[1]["data_wait_ms"] > 100 and ranks[0]["data_wait_ms"] < 1
    # rank 0's NCCL all-reduce kernel spins while it waits for rank 1: communication, on the GPU
    assert ranks[0]["top_exposed"] == "communication" and ranks[0]["exposed_communication_share"] > 0.9
    assert ranks[0]["communication_ms"] > 50
    # DDP's forward blocks in cudaEventSynchronize until that all-reduce ends: a wait for the
    # straggler, not a sync to remove (SYNC001 once fired here with "GPU idle 293% of the step")
    assert report.symptoms["sync.per_step"]["value"] == 0
    assert [f["rule"] for f in report.findings] == ["DIST003"]


def test_recorded_nccl_pair_of_a_communication_bound_mlp() -> None:
    """tests/data/ddp_mlp_nccl: workloads/train.py, the 456M-parameter MLP (fp32 gradients, 1.8 GB
    per step) on 2 H200s, batch 128 per GPU, 8 workers per rank."""
    report = analyze_run(RunDir(DATA / "ddp_mlp_nccl"), AnalysisOptions.load())
    ranks = report.distributed["ranks"]
    assert all(r["top_exposed"] == "communication" for r in ranks)
    assert report.symptoms["exposed.communication_own"]["value"] >= 0.15
    rules = [f["rule"] for f in report.findings]
    assert "DIST002" in rules and "DIST003" not in rules and "SYNC001" not in rules
    assert report.distributed["job_samples_per_s"] > 10_000


@pytest.mark.parametrize("name", ["ddp_straggler_cpu", "ddp_straggler_nccl", "ddp_mlp_nccl"])
def test_the_rank_table_and_the_breakdown_describe_one_rank_with_one_communication_figure(name: str) -> None:
    """The job's breakdown is the lead rank's (rank 1 in these pairs: the others wait for it);
    the rank table said "the report above is rank 0's", and "comm ms 0.00" on gloo beside a
    breakdown of exposed communication."""
    from diagnose.renderers.html import HTMLRenderer
    from diagnose.renderers.terminal import TerminalRenderer
    from diagnose.renderers.view import ReportView

    report = analyze_run(RunDir(DATA / name), AnalysisOptions.load())
    lead = report.source["rank"]
    view = ReportView.from_report(report)
    assert lead == 1 and view.ranks is not None and view.ranks.lead_rank == lead
    text = TerminalRenderer(color=False, width=160).render(report)
    assert f"the report above is rank {lead}'s" in text and "rank 0's" not in text
    assert f"the breakdown above is rank {lead}" in HTMLRenderer().render(report)  # its apostrophe escaped
    communication = next(row for row in view.breakdown.exposed if row.category == "communication")
    row = next(r for r in view.ranks.rows if r.rank == lead)
    assert row.exposed_communication_ms == pytest.approx(communication.mean_ms, abs=1e-3)
    assert f"{communication.mean_ms:.2f}" in text.split("ranks side by side", 1)[1]
    assert all(r.communication_ms for r in view.ranks.rows)  # in flight: gloo's threads' time too, never 0.00 beside it


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


WINDOW = ["--warmup", "2", "--steps", "4", "--timed-steps", "4", "--quiet"]
EXAMPLE = str(REPO / "examples" / "ddp_straggler.py")


@pytest.mark.slow
def test_nproc_per_node_launches_through_torchrun_and_merges(tmp_path: Path) -> None:
    proc = _run(
        [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--nproc-per-node",
            "2",
            *WINDOW,
            "--json",
            "--out",
            "run",
            EXAMPLE,
            "--",
            "--small",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["distributed"]["world_size"] == 2
    assert report["distributed"]["straggler"]["rank"] == 1
    assert report["findings"][0]["rule"] == "DIST003"
    names = sorted(p.name for p in (tmp_path / "run").iterdir())
    own = sorted(p.name for p in (tmp_path / "run" / "diagnose").iterdir())
    assert {"rank0.run.json", "rank1.run.json", "report.json"} <= set(own)
    # each rank analysed its own trace; the launcher merged from their summaries
    assert {"rank0.report.json", "rank1.report.json", "rank0.summary.json", "rank1.summary.json"} <= set(own)
    assert report["distributed"]["gathered"] == "run directory"
    assert any(n.startswith("rank0_") and n.endswith(".pt.trace.json.gz") for n in names)
    assert any(n.startswith("rank1_") and n.endswith(".pt.trace.json.gz") for n in names)
    backend = json.loads((tmp_path / "run" / "diagnose" / "rank1.run.json").read_text())["distributed"]
    assert backend["backend"] == "gloo" and backend["world_size"] == 2


@pytest.mark.slow
def test_torchrun_dash_m_diagnose_rank_aware(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "diagnose",
        "run",
        "--rank-aware",
    ]
    proc = _run([*cmd, *WINDOW, "--json", "--out", "shared", EXAMPLE, "--", "--small"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(line) for line in _json_objects(proc.stdout)]
    assert len(reports) == 1, "rank 0 alone merges and prints"
    assert reports[0]["distributed"]["straggler"]["rank"] == 1
    # the summaries came over the job's process-group store, kept after the script destroyed its group
    assert reports[0]["distributed"]["gathered"] == "process group store"
    assert reports[0]["distributed"]["ranks"][1]["collectives"]["all_reduce"]["calls_per_step"] == 1.0


def _json_objects(text: str) -> list[str]:
    """torchrun prefixes nothing but interleaves ranks' stdout: find the one JSON document."""
    start = text.find("{\n")
    return [text[start:]] if start >= 0 else []


def test_rank_aware_without_a_launcher_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("pass\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "diagnose", "run", "--rank-aware", "t.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "--rank-aware needs" in proc.stderr


@pytest.mark.slow
def test_fsdp2_over_gloo_splits_all_gathers_from_reduce_scatters(tmp_path: Path) -> None:
    """examples/fsdp_exposed_comm.py --small: 6 fully_shard blocks and the root, 2 gloo ranks.
    Per step, forward gathers 7 groups and backward re-gathers the 6 blocks (they reshard after
    forward; the root's parameters stay gathered); 7 reduce-scatters, issued from the autograd
    thread, run as gloo all-reduces."""
    example = str(REPO / "examples" / "fsdp_exposed_comm.py")
    proc = _run(
        [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--nproc-per-node",
            "2",
            *WINDOW,
            "--json",
            "--out",
            "run",
            example,
            "--",
            "--small",
            "--steps",
            "30",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    for row in report["distributed"]["ranks"]:
        kinds = row["collectives"]
        assert sorted(kinds) == ["all_gather", "reduce_scatter"]
        assert kinds["all_gather"]["calls_per_step"] == 13.0 and kinds["reduce_scatter"]["calls_per_step"] == 7.0
        for c in kinds.values():
            assert c["ms"] == pytest.approx(c["exposed_ms"] + c["overlapped_ms"], abs=2e-4)
    assert report["symptoms"]["dist.all_gather_exposed"]["value"] > 0
