"""Advice already taken (issue 33, item 4): the runner reads the settings a rule would advise off
the model's wrappers (FSDP prefetch, DataParallel's devices, DDP's buckets), and a rule whose
setting is on says why it is not enough (``[already]``) or, where the change cannot gain, stays
silent."""

from __future__ import annotations

import pytest

from diagnose.analysis.symptoms import symptoms_from_values
from diagnose.analysis.verdict.findings import make_finding
from diagnose.analysis.verdict.rules import load_rules

RULES = {r.id: r for r in load_rules()}


def test_dist006_says_why_the_scripts_own_prefetch_is_not_enough() -> None:
    values = {"dist.world_size": 2, "dist.all_gather_exposed": 0.3, "exposed.communication_own": 0.35, "gpu.present": 1}
    plain = make_finding(RULES["DIST006"], symptoms_from_values(values))
    assert "set_modules_to_forward_prefetch" in plain.do  # the advice: switch prefetch on
    taken = make_finding(RULES["DIST006"], symptoms_from_values({**values, "fsdp.prefetch_set": 1}))
    assert taken.title == "FSDP's parameter all-gathers stay exposed although the script prefetches them"
    assert "with the script's own forward and backward prefetch set" in taken.says
    assert "set_modules_to_forward_prefetch" not in taken.do and "param_dtype=torch.bfloat16" in taken.do


def test_dist001_is_silent_for_dataparallel_over_one_gpu() -> None:
    rule = RULES["DIST001"]
    assert rule.fires({"model.data_parallel": 1, "gpu.present": 1, "model.data_parallel_devices": 2})
    assert not rule.fires({"model.data_parallel": 1, "gpu.present": 1, "model.data_parallel_devices": 1})
    assert rule.fires({"model.data_parallel": 1, "gpu.present": 1})  # an older run.json: devices unknown


torch = pytest.importorskip("torch")


def test_the_runner_reads_fsdp2_prefetch_and_dataparallel_devices() -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from diagnose.runtime.instrument import describe_parallel

    assert describe_parallel(torch.nn.DataParallel(torch.nn.Linear(2, 2))) == {
        "kind": "DataParallel",
        "devices": torch.cuda.device_count(),
    }
    assert describe_parallel(torch.nn.Linear(2, 2)) == {}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        model = torch.nn.Sequential(*blocks)
        for block in blocks:
            fully_shard(block)
        fully_shard(model)
        seen = describe_parallel(model)
        assert seen == {
            "kind": "FSDP2",
            "sharded_modules": 4,
            "forward_prefetch_modules": 0,
            "backward_prefetch_modules": 0,
        }
        blocks[0].set_modules_to_forward_prefetch([blocks[1]])
        blocks[1].set_modules_to_forward_prefetch([blocks[2]])
        blocks[2].set_modules_to_backward_prefetch([blocks[1]])
        seen = describe_parallel(model)
        assert (seen["forward_prefetch_modules"], seen["backward_prefetch_modules"]) == (2, 1)
    finally:
        dist.destroy_process_group()


def test_an_fsdp1_model_is_told_fsdp1s_arguments() -> None:
    """From the wrapper the runner reads to the advice: an FSDP1 model records ``kind`` FSDP1,
    ``fsdp.version`` reads 1, and DIST006 speaks in FullyShardedDataParallel's arguments, never
    FSDP2's ``fully_shard`` (issue 34, item 3)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    from diagnose.analysis.symptoms import compute_symptoms
    from diagnose.record import ModelInfo, RunRecord
    from diagnose.runtime.instrument import describe_parallel

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = FullyShardedDataParallel(torch.nn.Linear(4, 4), device_id=torch.device("cpu"))
        seen = describe_parallel(model)
    finally:
        dist.destroy_process_group()
    assert seen["kind"] == "FSDP1" and seen["forward_prefetch"] is False
    record = RunRecord(models=[ModelInfo("m", 20, "float32", 0, False, False, False, False, seen)])
    recorded = compute_symptoms(None, record).values_by_name()
    assert (recorded["fsdp.version"], recorded["fsdp.prefetch_set"]) == (1, 0)
    gathers = {"dist.world_size": 2, "dist.all_gather_exposed": 0.3, "exposed.communication_own": 0.35}
    do = make_finding(RULES["DIST006"], symptoms_from_values({**recorded, **gathers})).do
    assert "forward_prefetch=True," in do and "fully_shard" not in do
