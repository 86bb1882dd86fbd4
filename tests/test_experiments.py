"""verify and sweep: knob injection on tiny scripts, the bookkeeping, OOM handling, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from diagnose.analysis.report import Report
from diagnose.errors import UsageError
from diagnose.experiments import (
    STATISTIC,
    Baseline,
    Outcome,
    Spec,
    VerifyResult,
    compare_by_samples,
    compile_cost,
    judge,
    merge_knobs,
    outcome_from_report,
    parse_sweep,
    summarize_sweep,
    summarize_verify,
    uncompared_words,
)
from diagnose.progress import Progress
from diagnose.record import WindowPlan
from diagnose.renderers import TerminalRenderer
from diagnose.rundir import RunDir
from diagnose.runtime.knobs import Knobs
from diagnose.runtime.runner import resolve_target, run_target
from tests.conftest import REPO

SMALL = WindowPlan(warmup=2, steps=2, timed=3)


def ok(label: str, rate: float, samples: float | None = None, **kw) -> Outcome:
    return Outcome(label, {}, "ok", "", steps_per_s=rate, samples_per_s=samples, **kw)


# --- bookkeeping (pure) -------------------------------------------------------------------------


def test_spread_and_no_effect_calls() -> None:
    baseline = Baseline([ok("b", 10.0), ok("b", 10.4)], by_samples=False)
    assert baseline.rate == pytest.approx(10.2)
    assert baseline.spread == pytest.approx(0.2 / 10.2)
    assert judge(ok("x", 10.3), baseline).verdict == "no effect"  # inside ±2%
    helped = judge(ok("x", 20.4), baseline)
    assert (helped.verdict, helped.speedup) == ("helped", pytest.approx(2.0))
    assert judge(ok("x", 5.1), baseline).verdict == "slower"
    assert judge(Outcome("x", {}, "oom", ""), baseline).verdict == "oom"


def test_a_run_whose_steps_are_another_kind_than_the_baselines_is_not_compared() -> None:
    # a compiled torchdiffeq flow's check counted one ODE evaluation a "step" (model calls) against
    # the baseline's optimizer steps, and read 11.7x
    baseline = Baseline([ok("b", 2.3, step_mode="optimizer")], by_samples=False)
    variant = judge(ok("x", 47.0, step_mode="forward"), baseline)
    assert (variant.verdict, variant.speedup) == ("not compared", None)
    assert uncompared_words(variant, baseline) == (
        "its steps were counted at each call of the model (no optimizer step, no DataLoader seen), the baseline's at "
        "each optimizer step: its steps/s measure other steps: not compared"
    )
    # the same kind, or a side that did not say: compared as before
    assert judge(ok("x", 4.6, step_mode="optimizer"), baseline).speedup == pytest.approx(2.0)
    assert judge(ok("x", 4.6), baseline).speedup == pytest.approx(2.0)


def test_small_changes_are_no_effect_even_with_a_tight_baseline() -> None:
    baseline = Baseline([ok("b", 10.0)], by_samples=False)  # one run that did not say its steps' spread
    assert baseline.spread == 0 and baseline.spread_from is None
    assert judge(ok("x", 10.15), baseline).verdict == "no effect"  # under the 2% floor


def steady(mean: float, p10: float, p90: float) -> dict[str, float]:
    return {"mean_step_ms": mean, "p10_step_ms": p10, "p90_step_ms": p90}


def test_one_baseline_run_spreads_by_its_steps_p10_p90() -> None:
    # a 100 ms mean step, p10-p90 90-130 ms: the band is half that range over the mean, ±20%
    baseline = Baseline([ok("b", 10.0, **steady(100.0, 90.0, 130.0))], by_samples=False)
    assert (baseline.spread_from, baseline.spread) == ("steps", pytest.approx(0.2))
    assert judge(ok("x", 11.9), baseline).verdict == "no effect"  # 1.19x
    assert judge(ok("x", 12.1), baseline).verdict == "helped"  # 1.21x
    assert judge(ok("x", 8.1), baseline).verdict == "no effect"  # 0.81x
    assert judge(ok("x", 7.9), baseline).verdict == "slower"


def test_repeats_spread_by_their_means_not_their_steps() -> None:
    # two runs whose means agree within ±1% however widely their own steps vary
    baseline = Baseline(
        [ok("b", 10.0, **steady(100.0, 50.0, 150.0)), ok("b", 10.2, **steady(98.0, 49.0, 147.0))], by_samples=False
    )
    assert (baseline.spread_from, baseline.spread) == ("repeats", pytest.approx(0.1 / 10.1))
    assert judge(ok("x", 10.1 * 1.05), baseline).verdict == "helped"
    # a failed repeat does not count: one run left, its steps' spread
    failed = Baseline([ok("b", 10.0, **steady(100.0, 95.0, 105.0)), Outcome("b", {}, "failed", "")], by_samples=False)
    assert (failed.spread_from, failed.spread) == ("steps", pytest.approx(0.05))


def test_outcomes_carry_the_reports_steady_mean_and_its_p10_p90(tmp_path: Path) -> None:
    report = {
        "status": {"state": "stopped"},
        "throughput": {
            "steady": {
                "steps": 20,
                "steps_per_s": 10.0,
                "samples_per_s": 640.0,
                "median_step_ms": 95.0,
                **steady(100.0, 90.0, 130.0),
            }
        },
    }
    o = outcome_from_report(Spec("baseline"), report, tmp_path, 0)
    assert (o.status, o.steps_per_s, o.samples_per_s) == ("ok", 10.0, 640.0)
    assert (o.mean_step_ms, o.p10_step_ms, o.p90_step_ms) == (100.0, 90.0, 130.0)
    assert "median_step_ms" not in asdict(o)  # one statistic: the mean, as the report's steady figure


def test_verify_summary_names_its_statistic_and_its_spread() -> None:
    base = ok("baseline-1", 10.0, **steady(100.0, 90.0, 130.0))
    tried = Outcome(
        "DATA001", {"num_workers": "4"}, "ok", "", rule="DATA001", steps_per_s=11.0, **steady(91.0, 85.0, 97.0)
    )
    baseline = Baseline([base], by_samples=False)
    judge(tried, baseline)
    summary = summarize_verify(
        VerifyResult(baseline, [tried], None, []), {"findings": [{"rule": "DATA001", "gain_bound": 1.5}]}
    )
    assert summary["statistic"] == STATISTIC == "mean of the timed steps with the profiler off, and their p10-p90"
    assert (summary["baseline_spread"], summary["baseline_spread_from"]) == (0.2, "steps")
    assert summary["conclusions"][0] == (
        "DATA001 (num_workers=4) had no effect: 1.100x is inside the baseline's ±20.0% spread "
        "(half the p10-p90 range of the baseline's timed steps)"
    )
    row = next(r for r in summary["rows"] if r["role"] == "recommendation")
    assert (row["mean_step_ms"], row["p10_step_ms"], row["p90_step_ms"]) == (91.0, 85.0, 97.0)
    # the terminal labels the table and the spread
    text = " ".join(TerminalRenderer(color=False, width=200).render(Report.from_dict({"experiments": summary})).split())
    assert f"What each recommendation really buys: {STATISTIC}" in text
    assert "mean steps/s" in text and "mean step ms (p10-p90)" in text and "91.0 (85.0-97.0)" in text
    assert (
        "baseline spread: ±20.0% (one baseline run: half the p10-p90 range of its timed steps; changes inside it count as no effect)"
        in text
    )


def test_samples_per_second_is_compared_when_every_run_has_it() -> None:
    runs = [ok("b", 10.0, samples=160.0), ok("bigger batch", 6.0, samples=384.0)]
    assert compare_by_samples(runs)
    baseline = Baseline(runs[:1], by_samples=True)
    assert judge(runs[1], baseline).speedup == pytest.approx(2.4)  # fewer steps, more samples
    assert not compare_by_samples([ok("b", 10.0, samples=160.0), ok("x", 12.0)])


def test_a_batch_change_is_compared_by_samples_never_by_steps() -> None:
    """A run that changes the batch does other work per step: compared by steps/s, timm's batch
    2048 against 64 read 0.01x (0.27 against 36.7 steps/s). Any run that changes it (the knob,
    or the script's flag however spelled) makes every run compared by samples/s, and a run
    without samples/s is "not compared", with why; a change that leaves the batch alone keeps
    steps/s."""
    base = ok("baseline-1", 36.7)  # a script whose steps' samples are unknown: no samples/s
    for knob in ("batch_size", "arg.batch_size", "arg.batch-size", "arg.bs", "arg.per_device_train_batch_size"):
        big = Outcome("MEM004", {knob: "2048"}, "ok", "", rule="MEM004", steps_per_s=0.27)
        assert compare_by_samples([base, big]), knob
    for knob in ("env.BATCH_SIZE", "arg.gradient_accumulation_steps", "arg.accumulate_grad_batches"):
        assert compare_by_samples([base, Outcome("x", {knob: "4"}, "ok", "", steps_per_s=9.0)]), knob
    # the batch left alone: steps/s, as before; an evaluation's batch or accumulation is no step's
    for knob in ("num_workers", "arg.lr", "autocast", "arg.eval_accumulation_steps", "arg.eval_batch_size"):
        assert not compare_by_samples([base, Outcome("x", {knob: "4"}, "ok", "", steps_per_s=40.0)]), knob
    # a batch change that ran out of memory measured nothing: the others compare by steps/s
    assert not compare_by_samples([base, Outcome("b", {"batch_size": "4096"}, "oom", "")])

    # verify: the baseline knows its samples/s, the larger batch does not (it ended after 5 steps)
    base = ok("baseline-1", 36.7, samples=36.7 * 64)
    big = Outcome("MEM004", {"batch_size": "2048"}, "ok", "", rule="MEM004", steps_per_s=0.27)
    baseline = Baseline([base], compare_by_samples([base, big]))
    assert (judge(big, baseline).verdict, big.speedup) == ("not compared", None)
    summary = summarize_verify(VerifyResult(baseline, [big], None, []), {"findings": [{"rule": "MEM004"}]})
    assert summary["compared_by"] == "samples_per_s"
    assert summary["conclusions"] == [
        "MEM004 (batch_size=2048): it measured no samples/s (the samples of its steps are unknown), and a run "
        "changes the batch: steps/s would compare steps of unlike size: not compared"
    ]
    # with its samples/s known: per sample, 0.27 x 2048 = 552.96 against 36.7 x 64 = 2348.8
    big = Outcome("MEM004", {"batch_size": "2048"}, "ok", "", rule="MEM004", steps_per_s=0.27, samples_per_s=552.96)
    assert judge(big, Baseline([base], compare_by_samples([base, big]))).speedup == pytest.approx(552.96 / 2348.8)
    # a baseline without samples/s: the batch change is not compared, and the conclusion says
    # why; a change that leaves the batch alone is still judged, by steps/s (like with like)
    base = ok("baseline-1", 36.7)
    bf16 = Outcome("PREC001", {"autocast": "bf16"}, "ok", "", rule="PREC001", steps_per_s=55.05)
    baseline = Baseline([base], compare_by_samples([base, big, bf16]))
    assert baseline.by_samples and judge(big, baseline).verdict == "no baseline"
    assert (judge(bf16, baseline).verdict, bf16.speedup) == ("helped", pytest.approx(1.5))
    summary = summarize_verify(VerifyResult(baseline, [big], None, []), {"findings": [{"rule": "MEM004"}]})
    assert summary["conclusions"] == [
        "MEM004 (batch_size=2048): the baseline measured no samples/s, and the run changes the batch: not compared"
    ]


def test_a_sweep_of_the_batch_without_samples_per_second_names_no_best() -> None:
    """Before: "best: arg.batch_size=64" by steps/s, and 2048 at 0.01x."""
    points = [
        Outcome(f"arg.batch_size={b}", {"arg.batch_size": str(b)}, "ok", "", steps_per_s=rate)
        for b, rate in ((64, 36.7), (2048, 0.27))
    ]
    summary = summarize_sweep(["arg.batch_size"], points)
    assert summary["compared_by"] == "samples_per_s"
    assert [(r["verdict"], r["speedup"]) for r in summary["rows"]] == [("not compared", None)] * 2
    assert summary["conclusions"] == [
        f"arg.batch_size={b}: it measured no samples/s (the samples of its steps are unknown), and a run changes "
        "the batch: steps/s would compare steps of unlike size: not compared"
        for b in (64, 2048)
    ]


def test_a_run_whose_knobs_reached_nothing_is_not_applied_never_a_speedup() -> None:
    """The knob's ``via`` says ``not applied: ...`` (a DataLoader knob set on a loader that fed
    no profiled step): the run was the unchanged script, and 0.82x of it is the spread."""
    missed = "not applied: the DataLoader it reached (train.py:12) delivered no batch to the profiled steps"
    base = ok("baseline-1", 10.0, samples=640.0)
    tried = Outcome(
        "MEM004", {"batch_size": "65536"}, "ok", "", rule="MEM004", steps_per_s=8.2, samples_per_s=524.8,
        via={"batch_size": missed},
    )  # fmt: skip
    baseline = Baseline([base], compare_by_samples([base, tried]))
    assert (judge(tried, baseline).verdict, tried.speedup) == ("not applied", None)
    summary = summarize_verify(VerifyResult(baseline, [tried], None, []), {"findings": [{"rule": "MEM004"}]})
    assert summary["conclusions"] == [
        "MEM004 (batch_size=65536): not applied (batch_size: the DataLoader it reached (train.py:12) "
        "delivered no batch to the profiled steps): not compared"
    ]
    # one knob of two reached the script: judged, its via saying which did not
    both = Outcome(
        "DATA002", {"pin_memory": "true", "non_blocking": "true"}, "ok", "", steps_per_s=12.0, samples_per_s=768.0,
        via={"pin_memory": missed, "non_blocking": "Tensor.to(non_blocking=True) for pinned tensors"},
    )  # fmt: skip
    assert judge(both, baseline).verdict == "helped"
    # a sweep: the unchanged points are neither compared nor the best
    points = [
        Outcome(f"num_workers={n}", {"num_workers": str(n)}, "ok", "", steps_per_s=rate, via={"num_workers": missed})
        for n, rate in ((0, 10.0), (8, 11.0))
    ]
    summary = summarize_sweep(["num_workers"], points)
    assert [(r["verdict"], r["speedup"]) for r in summary["rows"]] == [("not applied", None)] * 2
    assert summary["conclusions"] == [
        f"num_workers={n}: not applied (num_workers: the DataLoader it reached (train.py:12) delivered no batch "
        "to the profiled steps): not compared"
        for n in (0, 8)
    ]


def test_the_in_run_check_measures_neither_an_unlike_batch_nor_an_unapplied_knob(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``diagnose run``'s check reuses verify's bookkeeping: its batch-size A/B without
    samples/s and its A/B whose knob reached nothing are measured as nothing (no Measurement to
    rank on), each with a line in ``not_measured`` saying why."""
    from diagnose import experiments as E

    missed = "not applied: the DataLoader it reached (train.py:12) delivered no batch to the profiled steps"

    def fake_run(script, spec, run_dir, plan, base_knobs=None, timeout=None, options=None):
        via = {"num_workers": missed} if "num_workers" in spec.knobs else {}
        rate = 0.27 if "batch_size" in spec.knobs else 11.0  # a steps/s far under the baseline's, unlike work
        return Outcome(spec.label, spec.knobs, "ok", str(run_dir.path), rule=spec.rule, steps_per_s=rate, via=via)

    monkeypatch.setattr(E, "run_experiment", fake_run)
    report = {
        "status": {"state": "stopped"},
        "throughput": {"steady": {"steps_per_s": 36.7, "mean_step_ms": 27.2, "mean_spread": 0.02}},
        "ranking": {
            "to_check": [
                {"rule": "MEM004", "why": ["x"], "knobs": {"batch_size": "2048"}},
                {"rule": "DATA001", "why": ["y"], "knobs": {"num_workers": "8"}},
            ]
        },
    }
    measured, summary = E.check(["train.py", "--"], RunDir(tmp_path), SMALL, report, 2, 1e6)
    assert measured == {}
    assert [(r["rule"], r["verdict"], r["speedup"]) for r in summary["experiments"]] == [
        ("MEM004", "not compared", None),
        ("DATA001", "not applied", None),
    ]
    assert summary["compared_by"] == "samples_per_s"
    assert summary["not_measured"] == [
        "MEM004: it measured no samples/s (the samples of its steps are unknown), and a run changes the batch: "
        "steps/s would compare steps of unlike size: not compared",
        f"DATA001: not applied (num_workers: {missed.removeprefix('not applied: ')}): not compared",
    ]


