"""Stage 7: fire the rules on the symptoms, quote the evidence, rank by the expected gain.

Contract: ``diagnose_symptoms(rules, symptoms, predictor=None, measured=None) -> Diagnosis``; pure.

A finding's gain bound is the most its fix can give (for removing an exposed share s:
1 / (1 - s)). Where the rule names a transformation (``predict``) and the run's step replays
(diagnose.analysis.prediction.replay), the finding also carries the predicted speedup: the step's model
changed as the fix would change it, replayed, with its interval (``uncertainty``: a block
bootstrap over the profiled steps, times what the model cannot see for that transformation).
Where a short A/B measured the fix (``measured``: ``diagnose run``'s check, one fresh run per
experiment through verify's knobs), the measurement stands in for the prediction.

Findings rank in tiers: measured to help first, then predicted (a fix for a category that idles
the GPU most of the step, ``DOMINANT_SHARE``, first among them), then those with the bound alone;
within a tier by the measured, predicted or bounded gain. The ranking's confidence is the share
of resamples in which the top finding stays first (``Diagnosis.ranking``). Findings whose bound
is under ``MIN_GAIN`` are dropped; those predicted to gain less than the floor (the mean step's
uncertainty and the run-to-run term: ``uncertainty.change_floor``; never the spread of single
steps) are left out with one line saying so, except a fix for a dominant category predicted
within the floor, which is measured or shown first with its interval; those measured not to help are left out the same way.
Findings whose prediction is unsure (intervals that overlap at the top, a wide interval, a
transformation the model predicts badly here, no prediction, a dominant category, an unsettled
ranking) say why (``Finding.check``): ``diagnose run`` measures them. Where the top finding is
itself unsure (or none is shown), a fix left out within the floor yet predicted to gain at least
``MIN_GAIN`` is measured too (``ranking.to_check``, after the shown ones): the floor says a
prediction cannot tell, not that the fix does not help, and a measurement that helps ranks first.
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

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from diagnose.analysis.measure.categories import EXPOSED_LABELS, HOST_EXPOSED
from diagnose.analysis.prediction import uncertainty as U
from diagnose.analysis.prediction.predict import Prediction, PredictionRequest, Predictor
from diagnose.analysis.prediction.uncertainty import MIN_GAIN, RUN_TO_RUN_SPREAD  # MIN_GAIN: read from here too
from diagnose.analysis.symptoms import CATALOG, Symptoms
from diagnose.analysis.verdict.rules import Rule, cpu_only_run, render_template, template_names
from diagnose.record import DATALOADER_KNOBS, FRAMEWORKS
from diagnose.units import format_value, measured_words, what_measures

#: An exposed category where the GPU idles (data wait, copies, syncs, host code) over this share
#: of the step: a fix for it is never left out for a small prediction, it is measured or shown
#: first with its interval (issue 32: a JPEG classifier waited 96% of the step for data, and its
#: DATA001, predicted 1.53x, was discarded as within the steps' spread; 15 workers measured 2.02x).
DOMINANT_SHARE = 0.5
#: The top finding counts as settled when it is first in at least this share of the resamples.
SETTLED_SHARE = 0.9
#: An interval whose high end is over this many times its low end is wide: measure the fix.
WIDE_INTERVAL = 1.5
#: The top findings the check considers measuring (``diagnose run --check N`` takes the first N
#: of them that say why).
CHECK_WINDOW = 3
#: A predicted gain within this factor of the gain a change must beat (the floor:
#: ``uncertainty.change_floor``) is borderline: the floor is itself estimated from one run's steps (2% to 10% over
#: five runs of one script) and a prediction near 1x is uncertain by about its own size
#: (docs/truth.md), so a rerun may fall on the other side.
PREDICTION_BAND = 2.0
#: the name a finding's ``borderline`` list gives its predicted gain
PREDICTED_EVIDENCE = "predicted speedup"
#: Findings shown by default (``--all`` shows every one that fired).
DEFAULT_LIMIT = 5


@dataclass(frozen=True)
class Measurement:
    """What a short A/B of a finding's knobs measured (``diagnose run``'s check): the speedup of
    the steady step against the run itself, the relative spread it was judged against, the
    verdict (helped, no effect, slower) and the change as applied."""

    speedup: float
    spread: float
    verdict: str
    change: str = ""
    #: what a rerun of the A/B reads (``uncertainty.INTERVAL``): its spread and the run-to-run
    #: term of each of its two runs (``uncertainty.run_to_run``); set where the findings are ranked
    interval: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "speedup": round(self.speedup, 4),
            "spread": round(self.spread, 4),
            "verdict": self.verdict,
            "change": self.change,
            "interval": None if self.interval is None else [round(v, 4) for v in self.interval],
        }

    @property
    def words(self) -> str:
        """The measurement as the verdict and the renderers word it."""
        return measured_words(self.speedup, self.spread, self.interval)


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
    #: the prediction's ``uncertainty.INTERVAL`` interval (None without a prediction)
    predicted_low: float | None = None
    predicted_high: float | None = None
    #: why the model is known to predict this fix badly on this run (``predict.weakness``)
    weak: str | None = None
    #: the least speedup that weakness allows (``Prediction.floor``; None: not named)
    weak_floor: float | None = None
    #: the most another measure of the run allows (``Prediction.reach``; None: not named)
    weak_reach: float | None = None
    #: what a short A/B measured (None: not measured)
    measured: Measurement | None = None
    #: the share of the resamples in which this finding ranks first
    first_share: float | None = None
    #: why this finding's gain is unsure enough to measure (empty: sure, or measured)
    check: list[str] = field(default_factory=list)
    #: the exposed category over ``DOMINANT_SHARE`` of the step that its fix relieves
    dominant: str | None = None

    @property
    def basis(self) -> str:
        """What the ranking stands on: "measured", "predicted" or "bound"."""
        return "measured" if self.measured is not None else "predicted" if self.predicted is not None else "bound"

    @property
    def expected(self) -> float | None:
        """What the ranking uses: the measurement, else the prediction, else the bound."""
        if self.measured is not None:
            return self.measured.speedup
        return self.predicted if self.predicted is not None else self.gain

    @property
    def tier(self) -> int:
        """0 measured, 1 predicted (or the fix of a dominant category), 2 the bound alone."""
        return 0 if self.measured is not None else 1 if self.predicted is not None or self.dominant else 2

    @property
    def may_slow(self) -> bool:
        """A prediction whose interval reaches below 1x: the change may make the step slower (a
        compile the model knows it predicts badly, ``uncertainty.WEAK_DOWNSIDE_ERROR``). It
        ranks after the predictions of its tier that are sure to help, whatever its point
        estimate; a measurement settles it."""
        return self.measured is None and self.predicted_low is not None and self.predicted_low < 1.0

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.measured is not None:
            m = self.measured
            return (m.speedup * (1 - m.spread), m.speedup * (1 + m.spread))
        if self.predicted_low is not None and self.predicted_high is not None:
            return (self.predicted_low, self.predicted_high)
        return None

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
            "predicted_interval": None
            if self.predicted_low is None
            else [round(self.predicted_low, 4), round(self.predicted_high or 0.0, 4)],
            "prediction_note": self.prediction_note,
            "model_weakness": self.weak,
            "basis": self.basis,
            "measured": None if self.measured is None else self.measured.to_dict(),
            "first_share": None if self.first_share is None else round(self.first_share, 4),
            "check": list(self.check),
            "dominant": self.dominant,
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
    #: how sure the ranking is (``ranking_summary``): the floor, the resampling, the top
    #: finding's share of first places, and the findings to measure
    ranking: dict[str, Any] | None = None

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
    this run did not record (``{lines.sync_sites}`` in a bare trace) is left out, and so is a
    DataLoader knob where no DataLoader fed the profiled steps (``dataloader.present`` 0: the
    script feeds them from its own loader): verify would set it on a loader the steps never
    read and measure the unchanged script. The batch there goes through the script's own batch
    option where its samples were counted by it (``batch.flag``: ``arg.batch_size``). A loader
    that takes whole batches from a batch sampler (``dataloader.batch_sampler``) refuses a
    batch_size: the batch goes through the script's own option where its value is the steps'
    batch (``batch.script_flag``), else there is no knob for it (ENet's segmentation script: its
    larger batch read "not applied" in every check and verify)."""
    out = {}
    no_loader = values.get("dataloader.present") == 0
    fixed = values.get("dataloader.batch_sampler") == 1
    for name, template in rule.knobs.items():
        if no_loader and name == "batch_size" and texts.get("batch.flag"):
            # the script's own batch option counted the steps' samples: the knob reaches it
            name = f"arg.{texts['batch.flag'].lstrip('-')}"
        elif fixed and name == "batch_size":
            if not texts.get("batch.script_flag"):
                continue
            name = f"arg.{texts['batch.script_flag'].lstrip('-')}"
        elif no_loader and name in DATALOADER_KNOBS:
            continue
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


