"""Stage 6: rules as data. One TOML file per rule in ``rules/``; this module loads and checks them.

Contract: ``load_rules(extra_dirs) -> list[Rule]``; ``Rule.fires(symptoms) -> bool``. A rule is
an id, a title, conditions over symptoms, texts with ``{symptom}`` placeholders, a gain bound, a
knob for ``diagnose verify``, the rules it supersedes (their findings are dropped when it fires:
one cause, one finding) and its own examples that must and must not fire (the test suite runs
them all; docs/rules.md is generated from the files).

``[when]`` takes ``all`` (every condition holds), ``any`` (at least one holds) and ``none`` (no
condition holds: since a missing symptom makes a condition false, ``none`` does not block a rule
over what the run did not measure).

``[do_by_framework]`` holds the change as a user of each training framework writes it
(``lightning``, ``hf_trainer``, ``accelerate``); ``Rule.do_for(framework)`` picks it, with the
plain ``do`` for plain PyTorch and for frameworks the table leaves out.

Why one module: the rule file's format, its checks at load and the condition grammar that reads
it are one contract; a rule's load-time checks and its evaluation must agree field by field.

``[already]`` is for a rule that advises a setting the script may have set already: its
``when`` (conditions that all hold when the setting is on) and the words that then say why the
setting is not enough (any of ``title``, ``says``, ``why``, ``do``; ``Rule.texts(cpu_only,
values)``). A rule whose advice cannot help once the setting is on stays silent instead, through
``[when] none``. An example may say ``already = true`` to check which words it gets.

``[on_cpu]`` holds the words for a run that used no GPU (``gpu.present == 0``): any of
``title``, ``says``, ``why`` and ``do``, each replacing the rule's own on such a run
(``Rule.texts(cpu_only)``). A rule that can fire on a CPU-only run words its texts for either
device, or carries the CPU words here: a CPU run never speaks of a GPU it does not have.

``[[words]]`` holds the words for a kind of run the rule's own texts do not fit: each entry a
``name``, a ``when`` (conditions that all hold on such a run) and any of ``title``, ``says``,
``why``, ``do`` (FSDP1's code where the rule's is FSDP2's: ``when = ["fsdp.version == 1"]``;
the script's own batch size where no DataLoader fed the steps). The first entry whose
conditions hold is the run's case (``Rule.words_for(values)``); it may carry its own
``[words.already]`` table: the ``[already]`` words for that case. An example may say
``words = "name"`` (or ``false``: the rule's own words) to check which case it gets.

Which words a finding shows, each of the four texts on its own, the later winning:

1. the rule's own;
2. ``[on_cpu]``'s, on a CPU-only run (a case's words hold on either device, or its ``when``
   says which: the case is the more specific fact about the run);
3. the run's ``[[words]]`` case;
4. ``[already]``'s, where the setting is on (whatever the case: the setting being on is the
   news), then the case's own ``[words.already]``.

A framework's text (``[do_by_framework]``) replaces ``do`` unless 3 or 4 gave one: those say
the plain code does not fit this run, and a framework's text written for the usual run would
not either. ``[already]`` stays a table of its own rather than a ``[[words]]`` entry: it states a
fact other parts read (``Rule.already_set``: the examples' ``already``, the docs' section), and
its words must beat every case's, which a first-match list cannot say.

Conditions and gains use a small grammar, never ``eval``::

    condition := expr ("<" | "<=" | ">" | ">=" | "==" | "!=") expr
    expr      := term (("+" | "-") term)*
    term      := factor (("*" | "/") factor)*
    factor    := NUMBER | "true" | "false" | SYMPTOM | FUNC "(" expr ("," expr)* ")" | "(" expr ")" | "-" factor
    FUNC      := min | max | ceil | floor

A symptom the run did not measure makes its condition false and its gain unknown.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagnose.analysis.symptoms import CATALOG
from diagnose.errors import RuleError
from diagnose.record import FRAMEWORKS
from diagnose.units import format_value

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RULE_KINDS = ("problem", "next")
#: the texts a rule may word differently for a run that used no GPU (``[on_cpu]``)
DEVICE_TEXT_KEYS = ("title", "says", "why", "do")
_ID_RE = re.compile(r"^[A-Z]{2,8}\d{3}$")


# --- expressions ----------------------------------------------------------------------------------


class MissingSymptom(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


Node = float | str | tuple[Any, ...]  # number, symptom name, or (op, *children)

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
    r"|(?P<op><=|>=|==|!=|[-+*/(),<>]))"
)
_COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12),
    "!=": lambda a, b: not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12),
}


def _rounded(round_fn: Callable[[float], int]) -> Callable[[float], float]:
    """``ceil``/``floor`` that pass infinities and NaN through (``math.ceil`` raises on them)."""
    return lambda x: float(round_fn(x)) if math.isfinite(x) else x


_FUNCS: dict[str, Callable[..., float]] = {
    "min": min,
    "max": max,
    "ceil": _rounded(math.ceil),
    "floor": _rounded(math.floor),
}
#: how many arguments each function takes: (least, most); None is no upper limit
_ARITY: dict[str, tuple[int, int | None]] = {"min": (2, None), "max": (2, None), "ceil": (1, 1), "floor": (1, 1)}
#: parentheses, calls and minus signs nested deeper than this are refused at load time (a
#: recursive evaluation of a deeper tree would exhaust Python's stack)
MAX_NESTING = 32
#: a longer expression is refused too: ``a + a + ...`` builds a tree as deep as it is long
MAX_TOKENS = 256


class ExprError(ValueError):
    pass


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise ExprError(f"unexpected {text[pos:].strip()[:20]!r} in {self.text!r}")
            kind = m.lastgroup or ""
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
            if len(self.tokens) > MAX_TOKENS:
                raise ExprError(f"{self.text[:40]!r}... is longer than {MAX_TOKENS} tokens")
        self.i = 0
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise ExprError(f"{self.text!r} ends too early")
        if value is not None and tok[1] != value:
            raise ExprError(f"expected {value!r} but found {tok[1]!r} in {self.text!r}")
        self.i += 1
        return tok

    def done(self) -> None:
        if self.peek() is not None:
            raise ExprError(f"unexpected {self.peek()[1]!r} in {self.text!r}")  # type: ignore[index]

    def expr(self) -> Node:
        node = self.term()
        while (tok := self.peek()) is not None and tok[1] in "+-" and tok[0] == "op":
            self.take()
            node = (tok[1], node, self.term())
        return node

    def term(self) -> Node:
        node = self.factor()
        while (tok := self.peek()) is not None and tok[1] in ("*", "/"):
            self.take()
            node = (tok[1], node, self.factor())
        return node

    def factor(self) -> Node:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise ExprError(f"{self.text[:40]!r}... nests deeper than {MAX_NESTING} levels")
        try:
            return self._factor()
        finally:
            self.depth -= 1

    def _factor(self) -> Node:
        kind, value = self.take()
        if kind == "num":
            number = float(value)
            if not math.isfinite(number):
                raise ExprError(f"the number {value} is too large in {self.text!r}")
            return number
        if kind == "name":
            if value in ("true", "false"):
                return 1.0 if value == "true" else 0.0
            if value in _FUNCS and (nxt := self.peek()) is not None and nxt[1] == "(":
                self.take("(")
                args = [self.expr()]
                while (tok := self.peek()) is not None and tok[1] == ",":
                    self.take()
                    args.append(self.expr())
                self.take(")")
                least, most = _ARITY[value]
                if len(args) < least or (most is not None and len(args) > most):
                    wanted = f"{least}" if least == most else f"at least {least}"
                    raise ExprError(f"{value}() takes {wanted} argument(s), not {len(args)}, in {self.text!r}")
                return ("call", value, *args)
            return value
        if value == "(":
            node = self.expr()
            self.take(")")
            return node
        if value == "-":
            return ("neg", self.factor())
        raise ExprError(f"unexpected {value!r} in {self.text!r}")


def parse_expr(text: str) -> Node:
    parser = _Parser(text)
    node = parser.expr()
    parser.done()
    return node


def parse_condition(text: str) -> tuple[str, Node, Node]:
    parser = _Parser(text)
    left = parser.expr()
    tok = parser.peek()
    if tok is None or tok[1] not in _COMPARISONS:
        raise ExprError(f"a condition compares two values (<, <=, >, >=, ==, !=): {text!r}")
    parser.take()
    right = parser.expr()
    parser.done()
    return (tok[1], left, right)


def evaluate(node: Node, values: Mapping[str, float]) -> float:
    if isinstance(node, float):
        return node
    if isinstance(node, str):
        if node not in values:
            raise MissingSymptom(node)
        return values[node]
    op = node[0]
    if op == "call":
        return float(_FUNCS[node[1]](*(evaluate(arg, values) for arg in node[2:])))
    if op == "neg":
        return -evaluate(node[1], values)
    a, b = evaluate(node[1], values), evaluate(node[2], values)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return math.inf if a > 0 else -math.inf if a < 0 else math.nan
    return a / b


def names_in(node: Node) -> set[str]:
    if isinstance(node, float):
        return set()
    if isinstance(node, str):
        return {node}
    start = 2 if node[0] == "call" else 1
    out: set[str] = set()
    for child in node[start:]:
        out |= names_in(child)
    return out


# --- text templates -------------------------------------------------------------------------------

#: ``{symptom}``, ``{symptom:spec}``, and either with ``|fallback`` text for runs that lack it
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)(?::([^{}|]*))?(?:\|([^{}]*))?\}")


def render_template(text: str, values: Mapping[str, float], extra: Mapping[str, str] | None = None) -> str:
    """Fill ``{name}`` placeholders; ``extra`` holds text values (source lines, the gain)."""

    def replace(m: re.Match[str]) -> str:
        name, spec, fallback = m.group(1), m.group(2), m.group(3)
        if extra and name in extra:
            return extra[name]
        if name not in values and fallback is not None:
            return fallback
        unit = CATALOG.get(name, ("", ""))[0]
        return format_value(values.get(name), spec, unit)

    return _PLACEHOLDER.sub(replace, text)


#: a format spec of the mini-language for numbers (``>8.2f``, ``,.0f``, ``+.1%``)
_FORMAT_SPEC = re.compile(r"^(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d+)?[,_]?(?:\.(?P<precision>\d+))?[eEfFgGn%]?$")
#: widths and precisions beyond these are refused: ``{x:>1500000000}`` would write 1.5 GB
MAX_FORMAT_WIDTH = 40
MAX_FORMAT_PRECISION = 12


def template_spec_problem(text: str) -> str | None:
    """What is wrong with a template's format specs (None: they are all usable)."""
    for m in _PLACEHOLDER.finditer(text):
        spec = m.group(2)
        if not spec or spec in ("%", "x", "bytes"):
            continue
        parsed = _FORMAT_SPEC.match(spec)
        if parsed is None:
            return f"{{{m.group(1)}:{spec}}}: not a number format (like .1f, >8.2f, %, x or bytes)"
        width, precision = int(parsed.group("width") or 0), int(parsed.group("precision") or 0)
        if width > MAX_FORMAT_WIDTH or precision > MAX_FORMAT_PRECISION:
            return f"{{{m.group(1)}:{spec}}}: width over {MAX_FORMAT_WIDTH} or precision over {MAX_FORMAT_PRECISION}"
        try:
            format(1.5, spec)
        except ValueError as exc:
            return f"{{{m.group(1)}:{spec}}}: {exc}"
    return None


