"""What the runner saw, as a plain value saved to ``run.json`` (stage 1's output).

Everything here is JSON-ready data: the analysis (``diagnose analyze RUN_DIR``) reads it back
without torch and without running the script again.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

RUN_SCHEMA = "diagnose.run/1"

#: the training frameworks diagnose recognises, from the one that owns the loop most completely
#: (Lightning, the HF Trainer: both may build an ``Accelerator`` or their own loop) to the least
FRAMEWORKS = ("lightning", "hf_trainer", "fabric", "accelerate")

#: the knobs that are ``DataLoader`` keywords (``--set num_workers=8``): the runtime sets them in
#: ``DataLoader.__init__`` (each loader's ``knobs_applied``), and the analysis offers them only
#: where a DataLoader fed the profiled steps (``RunRecord.fed_by_dataloader``); here, where both read it
DATALOADER_KNOBS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size")

#: How a run ended. "stopped" means diagnose stopped the script on purpose after measuring;
#: "not_run" that the script could not be started (missing, not Python, module not found);
#: "crashed" that its process ended without diagnose seeing how (a segfault, SIGKILL, an exec, a
#: C library's exit): the supervising ``diagnose run`` wrote what was saved until then.
STATUSES = (
    "completed",
    "stopped",
    "exited",
    "failed",
    "interrupted",
    "terminated",
    "oom",
    "no_steps",
    "not_run",
    "crashed",
)


#: steps vary widely when the p90 step is over this many times the median step: the profiled
#: window grows while they do, and the report calls such a window (or steady state) noisy
NOISY_P90_OVER_MEDIAN = 1.5
#: the window also grows while the mean of its steps is uncertain by more than this (relative
#: half-width of its 90% interval, ``mean_uncertainty_estimate``): the floor a change
#: must beat and every prediction's interval rest on the mean step, and the ranking of findings
#: with them (issue 32: the top finding changed between identical runs). A proxy for "the top
#: of the ranking is not settled" that costs microseconds per step; the report's own
#: ``ranking.first_share`` is the full measure, from the trace.
WINDOW_MEAN_UNCERTAINTY = 0.10
#: the window grows only while it has lasted under this many seconds (a slow model's steps)
GROWTH_BUDGET_S = 120.0
#: ``diagnose run`` lets the window grow to this many times ``--steps`` (``--max-steps``)
GROWTH_FACTOR = 3


#: script options (their ``dest``, lower case) that set how long a script trains: in optimizer
#: steps, or in epochs (passes over its DataLoader)
LENGTH_OPTIONS: dict[str, str] = {
    **dict.fromkeys(
        (
            "max_iters",
            "max_iter",
            "max_iterations",
            "max_steps",
            "iters",
            "iterations",
            "num_iters",
            "num_iterations",
            "steps",
            "num_steps",
            "n_steps",
            "train_steps",
            "total_steps",
            "training_steps",
            "max_train_steps",
            "num_train_steps",
            "train_iters",
        ),
        "steps",
    ),
    **dict.fromkeys(
        ("epochs", "num_epochs", "n_epochs", "max_epochs", "num_train_epochs", "train_epochs", "nepochs"), "epochs"
    ),
}


#: option destinations (lower case) that name the training batch; any ending in ``batch_size``
#: does too (``train_batch_size``, ``per_device_train_batch_size``) unless it names another
#: split's (``EVAL_PREFIXES``)
BATCH_DESTS = ("batch_size", "batchsize", "bs", "batch", "bsz", "train_bs")
EVAL_PREFIXES = ("eval", "test", "val", "valid", "predict", "infer")


def option_words(option: dict[str, Any], value: object) -> str:
    """A script option set to ``value`` as the script writes it: ``--max_iters 36``, or
    ``--max_iters=36`` for one read from ``--key=value`` arguments (``joined``)."""
    return f"{option['flag']}={value}" if option.get("joined") else f"{option['flag']} {value}"


def training_key(dest: str) -> str | None:
    """An option's destination in lower case with ``_`` for ``-``; None where it names another
    split's setting (``EVAL_PREFIXES``: ``eval_batch_size``, ``test_bs``)."""
    key = dest.lower().replace("-", "_")
    return None if key.startswith(EVAL_PREFIXES) else key