def test_compile_time_and_break_even() -> None:
    baseline = Baseline([ok("b", 10.0, mean_step_ms=100.0, startup_s=5.0)], by_samples=False)
    compiled = ok("c", 20.0, mean_step_ms=50.0, startup_s=45.0)
    assert compile_cost(compiled, baseline) == {"compile_s": 40.0, "break_even_steps": 800}


def test_merge_knobs_later_wins() -> None:
    assert merge_knobs([Spec("a", {"num_workers": "4", "pin_memory": "true"}), Spec("b", {"num_workers": "8"})]) == {
        "num_workers": "8",
        "pin_memory": "true",
    }


def test_parse_sweep_one_or_two_knobs() -> None:
    names, specs = parse_sweep(["num_workers=0,2", "pin_memory=false,true"])
    assert names == ["num_workers", "pin_memory"]
    assert [s.knobs for s in specs] == [
        {"num_workers": "0", "pin_memory": "false"},
        {"num_workers": "0", "pin_memory": "true"},
        {"num_workers": "2", "pin_memory": "false"},
        {"num_workers": "2", "pin_memory": "true"},
    ]
    with pytest.raises(UsageError, match="one or two"):
        parse_sweep(["a=1", "b=2", "c=3"])
    with pytest.raises(UsageError, match="whole number"):
        parse_sweep(["num_workers=0,two"])
    with pytest.raises(UsageError, match="unknown knob"):
        parse_sweep(["warp_speed=9"])


