"""The reader's array helpers (``analysis/trace/vectorized``) give what the Python loops they replace
gave, row for row, on hand-made cases and on random ones full of ties."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from diagnose.analysis.trace import vectorized as V
from diagnose.analysis.trace.timeline import _outermost


def _loop_outermost(starts: list[float], ends: list[float]) -> list[int]:
    out, top_end = [], float("-inf")
    for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
        if start >= top_end:
            out.append(i)
            top_end = end
    return out


def _random_rows(rng: random.Random, n: int) -> tuple[list[float], list[float]]:
    starts = [float(rng.randrange(20)) for _ in range(n)]
    ends = [s + rng.choice([0.0, 0.5, 1.0, 3.0]) for s in starts]
    return starts, ends


@pytest.mark.parametrize("seed", range(20))
def test_sort_order_is_pythons_stable_sort(seed: int) -> None:
    rng = random.Random(seed)
    starts, ends = _random_rows(rng, rng.randrange(0, 60))
    for descending in ([False], [False, False], [False, True]):
        keys = [starts, ends][: len(descending)]
        rows = list(
            zip(*[[-v for v in k] if down else k for k, down in zip(keys, descending, strict=True)], strict=True)
        )
        expected = sorted(range(len(starts)), key=rows.__getitem__)
        order = V.sort_order(keys, descending)
        assert (list(range(len(starts))) if order is None else order.tolist()) == expected
        assert (order is None) == (expected == list(range(len(starts))))


def test_sort_order_leaves_rows_in_order_alone() -> None:
    assert V.sort_order([[1.0, 1.0, 2.0], [3.0, 2.0, 0.0]], [False, True]) is None
    assert V.sort_order([[1.0, 1.0, 2.0], [2.0, 3.0, 0.0]], [False, True]).tolist() == [1, 0, 2]
    assert V.sort_order([[]], [False]) is None and V.sort_order([[5.0]], [False]) is None


@pytest.mark.parametrize("seed", range(30))
def test_outermost_operators_are_the_loops(seed: int) -> None:
    rng = random.Random(seed)
    starts, ends = _random_rows(rng, rng.randrange(0, 40))
    order = sorted(range(len(starts)), key=lambda i: (starts[i], -ends[i]))
    starts, ends = [starts[i] for i in order], [ends[i] for i in order]
    kept = V.outermost(starts, ends)
    assert kept is None or kept.tolist() == _loop_outermost(starts, ends)
    assert list(_outermost(starts, ends)) == _loop_outermost(starts, ends)


def test_an_operator_that_outlives_its_parent_is_left_to_the_loop() -> None:
    # op 1 starts inside op 0 and ends after it: the loop measures op 2 against op 0's end
    starts, ends = [0.0, 1.0, 2.5], [2.0, 3.0, 4.0]
    assert V.outermost(starts, ends) is None
    assert list(_outermost(starts, ends)) == [0, 2]
    assert V.outermost([0.0, 1.0, 2.0], [2.0, 1.5, 3.0]).tolist() == [0, 2]
    assert V.outermost([], []).tolist() == []


def test_members_and_repeats() -> None:
    assert V.members([1.0, 2.0, -0.0], [0.0, 2.0]) == [False, True, True]
    assert V.members([], [1.0]) == [] and V.members([1.0], []) == [False]
    assert V.repeats([1.0, 1.0, 2.0, 2.0, 2.0, 3.0]) == [1, 3, 4] and V.repeats([]) == [] and V.repeats([4.0]) == []


def _loop_backward_spans(ops: list[tuple[float, float]], forward_starts: list[float]) -> list[tuple[float, float]]:
    from bisect import bisect_right

    spans: list[tuple[float, float]] = []
    for start, end in ops:
        if spans:
            k = bisect_right(forward_starts, spans[-1][1])
            if not (k < len(forward_starts) and forward_starts[k] < start):
                spans[-1] = (spans[-1][0], max(spans[-1][1], end))
                continue
        spans.append((start, end))
    return spans


@pytest.mark.parametrize("seed", range(40))
def test_backward_calls_are_the_loops_groups(seed: int) -> None:
    from diagnose.analysis.measure.breakdown import backward_spans

    rng = random.Random(seed)
    ops = sorted(zip(*_random_rows(rng, rng.randrange(0, 200)), strict=True))
    forward_starts = sorted(float(rng.randrange(20)) + 0.25 * rng.randrange(4) for _ in range(rng.randrange(0, 12)))
    expected = _loop_backward_spans(ops, forward_starts)
    assert V.backward_calls([a for a, _ in ops], [b for _, b in ops], forward_starts) == expected
    assert backward_spans(ops, forward_starts) == expected


def test_backward_events_that_end_before_they_start_are_left_to_the_loop() -> None:
    from diagnose.analysis.measure.breakdown import backward_spans

    ops = [(float(i), float(i) + 0.5) for i in range(80)] + [(90.0, 89.0)]
    assert V.backward_calls([a for a, _ in ops], [b for _, b in ops], [40.7]) is None
    assert backward_spans(ops, [40.7]) == _loop_backward_spans(ops, [40.7]) == [(0.0, 40.5), (41.0, 89.0)]
    assert V.backward_calls([], [], [1.0]) == []


def test_numpy_is_loaded_with_one_blas_thread_and_the_environment_restored() -> None:
    """numpy's BLAS pool busy-waits beside the analysis (it multiplies no matrices): loaded
    through ``vectorized`` it starts no thread, and the variable is gone again (a training
    script started later must not inherit it); a value the user set is left alone."""
    code = (
        "import json, os; from diagnose.analysis.trace import forking; before = forking.threads_in_process();"
        "from diagnose.analysis.trace import vectorized as V;"
        "print(json.dumps([before, forking.threads_in_process(), V.STARTED_THREADS, os.environ.get('OPENBLAS_NUM_THREADS'), forking.can_fork()]))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    before, after, started, variable, can_fork = json.loads(out.stdout)
    assert (before, after, started, variable, can_fork) == (1, 1, 0, None, True)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "OPENBLAS_NUM_THREADS": "2"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout)[3] == "2"
