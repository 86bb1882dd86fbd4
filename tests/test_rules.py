"""Every rule's own examples, the condition grammar, malformed rule files, docs/rules.md."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from diagnose.analysis.symptoms import CATALOG, symptoms_from_values
from diagnose.analysis.verdict.findings import diagnose_symptoms, make_finding, superseded_by
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
    if example.words is not None:  # the [[words]] case it gets, or none (false)
        case = rule.words_for(example.symptoms)
        assert (case.name if case else False) == example.words


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


#: a [[words]] entry's name and conditions
FSDP1 = 'name = "FSDP1"\nwhen = ["fsdp.version == 1"]'


def _words(entry: str) -> str:
    """VALID with one ``[[words]]`` entry (or more) before its ``[when]``."""
    return VALID.replace("[when]", f"[[words]]\n{entry}\n[when]")


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
        # [[words]]: the words for a kind of run (FSDP1, no DataLoader); the entry starts on line 6
        (VALID.replace("[when]", 'words = "FSDP1"\n[when]'), 6, "words is an array of tables"),
        (_words('when = ["fsdp.version == 1"]\ndo = "x"'), 6, "words 1: needs a name"),
        (_words('name = "FSDP1"\ndo = "x"'), 7, "words 1 (FSDP1): when is a list"),
        (
            _words('name = "FSDP1"\nwhen = ["fsdp.versoin == 1"]\ndo = "x"'),
            8,
            "unknown symptom 'fsdp.versoin'; did you mean 'fsdp.version'",
        ),
        (_words('name = "FSDP1"\nwhen = ["fsdp.version =="]\ndo = "x"'), 8, "words 1 (FSDP1): bad condition"),
        (_words('name = "FSDP1"\nwhen = ["fsdp.version == 1"]'), 7, "words 1 (FSDP1): give the words"),
        (_words(f'{FSDP1}\nheadline = "x"'), 7, "words 'FSDP1': unknown key 'headline'"),
        (_words(f'{FSDP1}\ndo = "{{batch.sise}}"'), 9, "unknown symptom 'batch.sise'"),
        (
            _words('name = "a"\nwhen = ["fsdp.version == 1"]\ndo = "x"\n[[words]]\nname = "a"\ndo = "y"'),
            7,
            "words 2: the name 'a' is used twice",
        ),
        (
            _words(f'{FSDP1}\n[words.already]\ndo = "x"'),
            7,
            "words 1 (FSDP1): [words.already] words a rule's [already] case; this rule has none",
        ),
        (
            VALID.replace("fires = false", 'fires = false\nwords = "FSDP1"'),
            14,
            "example 2: words names a [[words]] entry (none: the rule has no [[words]]) or is false",
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


#: a rule with every kind of words: its own, [on_cpu], [already], two cases (one with its
#: [already] words) and a framework's; each text names where it came from
WORDED = """\
id = "MY003"
title = "own title"
says = "own says"
do = "own do"
why = "own why"
[do_by_framework]
lightning = "lightning do"
[on_cpu]
says = "cpu says"
do = "cpu do"
[already]
when = ["fsdp.prefetch_set == 1"]
title = "already title"
why = "already why"
[[words]]
name = "FSDP1"
when = ["fsdp.version == 1"]
why = "fsdp1 why"
do = "fsdp1 do"
[words.already]
do = "fsdp1 already do"
[[words]]
name = "any FSDP"
when = ["fsdp.version >= 1"]
says = "fsdp says"
[when]
all = ["gpu.busy < 0.5"]
[[examples]]
symptoms = { "gpu.busy" = 0.1, "fsdp.version" = 1 }
fires = true
words = "FSDP1"
[[examples]]
symptoms = { "gpu.busy" = 0.1, "fsdp.version" = 2 }
fires = true
words = "any FSDP"
[[examples]]
symptoms = { "gpu.busy" = 0.9 }
fires = false
words = false
"""


@dataclass
class WordsCase:
    name: str
    values: dict[str, float]
    framework: str | None
    #: title, says, why, do as the finding shows them, and the framework whose terms do uses
    expected: tuple[str, str, str, str, str | None]


@pytest.mark.parametrize(
    "case",
    [
        WordsCase(
            "no case: the rule's own", {"fsdp.version": 0}, None, ("own title", "own says", "own why", "own do", None)
        ),
        WordsCase("a CPU run", {"gpu.present": 0}, None, ("own title", "cpu says", "own why", "cpu do", None)),
        WordsCase(
            "FSDP1: the first case", {"fsdp.version": 1}, None, ("own title", "own says", "fsdp1 why", "fsdp1 do", None)
        ),
        # the first entry whose conditions hold is the case, alone: "any FSDP"'s says does not
        # fill in what FSDP1's entry leaves out
        WordsCase(
            "FSDP2: the second case", {"fsdp.version": 2}, None, ("own title", "fsdp says", "own why", "own do", None)
        ),
        # a case is the more specific fact: it beats [on_cpu] where both word a text
        WordsCase(
            "FSDP1 on a CPU run",
            {"fsdp.version": 1, "gpu.present": 0},
            None,
            ("own title", "cpu says", "fsdp1 why", "fsdp1 do", None),
        ),
        # [already] beats the case; the case's own [words.already] beats both
        WordsCase(
            "FSDP1 prefetching already",
            {"fsdp.version": 1, "fsdp.prefetch_set": 1},
            None,
            ("already title", "own says", "already why", "fsdp1 already do", None),
        ),
        WordsCase(
            "FSDP2 prefetching already: [already]'s words over the case's",
            {"fsdp.version": 2, "fsdp.prefetch_set": 1},
            None,
            ("already title", "fsdp says", "already why", "own do", None),
        ),
        # a framework's text is written for the usual run: it gives way to a case's do
        WordsCase(
            "under Lightning",
            {"fsdp.version": 0},
            "lightning",
            ("own title", "own says", "own why", "lightning do", "lightning"),
        ),
        WordsCase(
            "FSDP1 under Lightning",
            {"fsdp.version": 1},
            "lightning",
            ("own title", "own says", "fsdp1 why", "fsdp1 do", None),
        ),
        WordsCase(
            "FSDP2 under Lightning: the case words no do",
            {"fsdp.version": 2},
            "lightning",
            ("own title", "fsdp says", "own why", "lightning do", "lightning"),
        ),
    ],
    ids=lambda c: c.name,
)
def test_words_precedence_own_then_cpu_then_case_then_already(tmp_path: Path, case: WordsCase) -> None:
    (tmp_path / "MY003.toml").write_text(WORDED)
    rule = load_rule_file(tmp_path / "MY003.toml")
    values = {"gpu.busy": 0.1, **case.values}
    if case.framework:
        values[f"framework.{case.framework}"] = 1
    finding = make_finding(rule, symptoms_from_values(values))
    assert (finding.title, finding.says, finding.why, finding.do, finding.framework) == case.expected
    # the examples say which case they get (the suite checks every built-in rule's the same way)
    assert [rule.words_for(e.symptoms) and rule.words_for(e.symptoms).name for e in rule.examples] == [
        "FSDP1",
        "any FSDP",
        None,
    ]
    assert [e.words for e in rule.examples] == ["FSDP1", "any FSDP", False]


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
    # the script's own batch option counted its samples: the larger batch goes through it, as
    # the script spells it, and the words quote it
    from diagnose.analysis.symptoms.registry import Symptoms

    own = symptoms_from_values({**mem004, "dataloader.present": 0, "batch.option": 1})
    own = Symptoms(dict(own), {"batch.flag": "--batch-size"})
    finding = make_finding(rules["MEM004"], own)
    assert finding.knobs == {"arg.batch-size": "512"}
    assert "python train.py ... --batch-size 512   # was 16" in finding.do
    # a DataLoader over the script's batch sampler refuses a batch_size: the script's option, or no knob
    sampler = symptoms_from_values({**mem004, "dataloader.present": 1, "dataloader.batch_sampler": 1})
    assert make_finding(rules["MEM004"], sampler).knobs == {}
    flagged = Symptoms(
        dict(
            symptoms_from_values(
                {**mem004, "dataloader.present": 1, "dataloader.batch_sampler": 1, "batch.script_option": 1}
            )
        ),
        {"batch.script_flag": "--batch-size"},
    )
    finding = make_finding(rules["MEM004"], flagged)
    assert finding.knobs == {"arg.batch-size": "512"}
    assert "python train.py ... --batch-size 512   # was 16" in finding.do


def test_advice_code_fits_the_fsdp_the_run_used() -> None:
    """DIST006 printed FSDP2's fully_shard and set_modules_to_forward_prefetch on an FSDP1 run
    (issue 34, item 3): FullyShardedDataParallel's modules have neither. An FSDP1 run reads its
    constructor's arguments, with the script's prefetch on too; an FSDP2 run keeps FSDP2's code."""
    rules = {r.id: r for r in RULES}
    gathers = {"dist.world_size": 2, "dist.all_gather_exposed": 0.3, "exposed.communication_own": 0.35}

    def do(rule_id: str, values: dict[str, float]) -> str:
        return make_finding(rules[rule_id], symptoms_from_values(values)).do

    fsdp1 = do("DIST006", {**gathers, "fsdp.version": 1, "fsdp.prefetch_set": 0})
    assert "forward_prefetch=True," in fsdp1 and "backward_prefetch=BackwardPrefetch.BACKWARD_PRE," in fsdp1
    assert "model = FullyShardedDataParallel(" in fsdp1 and "limit_all_gathers=True," in fsdp1
    fsdp1_prefetching = make_finding(
        rules["DIST006"], symptoms_from_values({**gathers, "fsdp.version": 1, "fsdp.prefetch_set": 1})
    )
    assert fsdp1_prefetching.title == "FSDP's parameter all-gathers stay exposed although the script prefetches them"
    assert "mixed_precision=MixedPrecision(param_dtype=torch.bfloat16)" in fsdp1_prefetching.do
    assert "FullyShardedDataParallel's\nforward_prefetch=True and backward_prefetch" in fsdp1_prefetching.why
    fsdp2 = do("DIST006", {**gathers, "fsdp.version": 2, "fsdp.prefetch_set": 0})
    fsdp2_prefetching = do("DIST006", {**gathers, "fsdp.version": 2, "fsdp.prefetch_set": 1})
    assert "block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 3])" in fsdp2
    assert "MixedPrecisionPolicy(param_dtype=torch.bfloat16)" in fsdp2_prefetching
    for text in (fsdp1, fsdp1_prefetching.do, fsdp1_prefetching.why):
        assert "fully_shard" not in text and "set_modules_to" not in text and "MixedPrecisionPolicy" not in text
    assert "FullyShardedDataParallel" not in fsdp2 + fsdp2_prefetching

    scatters = {"dist.world_size": 2, "dist.reduce_scatter_exposed": 0.2, "exposed.communication_own": 0.22}
    fsdp1 = do("DIST007", {**scatters, "fsdp.version": 1})
    assert "mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)" in fsdp1
    assert "FullyShardedDataParallel(model, auto_wrap_policy=policy, mixed_precision=mp)" in fsdp1
    assert "model.no_sync()" in fsdp1 and "fully_shard" not in fsdp1 and "set_requires_gradient_sync" not in fsdp1
    assert "model.set_requires_gradient_sync(last)" in do("DIST007", {**scatters, "fsdp.version": 2})

    # DIST002's accumulation: DDP's no_sync, FSDP2's set_requires_gradient_sync
    exposed = {"exposed.communication": 0.2, "exposed.communication_own": 0.18, "gpu.communication_step_share": 0.3}
    fsdp2 = do("DIST002", {**exposed, "fsdp.version": 2})
    assert "model.set_requires_gradient_sync(sync)" in fsdp2 and "no_sync" not in fsdp2
    assert "DistributedDataParallel" not in fsdp2 + do("DIST002", {**exposed, "fsdp.version": 1})
    assert "DistributedDataParallel(model, gradient_as_bucket_view=True)" in do("DIST002", exposed)


