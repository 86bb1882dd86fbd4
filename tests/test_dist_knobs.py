"""The distributed knobs (DDP, FSDP2, FSDP1, the backend, env.NAME) applied to the objects a script
builds, without editing it: a one-rank gloo group in this process."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from diagnose.errors import UsageError
from diagnose.runtime.knobs import Knobs


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _installed(*assignments: str) -> Knobs:
    knobs = Knobs.parse(list(assignments))
    knobs.install()
    return knobs


def test_ddp_keywords_are_replaced_in_the_constructor(group: None) -> None:
    knobs = _installed("bucket_cap_mb=1.5", "gradient_as_bucket_view=true", "static_graph=true")
    try:
        ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 4), bucket_cap_mb=10000)
    finally:
        knobs.remove()
    assert ddp.bucket_bytes_cap == int(1.5 * 1024 * 1024)
    assert ddp.gradient_as_bucket_view and ddp.static_graph
    assert knobs.via()["bucket_cap_mb"] == "DistributedDataParallel(bucket_cap_mb=1.5)"
    plain = nn.parallel.DistributedDataParallel(nn.Linear(4, 4))  # removed: the script's own values again
    assert plain.bucket_bytes_cap == 25 * 1024 * 1024 and not plain.static_graph


def test_a_ddp_knob_the_script_never_reached_says_so() -> None:
    knobs = _installed("bucket_cap_mb=10")
    knobs.remove()
    assert knobs.via()["bucket_cap_mb"].startswith("not applied")


def _blocks() -> tuple[nn.ModuleList, nn.Sequential]:
    blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
    return blocks, nn.Sequential(*blocks)


def test_fully_shard_takes_reshard_mixed_precision_and_a_prefetch_chain(group: None) -> None:
    import torch.distributed.fsdp as fsdp

    original = fsdp.fully_shard
    knobs = _installed("reshard_after_forward=false", "reduce_dtype=bf16", "forward_prefetch=2", "backward_prefetch=1")
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # as a script imports it, after install

        blocks, model = _blocks()
        for block in blocks:
            fully_shard(block, reshard_after_forward=True, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))
        fully_shard(model)  # the root holds the blocks: not part of the chain
    finally:
        knobs.remove()
    states = [b._get_fsdp_state() for b in blocks]
    forward = [[s for s in st._states_to_forward_prefetch] for st in states]
    assert forward == [[states[1], states[2]], [states[2], states[3]], [states[3]], []]
    assert [list(st._states_to_backward_prefetch) for st in states] == [[], [states[0]], [states[1]], [states[2]]]
    policy = states[0]._mp_policy
    assert policy.reduce_dtype == torch.bfloat16 and policy.param_dtype == torch.float32  # the script's own field kept
    assert states[0]._fsdp_param_group.post_forward_mesh_info is None  # not resharded after forward
    assert knobs.via()["reduce_dtype"].startswith(
        "fully_shard(reshard_after_forward=False, mp_policy=MixedPrecisionPolicy(reduce_dtype=bf16)"
    )
    assert fsdp.fully_shard is original  # removed


def test_fsdp1_takes_prefetch_and_mixed_precision(group: None) -> None:
    knobs = _installed("forward_prefetch=1", "backward_prefetch=0", "reduce_dtype=bf16")
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(nn.Linear(8, 8), device_id=torch.device("cpu"))
    finally:
        knobs.remove()
    assert model.forward_prefetch is True and model.backward_prefetch is None
    assert model.mixed_precision.reduce_dtype == torch.bfloat16
    assert knobs.via()["forward_prefetch"].startswith("FullyShardedDataParallel(forward_prefetch=True")


def test_the_backend_knob_replaces_the_scripts_backend() -> None:
    knobs = _installed("backend=gloo")
    try:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)  # no NCCL here: gloo it is
        try:
            assert dist.get_backend() == "gloo"
        finally:
            dist.destroy_process_group()
    finally:
        knobs.remove()
    assert knobs.via()["backend"] == 'init_process_group(backend="gloo")'


def test_env_knobs_set_variables_until_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DIAGNOSE_TEST_DP", raising=False)
    knobs = _installed("env.DIAGNOSE_TEST_DP=4")
    assert os.environ["DIAGNOSE_TEST_DP"] == "4" and knobs.as_dict() == {"env.DIAGNOSE_TEST_DP": "4"}
    knobs.remove()
    assert "DIAGNOSE_TEST_DP" not in os.environ


@pytest.mark.parametrize("bad", ["bucket_cap_mb=0", "bucket_cap_mb=big", "reduce_dtype=int8", "env.=1"])
def test_bad_distributed_values_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError):
        Knobs.parse([bad])


def test_diagnose_knobs_lists_every_distributed_knob() -> None:
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "diagnose", "knobs", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    names = {k["name"] for k in json.loads(proc.stdout)}
    wanted = {
        "bucket_cap_mb",
        "gradient_as_bucket_view",
        "static_graph",
        "reshard_after_forward",
        "forward_prefetch",
        "backward_prefetch",
        "param_dtype",
        "reduce_dtype",
        "backend",
        "nproc_per_node",
        "env.<NAME>",
    }
    assert wanted <= names