def is_batch_dest(dest: str) -> bool:
    """Whether an option's destination names the training batch (``batch_size``, ``bs``,
    ``train_batch_size``), not an evaluation one (``eval_batch_size``, ``test_bs``)."""
    key = training_key(dest)
    return key is not None and (key in BATCH_DESTS or key.endswith("batch_size"))


def step_samples(option: dict[str, Any]) -> int:
    """The samples an optimizer step holds by the script's batch option (``RunRecord.batch_option``):
    its value times its accumulation."""
    return int(option["value"]) * int(option.get("accumulation", 1))


def is_accumulation_dest(dest: str) -> bool:
    """Whether an option's destination sets the micro-batches an optimizer step accumulates
    (``gradient_accumulation_steps``, ``accumulation_steps``, ``grad_accum``)."""
    key = training_key(dest)
    return key is not None and "accum" in key


@dataclass(frozen=True)
class RunLength:
    """How many steps the script will make, as far as its settings say, and which say it."""

    steps: int
    #: "--max_iters 40", "--epochs 2 x 20 batches", "TrainingArguments(max_steps=40)"
    source: str


def run_length(
    options: list[dict[str, Any]], loader_batches: int | None, frameworks: list[FrameworkInfo]
) -> RunLength | None:
    """The steps the script's own settings promise. A framework that runs the loop (the HF
    Trainer, Lightning) is asked first: its ``max_steps``, else its epochs times the DataLoader's
    batches (a script's ``--steps`` it never passed on says nothing). Else a step-count option
    (``--max_iters 40``), else epochs times the DataLoader's batches; None when nothing says.
    Gradient accumulation is not divided out: an estimate on the long side only lets the window
    keep more of its plan."""
    for f in frameworks:
        steps = f.settings.get("max_steps")
        if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
            return RunLength(steps, f"{f.cls}(max_steps={steps})")
        epochs = f.settings.get("num_train_epochs", f.settings.get("max_epochs"))
        if loader_batches and isinstance(epochs, (int, float)) and not isinstance(epochs, bool) and epochs > 0:
            name = "num_train_epochs" if "num_train_epochs" in f.settings else "max_epochs"
            return RunLength(
                max(1, round(epochs * loader_batches)), f"{f.cls}({name}={epochs:g}) x {loader_batches} batches"
            )
    for option in options:
        if option.get("kind") == "steps" and isinstance(option.get("value"), int) and option["value"] > 0:
            return RunLength(option["value"], option_words(option, option["value"]))
    if loader_batches:
        for option in options:
            epochs = option.get("value")
            if option.get("kind") == "epochs" and isinstance(epochs, (int, float)) and epochs > 0:
                return RunLength(
                    max(1, round(epochs * loader_batches)),
                    f"{option_words(option, f'{epochs:g}')} x {loader_batches} batches",
                )
    return None


def even_out_epoch_turns(samples: list[int], batches: list[tuple[int, int]]) -> list[int]:
    """Samples per step with an epoch's turn evened out. A loader wrapped in a one-ahead
    prefetch (accelerate's ``DataLoaderShard``, under the HF Trainer and ``Accelerator``) draws
    each batch a step early: at an epoch's end one step draws nothing (the data ran out) and
    the next draws two batches, the new epoch's first two. The first of them is the empty
    step's: without it the step reads 0 samples and no samples/s can be said. ``batches``: per
    step, the batches drawn and the first one's samples."""
    out = list(samples)
    for i in range(min(len(out), len(batches)) - 1):
        (drawn, _), (drawn_next, first_next) = batches[i], batches[i + 1]
        if out[i] == 0 and drawn == 0 and drawn_next >= 2 and 0 < first_next < out[i + 1]:
            out[i], out[i + 1] = first_next, out[i + 1] - first_next
    return out


def steps_vary_widely(durations: list[float]) -> bool:
    """Whether the p90 of these step times (linear interpolation, numpy's default) is over
    ``NOISY_P90_OVER_MEDIAN`` times their median; never for fewer than two steps."""
    if len(durations) < 2:
        return False
    median = statistics.median(durations)
    p90 = statistics.quantiles(durations, n=10, method="inclusive")[8]
    return median > 0 and p90 > NOISY_P90_OVER_MEDIAN * median