def template_names(text: str) -> set[str]:
    return {m.group(1) for m in _PLACEHOLDER.finditer(text)}


# --- rules ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    text: str
    tree: tuple[str, Node, Node]

    def holds(self, values: Mapping[str, float]) -> bool:
        op, left, right = self.tree
        try:
            return _COMPARISONS[op](evaluate(left, values), evaluate(right, values))
        except MissingSymptom:
            return False


@dataclass(frozen=True)
class Example:
    name: str
    symptoms: dict[str, float]
    fires: bool
    #: whether the rule's ``[already]`` words apply (None: the example does not say)
    already: bool | None = None
    #: the name of the ``[[words]]`` case it gets, or False for none (None: it does not say)
    words: str | bool | None = None


@dataclass(frozen=True)
class Words:
    """One ``[[words]]`` entry: the words for a kind of run (see the module docstring)."""

    name: str
    when: tuple[Condition, ...]
    #: key of DEVICE_TEXT_KEYS -> text, replacing the rule's own on such a run
    texts: Mapping[str, str]
    #: ``[words.already]``: the words where the rule's ``[already]`` setting is on too
    already: Mapping[str, str] = field(default_factory=dict)

    def holds(self, values: Mapping[str, float]) -> bool:
        return all(c.holds(values) for c in self.when)


