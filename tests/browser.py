"""Headless Chromium for the HTML report tests: open a page from a file and return the DOM as the
browser built it, the console messages (script errors, loads the page's CSP blocked) and a
screenshot. Debian's ``chromium`` package provides the binary (``apt-get install -y chromium``)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: No network, no first-run work, no GPU: the page must render from the file alone.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
)
#: How Chromium logs a page's console message (an uncaught error, a blocked load) on stderr.
CONSOLE_MARK = ":CONSOLE"


@dataclass
class LoadedPage:
    dom: str
    console: list[str]
    screenshot: Path


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, CHROMIUM_NAMES) if path), None)


def load_page(chromium: str, page: Path, work_dir: Path, window: tuple[int, int] = (1280, 2000)) -> LoadedPage:
    """Open ``page`` once: the DOM after load and a screenshot of the window, in one run."""
    screenshot = work_dir / "shot.png"
    command = [
        chromium,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={work_dir / 'profile'}",
        f"--window-size={window[0]},{window[1]}",
        f"--screenshot={screenshot}",
        "--dump-dom",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    console = [line for line in done.stderr.splitlines() if CONSOLE_MARK in line]
    return LoadedPage(dom=done.stdout, console=console, screenshot=screenshot)


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.elements: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(Element(tag, {name: value or "" for name, value in attrs}))


def elements(markup: str) -> list[Element]:
    """Every element of an HTML document, in document order."""
    collector = _Collector()
    collector.feed(markup)
    collector.close()
    return collector.elements


def with_class(found: list[Element], tag: str, css_class: str) -> list[Element]:
    return [e for e in found if e.tag == tag and css_class in e.classes]