def _rank_key(f: Finding) -> tuple[int, int, int, float]:
    expected = f.expected
    first = 0 if f.dominant and f.measured is None else 1  # a dominant category's fix: first of its tier
    return (f.tier, first, 1 if f.may_slow else 0, -expected if expected is not None else 0.0)


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
    finding.weak = outcome.weak
    finding.weak_floor = outcome.floor
    finding.weak_reach = outcome.reach
    if outcome.speedup is not None:
        # not capped at the bound: the bound counts the finding's own share alone, and the
        # change may do more (compile also removes launches; more workers also pin and keep
        # them). On the H200 six of sixteen measured gains were above their bound; on the H100
        # fixture the HF Trainer's DATA001 replayed 3.18x, was capped at its 2.65x bound, and
        # measured 3.98x.
        finding.predicted = outcome.speedup


def dominant_category(rule: Rule, values: dict[str, float]) -> str | None:
    """The exposed category where the GPU idles over ``DOMINANT_SHARE`` of the step that this
    rule's fix relieves (its transformation's ``uncertainty.TARGET_CATEGORIES``), or None."""
    shares = {c: idle_share(values, c) for c in U.TARGET_CATEGORIES.get(rule.predict or "", ()) if c in HOST_EXPOSED}
    over = [c for c, share in shares.items() if share > DOMINANT_SHARE]
    return max(over, key=shares.__getitem__) if over else None


