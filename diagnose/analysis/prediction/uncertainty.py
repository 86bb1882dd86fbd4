"""How sure a prediction, the floor a change must beat, and the ranking are: a block bootstrap
over the profiled steps, with a fixed seed (a report is reproducible from its trace).

Contract (pure; numpy, imported where it is used):

* ``resample_indices(n, resamples, block, seed) -> array (resamples, n)``: circular block
  bootstrap of ``n`` steps, each row one resample's step indices;
* ``block_length(values) -> int``: 1 where consecutive steps do not correlate, else blocks of
  about the cube root of the steps (a host that runs ahead times a short step, then a long one);
* ``mean_uncertainty(durations) -> float``: the relative half-width of the mean step's
  ``INTERVAL`` interval over resamples of the steps: what the mean of this run's steps says
  about the mean step, NOT the spread of single steps;
* ``record.mean_uncertainty_estimate(durations) -> float``: its normal approximation, what the
  capture computes at each step boundary to grow the window while the mean is unsettled (kept
  with the window plan, in the run record: the runtime reads it, and never the analysis);
* ``change_floor(mean_uncertainty) -> float``: the relative gain a change must beat: the mean's
  uncertainty and the run-to-run term together, at least ``MIN_GAIN``;
* ``run_to_run(host_share) -> float``: what a rerun of the script moves its steady step by, from
  the share of the step the GPU idles (a GPU-paced step barely moves, a host-paced one does);
  what a prediction's or a measurement's interval says the next run reads (never the floor);
* ``StepSample`` (each profiled step's duration and its exposed time per category) and
  ``resampled_speedups(sample, speedup, categories=..., error=model_error(name), ...)``: one
  finding's predicted speedup on each resample of the steps, times a draw of what the model
  cannot see for its transformation (``MODEL_ERROR``; below the prediction
  ``WEAK_DOWNSIDE_ERROR`` where it knows it predicts a compile badly on the run) and of the
  run-to-run term;
  ``measured_draws`` the same for a measured speedup; ``interval(values)`` their 5th-95th
  percentiles;
* ``ranking_shares(values, tiers) -> list[float]``: how often each finding is first when every
  resample is ranked on its own values (tiers first: measured, then predicted, then bound only).

The resampling is of per-step quantities, not of whole replays: a prediction's saving is shared
out over the steps in proportion to each step's exposed time in the categories its
transformation changes (``TARGET_CATEGORIES``; in proportion to the step's length where none
is named; at most ``MAX_REMOVED`` of that time, every step then scaled so that together they
keep what the replay said), and each resample's speedup is its steps' time over their time
after the change. One replay per resample would cost 0.1-0.3 s each on a large window (predict.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

# the z of INTERVAL, and the capture's estimate of the mean step's uncertainty (which uses it), live
# with the window plan that grows on it: the run record sits below the analysis
from diagnose.analysis.measure.categories import HOST_EXPOSED
from diagnose.record import Z_INTERVAL

if TYPE_CHECKING:
    import numpy  # for the annotations inside functions, where np is numpy imported there
    import numpy as np

#: A fix that cannot make the step at least this much faster is not worth a user's time.
MIN_GAIN = 1.03
#: How much the steady step of the same script moves from one run to the next, beyond what one
#: run's own steps show: the median coefficient of variation of the steady step over 22 planted
#: and framework examples, 5 runs each, on an H200 (benchmarks/flip_rate.py, 2026-11-23; GPU-bound
#: loops under 1%, host-bound ones 4-20%).
RUN_TO_RUN_SPREAD = 0.04
#: What a rerun reads, as opposed to whether the mean moved (the floor above): the coefficient of
#: variation of the steady step from one run of a script to the next, where the GPU sets the pace
#: of every step (the examples' GPU-bound loops: under 1%) and where the host does (GPU idle the
#: whole step). The second is fitted on the outside corpus's calibration half (benchmarks/zoo/
#: calibrate.py: each script's diagnose runs, against their host share; docs/zoo.md),
#: where host-bound scripts moved 4-20% between runs on one machine, and the examples' 4% left
#: the intervals of their fixes too narrow. ``run_to_run`` interpolates between the two by the
#: share of the step the GPU idles.
RUN_TO_RUN_GPU = 0.01
#: calibrate.py on the calibration half, 2026-11-28 (docs/zoo.md "The seventh GPU run"): four
#: scripts of three runs each on H200s (pe-mnist 15%, pe-vae 20%, pe-dcgan 20%, xtransformers-copy
#: 10%; host shares 78-97%)
RUN_TO_RUN_HOST = 0.182
#: Resamples of the steps; 400 keep a 90% interval's ends within about a percent of where more
#: would put them, and cost a millisecond on 30 steps.
RESAMPLES = 400
#: The bootstrap's seed: fixed, so that the same trace gives the same report.
SEED = 32
#: The interval every figure here carries: its 5th to 95th percentile over the resamples.
INTERVAL = 0.90
#: Steps whose lag-1 autocorrelation is at least this (either sign) are resampled in blocks.
BLOCK_CORRELATION = 0.3
#: The most of a step's time in the changed categories that one step's share of a saving removes
#: (the rest of the saving is shared by every step's length): no resample of steps makes a step
#: vanish.
MAX_REMOVED = 0.9

#: What the replay model cannot see for each transformation: the relative error |predicted -
#: measured| / measured taken as the edge of the ``INTERVAL`` interval, the largest seen for that
#: transformation on the project's own examples under verify (docs/truth.md, "A host that runs
#: ahead": fifteen rows on an H100, 2026-11-25; more_workers and larger_batch also the other two
#: calls of that day). Never fitted on the outside corpus (benchmarks/zoo/), whose evaluation half
#: is where the accuracy is reported.
MODEL_ERROR: dict[str, float] = {
    # lightning 3%, fabric 17%, fp32_transformer 6%, closure_optimizer 18%, accelerate 3%
    "autocast_bf16": 0.18,
    # elementwise_chain (FUSE001) 16%, well_tuned (NEXT001) 0%
    "compile": 0.16,
    # launch_bound (LAUNCH001) 28%
    "cuda_graphs": 0.28,
    # compiled_launch_bound (LAUNCH002) 30%
    "graphs_of_compiled": 0.30,
    # data_bound 1%, 5%, 19%; hf_trainer_workers 29%, 3%, 5%
    "more_workers": 0.29,
    # item_syncs (SYNC001) 17%
    "remove_syncs": 0.17,
    # tiny_batch (MEM004) 10%, 19%
    "larger_batch": 0.19,
}
#: The least model error of any transformation: one or two measurements within a few percent
#: (pinned_copies 3%, fused_optimizer 0%) say little about the next script.
MODEL_ERROR_MIN = 0.05
#: A transformation never measured against verify (tf32): the accuracy goal's 90th percentile
#: (issue 32: |predicted - measured| / measured at most 35% in nine scripts of ten).
MODEL_ERROR_UNMEASURED = 0.35

#: The exposed categories (analysis/measure/categories.py) whose time each transformation changes: its
#: saving is shared out over the steps by them. Not named: by the steps' length.
TARGET_CATEGORIES: dict[str, tuple[str, ...]] = {
    "more_workers": ("data_wait",),
    "pinned_copies": ("h2d_copy",),
    "remove_syncs": ("sync",),
    "fused_optimizer": ("host_optimizer", "gpu_optimizer"),
    "autocast_bf16": ("gpu_forward", "gpu_backward"),
    "tf32": ("gpu_forward", "gpu_backward"),
    "compile": ("host_forward", "host_backward", "gpu_forward", "gpu_backward"),
    "cuda_graphs": ("host_forward", "host_backward", "host_optimizer"),
    "graphs_of_compiled": ("host_forward", "host_backward", "host_optimizer"),
}


#: The downside of a compile the model knows it predicts badly on the run (``predict.weakness``:
#: through graph breaks or cuDNN's recurrent layers): the largest relative error of such
#: predictions on the outside corpus's calibration half (benchmarks/zoo/, docs/zoo.md), the one
#: half the models may be fitted on. pytorch/examples' LSTM word language model: torch.compile
#: predicted 2.98x and 3.31x, measured 0.89x (272%); its Transformer, reduce-overhead through one
#: graph break a step: 2.38x predicted, 0.88x measured (170%). Both missed downwards: what the
#: model does not see there (graphs lost, pieces recompiled, eager code between them) only costs,
#: so the interval widens below the prediction alone, down to "it may make the step slower", and
#: the in-run check or verify has to measure it. The other weaknesses have no calibration-half
#: measurement yet (a precision change where the host ran ahead missed on the evaluation half,
#: which nothing may be fitted on): their intervals keep the transformation's own error.
WEAK_DOWNSIDE_ERROR: dict[str, float] = {"compile": 2.72, "cuda_graphs": 2.72, "graphs_of_compiled": 2.72}


#: One side of a transformation's interval where the outside corpus's calibration half missed it
#: further than the examples' ``MODEL_ERROR`` (benchmarks/zoo/calibrate.py: each side's
#: split-conformal edge, at 95% one-sided, of what the rows' misses leave after the run-to-run
#: term; docs/zoo.md "The seventh GPU run"). More workers, eleven rows on H200s, 2026-11-28:
#: measured above the prediction by up to 155% after the run-to-run term (pytorch/examples'
#: DCGAN, 2.98x predicted, 8.20x measured, verify's baseline spread 83%), below it by up to 31%
#: (facebookresearch/dlrm, 7.51x and 4.56x), just past the examples' 29%.
CALIBRATED_UPSIDE: dict[str, float] = {"more_workers": 1.55}
CALIBRATED_DOWNSIDE: dict[str, float] = {"more_workers": 0.31}


def model_error(transformation: str) -> float:
    """The relative error of a transformation's prediction at the interval's edge."""
    if transformation not in MODEL_ERROR and transformation not in ("pinned_copies", "fused_optimizer"):
        return MODEL_ERROR_UNMEASURED
    return max(MODEL_ERROR.get(transformation, 0.0), MODEL_ERROR_MIN)


def within_model_error(transformation: str, other: float, speedup: float) -> bool:
    """A second figure for the same change lies within the prediction's own error (``model_error``
    either way, in log space): the two do not disagree."""
    return abs(math.log(other / speedup)) <= math.log1p(model_error(transformation))


def upside_error(transformation: str, reach: float | None = None, speedup: float | None = None) -> float | None:
    """The relative error at the interval's upper edge where it is larger than ``model_error``:
    the calibration half's (``CALIBRATED_UPSIDE``), or up to where another measure of the run
    reaches above the prediction (``Prediction.reach``); None: neither passes it."""
    errors = [CALIBRATED_UPSIDE.get(transformation, 0.0)]
    if reach and speedup and reach > speedup:
        errors.append(reach / speedup - 1)
    return max(errors) if max(errors) > model_error(transformation) else None


def downside_error(
    transformation: str, weak: bool, floor: float | None = None, speedup: float | None = None
) -> float | None:
    """The relative error at the interval's lower edge where it is larger than ``model_error``
    (the calibration half's, ``CALIBRATED_DOWNSIDE``; a weak compile: ``WEAK_DOWNSIDE_ERROR``; a
    weakness that names the least it allows, or a sampled input's counting error, ``floor``: down
    to it from ``speedup``); None: the lower edge is the transformation's own."""
    errors = [CALIBRATED_DOWNSIDE[transformation]] if transformation in CALIBRATED_DOWNSIDE else []
    if weak and transformation in WEAK_DOWNSIDE_ERROR:
        errors.append(WEAK_DOWNSIDE_ERROR[transformation])
    if floor and speedup and speedup > floor:
        errors.append(speedup / floor - 1)
    if not errors or max(errors) <= model_error(transformation):
        return None
    return max(errors)