def test_sweep_summary_reports_the_largest_batch_that_fits() -> None:
    outcomes = [
        Outcome("b=16", {"batch_size": "16"}, "ok", "", steps_per_s=10, samples_per_s=160),
        Outcome("b=32", {"batch_size": "32"}, "ok", "", steps_per_s=9, samples_per_s=288),
        Outcome("b=64", {"batch_size": "64"}, "oom", ""),
        Outcome("b=128", {"batch_size": "128"}, "oom", "", error="skipped"),
    ]
    summary = summarize_sweep(["batch_size"], outcomes)
    assert summary["compared_by"] == "samples_per_s"
    assert "out of memory from batch_size=64; the largest that fits: batch_size=32" in summary["conclusions"]
    assert summary["conclusions"][0].startswith("best: b=32")
    assert [r["speedup"] for r in summary["rows"][:2]] == [1.0, 1.8]


def test_sweep_over_compile_reports_compile_time_and_break_even() -> None:
    outcomes = [
        Outcome("compile=none", {"arg.compile": "none"}, "ok", "", steps_per_s=2.0, mean_step_ms=500.0, startup_s=20.0),
        Outcome("compile=flag", {"arg.compile": "flag"}, "ok", "", steps_per_s=2.5, mean_step_ms=400.0, startup_s=95.0),
        Outcome(
            "compile=slow", {"compile": "max-autotune"}, "ok", "", steps_per_s=1.9, mean_step_ms=520.0, startup_s=30.0
        ),
    ]
    summary = summarize_sweep(["arg.compile"], outcomes)
    rows = summary["rows"]
    assert "compile" not in rows[0]
    # 75 s more to start, 100 ms saved per step: paid back after 750 steps
    assert rows[1]["compile"] == {"compile_s": 75.0, "break_even_steps": 750}
    assert rows[2]["compile"] == {"compile_s": 10.0}  # slower steps never pay it back
    assert (
        "compile=flag: compiling took 75.0 s more than compile=none and pays for itself after 750 steps"
        in summary["conclusions"]
    )
    assert (
        "compile=slow: compiling took 10.0 s more than compile=none and never pays for itself" in summary["conclusions"]
    )
    assert summary["conclusions"][0].startswith("best: compile=flag")


