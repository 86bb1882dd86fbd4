"""benchmarks/_bench.py's additive model: the moment, the side and the variant told apart
exactly where the data hold no noise, and the standard error of a variant's effect as the
textbook formula gives it for a small balanced design."""

from __future__ import annotations

import math
import statistics
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from _bench import additive_effects

VARIANTS = ("plain", "plain-again", "watch", "watch-again")
SIDES = ("0", "1", "2", "3")


def latin_square(repeats: int, effect: dict[str, float], noise: dict[tuple[int, str], float] | None = None):
    """Variants rotating over sides as watch_cost's concurrent part places them; each value is the
    moment's (0.1 * repeat) plus the side's (0.01 * side) plus the variant's, plus ``noise``."""
    rows = []
    for i in range(repeats):
        for j, v in enumerate(VARIANTS):
            side = SIDES[(j + i) % len(VARIANTS)]
            value = 0.1 * i + 0.01 * int(side) + effect[v] + (noise or {}).get((i, v), 0.0)
            rows.append((str(i), side, v, value))
    return rows


def test_effects_recovered_exactly_without_noise() -> None:
    effect = {"plain": 0.0, "plain-again": 0.0, "watch": -0.03, "watch-again": -0.03}
    effects, sigma, dof = additive_effects(latin_square(8, effect))
    assert dof == 32 - (1 + 7 + 3 + 3)
    assert effects["watch"][0] == pytest.approx(-0.03, abs=1e-12)
    assert effects["watch-again"][0] == pytest.approx(-0.03, abs=1e-12)
    assert effects["plain-again"][0] == pytest.approx(0.0, abs=1e-12)
    assert sigma == pytest.approx(0.0, abs=1e-9)
    assert all(se == pytest.approx(0.0, abs=1e-9) for _, se in effects.values())


def test_on_one_side_the_effect_is_the_paired_difference_with_its_t_error() -> None:
    # plain and watch at each of four moments on one side: the model is the paired comparison,
    # its effect the mean difference, its error the differences' standard deviation over sqrt(n),
    # and one process's own spread that standard deviation over sqrt(2)
    plain = [1.00, 1.30, 0.90, 1.10]
    differences = [-0.02, -0.05, 0.01, -0.03]
    rows = [(str(i), "0", "plain", p) for i, p in enumerate(plain)]
    rows += [(str(i), "0", "watch", p + d) for i, (p, d) in enumerate(zip(plain, differences, strict=True))]
    effects, sigma, dof = additive_effects(rows)
    assert dof == 3
    assert effects["watch"][0] == pytest.approx(statistics.mean(differences), abs=1e-12)
    assert effects["watch"][1] == pytest.approx(statistics.stdev(differences) / 2, abs=1e-12)
    assert sigma == pytest.approx(statistics.stdev(differences) / math.sqrt(2), abs=1e-12)


def test_a_design_that_confounds_side_and_variant_is_refused() -> None:
    rows = [(str(i), "0" if v == "plain" else "1", v, 0.0) for i in range(4) for v in ("plain", "watch")]
    with pytest.raises(ValueError, match="cannot be told apart"):
        additive_effects(rows)
    with pytest.raises(ValueError, match="reference"):
        additive_effects([("0", "0", "watch", 0.0)])


def test_calls_pooled_with_their_own_sides_keep_the_variants_estimable() -> None:
    # two calls on two hosts: each call's sides are its own, so one side column repeats what the
    # call's moments say; it is dropped, and the variants' effects come out as planted
    effect = {"plain": 0.0, "plain-again": 0.0, "watch": -0.04, "watch-again": -0.04}
    rows = [(f"a{m}", f"a{s}", v, y) for m, s, v, y in latin_square(4, effect)]
    rows += [(f"b{m}", f"b{s}", v, y + 0.3) for m, s, v, y in latin_square(4, effect)]
    effects, sigma, dof = additive_effects(rows)
    assert effects["watch"][0] == pytest.approx(-0.04, abs=1e-12)
    assert effects["plain-again"][0] == pytest.approx(0.0, abs=1e-12)
    assert sigma == pytest.approx(0.0, abs=1e-9)
    # 32 rows; intercept, 7 moments, 3 + 3 sides (one of call b's repeats call a's), 3 variants
    assert dof == 32 - (1 + 7 + 6 + 3)
