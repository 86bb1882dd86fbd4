"""Where the step's time goes: exposed shares, phase shares, hidden shares, the step itself."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from diagnose.analysis.measure.breakdown import Breakdown
from diagnose.analysis.measure.categories import EXPOSED, HOST_EXPOSED, LAUNCH_EXPOSED, PHASES
from diagnose.analysis.measure.ranks import RankSet
from diagnose.analysis.symptoms.registry import Known, declare, symptom
from diagnose.record import RunRecord


def _words(key: str) -> str:
    return key.replace("_", " ")


def _share(view: str, key: str) -> Callable[[Breakdown], float]:
    """The breakdown's share of one category of one view (exposed, phase or hidden)."""

    def share(steps: Breakdown) -> float:
        value: float = getattr(steps, view)[key]
        return value

    return share


EXPOSED_SHARES = tuple(
    declare(f"exposed.{cat}", "share", f"share of step time exposed as {_words(cat)}", _share("exposed_share", cat))
    for cat in EXPOSED
)
PHASE_SHARES = tuple(
    declare(
        f"phase.{phase}",
        "share",
        f"share of step time the main thread spends in {_words(phase)}",
        _share("phase_share", phase),
    )
    for phase in PHASES
)
HIDDEN_SHARES = tuple(
    declare(
        f"hidden.{phase}",
        "share",
        f"share of step time in {_words(phase)} hidden behind GPU work",
        _share("hidden_share", phase),
    )
    for phase in PHASES
)


@symptom(
    "exposed.communication_own",
    "share",
    "exposed communication that is the collectives' own cost: in a distributed run, the least any rank sees (the others also wait for the slowest)",
)
def communication_own(steps: Breakdown | None = None, ranks: RankSet | None = None) -> float | None:
    # The rank that reaches the all-reduce last waits only for the reduction itself; the others
    # also wait for it. So the least exposed communication of any rank is what the network costs.
    if ranks is not None:
        shares = [s.exposed_communication_share for s in ranks.summaries if s.exposed_communication_share is not None]
        if shares and len(shares) == len(ranks.summaries):
            return min(shares)
    return steps.exposed_share["communication"] if steps is not None else None


@symptom(
    "exposed.launch",
    "share",
    "GPU idle while the host runs forward/backward/optimizer code (launch and Python overhead)",
)
def launch(gpu: Breakdown) -> float:
    return sum(gpu.exposed_share[c] for c in LAUNCH_EXPOSED)


@symptom(
    "exposed.launch_model",
    "share",
    "GPU idle while the host runs forward and backward code (launch and Python overhead)",
)
def launch_model(gpu: Breakdown) -> float:
    return gpu.exposed_share["host_forward"] + gpu.exposed_share["host_backward"]


@symptom(
    "exposed.other_not_sync",
    "share",
    "share of the step in which the host runs other code and nothing else runs beside it, not counting the idle that "
    "follows syncs, nor evaluation passes (their forward starts no backward: the trace calls it other host work)",
    uses=("sync.idle_after_share", "step.eval_share"),
)
def other_not_sync(steps: Breakdown, known: Known) -> float:
    evaluation = known.get("step.eval_share") or 0.0
    if not steps.has_gpu:  # every instant is host time; there are no syncs to set apart
        return max(0.0, steps.exposed_share["host_other"] - evaluation)
    return max(0.0, steps.exposed_share["host_other"] - (known.get("sync.idle_after_share") or 0.0) - evaluation)


@symptom("exposed.host", "share", "GPU idle for any host reason (sum of the host-side exposed shares)")
def host(gpu: Breakdown) -> float:
    return sum(gpu.exposed_share[c] for c in HOST_EXPOSED)


@symptom("step.time_ms", "ms", "mean step time (steady state where measured, else the profiled steps' median)")
def step_time_ms(steps: Breakdown | None = None, record: RunRecord | None = None) -> float | None:
    steady = record.steady_mean_s() if record is not None else None
    if steady:
        return steady * 1000
    if steps is not None:
        return statistics.median(s.duration_us for s in steps.steps) / 1000
    return None


@symptom(
    "step.steady_mean_ms", "ms", "mean step time of the steady steps, timed with the profiler off (none: not measured)"
)
def steady_mean_ms(record: RunRecord) -> float | None:
    steady = record.steady_mean_s()
    return steady * 1000 if steady else None


@symptom(
    "step.median_ms",
    "ms",
    "median step time (steady state where measured, else profiled): a typical training step, where step.time_ms, the "
    "mean, also holds what a step paid for an evaluation or an epoch's end",
)
def step_median_ms(steps: Breakdown | None = None, record: RunRecord | None = None) -> float | None:
    steady = record.steady_durations() if record is not None else []
    if steady:
        return statistics.median(steady) * 1000
    if record is not None and record.timed_seconds and record.timed_steps:
        return None  # timed steps known by their sum alone: the profiled ones are another basis
    if steps is not None and steps.steps:
        return statistics.median(s.duration_us for s in steps.steps) / 1000
    return None


@symptom("step.profiled", "count", "profiled steps analysed")
def profiled(steps: Breakdown) -> int:
    return len(steps.steps)


@symptom(
    "exposed.host_code",
    "share",
    "GPU idle while the host runs code (model, optimizer, other), not counting waits for data, copies or syncs",
    uses=("exposed.launch", "exposed.other_not_sync"),
)
def host_code(known: Known) -> float | None:
    launch, other = known.get("exposed.launch"), known.get("exposed.other_not_sync")
    return launch + other if launch is not None and other is not None else None
