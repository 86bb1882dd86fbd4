"""The page's colours and stylesheet: style.css beside this file, plus one rule per category.

Colours are the terminal renderer's ``STYLES``, as rich prints them when it exports a terminal
to SVG; a host phase takes the colour of the exposed category the host is in during it.
"""

from __future__ import annotations

from importlib import resources

from rich.color import Color
from rich.terminal_theme import SVG_EXPORT_THEME

from diagnose.renderers.html.markup import Markup, el
from diagnose.renderers.terminal import STYLES

#: No script, no outside resource: the page is one file that can be mailed or archived.
CSP = "default-src 'none'; style-src 'unsafe-inline'"

#: The colour of each exposed category: the terminal's, as rich renders it in its SVG export.
CATEGORY_COLOURS = {cat: Color.parse(style).get_truecolor(SVG_EXPORT_THEME).hex for cat, (style, _) in STYLES.items()}
#: Host phases take the colour of the exposed category the host is in during that phase.
PHASE_COLOURS = {
    "data_wait": CATEGORY_COLOURS["data_wait"],
    "h2d_copy": CATEGORY_COLOURS["h2d_copy"],
    "forward": CATEGORY_COLOURS["host_forward"],
    "backward": CATEGORY_COLOURS["host_backward"],
    "optimizer": CATEGORY_COLOURS["host_optimizer"],
    "other": CATEGORY_COLOURS["host_other"],
}


def text_colour(hex_colour: str) -> str:
    """Dark text on light segments, white on dark ones (relative luminance)."""
    r, g, b = (int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return "#1f2328" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.55 else "#ffffff"


def stylesheet() -> str:
    """style.css, then the fill and text colour of every category (``c-``) and phase (``p-``)."""
    css = resources.files(__package__).joinpath("style.css").read_text(encoding="utf-8")
    colour_rules = [
        f".c-{cat}{{fill:{hex_};background:{hex_}}}.on-c-{cat}{{fill:{text_colour(hex_)}}}"
        for cat, hex_ in CATEGORY_COLOURS.items()
    ]
    colour_rules += [
        f".p-{phase}{{fill:{hex_};background:{hex_}}}.on-p-{phase}{{fill:{text_colour(hex_)}}}"
        for phase, hex_ in PHASE_COLOURS.items()
    ]
    return "\n" + css + "\n".join(colour_rules) + "\n"


def page(title: str, body: Markup) -> str:
    """A whole self-contained page: the head (charset, CSP, viewport, title, stylesheet) and ``body``."""
    head = el(
        "head",
        el("meta", charset="utf-8"),
        el("meta", http_equiv="Content-Security-Policy", content=CSP),
        el("meta", name="viewport", content="width=device-width, initial-scale=1"),
        el("title", title),
        el("style", Markup(stylesheet())),
    )
    return "<!DOCTYPE html>\n" + el("html", head, el("body", body), lang="en") + "\n"