def idle_share(values: dict[str, float], category: str) -> float:
    """The share of the step the GPU idles for ``category``: the window's exposed share, and for
    the data wait the steady steps' where larger (``data.wait``: measured, or what the workers'
    CPU time implies; a window can take the batches they queued before it)."""
    share = values.get(f"exposed.{category}") or 0.0
    return max(share, values.get("data.wait") or 0.0) if category == "data_wait" else share


def rank_findings(findings: list[Finding], transformations: dict[str, str | None], predictor: Predictor | None) -> None:
    """Put each prediction's interval on it, order ``findings`` (``_rank_key``: a prediction
    whose interval reaches below 1x after those of its tier sure to help), and put each
    finding's share of first places over the resamples on it, in place. ``transformations``: rule id
    -> the transformation its prediction came from."""
    import zlib

    import numpy as np

    if not findings:
        return
    sample = predictor.steps if predictor is not None else U.StepSample(())
    indices = sample.indices() if sample.steps else None
    drawn: list[tuple[Finding, Any]] = []
    for f in findings:  # the intervals first: whether one reaches below 1x orders the findings
        stream = zlib.crc32(f.rule_id.encode())  # a finding's own draws, whatever else fired
        if f.measured is not None:
            values = U.measured_draws(
                f.measured.speedup,
                f.measured.spread,
                sample.resamples,
                stream,
                sample.seed,
                rerun=U.run_to_run(sample.host_share),
            )
            f.measured = replace(f.measured, interval=U.interval(values))
        elif f.predicted is not None:
            name = transformations.get(f.rule_id) or ""
            values = U.resampled_speedups(
                sample,
                f.predicted,
                categories=U.TARGET_CATEGORIES.get(name, ()),
                error=U.model_error(name),
                stream=stream,
                indices=indices,
                downside=U.downside_error(name, weak=bool(f.weak), floor=f.weak_floor, speedup=f.predicted),
                upside=U.upside_error(name, reach=f.weak_reach, speedup=f.predicted),
            )
            f.predicted_low, f.predicted_high = U.interval(values)
        else:
            values = np.full(sample.resamples, f.gain or 1.0)
        drawn.append((f, values))
    drawn.sort(key=lambda pair: _rank_key(pair[0]))
    findings[:] = [f for f, _ in drawn]
    if all(f.tier == 2 for f in findings):  # bounds alone: nothing was resampled
        return
    shares = U.ranking_shares([values for _, values in drawn], [f.tier for f in findings])
    for f, share in zip(findings, shares, strict=True):
        f.first_share = share


