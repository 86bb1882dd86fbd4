"""verify and sweep of torchrun jobs, and two torchrun "nodes" on one host diagnosed as one job
(a c10d rendezvous, one gloo rank per node): the launch options, the job's samples/s as the
compared figure, the report a node that does not merge waits for."""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from diagnose.experiments import Launch, Spec, outcome_from_report, wait_for_report
from diagnose.rundir import RunDir
from tests.conftest import REPO

BUCKETS = str(REPO / "examples" / "ddp_buckets.py")
STRAGGLER = str(REPO / "examples" / "ddp_straggler.py")
WINDOW = ["--warmup", "2", "--steps", "3", "--timed-steps", "5"]


def test_each_experiment_meets_in_its_own_rendezvous() -> None:
    launch = Launch(2, ("--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29400", "--rdzv-id=job42"))
    argv = launch.argv("bucket_cap_mb=1")
    assert argv[:2] == ["--nproc-per-node", "2"] and launch.multi_node
    assert argv[argv.index("--rdzv-id") + 1] == "job42-bucket_cap_mb_1"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "node0:29400"
    assert Launch(2).argv("baseline-1") == ["--nproc-per-node", "2"] and not Launch(2).multi_node
    assert Launch().argv("x") == []


def test_a_job_is_compared_by_its_samples_per_s_not_its_lead_ranks() -> None:
    report = {
        "status": {"state": "stopped"},
        "throughput": {"steady": {"steps_per_s": 10.0, "samples_per_s": 160.0}},
        "distributed": {"job_samples_per_s": 330.0},
    }
    outcome = outcome_from_report(Spec("baseline"), report, Path("/nowhere"), 0)
    assert outcome.status == "ok" and outcome.samples_per_s == 330.0 and outcome.steps_per_s == 10.0


def test_a_node_that_does_not_merge_waits_for_a_fresh_report(tmp_path: Path) -> None:
    run_dir = RunDir.create(tmp_path / "run")
    run_dir.own_path.mkdir(parents=True, exist_ok=True)
    run_dir.report_path.write_text(json.dumps({"old": True}))
    os.utime(run_dir.report_path, (1.0, 1.0))  # an earlier run's report in a reused folder
    since = time.time()
    assert wait_for_report(run_dir, since, timeout_s=0.3, poll_s=0.05) == {}
    threading.Timer(0.2, lambda: run_dir.report_path.write_text(json.dumps({"new": True}))).start()
    assert wait_for_report(run_dir, since - 1, timeout_s=10, poll_s=0.05) == {"new": True}


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")


@pytest.mark.slow
def test_sweep_under_torchrun_applies_the_ddp_knob_on_every_rank_and_compares_the_jobs(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "diagnose",
        "sweep",
        "--nproc-per-node",
        "2",
        *WINDOW,
        "--set",
        "bucket_cap_mb=1,10000",
        "--json",
        "--out",
        "sw",
        BUCKETS,
        "--",
        "--small",
        "--steps",
        "40",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=500, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)["experiments"]["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok"]
    for row, cap in zip(rows, ("1", "10000"), strict=True):
        assert row["via"] == {"bucket_cap_mb": f"DistributedDataParallel(bucket_cap_mb={cap})"}
        report = RunDir(Path(row["run_dir"])).load_report().to_dict()
        assert report["distributed"]["world_size"] == 2
        for rank in (0, 1):  # every rank built its DDP with the knob's bucket size
            record = json.loads(RunDir(Path(row["run_dir"])).record_path(rank).read_text())
            assert record["knobs_via"]["bucket_cap_mb"] == f"DistributedDataParallel(bucket_cap_mb={cap})"
        calls = report["distributed"]["ranks"][0]["collectives"]["all_reduce"]["calls_per_step"]
        assert (calls > 1) if cap == "1" else (calls == 1)  # 2 MiB of gradients: several buckets of 1 MiB, else one