# --- knob injection on tiny scripts (in-process) -------------------------------------------------


def _run(write_script, body: str, knobs: list[str], tmp_path: Path):
    script = write_script(body)
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    return run_target(
        resolve_target(str(script), None, []),
        SMALL,
        RunDir(run_dir),
        knobs=Knobs.parse(knobs),
        progress=Progress(enabled=False),
    )


PROBE = """
import json, torch
from torch.utils.data import DataLoader, TensorDataset
seen = {}
m = torch.nn.Linear(8, 8)
opt = torch.optim.AdamW(m.parameters(), lr=0.1)
dl = DataLoader(TensorDataset(torch.randn(512, 8)), batch_size=4)
for i, (x,) in enumerate(dl):
    y = m(x)
    seen["autocast_dtype"] = str(y.dtype)
    seen["tf32"] = torch.backends.cuda.matmul.allow_tf32
    seen["benchmark"] = torch.backends.cudnn.benchmark
    seen["loader"] = [dl.num_workers, dl.batch_size, dl.pin_memory]
    seen["foreach"] = opt.defaults["foreach"]
    y.float().sum().backward(); opt.step(); opt.zero_grad()
    with open(__file__ + ".json", "w") as f:
        json.dump(seen, f)
"""


def test_knobs_reach_autocast_flags_loader_and_optimizer(write_script, tmp_path: Path) -> None:
    knobs = ["autocast=bf16", "tf32=true", "cudnn_benchmark=true", "batch_size=16", "optimizer=foreach"]
    record = _run(write_script, PROBE, knobs, tmp_path)
    seen = json.loads((tmp_path / "train.py.json").read_text())
    assert seen["autocast_dtype"] == "torch.bfloat16"  # the Linear ran under autocast
    assert seen["tf32"] is True and seen["benchmark"] is True
    assert seen["loader"][1] == 16
    assert seen["foreach"] is True
    assert record.batch_size() == 16
    # and every global change is undone afterwards (the autouse fixture checks the hooks)
    import torch

    assert not torch.is_autocast_enabled("cpu")
    assert torch.backends.cudnn.benchmark is False


