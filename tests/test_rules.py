"""Every rule's own examples, the condition grammar, malformed rule files, docs/rules.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.analysis.symptoms import CATALOG, symptoms_from_values
from diagnose.analysis.verdict.findings import diagnose_symptoms, superseded_by
from diagnose.analysis.verdict.rules import (
    ExprError,
    evaluate,
    load_rule_file,
    load_rules,
    parse_condition,
    parse_expr,
    render_template,
)
from diagnose.analysis.verdict.rulesdoc import rules_markdown
from diagnose.errors import RuleError
from tests.conftest import REPO

RULES = load_rules()
EXAMPLES = [(rule, ex) for rule in RULES for ex in rule.examples]


@pytest.mark.parametrize(("rule", "example"), EXAMPLES, ids=[f"{r.id}: {e.name}" for r, e in EXAMPLES])
def test_rule_examples(rule, example) -> None:
    """An example fires when the rule's conditions hold and no rule that supersedes it fires."""
    fired = [r for r in RULES if r.fires(example.symptoms)]
    assert (rule in fired and rule.id not in superseded_by(fired)) is example.fires
    if example.already is not None:  # the setting it advises is on: [already]'s words, or not
        assert rule.already_set(example.symptoms) is example.already


def test_a_superseded_finding_is_dropped_and_recorded() -> None:
    by_id = {r.id: r for r in RULES}
    # fp32 everywhere: PREC003's conditions hold too, but PREC001 says what to do
    values = {
        "gpu.compute_capability": 9.0,
        "gpu.fp32_matmul_step_share": 0.7,
        "gpu.fp32_matmul_share": 1.0,
        "gpu.busy": 0.97,
    }
    assert by_id["PREC003"].fires(values)
    diagnosis = diagnose_symptoms([by_id["PREC003"], by_id["PREC001"]], symptoms_from_values(values))
    assert [f.rule_id for f in diagnosis.findings] == ["PREC001"]
    assert diagnosis.superseded == {"PREC003": "PREC001"}
    # alone, PREC003 speaks
    alone = diagnose_symptoms([by_id["PREC003"]], symptoms_from_values(values))
    assert [f.rule_id for f in alone.findings] == ["PREC003"] and alone.superseded == {}


def test_none_conditions_block_only_what_was_measured() -> None:
    (rule,) = [r for r in RULES if r.id == "NEXT001"]
    assert rule.fires({"gpu.busy": 0.9, "model.compiled": 0, "gpu.triton_share": 0.1})
    assert not rule.fires({"gpu.busy": 0.9, "model.compiled": 0, "gpu.triton_share": 0.3})
    assert not rule.fires({"gpu.busy": 0.9, "model.compiled": 1})
    assert rule.fires({"gpu.busy": 0.9})  # nothing says it is compiled


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_firing_examples_render_every_placeholder(rule) -> None:
    for example in rule.examples:
        if example.fires:
            finding = diagnose_symptoms([rule], symptoms_from_values(example.symptoms))
            found = finding.findings + finding.next_steps + [None] * bool(finding.dropped)
            assert found, f"{rule.id} fired but produced no finding"
            if found[0] is not None:
                assert "{" not in found[0].says, found[0].says


def test_the_issue_rule_set_is_there() -> None:
    ids = {r.id for r in RULES}
    assert {
        "DATA001",
        "DATA002",
        "DATA003",
        "DATA004",
        "DATA005",
        "PREC001",
        "LAUNCH001",
        "SYNC001",
        "OPT001",
        "MEM001",
        "MEM002",
        "CONV001",
        "CONV002",
        "DIST001",
        "DIST002",
        "NEXT001",
    } <= ids


def test_docs_rules_md_is_generated_from_the_rule_files() -> None:
    assert (REPO / "docs" / "rules.md").read_text() == rules_markdown(RULES), (
        "run: diagnose rules --markdown > docs/rules.md"
    )


@pytest.mark.parametrize(
    ("text", "values", "expected"),
    [
        ("1 / (1 - exposed.data_wait)", {"exposed.data_wait": 0.5}, 2.0),
        ("min(cpu.count - 1, 8) * 2", {"cpu.count": 4}, 6.0),
        ("-batch.size + 3", {"batch.size": 1}, 2.0),
        ("ceil(2.1) + floor(2.9)", {}, 5.0),
        ("2 * 3 + 4 / 2 - 1", {}, 7.0),
        ("true + false", {}, 1.0),
        ("1e6 / 2", {}, 500000.0),
    ],
)
def test_expression_grammar(text: str, values: dict, expected: float) -> None:
    assert evaluate(parse_expr(text), values) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["1 +", "(1", "1 2", "__import__('os')", "a[0]", "1 ; 2", "exposed.data_wait >= 0.1"])
