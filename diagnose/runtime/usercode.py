"""Whose code a frame runs: the user's, a library's (torch, site-packages, the standard library,
diagnose), or code no one wrote (FX graphs, torch.compile's output); and the text of a line.

Contract: ``library_prefixes()`` once per run; ``first_user_frame(frame, library)`` and
``user_frame(library)`` walk outwards to the user's innermost frame; ``is_generated(filename)``;
``source_line("file:line")`` reads that line ("" when it cannot). A leaf of the runtime side:
the hooks (``instrument``), line attribution, the compile and framework watches all read it, and
it imports nothing of diagnose.
"""

from __future__ import annotations

import os
import sys
from types import FrameType

#: Path fragments of code that torch.compile generates: Inductor's output code and kernels
#: (``/tmp/torchinductor_<user>/xy/cxy...py``, or under ``TORCHINDUCTOR_CACHE_DIR``), Triton's
#: cache, and dynamo's debug dumps. Such a file is nobody's line to change.
GENERATED_PATH_FRAGMENTS = ("/torchinductor_", "/.triton/", "/torch_compile_debug/")


def _generated_dirs() -> tuple[str, ...]:
    dirs = [os.environ.get(name) for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")]
    return tuple(d.rstrip("/") + "/" for d in dirs if d)


def is_generated(filename: str) -> bool:
    """Code no user wrote: ``<string>``/``<eval_with_key>.N`` (FX graphs), Inductor's output."""
    if filename.startswith("<"):
        return True
    normalized = filename.replace(os.sep, "/")
    if any(fragment in normalized for fragment in GENERATED_PATH_FRAGMENTS):
        return True
    dirs = _generated_dirs()
    return bool(dirs) and normalized.startswith(dirs)


def first_user_frame(frame: FrameType | None, library: tuple[str, ...]) -> FrameType | None:
    """The innermost frame, from ``frame`` outwards, that is the user's: outside ``library``
    (torch, site-packages, the standard library, diagnose) and not generated code (FX graphs,
    torch.compile's output: see ``is_generated``)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(library) and not is_generated(filename):
            return frame
        frame = frame.f_back
    return None


def user_frame(library: tuple[str, ...]) -> str | None:
    """``file:line`` of the user's innermost caller of the function that calls this one."""
    frame = first_user_frame(sys._getframe(2), library)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else None


def library_prefixes() -> tuple[str, ...]:
    """Path prefixes of code that is not the user's: torch, site-packages, stdlib, diagnose."""
    import sysconfig

    import torch

    prefixes = {
        os.path.dirname(torch.__file__),
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # the diagnose package
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
    }
    return tuple(sorted(p for p in prefixes if p))


def source_line(site: str) -> str:
    path, _, line = site.rpartition(":")
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for i, text in enumerate(fh, 1):
                if i == int(line):
                    return text.strip()
    except (OSError, ValueError):
        pass
    return ""
