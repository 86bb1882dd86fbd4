"""The Timeline's compact columns read exactly as the lists of tuples they replace."""

from __future__ import annotations

from array import array

import pytest

from diagnose.analysis.trace.columns import Launches, Records, extend_ints, float_column, int_column, take
from diagnose.analysis.trace.timeline import GpuKernel

KERNELS = [GpuKernel(1.0, 2.5, 7, "gemm", 0), GpuKernel(2.0, 3.0, 8, "relu", 1), GpuKernel(4.0, 4.5, -1, "gemm", 0)]


def _kernel_records(kernels: list[GpuKernel]) -> Records[GpuKernel]:
    return Records(
        GpuKernel,
        [
            float_column(k.start for k in kernels),
            float_column(k.end for k in kernels),
            int_column(k.correlation for k in kernels),
            [k.name for k in kernels],
            int_column(k.stream for k in kernels),
        ],
    )


def test_records_read_as_the_list_of_tuples() -> None:
    records = _kernel_records(KERNELS)
    assert records == KERNELS and records == KERNELS and list(records) == KERNELS
    assert len(records) == 3 and bool(records) and not Records(tuple, [float_column(), float_column()])
    assert records[1] == KERNELS[1] and type(records[1]) is GpuKernel and records[-1].name == "gemm"
    assert records[:1] == KERNELS[:1] and records[::2] == KERNELS[::2]
    assert records + [KERNELS[0]] == KERNELS + [KERNELS[0]] and [KERNELS[0]] + records == [KERNELS[0]] + KERNELS  # noqa: RUF005 - Records' + itself
    assert sorted(records, key=lambda k: -k.start) == sorted(KERNELS, key=lambda k: -k.start)
    assert records != KERNELS[:2] and records != [*KERNELS[:2], KERNELS[2]._replace(stream=3)]
    with pytest.raises(IndexError):
        records[3]


def test_a_single_column_reads_as_bare_values() -> None:
    starts = Records(None, [float_column([1.0, 0.5])])
    assert starts == [1.0, 0.5] and starts[1] == 0.5 and list(starts) == [1.0, 0.5]


def test_int_columns_become_lists_for_values_that_are_not_machine_integers() -> None:
    column = int_column([1, 2])
    assert type(column) is array
    column = extend_ints(column, [3])
    assert type(column) is array and list(column) == [1, 2, 3]
    for odd in (["corr-4"], [2**70], [None], [4.5]):
        widened = extend_ints(int_column([1, 2]), odd)
        assert type(widened) is list and widened == [1, 2, *odd]
    assert take(int_column([5, 6, 7]), [2, 0]) == array("q", [7, 5]) and take(["a", "b"], [1]) == ["b"]


def test_take_reorders_every_kind_of_column_by_a_list_or_an_array() -> None:
    import numpy as np

    floats_, ints_, names = float_column([0.5, 1.5, 2.5]), int_column([7, -8, 9]), ["a", "b", "c"]
    for order in ([2, 0, 0], np.array([2, 0, 0]), iter([2, 0, 0])):
        assert take(floats_, order) == array("d", [2.5, 0.5, 0.5])
    assert take(ints_, np.array([1, 2])) == array("q", [-8, 9]) and take(names, np.array([2, 1])) == ["c", "b"]
    assert take(float_column(), []) == array("d") and take(ints_, np.array([], dtype=int)) == array("q")
    assert take(["x", 2**70], np.array([1])) == [2**70]


@pytest.mark.parametrize(
    ("correlations", "expected"),
    [
        ([1, 2, 5], {1: (0.0, 1.0), 2: (1.0, 2.0), 5: (2.0, 3.0)}),  # in order: kept as it is
        ([5, 1, 2], {5: (0.0, 1.0), 1: (1.0, 2.0), 2: (2.0, 3.0)}),
        ([3, 1, 3], {1: (1.0, 2.0), 3: (2.0, 3.0)}),  # the later call wins, as a dict's assignment did
        ([3, 3, 1], {3: (1.0, 2.0), 1: (2.0, 3.0)}),
        ([2, 2, 2], {2: (2.0, 3.0)}),
    ],
)
def test_launches_map_correlations_like_the_dict_they_replace(
    correlations: list[int], expected: dict[int, tuple[float, float]]
) -> None:
    launches = Launches.from_calls(
        int_column(correlations), float_column([0.0, 1.0, 2.0]), float_column([1.0, 2.0, 3.0])
    )
    assert type(launches) is Launches
    assert launches == expected and dict(launches.items()) == expected and len(launches) == len(expected)
    for corr, span in expected.items():
        assert launches[corr] == span and launches.get(corr) == span and corr in launches
    assert (
        launches.get(4) is None
        and 4 not in launches
        and launches.get("1") is None
        and launches.get(None, "none") == "none"
    )
    with pytest.raises(KeyError):
        launches[4]


def test_launches_of_many_calls_out_of_order_read_as_the_dict() -> None:
    import random

    rng = random.Random(3)
    ids = [rng.randrange(500) for _ in range(2000)]
    starts = [float(i) for i in range(len(ids))]
    expected = {corr: (start, start + 0.5) for corr, start in zip(ids, starts, strict=True)}
    launches = Launches.from_calls(int_column(ids), float_column(starts), float_column(s + 0.5 for s in starts))
    assert type(launches) is Launches and dict(launches.items()) == expected and list(launches) == sorted(expected)
    assert Launches.from_calls(int_column(), float_column(), float_column()) == {}


def test_many_launches_looked_up_at_once_are_each_get() -> None:
    launches = Launches.from_calls(
        int_column([9, 3, 5, 3]), float_column([0.0, 1.0, 2.0, 3.0]), float_column([0.5, 1.5, 2.5, 3.5])
    )
    keys = [3, 5, 9, 4, 10, -1, 2**70, "3", None, True]
    assert launches.many(keys) == {k: launches.get(k) for k in keys}
    assert launches.many(keys)[3] == (3.0, 3.5) and launches.many([]) == {}
    assert Launches(int_column(), float_column(), float_column()).many([1]) == {1: None}


def test_launches_with_ids_that_are_not_integers_are_a_dict() -> None:
    launches = Launches.from_calls(["a", 2], float_column([0.0, 1.0]), float_column([1.0, 2.0]))
    assert launches == {"a": (0.0, 1.0), 2: (1.0, 2.0)}