#: The z of a two-sided 90% interval of a normal (``uncertainty.INTERVAL``, analysis/prediction/):
#: a mean's half-width is this many standard errors; a model error given as the relative error at
#: the interval's edge is a spread of ``log(1 + error) / Z_INTERVAL`` in log speed.
Z_INTERVAL = 1.645


def mean_uncertainty_estimate(durations: Sequence[float]) -> float:
    """The capture's cheap proxy of ``uncertainty.mean_uncertainty`` (analysis/prediction/; pure
    Python, a few microseconds, run at each step boundary of a growing window): the normal
    approximation of the mean's 90% half-width, ``Z_INTERVAL`` standard errors over the mean (0
    for fewer than three steps)."""
    n = len(durations)
    if n < 3:
        return 0.0
    mean = sum(durations) / n
    if mean <= 0:
        return 0.0
    var = sum((d - mean) ** 2 for d in durations) / (n - 1)
    return Z_INTERVAL * math.sqrt(var / n) / mean


def window_unsettled(durations: list[float]) -> bool:
    """Whether a growing window profiles one more step: its steps vary widely, or their mean is
    uncertain by more than ``WINDOW_MEAN_UNCERTAINTY``."""
    return steps_vary_widely(durations) or mean_uncertainty_estimate(durations) > WINDOW_MEAN_UNCERTAINTY


@dataclass(frozen=True)
class WindowPlan:
    """Which steps are warm-up, profiled and timed; whether to stop the script afterwards.

    Step k runs from boundary k to boundary k+1::

        0 .. warmup-1              warm-up (the last one is the profiler's own warm-up)
        warmup .. window_end-1     profiled: the trace
        window_end                 absorbs the trace export, not measured
        first_timed .. last_boundary-1   timed with the profiler off

    With ``max_steps`` over ``steps`` the window may grow: while the profiled steps vary widely
    (``steps_vary_widely``) the capture profiles one more step at a time, up to ``max_steps``
    (``grown()`` is the plan one step longer; the later boundaries move with it).
    """

    warmup: int = 5
    steps: int = 10
    timed: int = 20
    stop: bool = True
    #: the most steps the window may grow to (None, or not over ``steps``: a fixed window)
    max_steps: int | None = None

    @property
    def step_bound(self) -> int:
        """The most profiled steps: ``steps`` for a fixed window."""
        return max(self.steps, self.max_steps or 0)

    def grows(self) -> bool:
        return self.step_bound > self.steps

    def grown(self) -> WindowPlan:
        """The same plan with one more profiled step (never past ``step_bound``)."""
        return replace(self, steps=min(self.steps + 1, self.step_bound))

    @property
    def window_end(self) -> int:
        """The boundary that ends the last profiled step (the profiler stops there)."""
        return self.warmup + self.steps

    @property
    def first_timed(self) -> int:
        # one step between the window and the timing absorbs the trace export
        return self.window_end + 1

    @property
    def last_boundary(self) -> int:
        """The boundary that ends the last timed step: the script is stopped there."""
        return self.first_timed + self.timed

    def in_window(self, step: int) -> bool:
        return self.warmup <= step < self.window_end

    def profiled(self, completed_steps: int) -> int:
        """How many profiled steps completed when ``completed_steps`` steps did."""
        return max(0, min(completed_steps, self.window_end) - self.warmup)

    def timed_slice(self) -> slice:
        """The timed steps, as a slice of per-step lists."""
        return slice(self.first_timed, self.last_boundary)

    def fitted(self, total: int) -> WindowPlan:
        """The plan cut to a script of ``total`` steps: the warm-up first (all but one step at
        most), then the profiled window, then the timed steps after the export step; a window
        that may grow grows only as far as the timed steps still fit. Unchanged when the
        script has the steps the plan needs, or fewer than two."""
        if total < 2:
            return self
        if total >= self.last_boundary:
            bound = min(self.step_bound, total - self.warmup - 1 - self.timed)
            return replace(self, max_steps=bound if bound > self.steps else None)
        warmup = min(self.warmup, total - 1)
        steps = min(self.steps, total - warmup)
        timed = max(0, total - warmup - steps - 1)
        return replace(self, warmup=warmup, steps=steps, timed=timed, max_steps=None)

    def to_argv(self) -> list[str]:
        """The plan as ``diagnose run`` options: what a rank or an experiment is started with."""
        argv = [
            "--warmup",
            str(self.warmup),
            "--steps",
            str(self.steps),
            "--max-steps",
            str(self.step_bound),
            "--timed-steps",
            str(self.timed),
        ]
        return argv if self.stop else [*argv, "--no-stop"]