def _overlap(a: Finding, b: Finding) -> bool:
    ia, ib = a.interval, b.interval
    return ia is not None and ib is not None and ia[0] <= ib[1] and ib[0] <= ia[1]


def mark_checks(findings: list[Finding], values: dict[str, float]) -> None:
    """Say, on each of the top ``CHECK_WINDOW`` findings not measured yet, why its gain is too
    unsure to stand on (``Finding.check``; empty where it is sure enough)."""
    top_share = findings[0].first_share if findings else None
    for i, f in enumerate(findings[:CHECK_WINDOW]):
        if f.measured is not None:
            continue
        why = []
        if f.dominant:
            why.append(f"{EXPOSED_LABELS[f.dominant].lower()} holds {idle_share(values, f.dominant):.0%} of the step")
        if f.predicted is None:
            why.append("no prediction: the model cannot replay this change here")
        else:
            if f.weak:
                why.append(f"the model predicts this change badly here: {f.weak}")
            if f.may_slow:
                why.append(
                    f"its interval {f.predicted_low:.2f}x-{f.predicted_high or 0.0:.2f}x reaches below 1x: it may make the step slower"
                )
            elif f.predicted_low and f.predicted_high and f.predicted_high > WIDE_INTERVAL * f.predicted_low:
                why.append(f"its interval {f.predicted_low:.2f}x-{f.predicted_high:.2f}x is wide")
        if i < 2 and len(findings) > 1 and findings[1].tier <= 1 and _overlap(findings[0], findings[1]):
            why.append("the top two findings' intervals overlap")
        if i < 2 and len(findings) > 1 and top_share is not None and top_share < SETTLED_SHARE:
            why.append(f"the top finding is first in only {top_share:.0%} of resamples")
        f.check = why


def ranking_summary(
    findings: list[Finding], floor: float, predictor: Predictor | None, also: list[Finding] | None = None
) -> dict[str, Any]:
    """How sure the ranking is, for the report: the resampling, the floor and what it is made of,
    the top finding's share of first places, and the findings to measure (with their knobs): the
    shown ones that say why, then ``also`` (left out within the floor, measured all the same)."""
    sample = predictor.steps if predictor is not None else U.StepSample(())
    top = findings[0] if findings else None
    return {
        **sample.to_dict(),
        "floor": round(floor, 4),
        "mean_uncertainty": None if predictor is None else round(predictor.mean_uncertainty, 4),
        "run_to_run": RUN_TO_RUN_SPREAD,
        # what the intervals take a rerun to move the steady step by, from the steps' host share
        "rerun_spread": round(U.run_to_run(sample.host_share), 4),
        "top": top.rule_id if top else None,
        "basis": top.basis if top else None,
        "first_share": None if top is None or top.first_share is None else round(top.first_share, 4),
        "settled": top is None or len(findings) == 1 or (top.first_share or 0.0) >= SETTLED_SHARE,
        "to_check": [
            {"rule": f.rule_id, "why": f.check, "knobs": f.knobs} for f in [*findings, *(also or [])] if f.check
        ],
    }