@pytest.mark.slow
def test_a_job_of_one_rank_is_diagnosed_like_any_other(tmp_path: Path) -> None:
    """A scaling sweep's first point (nproc_per_node=1) is one torchrun rank whose launching
    parent holds the run directory: the rank, a world of one, once took it for a plain run,
    asked for the directory's lock and failed ("another diagnose run is writing into ...")."""
    cmd = [sys.executable, "-m", "diagnose", "run", "--nproc-per-node", "1", *WINDOW, "--no-check", "--json"]
    cmd += ["--out", "one", BUCKETS, "--", "--small", "--steps", "40"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["distributed"]["world_size"] == 1
    assert [r["rank"] for r in report["distributed"]["ranks"]] == [0]


def _both(nodes: list[subprocess.Popen[str]], timeout: float) -> list[tuple[str, str]]:
    """Every "node"'s stdout and stderr once all have ended, each with exit code 0. Read side by
    side: a node that fails ends the wait at once, the others killed (one that ended before the
    rendezvous leaves the other waiting there for torchrun's 600 s), and every node's stderr is
    shown; so is a hang's, at the timeout."""
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        futures = [pool.submit(proc.communicate) for proc in nodes]
        deadline = time.monotonic() + timeout
        while not all(f.done() for f in futures) and time.monotonic() < deadline:
            if any(proc.poll() not in (None, 0) for proc in nodes):
                break
            time.sleep(0.2)
        for proc in nodes:
            if proc.poll() is None:
                proc.kill()
        outputs = [f.result() for f in futures]
    codes = [proc.wait() for proc in nodes]
    said = "\n".join(
        f"node {i} (exit {code}):\n{err[-2000:]}" for i, (code, (_, err)) in enumerate(zip(codes, outputs, strict=True))
    )
    assert codes == [0] * len(nodes), said
    return outputs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_torchrun_nodes_with_a_c10d_rendezvous_are_diagnosed_as_one_job(tmp_path: Path) -> None:
    """Two ``diagnose run --nnodes 2`` on one host, one gloo rank each, meeting at a c10d
    rendezvous: the job's rank 0 (on whichever node) merges both ranks into one report in the
    shared --out; the other node's diagnose finds it there or says where it will be."""
    port = _free_port()
    shared = tmp_path / "shared"

    def node(rank: int) -> subprocess.Popen[str]:
        cmd = [
            sys.executable,
            "-m",
            "diagnose",
            "run",
            "--nproc-per-node",
            "1",
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "two-nodes",
            *WINDOW,
            "--json",
            "--out",
            str(shared),
            STRAGGLER,
            "--",
            "--small",
            "--steps",
            "60",
        ]
        return subprocess.Popen(
            cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    outputs = _both([node(0), node(1)], timeout=400)
    report = RunDir(shared).load_report().to_dict()
    dist = report["distributed"]
    assert dist["world_size"] == 2 and [r["rank"] for r in dist["ranks"]] == [0, 1]
    assert dist["gathered"] == "process group store"  # the job's rank 0 merged, not a node's launcher
    assert {r["backend"] for r in dist["ranks"]} == {"gloo"}
    assert all(r["collectives"]["all_reduce"]["calls_per_step"] >= 1 for r in dist["ranks"])
    printed = [json.loads(out) for out, _ in outputs if out.strip()]
    assert printed and all(p["distributed"]["world_size"] == 2 for p in printed)  # the node that merged printed it


def test_verify_tries_the_named_rules_finding_wherever_it_ranks() -> None:
    from diagnose.experiments import Baseline, VerifyResult, candidates_from_report, summarize_verify

    report = {
        "findings": [
            {"rule": "LAUNCH001", "knobs": {"compile": "default"}},
            {"rule": "DIST002", "knobs": {}},
            {"rule": "DIST008", "knobs": {"bucket_cap_mb": "4"}},
        ]
    }
    assert [s.rule for s in candidates_from_report(report, top=1)] == ["LAUNCH001"]
    assert [(s.rule, s.knobs) for s in candidates_from_report(report, top=1, rules=["DIST008"])] == [
        ("DIST008", {"bucket_cap_mb": "4"})
    ]
    result = VerifyResult(Baseline([], True), [], None, [], not_fired=["DIST009"])
    assert summarize_verify(result, report)["conclusions"] == [
        "DIST009 did not fire on the baseline: nothing of it to try"
    ]


@pytest.mark.slow
def test_a_sweep_on_two_simulated_nodes_measures_each_point_as_one_job(tmp_path: Path) -> None:
    """The same ``diagnose sweep --nnodes 2 ...`` on both "nodes", into one --out: each point is
    one two-rank job in its own rendezvous; the node whose ranks do not merge waits for the
    job's report and tabulates the same figure."""
    port = _free_port()
    shared = tmp_path / "shared"

    def node() -> subprocess.Popen[str]:
        cmd = [
            sys.executable,
            "-m",
            "diagnose",
            "sweep",
            "--nproc-per-node",
            "1",
            "--nnodes",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "sweep",
            *WINDOW,
            "--set",
            "bucket_cap_mb=1,10000",
            "--json",
            "--out",
            str(shared),
            BUCKETS,
            "--",
            "--small",
            "--steps",
            "40",
        ]
        return subprocess.Popen(
            cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    tables = [json.loads(out)["experiments"]["rows"] for out, _ in _both([node(), node()], timeout=600)]
    for rows in tables:
        assert [r["status"] for r in rows] == ["ok", "ok"]
    assert [r["steps_per_s"] for r in tables[0]] == [
        r["steps_per_s"] for r in tables[1]
    ]  # one job per point, read alike
    for row in tables[0]:
        report = RunDir(Path(row["run_dir"])).load_report().to_dict()
        assert report["distributed"]["world_size"] == 2
