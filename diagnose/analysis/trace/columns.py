"""Compact storage of the Timeline's long lists: records kept as columns, read as tuples.

Contract: ``Records(make, columns)`` is a read-only sequence of ``make`` tuples (a NamedTuple
class, ``tuple`` for plain intervals, or ``None`` for a single column of bare values) whose fields
are the given columns; iterating, indexing and slicing build the tuples on the fly, and it compares
equal to a list of the same tuples. ``Launches(correlations, starts, ends)`` is the read-only
mapping correlation id -> (start, end) of the runtime calls, kept as three sorted columns
(``many`` looks up a set of ids at once).
``float_column``/``int_column``/``object_column`` make the columns; ``extend_ints`` extends an int
column, turning it into a plain list when a value does not fit a machine integer.

Why: a kernel held as a NamedTuple of Python floats and ints takes about 170 bytes; the same five
fields in ``array`` columns take 40 (names are references to one interned string each). A
timeline of millions of kernels, launches and operators then takes a fifth of the memory, and
the code that reads ``timeline.kernels`` as a list of ``GpuKernel`` still does. The columns are
the standard library's arrays, which numpy views without a copy where the breakdown computes
over them (``vectorized``) and where the reader reorders them (``take``, ``Launches.from_calls``:
after the reader's worker processes are done; the workers themselves never import numpy, and
numpy is always imported through ``vectorized``, which counts the threads it starts).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from itertools import islice
from typing import Any, Generic, TypeVar, Union, overload

Item = TypeVar("Item")
#: an int column: machine integers, or a list where some value is not one (a string id, say)
IntColumn = Union["array[int]", list[Any]]
Column = Union["array[float]", "array[int]", list[Any]]


def float_column(values: Iterable[float] = ()) -> array[float]:
    return array("d", values)


def int_column(values: Iterable[Any] = ()) -> IntColumn:
    column: IntColumn = array("q")
    return extend_ints(column, values)


def object_column(values: Iterable[Any] = ()) -> list[Any]:
    return list(values)


def extend_ints(column: IntColumn, values: Iterable[Any]) -> IntColumn:
    """``column`` extended by ``values``; a list from the first value that is not an int of 64 bits
    (an id written as a string, say): equal values, just not compact. (A bool is stored as 0 or 1,
    which compare and hash as the bool did.)"""
    if isinstance(column, list):
        column.extend(values)
        return column
    values = values if isinstance(values, (list, tuple, array)) else list(values)
    n = len(column)
    try:
        column.extend(values)
        return column
    except (TypeError, OverflowError):
        del column[n:]
    return column.tolist() + list(values)


def take(column: Column, order: Iterable[int]) -> Column:
    """``column`` reordered (``order`` lists indices: a list, or an integer numpy array)."""
    if isinstance(column, list):
        return list(map(column.__getitem__, order.tolist() if hasattr(order, "tolist") else order))
    from diagnose.analysis.trace.vectorized import np  # counts the threads numpy starts (see vectorized)

    out = array(column.typecode)
    index = order if isinstance(order, np.ndarray) else np.fromiter(order, dtype=np.intp)
    if len(column) and len(index):
        out.frombytes(np.frombuffer(column, dtype=column.typecode)[index].tobytes())
    return out


class Records(Sequence[Item], Generic[Item]):
    """A read-only list of tuples stored as columns (see the module docstring)."""

    __slots__ = ("make", "columns", "_new")

    def __init__(self, make: type[Item] | None, columns: Sequence[Column]) -> None:
        self.make = make
        self.columns = tuple(columns)
        lengths = {len(c) for c in self.columns}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        # make, where given, is a tuple class (a NamedTuple): Item is not bound to tuple, as a bare
        # column's items are its values
        self._new = None if make is None else partial(tuple.__new__, make)  # type: ignore[type-var]

    def __len__(self) -> int:
        return len(self.columns[0]) if self.columns else 0

    def __iter__(self) -> Iterator[Item]:
        if self._new is None:
            return iter(self.columns[0])
        return map(self._new, zip(*self.columns, strict=True))

    @overload
    def __getitem__(self, index: int) -> Item: ...
    @overload
    def __getitem__(self, index: slice) -> list[Item]: ...
    def __getitem__(self, index: int | slice) -> Item | list[Item]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            return list(islice(self, start, stop, step))
        if self._new is None:
            return self.columns[0][index]  # type: ignore[return-value]
        return self._new(tuple(c[index] for c in self.columns))

    def column(self, index: int) -> Column:
        """One field of every record (read-only by convention)."""
        return self.columns[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Records, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Iterable[Item]) -> list[Item]:
        return [*self, *other]

    def __radd__(self, other: Iterable[Item]) -> list[Item]:
        return [*other, *self]

    def __repr__(self) -> str:
        shown = ", ".join(map(repr, islice(self, 3)))
        more = f", ... ({len(self):,} in all)" if len(self) > 3 else ""
        return f"Records([{shown}{more}])"


class Launches(Mapping[Any, tuple[float, float]]):
    """Correlation id -> (start, end) of the runtime call that launched it, as sorted columns.
    A lookup is a binary search (about 20 steps for a million launches) instead of a dict's
    hash: a dict held about 180 bytes per launch, these columns 24."""

    __slots__ = ("correlations", "starts", "ends")

    def __init__(self, correlations: array[int], starts: array[float], ends: array[float]) -> None:
        self.correlations = correlations
        self.starts = starts
        self.ends = ends

    @classmethod
    def from_calls(
        cls, correlations: IntColumn, starts: array[float], ends: array[float]
    ) -> Launches | dict[Any, tuple[float, float]]:
        """The launches of calls in file order: a later call with the same id replaces an earlier
        one (as assigning into a dict did). A plain dict when the ids are not all integers."""
        if isinstance(correlations, list):
            return {c: (s, e) for c, s, e in zip(correlations, starts, ends, strict=True)}
        from diagnose.analysis.trace import vectorized as V  # imports numpy, counting the threads it starts

        ids = V.ints(correlations)
        if (ids[1:] > ids[:-1]).all():  # the usual order
            return cls(correlations, starts, ends)
        order = V.np.argsort(ids, kind="stable")  # stable: the last of equal ids wins below
        in_order = ids[order]
        last = V.np.append(in_order[1:] != in_order[:-1], True)
        if not last.all():
            order = order[last]
        return cls(take(correlations, order), take(starts, order), take(ends, order))  # type: ignore[arg-type]  # take keeps an array an array

    def _index(self, corr: Any) -> int:
        if type(corr) is not int:
            return -1
        i = bisect_left(self.correlations, corr)
        return i if i < len(self.correlations) and self.correlations[i] == corr else -1

    def __getitem__(self, corr: Any) -> tuple[float, float]:
        i = self._index(corr)
        if i < 0:
            raise KeyError(corr)
        return (self.starts[i], self.ends[i])

    def get(self, corr: Any, default: Any = None) -> Any:
        i = self._index(corr)
        return default if i < 0 else (self.starts[i], self.ends[i])

    def many(self, corrs: Iterable[Any]) -> dict[Any, tuple[float, float] | None]:
        """``{corr: self.get(corr)}`` for each of ``corrs``, the searches made at once (numpy)."""
        from diagnose.analysis.trace import vectorized as V  # imports numpy, counting the threads it starts

        out: dict[Any, tuple[float, float] | None] = dict.fromkeys(corrs)
        wanted = [c for c in out if type(c) is int and -(2**63) <= c < 2**63]
        rows = V.rows_of(V.np.array(wanted, dtype=V.np.int64), V.ints(self.correlations))
        found = rows >= 0
        starts, ends = V.floats(self.starts)[rows[found]].tolist(), V.floats(self.ends)[rows[found]].tolist()
        for j, start, end in zip(V.np.flatnonzero(found).tolist(), starts, ends, strict=True):
            out[wanted[j]] = (start, end)
        return out

    def times_of(self, corrs: Sequence[Any]) -> tuple[Any, Any]:
        """The (start, end) of the launch of each of ``corrs`` as two float arrays (numpy), NaN
        where there is none (an id that is not a machine integer has none)."""
        from diagnose.analysis.trace import vectorized as V  # imports numpy, counting the threads it starts

        np = V.np
        keys = V.ints(corrs)
        if keys is None:
            plain = [type(c) is int and -(2**63) <= c < 2**63 for c in corrs]
            keys = np.array([c if ok else 0 for c, ok in zip(corrs, plain, strict=True)], dtype=np.int64)
            rows = np.where(np.array(plain, dtype=bool), V.rows_of(keys, V.ints(self.correlations)), -1)
        else:
            rows = V.rows_of(keys, V.ints(self.correlations))
        found = rows >= 0
        starts, ends = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
        starts[found] = V.floats(self.starts)[rows[found]]
        ends[found] = V.floats(self.ends)[rows[found]]
        return starts, ends

    def __contains__(self, corr: object) -> bool:
        return self._index(corr) >= 0

    def __len__(self) -> int:
        return len(self.correlations)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.correlations)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return len(self) == len(other) and all(other.get(c, None) == v for c, v in self.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Launches({len(self):,} calls)"
