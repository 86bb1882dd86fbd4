"""What only the ranks together show: the straggler, unequal data, and the process group's backend."""

from __future__ import annotations

from diagnose.analysis.ranks import RankSet
from diagnose.analysis.symptoms.registry import symptom
from diagnose.record import RunRecord


@symptom("dist.world_size", "count", "ranks in the run")
def world_size(ranks: RankSet) -> int:
    return len(ranks.summaries)


def _straggler(ranks: RankSet, key: str) -> float | None:
    return ranks.straggler[key] if ranks.straggler is not None else None


@symptom("dist.straggler_rank", "count", "the rank whose exposed data wait stands out")
def straggler_rank(ranks: RankSet) -> float | None:
    return _straggler(ranks, "rank")


@symptom("dist.straggler_data_share", "share", "the straggler's exposed data wait over the other ranks' median, as a share of the step")
def straggler_data_share(ranks: RankSet) -> float | None:
    return _straggler(ranks, "excess_share")


@symptom("dist.straggler_data_ms", "ms", "the straggler's exposed data wait per step")
def straggler_data_ms(ranks: RankSet) -> float | None:
    return _straggler(ranks, "data_wait_ms")


@symptom("dist.others_data_ms", "ms", "the other ranks' exposed data wait per step (median)")
def others_data_ms(ranks: RankSet) -> float | None:
    return _straggler(ranks, "others_data_wait_ms")


@symptom("dist.samples_imbalance", "", "samples per step of the busiest rank over the lightest")
def samples_imbalance(ranks: RankSet) -> float | None:
    samples = [s.samples_per_step for s in ranks.summaries if s.samples_per_step]
    if not samples or len(samples) != len(ranks.summaries):
        return None
    return max(samples) / min(samples)


@symptom("dist.gloo_with_gpus", "bool", "the process group uses gloo although GPUs (and NCCL) are there")
def gloo_with_gpus(record: RunRecord) -> bool | None:
    group = record.distributed
    return group.get("backend") == "gloo" and bool(group.get("cuda_available")) if group else None