def _np() -> Any:
    import numpy

    return numpy


def block_length(values: Sequence[float]) -> int:
    """1 where consecutive steps are uncorrelated (|lag-1 autocorrelation| under
    ``BLOCK_CORRELATION``), else about the cube root of the steps (at least 2)."""
    n = len(values)
    if n < 4:
        return 1
    np = _np()
    x = np.asarray(values, dtype=float) - float(np.mean(values))
    denom = float(np.dot(x, x))
    if denom <= 0:
        return 1
    r1 = float(np.dot(x[:-1], x[1:])) / denom
    return 1 if abs(r1) < BLOCK_CORRELATION else max(2, round(n ** (1 / 3)))


def resample_indices(n: int, resamples: int = RESAMPLES, block: int = 1, seed: int = SEED) -> np.ndarray:
    """Circular block bootstrap: each row draws ``ceil(n / block)`` blocks of ``block``
    consecutive steps (wrapping at the end), cut to ``n``."""
    np = _np()
    rng = np.random.default_rng(seed)
    block = max(1, min(block, n))
    blocks = -(-n // block)
    starts = rng.integers(0, n, size=(resamples, blocks))
    rows = (starts[:, :, None] + np.arange(block)[None, None, :]) % n
    indices: numpy.ndarray = rows.reshape(resamples, blocks * block)[:, :n]
    return indices


def _quantiles(values: np.ndarray, axis: int = -1) -> tuple[Any, Any]:
    np = _np()
    tail = (1 - INTERVAL) / 2
    return np.quantile(values, tail, axis=axis), np.quantile(values, 1 - tail, axis=axis)


def mean_uncertainty(durations: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED) -> float:
    """The relative half-width of the mean step's ``INTERVAL`` interval over block resamples of
    ``durations`` (0 for fewer than two steps)."""
    n = len(durations)
    if n < 2:
        return 0.0
    np = _np()
    d = np.asarray(durations, dtype=float)
    mean = float(d.mean())
    if mean <= 0:
        return 0.0
    means = d[resample_indices(n, resamples, block_length(durations), seed)].mean(axis=1)
    low, high = _quantiles(means)
    return float(high - low) / 2 / mean


def change_floor(mean_uncertainty: float) -> float:
    """The relative gain a change must beat: the mean step's uncertainty and the run-to-run
    term (independent, so in quadrature), at least ``MIN_GAIN``."""
    return max(MIN_GAIN - 1, math.hypot(mean_uncertainty, RUN_TO_RUN_SPREAD))


def run_to_run(host_share: float | None, host: float = RUN_TO_RUN_HOST) -> float:
    """The run-to-run coefficient of variation of the steady step where the GPU idles
    ``host_share`` of it (``RUN_TO_RUN_GPU`` at 0, ``host`` at 1, linear between; calibrate.py
    tries other values of ``host``); ``RUN_TO_RUN_SPREAD`` where the share is unknown."""
    if host_share is None or math.isnan(host_share):
        return RUN_TO_RUN_SPREAD
    share = min(max(host_share, 0.0), 1.0)
    return RUN_TO_RUN_GPU + (host - RUN_TO_RUN_GPU) * share


@dataclass(frozen=True)
class StepSample:
    """The profiled steps as the bootstrap resamples them: each step's duration and its exposed
    time per category (µs), and the resamples' step indices (fixed seed, blocks where the steps
    correlate)."""

    durations_us: tuple[float, ...]
    exposed_us: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    resamples: int = RESAMPLES
    seed: int = SEED

    @property
    def steps(self) -> int:
        return len(self.durations_us)

    @property
    def block(self) -> int:
        return block_length(self.durations_us)

    def indices(self) -> np.ndarray:
        return resample_indices(self.steps, self.resamples, self.block, self.seed)

    @cached_property
    def host_share(self) -> float | None:
        """The share of the steps' time the GPU idles (the host-side exposed categories); None
        without steps or their exposed times. Summed once: every finding's draws read it."""
        total = sum(self.durations_us)
        if total <= 0 or not self.exposed_us:
            return None
        host = sum(sum(self.exposed_us.get(name, ())) for name in HOST_EXPOSED)
        return min(host / total, 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "resamples": self.resamples,
            "seed": self.seed,
            "block": self.block,
            "interval": INTERVAL,
            "host_share": None if self.host_share is None else round(self.host_share, 4),
        }


def resampled_speedups(
    sample: StepSample,
    speedup: float,
    batch_factor: float = 1.0,
    categories: Sequence[str] = (),
    error: float = 0.0,
    stream: int = 0,
    indices: np.ndarray | None = None,
    downside: float | None = None,
    upside: float | None = None,
) -> np.ndarray:
    """One prediction on each resample of the steps (see the module's docstring), times a
    lognormal draw of the model's error (``error`` at the interval's edge) and of the run-to-run
    term (a measurement compares two runs: ``run_to_run`` of the steps' host share times the
    square root of 2).
    ``downside`` and ``upside``: the model's error at the lower or the upper edge where it is
    larger (the draws below or above the prediction use it: a split lognormal, its median the
    prediction). ``stream`` picks the finding's own draws (the same finding draws the same
    numbers)."""
    np = _np()
    d = np.asarray(sample.durations_us, dtype=float)
    total = float(d.sum())
    if sample.steps == 0 or total <= 0 or speedup <= 0:
        values = np.full(sample.resamples if indices is None else indices.shape[0], float(speedup))
    else:
        idx = sample.indices() if indices is None else indices
        saved = total - total * batch_factor / speedup  # time the change removes from the window
        c = np.zeros_like(d)
        for name in categories:
            exposed = sample.exposed_us.get(name)
            if exposed is not None and len(exposed) == len(d):
                c += np.minimum(np.asarray(exposed, dtype=float), d)
        if float(c.sum()) <= 0:
            c = d
        # each step keeps its time less a share of its category's: at most ``MAX_REMOVED`` of it
        # (a host-ahead window's drained first steps hold little GPU time, the next ones all),
        # then every step is scaled so that the window's steps together keep what the replay said
        k = min(max(saved, 0.0) / float(c.sum()), MAX_REMOVED) if saved > 0 else saved / float(c.sum())
        kept = d - k * c
        kept *= (total - saved) / float(kept.sum())
        values = d[idx].sum(axis=1) / kept[idx].sum(axis=1) * batch_factor
    rerun = math.sqrt(2) * run_to_run(sample.host_share)
    sigma = math.hypot(math.log1p(error) / Z_INTERVAL, rerun)
    z = np.random.default_rng([sample.seed, stream]).normal(0.0, 1.0, len(values))
    low, high = (math.hypot(math.log1p(e) / Z_INTERVAL, rerun) if e is not None else sigma for e in (downside, upside))
    draws: numpy.ndarray = values * np.exp(np.where(z < 0, z * low, z * high))
    return draws


def measured_draws(
    speedup: float,
    spread: float,
    resamples: int = RESAMPLES,
    stream: int = 0,
    seed: int = SEED,
    rerun: float = 0.0,
) -> np.ndarray:
    """A measured speedup on each resample: lognormal, its relative ``spread`` (the A/B's
    baseline spread, half a range) taken as the interval's edge, and ``rerun`` (the run-to-run
    coefficient of variation, ``run_to_run``) for each of the two runs it compared."""
    np = _np()
    sigma = math.hypot(math.log1p(max(spread, 0.0)) / Z_INTERVAL, math.sqrt(2) * rerun)
    draws: numpy.ndarray = speedup * np.exp(np.random.default_rng([seed, stream]).normal(0.0, sigma, resamples))
    return draws


def interval(values: np.ndarray) -> tuple[float, float]:
    """The ``INTERVAL`` interval of resampled values."""
    low, high = _quantiles(values)
    return float(low), float(high)


def ranking_shares(values: Sequence[np.ndarray], tiers: Sequence[int]) -> list[float]:
    """For each finding, the share of resamples in which it ranks first: a lower tier first
    (measured, predicted, bound only), then the higher value. ``values[i]`` holds finding i's
    value on every resample (the same resamples for all)."""
    if not values:
        return []
    np = _np()
    v = np.vstack([np.asarray(x, dtype=float) for x in values])
    best_tier = min(tiers)
    v = np.where(np.asarray(tiers)[:, None] == best_tier, v, -np.inf)
    first = np.argmax(v, axis=0)
    return [float(np.mean(first == i)) for i in range(len(values))]
