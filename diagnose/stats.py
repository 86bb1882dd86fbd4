"""Small statistics over plain lists of numbers, at the ground floor: the analysis and the
renderers read the same quantile.

Contract: pure functions; no imports from diagnose.
"""

from __future__ import annotations

from collections.abc import Sequence


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0-1), interpolated linearly between the closest ranks (numpy's
    default method); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)
