"""Safe HTML building: every string from a trace, a script or a rule file is escaped.

Contract: ``el(tag, *children, **attrs) -> Markup`` escapes all text children and every
attribute value; only ``Markup`` (built here) is inserted as is. The table helpers build the
page's settings and record tables from ``(key, value)`` rows.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

from diagnose.units import plain

VOID_ELEMENTS = frozenset({"meta"})


class Markup(str):
    """HTML built by this package: inserted as is. Anything else is escaped."""


def el(tag: str, *children: Any, **attrs: Any) -> Markup:
    """One element. Text children and every attribute value are escaped; ``Markup`` children and
    lists of them are kept. ``class_`` is ``class``; other underscores become dashes."""
    attr_text = "".join(
        _attribute(name, value) for name, value in attrs.items() if value is not None and value is not False
    )
    if tag in VOID_ELEMENTS:
        return Markup(f"<{tag}{attr_text}>")
    return Markup(f"<{tag}{attr_text}>{_content(children)}</{tag}>")


def _attribute(name: str, value: Any) -> str:
    name = name.rstrip("_").replace("_", "-")
    return f" {name}" if value is True else f' {name}="{html.escape(str(value), quote=True)}"'


def _content(children: Iterable[Any]) -> str:
    parts: list[str] = []
    for child in children:
        if child is None:
            continue
        if isinstance(child, Markup):
            parts.append(child)
        elif isinstance(child, (list, tuple)):
            parts.append(_content(child))
        else:
            parts.append(html.escape(str(child), quote=True))
    return "".join(parts)


def section(title: str, *children: Any, anchor: str) -> Markup:
    return el("section", el("h2", title), *children, id=anchor)


def kv_table(rows: Iterable[tuple[str, Any]]) -> Markup:
    """A two-column table of settings; values as ``units.plain`` prints them."""
    return el(
        "table", el("tbody", [el("tr", el("th", key), el("td", plain(value))) for key, value in rows]), class_="kv"
    )


def records_table(records: Iterable[Iterable[tuple[str, Any]]]) -> Markup:
    """One row per record, one column per key any record has."""
    rows = [dict(record) for record in records]
    keys = list(dict.fromkeys(key for record in rows for key in record))
    header = el("tr", [el("th", key) for key in keys])
    body = [el("tr", [el("td", plain(record.get(key))) for key in keys]) for record in rows]
    return el("table", el("thead", header), el("tbody", body), class_="grid")


def swatch(colour_class: str) -> Markup:
    return el("span", "", class_=f"swatch {colour_class}")


def reference(url: str) -> Markup:
    """A link for a web address, plain text for anything else (no javascript: links)."""
    if url.startswith(("https://", "http://")):
        return el("a", url, href=url, rel="noreferrer")
    return el("span", url)