@dataclass
class DataLoaderInfo:
    loader_id: int
    created_at: str | None
    dataset: str
    dataset_len: int | None
    batch_size: int | None
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    drop_last: bool
    iterators_created: int = 0
    #: seconds from ``iter(loader)`` to its first batch, one value per iterator
    first_batch_wait_s: list[float] = field(default_factory=list)
    #: ``time.perf_counter()`` at each ``iter(loader)`` (the start of each first-batch wait)
    first_batch_at_s: list[float] = field(default_factory=list)
    #: seconds from ``iter(loader)`` until each worker delivered its first batch (the first
    #: ``num_workers`` batches, or as many as the epoch had; the first batch without workers),
    #: one value per iterator
    workers_ready_s: list[float] = field(default_factory=list)
    fetches_in_window: int = 0
    knobs_applied: dict[str, Any] = field(default_factory=dict)
    #: ``len(loader)`` when it was iterated: batches per epoch, also with a batch sampler
    batches_per_epoch: int | None = None

    def batches(self) -> int | None:
        """Batches in one pass over the dataset (None when neither the loader's length nor its
        dataset's length and batch size are known)."""
        if self.batches_per_epoch:
            return self.batches_per_epoch
        if not self.dataset_len or not self.batch_size:
            return None
        full, rest = divmod(self.dataset_len, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)


@dataclass
class OptimizerInfo:
    name: str
    param_tensors: int
    params: int
    implementation: str  # "fused", "foreach" or "for-loop"
    lr: float | None = None
    created_at: str | None = None


@dataclass
class ModelInfo:
    name: str
    params: int
    param_dtype: str
    conv_layers: int
    channels_last: bool
    compiled: bool
    data_parallel: bool
    distributed_data_parallel: bool
    #: how the model is spread over devices and the settings the rules would advise
    #: (``instrument.describe_parallel``): ``kind`` ("DataParallel", "DDP", "FSDP1", "FSDP2")
    #: with its devices, bucket size or prefetch settings; empty for a plain model
    parallel: dict[str, Any] = field(default_factory=dict)


@dataclass
class FrameworkInfo:
    """A training framework object the script built (Lightning ``Trainer`` or ``Fabric``, HF
    ``Trainer`` or ``TrainingArguments``, ``accelerate.Accelerator``): see ``runtime/frameworkwatch.py``."""

    framework: str  # "lightning", "hf_trainer", "fabric" or "accelerate"
    role: str  # "trainer", "arguments", "fabric" or "accelerator"
    cls: str
    version: str | None
    #: the user's line that built it (``file:line``) and its source text
    created_at: str | None
    code: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    #: the user's code the framework runs (Lightning: ``training_step``), and the ``fit`` call
    #: (Fabric: the ``setup`` call that hands it the model)
    sites: dict[str, str] = field(default_factory=dict)
    #: knob -> the framework setting ``diagnose verify`` changed for it
    knobs_applied: dict[str, str] = field(default_factory=dict)


@dataclass
class OpCount:
    """One aten operator's totals over the counted step (``FlopCount.ops``)."""

    calls: int = 0
    #: from torch's own formulas (torch.utils.flop_counter): matmul, convolution, attention only
    flops: int = 0
    #: tensor bytes read and written, views not counted (an estimate of the memory traffic)
    bytes: int = 0
    elements_in: int = 0
    elements_out: int = 0