@dataclass(frozen=True)
class RuleTexts:
    """A rule's words for one kind of run (with a GPU, or CPU only); templates, not yet filled."""

    title: str
    says: str
    why: str
    do: str


def cpu_only_run(values: Mapping[str, float]) -> bool:
    """The run used no GPU: its trace holds no GPU activity (unknown counts as a GPU run, the
    rules' default wording)."""
    return values.get("gpu.present") == 0


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    category: str
    kind: str
    all_of: tuple[Condition, ...]
    any_of: tuple[Condition, ...]
    none_of: tuple[Condition, ...]
    says: str
    do: str
    why: str
    gain_text: str | None
    gain_tree: Node | None
    evidence: tuple[str, ...]
    knobs: dict[str, str]
    references: tuple[str, ...]
    examples: tuple[Example, ...]
    source: Path
    builtin: bool = True
    #: a text symptom (source lines) quoted with the finding
    quote: str | None = None
    #: ids of the rules whose findings this rule's finding replaces when both fire
    supersedes: tuple[str, ...] = ()
    #: the transformation of the replay model that predicts this fix (diagnose.analysis.prediction.predict),
    #: and its parameters: name -> expression over symptoms
    predict: str | None = None
    predict_params: tuple[tuple[str, Node], ...] = ()

    def prediction_params(self, values: Mapping[str, float]) -> dict[str, float]:
        """The ``predict`` parameters for this run (a parameter over a missing symptom is left out)."""
        out = {}
        for name, tree in self.predict_params:
            try:
                out[name] = evaluate(tree, values)
            except MissingSymptom:
                continue
        return out

    #: framework name -> the change as that framework's user makes it
    do_by_framework: Mapping[str, str] = field(default_factory=dict)
    #: the words for a run that used no GPU: key of DEVICE_TEXT_KEYS -> text
    on_cpu: Mapping[str, str] = field(default_factory=dict)
    #: ``[already]``: conditions that hold when the advised setting is on already, and the words
    #: that then say why it is not enough (key of DEVICE_TEXT_KEYS -> text)
    already_when: tuple[Condition, ...] = ()
    already_texts: Mapping[str, str] = field(default_factory=dict)
    #: ``[[words]]``: the words for kinds of run the rule's own do not fit, first match wins
    words: tuple[Words, ...] = ()

    def already_set(self, values: Mapping[str, float] | None) -> bool:
        """The script already does what the rule advises (``[already]``'s conditions hold)."""
        return bool(self.already_when) and values is not None and all(c.holds(values) for c in self.already_when)

    def words_for(self, values: Mapping[str, float] | None) -> Words | None:
        """The run's ``[[words]]`` case: the first entry whose conditions hold (None: none does)."""
        if values is None:
            return None
        return next((w for w in self.words if w.holds(values)), None)

    def _run_words(self, values: Mapping[str, float] | None) -> dict[str, str]:
        """The words the run's values choose (steps 3 and 4 of the module docstring's order)."""
        case = self.words_for(values)
        words = dict(case.texts) if case else {}
        if self.already_set(values):
            words.update(self.already_texts)
            if case:
                words.update(case.already)
        return words

    def texts(self, cpu_only: bool = False, values: Mapping[str, float] | None = None) -> RuleTexts:
        """The rule's title, says, why and do, in the words of a CPU-only run where asked, of
        the run's ``[[words]]`` case, and of ``[already]`` where the run's ``values`` show the
        advised setting on (in that order, the later winning)."""
        words = dict(self.on_cpu) if cpu_only else {}
        words.update(self._run_words(values))
        return RuleTexts(
            title=words.get("title", self.title),
            says=words.get("says", self.says),
            why=words.get("why", self.why),
            do=words.get("do", self.do),
        )

    def fires(self, values: Mapping[str, float]) -> bool:
        """The conditions hold (whether the finding is shown also depends on ``supersedes``)."""
        if not all(c.holds(values) for c in self.all_of):
            return False
        if any(c.holds(values) for c in self.none_of):
            return False
        return not self.any_of or any(c.holds(values) for c in self.any_of)

    def do_for(
        self, framework: str | None, cpu_only: bool = False, values: Mapping[str, float] | None = None
    ) -> tuple[str, str | None]:
        """The change's text for a loop under ``framework``, and the framework whose terms it
        uses (None: the plain PyTorch text, in a CPU-only run's words where asked; the run's
        ``[[words]]`` case's or ``[already]``'s where they word ``do``: the framework's text is
        written for the usual run, and its way to switch a setting on is no news where it is on)."""
        if framework is not None and framework in self.do_by_framework and "do" not in self._run_words(values):
            return self.do_by_framework[framework], framework
        return self.texts(cpu_only, values).do, None

    def condition_names(self) -> set[str]:
        """The symptoms the rule's conditions read."""
        out: set[str] = set()
        for condition in (*self.all_of, *self.any_of, *self.none_of):
            _, left, right = condition.tree
            out |= names_in(left) | names_in(right)
        return out

    def gain(self, values: Mapping[str, float]) -> float | None:
        if self.gain_tree is None:
            return None
        try:
            value = evaluate(self.gain_tree, values)
        except MissingSymptom:
            return None
        if not math.isfinite(value) or value <= 0:
            return None  # an infinite bound (a share of 100%) bounds nothing: unknown, not "infx"
        return value


