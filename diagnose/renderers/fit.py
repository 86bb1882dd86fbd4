"""Tables that fit the terminal's width without cutting a label or a number.

Contract: ``fit_table(columns, rows, width, title=...) -> FittedTable``. A cell is never cut,
folded or shortened with an ellipsis (a cut label or number reads as another one:
``arg.batch-siz…``, ``(389.9-2…``). When the table is wider than ``width``, the columns that
may go (``Column.drop``, lowest first) are left out one by one until it fits, and
``FittedTable.left_out`` names them so that the renderer can say so; when even the columns
that must stay do not fit, each row is stacked instead: its first cell on a line, then one
``header: value`` line per other column. ``width=None`` (piped output, not wrapped) keeps every
column. Headers may wrap between words, never inside one, and so may the cells of a column of
prose (``Column.wrap``: a description), which takes the width the others leave. Pure: the result
is a rich renderable, printed by the caller; ``text_table`` prints one to a string.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

Cell = str | Text

#: the spaces between two columns (rich's default padding of one each side, no outer edge)
GAP = 2


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "left"
    #: None: always shown; else the order in which columns are left out when the table is too
    #: wide, lowest first
    drop: int | None = None
    style: str | None = None
    #: prose: its cells wrap between words (the column needs only its longest word)
    wrap: bool = False


@dataclass(frozen=True)
class FittedTable:
    renderable: RenderableType
    left_out: tuple[str, ...] = ()  # headers of the columns not shown
    stacked: bool = False

    def note(self, width: int | None) -> str | None:
        """The line that says which columns are not shown, or None."""
        if not self.left_out:
            return None
        return f"(not shown at {width} columns: {', '.join(self.left_out)}; a wider terminal or --json shows them)"


def _plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def _cell_width(cell: Cell) -> int:
    return max((cell_len(line) for line in _plain(cell).splitlines()), default=0)


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def column_widths(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> list[int]:
    """The width each column needs: its widest cell (its longest word for prose), and its
    header's longest word."""
    return [
        max(
            [
                _longest_word(col.header),
                *((_longest_word(_plain(row[i])) if col.wrap else _cell_width(row[i])) for row in rows),
            ]
        )
        for i, col in enumerate(columns)
    ]


def natural_widths(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> list[int]:
    """The width each column takes with room to spare: its widest cell or its header."""
    return [max([cell_len(col.header), *(_cell_width(row[i]) for row in rows)]) for i, col in enumerate(columns)]


def fit_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    width: int | None,
    *,
    title: str | None = None,
    **table_options: Any,
) -> FittedTable:
    needs = column_widths(columns, rows)
    shown = list(range(len(columns)))
    left_out: list[int] = []

    def total(indices: list[int]) -> int:
        return sum(needs[i] for i in indices) + GAP * max(len(indices) - 1, 0)

    if width is not None:
        for i in sorted((i for i, c in enumerate(columns) if c.drop is not None), key=lambda i: (columns[i].drop, -i)):
            if total(shown) <= width:
                break
            shown.remove(i)
            left_out.append(i)
        if total(shown) > width:  # the columns that must stay do not fit side by side: stack each row
            return FittedTable(_stacked(columns, rows, title, table_options.get("header_style")), stacked=True)
    naturals = natural_widths(columns, rows)
    widths = _widths([columns[i] for i in shown], [needs[i] for i in shown], [naturals[i] for i in shown], width)
    table = Table(title=title, title_justify="left", box=None, pad_edge=False, **table_options)
    for i, column_width in zip(shown, widths, strict=True):
        column = columns[i]
        table.add_column(column.header, justify=column.justify, width=column_width, style=column.style)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return FittedTable(table, tuple(columns[i].header for i in sorted(left_out)))


def _widths(columns: Sequence[Column], needs: Sequence[int], naturals: Sequence[int], width: int | None) -> list[int]:
    """Each column's width, set here rather than left to rich (whose shrinking crops cells):
    what its cells need; then, as the width allows, prose its whole lines, and a header that
    would wrap its whole length (the narrowest headers first, so that as many as can stay on
    one line)."""
    widths = list(needs)
    room = None if width is None else width - (sum(needs) + GAP * max(len(needs) - 1, 0))
    for i in reversed([i for i, column in enumerate(columns) if column.wrap]):  # the last (the prose) first
        more = naturals[i] - widths[i]
        if room is not None:
            more = min(more, room)
            room -= more
        widths[i] += more
    for i in sorted(range(len(columns)), key=lambda i: naturals[i] - widths[i]):
        more = max(naturals[i] - widths[i], 0)
        if room is not None:
            more = min(more, room)
            room -= more
        widths[i] += more
    return widths


def _stacked(
    columns: Sequence[Column], rows: Sequence[Sequence[Cell]], title: str | None, header_style: str | None
) -> RenderableType:
    lines: list[RenderableType] = []
    if title:
        lines.append(Text(title, style="bold"))
    for row in rows:
        first = row[0]
        lines.append(first if isinstance(first, Text) else Text(first, style="bold"))
        for column, cell in zip(columns[1:], row[1:], strict=True):
            if not _plain(cell):
                continue
            lines.append(Text.assemble("  ", (f"{column.header}: ", header_style or "dim"), cell))
    return Group(*lines)


def text_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int | None) -> str:
    """The fitted table as plain text (no colour), its note below it, no line ending in spaces."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=width or 100_000, color_system=None, highlight=False, soft_wrap=width is None)
    fitted = fit_table(columns, rows, width, header_style="bold")
    console.print(fitted.renderable)
    note = fitted.note(width)
    if note:
        console.print(note)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