def test_bad_expressions_are_rejected(bad: str) -> None:
    with pytest.raises(ExprError):
        parse_expr(bad)


def test_condition_needs_a_comparison() -> None:
    assert parse_condition("a.b >= 2")[0] == ">="
    with pytest.raises(ExprError, match="compares"):
        parse_condition("a.b + 2")


def test_missing_symptom_makes_condition_false_and_gain_unknown() -> None:
    (rule,) = [r for r in RULES if r.id == "DATA001"]
    assert not rule.fires({"exposed.data_wait": 0.9})
    assert rule.gain({}) is None


def test_templates_format_units() -> None:
    values = {"exposed.data_wait": 0.4567, "h2d.bytes_per_step": 64e6, "gpu.compute_capability": 9.0}
    text = render_template(
        "{exposed.data_wait:%} {h2d.bytes_per_step} {gpu.compute_capability:.1f} {batch.size}", values
    )
    assert text == "46% 64.0 MB 9.0 n/a"
    assert render_template("{batch.size|unknown} {exposed.data_wait:.2f|-}", values) == "unknown 0.46"


def _rule(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "MY001.toml"
    path.write_text(body)
    return path


VALID = """\
id = "MY001"
title = "t"
says = "s"
do = "d"
why = "w"
[when]
all = ["gpu.busy < 0.5"]
[[examples]]
symptoms = { "gpu.busy" = 0.1 }
fires = true
[[examples]]
symptoms = { "gpu.busy" = 0.9 }
fires = false
"""


@pytest.mark.parametrize(
    ("body", "line", "problem"),
    [
        (
            VALID.replace('all = ["gpu.busy < 0.5"]', 'all = ["gpu.bussy < 0.5"]'),
            7,
            "unknown symptom 'gpu.bussy'; did you mean 'gpu.busy'",
        ),
        (VALID.replace('all = ["gpu.busy < 0.5"]', 'all = ["gpu.busy <"]'), 7, "bad condition"),
        (VALID.replace('title = "t"', 'title = "t'), 2, "not valid TOML"),
        (VALID.replace('id = "MY001"', 'id = "my rule"'), 1, "must be letters then three digits"),
        (VALID.replace('do = "d"\n', ""), 1, "missing or empty 'do'"),
        (VALID.replace("fires = false", "fires = true"), 8, "at least one example that fires and one that does not"),
        (VALID.replace('why = "w"', 'why = "w"\ncolour = "red"'), 6, "unknown key 'colour'"),
        (VALID + "expected = 1\n", 14, "example 2: unknown key 'expected'"),
        (VALID.replace('why = "w"', 'why = "w"\ngain = "1 / (1 - "'), 6, "bad gain expression"),
        (VALID.replace('why = "w"', 'why = "w"\nsupersedes = "DATA001"'), 6, "supersedes must be a list of rule ids"),
        (VALID.replace('why = "w"', 'why = "w"\nsupersedes = ["MY001"]'), 6, "MY001 cannot supersede itself"),
        (VALID.replace("[when]", '[when]\nunless = ["gpu.busy > 2"]'), 6, "'when' takes 'all', 'any' and 'none'"),
        # [already]: the advised setting is on (issue 33)
        (VALID.replace("[when]", '[already]\nsays = "s2"\n[when]'), 6, "already is a table with 'when'"),
        (
            VALID.replace("[when]", '[already]\nwhen = ["dataloader.pin_mem == 1"]\nsays = "s2"\n[when]'),
            7,
            "unknown symptom 'dataloader.pin_mem'",
        ),
        (
            VALID.replace("[when]", '[already]\nwhen = ["dataloader.pin_memory == 1"]\n[when]'),
            6,
            "already: give the words",
        ),
        (
            VALID.replace("[when]", '[already]\nwhen = ["dataloader.pin_memory == 1"]\ncolour = "red"\n[when]'),
            6,
            "already: unknown key 'colour'",
        ),
        (
            VALID.replace("fires = false", "fires = false\nalready = true"),
            14,
            "already is true or false, in a rule with an [already] table",
        ),
    ],
)
def test_malformed_rule_files_name_file_line_and_problem(tmp_path: Path, body: str, line: int, problem: str) -> None:
    path = _rule(tmp_path, body)
    with pytest.raises(RuleError) as info:
        load_rule_file(path)
    message = info.value.message
    assert message.startswith(f"{path}:")
    assert problem in message
    if line > 1:
        assert f"{path}:{line}:" in message, message


def test_user_rules_dir_adds_rules_and_ids_are_never_reused(tmp_path: Path) -> None:
    _rule(tmp_path, VALID)
    assert [r.id for r in load_rules([tmp_path]) if not r.builtin] == ["MY001"]
    (tmp_path / "MY001.toml").write_text(VALID.replace('"MY001"', '"DATA001"'))
    with pytest.raises(RuleError, match="already used"):
        load_rules([tmp_path])
    with pytest.raises(RuleError, match="does not exist"):
        load_rules([tmp_path / "nope"])


def test_supersedes_names_loaded_rules_and_never_both_ways(tmp_path: Path) -> None:
    _rule(tmp_path, VALID.replace('why = "w"', 'why = "w"\nsupersedes = ["NOPE001"]'))
    with pytest.raises(RuleError, match="supersedes unknown rule 'NOPE001'") as info:
        load_rules([tmp_path])
    assert info.value.message.startswith(f"{tmp_path / 'MY001.toml'}:6:")
    _rule(tmp_path, VALID.replace('why = "w"', 'why = "w"\nsupersedes = ["MY002"]'))
    (tmp_path / "MY002.toml").write_text(
        VALID.replace("MY001", "MY002").replace('why = "w"', 'why = "w"\nsupersedes = ["MY001"]')
    )
    with pytest.raises(RuleError, match="supersede each other"):
        load_rules([tmp_path])
    (tmp_path / "MY002.toml").unlink()
    _rule(tmp_path, VALID.replace('why = "w"', 'why = "w"\nsupersedes = ["DATA004"]'))
    assert [r.supersedes for r in load_rules([tmp_path]) if r.id == "MY001"] == [("DATA004",)]


def test_every_catalog_symptom_has_unit_and_description() -> None:
    for name, (_unit, description) in CATALOG.items():
        assert description, name
        assert "." in name


WAIT_RULE = """
id = "MY002"
title = "Waits for data"
category = "data"
why = "A rule over one share."
says = "waits {exposed.data_wait:%}"
do = "more workers"
gain = "1 / (1 - exposed.data_wait)"
evidence = ["exposed.data_wait"]
[when]
all = ["exposed.data_wait >= 0.10"]
[[examples]]
symptoms = { "exposed.data_wait" = 0.3 }
fires = true
[[examples]]
symptoms = { "exposed.data_wait" = 0.05 }
fires = false
"""


@pytest.mark.parametrize(
    ("value", "low", "high", "fires", "borderline"),
    [
        (0.30, 0.25, 0.35, True, False),  # clear: the whole spread is over the threshold
        (0.11, 0.07, 0.15, True, True),  # fired, but a step at p10 would not: borderline
        (0.08, 0.05, 0.12, False, True),  # did not fire, but a step at p90 would: a near miss
        (0.02, 0.01, 0.04, False, False),  # clearly not
    ],
)
def test_a_finding_within_its_symptoms_spread_of_the_threshold_is_borderline(
    tmp_path: Path, value: float, low: float, high: float, fires: bool, borderline: bool
) -> None:
    from diagnose.analysis.symptoms.registry import Symptom, Symptoms

    rule = load_rule_file(_rule(tmp_path, WAIT_RULE))
    symptoms = Symptoms({"exposed.data_wait": Symptom("exposed.data_wait", value, "share", "", low=low, high=high)})
    diagnosis = diagnose_symptoms([rule], symptoms)
    assert [f.rule_id for f in diagnosis.findings] == (["MY002"] if fires else [])
    if fires:
        assert diagnosis.findings[0].borderline == (["exposed.data_wait"] if borderline else [])
        assert diagnosis.borderline == []
    else:
        assert len(diagnosis.borderline) == (1 if borderline else 0)
        if borderline:
            assert (
                diagnosis.borderline[0].startswith("borderline: MY002")
                and "exposed.data_wait 5%–12%" in diagnosis.borderline[0]
            )


def test_the_sync_rules_verify_with_the_sync_sites_found() -> None:
    """SYNC001 and EXPO003 measure their fix with ``unsync`` at the sites line attribution found;
    a bare trace records no site, and the knob is left out rather than given a blank value."""
    from diagnose.analysis.symptoms import symptoms_from_values
    from diagnose.analysis.verdict.findings import make_finding

    rules = {r.id: r for r in RULES}
    values = {"sync.per_step": 49, "sync.cost_share": 0.4, "sync.blocked_share": 0.2, "sync.idle_after_share": 0.2}
    symptoms = symptoms_from_values(values)
    symptoms.texts = {"lines.sync_sites": "implicit_syncs.py:29+implicit_syncs.py:48"}
    for rule_id in ("SYNC001", "EXPO003"):
        assert make_finding(rules[rule_id], symptoms).knobs == {"unsync": "implicit_syncs.py:29+implicit_syncs.py:48"}
        assert make_finding(rules[rule_id], symptoms_from_values(values)).knobs == {}


def test_dataloader_knobs_are_offered_only_where_a_dataloader_fed_the_profiled_steps() -> None:
    """A script that feeds its steps from its own loader (``dataloader.present`` 0) gets no
    DataLoader knob: verify would set it on a loader the steps never read (issue 32: MEM004's
    ``batch_size=65536`` went to a DataLoader built at start-up, and the unchanged run read 0.82x).
    Its other knobs stay; a bare trace that cannot tell (no ``dataloader.present``) keeps them."""
    from diagnose.analysis.symptoms import symptoms_from_values
    from diagnose.analysis.verdict.findings import make_finding

    rules = {r.id: r for r in RULES}
    mem004 = {"matmul.roof_share": 0.054, "kernels.matmul_share": 0.85, "gpu.busy": 0.8, "memory.samples": 16}
    mem004 |= {"memory.largest_batch": 150000, "suggest.batch_to_fill": 512}
    data002 = {"exposed.h2d_copy": 0.3, "copy.pageable_share": 1.0, "copy.h2d_mb_per_step": 64}
    cases = [
        ("MEM004", mem004, {"batch_size": "512"}, {}),
        ("DATA002", data002, {"pin_memory": "true", "non_blocking": "true"}, {"non_blocking": "true"}),
    ]
    for rule_id, values, fed, own_loader in cases:
        knobs = {
            present: make_finding(rules[rule_id], symptoms_from_values({**values, "dataloader.present": present})).knobs
            for present in (1, 0)
        }
        assert knobs == {1: fed, 0: own_loader}, rule_id
        assert make_finding(rules[rule_id], symptoms_from_values(values)).knobs == fed, rule_id


# --- two findings never give one setting opposite values ------------------------------------------

_SETTING = __import__("re").compile(r"\b([a-z_]+)\s*=\s*([^,\s)]+)")
_BOUND = __import__("re").compile(r"^([\w.]+)\s*(<=|>=|<|>|==)\s*(-?[\d.]+)$")


def _settings(rule) -> dict[str, set[str]]:  # Rule
    """The distributed settings (DDP's, FSDP's, the backend) a rule gives a value, in its code
    (every device's and framework's words) and its knob table."""
    from diagnose.runtime.knobs import DDP_KNOBS, FSDP_KNOBS

    settings = {*DDP_KNOBS, *FSDP_KNOBS, "backend"}
    found: dict[str, set[str]] = {}
    for text in (rule.do, *rule.on_cpu.values(), *rule.do_by_framework.values()):
        for name, value in _SETTING.findall(text):
            if name in settings:
                found.setdefault(name, set()).add(value.strip("\"'").lower())
    for name, value in rule.knobs.items():
        if name in settings:
            found.setdefault(name, set()).add(value.lower())
    return found


def _exclusive(a, b) -> bool:  # Rules
    """Whether two rules can never fire together: one bounds a symptom above where the other
    bounds it below (DIST008's ``calls <= 2``, DIST009's ``calls >= 40``)."""

    def bounds(rule) -> list[tuple[str, str, float]]:
        return [(m[1], m[2], float(m[3])) for c in rule.all_of if (m := _BOUND.match(c.text.strip()))]

    for name, op_a, x in bounds(a):
        for other, op_b, y in bounds(b):
            if name != other:
                continue
            if (op_a in ("<", "<=") and op_b in (">", ">=") and x < y) or (
                op_b in ("<", "<=") and op_a in (">", ">=") and y < x
            ):
                return True
            if op_a == op_b == "==" and x != y:
                return True
    return False


def test_two_rules_that_can_fire_together_never_give_a_distributed_setting_two_values() -> None:
    """DIST002 advised bucket_cap_mb=100 beside DIST008's 10 in one report: the bucket size is
    DIST008's and DIST009's (which cannot fire together), DIST002 defers to them."""
    rules = load_rules()
    given = {r.id: _settings(r) for r in rules}
    clashes = []
    for i, a in enumerate(rules):
        for b in rules[i + 1 :]:
            for name in set(given[a.id]) & set(given[b.id]):
                if given[a.id][name] != given[b.id][name] and not _exclusive(a, b):
                    clashes.append(f"{a.id} {name}={given[a.id][name]} vs {b.id} {name}={given[b.id][name]}")
    assert clashes == []
    assert (
        "bucket_cap_mb" not in given["DIST002"]
        and "bucket_cap_mb" in given["DIST008"]
        and "bucket_cap_mb" in given["DIST009"]
    )
