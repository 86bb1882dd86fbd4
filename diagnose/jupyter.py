"""How Jupyter shows diagnose's report: a registry of HTML pages by type name.

Contract: ``register_display(type_name, page)``; ``notebook_frame(value) -> str | None`` (the
page in an ``iframe``, for ``_repr_html_``; None while nothing is registered for the type).
The types sit below the renderers (``diagnose/report.py``, ``analysis/compare.py``) and never
import one; the package's top (``diagnose/__init__.py``), which sees both, registers which
renderer draws them. It imports nothing, so ``import diagnose`` stays cheap.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

#: type name -> the function that draws a value of it as a whole HTML page (filled once, at
#: import of the package)
_PAGES: dict[str, Callable[[Any], str]] = {}


def register_display(type_name: str, page: Callable[[Any], str]) -> None:
    """Show values of ``type_name`` in a notebook as the HTML page ``page(value)`` returns."""
    _PAGES[type_name] = page


def notebook_frame(value: Any) -> str | None:
    """``value``'s page from its registered display, in a frame (None: no display registered)."""
    page = _PAGES.get(type(value).__name__)
    return None if page is None else html_frame(page(value))


def html_frame(page: str, height_px: int = 900) -> str:
    """A whole HTML page inside an ``iframe`` (``srcdoc``), for a notebook's output cell: its
    stylesheet and Content-Security-Policy stay inside the frame."""
    return f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width:100%;height:{height_px}px;border:0" sandbox=""></iframe>'