@dataclass
class MatmulShape:
    """A matmul or convolution shape seen in the counted step: ``m x n x k`` (a convolution:
    ``n`` output channels, ``k`` input channels per group, ``m`` input pixels times the batch):
    the dimensions Tensor Cores want in multiples of 8 or 16."""

    op: str
    m: int
    n: int
    k: int
    dtype: str
    calls: int = 0
    flops: int = 0


@dataclass
class FlopCount:
    """FLOPs of one training step, counted outside the profiled window by a dispatch mode
    (``runtime/flops.py``): the step after the window, whose time is not measured."""

    step: int
    #: wall time of the counted step, counting overhead included (not a performance figure)
    seconds: float
    #: torch.utils.flop_counter's formulas: matmul, convolution and attention FLOPs
    total: int
    by_phase: dict[str, int] = field(default_factory=dict)
    bytes_by_phase: dict[str, int] = field(default_factory=dict)
    ops: dict[str, OpCount] = field(default_factory=dict)
    matmuls: list[MatmulShape] = field(default_factory=list)
    #: samples the counted step drew from its DataLoader, when it drew any
    samples: int | None = None
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FlopCount:
        data = dict(data)
        data["ops"] = {name: OpCount(**o) for name, o in data.get("ops", {}).items()}
        data["matmuls"] = [MatmulShape(**m) for m in data.get("matmuls", [])]
        return cls(**data)


@dataclass
class MemorySplit:
    """What held GPU memory, from the allocator's own figures (``runtime/memory_probe.py``), measured
    over one step (``when="step"``) or at an out-of-memory error (``when="oom"``)."""

    when: str
    parameters_bytes: int = 0
    gradients_bytes: int = 0
    optimizer_state_bytes: int = 0
    #: allocated by tensors when the step began / ended (for ``oom``: at the error)
    allocated_start_bytes: int = 0
    allocated_end_bytes: int = 0
    gradients_start_bytes: int = 0
    #: the allocator's peaks over the step (for ``oom``: since the script started)
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    reserved_bytes: int = 0
    capacity_bytes: int = 0
    #: samples in the step (None when no DataLoader told)
    samples: int | None = None
    #: the first line of the out-of-memory message, when ``when == "oom"``
    message: str | None = None