OWN_LOADER = """
import torch
from torch.utils.data import DataLoader, TensorDataset
data = torch.randn(512, 8)
stats = DataLoader(TensorDataset(data), batch_size=128)  # read once at start-up, never in the loop
mean = next(iter(stats))[0].mean(0)
m = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(40):
    x = data[(i * 16) % 512 : (i * 16) % 512 + 16] - mean  # its own loader
    m(x).sum().backward(); opt.step(); opt.zero_grad()
"""


def test_a_dataloader_knob_on_a_loader_that_fed_no_profiled_step_says_not_applied(write_script, tmp_path: Path) -> None:
    """The DataLoader the steps read takes the knob (PROBE); one built at start-up by a script
    that feeds its steps itself does not count: its ``via`` says so, and the analysis sees no
    DataLoader feeding the steps."""
    record = _run(write_script, OWN_LOADER, ["batch_size=64", "num_workers=0", "autocast=bf16"], tmp_path)
    assert record.dataloaders[0].knobs_applied and not record.fed_by_dataloader()
    missed = "not applied: the DataLoader it reached (train.py:4) delivered no batch to the profiled steps"
    assert record.knobs_via == {"batch_size": missed, "num_workers": missed, "autocast": "global torch.autocast"}
    # and a plain diagnose run --set says so among its warnings
    assert [w for w in record.warnings if w.startswith("--set")] == [
        f"--set batch_size=64: {missed}",
        f"--set num_workers=0: {missed}",
    ]
    record = _run(write_script, PROBE, ["batch_size=16"], tmp_path)
    assert record.knobs_via == {"batch_size": "DataLoader(batch_size=...)"} and record.fed_by_dataloader()


def test_dataloader_miss_names_the_loaders_the_knob_reached() -> None:
    from diagnose.record import DataLoaderInfo
    from diagnose.runtime.knobs import dataloader_miss

    def loader(site: str, fetches: int, applied: dict) -> DataLoaderInfo:
        return DataLoaderInfo(
            1, site, "D", 8, 4, 0, False, None, False, False, fetches_in_window=fetches, knobs_applied=applied
        )

    fed = loader("/job/train.py:30", 5, {"batch_size": 64})
    idle = [loader("/job/train.py:9", 0, {"batch_size": 64}), loader("/job/eval.py:3", 0, {"batch_size": 64})]
    assert dataloader_miss("batch_size", [*idle, fed]) is None
    assert dataloader_miss("batch_size", idle) == (
        "not applied: the DataLoader it reached (eval.py:3, train.py:9) delivered no batch to the profiled steps"
    )
    # a batch sampler decided the batch: the knob reached no loader
    assert dataloader_miss("batch_size", [loader("train.py:30", 5, {})]) == (
        "not applied: no DataLoader the script built took it"
    )
    assert dataloader_miss("num_workers", []) == "not applied: the script built no DataLoader"


def test_autocast_is_off_during_backward(write_script, tmp_path: Path) -> None:
    body = """
    import json, torch
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    state = {}
    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x
        @staticmethod
        def backward(ctx, g):
            state["backward_autocast"] = torch.is_autocast_enabled("cpu")
            return g
    for _ in range(20):
        y = Probe.apply(m(torch.randn(4, 8)))
        state["forward_autocast"] = torch.is_autocast_enabled("cpu")
        y.float().sum().backward(); opt.step(); opt.zero_grad()
        json.dump(state, open(__file__ + ".json", "w"))
    """
    _run(write_script, body, ["autocast=bf16"], tmp_path)
    state = json.loads((tmp_path / "train.py.json").read_text())
    assert state == {"forward_autocast": True, "backward_autocast": False}


