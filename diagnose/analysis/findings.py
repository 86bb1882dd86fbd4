"""Stage 7: fire the rules on the symptoms, quote the evidence, rank by the predicted gain.

Contract: ``diagnose_symptoms(rules, symptoms, predictor=None) -> Diagnosis``; pure.

A finding's gain bound is the most its fix can give (for removing an exposed share s:
1 / (1 - s)). Where the rule names a transformation (``predict``) and the run's step replays
(diagnose.analysis.replay), the finding also carries the predicted speedup: the step's model
changed as the fix would change it, replayed. Findings rank by the prediction where there is
one, else by the bound. Findings whose bound is under ``MIN_GAIN`` are dropped; those predicted
to gain less than the run-to-run spread (or ``MIN_GAIN``) are left out with one line saying so.
A rule whose conditions hold is dropped too when a rule that supersedes it fires (one cause, one
finding); the Diagnosis records which rule spoke instead. "next" rules (what to try when nothing is wrong) are shown only when no problem fired.

Under a training framework (the ``framework.*`` symptoms) a finding's change is the rule's text
for that framework where it has one, and its ``where`` line starts at the user's framework
object (``lines.framework``: the Trainer, TrainingArguments or Accelerator, and the user's
``training_step``), not at the ``.fit()``/``.train()`` call the samples land on.

Each rule's conditions are also evaluated at the edges of its symptoms' step-to-step spread
(``Symptom.low``/``high``, the p10 and p90 of the steps): a finding that would not fire at one
edge is ``borderline`` (it says so, naming the symptoms), and a rule that did not fire but would
at one edge is a near miss (``Diagnosis.borderline``, one line each). Outside that band the same
script gives the same verdict twice; inside it, a rerun may differ, and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnose.analysis.predict import Prediction, PredictionRequest, Predictor
from diagnose.analysis.rules import Rule, cpu_only_run, render_template, template_names
from diagnose.analysis.symptoms import CATALOG
from diagnose.analysis.symptoms import Symptoms
from diagnose.units import format_value
from diagnose.record import FRAMEWORKS

#: A fix that cannot make the step at least this much faster is not worth a user's time.
MIN_GAIN = 1.03
#: How much the steady step of the same script moves from one run to the next, beyond what one
#: run's own step spread shows: the median coefficient of variation of the steady step over 22
#: planted and framework examples, 5 runs each, on an H200 (benchmarks/flip_rate.py, 2026-11-23;
#: GPU-bound loops under 1%, host-bound ones 4-20%: implicit_syncs 14%, whose runs' own step
#: spreads were 2-10%). A predicted gain under it cannot be told from a rerun.
RUN_TO_RUN_SPREAD = 0.04
#: A predicted gain within this factor of the gain a change must beat (the floor: the spread, or
#: MIN_GAIN) is borderline: the floor is itself estimated from one run's steps (2% to 10% over
#: five runs of one script) and a prediction near 1x is uncertain by about its own size
#: (docs/truth.md), so a rerun may fall on the other side.
PREDICTION_BAND = 2.0
#: the name a finding's ``borderline`` list gives its predicted gain
PREDICTED_EVIDENCE = "predicted speedup"
#: Findings shown by default (``--all`` shows every one that fired).
DEFAULT_LIMIT = 5


@dataclass
class Evidence:
    name: str
    value: float
    unit: str
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
    #: the training framework whose terms ``do`` is written in (None: plain PyTorch)
    framework: str | None = None
    #: symptoms whose step-to-step spread reaches the rule's threshold: a rerun may not fire it
    borderline: list[str] = field(default_factory=list)
    #: the replayed speedup of the fix (None: no transformation, or the model cannot express it)
    predicted: float | None = None
    prediction_note: str | None = None

    @property
    def expected(self) -> float | None:
        """What the ranking uses: the prediction where there is one, else the bound."""
        return self.predicted if self.predicted is not None else self.gain

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
            "predicted_speedup": None if self.predicted is None else round(self.predicted, 4),
            "prediction_note": self.prediction_note,
            "gain_formula": self.gain_formula,
            # names of symptoms: their values, units and descriptions are the report's ``symptoms``
            "evidence": [e.name for e in self.evidence],
            "references": self.references,
            "knobs": self.knobs,
            "lines": self.lines,
            "framework": self.framework,
            "borderline": self.borderline,
        }


@dataclass
class Diagnosis:
    findings: list[Finding]  # problems, ranked
    next_steps: list[Finding]  # "next" rules, when no problem fired
    dropped: list[str] = field(default_factory=list)  # fired, but the gain bound was too small
    #: fired, but a rule that supersedes it fired too: rule id -> the id of that rule
    superseded: dict[str, str] = field(default_factory=dict)
    #: fired, but predicted to gain less than the spread: one line each, saying so
    considered: list[str] = field(default_factory=list)
    #: the replay check and the prediction settings (``Predictor.to_dict``), when there was one
    replay: dict[str, Any] | None = None
    #: rules that failed while evaluated on this run, one line each: skipped, never fatal
    skipped: list[str] = field(default_factory=list)
    #: rules that did not fire but would at an edge of their symptoms' spread: one line each
    borderline: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.findings


def loop_framework(values: dict[str, float]) -> str | None:
    """The framework the ``framework.<name>`` symptoms say runs the loop."""
    return next((name for name in FRAMEWORKS if values.get(f"framework.{name}") == 1), None)


def make_finding(rule: Rule, symptoms: Symptoms) -> Finding:
    values = symptoms.values_by_name()
    cpu_only = cpu_only_run(values)
    texts = rule.texts(cpu_only, values)  # [already]'s words where the script has the setting on
    do, framework = rule.do_for(loop_framework(values), cpu_only, values)
    lines = symptoms.texts.get(rule.quote) if rule.quote else None
    if framework is not None and symptoms.texts.get("lines.framework"):
        lines = "; ".join(x for x in (symptoms.texts["lines.framework"], lines) if x)
    gain = rule.gain(values)
    extra = {"gain": format_value(gain, "x") if gain is not None else "n/a", **symptoms.texts}
    evidence = []
    for name in rule.evidence:
        s = symptoms.get(name)
        if s is not None:
            evidence.append(Evidence(name, s.value, s.unit, s.description))
    return Finding(
        rule_id=rule.id,
        title=texts.title,
        category=rule.category,
        kind=rule.kind,
        says=render_template(texts.says, values, extra),
        do=render_template(do, values, extra),
        why=texts.why,
        gain=gain,
        gain_formula=rule.gain_text,
        evidence=evidence,
        references=list(rule.references),
        knobs=rule_knobs(rule, values, symptoms.texts),
        lines=lines,
        framework=framework,
    )


def rule_knobs(rule: Rule, values: dict[str, float], texts: dict[str, str]) -> dict[str, str]:
    """The rule's knobs with their values filled in; a knob whose value comes from source lines
    this run did not record (``{lines.sync_sites}`` in a bare trace) is left out."""
    out = {}
    for name, template in rule.knobs.items():
        if any(CATALOG.get(n, ("",))[0] == "text" and not texts.get(n) for n in template_names(template)):
            continue
        out[name] = render_template(template, values, texts)
    return out


def flips_within_spread(rule: Rule, values: dict[str, float], spreads: dict[str, tuple[float, float]]) -> list[str]:
    """The symptoms of ``rule``'s conditions that, moved to either edge of their step-to-step
    spread (one at a time, then all of them to the same side), change whether it fires."""
    names = sorted(n for n in rule.condition_names() if n in spreads)
    if not names:
        return []
    fires = rule.fires(values)
    flipping = [n for n in names if any(rule.fires({**values, n: edge}) != fires for edge in spreads[n])]
    if not flipping:
        for side in (0, 1):
            if rule.fires({**values, **{n: spreads[n][side] for n in names}}) != fires:
                return names
    return flipping


def _spread_text(names: list[str], symptoms: Symptoms) -> str:
    parts = []
    for name in names:
        s = symptoms[name]
        low, high = s.spread or (s.value, s.value)
        parts.append(f"{name} {format_value(low, None, s.unit)}–{format_value(high, None, s.unit)}")
    return ", ".join(parts)


def _rank_key(f: Finding) -> tuple[int, float]:
    expected = f.expected
    return (0, -expected) if expected is not None else (1, 0.0)


def superseded_by(fired: list[Rule]) -> dict[str, str]:
    """Among rules whose conditions hold: rule id -> the first fired rule that supersedes it."""
    out: dict[str, str] = {}
    for rule in fired:
        for other in rule.supersedes:
            out.setdefault(other, rule.id)
    return {rule.id: out[rule.id] for rule in fired if rule.id in out}


def _predict(finding: Finding, rule: Rule, outcome: Prediction | Exception) -> None:
    """Put a rule's prediction (or why there is none) on its finding."""
    if isinstance(outcome, Exception):  # the finding stands on its bound
        finding.predicted = None
        finding.prediction_note = f"{rule.predict}: not predicted ({type(outcome).__name__}: {str(outcome)[:200]})"
        return
    finding.prediction_note = f"{rule.predict}: {outcome.note}"
    if outcome.speedup is not None:
        # not capped at the bound: the bound counts the finding's own share alone, and the
        # change may do more (compile also removes launches; more workers also pin and keep
        # them). On the H200 six of sixteen measured gains were above their bound; on the H100
        # fixture the HF Trainer's DATA001 replayed 3.18x, was capped at its 2.65x bound, and
        # measured 3.98x.
        finding.predicted = outcome.speedup


