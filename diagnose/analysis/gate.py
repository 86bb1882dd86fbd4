"""The CI gate: ``--fail-on`` conditions checked against a report (docs/ci.md).

Contract: ``parse_condition(text) -> Condition`` (a ``UsageError`` for one it cannot read),
``resolve_names(conditions, rules) -> list[Condition]`` (each rule id and category checked
against the rules loaded, spelled as they spell it; a ``UsageError`` listing the valid ones for
any other: a typo must never turn a CI gate off) and ``check(report, conditions, baseline=None)
-> list[str]``: one line per condition that holds, empty when the gate passes. Pure; no files.

The conditions:

* ``DATA001`` or ``rule:DATA001``: that rule fired (a finding in the report; pass ``--all`` so
  that findings past the top five are in it);
* ``category:data``: a finding of that category fired (``diagnose rules`` lists categories);
* ``any``: any finding fired;
* ``throughput<1200``: the run's throughput is below 1200 (samples/s when the run counted
  samples, else steps/s; steady, else profiled);
* ``throughput<baseline``: below the baseline run's (``--baseline PATH``, or the first run of
  ``diagnose compare``), in the figure both runs have;
* either bound with a tolerance: ``throughput<baseline-5%``, ``throughput<1200-5%``: below the
  bound by more than 5%.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from diagnose.analysis.compare import rate_key_for, throughput_of, window_for
from diagnose.errors import UsageError
from diagnose.report import Report

_RULE_ID = re.compile(r"^[A-Z][A-Z0-9]*\d{3}$", re.IGNORECASE)
_THROUGHPUT = re.compile(
    r"^throughput\s*<\s*(?P<bound>baseline|\d+(?:\.\d+)?)\s*(?:-\s*(?P<tolerance>\d+(?:\.\d+)?)\s*%)?$"
)


@dataclass(frozen=True)
class Condition:
    text: str  # as given
    kind: str  # "rule", "category", "any", "throughput"
    value: str = ""  # the rule id or category
    bound: float | None = None  # throughput below this number; None with "baseline"
    tolerance: float = 0.0  # a fraction: 0.05 for 5%

    @property
    def needs_baseline(self) -> bool:
        return self.kind == "throughput" and self.bound is None


def parse_condition(text: str) -> Condition:
    spec = text.strip()
    if spec == "any":
        return Condition(text, "any")
    if spec.startswith("rule:") or _RULE_ID.match(spec):
        rule = spec.removeprefix("rule:").strip()
        if not _RULE_ID.match(rule):
            raise UsageError(
                f"--fail-on {text!r}: {rule!r} is not a rule id",
                hint="rule ids look like DATA001 (diagnose rules lists them)",
            )
        return Condition(text, "rule", rule)
    if spec.startswith("category:"):
        category = spec.removeprefix("category:").strip()
        if not category:
            raise UsageError(f"--fail-on {text!r}: name a category, e.g. category:data")
        return Condition(text, "category", category)
    match = _THROUGHPUT.match(spec)
    if match:
        bound = match.group("bound")
        tolerance = float(match.group("tolerance") or 0) / 100
        return Condition(text, "throughput", bound=None if bound == "baseline" else float(bound), tolerance=tolerance)
    raise UsageError(
        f"--fail-on {text!r}: not a condition",
        hint="one of: DATA001, rule:DATA001, category:data, any, throughput<1200, throughput<baseline-5%",
    )


class NamedRule(Protocol):
    """What the gate needs of a loaded rule (analysis.verdict.rules.Rule, a frozen value)."""

    @property
    def id(self) -> str: ...

    @property
    def category(self) -> str: ...


def resolve_names(conditions: Sequence[Condition], rules: Iterable[NamedRule]) -> list[Condition]:
    """The conditions with each rule id and category spelled as the rules spell it (``data001``
    is DATA001, ``category:DATA`` is data); a ``UsageError`` naming the valid ones for a rule id
    or category that no rule has, which would otherwise never hold."""
    loaded = list(rules)
    resolved = []
    for condition in conditions:
        if condition.kind == "rule":
            known = sorted({r.id for r in loaded})
            what = "rule id"
        elif condition.kind == "category":
            known = sorted({r.category for r in loaded})
            what = "category"
        else:
            resolved.append(condition)
            continue
        by_folded = {name.casefold(): name for name in known}
        name = by_folded.get(condition.value.casefold())
        if name is None:
            close = difflib.get_close_matches(
                condition.value.upper() if what == "rule id" else condition.value.lower(), known, n=1
            )
            raise UsageError(
                f"--fail-on {condition.text!r}: no rule has the {what} {condition.value!r}"
                + (f" (did you mean {close[0]}?)" if close else ""),
                hint=f"{what}s: {', '.join(known)} (diagnose rules lists them; --rules adds your own)",
            )
        resolved.append(replace(condition, value=name))
    return resolved


def check(report: Report, conditions: list[Condition], baseline: Report | None = None) -> list[str]:
    """The conditions that hold for ``report``, one line each saying why."""
    failures = []
    fired = report.findings
    for condition in conditions:
        if condition.kind == "any" and fired:
            failures.append(f"{condition.text}: {', '.join(f.rule for f in fired)} fired")
        elif condition.kind == "rule" and any(f.rule == condition.value for f in fired):
            failures.append(f"{condition.text}: {condition.value} fired")
        elif condition.kind == "category":
            rules = [f.rule for f in fired if f.category == condition.value]
            if rules:
                failures.append(f"{condition.text}: {', '.join(rules)} fired")
        elif condition.kind == "throughput":
            line = _throughput_failure(report, condition, baseline)
            if line:
                failures.append(line)
    return failures


def _throughput_failure(report: Report, condition: Condition, baseline: Report | None) -> str | None:
    if condition.bound is None:
        if baseline is None:
            raise UsageError(
                f"--fail-on {condition.text!r} needs a baseline run",
                hint="pass --baseline RUN_DIR (compare uses its first run)",
            )
        rate_key = rate_key_for([report, baseline])
        window = window_for([report, baseline], rate_key)  # both in one window: steady, else profiled
        bound = throughput_of(baseline, rate_key, window)
        if bound is None:
            raise UsageError(f"--fail-on {condition.text!r}: the baseline run measured no throughput")
        bound_text = f"the baseline's {bound:,.1f}"
    else:
        rate_key = rate_key_for([report])
        window = None
        bound = condition.bound
        bound_text = f"{bound:,g}"
    unit = rate_key.replace("_per_s", "/s")
    value = throughput_of(report, rate_key, window)
    if value is None:
        return f"{condition.text}: the run measured no throughput"
    limit = bound * (1 - condition.tolerance)
    if value < limit:
        below = 1 - value / bound
        return f"{condition.text}: {value:,.1f} {unit} is {below:.1%} below {bound_text}" + (
            f" (allowed: {condition.tolerance:.0%})" if condition.tolerance else ""
        )
    return None