def test_item_every_skips_syncs_per_call_site(write_script, tmp_path: Path) -> None:
    body = """
    import json, torch
    m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    values = []
    for i in range(20):
        loss = m(torch.ones(2, 4)).sum() * 0 + i
        loss.backward(); opt.step(); opt.zero_grad()
        values.append(loss.item())
        json.dump(values, open(__file__ + ".json", "w"))
    """
    _run(write_script, body, ["item_every=5"], tmp_path)
    values = json.loads((tmp_path / "train.py.json").read_text())
    # CPU tensors are never deferred (no sync to save): every value is fresh
    assert len(values) > 5 and values == [float(i) for i in range(len(values))]


def test_fake_oom_is_recorded_as_oom_even_when_the_script_exits(write_script, tmp_path: Path) -> None:
    body = """
    import sys, torch
    m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
    try:
        for i in range(50):
            m(torch.ones(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
            if i == 4:  # inside the profiled window
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    except torch.OutOfMemoryError:
        print("CUDA out of memory at batch size 2", file=sys.stderr)
        sys.exit(3)
    """
    record = _run(write_script, body, [], tmp_path)
    assert record.status == "oom" and record.exit_code == 3
    assert "Tried to allocate" in record.error["message"]


# --- the commands end to end (CPU) ---------------------------------------------------------------

OOM_ABOVE_32 = """
import argparse, torch
p = argparse.ArgumentParser(); p.add_argument("--batch_size", type=int, default=8); a = p.parse_args()
if a.batch_size > 32:
    raise torch.OutOfMemoryError(f"CUDA out of memory at batch {a.batch_size}")
m = torch.nn.Linear(8, 2); opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(a.batch_size, 8)
from torch.utils.data import DataLoader, TensorDataset
for (b,) in DataLoader(TensorDataset(torch.randn(100000, 8)), batch_size=a.batch_size):
    m(b).sum().backward(); opt.step(); opt.zero_grad()
"""


