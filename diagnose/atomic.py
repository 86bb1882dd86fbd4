"""Writing a file whole or not at all: a reader never sees half of it, and a write that fails
(a full disk, a file-size limit, memory running out) leaves nothing behind.

Contract: ``write_atomically(path, data)`` writes ``data`` (text as UTF-8, or bytes) under a
temporary name beside ``path`` (``.<name>.<pid>.tmp``: per process, so that ranks sharing a
folder never write one temporary file), then renames it over ``path``. On any failure, the
signals that stop diagnose included, the temporary file is removed and the error raised as it
came; ``path`` keeps what it held before. No torch import.
"""

from __future__ import annotations

import os
from pathlib import Path


def temporary_name(path: Path) -> Path:
    """Where ``write_atomically`` writes ``path`` before renaming it."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomically(path: Path, data: str | bytes) -> Path:
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as stream:
            stream.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    return path
