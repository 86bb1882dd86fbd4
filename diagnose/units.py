"""Numbers for people: bytes, shares, milliseconds, rates and speedups, each written one way.

Contract: pure functions from a number to a string; no imports from diagnose. The rules' text
templates (``format_value``) and every renderer format through here, so that "97%" or "1.2 GB"
reads the same in the terminal, the HTML page and TensorBoard.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def human_bytes(value: float) -> str:
    """Decimal units, one digit: ``1.2 GB``, ``512.0 KB``, ``12 B``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def percent(share: float, digits: int = 1) -> str:
    """A share of 0-1 as a percentage: ``percent(0.193) == "19.3%"``."""
    return f"{share * 100:.{digits}f}%"


def spread_ms(low: float | None, high: float | None, digits: int = 2) -> str:
    """A per-step p10-p90 range in ms: ``1.20–3.40``; ``-`` when the report has none."""
    if low is None or high is None:
        return "-"
    return f"{low:.{digits}f}–{high:.{digits}f}"


def speedup(factor: float) -> str:
    """A factor, two decimals: ``2.50x``."""
    return f"{factor:.2f}x"


def measured_words(
    speedup: float, spread: float, interval: Sequence[float] | None = None, change: str | None = None
) -> str:
    """A short A/B's measurement as every renderer words it: the speedup, the spread it was judged
    against, what a rerun reads where that is known, and the change where given."""
    parts = [f"±{spread:.1%}"]
    if interval:
        parts.append(f"a rerun {interval[0]:.2f}x-{interval[1]:.2f}x")
    if change is not None:
        parts.append(change)
    return f"measured {speedup:.2f}x by a short A/B ({'; '.join(parts)})"


#: a bound above this is shown as ``>100x``: it is 1 / (1 - s) of a share s near 1 (a trace whose
#: window is nearly all host time, HTA's triton_example: 7578461.37x), which no digits make clearer
LARGEST_SHOWN_BOUND = 100.0


def bound_text(bound: float) -> str:
    """A finding's gain bound: ``2.50x``, or ``>100x`` above ``LARGEST_SHOWN_BOUND``."""
    return speedup(bound) if bound <= LARGEST_SHOWN_BOUND else f">{LARGEST_SHOWN_BOUND:g}x"


def gain_words(predicted: float | None, bound: float | None) -> str:
    """A finding's gain, one way everywhere: ``predicted 1.31x, at most 1.53x``; ``up to 1.53x``
    without a prediction; and where the replay predicts more than the bound (the bound counts
    the finding's own share alone, the change may do more: compile fuses and removes launches),
    ``predicted 2.98x (its share alone: 2.53x)``. Empty when there is neither."""
    if predicted is None:
        return f"up to {bound_text(bound)}" if bound else ""
    if bound and predicted > bound:
        return f"predicted {speedup(predicted)} (its share alone: {bound_text(bound)})"
    return (
        f"predicted {speedup(predicted)}, at most {bound_text(bound)}" if bound else f"predicted {speedup(predicted)}"
    )


def unsure_words(
    reasons: Sequence[str],
    rule: str,
    knobs: Mapping[str, Any] | None,
    world_size: int | None = None,
    tried: str | None = None,
) -> str:
    """A finding's unsure line, one way everywhere, saying what would measure it: ``diagnose run``'s
    check where one of its knobs applies the change in one process; ``diagnose verify`` under
    torchrun for a distributed run (its check would be a whole job: it measures nothing in-run);
    and where no knob applies the change (DATA007's loading code, a straggler's disk), that the
    change is the user's to make before a second run can measure it. ``tried``: what the run's
    check met when it tried the finding and could not measure it (a compiled model's first steps
    can outlast the check's budget)."""
    why = f"unsure ({'; '.join(reasons)})"
    if not any(value not in ("", "n/a") for value in (knobs or {}).values()):  # as experiments.check_candidates
        return f"{why}: no knob applies this change; make it and run diagnose again to measure it"
    if tried and not (world_size is not None and world_size > 1):  # a distributed run's check tried nothing
        return (
            f"{why}: diagnose run's check tried it and could not measure it ({tried}); "
            f"--check-budget SECONDS gives it longer, diagnose verify --rule {rule} measures it apart"
        )
    return f"{why}: {what_measures(rule, world_size)}"


def what_measures(rule: str, world_size: int | None = None) -> str:
    """What measures a finding whose change a knob applies: ``diagnose run``'s check in one
    process, ``diagnose verify`` under torchrun for a distributed run (its check would be a whole
    job: it measures nothing in-run)."""
    if world_size is not None and world_size > 1:
        return (
            f"diagnose verify --nproc-per-node N --rule {rule} measures it (a distributed run measures nothing in-run)"
        )
    return "diagnose run measures it (--check N)"


def ms(value: float) -> str:
    """Milliseconds with as many decimals as the size warrants: ``120 ms``, ``12.3 ms``, ``0.125 ms``."""
    digits = 0 if value >= 100 else 1 if value >= 10 else 2 if value >= 1 else 3
    return f"{value:.{digits}f} ms"


def rate(value: float) -> str:
    """A throughput: thousands separated from 100 up (``1,800``), two decimals under (``12.50``)."""
    return f"{value:,.0f}" if value >= 100 or value == 0 else f"{value:.2f}"


#: counts from a million up are written in words (``1.19 billion``): digits there are unreadable
_COUNT_WORDS = (("trillion", 1e12), ("billion", 1e9), ("million", 1e6))


def count(value: float) -> str:
    """A count or a figure (samples, kernels, FLOP/byte): whole numbers with thousands separated
    (``123,456``), from a million up in words (``1.19 billion``, never ``1.19451e+09``), a
    fraction to three significant digits (``2.5``, ``0.125``)."""
    for word, scale in _COUNT_WORDS:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {word}"
    if float(value).is_integer() or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def plain(value: Any) -> str:
    """Any recorded setting: ``—`` for none, six significant digits, lists and dicts joined."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e6 and value.is_integer() else f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(plain(v) for v in value) or "—"
    if isinstance(value, dict):
        return ", ".join(f"{k}={plain(v)}" for k, v in value.items()) or "—"
    return str(value)


def format_value(value: float | None, spec: str | None, unit: str = "") -> str:
    """A symptom for people: ``spec`` ``%`` percent, ``x`` a factor, ``bytes`` scaled, or a
    format spec (``.1f``); without one, the symptom's unit decides."""
    if value is None:
        return "n/a"
    spec = spec or ""
    if spec == "%" or (not spec and unit == "share"):
        return percent(value, 0)
    if spec == "x":
        return speedup(value)
    if spec == "bytes" or (not spec and unit == "bytes"):
        return human_bytes(value)
    if spec:
        try:
            return format(value, spec)
        except ValueError:
            return str(value)
    if unit == "us":
        return f"{value:.1f} µs"
    if unit == "ms":
        return f"{value:.1f} ms"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "GB":
        return f"{value:.1f} GB"
    if unit == "GB/s":
        return f"{value:.1f} GB/s"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.2f}"