@pytest.mark.slow
def test_sweep_cli_finds_the_largest_batch_that_fits(write_script, tmp_path: Path) -> None:
    script = write_script(OOM_ABOVE_32)
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "diagnose", "sweep", "--json", "--warmup", "1", "--steps", "2", "--timed-steps", "3"]
    cmd += ["--set", "arg.batch_size=16,32,64,128", "--out", str(out), str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    rows = report["experiments"]["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok", "oom", "oom"]
    assert rows[3]["error"].startswith("skipped")  # larger than a size that already failed
    assert "the largest that fits: arg.batch_size=32" in " ".join(report["experiments"]["conclusions"])
    assert (out / "diagnose" / "report.json").is_file()
    assert f"run directory: {out}" in proc.stderr  # where the runs are, as diagnose run says it
    assert report["environment"]["cpu_count"] >= 1  # the header names the device the points ran on
    assert len(list(out.glob("events.out.tfevents.*.diagnose-compare"))) == 1  # its runs side by side in TensorBoard
    if report["experiments"].get("plot"):
        assert (out / "sweep.png").stat().st_size > 1000


def test_sweep_cli_of_a_dataloader_knob_the_steps_never_read_compares_nothing(write_script, tmp_path: Path) -> None:
    """End to end: a script that feeds its steps itself, beside a DataLoader read once at
    start-up: each point's knob reached only that loader, and the sweep says so instead of
    naming a best (before: "best" and a speedup out of the run-to-run spread)."""
    script = write_script(OWN_LOADER)
    cmd = [sys.executable, "-m", "diagnose", "sweep", "--json", "--warmup", "1", "--steps", "2", "--timed-steps", "3"]
    cmd += ["--set", "batch_size=32,64", "--out", str(tmp_path / "sweep"), str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    experiments = json.loads(proc.stdout)["experiments"]
    assert [(r["status"], r["verdict"], r["speedup"]) for r in experiments["rows"]] == [("ok", "not applied", None)] * 2
    assert experiments["conclusions"] == [
        f"batch_size={b}: not applied (batch_size: the DataLoader it reached (train.py:4) delivered no batch to the "
        "profiled steps): not compared"
        for b in (32, 64)
    ]


@pytest.mark.slow
def test_verify_cli_measures_the_top_recommendation(write_script, tmp_path: Path) -> None:
    script = write_script(
        """
        import torch
        from torch.utils.data import DataLoader, Dataset
        class Slow(Dataset):
            def __len__(self): return 100000
            def __getitem__(self, i):
                x = torch.randn(64, 64)
                for _ in range(30):
                    x = x @ x.T / 64
                return x.flatten()[:16]
        m = torch.nn.Linear(16, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
        for x in DataLoader(Slow(), batch_size=8):
            m(x).sum().backward(); opt.step(); opt.zero_grad()
        """
    )
    # a rule of our own, so that a recommendation with a knob fires on a 2-CPU machine too
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "TEST001.toml").write_text(
        'id = "TEST001"\ntitle = "t"\nsays = "s"\ndo = "d"\nwhy = "w"\ngain = "1 / (1 - exposed.data_wait)"\n'
        'knob = { num_workers = "1" }\n[when]\nall = ["exposed.data_wait >= 0.1"]\n'
        '[[examples]]\nsymptoms = { "exposed.data_wait" = 0.5 }\nfires = true\n'
        '[[examples]]\nsymptoms = { "exposed.data_wait" = 0.0 }\nfires = false\n'
    )
    out = tmp_path / "verify"
    cmd = [sys.executable, "-m", "diagnose", "verify", "--json", "--repeats", "2", "--warmup", "1", "--steps", "2"]
    cmd += ["--timed-steps", "4", "--rules", str(rules), "--out", str(out), str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    experiments = report["experiments"]
    roles = [r["role"] for r in experiments["rows"]]
    assert roles[:2] == ["baseline", "baseline"]
    assert experiments["baseline_spread"] >= 0
    assert experiments["conclusions"], "every tried recommendation gets a sentence"
    (tried,) = [row for row in experiments["rows"] if row["role"] == "recommendation"]
    assert tried["rule"] == "TEST001" and tried["knobs"] == {"num_workers": "1"}
    assert tried["status"] == "ok" and tried["verdict"] in ("helped", "no effect", "slower")
    assert tried["speedup"] > 0 and tried["top_exposed"]["category"]
    assert any(
        line.startswith("TEST001 (num_workers=1 via DataLoader(num_workers=...))")
        for line in experiments["conclusions"]
    )
    assert (out / "diagnose" / "report.json").is_file() and (out / "baseline-1" / "diagnose" / "run.json").is_file()
    assert f"run directory: {out}" in proc.stderr


def test_one_baseline_run_uses_how_far_its_mean_moves_not_how_its_steps_differ() -> None:
    """A GPU-bound loop whose host runs ahead times bimodal steps (6 ms, then 102 ms): their
    p10-p90 is wider than the mean itself, while the mean of any block of them hardly moves."""
    from diagnose.analysis.report import _timing, mean_spread

    steps_s = [0.006, 0.102] * 9  # 18 steps, three blocks of 6
    timing = _timing(steps_s, None)
    assert timing["mean_spread"] == 0.0 and timing["p90_step_ms"] - timing["p10_step_ms"] == pytest.approx(96.0)
    # blocks of 2, 2 and 2 steps: means 10, 20 and 30 ms around a mean of 20 ms
    assert mean_spread([0.010, 0.010, 0.020, 0.020, 0.030, 0.030]) == pytest.approx(0.5)
    assert mean_spread([0.01] * 5) is None  # under two steps a block
    one = Baseline(
        [ok("b", 18.5, mean_step_ms=54.0, p10_step_ms=6.0, p90_step_ms=102.0, mean_spread=0.03)], by_samples=False
    )
    assert (one.spread_from, one.spread) == ("blocks", 0.03)
    assert one.spread_words() == "half the range of the means of 3 blocks of the baseline's timed steps"
    assert judge(ok("x", 18.5 * 1.2), one).verdict == "helped"  # the p10-p90 (±89%) would say no effect
    older = Baseline([ok("b", 18.5, mean_step_ms=54.0, p10_step_ms=6.0, p90_step_ms=102.0)], by_samples=False)
    assert (older.spread_from, older.spread) == ("steps", pytest.approx(48 / 54))  # a report without it
    # a rerun's move wider than the blocks' spread (0 here, however wide the p10-p90) governs
    still = Baseline(
        [ok("b", 18.5, mean_step_ms=54.0, p10_step_ms=6.0, p90_step_ms=102.0, mean_spread=0.0)],
        by_samples=False,
        rerun_floor=0.16,
    )
    assert (still.spread_from, still.spread) == ("rerun", 0.16)


def test_verify_of_a_short_script_judges_every_run_by_its_profiled_window() -> None:
    # the baseline's script ended before the timed steps; the change's run did not: both are
    # compared by their profiled windows, the change is no failure
    from diagnose.experiments import align_basis

    def point(label: str, steady: float | None, profiled: float) -> Outcome:
        figures = {
            "steady": {"steps": 20, "steps_per_s": steady} if steady else None,
            "profiled": {"steps": 10, "steps_per_s": profiled},
        }
        return Outcome(label, {}, "ok", "", figures=figures)

    base, change = point("baseline", None, 10.0), point("DATA001", 30.0, 20.0)
    assert align_basis([base, change]) == "profiled"
    baseline = Baseline([base], by_samples=False)
    judge(change, baseline)
    assert (change.verdict, change.speedup, change.basis) == ("helped", 2.0, "profiled")


def _stopped_report(timed_steps: int) -> dict:
    """What a run stopped at its time limit leaves (the outside corpus: a batch 64x larger stopped
    at the check's budget): its script killed mid-loop, the timed steps it finished kept."""
    steady_figures = (
        {"steps": timed_steps, "steps_per_s": 2.184, "samples_per_s": 8946.0, "mean_step_ms": 457.874}
        if timed_steps
        else None
    )
    return {
        "status": {"state": "failed", "message": "the script raised RuntimeError: DataLoader worker is killed"},
        "throughput": {"batch_size": 4096, "steady": steady_figures},
    }


@pytest.mark.parametrize(
    ("timed_steps", "status", "error"),
    [
        (4, "ok", "timed out after 25 s: judged on the 4 timed steps it measured before"),
        (3, "ok", "timed out after 25 s: judged on the 3 timed steps it measured before"),
        (2, "failed", "timed out after 25 s (what it measured is in its report)"),
        (0, "failed", "timed out after 25 s (what it measured is in its report)"),
    ],
)
def test_a_run_stopped_at_its_time_limit_is_judged_on_the_timed_steps_it_finished(
    tmp_path: Path, timed_steps: int, status: str, error: str
) -> None:
    from diagnose.experiments import timed_out

    spec = Spec("MEM001", {"batch_size": "4096"}, rule="MEM001")
    outcome = timed_out(outcome_from_report(spec, _stopped_report(timed_steps), tmp_path, -15), 25.0, True)
    assert (outcome.status, outcome.error) == (status, error)
    if status == "ok":
        assert (outcome.basis, outcome.samples_per_s) == ("steady", 8946.0)
        judge(outcome, Baseline([ok("baseline-1", 45.0, 2880.0)], by_samples=True))
        assert outcome.verdict == "helped" and outcome.speedup == pytest.approx(8946.0 / 2880.0)
    assert timed_out(outcome_from_report(spec, {}, tmp_path, -9), 25.0, False).error == "timed out after 25 s"


def test_a_larger_batch_is_compared_without_either_sides_epoch_turns() -> None:
    """timm's ResNet-18 at twice its batch: 20 batches an epoch, so its timed steps held an
    evaluation pass the baseline's (40 an epoch) did not; its check measured 0.51-0.55x, verify
    1.20-1.76x (docs/zoo.md). A run that changes the batch is compared by both sides' turn-free
    rates; any other change keeps the steady ones (what persistent workers save is in turns)."""

    def measured(knobs: dict[str, str], steady: float, turn_free: float | None, batch: int = 64) -> Outcome:
        figures: dict = {"steady": {"steps_per_s": steady, "samples_per_s": steady * batch}, "profiled": None}
        if turn_free is not None:
            figures["turn_free"] = {"steps_per_s": turn_free, "samples_per_s": turn_free * batch}
        out = Outcome("x", knobs, "ok", "", figures=figures)
        out.use("steady")
        return out

    baseline = Baseline([measured({}, 50.0, None)], by_samples=True)
    assert baseline.turn_free_rate == pytest.approx(3200.0)  # no turn kept: its steady figures
    # twice the batch: 10 steps/s with the evaluation pass in them (0.40x), 40 without (1.60x)
    bigger = judge(measured({"batch_size": "128"}, 10.0, 40.0, batch=128), baseline)
    assert bigger.speedup == pytest.approx(40 * 128 / 3200)
    assert bigger.without_turns and bigger.verdict == "helped"
    # the same figures for a change that leaves the batch alone: the steady ones
    workers = judge(measured({"persistent_workers": "true"}, 10.0, 40.0), baseline)
    assert workers.speedup == pytest.approx(640 / 3200) and not workers.without_turns


def test_verify_with_one_baseline_run_judges_a_change_against_how_far_a_rerun_moves_the_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One baseline run (``--repeats 1``) of a host-paced script whose diagnosis says a rerun
    moves the step by 16%: its blocks' 2% would call 0.85x slower, but another process of the
    unchanged script may run that much slower too (PointNet's persistent workers, a change that
    does nothing past an epoch's turn, read 0.80x so): the change must beat the 16%, and the
    conclusions say where the spread came from. With two baseline runs, their own range."""
    from diagnose import experiments as E

    def fake_run(script, spec, run_dir, plan, base_knobs=None, timeout=None, options=None, launch=None, on_line=None):
        if spec.label == "baseline" and run_dir.path.name == "baseline-1":
            run_dir.path.mkdir(parents=True, exist_ok=True)
            report = {
                "findings": [{"rule": "DATA005", "knobs": {"persistent_workers": "true"}}],
                "ranking": {"rerun_spread": 0.16},
            }
            run_dir.report_path.parent.mkdir(parents=True, exist_ok=True)
            run_dir.report_path.write_text(json.dumps(report))
        rate = 10.0 if spec.label == "baseline" else 8.5
        return E.Outcome(
            spec.label, spec.knobs, "ok", str(run_dir.path), rule=spec.rule, steps_per_s=rate, mean_spread=0.02
        )

    monkeypatch.setattr(E, "run_experiment", fake_run)
    monkeypatch.setattr(
        E.RunDir, "load_report", lambda self: Report.from_dict(json.loads(self.report_path.read_text()))
    )
    result, report = E.verify(["train.py"], RunDir(tmp_path), WindowPlan(), top=1, repeats=1)
    (tried,) = result.tried
    assert (tried.speedup, tried.verdict) == (pytest.approx(0.85), "no effect")
    summary = summarize_verify(result, report)
    assert (summary["baseline_spread"], summary["baseline_spread_from"]) == (0.16, "rerun")
    assert summary["conclusions"][-1] == (
        "one baseline run: a change must beat the ±16% a rerun may move the step "
        "(the diagnosis's estimate; --repeats 2 or more measures it)"
    )
    two, _ = E.verify(["train.py"], RunDir(tmp_path / "two"), WindowPlan(), top=1, repeats=2)
    assert two.baseline.spread_from == "repeats" and two.tried[0].verdict == "slower"