def builtin_rules_dir() -> Path:
    """``rules/`` beside the package in a checkout, or the copy inside an installed wheel."""
    package = Path(__file__).resolve().parents[2]  # diagnose/, from diagnose/analysis/verdict/rules.py
    for candidate in (package.parent / "rules", package / "_builtin_rules"):
        if candidate.is_dir():
            return candidate
    raise RuleError("the built-in rules folder is missing from this installation", hint="reinstall diagnose")


def load_rules(extra_dirs: list[Path] | None = None, include_builtin: bool = True) -> list[Rule]:
    files: list[tuple[Path, bool]] = []
    if include_builtin:
        files += [(p, True) for p in sorted(builtin_rules_dir().glob("*.toml"))]
    for d in extra_dirs or []:
        d = Path(d)
        if not d.exists():
            raise RuleError(f"rules folder {d} does not exist")
        if d.is_file():
            files.append((d, False))
            continue
        found = sorted(d.glob("*.toml"))
        if not found:
            raise RuleError(f"rules folder {d} holds no .toml rule files")
        files += [(p, False) for p in found]
    rules: list[Rule] = []
    seen: dict[str, Path] = {}
    for path, builtin in files:
        rule = load_rule_file(path, builtin=builtin)
        if rule.id in seen:
            raise RuleError(
                f"{path}:1: rule id {rule.id} is already used by {seen[rule.id]}", hint="ids are never reused"
            )
        seen[rule.id] = path
        rules.append(rule)
    _check_supersedes(rules)
    return rules


