"""The words a comparison is written in, shared by its terminal and JSON renderer
(``comparison.py``), its HTML page (``html/comparison.py``) and its TensorBoard events
(``comparison_events.py``): the rate's unit, a change in points, a speedup, the findings that came
and went, the mean step with its spread. Pure functions of the ``Comparison``'s values.
"""

from __future__ import annotations

from diagnose.analysis.compare import RunColumn
from diagnose.units import ms, spread_ms


def rate_words(rate_key: str) -> str:
    return "samples/s" if rate_key == "samples_per_s" else "steps/s"


def signed_points(delta: float | None) -> str:
    """A change of share in percentage points: "+12.0 pt", "-61.0 pt", "" for none."""
    if delta is None:
        return ""
    if abs(delta) < 0.0005:
        return "±0"
    return f"{delta * 100:+.1f} pt"


def speedup_text(speedup: float | None) -> str:
    return "" if speedup is None else f"{speedup:.2f}x"


def findings_change(run: RunColumn, after_word: str = "") -> str:
    """What changed in a run's findings against the baseline: ``gone X; new Y; still Z``
    (``after_word`` follows each word: the HTML table writes ``gone: X``)."""
    kept = [r for r in run.findings if r not in run.appeared]
    parts = [
        f"{word}{after_word} " + ", ".join(rules)
        for word, rules in (("gone", run.disappeared), ("new", run.appeared), ("still", kept))
        if rules
    ]
    return "; ".join(parts) or "none, as in the baseline"


def step_text(run: RunColumn) -> str:
    """The mean step and its p10-p90, as verify and sweep write them."""
    if run.mean_step_ms is None:
        return "—"
    if run.p10_step_ms is None or run.p90_step_ms is None:
        return ms(run.mean_step_ms)
    return f"{ms(run.mean_step_ms)} ({spread_ms(run.p10_step_ms, run.p90_step_ms, 1)})"
