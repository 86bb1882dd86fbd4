"""How a symptom is declared, and how the declared symptoms are computed in dependency order.

A symptom is one small unit: a name, a unit, a sentence, and a pure function that computes it.
The function's parameters say what it reads, by name:

* ``steps``: the breakdown, when it holds at least one profiled step;
* ``gpu``: the breakdown, when it holds profiled steps with GPU activity;
* ``record``: the run record (``run.json``);
* ``meta``: what the trace says about the device;
* ``ranks``: the ranks of a distributed run, side by side (``diagnose.analysis.measure.ranks``);
* ``known``: the values of the symptoms named in ``uses``, computed first.

A parameter without a default is required: when that input is missing the symptom is absent. A
parameter that defaults to ``None`` is optional. The function returns a number, a bool (stored
as 0/1), text for a ``text`` symptom, or None when the run does not show it; NaN and infinity
count as None. The order of computation comes from ``uses``, never from where a symptom is
written.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from diagnose.stats import quantile

#: the inputs a symptom function may name, in the order they are documented above
INPUTS = ("steps", "gpu", "record", "meta", "ranks", "known")


@dataclass(frozen=True)
class Definition:
    """One declared symptom: what it is and how it is computed."""

    name: str
    unit: str
    description: str
    compute: Callable[..., Any]
    #: symptoms this one reads (through ``known``); computed before it
    uses: tuple[str, ...] = ()

    @cached_property
    def parameters(self) -> tuple[str, ...]:
        return tuple(inspect.signature(self.compute).parameters)

    @cached_property
    def required(self) -> frozenset[str]:
        params = inspect.signature(self.compute).parameters
        return frozenset(p for p, v in params.items() if v.default is inspect.Parameter.empty and p != "known")


def declare(
    name: str, unit: str, description: str, compute: Callable[..., Any], uses: tuple[str, ...] = ()
) -> Definition:
    """A symptom from a function; checks that the function names only known inputs."""
    params = tuple(inspect.signature(compute).parameters)
    unknown = [p for p in params if p not in INPUTS]
    if unknown:
        raise TypeError(f"symptom {name}: parameter {unknown[0]!r} is not an input ({', '.join(INPUTS)})")
    if bool(uses) != ("known" in params):
        raise TypeError(f"symptom {name}: a symptom that reads others names them in uses= and takes `known`")
    return Definition(name, unit, description, compute, tuple(uses))


def symptom(
    name: str, unit: str, description: str, uses: tuple[str, ...] = ()
) -> Callable[[Callable[..., Any]], Definition]:
    """Decorator form of :func:`declare`: ``@symptom("gpu.busy", "share", "...")``."""

    def wrap(compute: Callable[..., Any]) -> Definition:
        return declare(name, unit, description, compute, uses)

    return wrap


def definitions_in(namespace: Mapping[str, Any]) -> tuple[Definition, ...]:
    """The definitions a module holds, in the order written (tuples of them included)."""
    out: list[Definition] = []
    for value in namespace.values():
        if isinstance(value, Definition):
            out.append(value)
        elif isinstance(value, tuple) and value and all(isinstance(v, Definition) for v in value):
            out.extend(value)
    return tuple(out)


class Known:
    """The values a symptom declared in ``uses``; reading any other one is a programming error."""

    def __init__(self, values: Mapping[str, float], definition: Definition) -> None:
        self._values = values
        self._definition = definition

    def get(self, name: str) -> float | None:
        if name not in self._definition.uses:
            raise KeyError(f"symptom {self._definition.name} reads {name} without naming it in uses=")
        return self._values.get(name)


def evaluation_order(definitions: tuple[Definition, ...]) -> tuple[Definition, ...]:
    """Each symptom after the ones it uses; otherwise in the order declared. Names are unique,
    ``uses`` names declared symptoms, and there is no cycle."""
    by_name: dict[str, Definition] = {}
    for d in definitions:
        if d.name in by_name:
            raise ValueError(f"symptom {d.name} is declared twice")
        by_name[d.name] = d
    for d in definitions:
        for used in d.uses:
            if used not in by_name:
                raise ValueError(f"symptom {d.name} uses {used}, which no module declares")
    ordered: list[Definition] = []
    done: set[str] = set()
    visiting: set[str] = set()

    def visit(d: Definition) -> None:
        if d.name in done:
            return
        if d.name in visiting:
            raise ValueError(f"symptoms depend on each other in a cycle through {d.name}")
        visiting.add(d.name)
        for used in d.uses:
            visit(by_name[used])
        visiting.discard(d.name)
        done.add(d.name)
        ordered.append(d)

    for d in definitions:
        visit(d)
    return tuple(ordered)


@dataclass(frozen=True)
class Symptom:
    name: str
    value: float
    unit: str
    description: str
    #: the value's step-to-step spread: the p10 and p90 of its per-step values, moved to sit
    #: around ``value`` (None when it does not vary from step to step, or was not measured per step)
    low: float | None = None
    high: float | None = None

    @property
    def spread(self) -> tuple[float, float] | None:
        return (self.low, self.high) if self.low is not None and self.high is not None else None


class Symptoms(Mapping[str, Symptom]):
    """Numeric symptoms by name; ``texts`` holds the ``text`` ones (source lines to quote)."""

    def __init__(self, items: dict[str, Symptom], texts: dict[str, str] | None = None) -> None:
        self._items = items
        self.texts = texts or {}

    def __getitem__(self, name: str) -> Symptom:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def values_by_name(self) -> dict[str, float]:
        return {name: s.value for name, s in self._items.items()}

    def spreads(self) -> dict[str, tuple[float, float]]:
        """(low, high) of each symptom that varies from step to step."""
        return {name: s.spread for name, s in self._items.items() if s.spread is not None}

    def with_spreads(self, per_step: list[Symptoms], quantiles: tuple[float, float]) -> Symptoms:
        """These symptoms, each with the spread of its values over ``per_step`` (the same
        symptoms computed on each step alone), centred on this value: low = value - (mean - p10),
        high = value + (p90 - mean). Centred, because the window's value may be calibrated to
        the steady state while the steps are not."""
        items: dict[str, Symptom] = {}
        for name, symptom in self._items.items():
            values = [step[name].value for step in per_step if name in step]
            if len(values) < 2 or max(values) == min(values):
                items[name] = symptom
                continue
            mean = sum(values) / len(values)
            low, high = (quantile(values, q) for q in quantiles)
            # moved, the range may leave the values' own: a share stays within 0-100%, a
            # figure never negative in any step stays at or above 0 (no "73%-103%")
            floor, ceiling = (0.0, 1.0) if symptom.unit == "share" else (0.0 if min(values) >= 0 else None, None)
            items[name] = Symptom(
                name,
                symptom.value,
                symptom.unit,
                symptom.description,
                low=_bounded(symptom.value - (mean - low), floor, ceiling),
                high=_bounded(symptom.value + (high - mean), floor, ceiling),
            )
        return Symptoms(items, self.texts)


def _bounded(value: float, floor: float | None, ceiling: float | None) -> float:
    if floor is not None:
        value = max(value, floor)
    if ceiling is not None:
        value = min(value, ceiling)
    return value


def evaluate(ordered: tuple[Definition, ...], inputs: Mapping[str, Any]) -> Symptoms:
    """Compute ``ordered`` (from :func:`evaluation_order`) over ``inputs`` (keyed as ``INPUTS``)."""
    values: dict[str, float] = {}
    items: dict[str, Symptom] = {}
    texts: dict[str, str] = {}
    for d in ordered:
        if any(inputs.get(p) is None for p in d.required):
            continue
        args = {p: Known(values, d) if p == "known" else inputs.get(p) for p in d.parameters}
        value = d.compute(**args)
        if d.unit == "text":
            if value:
                texts[d.name] = str(value)
            continue
        if value is None:
            continue
        number = float(value)
        if math.isnan(number) or math.isinf(number):
            continue
        values[d.name] = number
        items[d.name] = Symptom(d.name, number, d.unit, d.description)
    return Symptoms(items, texts)