@dataclass
class RunRecord:
    schema: str = RUN_SCHEMA
    target: dict[str, Any] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    started_at: str = ""
    ended_at: str = ""
    wall_s: float = 0.0
    status: str = "completed"
    exit_code: int = 0
    error: dict[str, Any] | None = None
    #: the plan as it ran: cut to the script's steps where its settings said it has fewer
    plan: dict[str, Any] = field(default_factory=dict)
    #: how the plan was cut (empty: it was not): ``asked`` (the plan as asked), ``steps`` (the
    #: steps the script's settings promised) and ``source`` ("--max_iters 40")
    plan_fit: dict[str, Any] = field(default_factory=dict)
    #: the script's own options that set how long it trains: ``flag`` (as the script spells
    #: it), ``dest``, ``kind`` ("steps" or "epochs") and the ``value`` it parsed
    length_options: list[dict[str, Any]] = field(default_factory=list)
    #: the script's own option that sets its training batch (``flag``, ``dest``, ``value``, and
    #: ``accumulation`` where an option set the micro-batches a step accumulates), where its
    #: parsers (or its ``--key=value`` arguments) had exactly one
    #: (``scriptargs.ScriptArgs.batch_option``); None otherwise
    batch_option: dict[str, Any] | None = None
    #: where ``samples_per_step`` came from when no DataLoader fed the steps: the batch option's
    #: flag ("--batch_size", each step counted at its value); None: the DataLoaders' batches
    samples_from: str | None = None
    step_mode: str | None = None
    #: ``time.perf_counter()`` when the script started (before its first step: imports, set-up)
    script_start_s: float | None = None
    #: ``time.perf_counter()`` when the script's own code ended (None: it did not, or an older run)
    script_end_s: float | None = None
    #: ``time.perf_counter()`` at each step boundary: step k runs from boundary k to k+1
    boundaries_s: list[float] = field(default_factory=list)
    #: seconds the training thread had waited inside DataLoader ``__next__`` at each boundary (a
    #: running sum, aligned with ``boundaries_s``; empty where not recorded): step k waited
    #: ``data_wait_s[k + 1] - data_wait_s[k]``, profiled or not
    data_wait_s: list[float] = field(default_factory=list)
    #: the evaluation passes inside the profiled window (``runtime/evalspans.py``): a module's
    #: ``eval()`` to its ``train()`` with no backward or optimizer step between, as
    #: ``[start, end]`` pairs of ``time.perf_counter()`` (the clock of ``boundaries_s``)
    eval_spans_s: list[list[float]] = field(default_factory=list)
    samples_per_step: list[int] = field(default_factory=list)
    profiled_steps: int = 0
    timed_steps: int = 0
    #: steps after the window left untimed: they drew the batches the DataLoader workers had
    #: queued during the (slower) profiled steps
    timed_skipped: int = 0
    #: how the profiled window grew past the planned steps (empty: it did not try):
    #: ``planned_steps``, ``max_steps``, ``steps`` (the window's final length), ``ended_by``
    #: ("steady", "bound", "budget", "script end") and ``p90_over_median`` of the window as planned
    window_growth: dict[str, Any] = field(default_factory=dict)
    timed_seconds: float | None = None
    timed_samples: int | None = None
    trace_files: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    dataloaders: list[DataLoaderInfo] = field(default_factory=list)
    optimizers: list[OptimizerInfo] = field(default_factory=list)
    models: list[ModelInfo] = field(default_factory=list)
    flags: dict[str, Any] = field(default_factory=dict)
    #: the process group the script made (backend, rank, world size), if any
    distributed: dict[str, Any] = field(default_factory=dict)
    knobs: dict[str, Any] = field(default_factory=dict)
    #: knob -> how it reached the script ("TrainingArguments(bf16=True)", "global torch.autocast")
    knobs_via: dict[str, str] = field(default_factory=dict)
    #: framework objects the script built, in order (empty for a plain PyTorch loop)
    frameworks: list[FrameworkInfo] = field(default_factory=list)
    #: torch.compile as the script used it: calls and modes, graph breaks, recompilations after
    #: the warm-up (diagnose.runtime.compilewatch); empty when nothing was compiled
    compile: dict[str, Any] = field(default_factory=dict)
    sync_sites: list[dict[str, Any]] = field(default_factory=list)
    #: the order in which sync sites fired during the window (``sync_sites[i]["index"]``)
    sync_sequence: list[int] = field(default_factory=list)
    host_samples: dict[str, Any] = field(default_factory=dict)
    worker_samples: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: FLOPs of one step outside the window (None: not counted, e.g. a CPU-only run or no step)
    flops: FlopCount | None = None
    #: GPU memory by owner over the step after the window
    memory_split: MemorySplit | None = None
    #: GPU memory by owner when the script ran out of it (the error's own moment)
    memory_at_oom: MemorySplit | None = None
    #: ``diagnose watch``: the whole run as ``runtime/whole.py`` saw it (steps, spans of
    #: evaluation, checkpoints, compilation and data start-up, memory samples, extra windows);
    #: empty for ``diagnose run``. Read by ``analysis/measure/wholerun.py``
    whole: dict[str, Any] = field(default_factory=dict)

    # --- derived figures ----------------------------------------------------------------------

    def step_durations(self) -> list[float]:
        b = self.boundaries_s
        return [b[i + 1] - b[i] for i in range(len(b) - 1)]

    def startup_seconds(self, warmup: int) -> float | None:
        """From the script's start to the end of its warm-up steps: where compilation happens."""
        if self.script_start_s is None or len(self.boundaries_s) <= warmup:
            return None
        return self.boundaries_s[warmup] - self.script_start_s

    def after_last_step_seconds(self) -> float | None:
        """From the end of the last step to the script's end: its teardown, checkpoint or
        evaluation (None when unknown, or when diagnose stopped the script)."""
        if self.script_end_s is None or not self.boundaries_s or self.status == "stopped":
            return None
        return max(0.0, self.script_end_s - self.boundaries_s[-1])

    def completed_steps(self) -> int:
        return max(0, len(self.boundaries_s) - 1)

    def durations_between(self, first: int, count: int) -> list[float]:
        return self.step_durations()[first : first + count]

    def window_plan(self) -> WindowPlan:
        """The plan as it ran: the planned window grown to the steps it grew to."""
        plan = WindowPlan(**self.plan)
        grown = self.window_growth.get("steps")
        return replace(plan, steps=grown) if isinstance(grown, int) and grown > plan.steps else plan

    def first_timed_step(self) -> int:
        """The first step timed with the profiler off (after the untimed prefetched ones)."""
        return self.window_plan().first_timed + self.timed_skipped if self.plan else 0

    def turn_steps(self) -> set[int]:
        """The steps (``i``: boundary ``i`` to ``i + 1``) in which a DataLoader iterator began: an
        epoch's turn (the new epoch's first batch, fresh workers where they are not persistent)
        or another loader's pass (an evaluation between epochs, its iterator and its batches)."""
        b = self.boundaries_s
        starts = (t for d in self.dataloaders for t in d.first_batch_at_s)
        return {i for i in (bisect.bisect_right(b, t) - 1 for t in starts) if 0 <= i < len(b) - 1}

    def steady_steps(self, every_turn: bool = False) -> list[int]:
        """The timed steps (profiler off) a steady figure is made of: where the training loader's
        epoch is longer than the timed steps (or of unknown length), or ``every_turn``, those at
        an epoch's turn left out (``turn_steps``), where at least half of them and two remain. Such a window holds
        a turn by chance: fifteen timed steps of a 20-batch epoch held the epoch's end and an
        evaluation pass (one 1.9 s step among 17 ms ones: a ResNet-18 at twice its batch measured
        0.46x by the mean, docs/zoo.md) where the same steps at the old batch (40 batches an
        epoch) held none; the turn's cost belongs to the epoch (WHOLE001, WHOLE003), not to the
        training step two runs are compared by. Where epochs are no longer than the timed steps,
        turns recur in the window at their own rate and are part of its steady state (what
        persistent workers save is in them); ``every_turn`` leaves them out there too, for a run
        compared with one of another batch, whose epochs turn at another rate (the turn's cost per
        sample is the same: ``Throughput.turn_free``)."""
        timed = self._timed_steps()
        epoch = self.epoch_batches()
        if not timed or (not every_turn and epoch is not None and epoch <= len(timed)):
            return timed
        turns = self.turn_steps()
        kept = [i for i in timed if i not in turns]
        return kept if len(kept) >= max(2, (len(timed) + 1) // 2) else timed

    def _timed_steps(self) -> list[int]:
        """The timed steps whose boundaries the record holds."""
        if not self.timed_steps:
            return []
        first = self.first_timed_step()
        return list(range(first, min(first + self.timed_steps, len(self.boundaries_s) - 1)))

    def steady_left_out(self, every_turn: bool = False) -> int:
        """Timed steps left out of the steady figures (``steady_steps``)."""
        return len(self._timed_steps()) - len(self.steady_steps(every_turn))

    def steady_durations(self, every_turn: bool = False) -> list[float]:
        """The steady steps' durations (profiler off), in seconds (``steady_steps``)."""
        d = self.step_durations()
        return [d[i] for i in self.steady_steps(every_turn) if i < len(d)]

    def steady_samples(self, every_turn: bool = False) -> list[int]:
        """Samples of each steady step (0 where not known), aligned with ``steady_durations``."""
        n = self.samples_per_step
        return [n[i] if i < len(n) else 0 for i in self.steady_steps(every_turn)]

    def steady_mean_s(self) -> float | None:
        """The mean steady step in seconds: the timed steps' sum (synchronised at both ends) over
        their count, or, where steps at an epoch's turn were left out, the mean of the rest."""
        if not self.timed_seconds or not self.timed_steps:
            return None
        if not self.steady_left_out():
            return self.timed_seconds / self.timed_steps
        kept = self.steady_durations()
        return sum(kept) / len(kept) if kept else None

    def steady_data_wait_share(self) -> float | None:
        """The share of the steady steps (``steady_steps``, profiler off) the training thread spent
        waiting inside DataLoader ``__next__``: measured, where the profiled window may have
        drawn batches the workers queued before it. None where the record holds no waits."""
        w, b = self.data_wait_s, self.boundaries_s
        if len(w) != len(b):
            return None
        steps = [i for i in self.steady_steps() if i + 1 < len(b)]
        total = sum(b[i + 1] - b[i] for i in steps)
        if not steps or total <= 0:
            return None
        return min(1.0, max(0.0, sum(w[i + 1] - w[i] for i in steps) / total))

    def train_loader(self) -> DataLoaderInfo | None:
        """The DataLoader the profiled steps drew from (the most fetches in the window)."""
        if not self.dataloaders:
            return None
        best = max(self.dataloaders, key=lambda d: d.fetches_in_window)
        if best.fetches_in_window == 0:
            iterated = [d for d in self.dataloaders if d.iterators_created]
            return iterated[0] if iterated else self.dataloaders[0]
        return best

    def epoch_batches(self) -> int | None:
        """Batches per epoch of the DataLoader that fed the profiled steps: None where none fed
        them (a loader built and never drawn from in the window says nothing of the steps' epoch)."""
        loader = self.train_loader()
        return loader.batches() if loader is not None and loader.fetches_in_window else None

    def fed_by_dataloader(self) -> bool:
        """Some DataLoader delivered a batch to the profiled steps (a script that feeds its steps
        from its own loader has none, whatever DataLoaders it built at start-up)."""
        return any(d.fetches_in_window for d in self.dataloaders)

    def loop_framework(self) -> str | None:
        """The framework that runs the training loop: Lightning or the HF Trainer over an
        ``Accelerator`` they may build themselves; None for a plain PyTorch loop."""
        names = {f.framework for f in self.frameworks}
        return next((n for n in FRAMEWORKS if n in names), None)

    def batch_size(self) -> float | None:
        """Samples per step, found from the data (median over steps that fetched any)."""
        seen = [n for n in self.samples_per_step if n > 0]
        return statistics.median(seen) if seen else None

    # --- persistence --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """A record from its JSON form; ``ValueError`` (saying which field) for a value of the
        wrong kind: a corrupt or edited run.json must not fail deep inside the analysis."""
        check_field_kinds(cls, data)
        data = dict(data)
        data["dataloaders"] = [DataLoaderInfo(**d) for d in data.get("dataloaders", [])]
        data["optimizers"] = [OptimizerInfo(**o) for o in data.get("optimizers", [])]
        data["models"] = [ModelInfo(**m) for m in data.get("models", [])]
        data["frameworks"] = [FrameworkInfo(**f) for f in data.get("frameworks", [])]
        if data.get("flops"):
            data["flops"] = FlopCount.from_dict(data["flops"])
        for name in ("memory_split", "memory_at_oom"):
            if data.get(name):
                data[name] = MemorySplit(**data[name])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: Path) -> None:
        from diagnose.atomic import write_atomically

        write_atomically(path, json.dumps(self.to_dict(), indent=1, default=str))

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        return cls.from_dict(json.loads(path.read_text()))


#: the JSON kinds a field's annotation allows (``None`` also where the annotation says so)
_KINDS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
}


def check_field_kinds(cls: type, data: Any) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"holds {type(data).__name__}, not an object")
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, annotation = data[f.name], str(f.type)
        if value is None and "None" in annotation:
            continue
        outer, _, inner = annotation.split(" | ")[0].partition("[")
        kinds = _KINDS.get(outer.strip())
        if kinds is None:
            continue
        if not isinstance(value, kinds) or (isinstance(value, bool) and outer.strip() in ("int", "float")):
            raise ValueError(f"its field {f.name} is {json.dumps(value)[:40]}, not {outer}")
        element = _KINDS.get(inner.rstrip("]").strip()) if outer.strip() == "list" else None
        if (
            element is not None
            and isinstance(value, list)
            and not all(isinstance(v, element) and not isinstance(v, bool) for v in value)
        ):
            raise ValueError(f"its field {f.name} holds {json.dumps(value)[:40]}, not a {annotation}")
