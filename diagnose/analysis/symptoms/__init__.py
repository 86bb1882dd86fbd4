"""Stage 5: named symptoms with units, computed from the breakdown and the run record.

Contract: ``compute_symptoms(breakdown, record, meta, ranks) -> Symptoms``; pure, no torch. Rules
read nothing else: every number a rule tests or quotes is a symptom here, with a unit and a
sentence that says what it measures (``diagnose rules --symptoms`` lists them, docs/rules.md too).

Each symptom is declared with its computation (``registry.symptom``) in a small module by
subject; ``CATALOG`` is their names, units and sentences. Symptoms are raw measurements: every
cut-off (how busy is "busy", which compute capability has Tensor Cores) is written in the rule
files, where a reader of the rule sees it. Booleans are 0/1 facts so that the rule grammar stays
arithmetic. A symptom the run could not measure (no DataLoader, a bare trace with no run record)
is absent, and conditions over it are false: a rule never fires on a guess.

May import: ``analysis/trace/``, ``analysis/measure/``, ``diagnose.record``, the ground floor;
never the prediction beside it (neither reads the other), the verdict or the report.
"""

from __future__ import annotations

from types import MappingProxyType

from diagnose.analysis.measure.breakdown import SPREAD_QUANTILES, Breakdown, one_step
from diagnose.analysis.measure.ranks import RankSet
from diagnose.analysis.symptoms import (
    compiled,
    copies,
    dataloader,
    distributed,
    environment,
    evaluation,
    exposed,
    frameworks,
    gpu,
    limits,
    lines,
    memory,
    optimizer,
    syncs,
    wholerun,
)
from diagnose.analysis.symptoms.dataloader import suggest_num_workers
from diagnose.analysis.symptoms.memory import suggest_batch_size
from diagnose.analysis.symptoms.registry import (
    Definition,
    Symptom,
    Symptoms,
    definitions_in,
    evaluate,
    evaluation_order,
)
from diagnose.analysis.trace.timeline import TraceMeta
from diagnose.record import RunRecord

#: the subject modules, in the order their symptoms are listed
MODULES = (
    exposed,
    evaluation,
    gpu,
    copies,
    syncs,
    optimizer,
    dataloader,
    memory,
    limits,
    environment,
    compiled,
    distributed,
    lines,
    frameworks,
    wholerun,
)
#: every declared symptom, in the order of its computation (after the symptoms it uses)
DEFINITIONS: tuple[Definition, ...] = evaluation_order(tuple(d for m in MODULES for d in definitions_in(vars(m))))
#: name -> (unit, description) for every symptom this version computes; the rule loader checks
#: that conditions only name these (a typo in a rule file is an error, not a silent never-fire).
CATALOG = MappingProxyType({d.name: (d.unit, d.description) for d in DEFINITIONS})


def compute_symptoms(
    breakdown: Breakdown | None, record: RunRecord | None, meta: TraceMeta | None = None, ranks: RankSet | None = None
) -> Symptoms:
    """The symptoms of the window; with three profiled steps or more, each also carries its
    step-to-step spread (the same symptom computed on each step alone), which the findings use
    to tell a clear verdict from a borderline one."""
    steps = breakdown if breakdown is not None and breakdown.steps else None
    window = evaluate(DEFINITIONS, _inputs(steps, record, meta, ranks))
    if steps is None or len(steps.steps) < MIN_STEPS_FOR_SPREAD:
        return window
    per_step = [evaluate(DEFINITIONS, _inputs(one_step(steps, i), record, meta, None)) for i in range(len(steps.steps))]
    return window.with_spreads(per_step, SPREAD_QUANTILES)


#: fewer profiled steps than this give no spread worth the name
MIN_STEPS_FOR_SPREAD = 3


def _inputs(
    steps: Breakdown | None, record: RunRecord | None, meta: TraceMeta | None, ranks: RankSet | None
) -> dict[str, object]:
    return {
        "steps": steps,
        "gpu": steps if steps is not None and steps.has_gpu else None,
        "record": record,
        "meta": meta,
        "ranks": ranks,
    }


def symptoms_from_values(values: dict[str, float]) -> Symptoms:
    """Symptoms from bare numbers (rule examples, tests): units come from the catalog."""
    items = {}
    for name, value in values.items():
        unit, description = CATALOG.get(name, ("", ""))
        items[name] = Symptom(name, float(value), unit, description)
    return Symptoms(items)


__all__ = [
    "CATALOG",
    "DEFINITIONS",
    "MODULES",
    "Symptom",
    "Symptoms",
    "compute_symptoms",
    "suggest_batch_size",
    "suggest_num_workers",
    "symptoms_from_values",
]