def _check_supersedes(rules: list[Rule]) -> None:
    """Every superseded id names a loaded rule, and no two rules supersede each other (both
    findings would be dropped)."""
    by_id = {r.id: r for r in rules}
    for rule in rules:
        line = _line_of(rule.source.read_text(encoding="utf-8"), "supersedes") if rule.supersedes else 1
        for other in rule.supersedes:
            if other not in by_id:
                raise RuleError(
                    f"{rule.source}:{line}: supersedes unknown rule {other!r}", hint="name the id of a loaded rule"
                )
            if rule.id in _superseded_closure(by_id, other):
                raise RuleError(
                    f"{rule.source}:{line}: {rule.id} and {other} supersede each other",
                    hint="one of them speaks, not both",
                )


def _superseded_closure(by_id: dict[str, Rule], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for other in by_id[todo.pop()].supersedes:
            if other in by_id and other not in seen:
                seen.add(other)
                todo.append(other)
    return seen


def _line_of(text: str, needle: str) -> int:
    """1-based line where ``needle`` first appears in the file (for error messages)."""
    index = text.find(needle)
    return text.count("\n", 0, index) + 1 if index >= 0 else 1


def load_rule_file(path: Path, builtin: bool = False) -> Rule:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path}: cannot read the rule file ({exc})") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        line = m.group(1) if m else "1"
        raise RuleError(f"{path}:{line}: not valid TOML: {exc}") from exc

    def fail(problem: str, needle: str | None = None) -> RuleError:
        line = _line_of(text, needle) if needle else 1
        return RuleError(f"{path}:{line}: {problem}", hint="see docs/rules.md for the rule file format")

    known_keys = {
        "id",
        "title",
        "category",
        "kind",
        "when",
        "says",
        "do",
        "why",
        "gain",
        "evidence",
        "knob",
        "references",
        "examples",
        "quote",
        "supersedes",
        "predict",
        "do_by_framework",
        "on_cpu",
        "already",
        "words",
    }
    for key in data:
        if key not in known_keys:
            raise fail(f"unknown key {key!r} (known: {', '.join(sorted(known_keys))})", key)
    for key in ("id", "title", "says", "do", "why"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise fail(f"missing or empty {key!r} (a string)", key if key in data else None)
    rule_id = data["id"]
    if not _ID_RE.match(rule_id):
        raise fail(f"id {rule_id!r} must be letters then three digits, like DATA001", "id")
    kind = data.get("kind", "problem")
    if kind not in RULE_KINDS:
        raise fail(f"kind must be one of {RULE_KINDS}, not {kind!r}", "kind")

    when = data.get("when")
    if not isinstance(when, dict) or not (when.get("all") or when.get("any")):
        raise fail("'when' needs an 'all' or 'any' list of conditions", "when")
    unknown_when = set(when) - {"all", "any", "none"}
    if unknown_when:
        raise fail(f"'when' takes 'all', 'any' and 'none', not {sorted(unknown_when)}", "when")

    def conditions(key: str) -> tuple[Condition, ...]:
        raw = when.get(key, [])
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
            raise fail(f"when.{key} must be a list of condition strings", key)
        return _read_conditions(raw, "", fail)

    all_of, any_of, none_of = conditions("all"), conditions("any"), conditions("none")

    supersedes = data.get("supersedes", [])
    if not isinstance(supersedes, list) or not all(isinstance(x, str) and _ID_RE.match(x) for x in supersedes):
        raise fail('supersedes must be a list of rule ids, like ["DATA006"]', "supersedes")
    if rule_id in supersedes:
        raise fail(f"{rule_id} cannot supersede itself", "supersedes")

    gain_text = data.get("gain")
    gain_tree = None
    if gain_text is not None:
        if not isinstance(gain_text, str):
            raise fail('gain must be an expression string, e.g. "1 / (1 - exposed.data_wait)"', "gain")
        try:
            gain_tree = parse_expr(gain_text)
        except ExprError as exc:
            raise fail(f"bad gain expression: {exc}", gain_text) from exc
        _check_names(names_in(gain_tree), gain_text, fail)

    for key in ("says", "do"):
        _check_names(template_names(data[key]) - {"gain"}, data[key], fail)
        if (problem := template_spec_problem(data[key])) is not None:
            raise fail(f"{key}: {problem}", key)

    do_by_framework = data.get("do_by_framework", {})
    if not isinstance(do_by_framework, dict):
        raise fail(f"do_by_framework must be a table of framework = text ({', '.join(FRAMEWORKS)})", "do_by_framework")
    for framework, text in do_by_framework.items():
        if framework not in FRAMEWORKS:
            raise fail(f"do_by_framework: unknown framework {framework!r} (known: {', '.join(FRAMEWORKS)})", framework)
        if not isinstance(text, str) or not text.strip():
            raise fail(f"do_by_framework.{framework} must be a non-empty string", framework)
        _check_names(template_names(text) - {"gain"}, text, fail)

    on_cpu = data.get("on_cpu", {})
    if not isinstance(on_cpu, dict):
        raise fail(f"on_cpu must be a table of the CPU-only run's texts ({', '.join(DEVICE_TEXT_KEYS)})", "on_cpu")
    _check_texts("on_cpu", on_cpu, fail)

    already_when, already_texts = _read_already(data.get("already"), fail)
    words = _read_words(data.get("words"), bool(already_when), fail)

    evidence = data.get("evidence", [])
    if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
        raise fail("evidence must be a list of symptom names", "evidence")
    _check_names(set(evidence), "evidence", fail)

    knobs = data.get("knob", {})
    if not isinstance(knobs, dict) or not all(isinstance(v, (str, int, float, bool)) for v in knobs.values()):
        raise fail("knob must be a table of knob = value", "knob")
    knobs = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in knobs.items()}
    for value in knobs.values():
        _check_names(template_names(value), value, fail)
        if (problem := template_spec_problem(value)) is not None:
            raise fail(f"knob: {problem}", "knob")

    quote = data.get("quote")
    if quote is not None and (not isinstance(quote, str) or CATALOG.get(quote, ("",))[0] != "text"):
        raise fail(f"quote names a text symptom (lines.sync, lines.data, lines.host_other), not {quote!r}", "quote")

    predict, predict_params = _read_predict(data.get("predict"), fail)

    references = data.get("references", [])
    if not isinstance(references, list) or not all(isinstance(r, str) for r in references):
        raise fail("references must be a list of strings", "references")

    examples = []
    for i, ex in enumerate(data.get("examples", [])):
        if not isinstance(ex, dict) or "symptoms" not in ex or "fires" not in ex:
            raise fail(f"example {i + 1} needs 'symptoms' (a table) and 'fires' (true/false)", "[[examples]]")
        for key in set(ex) - {"name", "symptoms", "fires", "already", "words"}:
            raise fail(
                f"example {i + 1}: unknown key {key!r} (an example has name, symptoms, fires, already, words)", key
            )
        if "already" in ex and (not isinstance(ex["already"], bool) or not already_when):
            raise fail(f"example {i + 1}: already is true or false, in a rule with an [already] table", "already")
        if "words" in ex and ex["words"] is not False and ex["words"] not in {w.name for w in words}:
            known = ", ".join(repr(w.name) for w in words) or "none: the rule has no [[words]]"
            raise fail(f"example {i + 1}: words names a [[words]] entry ({known}) or is false", "words =")
        symptoms = ex["symptoms"]
        if not isinstance(symptoms, dict) or not all(isinstance(v, (int, float, bool)) for v in symptoms.values()):
            raise fail(f"example {i + 1}: symptoms must map names to numbers", "symptoms")
        _check_names(set(symptoms), f"example {i + 1}", fail)
        examples.append(
            Example(
                str(ex.get("name", f"example {i + 1}")),
                {k: float(v) for k, v in symptoms.items()},
                bool(ex["fires"]),
                ex.get("already"),
                ex.get("words"),
            )
        )
    if not any(e.fires for e in examples) or not any(not e.fires for e in examples):
        raise fail(
            "a rule carries at least one example that fires and one that does not", "[[examples]]" if examples else None
        )

    return Rule(
        id=rule_id,
        title=data["title"].strip(),
        category=str(data.get("category", "other")),
        kind=kind,
        all_of=all_of,
        any_of=any_of,
        none_of=none_of,
        says=data["says"].strip(),
        do=data["do"].strip(),
        why=data["why"].strip(),
        gain_text=gain_text,
        gain_tree=gain_tree,
        evidence=tuple(evidence),
        knobs=knobs,
        references=tuple(references),
        examples=tuple(examples),
        source=path,
        builtin=builtin,
        quote=quote,
        supersedes=tuple(supersedes),
        predict=predict,
        predict_params=predict_params,
        do_by_framework={k: v.strip() for k, v in do_by_framework.items()},
        on_cpu={k: v.strip() for k, v in on_cpu.items()},
        already_when=already_when,
        already_texts=already_texts,
        words=words,
    )


