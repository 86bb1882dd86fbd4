"""The verdict: rules (data, ``rules/*.toml``) fired on the symptoms, findings ranked.

In: the ``Symptoms`` (``analysis/symptoms/``), the rules loaded from TOML, a ``Predictor`` and
the bootstrap (``analysis/prediction/``), measurements of a check where ``diagnose run`` made
them. Out: ``rules.load_rules(dirs) -> list[Rule]`` (checked at load: a small condition grammar,
never ``eval``), ``findings.diagnose_symptoms(rules, symptoms, ...) -> Diagnosis`` (findings with
evidence, predicted gains, ranked; the superseded ones recorded), ``rulesdoc`` (the listings of
``diagnose rules`` and docs/rules.md).

May import: ``analysis/symptoms/``, ``analysis/prediction/``, ``analysis/measure/`` (the category
names), ``diagnose.record``, the ground floor; never the report, which reads this stage.
"""