def diagnose_symptoms(
    rules: list[Rule],
    symptoms: Symptoms,
    predictor: Predictor | None = None,
    measured: Mapping[str, Measurement] | None = None,
) -> Diagnosis:
    values = symptoms.values_by_name()
    problems: list[Finding] = []
    nexts: list[Finding] = []
    dropped: list[str] = []
    considered: list[str] = []
    skipped: list[str] = []
    # the floor: what the mean of this run's steps and a rerun leave uncertain, not the spread of
    # single steps (a 96% data wait's DATA001, 1.53x, was left out "within the 64% step-to-step
    # spread"; fifteen workers measured 2.02x)
    floor = U.change_floor(predictor.mean_uncertainty) if predictor is not None else MIN_GAIN - 1
    measured = measured or {}
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
    #: left out within the floor but predicted to gain MIN_GAIN or more, with a knob (and the
    #: index of its "considered" line): measured where the top finding is unsure
    within_floor: list[tuple[Finding, int]] = []
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
        finding.dominant = dominant_category(rule, values)
        m = measured.get(rule.id)
        if m is not None:
            finding.measured = m
            if m.verdict != "helped":
                how = (
                    "slower than the step as it is"
                    if m.verdict == "slower"
                    else f"inside the ±{m.spread:.1%} the run's own steady steps move"
                )
                considered.append(f"considered {rule.id}: measured {m.speedup:.2f}x by a short A/B ({m.change}), {how}")
                continue
            (problems if rule.kind == "problem" else nexts).append(finding)
            continue
        near = (
            finding.predicted is not None
            and floor / PREDICTION_BAND <= finding.predicted - 1 <= floor * PREDICTION_BAND
        )
        # a dominant category's fix predicted within the floor stays (to be measured); one
        # predicted slower than the step as it is does not. So does a fix whose replay another
        # measure of the run contradicts, reaching past the floor (``Prediction.reach``: more
        # workers replayed 1.09x where the steady steps' measured wait said 1.53x, measured 2.61x)
        within = finding.predicted is not None and (
            (finding.dominant is not None and finding.predicted >= 1 / (1 + floor))
            or (finding.weak_reach is not None and finding.weak_reach >= 1 + floor)
        )
        if finding.predicted is not None and finding.predicted < 1 + floor and not within:
            uncertainty = predictor.mean_uncertainty if predictor is not None else 0.0
            why = (
                "slower than the step as it is"
                if finding.predicted < 1 / (1 + floor)
                else f"within the ±{floor:.0%} that the mean step's uncertainty (±{uncertainty:.0%}) and a rerun ({RUN_TO_RUN_SPREAD:.0%}) leave"
                if predictor is not None and floor > MIN_GAIN - 1
                else f"under the {MIN_GAIN - 1:.0%} worth a change"
            )
            considered.append(f"considered {rule.id}: predicted {finding.predicted:.2f}x, {why}")
            if finding.predicted >= MIN_GAIN and finding.knobs and rule.kind == "problem":
                within_floor.append((finding, len(considered) - 1))
            if near and rule.kind == "problem":
                near_misses.append(
                    f"borderline: {rule.id} ({rule.texts(cpu_only_run(values)).title}) was left out at a predicted "
                    f"{finding.predicted:.2f}x, within a factor {PREDICTION_BAND:g} of the {1 + floor:.2f}x a change must beat; a rerun may show it"
                )
            continue
        if near:
            finding.borderline = [*finding.borderline, PREDICTED_EVIDENCE]
        (problems if rule.kind == "problem" else nexts).append(finding)
    transformations = {rule.id: rule.predict for rule, _ in made}
    rank_findings(problems, transformations, predictor)
    rank_findings(nexts, transformations, predictor)
    shown = problems or nexts
    mark_checks(shown, values)
    also = []
    if not shown or shown[0].check:  # the top is unsure: what the floor left out may be the fix
        for finding, line in within_floor:
            finding.check = [
                f"predicted {finding.predicted:.2f}x, within the ±{floor:.0%} a change must beat: "
                "only a measurement can tell whether it helps"
            ]
            world = values.get("dist.world_size")
            considered[line] += f"; {what_measures(finding.rule_id, int(world) if world else None)}"
            also.append(finding)
    return Diagnosis(
        findings=problems,
        next_steps=[] if problems else nexts,
        dropped=dropped,
        superseded=superseded,
        considered=considered,
        replay=predictor.to_dict() if predictor is not None else None,
        skipped=skipped,
        borderline=near_misses,
        ranking=ranking_summary(shown, floor, predictor, also),
    )