def test_a_script_that_builds_its_own_batches_is_told_its_own_batch_size() -> None:
    """MEM001 and MEM004 printed ``loader = DataLoader(dataset, batch_size=N, ...)`` where no
    DataLoader fed the profiled steps: the script's own batch size is the setting, with the
    same numbers (and no knob: verify cannot reach it)."""
    rules = {r.id: r for r in RULES}
    mem001 = {"memory.peak_reserved_share": 0.03, "gpu.busy": 0.3, "exposed.launch": 0.6, "exposed.data_wait": 0.0}
    mem001 |= {"batch.size": 16, "suggest.batch_size": 256}
    mem004 = {"matmul.roof_share": 0.054, "kernels.matmul_share": 0.85, "gpu.busy": 0.8, "memory.samples": 16}
    mem004 |= {"memory.largest_batch": 150000, "suggest.batch_to_fill": 512}
    cases = [
        ("MEM001", mem001, "batch_size = 256   # was 16: the argument or variable the script builds each batch with"),
        ("MEM004", mem004, "batch_size = 512   # was 16: the argument or variable the script builds each batch with"),
    ]
    for rule_id, values, own in cases:
        own_loop = make_finding(rules[rule_id], symptoms_from_values({**values, "dataloader.present": 0}))
        assert own_loop.do.startswith(own), own_loop.do
        assert "DataLoader(" not in own_loop.do and own_loop.knobs == {}
        fed = make_finding(rules[rule_id], symptoms_from_values({**values, "dataloader.present": 1}))
        assert fed.do.startswith(f"loader = DataLoader(dataset, batch_size={own.split()[2]}, ...)   # was 16")
        assert fed.gain == own_loop.gain
    assert (
        "about 150000 samples fit (an estimate)"
        in make_finding(rules["MEM004"], symptoms_from_values({**mem004, "dataloader.present": 0})).do
    )


# --- two findings never give one setting opposite values ------------------------------------------

_SETTING = __import__("re").compile(r"\b([a-z_]+)\s*=\s*([^,\s)]+)")
_BOUND = __import__("re").compile(r"^([\w.]+)\s*(<=|>=|<|>|==)\s*(-?[\d.]+)$")


def _settings(rule) -> dict[str, set[str]]:  # Rule
    """The distributed settings (DDP's, FSDP's, the backend) a rule gives a value, in its code
    (every device's, framework's and [[words]] case's words) and its knob table."""
    from diagnose.runtime.knobs import DDP_KNOBS, FSDP_KNOBS

    settings = {*DDP_KNOBS, *FSDP_KNOBS, "backend"}
    found: dict[str, set[str]] = {}
    cases = [text for case in rule.words for text in (case.texts.get("do"), case.already.get("do")) if text]
    for text in (rule.do, *rule.on_cpu.values(), *rule.do_by_framework.values(), *cases):
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