def _read_already(
    raw: Any, fail: Callable[[str, str | None], RuleError]
) -> tuple[tuple[Condition, ...], dict[str, str]]:
    """``[already]``: ``when`` (a list of conditions) and the texts that replace the rule's own."""
    if raw is None:
        return (), {}
    if not isinstance(raw, dict) or not isinstance(raw.get("when"), list) or not raw["when"]:
        raise fail(
            "already is a table with 'when' (a list of conditions) and the texts that say why the setting is not enough",
            "already",
        )
    conditions = _read_conditions([str(text) for text in raw["when"]], "already: ", fail)
    texts = {k: v for k, v in raw.items() if k != "when"}
    if not texts:
        raise fail("already: give the words (title, says, why, do) that say why the setting is not enough", "already")
    _check_texts("already", texts, fail)
    return conditions, {k: v.strip() for k, v in texts.items()}


def _read_conditions(
    texts: list[str], where: str, fail: Callable[[str, str | None], RuleError]
) -> tuple[Condition, ...]:
    """Condition strings parsed and checked against the catalog (``[when]``, ``[already]``'s and
    a ``[[words]]`` entry's ``when``); ``where`` starts an error's message."""
    out = []
    for text in texts:
        try:
            tree = parse_condition(text)
        except ExprError as exc:
            raise fail(f"{where}bad condition {text!r}: {exc}", text) from exc
        _check_names(names_in(tree[1]) | names_in(tree[2]), text, fail)
        out.append(Condition(text, tree))
    return tuple(out)


