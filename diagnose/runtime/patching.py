"""One attribute of a class or module wrapped, and the way back: the hooks, the phase marks,
watch's spans and the evaluation passes wrap what the script calls through ``wrap_attribute``,
so that each is undone exactly: the attribute the owner defined itself is put back, one it
inherited is deleted again (never left as a copy that would hide a later change of the base's).
The knobs replace attributes outright (``Knobs._patch``), never reading what they replace."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def wrap_attribute(owner: Any, name: str, factory: Callable[[Any], Any]) -> Callable[[], None]:
    """Set ``owner.name`` to ``factory(current)``; the returned call undoes it."""
    own = name in vars(owner)
    original = vars(owner)[name] if own else getattr(owner, name)
    setattr(owner, name, factory(original))
    if own:
        return lambda: setattr(owner, name, original)
    return lambda: delattr(owner, name)