def diagnose_symptoms(rules: list[Rule], symptoms: Symptoms, predictor: Predictor | None = None) -> Diagnosis:
    values = symptoms.values_by_name()
    problems: list[Finding] = []
    nexts: list[Finding] = []
    dropped: list[str] = []
    considered: list[str] = []
    skipped: list[str] = []
    floor = max(MIN_GAIN - 1, predictor.spread, RUN_TO_RUN_SPREAD) if predictor is not None else MIN_GAIN - 1
    spreads = symptoms.spreads()

    def skip(rule: Rule, exc: Exception) -> None:
        # rule files are checked at load time; what still fails on this run's values costs
        # that rule its finding, never the report
        skipped.append(f"rule {rule.id} ({rule.source.name}) was skipped: {type(exc).__name__}: {str(exc)[:200]}")

    fired = []
    for rule in rules:
        try:
            if rule.fires(values):
                fired.append(rule)
        except Exception as exc:  # noqa: BLE001 - see skip()
            skip(rule, exc)
    superseded = superseded_by(fired)
    fired_ids = {rule.id for rule in fired}
    near_misses = []
    for rule in rules:
        if rule.kind == "problem" and rule.id not in fired_ids:
            try:
                flipping = flips_within_spread(rule, values, spreads)
            except Exception:  # noqa: BLE001 - a rule that fails on this run was skipped above
                continue
            if flipping:
                near_misses.append(
                    f"borderline: {rule.id} ({rule.texts(cpu_only_run(values)).title}) did not fire, but would within the steps' spread of "
                    f"{_spread_text(flipping, symptoms)}"
                )
    made: list[tuple[Rule, Finding]] = []
    for rule in fired:
        if rule.id in superseded:
            continue
        try:
            finding = make_finding(rule, symptoms)
        except Exception as exc:  # noqa: BLE001 - see skip()
            skip(rule, exc)
            continue
        finding.borderline = flips_within_spread(rule, values, spreads)
        if finding.gain is not None and finding.gain < MIN_GAIN:
            dropped.append(rule.id)
            continue
        made.append((rule, finding))
    if predictor is not None:  # every prediction at once: side by side on a large model
        asked: list[tuple[Rule, Finding, PredictionRequest | Exception]] = []
        for rule, finding in made:
            if rule.predict is not None:
                try:
                    asked.append((rule, finding, (rule.predict, values, rule.prediction_params(values))))
                except Exception as exc:  # noqa: BLE001 - the finding stands on its bound
                    asked.append((rule, finding, exc))
        requests = [request for _, _, request in asked if not isinstance(request, Exception)]
        outcomes = iter(predictor.predict_all(requests))
        for rule, finding, request in asked:
            _predict(finding, rule, request if isinstance(request, Exception) else next(outcomes))
    for rule, finding in made:
        near = finding.predicted is not None and floor / PREDICTION_BAND <= finding.predicted - 1 <= floor * PREDICTION_BAND
        if finding.predicted is not None and finding.predicted < 1 + floor:
            why = (
                "slower than the step as it is"
                if finding.predicted < 1 / (1 + floor)
                else f"within the {predictor.spread:.0%} step-to-step spread"
                if predictor is not None and predictor.spread >= max(MIN_GAIN - 1, RUN_TO_RUN_SPREAD)
                else f"within the {RUN_TO_RUN_SPREAD:.0%} a rerun moves the step"
                if predictor is not None and RUN_TO_RUN_SPREAD > MIN_GAIN - 1
                else f"under the {MIN_GAIN - 1:.0%} worth a change"
            )
            considered.append(f"considered {rule.id}: predicted {finding.predicted:.2f}x, {why}")
            if near and rule.kind == "problem":
                near_misses.append(
                    f"borderline: {rule.id} ({rule.texts(cpu_only_run(values)).title}) was left out at a predicted "
                    f"{finding.predicted:.2f}x, within a factor {PREDICTION_BAND:g} of the {1 + floor:.2f}x a change must beat; a rerun may show it"
                )
            continue
        if near:
            finding.borderline = [*finding.borderline, PREDICTED_EVIDENCE]
        (problems if rule.kind == "problem" else nexts).append(finding)
    problems.sort(key=_rank_key)
    nexts.sort(key=_rank_key)
    return Diagnosis(
        findings=problems,
        next_steps=[] if problems else nexts,
        dropped=dropped,
        superseded=superseded,
        considered=considered,
        replay=predictor.to_dict() if predictor is not None else None,
        skipped=skipped,
        borderline=near_misses,
    )