def _read_words(raw: Any, has_already: bool, fail: Callable[[str, str | None], RuleError]) -> tuple[Words, ...]:
    """``[[words]]``: each entry a ``name``, ``when`` (a list of conditions), the texts that
    replace the rule's own on such a run, and optionally ``already`` (a table of texts: the
    rule's ``[already]`` words for that case)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(entry, dict) for entry in raw):
        raise fail("words is an array of tables: [[words]] with name, when and the texts for such a run", "words")
    out: list[Words] = []
    for i, entry in enumerate(raw):
        where = f"words {i + 1}"
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise fail(f'{where}: needs a name (the examples\' words = "name" checks it)', "[[words]]")
        quoted = f'"{name}"'  # where the entry's errors point: its name's line
        if name in {w.name for w in out}:
            raise fail(f"{where}: the name {name!r} is used twice", quoted)
        when = entry.get("when")
        if not isinstance(when, list) or not when or not all(isinstance(c, str) for c in when):
            raise fail(f"{where} ({name}): when is a list of conditions that hold on such a run", quoted)
        conditions = _read_conditions(when, f"{where} ({name}): ", fail)
        texts = {k: v for k, v in entry.items() if k not in ("name", "when", "already")}
        already = entry.get("already", {})
        if not isinstance(already, dict):
            raise fail(f"{where} ({name}): already is a table of texts ([words.already])", quoted)
        if already and not has_already:
            raise fail(f"{where} ({name}): [words.already] words a rule's [already] case; this rule has none", quoted)
        if not texts and not already:
            raise fail(f"{where} ({name}): give the words (title, says, why, do) for such a run", quoted)
        _check_texts(f"words {name!r}", texts, fail, quoted)
        _check_texts(f"words {name!r} already", already, fail, quoted)
        out.append(
            Words(
                name,
                conditions,
                {k: v.strip() for k, v in texts.items()},
                {k: v.strip() for k, v in already.items()},
            )
        )
    return tuple(out)


def _check_texts(
    table: str, texts: dict[str, Any], fail: Callable[[str, str | None], RuleError], needle: str | None = None
) -> None:
    """A table of a rule's words (``[on_cpu]``, ``[already]``, a ``[[words]]`` entry's):
    known keys, non-empty strings, templates over known symptoms. ``needle``: what to find in
    the file for the error's line (the table's name where not given)."""
    needle = needle or table
    for key, text in texts.items():
        if key not in DEVICE_TEXT_KEYS:
            raise fail(f"{table}: unknown key {key!r} (known: {', '.join(DEVICE_TEXT_KEYS)})", needle)
        if not isinstance(text, str) or not text.strip():
            raise fail(f"{table}.{key} must be a non-empty string", needle)
        if key in ("says", "do"):
            _check_names(template_names(text) - {"gain"}, text, fail)
            if (problem := template_spec_problem(text)) is not None:
                raise fail(f"{table}.{key}: {problem}", needle)


def _read_predict(
    raw: Any, fail: Callable[[str, str | None], RuleError]
) -> tuple[str | None, tuple[tuple[str, Node], ...]]:
    """``predict = "name"`` or ``predict = { transform = "name", param = "expression" }``."""
    from diagnose.analysis.prediction.predict import TRANSFORMATIONS

    if raw is None:
        return None, ()
    table = {"transform": raw} if isinstance(raw, str) else raw
    if not isinstance(table, dict) or not isinstance(table.get("transform"), str):
        raise fail("predict is a transformation name, or a table with 'transform' and its parameters", "predict")
    name = table["transform"]
    if name not in TRANSFORMATIONS:
        raise fail(
            f"predict names an unknown transformation {name!r} (known: {', '.join(sorted(TRANSFORMATIONS))})", "predict"
        )
    params = []
    for key, value in table.items():
        if key == "transform":
            continue
        try:
            tree = parse_expr(str(value).lower() if isinstance(value, bool) else str(value))
        except ExprError as exc:
            raise fail(f"bad predict parameter {key}: {exc}", "predict") from exc
        _check_names(names_in(tree), str(value), fail)
        params.append((key, tree))
    return name, tuple(params)


def _check_names(names: set[str], context: str, fail: Callable[[str, str | None], RuleError]) -> None:
    unknown = sorted(n for n in names if n not in CATALOG)
    if unknown:
        hint = _closest(unknown[0])
        raise fail(
            f"unknown symptom {unknown[0]!r}{hint} (diagnose rules --symptoms lists them)",
            unknown[0] if context else None,
        )


def _closest(name: str) -> str:
    import difflib

    match = difflib.get_close_matches(name, list(CATALOG), n=1)
    return f"; did you mean {match[0]!r}?" if match else ""
