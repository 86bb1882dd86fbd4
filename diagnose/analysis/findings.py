"""Stage 7: fire the rules on the symptoms, quote the evidence, rank by the bound on the gain.

Contract: ``diagnose_symptoms(rules, symptoms) -> Diagnosis``; pure.

A finding's gain is the most its fix can give (for removing an exposed share s: 1 / (1 - s)):
an upper bound, not a promise; ``diagnose verify`` measures the real one. Findings whose bound
is under ``MIN_GAIN`` are dropped: a recommendation that cannot help noticeably is not printed.
A rule whose conditions hold is dropped too when a rule that supersedes it fires (one cause, one
finding); the Diagnosis records which rule spoke instead. "next" rules (what to try when nothing is wrong) are shown only when no problem fired.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnose.analysis.rules import Rule, format_value, render_template
from diagnose.analysis.symptoms import Symptoms

#: A fix that cannot make the step at least this much faster is not worth a user's time.
MIN_GAIN = 1.03
#: Findings shown by default (``--all`` shows every one that fired).
DEFAULT_LIMIT = 5


@dataclass
class Evidence:
    name: str
    value: float
    unit: str
    text: str
    description: str


@dataclass
class Finding:
    rule_id: str
    title: str
    category: str
    kind: str
    says: str
    do: str
    why: str
    gain: float | None
    gain_formula: str | None
    evidence: list[Evidence]
    references: list[str]
    knobs: dict[str, str]
    lines: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule_id,
            "title": self.title,
            "category": self.category,
            "kind": self.kind,
            "says": self.says,
            "do": self.do,
            "why": self.why,
            "gain_bound": None if self.gain is None else round(self.gain, 4),
            "gain_formula": self.gain_formula,
            "evidence": [
                {"symptom": e.name, "value": e.value, "unit": e.unit, "text": e.text} for e in self.evidence
            ],
            "references": self.references,
            "knobs": self.knobs,
            "lines": self.lines,
        }


@dataclass
class Diagnosis:
    findings: list[Finding]  # problems, ranked
    next_steps: list[Finding]  # "next" rules, when no problem fired
    dropped: list[str] = field(default_factory=list)  # fired, but the gain bound was too small
    #: fired, but a rule that supersedes it fired too: rule id -> the id of that rule
    superseded: dict[str, str] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not self.findings


def make_finding(rule: Rule, symptoms: Symptoms) -> Finding:
    values = symptoms.values_by_name()
    gain = rule.gain(values)
    extra = {"gain": format_value(gain, "x") if gain is not None else "n/a", **symptoms.texts}
    evidence = []
    for name in rule.evidence:
        s = symptoms.get(name)
        if s is not None:
            evidence.append(Evidence(name, s.value, s.unit, format_value(s.value, None, s.unit), s.description))
    return Finding(
        rule_id=rule.id,
        title=rule.title,
        category=rule.category,
        kind=rule.kind,
        says=render_template(rule.says, values, extra),
        do=render_template(rule.do, values, extra),
        why=rule.why,
        gain=gain,
        gain_formula=rule.gain_text,
        evidence=evidence,
        references=list(rule.references),
        knobs={k: render_template(v, values) for k, v in rule.knobs.items()},
        lines=symptoms.texts.get(rule.quote) if rule.quote else None,
    )


def _rank_key(f: Finding) -> tuple[int, float]:
    return (0, -f.gain) if f.gain is not None else (1, 0.0)


def superseded_by(fired: list[Rule]) -> dict[str, str]:
    """Among rules whose conditions hold: rule id -> the first fired rule that supersedes it."""
    out: dict[str, str] = {}
    for rule in fired:
        for other in rule.supersedes:
            out.setdefault(other, rule.id)
    return {rule.id: out[rule.id] for rule in fired if rule.id in out}


def diagnose_symptoms(rules: list[Rule], symptoms: Symptoms) -> Diagnosis:
    values = symptoms.values_by_name()
    problems: list[Finding] = []
    nexts: list[Finding] = []
    dropped: list[str] = []
    fired = [rule for rule in rules if rule.fires(values)]
    superseded = superseded_by(fired)
    for rule in fired:
        if rule.id in superseded:
            continue
        finding = make_finding(rule, symptoms)
        if finding.gain is not None and finding.gain < MIN_GAIN:
            dropped.append(rule.id)
            continue
        (problems if rule.kind == "problem" else nexts).append(finding)
    problems.sort(key=_rank_key)
    nexts.sort(key=_rank_key)
    return Diagnosis(findings=problems, next_steps=[] if problems else nexts, dropped=dropped, superseded=superseded)
